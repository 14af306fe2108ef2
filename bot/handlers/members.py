"""`my_chat_member`: Telegram tells the bot when a user blocks it (or unblocks it). A blocked
user's account is marked, and the notices job leaves them out until they come back."""

from __future__ import annotations

from sqlmodel import Session
from telegram import ChatMember, Update
from telegram.ext import ContextTypes

from billing.accounts import find_telegram_account
from billing.models import utcnow
from bot.runtime import runtime


async def on_my_chat_member(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    change = update.my_chat_member
    if change is None or change.chat.type != "private":
        return
    blocked = change.new_chat_member.status in (ChatMember.BANNED, ChatMember.LEFT)
    telegram_id = change.chat.id

    def work(session: Session) -> None:
        account = find_telegram_account(session=session, telegram_id=telegram_id)
        if account is None:
            return
        account.blocked_at = (account.blocked_at or utcnow()) if blocked else None
        session.add(account)

    await runtime(context).run(work)
