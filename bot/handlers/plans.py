"""Monthly plans: subscribing through a Stars invoice link, and `/plan`, the buyer's view of
their plans with cancel and resume.

A plan is chosen like a pack (an order snapshots it; the invoice payload is the order's id), but
a Telegram Stars subscription is paid through an invoice link made with `subscription_period`,
not `sendInvoice`. The first charge passes the same pre-checkout check as a pack's, and every
charge is credited in `bot.handlers.payments`. Cancelling and resuming ask Telegram first
(`editUserStarSubscription`, which names the subscription by its first charge) and are recorded
only once Telegram agreed; a cancelled plan runs to the end of the period paid for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlmodel import Session
from telegram import LabeledPrice, Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from billing import subscriptions
from billing.models import Subscription, utcnow
from billing.packs import STARS_CURRENCY
from billing.plans import find_plan
from bot import keyboards
from bot.handlers.shop import INVOICE_DESCRIPTION_LIMIT, INVOICE_TITLE_LIMIT, order_tapped
from bot.runtime import Runtime, account_of, lang, runtime
from bot.texts import Html, Lang, lines, number, plain, t, when

logger = logging.getLogger(__name__)


async def on_plan(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A plan was tapped: create its order and send the subscription's invoice link."""
    assert update.effective_chat is not None
    tapped = await order_tapped(
        update,
        context,
        choose=lambda shop, plan_id: find_plan(shop.plans, plan_id),
        prefix=keyboards.PLAN,
        unknown="plan_unknown",
    )
    if tapped is None:
        return
    plan, order = tapped
    language = lang(update, context)
    tokens = number(language, order.tokens)
    link = await context.bot.create_invoice_link(
        title=plain(language, "plan_invoice_title", title=order.pack_title, tokens=tokens)[
            :INVOICE_TITLE_LIMIT
        ],
        description=plain(language, "plan_invoice_description", tokens=tokens)[
            :INVOICE_DESCRIPTION_LIMIT
        ],
        payload=order.id,
        currency=STARS_CURRENCY,
        prices=[LabeledPrice(plain(language, "plan_invoice_label", tokens=tokens), order.price)],
        subscription_period=plan.period_seconds,
    )
    await context.bot.send_message(
        update.effective_chat.id,
        t(language, "plan_invoice", title=order.pack_title, tokens=tokens, price=order.price),
        reply_markup=keyboards.subscribe(language, link, order.price),
    )


async def show_plan(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`/plan`: each running plan (next renewal, or the end of a cancelled one) with its cancel
    or resume button, plans that ended lately, and the plans on sale when none runs."""
    assert update.effective_message is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def work(session: Session) -> list[tuple[Subscription, int]]:
        return [
            (item, subscriptions.renewals(session=session, subscription_id=item.id or 0))
            for item in subscriptions.of_account(session=session, account_id=account_id)
        ]

    text, markup = _view(lang(update, context), shop, await shop.read(work))
    await update.effective_message.reply_text(text, reply_markup=markup)


async def on_subscription_action(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`sub:cancel:<id>` or `sub:resume:<id>`: Telegram first, then the books."""
    query = update.callback_query
    assert query is not None and query.data is not None and update.effective_user is not None
    await query.answer()
    language = lang(update, context)
    action, _, raw = query.data.removeprefix(keyboards.SUBSCRIPTION).partition(":")
    cancel = action == "cancel"
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def find(session: Session) -> Subscription | None:
        return subscriptions.owned(session=session, account_id=account_id, subscription_id=int(raw))

    subscription = await shop.read(find)
    if subscription is None or subscription.id is None:
        await query.edit_message_text(t(language, "plan_gone"))
        return
    if not subscriptions.is_active(subscription):
        await query.edit_message_text(t(language, "plan_over"))
        return
    if subscription.first_charge_id is None:
        # Telegram names a subscription by its first charge, whose update was lost:
        # reconciliation finds it within RECONCILE_INTERVAL_SECONDS
        await query.edit_message_text(t(language, "plan_pending"))
        return
    try:
        await context.bot.edit_user_star_subscription(
            update.effective_user.id, subscription.first_charge_id, is_canceled=cancel
        )
    except TelegramError as error:
        logger.warning("Telegram refused to %s subscription %s", action, subscription.id)
        await query.edit_message_text(t(language, "plan_edit_failed", error=error.message))
        return
    subscription_id = subscription.id

    def record(session: Session) -> Subscription:
        return subscriptions.set_canceled(
            session=session, subscription_id=subscription_id, canceled=cancel
        )

    changed = await shop.run(record)
    await query.edit_message_text(
        t(
            language,
            "plan_canceled" if cancel else "plan_resumed",
            plan=changed.plan_title,
            date=when(changed.expires_at),
        ),
        reply_markup=keyboards.subscription_actions(
            language, [(subscription_id, changed.canceled_at is not None)]
        ),
    )


def _view(
    language: Lang, shop: Runtime, items: Sequence[tuple[Subscription, int]]
) -> tuple[Html, keyboards.InlineKeyboardMarkup | None]:
    now = utcnow()
    running = [
        (item.id, item.canceled_at is not None)
        for item, _ in items
        if item.id is not None and subscriptions.is_active(item, now)
    ]
    parts = [_line(language, item, renewals, now) for item, renewals in items]
    if not running:
        parts.append(t(language, "plans_none" if shop.plans else "plans_off"))
    offered = shop.plans if not running else ()
    markup = keyboards.subscription_actions(language, running, offered)
    return lines(parts), markup if markup.inline_keyboard else None


def _line(language: Lang, item: Subscription, renewals: int, now: datetime) -> Html:
    if not subscriptions.is_active(item, now):
        state = t(language, "plan_state_ended", date=when(item.expires_at))
    elif item.canceled_at is not None:
        state = t(language, "plan_state_canceled", date=when(item.expires_at))
    else:
        state = t(language, "plan_state_renews", date=when(item.expires_at), price=item.price)
    return t(
        language,
        "plan_line",
        title=item.plan_title,
        tokens=number(language, item.tokens),
        price=item.price,
        renewals=renewals,
        state=state,
    )
