"""`/language`: the buyer picks the bot's language among the files under `bot/locales/`; the
choice is kept on the account and wins over the Telegram client's language."""

from __future__ import annotations

from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing.models import Account
from bot import keyboards
from bot.runtime import account_of, lang, runtime
from bot.texts import LANGUAGE_NAMES, t


async def choose(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    await update.effective_message.reply_text(
        t(lang(update, context), "language_choose"),
        reply_markup=keyboards.languages(LANGUAGE_NAMES),
    )


async def on_language(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    query = update.callback_query
    assert query is not None and query.data is not None and update.effective_user is not None
    await query.answer()
    code = query.data.removeprefix(keyboards.LANGUAGE)
    if code not in LANGUAGE_NAMES:
        await choose(update, context)
        return
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def work(session: Session) -> None:
        row = session.get(Account, account_id)
        assert row is not None
        row.chosen_language = code
        session.add(row)

    await shop.run(work)
    shop.languages[update.effective_user.id] = code
    await query.edit_message_text(t(code, "language_set", name=LANGUAGE_NAMES[code]))
    assert update.effective_message is not None
    await update.effective_message.reply_text(
        t(code, "menu_updated"), reply_markup=keyboards.main_menu(code)
    )
