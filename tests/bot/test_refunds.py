"""Refunds: the operator's /refund (the figures first, then Telegram, then the books), Telegram's
refunded_payment update, and /paysupport, where a buyer finds the charge id to quote."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select
from telegram.ext import Application

from billing import ledger
from billing.models import LedgerEntry, Purchase
from bot.jobs import reconcile_star_transactions
from tests.bot.double import FakeTelegram, TelegramUser, star_payment, star_refund
from tests.bot.stories import account_of, buy_pack, confirm_refund
from tests.factories import bill_request

pytestmark = pytest.mark.anyio


def purchase(session: Session, charge_id: str) -> Purchase:
    session.rollback()
    found = session.exec(
        select(Purchase).where(Purchase.telegram_payment_charge_id == charge_id)
    ).one()
    return found


def refund_entries(session: Session) -> list[LedgerEntry]:
    session.rollback()
    return list(session.exec(select(LedgerEntry).where(LedgerEntry.kind == "refund")).all())


async def test_the_operator_refunds_a_charge_through_telegram_and_it_is_reversed_once(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-ref")

    await operator.send("/refund charge-ref")
    assert telegram.calls("refundStarPayment") == []  # figures first
    await confirm_refund(operator, telegram)

    call = telegram.last("refundStarPayment")
    assert (int(call["user_id"]), call["telegram_payment_charge_id"]) == (alice.id, "charge-ref")
    assert purchase(session, "charge-ref").refunded_at is not None
    assert "Refunded 50 ⭐" in telegram.last_text_to(operator.id)
    assert "100,000 tokens were removed" in telegram.last_text_to(alice.id)
    account_id = account_of(session, alice).id
    assert account_id is not None
    assert ledger.get_balance(session=session, account_id=account_id).available == 0

    # Telegram then reports the refund in the buyer's chat, and the operator repeats himself.
    await alice.refunded(invoice.payload, invoice.amount, "charge-ref")
    await operator.send("/refund charge-ref")

    assert len(refund_entries(session)) == 1
    assert len(telegram.calls("refundStarPayment")) == 1
    assert "already refunded" in telegram.last_text_to(operator.id)
    assert ledger.audit(session=session) == []


async def test_a_refund_that_telegram_refuses_changes_nothing(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-nope")
    telegram.fail("refundStarPayment", "Bad Request: CHARGE_NOT_FOUND")

    await operator.send("/refund charge-nope")
    await confirm_refund(operator, telegram)

    assert "Telegram refused the refund (Charge_not_found). Nothing was changed." in (
        telegram.last_text_to(operator.id)
    )
    assert purchase(session, "charge-nope").refunded_at is None
    assert refund_entries(session) == []
    account_id = account_of(session, alice).id
    assert account_id is not None
    assert ledger.get_balance(session=session, account_id=account_id).available == 100_000


async def test_refunding_an_unknown_charge_says_so(
    operator: TelegramUser, telegram: FakeTelegram
) -> None:
    await operator.send("/refund no-such-charge")

    assert telegram.last_text_to(operator.id) == (
        "No purchase with charge id <code>no-such-charge</code>."
    )
    assert telegram.calls("refundStarPayment") == []


async def test_a_refunded_payment_update_reverses_the_purchase_once(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-upd")

    await alice.refunded(invoice.payload, invoice.amount, "charge-upd")
    await alice.refunded(invoice.payload, invoice.amount, "charge-upd")

    assert len(refund_entries(session)) == 1
    assert purchase(session, "charge-upd").refunded_tokens == 100_000
    notices = [text for text in telegram.texts_to(alice.id) if "was refunded" in text]
    assert len(notices) == 1


async def test_paysupport_lists_the_buyers_charges_and_how_to_ask_for_a_refund(
    alice: TelegramUser, telegram: FakeTelegram
) -> None:
    await alice.send("/paysupport")
    assert "You have no payments yet." in telegram.last_text_to(alice.id)

    invoice = await buy_pack(alice, telegram, charge_id="charge-s1")
    await alice.refunded(invoice.payload, invoice.amount, "charge-s1")
    await buy_pack(alice, telegram, charge_id="charge-s2", pack="pro")
    await alice.send("/paysupport")

    text = telegram.last_text_to(alice.id)
    assert "Pro · 700 ⭐ · <code>charge-s2</code>" in text
    assert "Starter · 50 ⭐ · <code>charge-s1</code> · refunded" in text
    assert text.index("charge-s2") < text.index("charge-s1")
    assert "quote the charge id" in text
    assert "in full or not at all" in text


async def test_refund_shows_what_is_spent_before_anything_is_refunded(
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
    engine: Engine,
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-spent")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    bill_request(engine, account_id, "req-spent", cost=30_000)

    await operator.send("/refund charge-spent")

    text = telegram.last_text_to(operator.id)
    assert "The buyer has 70,000 tokens available" in text
    assert "Telegram refunds all 50 ⭐" in text
    assert "remove 70,000 tokens, and 30,000 already spent stay spent" in text
    assert telegram.calls("refundStarPayment") == []
    await operator.tap("refund:cancel")
    assert telegram.last_text_to(operator.id) == "Refund cancelled; nothing was changed."
    assert purchase(session, "charge-spent").refunded_at is None


async def test_charge_already_refunded_counts_as_done_and_reverses_the_books(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-twice")
    telegram.fail("refundStarPayment", "Bad Request: CHARGE_ALREADY_REFUNDED")

    await operator.send("/refund charge-twice")
    await confirm_refund(operator, telegram)

    assert "Refunded 50 ⭐" in telegram.last_text_to(operator.id)
    assert purchase(session, "charge-twice").refunded_tokens == 100_000
    assert ledger.audit(session=session) == []


async def test_a_refund_whose_answer_is_lost_is_checked_against_telegram(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    """The answer to refundStarPayment never arrives: the operator is told nothing until
    Telegram's transactions say whether the Stars went back."""
    await buy_pack(alice, telegram, charge_id="charge-lost")
    await buy_pack(alice, telegram, charge_id="charge-done")
    telegram.time_out("refundStarPayment")

    await operator.send("/refund charge-lost")
    await confirm_refund(operator, telegram)  # Telegram lists no refund of it

    text = telegram.last_text_to(operator.id)
    assert "did not confirm the refund of <code>charge-lost</code>" in text
    assert "Nothing was changed" not in text
    assert purchase(session, "charge-lost").refunded_at is None

    telegram.star_transactions.append(star_refund("charge-done", alice, 50))
    await operator.send("/refund charge-done")
    await confirm_refund(operator, telegram)  # this one went through

    assert "Refunded 50 ⭐" in telegram.last_text_to(operator.id)
    assert purchase(session, "charge-done").refunded_at is not None
    assert ledger.audit(session=session) == []


async def test_a_refund_made_outside_the_bot_that_finds_tokens_spent_alerts_the_operators(
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
    engine: Engine,
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-outside")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    bill_request(engine, account_id, "req-outside", cost=40_000)

    await alice.refunded(invoice.payload, invoice.amount, "charge-outside")

    alert = telegram.last_text_to(operator.id)
    assert "A refund found the tokens spent" in alert
    assert "charge-outside" in alert and "40,000 of its tokens had already been used" in alert
    assert purchase(session, "charge-outside").refund_shortfall == 40_000
    assert ledger.audit(session=session) == []


async def test_reconciliation_alerts_the_operators_to_an_outside_refund_of_spent_tokens(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
    engine: Engine,
) -> None:
    """The refunded_payment update was lost; reconciliation reverses the purchase and, the
    tokens being partly spent, tells the operators."""
    invoice = await buy_pack(alice, telegram, charge_id="charge-quiet")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    bill_request(engine, account_id, "req-quiet", cost=60_000)
    telegram.star_transactions.extend(
        [
            star_payment("charge-quiet", alice, invoice.amount, invoice.payload),
            star_refund("charge-quiet", alice, invoice.amount),
        ]
    )

    report = await reconcile_star_transactions(shop_bot)

    assert report.refunded == ["charge-quiet"]
    alert = telegram.last_text_to(operator.id)
    assert "charge charge-quiet of user 100001 was refunded outside the bot" in alert
    assert "60000 of its 100000 tokens had already been used" in alert
    assert purchase(session, "charge-quiet").refund_shortfall == 60_000
