"""A buyer's refund request, from the charge listed under /paysupport.

The terms' rule decides: within `REFUND_WINDOW_DAYS` of the purchase and with the pack's tokens
unused (the available balance covers the pack), the refund is made at once, Telegram first and
the books after, and the operators are told. Otherwise the request goes to the operators with
the figures and a button that refunds it; their reply to it reaches the buyer like any support
message.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlmodel import Session
from telegram import Update
from telegram.error import TelegramError
from telegram.ext import ContextTypes

from billing import ledger, support
from billing.errors import PurchaseNotFound
from billing.purchases import RefundCheck, check_refund
from bot import keyboards
from bot.alerts import tell_operators
from bot.handlers.payments import refund_notice
from bot.refunds import pay_back
from bot.runtime import account_of, lang, runtime
from bot.texts import number, t, when

logger = logging.getLogger(__name__)


async def on_claim(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`claim:<purchase id>`: the buyer asks for a refund of one purchase."""
    query = update.callback_query
    assert query is not None and query.data is not None and update.effective_user is not None
    await query.answer()
    language = lang(update, context)
    raw = query.data.removeprefix(keyboards.CLAIM)
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)
    window = timedelta(days=shop.settings.refund_window_days)

    def work(session: Session) -> RefundCheck:
        return check_refund(
            session=session, account_id=account_id, purchase_id=int(raw), window=window
        )

    try:
        check = await shop.read(work) if raw.isdigit() else None
    except PurchaseNotFound:
        check = None
    if check is None:
        await query.edit_message_text(t(language, "claim_unknown"))
        return
    purchase = check.purchase
    charge_id = purchase.telegram_payment_charge_id
    if purchase.refunded_at is not None:
        await query.edit_message_text(t(language, "claim_already", charge_id=charge_id))
        return
    if check.automatic and shop.settings.refund_automatically:
        attempt = await pay_back(context.bot, shop, update.effective_user.id, charge_id)
        if attempt.outcome == "refunded":

            def reverse(session: Session) -> ledger.RefundResult:
                return ledger.refund_purchase(session=session, charge_id=charge_id)

            result = await shop.run(reverse)
            await query.edit_message_text(refund_notice(language, result))
            await tell_operators(
                context.bot,
                shop.settings,
                t(
                    "en",
                    "operator_claim_refunded",
                    charge_id=charge_id,
                    telegram_id=update.effective_user.id,
                    price=purchase.price,
                    tokens=number("en", result.reversed_tokens),
                ),
            )
            return
        logger.warning("automatic refund of %s: %s %s", charge_id, attempt.outcome, attempt.error)
    await _to_operators(update, context, check)
    await query.edit_message_text(t(language, "claim_sent", charge_id=charge_id))


async def _to_operators(
    update: Update, context: ContextTypes.DEFAULT_TYPE, check: RefundCheck
) -> None:
    """The request, its figures and a refund button, to every operator; a reply to it finds
    the buyer (it is recorded as the buyer's support message)."""
    user = update.effective_user
    assert user is not None
    purchase = check.purchase
    assert purchase.id is not None
    shop = runtime(context)
    spent = max(0, purchase.tokens - max(check.available, 0))
    reasons = [
        text_id
        for text_id, applies in (
            ("claim_reason_window", not check.within_window),
            ("claim_reason_used", not check.unused),
            ("claim_reason_referral", check.paid_referral),
        )
        if applies
    ]
    card = t(
        "en",
        "operator_claim",
        name=user.full_name,
        telegram_id=user.id,
        charge_id=purchase.telegram_payment_charge_id,
        pack=purchase.pack_title,
        price=purchase.price,
        tokens=number("en", purchase.tokens),
        time=when(purchase.created_at),
        available=number("en", check.available),
        spent=number("en", spent),
        reasons=", ".join(str(t("en", reason)) for reason in reasons) or "—",
    )
    account_id = purchase.account_id

    def record(session: Session) -> int:
        saved = support.record_message(
            session=session,
            account_id=account_id,
            text=f"Refund request: {purchase.telegram_payment_charge_id}",
        )
        assert saved.id is not None
        return saved.id

    message_id = await shop.run(record)
    delivered: list[tuple[int, int]] = []
    for operator_id in sorted(shop.settings.admin_telegram_ids):
        try:
            sent = await context.bot.send_message(
                operator_id,
                card,
                reply_markup=keyboards.confirm_refund("en", purchase.id, purchase.price),
            )
        except TelegramError:
            logger.warning("could not pass a refund request to %s", operator_id, exc_info=True)
            continue
        delivered.append((operator_id, sent.message_id))

    def copies(session: Session) -> None:
        for chat_id, sent_id in delivered:
            support.record_copy(
                session=session, support_message_id=message_id, chat_id=chat_id, message_id=sent_id
            )

    await shop.run(copies)
