"""`/help`, `/terms`, `/privacy` and `/paysupport` (Telegram requires the last three of bots that
sell digital goods), and the replies to anything the bot does not understand."""

from __future__ import annotations

from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing.models import Purchase
from billing.purchases import recent_purchases
from bot import keyboards
from bot.runtime import account_of, lang, runtime
from bot.texts import Html, lines, t, when

RECENT_CHARGES = 10


async def show_help(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    language = lang(update)
    await update.effective_message.reply_text(
        t(language, "help"), reply_markup=keyboards.main_menu(language)
    )


async def show_terms(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    await update.effective_message.reply_text(t(lang(update), "terms"))


async def show_privacy(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    await update.effective_message.reply_text(t(lang(update), "privacy"))


async def pay_support(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The buyer's recent charges, with the ids a refund request needs, and whom to ask."""
    assert update.effective_message is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> list[Purchase]:
        return recent_purchases(session=session, account_id=account_id, limit=RECENT_CHARGES)

    purchases = await runtime(context).run(work)
    language = lang(update)
    listed = (
        lines(
            [
                t(
                    language,
                    "paysupport_line",
                    time=when(purchase.created_at),
                    pack=purchase.pack_title,
                    price=purchase.price,
                    charge_id=purchase.telegram_payment_charge_id,
                    refunded=t(language, "paysupport_refunded")
                    if purchase.refunded_at
                    else Html(""),
                )
                for purchase in purchases
            ]
        )
        if purchases
        else t(language, "paysupport_none")
    )
    contact = runtime(context).settings.support_contact or t(language, "paysupport_contact_default")
    await update.effective_message.reply_text(
        t(language, "paysupport", purchases=listed, contact=contact)
    )


async def unknown_command(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Every command nobody handled, operator commands sent by others included: the same reply,
    so the operator commands do not reveal themselves."""
    assert update.effective_message is not None
    await update.effective_message.reply_text(t(lang(update), "unknown_command"))


async def fallback(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    language = lang(update)
    await update.effective_message.reply_text(
        t(language, "help"), reply_markup=keyboards.main_menu(language)
    )
