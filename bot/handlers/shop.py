"""Buying: the pack list (and the monthly plans, `bot.handlers.plans`), the one-tap terms
acceptance, and the Stars invoice for a chosen pack.

Choosing a pack creates an order (owner, pack snapshot, price, expiry) and the invoice carries
only its opaque id as payload, so the pre-checkout check needs nothing from the invoice but that
id, and a forged or replayed invoice cannot name a price of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlmodel import Session
from telegram import LabeledPrice, Update
from telegram.ext import ContextTypes

from billing import accounts
from billing.errors import UnknownPack
from billing.models import Order
from billing.packs import STARS_CURRENCY, Pack, find_pack
from billing.purchases import create_order
from bot import keyboards
from bot.runtime import Runtime, account_of, lang, runtime
from bot.texts import Html, Lang, lines, number, plain, t

INVOICE_TITLE_LIMIT = 32  # Telegram's limits for an invoice
INVOICE_DESCRIPTION_LIMIT = 255
P = TypeVar("P", bound=Pack)  # a pack, or a plan


async def show_packs(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The packs, or first the terms if this buyer has not accepted them yet."""
    assert update.effective_message is not None
    account = await account_of(update, context)
    language = lang(update, context)
    shop = runtime(context)
    if account.terms_accepted_at is None:
        terms = t(language, "terms_prompt", days=shop.settings.refund_window_days)
        if shop.plans:
            terms = lines([terms, Html(""), t(language, "terms_prompt_plans")])
        await update.effective_message.reply_text(
            terms, reply_markup=keyboards.accept_terms(language)
        )
        return
    await update.effective_message.reply_text(
        shop_text(language, shop), reply_markup=keyboards.packs(language, shop.catalog, shop.plans)
    )


def shop_text(language: Lang, shop: Runtime) -> Html:
    """What the pack list says: the packs, and how plans renew when some are sold."""
    if not shop.plans:
        return t(language, "packs")
    return lines([t(language, "packs"), t(language, "packs_plans")])


async def on_accept_terms(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    query = update.callback_query
    assert query is not None
    await query.answer()
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> None:
        accounts.accept_terms(session=session, account_id=account_id)

    shop = runtime(context)
    await shop.run(work)
    language = lang(update, context)
    await query.edit_message_text(
        shop_text(language, shop), reply_markup=keyboards.packs(language, shop.catalog, shop.plans)
    )


async def order_tapped(
    update: Update,
    context: ContextTypes.DEFAULT_TYPE,
    *,
    choose: Callable[[Runtime, str], P],
    prefix: str,
    unknown: str,
) -> tuple[P, Order] | None:
    """The pack or plan a buyer tapped (`choose` finds it by the id after `prefix`) and its
    new order; None when it is not on sale (the shop is shown again, with `unknown`) or the
    terms are not accepted yet (they are asked for)."""
    query = update.callback_query
    assert query is not None and query.data is not None
    await query.answer()
    shop = runtime(context)
    language = lang(update, context)
    try:
        item = choose(shop, query.data.removeprefix(prefix))
    except UnknownPack:
        await query.edit_message_text(
            t(language, unknown), reply_markup=keyboards.packs(language, shop.catalog, shop.plans)
        )
        return None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    if account.terms_accepted_at is None:
        await show_packs(update, context)
        return None

    def work(session: Session) -> Order:
        return create_order(session=session, account_id=account_id, pack=item)

    return item, await shop.run(work)


async def on_pack(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A pack was tapped: create its order and send the Stars invoice."""
    assert update.effective_chat is not None
    tapped = await order_tapped(
        update,
        context,
        choose=lambda shop, pack_id: find_pack(shop.catalog, pack_id),
        prefix=keyboards.PACK,
        unknown="pack_unknown",
    )
    if tapped is None:
        return
    _, order = tapped
    language = lang(update, context)
    tokens = number(language, order.tokens)
    await context.bot.send_invoice(
        chat_id=update.effective_chat.id,
        title=plain(language, "invoice_title", title=order.pack_title, tokens=tokens)[
            :INVOICE_TITLE_LIMIT
        ],
        description=plain(language, "invoice_description", tokens=tokens)[
            :INVOICE_DESCRIPTION_LIMIT
        ],
        payload=order.id,
        currency=STARS_CURRENCY,
        prices=[LabeledPrice(plain(language, "invoice_label", tokens=tokens), order.price)],
    )
