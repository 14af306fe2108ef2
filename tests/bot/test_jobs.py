"""The periodic jobs: balance notices once per crossing, and reconciliation with Telegram's
Star transactions. The tests run each job's function directly instead of waiting for a timer."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select
from telegram.ext import Application

from billing import job_state, ledger
from billing.db import session_scope
from billing.models import Purchase
from bot.jobs import reconcile_star_transactions, send_balance_notices
from tests.bot.conftest import ADMIN_ID, LOW_BALANCE
from tests.bot.double import FakeTelegram, TelegramUser, star_payment, star_refund
from tests.bot.stories import account_of, buy_pack, order_pack
from tests.factories import bill_request

pytestmark = pytest.mark.anyio


def notices_to(telegram: FakeTelegram, user: TelegramUser) -> list[str]:
    return [
        text for text in telegram.texts_to(user.id) if "balance is low" in text or "run out" in text
    ]


async def test_a_low_balance_and_an_empty_one_are_each_announced_once_per_crossing(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    engine: Engine,
    session: Session,
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-n1")
    account_id = account_of(session, alice).id
    assert account_id is not None
    await send_balance_notices(shop_bot)
    assert notices_to(telegram, alice) == []

    bill_request(engine, account_id, "req-1", cost=100_000 - 400)  # 400 left, under the threshold
    await send_balance_notices(shop_bot)
    await send_balance_notices(shop_bot)  # the next poll, and a second bot process
    assert notices_to(telegram, alice) == [
        "⚠️ Your balance is low: 400 tokens left. 🛒 Buy tokens to top up."
    ]

    bill_request(engine, account_id, "req-2", cost=400)
    await send_balance_notices(shop_bot)
    await send_balance_notices(shop_bot)
    assert len(notices_to(telegram, alice)) == 2
    assert "run out" in notices_to(telegram, alice)[-1]

    # A top-up resets the level silently; the next fall is announced again.
    await buy_pack(alice, telegram, charge_id="charge-n2")
    await send_balance_notices(shop_bot)
    assert len(notices_to(telegram, alice)) == 2
    bill_request(engine, account_id, "req-3", cost=100_000 - LOW_BALANCE // 2)
    await send_balance_notices(shop_bot)
    assert len(notices_to(telegram, alice)) == 3


async def test_an_account_that_never_had_tokens_gets_no_notice(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
) -> None:
    await alice.send("/start")
    telegram.forget()

    await send_balance_notices(shop_bot)

    assert telegram.calls("sendMessage") == []


async def test_reconciliation_credits_a_paid_charge_whose_update_was_lost(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    invoice = await order_pack(alice, telegram)
    await alice.pre_checkout(invoice.payload, invoice.amount)
    # Telegram took the Stars, but the successful-payment update never reached the bot.
    telegram.star_transactions.append(
        star_payment("charge-lost", alice, invoice.amount, invoice.payload)
    )

    report = await reconcile_star_transactions(shop_bot)
    again = await reconcile_star_transactions(shop_bot)  # the next run starts after it
    telegram.star_transactions.clear()

    assert report.credited == ["charge-lost"] and again.seen == 0
    account_id = account_of(session, alice).id
    assert account_id is not None
    assert ledger.get_balance(session=session, account_id=account_id).purchased == 100_000
    assert any("Payment received: +100,000 tokens" in t for t in telegram.texts_to(alice.id))
    assert "sk-tks-" in telegram.last_text_to(alice.id)  # the key, as after any first purchase

    # A late update for the same charge changes nothing.
    await alice.paid(invoice.payload, invoice.amount, "charge-lost")
    session.rollback()
    assert len(session.exec(select(Purchase)).all()) == 1


async def test_reconciliation_reverses_a_refund_made_outside_the_bot(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-out")
    telegram.star_transactions += [
        star_payment("charge-out", alice, invoice.amount, invoice.payload),
        star_refund("charge-out", alice, invoice.amount),
    ]

    report = await reconcile_star_transactions(shop_bot)

    assert report.refunded == ["charge-out"] and report.problems == []
    session.rollback()
    assert ledger.audit(session=session) == []
    account_id = account_of(session, alice).id
    assert account_id is not None
    assert ledger.get_balance(session=session, account_id=account_id).refunded == 100_000


async def test_reconciliation_reports_a_charge_it_cannot_match_to_the_operators_once(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
    engine: Engine,
) -> None:
    invoice = await order_pack(alice, telegram)
    telegram.star_transactions += [
        star_payment("charge-cheap", alice, 1, invoice.payload),
        star_payment("charge-stray", alice, 50, "not-an-order"),
    ]

    report = await reconcile_star_transactions(shop_bot)
    with session_scope(engine) as writer:  # read them all again: reported once all the same
        job_state.save_position(session=writer, job="reconcile", position=0)
    await reconcile_star_transactions(shop_bot)

    assert report.credited == [] and len(report.problems) == 2
    alerts = [t for t in telegram.texts_to(ADMIN_ID) if "Star transactions" in t]
    assert len(alerts) == 1
    assert "charge-cheap" in alerts[0] and "priced 50; not credited" in alerts[0]
    assert "charge-stray" in alerts[0] and "matches no order" in alerts[0]
    session.rollback()
    assert session.exec(select(Purchase)).all() == []
