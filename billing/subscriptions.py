"""Subscriptions: a buyer's monthly plan, from its first charge through every renewal.

Telegram owns the schedule: it charges the buyer every period and sends each charge as a
successful payment naming the plan's order (its invoice payload). Tokens move only when such a
charge arrives (`billing.purchases.credit_order_payment`, once per charge id like a pack), so a
renewal that never comes credits nothing and one that comes late credits when it comes. This
module keeps the subscription's state beside those charges: the paid period's end (Telegram's
`subscription_expiration_date`), the first charge's id (what `editUserStarSubscription` names),
a cancellation made in the bot, and the notice sent before each renewal.

Unused tokens carry over at renewal: a renewal adds the plan's tokens to the balance, as the
terms say, and takes nothing away.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from billing.models import Account, Order, Purchase, Subscription, utcnow

RECENT_ENDED = timedelta(days=30)  # an ended plan stays in the buyer's view this long
REMINDER_BATCH = 500


@dataclass(frozen=True)
class PlanCharge:
    """What Telegram says about one charge of a subscription."""

    expires_at: datetime  # the end of the period this charge pays for
    first: bool | None  # `is_first_recurring`; None when unknown (found by reconciliation)


@dataclass(frozen=True)
class PlanCredit:
    """A credited plan charge, as the buyer is told about it."""

    title: str
    price: int
    expires_at: datetime  # the next renewal
    first: bool  # the subscription's first charge (else a renewal)


@dataclass(frozen=True)
class Reminder:
    """A renewal coming soon, to tell its buyer about."""

    subscription_id: int
    telegram_id: int
    language: str | None
    title: str
    tokens: int
    price: int
    renews_at: datetime


def for_order(*, session: Session, order_id: str) -> Subscription | None:
    return session.exec(select(Subscription).where(col(Subscription.order_id) == order_id)).first()


def start(*, session: Session, order: Order, expires_at: datetime) -> Subscription:
    """The subscription an order's first charge (or, if that was lost, its first renewal to
    arrive) starts; the caller holds the account's lock, so there is one per order."""
    assert order.subscription_period is not None
    subscription = Subscription(
        account_id=order.account_id,
        order_id=order.id,
        plan_id=order.pack_id,
        plan_title=order.pack_title,
        tokens=order.tokens,
        price=order.price,
        period_seconds=order.subscription_period,
        expires_at=expires_at,
    )
    session.add(subscription)
    session.flush()
    return subscription


def record_charge(
    *,
    session: Session,
    subscription: Subscription,
    charge_id: str,
    first: bool,
    expires_at: datetime,
) -> None:
    """A charge was credited: the paid period now ends at `expires_at` (never earlier than it
    did: a late or reconciled charge cannot shorten it). A renewal that pays for a later
    period means Telegram renews the plan, so a cancellation recorded in the bot no longer
    holds (the buyer resumed it in Telegram)."""
    if first:
        subscription.first_charge_id = charge_id
    if expires_at > subscription.expires_at:
        subscription.expires_at = expires_at
        if not first:
            subscription.canceled_at = None
    session.add(subscription)
    session.flush()


def credit_of(*, session: Session, purchase: Purchase) -> PlanCredit | None:
    """The plan a credited purchase renewed or started; None for a pack."""
    if purchase.subscription_id is None:
        return None
    subscription = session.get(Subscription, purchase.subscription_id)
    assert subscription is not None
    return PlanCredit(
        title=subscription.plan_title,
        price=subscription.price,
        expires_at=subscription.expires_at,
        first=subscription.first_charge_id == purchase.telegram_payment_charge_id,
    )


def of_account(
    *, session: Session, account_id: int, now: datetime | None = None
) -> list[Subscription]:
    """The account's running subscriptions and those that ended lately, newest first."""
    since = (now or utcnow()) - RECENT_ENDED
    return list(
        session.exec(
            select(Subscription)
            .where(
                col(Subscription.account_id) == account_id,
                col(Subscription.expires_at) >= since,
            )
            .order_by(col(Subscription.id).desc())
        ).all()
    )


def owned(*, session: Session, account_id: int, subscription_id: int) -> Subscription | None:
    subscription = session.get(Subscription, subscription_id)
    if subscription is None or subscription.account_id != account_id:
        return None
    return subscription


def set_canceled(*, session: Session, subscription_id: int, canceled: bool) -> Subscription:
    """Record what Telegram was just told: cancelled (it ends with its period) or resumed."""
    subscription = session.get(Subscription, subscription_id)
    assert subscription is not None
    subscription.canceled_at = utcnow() if canceled else None
    session.add(subscription)
    session.flush()
    return subscription


def is_active(subscription: Subscription, now: datetime | None = None) -> bool:
    """Paid up to a time still ahead."""
    return subscription.expires_at > (now or utcnow())


def renewals(*, session: Session, subscription_id: int) -> int:
    """Charges after the first."""
    charges = session.execute(
        sa_select(func.count()).where(col(Purchase.subscription_id) == subscription_id)
    ).scalar_one()
    return max(0, int(charges) - 1)


def claim_reminders(
    *, session: Session, ahead: timedelta, now: datetime | None = None, limit: int = REMINDER_BATCH
) -> list[Reminder]:
    """Renewals due within `ahead` whose buyers have not been told yet, each claimed with a
    guarded UPDATE so that of several bot processes only one tells the buyer, once per period.
    A cancelled plan has no renewal to announce, nor has a buyer who blocked the bot."""
    now = now or utcnow()
    due = (
        col(Subscription.canceled_at).is_(None),
        col(Subscription.expires_at) > now,
        col(Subscription.expires_at) <= now + ahead,
        or_(
            col(Subscription.reminded_for).is_(None),
            col(Subscription.reminded_for) < col(Subscription.expires_at),
        ),
    )
    rows = session.execute(
        sa_select(
            col(Subscription.id),
            col(Account.telegram_id),
            func.coalesce(col(Account.chosen_language), col(Account.language)),
            col(Subscription.plan_title),
            col(Subscription.tokens),
            col(Subscription.price),
            col(Subscription.expires_at),
        )
        .join(Account, col(Account.id) == Subscription.account_id)
        .where(*due, col(Account.telegram_id).is_not(None), col(Account.blocked_at).is_(None))
        .order_by(col(Subscription.id))
        .limit(limit)
    ).all()
    reminders: list[Reminder] = []
    for subscription_id, telegram_id, language, title, tokens, price, expires_at in rows:
        claimed = session.execute(
            update(Subscription)
            .where(col(Subscription.id) == subscription_id, *due)
            .values(reminded_for=Subscription.expires_at)
        )
        if claimed.rowcount == 1:  # type: ignore[attr-defined]
            reminders.append(
                Reminder(
                    subscription_id,
                    telegram_id,
                    language,
                    title,
                    tokens,
                    price,
                    expires_at,
                )
            )
    return reminders
