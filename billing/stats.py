"""Figures from the books: the operator's `/stats` (buyers, Stars taken, tokens sold, granted and
used) and a buyer's usage by day, model and key, with its CSV export.

Read-only aggregates over purchases and the ledger, so they agree with `audit` by construction.
A usage entry's request id is its hold's id, and the hold names the key that asked.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime, time

from sqlalchemy import ColumnElement, case, func, select
from sqlmodel import Session, col

from billing.models import ApiKey, Hold, LedgerEntry, Purchase, Subscription, utcnow


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


@dataclass(frozen=True)
class UsageRow:
    """One day's requests to one model (UTC days)."""

    day: str  # YYYY-MM-DD
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    charged: int  # balance tokens billed: the model's prices applied


@dataclass(frozen=True)
class KeyUsage:
    requests: int
    charged: int


def _usage(account_id: int) -> list[ColumnElement[bool]]:
    # A released hold (nothing generated) is a usage entry of 0 tokens: not a billed request.
    return [
        col(LedgerEntry.account_id) == account_id,
        col(LedgerEntry.kind) == "usage",
        col(LedgerEntry.amount) != 0,
    ]


def usage_by_day(
    *,
    session: Session,
    account_id: int,
    key_id: int | None = None,
    page: int = 0,
    per_page: int = 10,
) -> tuple[list[UsageRow], bool]:
    """A page of (day, model) rows, newest day first, and whether an older page exists. With
    `key_id`, only that key's requests."""
    day = func.date(LedgerEntry.created_at)
    query = select(
        day,
        func.coalesce(LedgerEntry.model, ""),
        func.count(),
        func.coalesce(func.sum(LedgerEntry.prompt_tokens), 0),
        func.coalesce(func.sum(LedgerEntry.completion_tokens), 0),
        func.coalesce(func.sum(-col(LedgerEntry.amount)), 0),
    ).where(*_usage(account_id))
    if key_id is not None:
        query = query.join(Hold, col(Hold.id) == LedgerEntry.request_id).where(
            col(Hold.key_id) == key_id
        )
    rows = session.execute(
        query.group_by(day, col(LedgerEntry.model))
        .order_by(day.desc(), col(LedgerEntry.model))
        .limit(per_page + 1)
        .offset(max(page, 0) * per_page)
    ).all()
    usage = [
        UsageRow(str(d), str(m) or "—", int(n), int(p), int(c), int(t))
        for d, m, n, p, c, t in rows[:per_page]
    ]
    return usage, len(rows) > per_page


def daily_usage(
    *, session: Session, since: datetime, account_id: int | None = None
) -> list[UsageRow]:
    """(day, model) rows of billed requests at or after `since`, oldest day first: one account's
    (the Mini App's usage chart) or, with no `account_id`, every account's (the operator's)."""
    day = func.date(LedgerEntry.created_at)
    where = [
        col(LedgerEntry.kind) == "usage",
        col(LedgerEntry.amount) != 0,
        col(LedgerEntry.created_at) >= since,
    ]
    if account_id is not None:
        where.append(col(LedgerEntry.account_id) == account_id)
    rows = session.execute(
        select(
            day,
            func.coalesce(LedgerEntry.model, ""),
            func.count(),
            func.coalesce(func.sum(LedgerEntry.prompt_tokens), 0),
            func.coalesce(func.sum(LedgerEntry.completion_tokens), 0),
            func.coalesce(func.sum(-col(LedgerEntry.amount)), 0),
        )
        .where(*where)
        .group_by(day, col(LedgerEntry.model))
        .order_by(day, col(LedgerEntry.model))
    ).all()
    return [
        UsageRow(str(d), str(m) or "—", int(n), int(p), int(c), int(t)) for d, m, n, p, c, t in rows
    ]


def usage_by_key(*, session: Session, account_id: int) -> dict[int | None, KeyUsage]:
    """Requests and tokens billed per key id (None: requests from before keys were recorded)."""
    rows = session.execute(
        select(col(Hold.key_id), func.count(), func.coalesce(func.sum(-col(LedgerEntry.amount)), 0))
        .select_from(LedgerEntry)
        .outerjoin(Hold, col(Hold.id) == LedgerEntry.request_id)
        .where(*_usage(account_id))
        .group_by(col(Hold.key_id))
    ).all()
    return {key_id: KeyUsage(int(n), int(t)) for key_id, n, t in rows}


def key_usage(*, session: Session, key_id: int) -> tuple[str, KeyUsage]:
    """One key's name, and the requests made and tokens billed with it."""
    name = session.execute(select(col(ApiKey.name)).where(col(ApiKey.id) == key_id)).scalar_one()
    requests, charged = session.execute(
        select(func.count(), func.coalesce(func.sum(-col(LedgerEntry.amount)), 0))
        .select_from(LedgerEntry)
        .join(Hold, col(Hold.id) == LedgerEntry.request_id)
        .where(
            col(Hold.key_id) == key_id,
            col(LedgerEntry.kind) == "usage",
            col(LedgerEntry.amount) != 0,
        )
    ).one()
    return str(name), KeyUsage(int(requests), int(charged))


CSV_LIMIT = 100_000


def usage_csv(*, session: Session, account_id: int, limit: int = CSV_LIMIT) -> str:
    """Every billed request of the account, oldest first, as CSV (a buyer's export)."""
    rows = session.execute(
        select(
            col(LedgerEntry.created_at),
            col(LedgerEntry.request_id),
            col(LedgerEntry.model),
            col(ApiKey.name),
            col(ApiKey.hint),
            col(LedgerEntry.prompt_tokens),
            col(LedgerEntry.completion_tokens),
            -col(LedgerEntry.amount),
        )
        .select_from(LedgerEntry)
        .outerjoin(Hold, col(Hold.id) == LedgerEntry.request_id)
        .outerjoin(ApiKey, col(ApiKey.id) == Hold.key_id)
        .where(*_usage(account_id))
        .order_by(col(LedgerEntry.id))
        .limit(limit)
    ).all()
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["time_utc", "request_id", "model", "key", "prompt_tokens", "completion_tokens", "charged"]
    )
    for created, request_id, model, name, hint, prompt, completion, charged in rows:
        key = f"{name} (…{hint})" if name else ""
        writer.writerow(
            [f"{created:%Y-%m-%d %H:%M:%S}", request_id, model, key, prompt, completion, charged]
        )
    return out.getvalue()


@dataclass(frozen=True)
class PlanStats:
    """Monthly plans in a period (`/stats`): a plan's first charge pays its order, a renewal
    names only its subscription."""

    started: int  # first charges
    renewals: int
    cancellations: int  # cancelled in the bot and not resumed
    ended: int  # paid periods that ran out without a renewal
    revenue: int  # Stars of every plan charge, refunded ones included


def plan_stats(
    *, session: Session, since: datetime | None = None, now: datetime | None = None
) -> PlanStats:
    """Plan figures at or after `since` (all time when None)."""
    now = now or utcnow()
    charges = select(
        func.coalesce(func.sum(case((col(Purchase.order_id).is_not(None), 1), else_=0)), 0),
        func.coalesce(func.sum(case((col(Purchase.order_id).is_(None), 1), else_=0)), 0),
        func.coalesce(func.sum(Purchase.price), 0),
    ).where(col(Purchase.subscription_id).is_not(None))
    canceled = select(func.count()).where(col(Subscription.canceled_at).is_not(None))
    ended = select(func.count()).where(col(Subscription.expires_at) <= now)
    if since is not None:
        charges = charges.where(col(Purchase.created_at) >= since)
        canceled = canceled.where(col(Subscription.canceled_at) >= since)
        ended = ended.where(col(Subscription.expires_at) >= since)
    started, renewals, revenue = session.execute(charges).one()
    return PlanStats(
        started=int(started),
        renewals=int(renewals),
        cancellations=int(session.execute(canceled).scalar_one()),
        ended=int(session.execute(ended).scalar_one()),
        revenue=int(revenue),
    )


def running_plans(*, session: Session, now: datetime | None = None) -> tuple[int, int]:
    """Subscriptions paid up to a time still ahead, and how many of them were cancelled (they
    end with their period)."""
    running, ending = session.execute(
        select(
            func.count(),
            func.coalesce(
                func.sum(case((col(Subscription.canceled_at).is_not(None), 1), else_=0)), 0
            ),
        ).where(col(Subscription.expires_at) > (now or utcnow()))
    ).one()
    return int(running), int(ending)
