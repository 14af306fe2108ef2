"""Periodic work: balance notices and reconciliation with Telegram's Star transactions.

Both run from the application's job queue, and both are plain functions of the application so
tests call them directly instead of waiting for a timer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlmodel import Session
from telegram import StarTransaction, TransactionPartnerUser
from telegram.error import TelegramError
from telegram.ext import Application, ContextTypes

from billing.accounts import get_account
from billing.notices import Notice, claim_notices
from billing.reconcile import ChargeResult, StarCharge, reconcile_charge
from bot.alerts import tell_operators
from bot.handlers.payments import Delivery, deliver, delivery_for
from bot.runtime import Runtime, runtime_of
from bot.texts import language_for, number, t

logger = logging.getLogger(__name__)

PAGE = 100  # getStarTransactions' largest page
MAX_PAGES_PER_RUN = 20  # the rest waits for the next run
OFFSET = "tokenshop.reconcile_offset"
REPORTED = "tokenshop.reconcile_reported"
INVOICE_PAYMENT = "invoice_payment"


async def send_balance_notices(application: Application) -> list[Notice]:  # type: ignore[type-arg]
    """Tell buyers whose balance fell under the threshold, or ran out, once per crossing."""
    shop = runtime_of(application.bot_data)
    threshold = shop.settings.low_balance_tokens

    def work(session: Session) -> list[Notice]:
        return claim_notices(session=session, threshold=threshold)

    notices = await shop.run(work)
    for notice in notices:
        language = language_for(notice.language)
        text = t(
            language, f"notice_{notice.level}", available=number(language, max(notice.balance, 0))
        )
        try:
            await application.bot.send_message(notice.telegram_id, text)
        except TelegramError:
            logger.info("could not send a %s notice to %s", notice.level, notice.telegram_id)
    return notices


@dataclass
class ReconcileReport:
    seen: int = 0
    credited: list[str] = field(default_factory=list)  # charge ids
    refunded: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


async def reconcile_star_transactions(application: Application) -> ReconcileReport:  # type: ignore[type-arg]
    """Walk Telegram's Star transactions from where the last run stopped and repair the books.

    Everything here is idempotent, so a restart that starts again from the first transaction
    costs only time.
    """
    shop = runtime_of(application.bot_data)
    report = ReconcileReport()
    offset: int = application.bot_data.get(OFFSET, 0)
    for _ in range(MAX_PAGES_PER_RUN):
        page = await application.bot.get_star_transactions(offset=offset, limit=PAGE)
        charges = [charge for tx in page.transactions if (charge := star_charge(tx)) is not None]
        for charge, result, delivery, language in await shop.run_each(
            charges, lambda session, charge: _reconcile(session, shop, charge)
        ):
            await _follow_up(application, shop, report, charge, result, delivery, language)
        report.seen += len(page.transactions)
        offset += len(page.transactions)
        if len(page.transactions) < PAGE:
            break
    application.bot_data[OFFSET] = offset
    reported: set[str] = application.bot_data.setdefault(REPORTED, set())
    fresh = [problem for problem in report.problems if problem not in reported]
    if fresh:
        reported.update(fresh)
        items = "\n".join(f"• {problem}" for problem in fresh)
        await tell_operators(
            application.bot, shop.settings, t("en", "reconcile_report", items=items)
        )
    return report


def star_charge(tx: StarTransaction) -> StarCharge | None:
    """A payment by a user for one of our invoices, or a refund to a user; None otherwise."""
    if isinstance(tx.source, TransactionPartnerUser):
        if tx.source.transaction_type != INVOICE_PAYMENT:
            return None
        return StarCharge(tx.id, tx.source.user.id, tx.amount, tx.source.invoice_payload, False)
    if isinstance(tx.receiver, TransactionPartnerUser):
        return StarCharge(tx.id, tx.receiver.user.id, tx.amount, None, True)
    return None


def _reconcile(
    session: Session, shop: Runtime, charge: StarCharge
) -> tuple[StarCharge, ChargeResult, Delivery | None, str | None]:
    result = reconcile_charge(session=session, charge=charge)
    if result.outcome not in ("credited", "refunded") or result.purchase is None:
        return charge, result, None, None
    account_id = result.purchase.account_id
    language = get_account(session=session, account_id=account_id).language
    delivery = (
        delivery_for(session, shop, account_id, result.tokens)
        if result.outcome == "credited"
        else None
    )
    return charge, result, delivery, language


async def _follow_up(
    application: Application,  # type: ignore[type-arg]
    shop: Runtime,
    report: ReconcileReport,
    charge: StarCharge,
    result: ChargeResult,
    delivery: Delivery | None,
    language: str | None,
) -> None:
    if result.outcome == "problem" and result.problem:
        report.problems.append(result.problem)
    elif result.outcome == "credited" and delivery is not None:
        logger.warning("reconciliation credited missing charge %s", charge.charge_id)
        report.credited.append(charge.charge_id)
        try:
            await deliver(
                application.bot, shop, charge.telegram_id, language_for(language), delivery
            )
        except TelegramError:
            logger.info("could not tell %s about charge %s", charge.telegram_id, charge.charge_id)
    elif result.outcome == "refunded":
        logger.warning("reconciliation reversed refunded charge %s", charge.charge_id)
        report.refunded.append(charge.charge_id)


async def notices_job(context: ContextTypes.DEFAULT_TYPE) -> None:
    await send_balance_notices(context.application)


async def reconcile_job(context: ContextTypes.DEFAULT_TYPE) -> None:
    await reconcile_star_transactions(context.application)
