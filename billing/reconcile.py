"""Reconciliation of Telegram's Star transactions with our purchases.

Telegram's `getStarTransactions` is the source of truth for money; our purchases are the source
of truth for tokens. A successful-payment update can be lost (the bot was down longer than
Telegram retries, a handler crashed after the payment), and a refund can be made from outside
the bot. Walking the transactions in order repairs both: a paid charge we never recorded is
credited through its order, exactly as the update would have done (and just as idempotently); a
refund we never recorded is reversed. Anything that cannot be matched safely is reported for a
human, never guessed at. A plan's renewal names its first order like the first charge did; one
whose update was lost is credited to the plan's subscription, for the period Telegram lists.

This module knows nothing of Telegram's types: the bot turns each transaction into a
`StarCharge`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlmodel import Session, col, select

from billing import stray_charges
from billing.errors import OrderError
from billing.ledger import refund_purchase
from billing.models import Account, Order, Purchase
from billing.purchases import credit_order_payment
from billing.subscriptions import PlanCharge

Outcome = Literal["matched", "credited", "refunded", "problem", "ignored"]


@dataclass(frozen=True)
class StarCharge:
    """One Star transaction between a user and the bot."""

    charge_id: str
    telegram_id: int
    amount: int  # Stars
    payload: str | None  # the invoice payload (our order id) of an incoming payment
    refund: bool  # True for the bot paying the Stars back
    date: datetime | None = None  # when Telegram took the Stars
    subscription_period: int | None = None  # seconds, for a subscription's charge


@dataclass(frozen=True)
class ChargeResult:
    outcome: Outcome
    purchase: Purchase | None = None
    problem: str | None = None
    tokens: int = 0  # credited or reversed


def reconcile_charge(*, session: Session, charge: StarCharge) -> ChargeResult:
    """Bring the books in line with one transaction; safe to repeat any number of times."""
    purchase = session.exec(
        select(Purchase).where(col(Purchase.telegram_payment_charge_id) == charge.charge_id)
    ).first()
    if charge.refund:
        return _reconcile_refund(session, charge, purchase)
    if purchase is not None:
        if purchase.price != charge.amount:
            return _problem(
                f"charge {charge.charge_id}: Telegram took {charge.amount} Stars, "
                f"the purchase records {purchase.price}"
            )
        return ChargeResult("matched", purchase)
    if stray_charges.find(session=session, charge_id=charge.charge_id) is not None:
        return ChargeResult("matched")  # a stray charge the bot recorded and pays back
    return _credit_missing(session, charge)


def _credit_missing(session: Session, charge: StarCharge) -> ChargeResult:
    order = session.get(Order, charge.payload) if charge.payload else None
    if order is None:
        return _problem(
            f"charge {charge.charge_id} of user {charge.telegram_id} ({charge.amount} Stars) "
            "matches no order; not credited"
        )
    owner = session.get(Account, order.account_id)
    if owner is None or owner.telegram_id != charge.telegram_id:
        return _problem(
            f"charge {charge.charge_id} of user {charge.telegram_id} names order {order.id} "
            "of another account; not credited"
        )
    if order.price != charge.amount:
        return _problem(
            f"charge {charge.charge_id}: Telegram took {charge.amount} Stars for order "
            f"{order.id} priced {order.price}; not credited"
        )
    try:
        result = credit_order_payment(
            session=session,
            order_id=order.id,
            telegram_id=charge.telegram_id,
            charge_id=charge.charge_id,
            plan_charge=_plan_charge(charge),
        )
    except OrderError as error:
        return _problem(f"charge {charge.charge_id}: {error}")
    outcome: Outcome = "credited" if result.newly_credited else "matched"
    return ChargeResult(outcome, result.purchase, tokens=result.purchase.tokens)


def _plan_charge(charge: StarCharge) -> PlanCharge | None:
    """A subscription's charge pays for the period from its date on; whether it was the first
    is left to the books (transactions are walked oldest first)."""
    if charge.subscription_period is None or charge.date is None:
        return None
    return PlanCharge(charge.date + timedelta(seconds=charge.subscription_period), first=None)


def _reconcile_refund(
    session: Session, charge: StarCharge, purchase: Purchase | None
) -> ChargeResult:
    if purchase is None:
        return ChargeResult("ignored")  # refunded before we ever credited it: nothing to undo
    if purchase.refunded_at is not None:
        return ChargeResult("matched", purchase)
    result = refund_purchase(session=session, charge_id=charge.charge_id)
    outcome: Outcome = "refunded" if result.newly_refunded else "matched"
    return ChargeResult(outcome, result.purchase, tokens=result.reversed_tokens)


def _problem(message: str) -> ChargeResult:
    return ChargeResult("problem", problem=message)
