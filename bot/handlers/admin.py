"""Operator commands, registered only for `ADMIN_TELEGRAM_IDS`; anyone else falls through to the
ordinary unknown-command reply, so the commands never reveal themselves.

`/refund` asks Telegram first and changes the books only after Telegram returned the Stars: a
failed call leaves everything as it was, and repeating the command is safe.
"""

from __future__ import annotations

import logging

from sqlmodel import Session
from telegram import Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from billing import accounts, keys, ledger, lookup
from billing.errors import AccountNotFound, InvalidAmount
from billing.stats import ShopStats, shop_stats, start_of_day
from bot.handlers.payments import refund_notice
from bot.runtime import lang, runtime
from bot.texts import Html, Lang, language_for, number, t

logger = logging.getLogger(__name__)


async def stats(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None

    def work(session: Session) -> tuple[ShopStats, ShopStats]:
        return (
            shop_stats(session=session, since=start_of_day()),
            shop_stats(session=session),
        )

    today, total = await runtime(context).read(work)
    language = lang(update)
    await update.effective_message.reply_text(
        t(language, "stats", today=_block(language, today), total=_block(language, total))
    )


def _block(language: Lang, figures: ShopStats) -> Html:
    return t(
        language,
        "stats_block",
        buyers=number(language, figures.buyers),
        purchases=number(language, figures.purchases),
        revenue=number(language, figures.revenue),
        refunded=number(language, figures.refunded),
        sold=number(language, figures.tokens_sold),
        granted=number(language, figures.tokens_granted),
        used=number(language, figures.tokens_used),
    )


async def refund(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`/refund <charge_id>`: return the Stars through Telegram, then reverse the tokens."""
    message = update.effective_message
    assert message is not None
    language = lang(update)
    if len(context.args or []) != 1:
        await message.reply_text(t(language, "refund_usage"))
        return
    charge_id = (context.args or [""])[0]
    shop = runtime(context)

    def find(session: Session) -> lookup.PurchaseOwner | None:
        return lookup.find_purchase(session=session, charge_id=charge_id)

    found = await shop.read(find)
    if found is None or found.telegram_id is None:
        await message.reply_text(t(language, "refund_unknown", charge_id=charge_id))
        return
    if found.purchase.refunded_at is not None:
        await message.reply_text(t(language, "refund_already", charge_id=charge_id))
        return
    try:
        await context.bot.refund_star_payment(found.telegram_id, charge_id)
    except TelegramError as error:
        logger.warning("Telegram refused to refund %s: %s", charge_id, error)
        await message.reply_text(t(language, "refund_telegram_failed", error=error.message))
        return

    def reverse(session: Session) -> tuple[ledger.RefundResult, str | None]:
        result = ledger.refund_purchase(session=session, charge_id=charge_id)
        buyer = accounts.get_account(session=session, account_id=result.purchase.account_id)
        return result, buyer.language

    result, buyer_language = await shop.run(reverse)
    shortfall = (
        t(language, "refund_shortfall", tokens=number(language, result.shortfall))
        if result.shortfall
        else Html("")
    )
    await message.reply_text(
        t(
            language,
            "refund_done",
            price=result.purchase.price,
            charge_id=charge_id,
            tokens=number(language, result.reversed_tokens),
            shortfall=shortfall,
        )
    )
    if result.newly_refunded:
        await _tell(context, found.telegram_id, refund_notice(language_for(buyer_language), result))


async def grant(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`/grant <telegram_id> <tokens>`: support credits and promotions, with a key if none yet."""
    message = update.effective_message
    assert message is not None
    language = lang(update)
    args = context.args or []
    if len(args) != 2 or not args[0].lstrip("-").isdigit():
        await message.reply_text(t(language, "grant_usage"))
        return
    telegram_id = int(args[0])
    if not args[1].isdigit() or int(args[1]) <= 0:
        await message.reply_text(t(language, "invalid_amount"))
        return
    tokens = int(args[1])
    shop = runtime(context)
    admin_id = update.effective_user.id if update.effective_user else None

    def work(session: Session) -> tuple[int, str | None]:
        account = accounts.get_account(session=session, telegram_id=telegram_id)
        assert account.id is not None
        ledger.grant(
            session=session, account_id=account.id, tokens=tokens, note=f"/grant by {admin_id}"
        )
        keys.ensure_key(session=session, account_id=account.id, secret_key=shop.secret_key)
        return ledger.get_balance(session=session, account_id=account.id).available, (
            account.language
        )

    try:
        available, buyer_language = await shop.run(work)
    except AccountNotFound:
        await message.reply_text(t(language, "grant_no_account", telegram_id=telegram_id))
        return
    except InvalidAmount:
        await message.reply_text(t(language, "invalid_amount"))
        return
    await message.reply_text(
        t(
            language,
            "grant_done",
            tokens=number(language, tokens),
            telegram_id=telegram_id,
            available=number(language, available),
        )
    )
    buyer = language_for(buyer_language)
    await _tell(context, telegram_id, t(buyer, "granted", tokens=number(buyer, tokens)))


async def _tell(context: ContextTypes.DEFAULT_TYPE, chat_id: int, text: str) -> None:
    """A courtesy message to a buyer; a buyer who blocked the bot changes nothing."""
    try:
        await context.bot.send_message(chat_id, text)
    except TelegramError:
        logger.info("could not message %s", chat_id, exc_info=True)
