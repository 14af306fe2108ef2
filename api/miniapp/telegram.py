"""The Bot API calls an API process makes for the Mini App, through python-telegram-bot's `Bot`
(the bot's own client, so the base URL, errors and retries behave as the bot's do).

An invoice link is made for an order exactly as the bot's invoice is (`bot/handlers/shop.py`):
its payload is the order's opaque id, so the bot's pre-checkout check and `successful_payment`
handler treat a purchase made in the page like one made in the chat, and only they credit it.
"""

from __future__ import annotations

import logging

from telegram import Bot, InputFile, LabeledPrice
from telegram.error import TelegramError

from billing.models import Order

logger = logging.getLogger("tokenshop.api")

INVOICE_TITLE_LIMIT = 32  # Telegram's limits for an invoice
INVOICE_DESCRIPTION_LIMIT = 255
# The bot's own wording (bot/locales), for the languages it speaks; others get English.
_INVOICE_TEXTS = {
    "en": (
        "{title}: {tokens} tokens",
        "{tokens} tokens for the OpenAI-compatible API. Credited right after payment.",
        "{tokens} tokens",
    ),
    "ru": (
        "{title}: {tokens} токенов",
        "{tokens} токенов для API, совместимого с OpenAI. Зачисляются сразу после оплаты.",
        "{tokens} токенов",
    ),
}
# A monthly plan's invoice, a subscription's (the bot's plan_invoice_* texts).
_PLAN_TEXTS = {
    "en": (
        "{title}: {tokens}/month",
        "{tokens} tokens for the OpenAI-compatible API every 30 days, charged in Stars until "
        "you cancel under /plan. Unused tokens carry over.",
        "{tokens} tokens every 30 days",
    ),
    "ru": (
        "{title}: {tokens}/мес",
        "{tokens} токенов для API, совместимого с OpenAI, каждые 30 дней; оплата в Stars, "
        "пока вы не отмените в /plan. Неизрасходованные токены переносятся.",
        "{tokens} токенов каждые 30 дней",
    ),
}


_CSV_CAPTIONS = {"en": "Every billed request, as CSV.", "ru": "Все оплаченные запросы в CSV."}


class TelegramUnavailable(Exception):
    """Raised when the Bot API refused or did not answer a call the page needed."""


def _number(language: str, value: int) -> str:
    grouped = f"{value:,}"
    return grouped.replace(",", "\u00a0") if language == "ru" else grouped


class BotApi:
    """One `Bot` per API process, made in the lifespan and shut down with it."""

    def __init__(self, token: str, base_url: str | None = None) -> None:
        self.bot = Bot(token, base_url=base_url) if base_url else Bot(token)

    async def invoice_link(self, order: Order, language: str | None) -> str:
        """A Stars invoice link for the order, for `Telegram.WebApp.openInvoice`; a monthly
        plan's order gets a subscription's link (`subscription_period`)."""
        code = (language or "en").split("-")[0].lower()
        texts = _INVOICE_TEXTS if order.subscription_period is None else _PLAN_TEXTS
        title, description, label = texts.get(code, texts["en"])
        code = code if code in _INVOICE_TEXTS else "en"
        tokens = _number(code, order.tokens)
        try:
            return await self.bot.create_invoice_link(
                title=title.format(title=order.pack_title, tokens=tokens)[:INVOICE_TITLE_LIMIT],
                description=description.format(tokens=tokens)[:INVOICE_DESCRIPTION_LIMIT],
                payload=order.id,
                currency=order.currency,
                prices=[LabeledPrice(label.format(tokens=tokens), order.price)],
                subscription_period=order.subscription_period,
            )
        except TelegramError as error:
            logger.warning("createInvoiceLink failed: %s", error.message)
            raise TelegramUnavailable("Telegram did not make the invoice; try again.") from error

    async def send(self, chat_id: int, text: str) -> int | None:
        """Send an HTML message; its id, or None if Telegram refused (a chat never opened)."""
        try:
            sent = await self.bot.send_message(chat_id, text, parse_mode="HTML")
        except TelegramError as error:
            logger.warning("could not message %s: %s", chat_id, error.message)
            return None
        return sent.message_id

    async def send_csv(self, chat_id: int, data: str, language: str | None) -> None:
        """The usage export as a document in the buyer's chat with the bot, as the bot's own
        CSV button sends it (a Mini App's webview may not save files)."""
        code = (language or "en").split("-")[0].lower()
        caption = _CSV_CAPTIONS.get(code, _CSV_CAPTIONS["en"])
        try:
            await self.bot.send_document(
                chat_id,
                InputFile(data.encode(), filename="tokenshop-usage.csv"),
                caption=caption,
            )
        except TelegramError as error:
            logger.warning("sendDocument failed: %s", error.message)
            raise TelegramUnavailable("Telegram did not take the file; try again.") from error

    async def close(self) -> None:
        await self.bot.shutdown()
