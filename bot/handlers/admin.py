"""Operator commands, registered only for `ADMIN_TELEGRAM_IDS`; anyone else falls through to the
ordinary unknown-command reply, so the commands never reveal themselves.

`/refund` shows what a refund would reverse and what is spent already, and asks; then it asks
Telegram first and changes the books only once the Stars are back with the buyer (a refusal
leaves everything as it was; a lost answer is checked against Telegram's list of transactions,
see `bot.refunds`). Repeating it is safe.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlmodel import Session
from telegram import StarTransaction, TransactionPartnerUser, Update
from telegram.ext import ContextTypes

from billing import accounts, keys, ledger, lookup, promos, stray_charges
from billing.errors import AccountNotFound, InvalidAmount, PromoError
from billing.models import PromoCode, StrayCharge, utcnow
from billing.stats import PlanStats, ShopStats, plan_stats, running_plans, shop_stats, start_of_day
from bot import keyboards
from bot.handlers.payments import refund_notice, tell
from bot.refunds import find_payment, pay_back, refund_stray
from bot.runtime import Runtime, lang, runtime
from bot.texts import Html, Lang, language_for, lines, number, t, when

logger = logging.getLogger(__name__)


async def stats(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None

    def work(session: Session) -> tuple[ShopStats, ShopStats]:
        return (
            shop_stats(session=session, since=start_of_day()),
            shop_stats(session=session),
        )

    def plans(session: Session) -> tuple[PlanStats, PlanStats, tuple[int, int]]:
        return (
            plan_stats(session=session, since=start_of_day()),
            plan_stats(session=session),
            running_plans(session=session),
        )

    shop = runtime(context)
    today, total = await shop.read(work)
    language = lang(update, context)
    text = t(language, "stats", today=_block(language, today), total=_block(language, total))
    plans_today, plans_total, (running, ending) = await shop.read(plans)
    if shop.plans or plans_total.started or plans_total.renewals:
        text = lines(
            [
                text,
                Html(""),
                t(
                    language,
                    "stats_plans",
                    active=number(language, running),
                    ending=number(language, ending),
                    today=_plan_block(language, plans_today),
                    total=_plan_block(language, plans_total),
                ),
            ]
        )
    await update.effective_message.reply_text(text)


def _plan_block(language: Lang, figures: PlanStats) -> Html:
    return t(
        language,
        "stats_plans_block",
        started=number(language, figures.started),
        renewals=number(language, figures.renewals),
        cancellations=number(language, figures.cancellations),
        ended=number(language, figures.ended),
        revenue=number(language, figures.revenue),
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
    """`/refund <charge_id>`: a purchase is shown with what a refund would reverse and what is
    spent already, and refunded on confirmation; a stray charge is paid back at once."""
    message = update.effective_message
    assert message is not None
    language = lang(update, context)
    if len(context.args or []) != 1:
        await message.reply_text(t(language, "refund_usage"))
        return
    charge_id = (context.args or [""])[0]
    shop = runtime(context)

    def find(session: Session) -> tuple[lookup.PurchaseOwner | None, int, StrayCharge | None]:
        found = lookup.find_purchase(session=session, charge_id=charge_id)
        if found is None:
            return None, 0, stray_charges.find(session=session, charge_id=charge_id)
        available = ledger.get_balance(session=session, account_id=found.purchase.account_id)
        return found, available.available, None

    found, available, stray = await shop.read(find)
    if found is None and stray is None:
        stray = await _record_unmatched(shop, await find_payment(context.bot, charge_id))
    if stray is not None:
        await _refund_stray(update, context, stray)
        return
    if found is None or found.telegram_id is None:
        await message.reply_text(t(language, "refund_unknown", charge_id=charge_id))
        return
    purchase = found.purchase
    if purchase.refunded_at is not None:
        await message.reply_text(t(language, "refund_already", charge_id=charge_id))
        return
    assert purchase.id is not None
    reversible = max(0, min(purchase.tokens, available))
    await message.reply_text(
        t(
            language,
            "refund_confirm",
            charge_id=charge_id,
            telegram_id=found.telegram_id,
            pack=purchase.pack_title,
            price=purchase.price,
            tokens=number(language, purchase.tokens),
            time=when(purchase.created_at),
            available=number(language, available),
            reversible=number(language, reversible),
            spent=number(language, purchase.tokens - reversible),
        ),
        reply_markup=keyboards.confirm_refund(language, purchase.id, purchase.price),
    )


async def on_refund_action(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The buttons under a refund's figures: refund (Telegram first, then the books) or cancel."""
    query = update.callback_query
    assert query is not None and query.data is not None
    language = lang(update, context)
    shop = runtime(context)
    if update.effective_user is None or update.effective_user.id not in (
        shop.settings.admin_telegram_ids
    ):
        await query.answer()
        return
    await query.answer()
    if query.data == keyboards.REFUND_CANCEL:
        await query.edit_message_text(t(language, "refund_cancelled"))
        return
    purchase_id = int(query.data.removeprefix(keyboards.REFUND_PURCHASE))

    def find(session: Session) -> lookup.PurchaseOwner | None:
        return lookup.purchase_by_id(session=session, purchase_id=purchase_id)

    found = await shop.read(find)
    if found is None or found.telegram_id is None:
        await query.edit_message_text(t(language, "refund_unknown", charge_id=purchase_id))
        return
    charge_id = found.purchase.telegram_payment_charge_id
    if found.purchase.refunded_at is not None:
        await query.edit_message_text(t(language, "refund_already", charge_id=charge_id))
        return
    attempt = await pay_back(context.bot, shop, found.telegram_id, charge_id)
    if attempt.outcome == "refused":
        logger.warning("Telegram refused to refund %s: %s", charge_id, attempt.error)
        await query.edit_message_text(
            t(language, "refund_telegram_failed", error=attempt.error or "")
        )
        return
    if attempt.outcome != "refunded":
        await query.edit_message_text(
            t(language, "refund_outcome_unknown", charge_id=charge_id, error=attempt.error or "")
        )
        return

    def reverse(session: Session) -> tuple[ledger.RefundResult, str | None]:
        result = ledger.refund_purchase(session=session, charge_id=charge_id)
        buyer = accounts.get_account(session=session, account_id=result.purchase.account_id)
        return result, buyer.chosen_language or buyer.language

    result, buyer_language = await shop.run(reverse)
    shortfall = (
        t(language, "refund_shortfall", tokens=number(language, result.shortfall))
        if result.shortfall
        else Html("")
    )
    await query.edit_message_text(
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
        buyer = language_for(buyer_language)
        await tell(context.bot, found.telegram_id, refund_notice(buyer, result))


async def _record_unmatched(shop: Runtime, tx: StarTransaction | None) -> StrayCharge | None:
    """A paid charge Telegram lists and the books never credited (reconciliation reports
    these): recorded as a stray charge, so that it can be refunded like one."""
    if tx is None or not isinstance(tx.source, TransactionPartnerUser):
        return None
    source = tx.source

    def record(session: Session) -> StrayCharge:
        return stray_charges.record(
            session=session,
            charge_id=tx.id,
            telegram_id=source.user.id,
            amount=tx.amount,
            currency="XTR",
            payload=source.invoice_payload,
            reason="unmatched",
        ).charge

    return await shop.run(record)


async def _refund_stray(
    update: Update, context: ContextTypes.DEFAULT_TYPE, stray: StrayCharge
) -> None:
    message = update.effective_message
    assert message is not None
    language = lang(update, context)
    charge_id = stray.telegram_payment_charge_id
    figures = {
        "charge_id": charge_id,
        "telegram_id": stray.telegram_id,
        "price": stray.amount,
        "reason": stray.reason,
        "time": when(stray.created_at),
    }
    if stray.refunded_at is not None:
        await message.reply_text(
            t(language, "refund_stray_done", refunded=when(stray.refunded_at), **figures)
        )
        return
    attempt = await refund_stray(context.bot, runtime(context), charge_id, stray.telegram_id)
    if attempt.outcome == "refunded":
        await message.reply_text(t(language, "refund_stray_now", **figures))
        await tell(
            context.bot,
            stray.telegram_id,
            t(
                language_for(runtime(context).languages.get(stray.telegram_id)),
                "stray_refunded_later",
                price=stray.amount,
                charge_id=charge_id,
            ),
        )
    elif attempt.outcome == "busy":
        await message.reply_text(t(language, "refund_stray_busy", **figures))
    elif attempt.outcome == "refused":
        await message.reply_text(t(language, "refund_telegram_failed", error=attempt.error or ""))
    else:
        await message.reply_text(
            t(language, "refund_outcome_unknown", charge_id=charge_id, error=attempt.error or "")
        )


async def grant(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`/grant <telegram_id> <tokens>`: support credits and promotions, with a key if none yet."""
    message = update.effective_message
    assert message is not None
    language = lang(update, context)
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
        keys.ensure_key(
            session=session,
            account_id=account.id,
            secret_key=shop.secret_key,
            defaults=shop.settings.key_defaults(),
        )
        return ledger.get_balance(session=session, account_id=account.id).available, (
            account.chosen_language or account.language
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
    await tell(context.bot, telegram_id, t(buyer, "granted", tokens=number(buyer, tokens)))


async def new_promo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`/promo_new <code> <tokens> <uses> [days]`: a promo code, valid `days` (forever if left
    out), redeemable `uses` times in all and once per buyer."""
    message = update.effective_message
    assert message is not None
    language = lang(update, context)
    args = context.args or []
    if len(args) not in (3, 4) or not all(arg.isdigit() for arg in args[1:]):
        await message.reply_text(t(language, "promo_new_usage"))
        return
    tokens, uses = int(args[1]), int(args[2])
    days = int(args[3]) if len(args) == 4 else None
    expires = utcnow() + timedelta(days=days) if days else None
    operator_id = update.effective_user.id if update.effective_user else None

    def work(session: Session) -> PromoCode:
        return promos.create_promo(
            session=session,
            code=args[0],
            tokens=tokens,
            max_uses=uses,
            expires_at=expires,
            created_by=operator_id,
        )

    try:
        promo = await runtime(context).run(work)
    except PromoError as error:
        await message.reply_text(t(language, f"promo_new_{error.reason}", code=args[0]))
        return
    await message.reply_text(
        t(
            language,
            "promo_created",
            code=promo.code,
            tokens=number(language, promo.tokens),
            uses=promo.max_uses,
            expires=when(promo.expires_at) if promo.expires_at else "—",
        )
    )


async def list_promos(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`/promos`: the newest codes with their uses."""
    message = update.effective_message
    assert message is not None
    language = lang(update, context)

    def work(session: Session) -> list[PromoCode]:
        return promos.list_promos(session=session)

    found = await runtime(context).read(work)
    if not found:
        await message.reply_text(t(language, "promos_none"))
        return
    await message.reply_text(
        lines(
            [t(language, "promos")]
            + [
                t(
                    language,
                    "promos_line",
                    code=promo.code,
                    tokens=number(language, promo.tokens),
                    used=promo.uses,
                    uses=promo.max_uses,
                    expires=when(promo.expires_at) if promo.expires_at else "—",
                )
                for promo in found
            ]
        )
    )
