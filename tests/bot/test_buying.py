"""Buying a pack: terms, order and Stars invoice, pre-checkout, payment credited exactly once,
and the key with its ready-to-paste snippet on the first purchase."""

from __future__ import annotations

import asyncio
import html
import re
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session, select
from telegram.ext import Application

from billing import keys, ledger
from billing.models import Order, Purchase, utcnow
from tests.bot.conftest import PUBLIC_API
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack, order_pack, pre_checkout_answer

pytestmark = pytest.mark.anyio


async def test_the_first_purchase_asks_for_the_terms_once_and_records_them(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("🛒 Buy tokens")
    assert "accept the terms" in telegram.last_text_to(alice.id)
    assert account_of(session, alice).terms_accepted_at is None

    await alice.tap("terms:accept")

    assert account_of(session, alice).terms_accepted_at is not None
    packs = telegram.last("editMessageText")["reply_markup"]["inline_keyboard"]
    assert [row[0]["callback_data"] for row in packs] == ["pack:starter", "pack:pro"]
    assert packs[0][0]["text"] == "Starter · 100,000 tokens · 50 ⭐"

    await alice.send("/buy")
    assert telegram.last_text_to(alice.id).startswith("Choose a pack")


async def test_choosing_a_pack_creates_an_order_and_sends_a_stars_invoice(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await order_pack(alice, telegram, "pro")
    session.rollback()

    sent = telegram.last("sendInvoice")
    assert sent["currency"] == "XTR"
    assert "provider_token" not in sent.params
    assert sent["prices"] == [{"label": "2,000,000 tokens", "amount": 700}]
    assert sent["title"] == "Pro: 2,000,000 tokens"
    order = session.get(Order, invoice.payload)
    assert order is not None
    assert (order.account_id, order.pack_id, order.tokens, order.price) == (
        account_of(session, alice).id,
        "pro",
        2_000_000,
        700,
    )
    assert order.expires_at > utcnow() and order.paid_at is None


async def test_pre_checkout_accepts_the_buyers_own_unpaid_order(
    alice: TelegramUser, telegram: FakeTelegram
) -> None:
    invoice = await order_pack(alice, telegram)

    await alice.pre_checkout(invoice.payload, invoice.amount)

    assert pre_checkout_answer(telegram) == (True, None)


@pytest.mark.parametrize(
    ("forgery", "refusal"),
    [
        ("wrong amount", "The price has changed"),
        ("wrong currency", "The price has changed"),
        ("unknown order", "This invoice is not known"),
        ("unsigned payload", "This invoice is not known"),
        ("empty payload", "This invoice is not known"),
    ],
)
async def test_pre_checkout_refuses_a_forged_invoice(
    alice: TelegramUser, telegram: FakeTelegram, forgery: str, refusal: str
) -> None:
    invoice = await order_pack(alice, telegram)
    payload, amount, currency = invoice.payload, invoice.amount, "XTR"
    if forgery == "wrong amount":
        amount = 1
    elif forgery == "wrong currency":
        currency = "USD"
    elif forgery == "unknown order":
        payload = "A" * len(invoice.payload)
    elif forgery == "unsigned payload":
        payload = '{"pack": "pro", "tokens": 99999999}'
    elif forgery == "empty payload":
        payload = ""

    await alice.pre_checkout(payload, amount, currency)

    ok, message = pre_checkout_answer(telegram)
    assert not ok and message is not None and message.startswith(refusal)


async def test_pre_checkout_refuses_someone_elses_order(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram
) -> None:
    invoice = await order_pack(alice, telegram)

    await boris.pre_checkout(invoice.payload, invoice.amount)

    assert pre_checkout_answer(telegram) == (False, "Этот счёт выставлен другому пользователю.")


async def test_pre_checkout_refuses_an_expired_or_paid_order(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    paid = await buy_pack(alice, telegram, charge_id="charge-paid")
    await alice.pre_checkout(paid.payload, paid.amount)
    assert pre_checkout_answer(telegram) == (False, "This invoice has already been paid.")

    stale = await order_pack(alice, telegram)
    session.rollback()
    order = session.get(Order, stale.payload)
    assert order is not None
    order.expires_at = utcnow() - timedelta(seconds=1)
    session.add(order)
    session.commit()
    await alice.pre_checkout(stale.payload, stale.amount)
    assert pre_checkout_answer(telegram) == (
        False,
        "This invoice has expired. Please choose a pack again.",
    )


async def test_a_payment_delivered_twice_is_credited_once(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-twice")

    await alice.paid(invoice.payload, invoice.amount, "charge-twice")  # Telegram retries

    session.rollback()
    account = account_of(session, alice)
    assert account.id is not None
    assert ledger.get_balance(session=session, account_id=account.id).purchased == 100_000
    purchases = session.exec(select(Purchase).where(Purchase.account_id == account.id)).all()
    assert [p.telegram_payment_charge_id for p in purchases] == ["charge-twice"]
    assert ledger.audit(session=session) == []
    confirmations = [text for text in telegram.texts_to(alice.id) if "Payment received" in text]
    assert len(confirmations) == 2  # the repeat repeats the confirmation, not the credit
    assert "Available now: 100,000 tokens" in confirmations[-1]


async def test_the_first_purchase_shows_a_working_key_with_a_ready_to_paste_snippet(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-first")

    received, with_key = telegram.texts_to(alice.id)[-2:]
    assert "Payment received: +100,000 tokens" in received
    assert "Available now: 100,000 tokens" in received
    key = re.search(r"<code>(sk-tks-\w+)</code>", with_key)
    assert key is not None
    assert f"<code>{PUBLIC_API}</code>" in with_key
    assert html.escape(f"curl {PUBLIC_API}/chat/completions", quote=False) in with_key
    assert f"Authorization: Bearer {key.group(1)}" in with_key
    assert html.escape(
        f'OpenAI(base_url="{PUBLIC_API}", api_key="{key.group(1)}")', quote=False
    ) in (with_key)
    identity = keys.authenticate(session=session, key=key.group(1))
    assert identity.account_id == account_of(session, alice).id


async def test_a_second_purchase_adds_tokens_without_repeating_the_key(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-1")
    telegram.forget()

    await buy_pack(alice, telegram, charge_id="charge-2", pack="pro")

    assert "Available now: 2,100,000 tokens" in telegram.last_text_to(alice.id)
    assert not any("sk-tks-" in text for text in telegram.texts_to(alice.id))


async def test_a_payment_for_an_order_of_someone_else_is_not_credited_and_is_reported(
    alice: TelegramUser,
    boris: TelegramUser,
    operator: TelegramUser,
    telegram: FakeTelegram,
    session: Session,
) -> None:
    invoice = await order_pack(alice, telegram)

    await boris.paid(invoice.payload, invoice.amount, "charge-odd")
    session.rollback()

    assert session.exec(select(Purchase)).all() == []
    assert "<code>charge-odd</code>" in telegram.last_text_to(boris.id)
    assert "charge-odd" in telegram.last_text_to(operator.id)


async def test_a_pack_that_is_no_longer_sold_gets_the_current_list_and_no_invoice(
    alice: TelegramUser, telegram: FakeTelegram
) -> None:
    await order_pack(alice, telegram)
    telegram.forget()

    await alice.tap("pack:gold")

    assert telegram.last_text_to(alice.id).startswith("That pack is no longer sold")
    assert telegram.calls("sendInvoice") == []


async def test_a_slow_handler_does_not_delay_anothers_pre_checkout_answer(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    boris: TelegramUser,
    telegram: FakeTelegram,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    invoice = await order_pack(alice, telegram)
    stuck = threading.Event()
    real_balance = ledger.get_balance

    def slow_balance(**kwargs: Any) -> ledger.Balance:
        stuck.wait(timeout=30)
        return real_balance(**kwargs)

    monkeypatch.setattr(ledger, "get_balance", slow_balance)
    answered, replied = telegram.called("answerPreCheckoutQuery"), telegram.called("sendMessage")
    await shop_bot.start()  # updates now flow through the queue, as when polling
    try:
        await replace(boris, queued=True).send("/balance")  # stuck in the database
        await replace(alice, queued=True).pre_checkout(invoice.payload, invoice.amount)
        await asyncio.wait_for(answered.wait(), timeout=10)
        assert pre_checkout_answer(telegram) == (True, None)
        assert not replied.is_set()  # Boris is still waiting
    finally:
        stuck.set()
        await asyncio.wait_for(replied.wait(), timeout=10)
        await shop_bot.stop()


async def test_a_forged_payment_for_an_unknown_order_credits_nothing_however_often_sent(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    for _ in range(3):  # a forger (or a confused Telegram) repeats it
        await alice.paid("no-such-order", 50, "charge-forged")
    session.rollback()

    assert session.exec(select(Purchase)).all() == []
    assert ledger.audit(session=session) == []
    assert not any("Payment received" in text for text in telegram.texts_to(alice.id))
    assert "charge-forged" in telegram.last_text_to(operator.id)
