"""Steps that several stories share: accepting the terms and buying a pack end to end, and a
second bot process on the same database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from sqlmodel import Session
from telegram.ext import Application

from billing.accounts import find_telegram_account
from billing.models import Account
from bot.app import build_application
from bot.settings import BotSettings
from tests.bot.double import FakeTelegram, TelegramUser


@dataclass(frozen=True)
class Invoice:
    payload: str
    amount: int
    currency: str


async def order_pack(user: TelegramUser, telegram: FakeTelegram, pack: str = "starter") -> Invoice:
    """Open the shop, accept the terms if asked, tap a pack: the invoice the bot sends."""
    await user.send("/buy")
    if "terms:accept" in str(telegram.last("sendMessage").get("reply_markup")):
        await user.tap("terms:accept")
    await user.tap(f"pack:{pack}")
    invoice = telegram.last("sendInvoice")
    return Invoice(invoice["payload"], invoice["prices"][0]["amount"], invoice["currency"])


def pre_checkout_answer(telegram: FakeTelegram) -> tuple[bool, str | None]:
    answer = telegram.last("answerPreCheckoutQuery")
    return answer["ok"] == "true", answer.get("error_message")


async def buy_pack(
    user: TelegramUser, telegram: FakeTelegram, charge_id: str, pack: str = "starter"
) -> Invoice:
    """The whole purchase: invoice, pre-checkout accepted, payment delivered."""
    invoice = await order_pack(user, telegram, pack)
    await user.pre_checkout(invoice.payload, invoice.amount)
    assert pre_checkout_answer(telegram) == (True, None)
    await user.paid(invoice.payload, invoice.amount, charge_id)
    return invoice


def buttons(telegram: FakeTelegram, method: str | None = None) -> list[str]:
    """The callback data of the inline keyboard the bot last sent (or edited in)."""
    calls = [
        call
        for call in telegram.calls_made
        if (call.method == method if method else call.method in ("sendMessage", "editMessageText"))
        and isinstance(call.get("reply_markup"), dict)
        and "inline_keyboard" in call["reply_markup"]
    ]
    assert calls, "the bot sent no inline keyboard"
    keyboard = calls[-1]["reply_markup"]["inline_keyboard"]
    return [button["callback_data"] for row in keyboard for button in row]


async def confirm_refund(operator: TelegramUser, telegram: FakeTelegram) -> None:
    """Tap "Refund" under the figures /refund showed."""
    data = [item for item in buttons(telegram) if item.startswith("refund:p:")]
    assert len(data) == 1, data
    await operator.tap(data[0])


def account_of(session: Session, user: TelegramUser) -> Account:
    """The user's account as the database has it now (the test's read transaction is ended first,
    so it sees what the bot committed since)."""
    session.rollback()
    account = find_telegram_account(session=session, telegram_id=user.id)
    assert account is not None and account.id is not None
    return account


@asynccontextmanager
async def another_bot(settings: BotSettings) -> AsyncIterator[Application]:  # type: ignore[type-arg]
    """A second bot process on the same database, started as `run_polling` starts one."""
    application = build_application(settings)
    await application.initialize()
    assert application.post_init is not None and application.post_shutdown is not None
    await application.post_init(application)
    try:
        yield application
    finally:
        await application.post_shutdown(application)
        await application.shutdown()
