"""Domain errors mapped to replies, in one place, and the error handler of last resort.

Handlers let billing errors propagate; `on_error` turns the ones a buyer can act on into a
reply in their language and everything else into a short apology, logs it, and the bot keeps
running. The pre-checkout answer, which must carry its own message, uses `order_refusal`.
"""

from __future__ import annotations

import logging

from telegram import Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from billing.errors import InvalidAmount, OrderError, UnknownPack
from bot.texts import Html, Lang, language_for, plain, t

logger = logging.getLogger(__name__)

ORDER_REASONS = {"unknown", "someone_else", "paid", "expired", "price"}


def order_refusal(error: OrderError, lang: Lang) -> str:
    """The pre-checkout refusal for an OrderError, in the buyer's language (plain text)."""
    if error.reason in ORDER_REASONS:
        return plain(lang, f"order_{error.reason}")
    return plain(lang, "order_generic")


def reply_for(error: BaseException, lang: Lang) -> Html:
    if isinstance(error, OrderError):
        return Html(order_refusal(error, lang))
    if isinstance(error, UnknownPack):
        return t(lang, "pack_unknown")
    if isinstance(error, InvalidAmount):
        return t(lang, "invalid_amount")
    return t(lang, "apology")


async def on_error(update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
    error = context.error
    update_id = update.update_id if isinstance(update, Update) else None
    logger.error("update %s failed", update_id, exc_info=error)
    if not isinstance(update, Update) or update.effective_chat is None or error is None:
        return
    user = update.effective_user
    lang = language_for(user.language_code if user else None)
    try:
        await context.bot.send_message(update.effective_chat.id, reply_for(error, lang))
    except TelegramError:
        logger.warning("could not apologise for update %s", update_id, exc_info=True)
