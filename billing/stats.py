"""The operator's figures for `/stats`: buyers, Stars taken and tokens sold, granted and used.

Read-only aggregates over purchases and the ledger, so they agree with `audit` by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time

from sqlalchemy import case, func, select
from sqlmodel import Session, col

from billing.models import LedgerEntry, Purchase, utcnow


@dataclass(frozen=True)
class ShopStats:
    buyers: int  # distinct accounts with a purchase
    purchases: int
    revenue: int  # Stars of every purchase, refunded ones included
    refunded: int  # Stars of the purchases that were refunded
    tokens_sold: int
    tokens_granted: int
    tokens_used: int


def shop_stats(*, session: Session, since: datetime | None = None) -> ShopStats:
    """Figures for purchases and ledger movements at or after `since` (all time when None)."""
    purchases = select(
        func.count(func.distinct(Purchase.account_id)),
        func.count(col(Purchase.id)),
        func.coalesce(func.sum(Purchase.price), 0),
        func.coalesce(
            func.sum(case((col(Purchase.refunded_at).is_not(None), Purchase.price), else_=0)), 0
        ),
        func.coalesce(func.sum(Purchase.tokens), 0),
    )
    movements = select(
        func.coalesce(
            func.sum(case((col(LedgerEntry.kind) == "grant", LedgerEntry.amount), else_=0)), 0
        ),
        func.coalesce(
            func.sum(case((col(LedgerEntry.kind) == "usage", -LedgerEntry.amount), else_=0)), 0
        ),
    )
    if since is not None:
        purchases = purchases.where(col(Purchase.created_at) >= since)
        movements = movements.where(col(LedgerEntry.created_at) >= since)
    buyers, count, revenue, refunded, sold = session.execute(purchases).one()
    granted, used = session.execute(movements).one()
    return ShopStats(
        buyers=int(buyers),
        purchases=int(count),
        revenue=int(revenue),
        refunded=int(refunded),
        tokens_sold=int(sold),
        tokens_granted=int(granted),
        tokens_used=int(used),
    )


def start_of_day(now: datetime | None = None) -> datetime:
    """Midnight UTC of `now`'s day: "today" in `/stats`."""
    now = now or utcnow()
    return datetime.combine(now.date(), time.min, tzinfo=now.tzinfo)
