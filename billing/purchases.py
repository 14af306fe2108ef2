"""Orders and purchases: money moves once.

An order is what the buyer chose (a pack snapshot, a price, an expiry); its opaque id is the
invoice payload. The pre-checkout check reads only the database, so it answers well within
Telegram's 10 seconds. A purchase is credited once per `telegram_payment_charge_id`, enforced by
a unique constraint, so a repeated update, a restart or two workers never credit twice. The
first purchase of a referred buyer pays the referrer's share in the same transaction.

A monthly plan's order is paid by its first charge like a pack's, and Telegram then charges
again every period naming the same order: each such charge is credited once per charge id too,
as a purchase of the plan's subscription (`billing.subscriptions`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing import subscriptions
from billing.errors import OrderError, PurchaseNotFound
from billing.ledger import credit, get_balance, lock_account
from billing.models import Account, Order, Purchase, Referral, Subscription, utcnow
from billing.packs import Pack
from billing.plans import Plan
from billing.referrals import Reward, referrer_of, reward
from billing.subscriptions import PlanCharge

ORDER_TTL = timedelta(hours=1)


@dataclass(frozen=True)
class CreditResult:
    purchase: Purchase
    newly_credited: bool
    referral: Reward | None = None  # the referrer's share this purchase paid
    subscription: Subscription | None = None  # the plan this charge started or renewed


def create_order(
    *, session: Session, account_id: int, pack: Pack, ttl: timedelta = ORDER_TTL
) -> Order:
    now = utcnow()
    order = Order(
        id=secrets.token_urlsafe(24),
        account_id=account_id,
        pack_id=pack.id,
        pack_title=pack.title,
        tokens=pack.tokens,
        price=pack.price,
        currency=pack.currency,
        created_at=now,
        expires_at=now + ttl,
        subscription_period=pack.period_seconds if isinstance(pack, Plan) else None,
    )
    session.add(order)
    session.flush()
    return order


def check_order_payable(
    *, session: Session, order_id: str, telegram_id: int, amount: int, currency: str
) -> Order:
    """The pre-checkout check: an unexpired, unpaid order of this user at this exact price."""
    order = session.get(Order, order_id) if order_id else None
    if order is None:
        raise OrderError("This invoice is not known. Please choose a pack again.", "unknown")
    owner = session.get(Account, order.account_id)
    if owner is None or owner.telegram_id != telegram_id:
        raise OrderError("This invoice belongs to someone else.", "someone_else")
    if order.paid_at is not None:
        raise OrderError("This invoice has already been paid.", "paid")
    if order.expires_at <= utcnow():
        raise OrderError("This invoice has expired. Please choose a pack again.", "expired")
    if amount != order.price or currency != order.currency:
        raise OrderError("The price has changed. Please choose a pack again.", "price")
    return order


def credit_purchase(
    *,
    session: Session,
    account_id: int,
    charge_id: str,
    pack: Pack,
    order_id: str | None = None,
    provider_charge_id: str | None = None,
    subscription_id: int | None = None,
) -> CreditResult:
    """Record a paid charge and credit its tokens, once per charge id whatever the retries, and
    once per order: a second charge id for a paid order raises OrderError (reason "paid")."""
    existing = _find_purchase(session, charge_id)
    if existing is not None:
        return CreditResult(existing, newly_credited=False)
    _lock_buyer(session, account_id)
    purchase = Purchase(
        account_id=account_id,
        order_id=order_id,
        telegram_payment_charge_id=charge_id,
        provider_payment_charge_id=provider_charge_id,
        pack_id=pack.id,
        pack_title=pack.title,
        tokens=pack.tokens,
        price=pack.price,
        currency=pack.currency,
        subscription_id=subscription_id,
    )
    try:
        with session.begin_nested():
            session.add(purchase)
            session.flush()
            if order_id is not None and not _mark_paid(session, order_id):
                # One order, one payment: pre-checkout refuses a paid order, so a second
                # charge id for it is forged or Telegram's mistake, for an operator to look at.
                raise OrderError(
                    f"Order {order_id} is already paid; charge {charge_id!r} was not credited.",
                    "paid",
                )
    except IntegrityError:
        raced = _find_purchase(session, charge_id)
        if raced is None:
            raise
        return CreditResult(raced, newly_credited=False)
    credit(
        session=session,
        account_id=account_id,
        tokens=pack.tokens,
        kind="purchase",
        purchase_id=purchase.id,
    )
    paid = reward(session=session, purchase=purchase)
    return CreditResult(purchase, newly_credited=True, referral=paid)


def _lock_buyer(session: Session, account_id: int) -> None:
    """The buyer's and their referrer's rows before any row that refers to them, in ascending
    id (billing.locks)."""
    referrer = referrer_of(session=session, account_id=account_id)
    for locked in sorted({account_id, referrer or account_id}):
        lock_account(session, locked)


def _mark_paid(session: Session, order_id: str) -> bool:
    """Mark the order paid, unless it already is; the row lock makes two charges racing for one
    order take turns, and the second finds it paid."""
    marked = session.execute(
        update(Order)
        .where(col(Order.id) == order_id, col(Order.paid_at).is_(None))
        .values(paid_at=utcnow())
    )
    return marked.rowcount == 1  # type: ignore[attr-defined]


def credit_order_payment(
    *,
    session: Session,
    order_id: str,
    telegram_id: int,
    charge_id: str,
    provider_charge_id: str | None = None,
    plan_charge: PlanCharge | None = None,
) -> CreditResult:
    """Credit a successful payment for an order. Telegram has taken the Stars by now, so an
    expired order is still honoured; only an order of somebody else is refused. A plan's
    order is credited once per charge: its first and every renewal (`plan_charge` says which,
    and the period paid for)."""
    order = session.get(Order, order_id)
    if order is None:
        raise OrderError(f"Payment {charge_id!r} names an unknown order.", "unknown")
    owner = session.get(Account, order.account_id)
    if owner is None or owner.telegram_id != telegram_id:
        raise OrderError(f"Payment {charge_id!r} is for an order of another user.", "someone_else")
    if order.subscription_period is not None:
        return _credit_plan_charge(session, order, charge_id, provider_charge_id, plan_charge)
    pack = Pack(order.pack_id, order.pack_title, order.tokens, order.price, order.currency)
    return credit_purchase(
        session=session,
        account_id=order.account_id,
        charge_id=charge_id,
        pack=pack,
        order_id=order.id,
        provider_charge_id=provider_charge_id,
    )


def _credit_plan_charge(
    session: Session,
    order: Order,
    charge_id: str,
    provider_charge_id: str | None,
    plan_charge: PlanCharge | None,
) -> CreditResult:
    """One charge of a plan's subscription. The first pays the order (a second "first" charge
    for it raises OrderError, as a second payment of a pack's order does); a renewal is a
    purchase of the subscription the first started. A renewal arriving before its first charge
    (whose update was lost) starts the subscription, and the first charge, found later, still
    pays the order."""
    assert order.subscription_period is not None
    charge = plan_charge or PlanCharge(
        expires_at=utcnow() + timedelta(seconds=order.subscription_period), first=None
    )
    existing = _find_purchase(session, charge_id)
    if existing is None:
        _lock_buyer(session, order.account_id)  # one caller at a time from here on
        existing = _find_purchase(session, charge_id)
    subscription = subscriptions.for_order(session=session, order_id=order.id)
    if existing is not None:
        return CreditResult(existing, newly_credited=False, subscription=subscription)
    if subscription is None:
        subscription = subscriptions.start(
            session=session, order=order, expires_at=charge.expires_at
        )
    first = charge.first if charge.first is not None else subscription.first_charge_id is None
    if first and subscription.first_charge_id not in (None, charge_id):
        raise OrderError(
            f"Order {order.id} is already paid; charge {charge_id!r} was not credited.", "paid"
        )
    assert subscription.id is not None
    plan = Pack(order.pack_id, order.pack_title, order.tokens, order.price, order.currency)
    result = credit_purchase(
        session=session,
        account_id=order.account_id,
        charge_id=charge_id,
        pack=plan,
        order_id=order.id if first else None,
        provider_charge_id=provider_charge_id,
        subscription_id=subscription.id,
    )
    subscriptions.record_charge(
        session=session,
        subscription=subscription,
        charge_id=charge_id,
        first=first,
        expires_at=charge.expires_at,
    )
    return CreditResult(
        result.purchase, result.newly_credited, result.referral, subscription=subscription
    )


def recent_purchases(*, session: Session, account_id: int, limit: int = 5) -> list[Purchase]:
    return list(
        session.exec(
            select(Purchase)
            .where(col(Purchase.account_id) == account_id)
            .order_by(col(Purchase.id).desc())
            .limit(limit)
        ).all()
    )


def _find_purchase(session: Session, charge_id: str) -> Purchase | None:
    return session.exec(
        select(Purchase).where(col(Purchase.telegram_payment_charge_id) == charge_id)
    ).first()


@dataclass(frozen=True)
class RefundCheck:
    """A buyer's request to refund one of their purchases, against the rule the terms state:
    within the window, and the pack's tokens unused (the available balance covers the pack).
    A purchase that paid a referral reward is left to the operator, so that buying and refunding
    cannot mint referral tokens."""

    purchase: Purchase
    available: int
    within_window: bool
    unused: bool
    paid_referral: bool

    @property
    def automatic(self) -> bool:
        return (
            self.purchase.refunded_at is None
            and self.within_window
            and self.unused
            and not self.paid_referral
        )


def check_refund(
    *, session: Session, account_id: int, purchase_id: int, window: timedelta
) -> RefundCheck:
    """Raises PurchaseNotFound unless the purchase is this account's."""
    purchase = session.get(Purchase, purchase_id)
    if purchase is None or purchase.account_id != account_id:
        raise PurchaseNotFound(f"No purchase {purchase_id} of account {account_id}.")
    available = get_balance(session=session, account_id=account_id).available
    paid_referral = (
        session.exec(select(Referral.id).where(col(Referral.purchase_id) == purchase.id)).first()
        is not None
    )
    return RefundCheck(
        purchase=purchase,
        available=available,
        within_window=utcnow() - purchase.created_at <= window,
        unused=available >= purchase.tokens,
        paid_referral=paid_referral,
    )
