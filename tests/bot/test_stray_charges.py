"""Stray charges: Stars Telegram took for nothing we can credit are recorded once and paid back
at once, the buyer is told plainly, the operators are alerted, and /refund, /paysupport and
reconciliation all know the charge."""

from __future__ import annotations

import asyncio

import pytest
from sqlmodel import Session, select
from telegram.ext import Application

from billing import ledger
from billing.models import Purchase, StrayCharge
from bot.jobs import reconcile_star_transactions
from tests.bot.double import FakeTelegram, TelegramUser, star_payment, star_refund
from tests.bot.stories import account_of, buy_pack, order_pack

pytestmark = pytest.mark.anyio

STARTER = 100_000


def strays(session: Session) -> list[StrayCharge]:
    session.rollback()  # see what the bot committed
    return list(session.exec(select(StrayCharge).order_by(StrayCharge.id)).all())


def refunds_of(telegram: FakeTelegram, charge_id: str) -> list[tuple[int, str]]:
    return [
        (int(call["user_id"]), call["telegram_payment_charge_id"])
        for call in telegram.calls("refundStarPayment")
        if call["telegram_payment_charge_id"] == charge_id
    ]


def alerts_about(telegram: FakeTelegram, operator: TelegramUser, charge_id: str) -> list[str]:
    return [text for text in telegram.texts_to(operator.id) if charge_id in text]


async def test_a_stray_charge_delivered_twice_is_recorded_once_refunded_once_and_refund_finds_it(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-real")

    for _ in range(2):  # a second genuine charge for the paid order, delivered twice
        await alice.paid(invoice.payload, invoice.amount, "charge-stray")

    [stray] = strays(session)
    assert (stray.telegram_payment_charge_id, stray.telegram_id) == ("charge-stray", alice.id)
    assert (stray.amount, stray.reason) == (50, "paid")
    assert stray.refunded_at is not None
    assert refunds_of(telegram, "charge-stray") == [(alice.id, "charge-stray")]
    told = [text for text in telegram.texts_to(alice.id) if "charge-stray" in text]
    assert len(told) == 2 and all("We have refunded it in full" in text for text in told)
    assert "this order had already been paid" in told[0]
    [alert] = alerts_about(telegram, operator, "charge-stray")
    assert "already paid" in alert and "refunded to the buyer at once" in alert
    account = account_of(session, alice)
    assert account.id is not None
    assert ledger.get_balance(session=session, account_id=account.id).purchased == STARTER

    await operator.send("/refund charge-stray")
    assert "was never credited (paid); it was refunded at" in telegram.last_text_to(operator.id)
    await alice.send("/paysupport")
    assert "<code>charge-stray</code> · not credited, refunded" in telegram.last_text_to(alice.id)
    assert len(telegram.calls("refundStarPayment")) == 1


async def test_a_stray_charge_delivered_twice_at_once_is_refunded_once(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-first")

    await asyncio.gather(
        *(alice.paid(invoice.payload, invoice.amount, "charge-again") for _ in range(4))
    )

    assert [stray.telegram_payment_charge_id for stray in strays(session)] == ["charge-again"]
    assert refunds_of(telegram, "charge-again") == [(alice.id, "charge-again")]


async def test_a_refund_telegram_refuses_is_retried_by_the_operator(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-ok")
    telegram.fail("refundStarPayment", "Bad Request: BALANCE_TOO_LOW")

    await alice.paid(invoice.payload, invoice.amount, "charge-owed")

    assert "It is being refunded in full" in telegram.last_text_to(alice.id)
    assert "Telegram refused the refund" in telegram.last_text_to(operator.id)
    [stray] = strays(session)
    assert stray.refunded_at is None and stray.refund_error is not None

    telegram.failures.clear()
    await operator.send("/refund charge-owed")

    assert "it is refunded now" in telegram.last_text_to(operator.id)
    assert "has been refunded in full" in telegram.last_text_to(alice.id)
    assert strays(session)[0].refunded_at is not None
    assert len(refunds_of(telegram, "charge-owed")) == 2  # the refused try and the retry


async def test_paying_someone_elses_invoice_is_refunded_not_credited(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await order_pack(alice, telegram)

    await boris.paid(invoice.payload, invoice.amount, "charge-boris")

    [stray] = strays(session)
    assert (stray.telegram_id, stray.reason) == (boris.id, "someone_else")
    assert refunds_of(telegram, "charge-boris") == [(boris.id, "charge-boris")]
    assert "счёт был выставлен другому пользователю" in telegram.last_text_to(boris.id)
    session.rollback()
    assert session.exec(select(Purchase)).all() == []


async def test_reconciliation_knows_a_recorded_stray_charge_and_reports_nothing(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-paid")
    await alice.paid(invoice.payload, invoice.amount, "charge-extra")
    telegram.star_transactions.extend(
        [
            star_payment("charge-paid", alice, invoice.amount, invoice.payload),
            star_payment("charge-extra", alice, invoice.amount, invoice.payload),
            star_refund("charge-extra", alice, invoice.amount),
        ]
    )
    telegram.forget()

    report = await reconcile_star_transactions(shop_bot)

    assert report.problems == [] and report.credited == [] and report.refunded == []
    assert telegram.texts_to(operator.id) == []


async def test_refund_finds_a_charge_only_telegram_knows_and_pays_it_back(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    """The update for a second charge was lost: reconciliation reports it, and /refund with the
    reported id records it and pays it back."""
    invoice = await buy_pack(alice, telegram, charge_id="charge-one")
    telegram.star_transactions.extend(
        [
            star_payment("charge-one", alice, invoice.amount, invoice.payload),
            star_payment("charge-lost", alice, invoice.amount, invoice.payload),
        ]
    )
    report = await reconcile_star_transactions(shop_bot)
    assert any("charge-lost" in problem for problem in report.problems)

    await operator.send("/refund charge-lost")

    assert "charge-lost" in telegram.last_text_to(operator.id)
    assert "it is refunded now" in telegram.last_text_to(operator.id)
    assert refunds_of(telegram, "charge-lost") == [(alice.id, "charge-lost")]
    [stray] = strays(session)
    assert (stray.reason, stray.amount, stray.refunded_at is not None) == ("unmatched", 50, True)
    telegram.star_transactions.append(star_refund("charge-lost", alice, invoice.amount))
    telegram.forget()
    assert (await reconcile_star_transactions(shop_bot)).problems == []
