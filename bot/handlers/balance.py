"""Balance and usage: available, in use, purchased, granted, used and refunded tokens, then the
usage by day and model (prompt and completion apart, and what was billed with the model's
prices applied), paged, with a CSV export of every request.

The API bills a request when it ends, so the figures are as of the last finished request;
"in use" is what running requests have reserved.
"""

from __future__ import annotations

from sqlmodel import Session
from telegram import InlineKeyboardMarkup, InputFile, Update
from telegram.ext import ContextTypes

from billing import ledger
from billing.stats import UsageRow, usage_by_day, usage_csv
from bot import keyboards
from bot.handlers.key import usage_line
from bot.runtime import account_of, lang, runtime
from bot.texts import Html, Lang, lines, number, t

USAGE_ROWS = 10


async def show_balance(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    text, markup = await _page(update, context, 0)
    await update.effective_message.reply_text(text, reply_markup=markup)


async def on_usage_action(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`usage:page:<n>` turns the page; `usage:csv` sends the export."""
    query = update.callback_query
    assert query is not None and query.data is not None
    await query.answer()
    action = query.data.removeprefix(keyboards.USAGE)
    if action == "csv":
        await _send_csv(update, context)
        return
    page = action.removeprefix("page:")
    text, markup = await _page(update, context, int(page) if page.isdigit() else 0)
    await query.edit_message_text(text, reply_markup=markup)


async def _page(
    update: Update, context: ContextTypes.DEFAULT_TYPE, page: int
) -> tuple[Html, InlineKeyboardMarkup | None]:
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> tuple[ledger.Balance, list[UsageRow], bool]:
        balance = ledger.get_balance(session=session, account_id=account_id)
        rows, older = usage_by_day(
            session=session, account_id=account_id, page=page, per_page=USAGE_ROWS
        )
        return balance, rows, older

    balance, rows, older = await runtime(context).read(work)
    language = lang(update, context)
    parts: list[Html] = [_figures(language, balance)]
    if rows:
        parts.append(t(language, "usage_title", page=page + 1))
        parts.extend(usage_line(language, row) for row in rows)
    else:
        parts.append(t(language, "balance_no_history"))
    if balance.available <= 0:
        parts.append(t(language, "balance_empty_hint"))
    app_url = runtime(context).settings.public_app_url
    markup = keyboards.usage_pages(language, page, older, app_url) if rows or page else None
    return lines(parts), markup


def _figures(language: Lang, balance: ledger.Balance) -> Html:
    figures = {
        name: number(language, getattr(balance, name))
        for name in ("available", "held", "purchased", "granted", "used", "refunded")
    }
    return t(language, "balance", **figures)


async def _send_csv(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_chat is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> str:
        return usage_csv(session=session, account_id=account_id)

    data = await runtime(context).read(work)
    await context.bot.send_document(
        update.effective_chat.id,
        InputFile(data.encode(), filename="tokenshop-usage.csv"),
        caption=t(lang(update, context), "usage_csv"),
    )
