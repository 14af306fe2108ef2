"""Periodic work: balance notices, notices of plans' coming renewals, and reconciliation with
Telegram's Star transactions.

Both run from the application's job queue, and both are plain functions of the application so
tests call them directly instead of waiting for a timer. Each runs in one bot process at a time
(an advisory lock, `billing.locks.single_runner`; another process's run is skipped), and the
reconciliation's position and the problems it reported live in the database
(`billing.job_state`), so a restart neither rescans from the start nor reports again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from sqlmodel import Session
from telegram import StarTransaction, TransactionPartnerUser
from telegram.error import TelegramError
from telegram.ext import Application, ContextTypes

from billing import job_state, subscriptions
from billing.accounts import get_account
from billing.locks import single_runner
from billing.notices import Notice, claim_notices
from billing.reconcile import ChargeResult, StarCharge, reconcile_charge
from billing.subscriptions import Reminder
from bot.alerts import tell_operators
from bot.handlers.payments import Delivery, deliver, delivery_for
from bot.runtime import Runtime, runtime_of
from bot.texts import language_for, number, t, when

logger = logging.getLogger(__name__)

PAGE = 100  # getStarTransactions' largest page
MAX_PAGES_PER_RUN = 20  # the rest waits for the next run
RECONCILE = "reconcile"  # the job's name in job_state and reported_problem
RECONCILE_LOCK = "tokenshop.bot.reconcile"
NOTICES_LOCK = "tokenshop.bot.notices"
REMINDERS_LOCK = "tokenshop.bot.plan-reminders"
INVOICE_PAYMENT = "invoice_payment"


@asynccontextmanager
async def alone(shop: Runtime, name: str) -> AsyncIterator[bool]:
    """True while this process alone runs job `name`; False if another bot process runs it."""
    runner = single_runner(shop.engine, name)
    held = await asyncio.to_thread(runner.__enter__)
    try:
        yield held
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


async def send_balance_notices(application: Application) -> list[Notice]:  # type: ignore[type-arg]
    """Tell buyers whose balance fell under the threshold, or ran out, once per crossing."""
    shop = runtime_of(application.bot_data)
    threshold = shop.settings.low_balance_tokens

    def work(session: Session) -> list[Notice]:
        return claim_notices(session=session, threshold=threshold)

    async with alone(shop, NOTICES_LOCK) as mine:
        if not mine:
            return []
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


async def send_renewal_reminders(application: Application) -> list[Reminder]:  # type: ignore[type-arg]
    """Tell each subscriber, once per period, that their plan renews soon (PLAN_REMINDER_HOURS
    ahead), for what, and how to cancel it."""
    shop = runtime_of(application.bot_data)
    ahead = timedelta(hours=shop.settings.plan_reminder_hours)

    def work(session: Session) -> list[Reminder]:
        return subscriptions.claim_reminders(session=session, ahead=ahead)

    async with alone(shop, REMINDERS_LOCK) as mine:
        if not mine:
            return []
        reminders = await shop.run(work)
    for reminder in reminders:
        language = language_for(reminder.language)
        text = t(
            language,
            "plan_reminder",
            plan=reminder.title,
            date=when(reminder.renews_at),
            price=reminder.price,
            tokens=number(language, reminder.tokens),
        )
        try:
            await application.bot.send_message(reminder.telegram_id, text)
        except TelegramError:
            logger.info("could not remind %s of a renewal", reminder.telegram_id)
    return reminders


@dataclass
class ReconcileReport:
    seen: int = 0
    credited: list[str] = field(default_factory=list)  # charge ids
    refunded: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    problem_charges: dict[str, str] = field(default_factory=dict)  # problem -> charge id
    skipped: bool = False  # another bot process was running it


async def reconcile_star_transactions(application: Application) -> ReconcileReport:  # type: ignore[type-arg]
    """Walk Telegram's Star transactions from where the last run stopped (in any bot process)
    and repair the books. Everything here is idempotent, so walking a page again costs only
    time."""
    shop = runtime_of(application.bot_data)
    async with alone(shop, RECONCILE_LOCK) as mine:
        if not mine:
            return ReconcileReport(skipped=True)
        return await _reconcile_pages(application, shop)


async def _reconcile_pages(application: Application, shop: Runtime) -> ReconcileReport:  # type: ignore[type-arg]
    report = ReconcileReport()
    offset = await shop.read(lambda s: job_state.position(session=s, job=RECONCILE))
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
    await shop.run(lambda s: job_state.save_position(session=s, job=RECONCILE, position=offset))
    fresh = await shop.read(
        lambda s: job_state.unreported(session=s, job=RECONCILE, messages=report.problems)
    )
    if fresh:
        items = "\n".join(f"• {problem}" for problem in fresh)
        await tell_operators(
            application.bot, shop.settings, t("en", "reconcile_report", items=items)
        )
        told = [(report.problem_charges.get(problem), problem) for problem in fresh]
        await shop.run(lambda s: job_state.record_reported(session=s, job=RECONCILE, problems=told))
    return report


def star_charge(tx: StarTransaction) -> StarCharge | None:
    """A payment by a user for one of our invoices, or a refund to a user; None otherwise."""
    if isinstance(tx.source, TransactionPartnerUser):
        if tx.source.transaction_type != INVOICE_PAYMENT:
            return None
        period = tx.source.subscription_period
        return StarCharge(
            tx.id,
            tx.source.user.id,
            tx.amount,
            tx.source.invoice_payload,
            False,
            date=tx.date,
            subscription_period=(
                int(period.total_seconds()) if isinstance(period, timedelta) else period
            ),
        )
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
        delivery_for(session, shop, result.purchase) if result.outcome == "credited" else None
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
        report.problem_charges[result.problem] = charge.charge_id
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
        if result.purchase is not None and result.purchase.refund_shortfall:
            # refunded outside the bot after its tokens were spent: the operators should know
            problem = (
                f"charge {charge.charge_id} of user {charge.telegram_id} was refunded outside "
                f"the bot; {result.purchase.refund_shortfall} of its {result.purchase.tokens} "
                "tokens had already been used and stay used"
            )
            report.problems.append(problem)
            report.problem_charges[problem] = charge.charge_id


async def notices_job(context: ContextTypes.DEFAULT_TYPE) -> None:
    await send_balance_notices(context.application)
    await send_renewal_reminders(context.application)


async def reconcile_job(context: ContextTypes.DEFAULT_TYPE) -> None:
    await reconcile_star_transactions(context.application)
