"""`/start` and the menu: the way in, and the persistent keyboard that routes to each feature."""

from __future__ import annotations

from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing import referrals
from billing.models import Account
from bot import keyboards
from bot.handlers import balance, key, shop, support
from bot.runtime import first_contact, lang, runtime
from bot.texts import number, t


async def start(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Greet, record the account, show the menu. Deep links: `/start buy` opens the packs,
    `/start ref_<code>` ties a buyer who has bought nothing yet to whoever shared the link."""
    assert update.effective_message is not None and update.effective_user is not None
    contact = await first_contact(update, context)
    language = lang(update, context)
    await update.effective_message.reply_text(
        t(language, "welcome", name=update.effective_user.first_name),
        reply_markup=keyboards.main_menu(language),
    )
    if contact.starter_tokens:
        await update.effective_message.reply_text(
            t(language, "starter_tokens", tokens=number(language, contact.starter_tokens))
        )
    argument = context.args[0] if context.args else ""
    if argument == "buy":
        await shop.show_packs(update, context)
    elif argument.startswith(referrals.LINK_PREFIX):
        await _follow_referral(update, context, contact.account, argument)


async def _follow_referral(
    update: Update, context: ContextTypes.DEFAULT_TYPE, account: Account, argument: str
) -> None:
    assert update.effective_message is not None and account.id is not None
    account_id = account.id
    shop_runtime = runtime(context)
    share = shop_runtime.settings.referral_share_percent
    code = argument.removeprefix(referrals.LINK_PREFIX)

    def work(session: Session) -> bool:
        return referrals.link(
            session=session, account_id=account_id, code=code, share_percent=share
        )

    if await shop_runtime.run(work):
        await update.effective_message.reply_text(t(lang(update, context), "referral_linked"))


_MENU = {
    "buy": shop.show_packs,
    "key": key.show_key,
    "balance": balance.show_balance,
    "help": support.show_help,
    "support": support.ask,
}
_LABELS = keyboards.menu_labels()


async def on_menu(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A tap on the persistent menu (its labels arrive as plain text messages)."""
    assert update.effective_message is not None
    action = _LABELS[update.effective_message.text or ""]
    await _MENU[action](update, context)
