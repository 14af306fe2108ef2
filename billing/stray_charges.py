"""Stray charges: Stars that Telegram took for nothing we can credit, and their refunds.

A successful payment whose order was already paid (a second charge for one order), is unknown or
belongs to someone else cannot be credited, and the Stars must not stay in limbo. It is recorded
once per charge id (a unique constraint, so a repeated update records nothing new) and refunded
at once. One caller at a time may try the refund: `claim_refund` is a guarded UPDATE that a
second caller within `RETRY_AFTER` loses, so a charge delivered twice is refunded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing.accounts import find_telegram_account
from billing.models import StrayCharge, utcnow

RETRY_AFTER = timedelta(minutes=1)  # a claim older than this (a crash mid-refund) lapses
ERROR_LENGTH = 255


@dataclass(frozen=True)
class Recorded:
    charge: StrayCharge
    new: bool  # False: this charge id was recorded before


def record(
    *,
    session: Session,
    charge_id: str,
    telegram_id: int,
    amount: int,
    currency: str,
    payload: str | None,
    reason: str,
) -> Recorded:
    """Record a charge that was not credited, once per charge id."""
    existing = find(session=session, charge_id=charge_id)
    if existing is not None:
        return Recorded(existing, new=False)
    account = find_telegram_account(session=session, telegram_id=telegram_id)
    row = StrayCharge(
        telegram_payment_charge_id=charge_id,
        telegram_id=telegram_id,
        account_id=account.id if account else None,
        amount=amount,
        currency=currency,
        payload=(payload or "")[:255] or None,
        reason=reason,
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        raced = find(session=session, charge_id=charge_id)
        if raced is None:
            raise
        return Recorded(raced, new=False)
    return Recorded(row, new=True)


def find(*, session: Session, charge_id: str) -> StrayCharge | None:
    return session.exec(
        select(StrayCharge).where(col(StrayCharge.telegram_payment_charge_id) == charge_id)
    ).first()


def claim_refund(*, session: Session, charge_id: str) -> bool:
    """Claim the right to call Telegram's refund for this charge now; False if it is refunded
    already or another caller claimed it within `RETRY_AFTER`."""
    now = utcnow()
    claimed = session.execute(
        update(StrayCharge)
        .where(
            col(StrayCharge.telegram_payment_charge_id) == charge_id,
            col(StrayCharge.refunded_at).is_(None),
            or_(
                col(StrayCharge.refund_tried_at).is_(None),
                col(StrayCharge.refund_tried_at) < now - RETRY_AFTER,
            ),
        )
        .values(refund_tried_at=now)
    )
    return claimed.rowcount == 1  # type: ignore[attr-defined]


def mark_refunded(*, session: Session, charge_id: str) -> None:
    session.execute(
        update(StrayCharge)
        .where(
            col(StrayCharge.telegram_payment_charge_id) == charge_id,
            col(StrayCharge.refunded_at).is_(None),
        )
        .values(refunded_at=utcnow(), refund_error=None)
    )


def mark_failed(*, session: Session, charge_id: str, error: str) -> None:
    """Telegram refused or did not answer: the claim lapses at once, so a retry may try again."""
    session.execute(
        update(StrayCharge)
        .where(
            col(StrayCharge.telegram_payment_charge_id) == charge_id,
            col(StrayCharge.refunded_at).is_(None),
        )
        .values(refund_error=error[:ERROR_LENGTH], refund_tried_at=None)
    )


def of_user(*, session: Session, telegram_id: int, limit: int = 10) -> list[StrayCharge]:
    """A Telegram user's stray charges, newest first (for /paysupport)."""
    return list(
        session.exec(
            select(StrayCharge)
            .where(col(StrayCharge.telegram_id) == telegram_id)
            .order_by(col(StrayCharge.id).desc())
            .limit(limit)
        ).all()
    )


def unrefunded(*, session: Session, limit: int = 100) -> list[StrayCharge]:
    """Charges still owed back (Telegram refused or timed out), oldest first."""
    return list(
        session.exec(
            select(StrayCharge)
            .where(col(StrayCharge.refunded_at).is_(None))
            .order_by(col(StrayCharge.id))
            .limit(limit)
        ).all()
    )
