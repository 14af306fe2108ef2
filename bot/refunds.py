"""Paying Stars back through Telegram, for a purchase or a stray charge, with honest outcomes.

`refundStarPayment` can fail three ways that matter: Telegram refuses (nothing happened),
Telegram says CHARGE_ALREADY_REFUNDED (the Stars are back with the buyer: the refund is done),
or the answer never arrives (it may or may not have happened). The last is settled against
Telegram's own list of Star transactions, where a refund carries the id of the charge it
returns, before anyone is told anything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from sqlmodel import Session
from telegram import Bot, StarTransaction, TransactionPartnerUser
from telegram.error import NetworkError, TelegramError, TimedOut

from billing import job_state, stray_charges
from bot.runtime import Runtime

logger = logging.getLogger(__name__)

ALREADY_REFUNDED = "CHARGE_ALREADY_REFUNDED"
PAGE = 100
MAX_PAGES = 50  # the refund of a lost answer is among the newest; 5,000 transactions at most

Outcome = Literal["refunded", "refused", "unknown", "busy"]


@dataclass(frozen=True)
class Attempt:
    outcome: Outcome  # busy: another caller is refunding it right now
    error: str | None = None


async def pay_back(bot: Bot, shop: Runtime, telegram_id: int, charge_id: str) -> Attempt:
    """Ask Telegram to refund a charge; "refunded" only when the Stars are back with the buyer."""
    try:
        await bot.refund_star_payment(telegram_id, charge_id)
    except TimedOut:
        logger.warning("refund of %s timed out; asking Telegram what happened", charge_id)
        return await _settle_unknown(bot, shop, charge_id, "Telegram did not answer in time")
    except NetworkError as error:  # the request may have reached Telegram
        if _already_refunded(error):
            return Attempt("refunded")
        if error.__class__ is NetworkError:
            return await _settle_unknown(bot, shop, charge_id, error.message)
        return Attempt("refused", error.message)  # BadRequest, Forbidden: refused as sent
    except TelegramError as error:
        if _already_refunded(error):
            return Attempt("refunded")
        return Attempt("refused", error.message)
    return Attempt("refunded")


def _already_refunded(error: TelegramError) -> bool:
    # python-telegram-bot rewrites "Bad Request: CHARGE_ALREADY_REFUNDED" as
    # "Charge_already_refunded"
    return ALREADY_REFUNDED.lower() in error.message.lower()


async def refund_listed(bot: Bot, charge_id: str, start: int = 0) -> bool | None:
    """Whether Telegram lists a refund of this charge (looking from transaction `start` on);
    None when it cannot be asked now."""
    try:
        found = await _find(bot, charge_id, refund=True, start=start)
    except TelegramError:
        logger.warning("could not list Star transactions to check %s", charge_id, exc_info=True)
        return None
    return found is not None


async def find_payment(bot: Bot, charge_id: str) -> StarTransaction | None:
    """Telegram's record of a user's payment with this charge id (one the books may never have
    seen: reconciliation reports such charges), or None."""
    try:
        return await _find(bot, charge_id, refund=False)
    except TelegramError:
        logger.warning("could not list Star transactions to find %s", charge_id, exc_info=True)
        return None


async def _find(
    bot: Bot, charge_id: str, *, refund: bool, start: int = 0
) -> StarTransaction | None:
    offset = start
    for _ in range(MAX_PAGES):
        page = await bot.get_star_transactions(offset=offset, limit=PAGE)
        for tx in page.transactions:
            partner = tx.receiver if refund else tx.source
            if tx.id == charge_id and isinstance(partner, TransactionPartnerUser):
                return tx
        offset += len(page.transactions)
        if len(page.transactions) < PAGE:
            break
    return None


async def _settle_unknown(bot: Bot, shop: Runtime, charge_id: str, error: str) -> Attempt:
    """A refund made just now is among the newest transactions: look from a page before where
    reconciliation has read up to."""
    from bot.jobs import RECONCILE  # bot.jobs imports the payment handlers, which import this

    def position(session: Session) -> int:
        return job_state.position(session=session, job=RECONCILE)

    start = max(0, await shop.read(position) - PAGE)
    listed = await refund_listed(bot, charge_id, start)
    if listed:
        return Attempt("refunded")
    return Attempt("unknown", error)


async def refund_stray(bot: Bot, shop: Runtime, charge_id: str, telegram_id: int) -> Attempt:
    """Refund a recorded stray charge, once: the caller that claims it calls Telegram, any
    other caller at the same time is told "busy". A failure frees the claim for a retry."""

    def claim(session: Session) -> bool:
        return stray_charges.claim_refund(session=session, charge_id=charge_id)

    if not await shop.run(claim):
        return Attempt("busy")
    attempt = await pay_back(bot, shop, telegram_id, charge_id)

    def record(session: Session) -> None:
        if attempt.outcome == "refunded":
            stray_charges.mark_refunded(session=session, charge_id=charge_id)
        else:
            stray_charges.mark_failed(
                session=session, charge_id=charge_id, error=attempt.error or attempt.outcome
            )

    await shop.run(record)
    return attempt
