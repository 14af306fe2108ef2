"""A buyer asks for a refund from the charges under /paysupport: under the terms' rule (within
the window, the pack's tokens unused) it is refunded at once; otherwise an operator decides."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from billing.models import Purchase
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buttons, buy_pack
from tests.factories import bill_request

pytestmark = pytest.mark.anyio


def claim_button(telegram: FakeTelegram) -> str:
    [claim] = [data for data in buttons(telegram) if data.startswith("claim:")]
    return claim


def purchase(session: Session, charge_id: str) -> Purchase:
    session.rollback()
    return session.exec(
        select(Purchase).where(Purchase.telegram_payment_charge_id == charge_id)
    ).one()


async def test_an_unused_pack_within_the_window_is_refunded_at_once(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-claim")
    await alice.send("/paysupport")

    await alice.tap(claim_button(telegram))

    assert [
        (int(call["user_id"]), call["telegram_payment_charge_id"])
        for call in telegram.calls("refundStarPayment")
    ] == [(alice.id, "charge-claim")]
    assert "was refunded; 100,000 tokens were removed" in telegram.last_text_to(alice.id)
    assert "Refunded under the terms' rule" in telegram.last_text_to(operator.id)
    assert purchase(session, "charge-claim").refunded_tokens == 100_000

    await alice.send("/paysupport")
    assert [data for data in buttons(telegram) if data.startswith("claim:")] == []


async def test_a_used_pack_goes_to_the_operator_who_refunds_it_with_one_tap(
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
    engine: Engine,
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-used")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    bill_request(engine, account_id, "req-used", cost=25_000)
    await alice.send("/paysupport")

    await alice.tap(claim_button(telegram))

    assert telegram.calls("refundStarPayment") == []
    assert "passed to the operators" in telegram.last_text_to(alice.id)
    card = telegram.sent_to(operator.id)[-1]
    assert "Refund request</b> from Alice" in card["text"]
    assert "a refund leaves 25,000 spent" in card["text"]
    assert "tokens of the pack were used" in card["text"]

    await operator.tap(next(data for data in buttons(telegram) if data.startswith("refund:p:")))

    assert "Refunded 50 ⭐" in telegram.last_text_to(operator.id)
    assert "75,000 tokens were removed" in telegram.last_text_to(alice.id)
    refunded = purchase(session, "charge-used")
    assert (refunded.refunded_tokens, refunded.refund_shortfall) == (75_000, 25_000)

    await operator.send("Done, and the used part stays used.", reply_to=card)
    assert "Done, and the used part stays used." in telegram.last_text_to(alice.id)


async def test_nobody_can_ask_to_refund_someone_elses_purchase(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-mine")
    await alice.send("/paysupport")
    claim = claim_button(telegram)

    await boris.tap(claim)

    assert telegram.last_text_to(boris.id) == "Эта покупка не ваша или её больше нет."
    assert telegram.calls("refundStarPayment") == []
    assert purchase(session, "charge-mine").refunded_at is None


async def test_a_purchase_that_paid_a_referral_reward_waits_for_the_operator(
    alice: TelegramUser,
    boris: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
) -> None:
    """Buying and refunding at once must not mint referral tokens."""
    await alice.send("/invite")
    link = re.search(r"start=(ref_\w+)", telegram.last_text_to(alice.id))
    assert link is not None
    await boris.send(f"/start {link.group(1)}")
    await buy_pack(boris, telegram, charge_id="charge-ref-first")
    await boris.send("/paysupport")

    await boris.tap(claim_button(telegram))

    assert telegram.calls("refundStarPayment") == []
    assert "the purchase paid a referral reward" in telegram.last_text_to(operator.id)
