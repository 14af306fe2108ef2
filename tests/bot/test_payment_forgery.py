"""Forged and repeated payments: money moves once per order, whatever arrives and however it
races, and updates posted to the webhook without Telegram's secret are never processed."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from sqlmodel import Session, select
from telegram.ext import Application

from billing import ledger
from billing.models import Purchase
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack, order_pack, pre_checkout_answer

pytestmark = pytest.mark.anyio

STARTER = 100_000


def _purchases(session: Session) -> list[str]:
    session.rollback()  # see what the bot committed
    return sorted(p.telegram_payment_charge_id for p in session.exec(select(Purchase)).all())


async def test_a_forged_payment_with_a_new_charge_id_for_a_paid_order_credits_nothing(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-real")

    for _ in range(2):  # the same order "paid" again under a charge id nobody has seen
        await alice.paid(invoice.payload, invoice.amount, "charge-forged")

    assert _purchases(session) == ["charge-real"]
    account = account_of(session, alice)
    assert account.id is not None
    assert ledger.get_balance(session=session, account_id=account.id).purchased == STARTER
    assert ledger.audit(session=session) == []
    confirmations = [text for text in telegram.texts_to(alice.id) if "Payment received" in text]
    assert len(confirmations) == 1
    assert "could not be credited" in telegram.last_text_to(alice.id)
    alert = telegram.last_text_to(operator.id)
    assert "charge-forged" in alert and "already paid" in alert
    assert len(telegram.calls("refundStarPayment")) == 1  # the Stars went back, once


async def test_one_payment_delivered_several_times_at_once_is_credited_once(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await order_pack(alice, telegram)
    await alice.pre_checkout(invoice.payload, invoice.amount)
    assert pre_checkout_answer(telegram) == (True, None)

    await asyncio.gather(
        *(alice.paid(invoice.payload, invoice.amount, "charge-once") for _ in range(5))
    )

    assert _purchases(session) == ["charge-once"]
    account = account_of(session, alice)
    assert account.id is not None
    assert ledger.get_balance(session=session, account_id=account.id).purchased == STARTER
    assert ledger.audit(session=session) == []


async def test_two_charges_racing_for_one_order_credit_it_once(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await order_pack(alice, telegram)
    await alice.pre_checkout(invoice.payload, invoice.amount)

    await asyncio.gather(
        alice.paid(invoice.payload, invoice.amount, "charge-a"),
        alice.paid(invoice.payload, invoice.amount, "charge-b"),
    )

    credited = _purchases(session)
    assert credited in (["charge-a"], ["charge-b"])
    account = account_of(session, alice)
    assert account.id is not None
    assert ledger.get_balance(session=session, account_id=account.id).purchased == STARTER
    assert ledger.audit(session=session) == []
    loser = "charge-b" if credited == ["charge-a"] else "charge-a"
    assert loser in telegram.last_text_to(operator.id)


async def test_a_payment_posted_to_the_webhook_without_the_secret_is_never_processed(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    """The real webhook server of python-telegram-bot: a forger who knows the URL and a real
    order's payload still cannot deliver a successful payment without the secret token."""
    invoice = await order_pack(alice, telegram)
    await alice.pre_checkout(invoice.payload, invoice.amount)
    assert telegram.router is not None and shop_bot.updater is not None
    telegram.router.route(host="127.0.0.1").pass_through()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    update = {
        "update_id": 900_001,
        "message": {
            "message_id": 1,
            "date": int(time.time()),
            "chat": {"id": alice.id, "type": "private"},
            "from": alice.as_dict(),
            "successful_payment": {
                "currency": "XTR",
                "total_amount": invoice.amount,
                "invoice_payload": invoice.payload,
                "telegram_payment_charge_id": "charge-webhook",
                "provider_payment_charge_id": "",
            },
        },
    }
    body = json.dumps(update)
    json_type = {"Content-Type": "application/json"}
    await shop_bot.updater.start_webhook(
        listen="127.0.0.1",
        port=port,
        url_path="telegram",
        webhook_url="https://bot.example.test/telegram",
        secret_token="the-real-secret",
    )
    try:
        url = f"http://127.0.0.1:{port}/telegram"
        async with httpx.AsyncClient() as client:
            refused = [await client.post(url, content=body, headers=json_type)] + [
                await client.post(
                    url,
                    content=body,
                    headers=json_type | {"X-Telegram-Bot-Api-Secret-Token": secret},
                )
                for secret in ("guess", "the-real-secre", "the-real-secretX", "THE-REAL-SECRET")
            ]
            assert [r.status_code for r in refused] == [403] * 5
            assert shop_bot.update_queue.empty()  # nothing reached the handlers
            assert _purchases(session) == []

            accepted = await client.post(
                url,
                content=body,
                headers=json_type | {"X-Telegram-Bot-Api-Secret-Token": "the-real-secret"},
            )
        assert accepted.status_code == 200
        delivered = await asyncio.wait_for(shop_bot.update_queue.get(), timeout=10)
    finally:
        await shop_bot.updater.stop()

    await shop_bot.process_update(delivered)
    assert _purchases(session) == ["charge-webhook"]
    assert ledger.audit(session=session) == []
