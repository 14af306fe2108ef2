"""Refunds: the operator's /refund (Telegram first, then the books), Telegram's refunded_payment
update, and /paysupport, where a buyer finds the charge id to quote."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from billing import ledger
from billing.models import LedgerEntry, Purchase
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack

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
    telegram.fail("refundStarPayment", "Bad Request: CHARGE_ALREADY_REFUNDED")

    await operator.send("/refund charge-nope")

    assert "Telegram refused the refund" in telegram.last_text_to(operator.id)
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
