"""Payments: the pre-checkout answer, the successful payment, and the refunded payment.

Money moves once. The pre-checkout query is answered from the database alone (Telegram allows
10 seconds, and the handler runs in its own group ahead of every other). Tokens are credited
only on the successful payment, keyed on the unique `telegram_payment_charge_id`, so a
repeated update, a restart or a second worker never credits twice; a repeat only repeats the
confirmation. A payment that cannot be credited (its order paid already, unknown, someone
else's) is a stray charge: recorded once and paid back at once (`bot.refunds`), the buyer told
plainly and the operators alerted. A refund reverses a purchase once, however often it is
reported; one made outside the bot that finds the tokens spent is flagged to the operators.
A monthly plan's charges (the first and each renewal, `is_recurring`) take the same way; the
buyer is told the plan's next renewal with the tokens.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, replace

from sqlmodel import Session
from telegram import Bot, Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from billing import keys, ledger, purchases, stray_charges, subscriptions
from billing.errors import OrderError, PurchaseNotFound
from billing.models import Purchase
from billing.purchases import check_order_payable, credit_order_payment
from billing.referrals import Reward
from billing.subscriptions import PlanCharge, PlanCredit
from bot.alerts import tell_operators
from bot.handlers.errors import order_refusal
from bot.refunds import Attempt, refund_stray
from bot.runtime import Runtime, lang, runtime
from bot.texts import Html, Lang, language_for, number, plain, snippet, t, when

logger = logging.getLogger(__name__)

PRE_CHECKOUT_BUDGET_S = 5.0  # well inside Telegram's 10 seconds, network included
_ORDER_ID = re.compile(
    r"^[A-Za-z0-9_-]{16,64}$"
)  # what `create_order` makes; anything else is forged


@dataclass(frozen=True)
class Delivery:
    """What the buyer is told once tokens are credited."""

    tokens: int
    available: int
    key: str | None  # shown on the first purchase (or when this credit issued the key)
    referral: Reward | None = None  # the referrer's share this purchase paid
    plan: PlanCredit | None = None  # the plan this charge started or renewed


async def on_pre_checkout(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Accept only an unexpired, unpaid order of this user at the same price and currency.
    Always answers: an unexpected failure refuses the payment rather than leaving it hanging."""
    query = update.pre_checkout_query
    assert query is not None
    chosen = runtime(context).languages.get(query.from_user.id)  # no read: answer fast
    language = language_for(chosen or query.from_user.language_code)
    try:
        refusal = await asyncio.wait_for(
            _refusal(
                runtime(context),
                query.invoice_payload,
                query.from_user.id,
                query.total_amount,
                query.currency,
                language,
            ),
            timeout=PRE_CHECKOUT_BUDGET_S,
        )
    except Exception:
        logger.exception("pre-checkout check failed; refusing the payment")
        refusal = plain(language, "order_generic")
    if refusal is None:
        await query.answer(ok=True)
    else:
        logger.info("pre-checkout refused for user %s: %s", query.from_user.id, refusal)
        await query.answer(ok=False, error_message=refusal)


async def _refusal(
    shop: Runtime, payload: str, telegram_id: int, amount: int, currency: str, language: Lang
) -> str | None:
    if not _ORDER_ID.match(payload):
        return plain(language, "order_unknown")

    def work(session: Session) -> None:
        check_order_payable(
            session=session,
            order_id=payload,
            telegram_id=telegram_id,
            amount=amount,
            currency=currency,
        )

    try:
        await shop.read(work)
    except OrderError as error:
        return order_refusal(error, language)
    return None


async def on_successful_payment(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    message = update.effective_message
    assert message is not None and message.successful_payment is not None
    assert update.effective_user is not None
    payment = message.successful_payment
    shop = runtime(context)
    telegram_id = update.effective_user.id
    plan_charge = (
        PlanCharge(payment.subscription_expiration_date, bool(payment.is_first_recurring))
        if payment.is_recurring and payment.subscription_expiration_date is not None
        else None
    )

    def work(session: Session) -> Delivery:
        result = credit_order_payment(
            session=session,
            order_id=payment.invoice_payload,
            telegram_id=telegram_id,
            charge_id=payment.telegram_payment_charge_id,
            provider_charge_id=payment.provider_payment_charge_id or None,
            plan_charge=plan_charge,
        )
        delivery = delivery_for(session, shop, result.purchase)
        return replace(delivery, referral=result.referral)

    try:
        delivery = await shop.run(work)
    except OrderError as error:
        await _stray(update, context, error)
        return
    await deliver(context.bot, shop, message.chat_id, lang(update, context), delivery)
    if delivery.referral is not None and delivery.referral.referrer_telegram_id is not None:
        referrer = language_for(delivery.referral.referrer_language)
        await tell(
            context.bot,
            delivery.referral.referrer_telegram_id,
            t(referrer, "referral_rewarded", tokens=number(referrer, delivery.referral.tokens)),
        )


async def _stray(update: Update, context: ContextTypes.DEFAULT_TYPE, error: OrderError) -> None:
    """A paid charge that cannot be credited: record it once, pay it back, say so."""
    message = update.effective_message
    assert message is not None and message.successful_payment is not None
    assert update.effective_user is not None
    payment = message.successful_payment
    charge_id = payment.telegram_payment_charge_id
    telegram_id = update.effective_user.id
    shop = runtime(context)
    logger.warning("paid charge %s could not be credited: %s", charge_id, error)

    def record(session: Session) -> stray_charges.Recorded:
        return stray_charges.record(
            session=session,
            charge_id=charge_id,
            telegram_id=telegram_id,
            amount=payment.total_amount,
            currency=payment.currency,
            payload=payment.invoice_payload,
            reason=error.reason,
        )

    recorded = await shop.run(record)
    if recorded.charge.refunded_at is not None:
        attempt = Attempt("refunded")
    else:
        attempt = await refund_stray(context.bot, shop, charge_id, telegram_id)
    language = lang(update, context)
    reason = t(language, f"stray_reason_{_reason(error.reason)}")
    outcome = "refunded" if attempt.outcome == "refunded" else "pending"
    await message.reply_text(
        t(
            language,
            f"stray_{outcome}",
            reason=reason,
            price=payment.total_amount,
            charge_id=charge_id,
        )
    )
    if recorded.new or attempt.outcome not in ("refunded", "busy"):
        await tell_operators(
            context.bot,
            shop.settings,
            t(
                "en",
                "operator_stray",
                charge_id=charge_id,
                telegram_id=telegram_id,
                price=payment.total_amount,
                payload=payment.invoice_payload,
                reason=str(error),
                outcome=_outcome_line(attempt),
            ),
        )


STRAY_REASONS = ("paid", "unknown", "someone_else")


def _reason(reason: str) -> str:
    return reason if reason in STRAY_REASONS else "unknown"


def _outcome_line(attempt: Attempt) -> Html:
    if attempt.outcome == "refunded":
        return t("en", "operator_stray_refunded")
    if attempt.outcome == "busy":
        return t("en", "operator_stray_busy")
    return t("en", f"operator_stray_{attempt.outcome}", error=attempt.error or "")


def delivery_for(session: Session, shop: Runtime, purchase: Purchase) -> Delivery:
    """After a credit: the balance, the plan's next renewal for a plan's charge, and the key if
    this was the first purchase. Issuing the key here, in the crediting transaction, means a
    paid buyer always has one."""
    account_id = purchase.account_id
    key, created = keys.ensure_key(
        session=session,
        account_id=account_id,
        secret_key=shop.secret_key,
        defaults=shop.settings.key_defaults(),
    )
    first = len(purchases.recent_purchases(session=session, account_id=account_id, limit=2)) == 1
    balance = ledger.get_balance(session=session, account_id=account_id)
    return Delivery(
        purchase.tokens,
        balance.available,
        key if created or first else None,
        plan=subscriptions.credit_of(session=session, purchase=purchase),
    )


async def deliver(
    bot: Bot, shop: Runtime, chat_id: int, language: Lang, delivery: Delivery
) -> None:
    await bot.send_message(chat_id, _received(language, delivery))
    if delivery.key is not None:
        setup = snippet(
            language,
            key=delivery.key,
            base_url=shop.settings.public_api_base_url,
            model=shop.settings.snippet_model,
        )
        await bot.send_message(chat_id, t(language, "payment_first_key", snippet=setup))


async def on_refunded_payment(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Telegram reports a refund (ours via /refund, or one made elsewhere): reverse it once."""
    message = update.effective_message
    assert message is not None and message.refunded_payment is not None
    refund = message.refunded_payment
    shop = runtime(context)

    def work(session: Session) -> ledger.RefundResult:
        return ledger.refund_purchase(session=session, charge_id=refund.telegram_payment_charge_id)

    try:
        result = await shop.run(work)
    except PurchaseNotFound:
        # Our own refund of a stray charge comes back this way too: nothing was credited.
        logger.info("refund of uncredited charge %s", refund.telegram_payment_charge_id)
        return
    if not result.newly_refunded:
        return
    await message.reply_text(refund_notice(lang(update, context), result))
    if result.shortfall:
        await tell_operators(
            context.bot,
            shop.settings,
            t(
                "en",
                "operator_refund_shortfall",
                charge_id=refund.telegram_payment_charge_id,
                telegram_id=message.chat_id,
                price=result.purchase.price,
                tokens=number("en", result.purchase.tokens),
                spent=number("en", result.shortfall),
            ),
        )


async def tell(bot: Bot, chat_id: int, text: str) -> None:
    """A courtesy message to a buyer; a buyer who blocked the bot changes nothing."""
    try:
        await bot.send_message(chat_id, text)
    except TelegramError:
        logger.info("could not message %s", chat_id, exc_info=True)


def _received(language: Lang, delivery: Delivery) -> Html:
    tokens, available = number(language, delivery.tokens), number(language, delivery.available)
    if delivery.plan is None:
        return t(language, "payment_received", tokens=tokens, available=available)
    return t(
        language,
        "payment_plan_started" if delivery.plan.first else "payment_plan_renewed",
        plan=delivery.plan.title,
        tokens=tokens,
        available=available,
        date=when(delivery.plan.expires_at),
        price=delivery.plan.price,
    )


def refund_notice(language: Lang, result: ledger.RefundResult) -> str:
    return t(
        language,
        "refunded",
        pack=result.purchase.pack_title,
        price=result.purchase.price,
        tokens=number(language, result.reversed_tokens),
    )
