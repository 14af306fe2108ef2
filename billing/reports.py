"""The operator's figures over a window of days, for the Mini App's operator pages: Stars taken
per day and per pack, refunds, new and paying buyers, the heaviest accounts, open holds and the
support queue. Read-only aggregates, like `billing.stats` (tokens per day per model is its
`daily_usage` over every account); days are UTC dates.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlmodel import Session, col

from billing.models import Account, Hold, LedgerEntry, Purchase, SupportMessage


@dataclass(frozen=True)
class PackDay:
    """One day's sales of one pack."""

    day: str  # YYYY-MM-DD
    pack: str  # the title it was sold under
    purchases: int
    stars: int


@dataclass(frozen=True)
class Refunds:
    day: str
    refunds: int
    stars: int


@dataclass(frozen=True)
class BuyersDay:
    day: str
    new: int  # accounts opened that day
    paying: int  # distinct accounts that paid that day


@dataclass(frozen=True)
class TopAccount:
    account_id: int
    telegram_id: int | None
    name: str | None
    used: int  # tokens billed in the window
    stars: int  # Stars paid in the window (refunded purchases included)


@dataclass(frozen=True)
class OpenHolds:
    holds: int
    tokens: int
    oldest: datetime | None


@dataclass(frozen=True)
class Waiting:
    """A buyer whose last support message has no operator reply after it."""

    account_id: int
    telegram_id: int | None
    name: str | None
    text: str
    at: datetime


def sales_by_day(*, session: Session, since: datetime) -> list[PackDay]:
    day = func.date(Purchase.created_at)
    rows = session.execute(
        select(day, col(Purchase.pack_title), func.count(), func.sum(Purchase.price))
        .where(col(Purchase.created_at) >= since)
        .group_by(day, col(Purchase.pack_title))
        .order_by(day, col(Purchase.pack_title))
    ).all()
    return [PackDay(str(d), str(p), int(n), int(s)) for d, p, n, s in rows]


def refunds_by_day(*, session: Session, since: datetime) -> list[Refunds]:
    day = func.date(Purchase.refunded_at)
    rows = session.execute(
        select(day, func.count(), func.sum(Purchase.price))
        .where(col(Purchase.refunded_at) >= since)
        .group_by(day)
        .order_by(day)
    ).all()
    return [Refunds(str(d), int(n), int(s)) for d, n, s in rows]


def buyers_by_day(*, session: Session, since: datetime) -> list[BuyersDay]:
    opened = func.date(Account.created_at)
    new = dict(
        session.execute(
            select(opened, func.count()).where(col(Account.created_at) >= since).group_by(opened)
        ).all()
    )
    paid = func.date(Purchase.created_at)
    paying = dict(
        session.execute(
            select(paid, func.count(func.distinct(Purchase.account_id)))
            .where(col(Purchase.created_at) >= since)
            .group_by(paid)
        ).all()
    )
    days = sorted({str(d) for d in new} | {str(d) for d in paying})
    new_by = {str(d): int(n) for d, n in new.items()}
    paying_by = {str(d): int(n) for d, n in paying.items()}
    return [BuyersDay(d, new_by.get(d, 0), paying_by.get(d, 0)) for d in days]


def top_accounts(*, session: Session, since: datetime, limit: int = 10) -> list[TopAccount]:
    """The accounts that used the most tokens in the window, with the Stars they paid in it."""
    used = (
        select(
            col(LedgerEntry.account_id).label("account_id"),
            func.sum(-col(LedgerEntry.amount)).label("used"),
        )
        .where(col(LedgerEntry.kind) == "usage", col(LedgerEntry.created_at) >= since)
        .group_by(col(LedgerEntry.account_id))
        .subquery()
    )
    paid = (
        select(
            col(Purchase.account_id).label("account_id"),
            func.sum(Purchase.price).label("stars"),
        )
        .where(col(Purchase.created_at) >= since)
        .group_by(col(Purchase.account_id))
        .subquery()
    )
    rows = session.execute(
        select(
            col(Account.id),
            col(Account.telegram_id),
            col(Account.name),
            func.coalesce(used.c.used, 0),
            func.coalesce(paid.c.stars, 0),
        )
        .outerjoin(used, used.c.account_id == Account.id)
        .outerjoin(paid, paid.c.account_id == Account.id)
        .where((used.c.used > 0) | (paid.c.stars > 0))
        .order_by(func.coalesce(used.c.used, 0).desc(), col(Account.id))
        .limit(limit)
    ).all()
    return [TopAccount(int(i), t, n, int(u), int(s)) for i, t, n, u, s in rows]


def open_holds(*, session: Session) -> OpenHolds:
    """Tokens reserved by requests in flight now (a number that stays up means stuck holds)."""
    count, tokens, oldest = session.execute(
        select(
            func.count(), func.coalesce(func.sum(Hold.amount), 0), func.min(Hold.created_at)
        ).where(col(Hold.state) == "held")
    ).one()
    return OpenHolds(int(count), int(tokens), oldest)


def support_queue(*, session: Session, limit: int = 20) -> list[Waiting]:
    """Buyers waiting for an answer, longest waiting first: each one's last message, when no
    operator wrote to them after it."""
    last = (
        select(func.max(SupportMessage.id))
        .group_by(col(SupportMessage.account_id))
        .scalar_subquery()
    )
    rows = session.execute(
        select(
            col(Account.id),
            col(Account.telegram_id),
            col(Account.name),
            col(SupportMessage.text),
            col(SupportMessage.created_at),
        )
        .join(Account, col(Account.id) == SupportMessage.account_id)
        .where(col(SupportMessage.id).in_(last), col(SupportMessage.operator_id).is_(None))
        .order_by(col(SupportMessage.id))
        .limit(limit)
    ).all()
    return [Waiting(int(i), t, n, str(x), at) for i, t, n, x, at in rows]


def ledger_entries(*, session: Session) -> int:
    """Entries ever appended to the ledger (its highest id: one index read, however long the
    ledger), so a rate of it is ledger writes per second."""
    return int(session.execute(select(func.coalesce(func.max(LedgerEntry.id), 0))).scalar_one())
