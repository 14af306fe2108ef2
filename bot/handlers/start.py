"""`/start` and the menu: the way in, and the persistent keyboard that routes to each feature."""

from __future__ import annotations

from telegram import Update
from telegram.ext import ContextTypes

from bot import keyboards
from bot.handlers import balance, key, shop, support
from bot.runtime import account_of, lang
from bot.texts import t


async def start(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Greet, record the account, show the menu; `/start buy` (a deep link) opens the packs."""
    assert update.effective_message is not None and update.effective_user is not None
    await account_of(update, context)
    language = lang(update)
    await update.effective_message.reply_text(
        t(language, "welcome", name=update.effective_user.first_name),
        reply_markup=keyboards.main_menu(language),
    )
    if context.args and context.args[0] == "buy":
        await shop.show_packs(update, context)


_MENU = {
    "buy": shop.show_packs,
    "key": key.show_key,
    "balance": balance.show_balance,
    "help": support.show_help,
}
_LABELS = keyboards.menu_labels()


async def on_menu(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A tap on the persistent menu (its labels arrive as plain text messages)."""
    assert update.effective_message is not None
    action = _LABELS[update.effective_message.text or ""]
    await _MENU[action](update, context)
