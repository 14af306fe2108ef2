"""Balance: available, in use, purchased, granted, used and refunded tokens, and the last requests.

The API bills a request when it ends, so the figures are as of the last finished request;
"in use" is what running requests have reserved.
"""

from __future__ import annotations

from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing import ledger
from billing.models import LedgerEntry
from bot.runtime import account_of, lang, runtime
from bot.texts import Html, lines, number, t, when

RECENT_REQUESTS = 5


async def show_balance(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> tuple[ledger.Balance, list[LedgerEntry]]:
        balance = ledger.get_balance(session=session, account_id=account_id)
        # Released holds (nothing generated) are ledger entries of 0 tokens: not worth a line.
        history = ledger.usage_history(
            session=session, account_id=account_id, limit=RECENT_REQUESTS * 4
        )
        return balance, [entry for entry in history if entry.amount][:RECENT_REQUESTS]

    balance, history = await runtime(context).read(work)
    language = lang(update)
    figures = {
        name: number(language, getattr(balance, name))
        for name in ("available", "held", "purchased", "granted", "used", "refunded")
    }
    parts: list[Html] = [t(language, "balance", **figures)]
    if history:
        parts.append(t(language, "balance_history"))
        parts.extend(
            t(
                language,
                "balance_history_line",
                time=when(entry.created_at),
                model=entry.model or "—",
                tokens=number(language, -entry.amount),
            )
            for entry in history
        )
    else:
        parts.append(t(language, "balance_no_history"))
    if balance.available <= 0:
        parts.append(t(language, "balance_empty_hint"))
    await update.effective_message.reply_text(lines(parts))
