"""Monthly plans: a Telegram Stars subscription bought through an invoice link, every charge
(the first and each renewal) credited once, cancel and resume through Telegram, notices before a
renewal and after each credit, and the operators' side: /stats, refunds, reconciliation. The
books balance after every story (`books_balance_after_every_story`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, update
from sqlmodel import Session, col, select
from telegram.ext import Application

from billing import ledger
from billing.db import session_scope
from billing.models import Order, Purchase, Subscription
from bot.jobs import reconcile_star_transactions, send_renewal_reminders
from bot.settings import BotSettings
from tests.bot.double import FakeTelegram, TelegramUser, star_payment, star_refund
from tests.bot.stories import account_of, buttons, confirm_refund, pre_checkout_answer
from tests.factories import bill_request

pytestmark = pytest.mark.anyio

PERIOD = 2_592_000  # 30 days: Telegram's subscription period
BASIC_TOKENS = 1_000_000


@pytest.fixture
def bot_settings(bot_settings: BotSettings) -> BotSettings:
    """The test shop, selling two plans beside its packs."""
    return bot_settings.model_copy(
        update={"plans": f"basic:{BASIC_TOKENS}:300:Basic,max:5000000:1200:Max"}
    )


@dataclass(frozen=True)
class PlanLink:
    payload: str
    amount: int
    link: str


async def choose_plan(user: TelegramUser, telegram: FakeTelegram, plan: str = "basic") -> PlanLink:
    """Open the shop, accept the terms if asked, tap a plan: the invoice link the bot sends."""
    await user.send("/buy")
    if "terms:accept" in str(telegram.last("sendMessage").get("reply_markup")):
        await user.tap("terms:accept")
    await user.tap(f"plan:{plan}")
    made = telegram.last("createInvoiceLink")
    button = telegram.last("sendMessage")["reply_markup"]["inline_keyboard"][0][0]
    assert button["url"] == telegram.last("createInvoiceLink").result
    return PlanLink(made["payload"], made["prices"][0]["amount"], button["url"])


def days_ahead(days: float) -> int:
    """A Unix time `days` from now, as Telegram sends `subscription_expiration_date`."""
    return int(time.time() + days * 86_400)


async def subscribe(
    user: TelegramUser, telegram: FakeTelegram, charge_id: str, plan: str = "basic"
) -> PlanLink:
    """The whole first charge: link, pre-checkout accepted, the first recurring payment."""
    link = await choose_plan(user, telegram, plan)
    await user.pre_checkout(link.payload, link.amount)
    assert pre_checkout_answer(telegram) == (True, None)
    await user.paid(link.payload, link.amount, charge_id, renews_at=days_ahead(30), first=True)
    return link


def subscription_of(session: Session, user: TelegramUser) -> Subscription:
    account = account_of(session, user)
    return session.exec(select(Subscription).where(Subscription.account_id == account.id)).one()


def available(session: Session, user: TelegramUser) -> int:
    account_id = account_of(session, user).id
    assert account_id is not None
    return ledger.get_balance(session=session, account_id=account_id).available


def charges(session: Session) -> list[str]:
    session.rollback()
    return [p.telegram_payment_charge_id for p in session.exec(select(Purchase)).all()]


async def test_a_plan_is_sold_beside_the_packs_through_a_subscription_invoice_link(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("/buy")
    assert "30 days" in telegram.last_text_to(alice.id)  # the terms say how plans renew
    await alice.tap("terms:accept")
    assert buttons(telegram) == ["pack:starter", "pack:pro", "plan:basic", "plan:max"]
    assert "Basic · 1,000,000 tokens/month · 300 ⭐/month" in str(
        telegram.last("editMessageText")["reply_markup"]
    )

    link = await choose_plan(alice, telegram)

    made = telegram.last("createInvoiceLink")
    assert int(made["subscription_period"]) == PERIOD
    assert made["currency"] == "XTR"
    assert made["prices"] == [{"label": "1,000,000 tokens every 30 days", "amount": 300}]
    assert "provider_token" not in made.params
    session.rollback()
    order = session.get(Order, link.payload)
    assert order is not None
    assert (order.pack_id, order.tokens, order.price, order.subscription_period) == (
        "basic",
        BASIC_TOKENS,
        300,
        PERIOD,
    )
    assert telegram.calls("sendInvoice") == []


async def test_the_first_charge_credits_the_plan_and_shows_the_key(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    renews_at = days_ahead(30)
    link = await choose_plan(alice, telegram)
    await alice.pre_checkout(link.payload, link.amount)
    assert pre_checkout_answer(telegram) == (True, None)

    await alice.paid(link.payload, link.amount, "sub-1", renews_at=renews_at, first=True)

    received, with_key = telegram.texts_to(alice.id)[-2:]
    assert "Plan Basic is active: +1,000,000 tokens" in received
    next_renewal = datetime.fromtimestamp(renews_at, UTC)
    assert f"Next renewal: {next_renewal:%Y-%m-%d %H:%M} UTC, 300 ⭐" in received
    assert "sk-tks-" in with_key
    assert available(session, alice) == BASIC_TOKENS
    subscription = subscription_of(session, alice)
    assert subscription.first_charge_id == "sub-1"
    assert subscription.expires_at == next_renewal
    # The order is paid: the same link cannot be paid a second time.
    await alice.pre_checkout(link.payload, link.amount)
    assert pre_checkout_answer(telegram) == (False, "This invoice has already been paid.")


async def test_a_renewal_credits_again_and_unused_tokens_carry_over(
    alice: TelegramUser, telegram: FakeTelegram, session: Session, engine: Engine
) -> None:
    link = await subscribe(alice, telegram, "sub-1")
    account_id = account_of(session, alice).id
    assert account_id is not None
    bill_request(engine, account_id, "req-1", cost=400_000)  # 600,000 left unused
    renews_at = days_ahead(60)

    await alice.paid(link.payload, link.amount, "sub-2", renews_at=renews_at)

    assert "Plan Basic renewed: +1,000,000 tokens" in telegram.last_text_to(alice.id)
    assert "Available now: 1,600,000 tokens" in telegram.last_text_to(alice.id)
    assert available(session, alice) == 600_000 + BASIC_TOKENS  # what the terms promise
    renewal = session.exec(
        select(Purchase).where(Purchase.telegram_payment_charge_id == "sub-2")
    ).one()
    subscription = subscription_of(session, alice)
    assert (renewal.subscription_id, renewal.order_id) == (subscription.id, None)
    assert subscription.first_charge_id == "sub-1"
    assert subscription.expires_at == datetime.fromtimestamp(renews_at, UTC)


async def test_the_same_charge_delivered_five_times_at_once_credits_once(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    link = await choose_plan(alice, telegram)
    await alice.pre_checkout(link.payload, link.amount)
    first, renewal = days_ahead(30), days_ahead(60)

    await asyncio.gather(
        *(
            alice.paid(link.payload, link.amount, "sub-1", renews_at=first, first=True)
            for _ in range(5)
        )
    )
    await asyncio.gather(
        *(alice.paid(link.payload, link.amount, "sub-2", renews_at=renewal) for _ in range(5))
    )

    assert sorted(charges(session)) == ["sub-1", "sub-2"]
    assert available(session, alice) == 2 * BASIC_TOKENS
    assert len(session.exec(select(Subscription)).all()) == 1
    started = [text for text in telegram.texts_to(alice.id) if "is active" in text]
    renewed = [text for text in telegram.texts_to(alice.id) if "renewed" in text]
    assert len(started) == len(renewed) == 5  # each repeat repeats the confirmation only
    assert all("Available now: 2,000,000 tokens" in text for text in renewed)


async def test_cancel_and_resume_name_the_first_charge_to_telegram(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    link = await subscribe(alice, telegram, "sub-1")
    await alice.paid(link.payload, link.amount, "sub-2", renews_at=days_ahead(60))
    subscription = subscription_of(session, alice)

    await alice.send("/plan")
    assert "Next renewal:" in telegram.last_text_to(alice.id)
    assert buttons(telegram) == [f"sub:cancel:{subscription.id}"]
    await alice.tap(f"sub:cancel:{subscription.id}")

    call = telegram.last("editUserStarSubscription")
    assert (int(call["user_id"]), call["telegram_payment_charge_id"], call["is_canceled"]) == (
        alice.id,
        "sub-1",
        "true",
    )
    assert "will not renew" in telegram.last_text_to(alice.id)
    session.rollback()
    assert subscription_of(session, alice).canceled_at is not None
    await alice.send("/plan")
    assert "Cancelled: it runs until" in telegram.last_text_to(alice.id)

    await alice.tap(f"sub:resume:{subscription.id}")

    call = telegram.last("editUserStarSubscription")
    assert (call["telegram_payment_charge_id"], call["is_canceled"]) == ("sub-1", "false")
    assert "renews again" in telegram.last_text_to(alice.id)
    session.rollback()
    assert subscription_of(session, alice).canceled_at is None
    assert available(session, alice) == 2 * BASIC_TOKENS  # cancelling moves no tokens


async def test_a_cancellation_telegram_refuses_changes_nothing(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await subscribe(alice, telegram, "sub-1")
    subscription = subscription_of(session, alice)
    telegram.fail("editUserStarSubscription", "Bad Request: SUBSCRIPTION_NOT_FOUND")

    await alice.tap(f"sub:cancel:{subscription.id}")
    await boris.tap(f"sub:cancel:{subscription.id}")  # not his

    assert "Telegram refused the change" in telegram.last_text_to(alice.id)
    assert "не ваш" in telegram.last_text_to(boris.id)
    assert len(telegram.calls("editUserStarSubscription")) == 1
    session.rollback()
    assert subscription_of(session, alice).canceled_at is None


async def test_a_renewal_that_never_comes_credits_nothing_and_a_late_one_is_credited(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
    engine: Engine,
) -> None:
    link = await subscribe(alice, telegram, "sub-1")
    with session_scope(engine) as writer:  # 30 days pass, and Telegram charges nothing
        writer.execute(
            update(Subscription).values(expires_at=datetime.now(UTC) - timedelta(hours=1))
        )

    await send_renewal_reminders(shop_bot)
    await reconcile_star_transactions(shop_bot)
    await alice.send("/plan")

    assert available(session, alice) == BASIC_TOKENS
    assert "Ended" in telegram.last_text_to(alice.id)
    assert buttons(telegram) == ["plan:basic", "plan:max"]  # subscribe again

    # Telegram's renewal comes a day late: it is credited, and the plan runs again.
    await alice.paid(link.payload, link.amount, "sub-2", renews_at=days_ahead(29))
    assert available(session, alice) == 2 * BASIC_TOKENS
    await alice.send("/plan")
    assert "Next renewal:" in telegram.last_text_to(alice.id)


async def test_reconciliation_credits_a_renewal_whose_update_was_lost(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    link = await subscribe(alice, telegram, "sub-1")
    renewed = days_ahead(0)
    telegram.star_transactions += [
        star_payment("sub-1", alice, 300, link.payload, subscription_period=PERIOD),
        star_payment("sub-2", alice, 300, link.payload, date=renewed, subscription_period=PERIOD),
    ]

    report = await reconcile_star_transactions(shop_bot)
    again = await reconcile_star_transactions(shop_bot)

    assert report.credited == ["sub-2"] and report.problems == [] and again.seen == 0
    assert available(session, alice) == 2 * BASIC_TOKENS
    assert "Plan Basic renewed: +1,000,000 tokens" in telegram.last_text_to(alice.id)
    subscription = subscription_of(session, alice)
    assert subscription.expires_at == datetime.fromtimestamp(renewed + PERIOD, UTC)
    # The update, arriving after all, changes nothing.
    await alice.paid(link.payload, link.amount, "sub-2", renews_at=renewed + PERIOD)
    assert sorted(charges(session)) == ["sub-1", "sub-2"]


async def test_reconciliation_starts_a_plan_whose_every_update_was_lost(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    link = await choose_plan(alice, telegram)
    await alice.pre_checkout(link.payload, link.amount)
    telegram.star_transactions += [
        star_payment("sub-1", alice, 300, link.payload, subscription_period=PERIOD),
        star_payment("sub-2", alice, 300, link.payload, subscription_period=PERIOD),
    ]

    report = await reconcile_star_transactions(shop_bot)

    assert report.credited == ["sub-1", "sub-2"]
    assert available(session, alice) == 2 * BASIC_TOKENS
    assert subscription_of(session, alice).first_charge_id == "sub-1"
    assert any("Plan Basic is active" in text for text in telegram.texts_to(alice.id))


async def test_a_refunded_renewal_reverses_its_tokens_once(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    link = await subscribe(alice, telegram, "sub-1")
    await alice.paid(link.payload, link.amount, "sub-2", renews_at=days_ahead(60))

    await operator.send("/refund sub-2")
    await confirm_refund(operator, telegram)
    # Telegram reports it in the buyer's chat, and lists it for reconciliation.
    await alice.refunded(link.payload, link.amount, "sub-2")
    telegram.star_transactions.append(star_refund("sub-2", alice, 300))
    report = await reconcile_star_transactions(shop_bot)

    call = telegram.last("refundStarPayment")
    assert (int(call["user_id"]), call["telegram_payment_charge_id"]) == (alice.id, "sub-2")
    assert "Refunded 300 ⭐" in telegram.last_text_to(operator.id)
    assert report.refunded == []
    assert available(session, alice) == BASIC_TOKENS
    account_id = account_of(session, alice).id
    assert account_id is not None
    assert ledger.get_balance(session=session, account_id=account_id).refunded == BASIC_TOKENS
    refunded = session.exec(select(Purchase).where(col(Purchase.refunded_at).is_not(None))).all()
    assert [p.telegram_payment_charge_id for p in refunded] == ["sub-2"]


async def test_a_coming_renewal_is_announced_once_and_not_for_a_cancelled_plan(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    boris: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    link = await choose_plan(alice, telegram)
    await alice.pre_checkout(link.payload, link.amount)
    await alice.paid(link.payload, link.amount, "sub-a", renews_at=days_ahead(1), first=True)
    other = await choose_plan(boris, telegram, "max")
    await boris.pre_checkout(other.payload, other.amount)
    await boris.paid(other.payload, other.amount, "sub-b", renews_at=days_ahead(1), first=True)
    await boris.tap(f"sub:cancel:{subscription_of(session, boris).id}")

    sent = await send_renewal_reminders(shop_bot)
    again = await send_renewal_reminders(shop_bot)

    assert [reminder.telegram_id for reminder in sent] == [alice.id] and again == []
    assert "renews on" in telegram.last_text_to(alice.id)
    assert "300 ⭐ for 1,000,000 more tokens" in telegram.last_text_to(alice.id)
    assert not any("Ваш тариф" in text for text in telegram.texts_to(boris.id))

    # After the renewal the next one is announced in its turn.
    await alice.paid(link.payload, link.amount, "sub-a2", renews_at=days_ahead(1.5))
    assert len(await send_renewal_reminders(shop_bot)) == 1


async def test_stats_and_paysupport_show_the_plans(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    link = await subscribe(alice, telegram, "sub-1")
    await alice.paid(link.payload, link.amount, "sub-2", renews_at=days_ahead(60))
    await alice.tap(f"sub:cancel:{subscription_of(session, alice).id}")

    await operator.send("/stats")
    stats = telegram.last_text_to(operator.id)
    assert "Plans</b>: 1 running, 1 of them cancelled" in stats
    assert "Today: 1 started · 1 renewals · 1 cancelled · 0 ended · 600 ⭐" in stats

    await alice.send("/paysupport")
    listed = telegram.last_text_to(alice.id)
    assert "🔁 Basic · 300 ⭐ · <code>sub-2</code>" in listed
    assert "🔁 Basic · 300 ⭐ · <code>sub-1</code>" in listed


async def test_a_second_first_charge_for_one_plan_order_is_paid_back(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    link = await subscribe(alice, telegram, "sub-1")

    await alice.paid(link.payload, link.amount, "sub-odd", renews_at=days_ahead(30), first=True)

    assert charges(session) == ["sub-1"]
    assert telegram.last("refundStarPayment")["telegram_payment_charge_id"] == "sub-odd"
    assert "sub-odd" in telegram.last_text_to(operator.id)
    assert available(session, alice) == BASIC_TOKENS


async def test_a_renewal_that_comes_before_its_lost_first_charge_waits_for_it_to_cancel(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    link = await choose_plan(alice, telegram)
    await alice.pre_checkout(link.payload, link.amount)
    renews_at = days_ahead(60)

    await alice.paid(link.payload, link.amount, "sub-2", renews_at=renews_at)
    await alice.tap(f"sub:cancel:{subscription_of(session, alice).id}")

    assert "still being matched" in telegram.last_text_to(alice.id)
    assert telegram.calls("editUserStarSubscription") == []
    assert available(session, alice) == BASIC_TOKENS

    # The first charge's update arrives after all: it pays the order and names the plan.
    await alice.paid(link.payload, link.amount, "sub-1", renews_at=days_ahead(30), first=True)
    await alice.tap(f"sub:cancel:{subscription_of(session, alice).id}")

    assert available(session, alice) == 2 * BASIC_TOKENS
    assert telegram.last("editUserStarSubscription")["telegram_payment_charge_id"] == "sub-1"
    # the earlier period's end does not shorten the one the renewal paid for
    assert subscription_of(session, alice).expires_at == datetime.fromtimestamp(renews_at, UTC)
    order = session.get(Order, link.payload)
    assert order is not None and order.paid_at is not None


async def test_a_renewal_after_a_cancellation_shows_the_plan_renewing_again(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    link = await subscribe(alice, telegram, "sub-1")
    await alice.tap(f"sub:cancel:{subscription_of(session, alice).id}")

    # The buyer resumed it in Telegram's own settings: Telegram charges the next period.
    await alice.paid(link.payload, link.amount, "sub-2", renews_at=days_ahead(60))
    await alice.send("/plan")

    assert subscription_of(session, alice).canceled_at is None
    assert "Next renewal:" in telegram.last_text_to(alice.id)
