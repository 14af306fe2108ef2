"""A key's own limits: a spend limit over a period that resets, an expiry time, the models it may
use, and requests and tokens per minute; each optional, each held in the database so that every
replica enforces the same numbers.

A key's `KeyLimit` row is made with the key and handed on when the key is rotated, so a new key
keeps the spend of the one it replaced. The spend limit is held like the balance: `ledger.hold`
reserves a request's tokens from the row (`held`) under its account's lock, with a guarded UPDATE
(`WHERE spent + held + :n <= spend_limit`), and the hold's resolution moves them to `spent`. So
concurrent requests on one key, on any number of replicas, never spend past its limit.

Periods reset at UTC boundaries (midnight; Monday; the 1st), lazily: the first hold or report
after a boundary finds `period_start` older than the current period's and counts from 0. A
request counts toward the period its hold was placed in.

RPM and TPM count in fixed one-minute windows on the same row, opened by the first request after
the last window ended: a request is counted when its hold is placed, its tokens as the hold's
amount, and what the hold did not use is given back when it resolves in the same window. A
refusal says how many seconds are left of the window (`Retry-After`).

Every write to a row locks its account first (`billing.locks`), like every write of the ledger,
so the row's updates take turns with the holds and settlements of the same account.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, bindparam, case, func, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from billing.errors import (
    InvalidLimits,
    KeyExpired,
    KeyLimitReached,
    KeyNotFound,
    KeyRateLimited,
    ModelNotAllowed,
)
from billing.locks import lock_accounts
from billing.models import ApiKey, Hold, KeyLimit, LedgerEntry

PERIODS = ("daily", "weekly", "monthly", "total")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the one period of "total"
RATE_WINDOW = timedelta(minutes=1)
MAX_MODELS_LENGTH = 1024


@dataclass(frozen=True)
class Limits:
    """A key's limits; None (or no models) leaves that limit off."""

    spend: int | None = None
    period: str = "total"
    expires_at: datetime | None = None
    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        if self.period not in PERIODS:
            raise InvalidLimits(f"The period must be one of {', '.join(PERIODS)}.")
        for name, value in (("spend", self.spend), ("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and (value < (0 if name == "spend" else 1)):
                raise InvalidLimits(f"The {name} limit must be a positive whole number.")
        if len(",".join(self.models)) > MAX_MODELS_LENGTH:
            raise InvalidLimits("The model list is too long.")
        if self.expires_at is not None and self.expires_at.tzinfo is None:
            raise InvalidLimits("The expiry time must name its time zone.")

    @property
    def any(self) -> bool:
        return self != Limits()


@dataclass(frozen=True)
class KeyDefaults:
    """The operator's limits for every new key (`KEY_DEFAULT_LIMITS`); an expiry is a lifetime,
    counted from each key's issue."""

    limits: Limits = Limits()
    lifetime: timedelta | None = None

    def for_key(self, now: datetime) -> Limits:
        expires = now + self.lifetime if self.lifetime is not None else self.limits.expires_at
        return replace(self.limits, expires_at=expires)


def parse_defaults(text: str) -> KeyDefaults | None:
    """`KEY_DEFAULT_LIMITS`, written as `parse` reads limits (`expires 90d`: a lifetime)."""
    if not text.strip():
        return None
    lifetime = None
    found = re.search(r"(?:^|;)\s*expires[ =]+(\d+)d\s*(?:;|$)", text)
    if found:
        lifetime = timedelta(days=int(found.group(1)))
        text = text[: found.start()] + ";" + text[found.end() :]
    _, changes = parse(text)
    return KeyDefaults(replace(Limits(), **changes), lifetime)


@dataclass(frozen=True)
class KeyReport:
    """A key's limits and where it stands, as `GET /v1/key`, the bot and the CLI show it."""

    key_id: int
    limit_id: int
    limits: Limits
    spent: int  # billed this period
    held: int  # reserved by the key's requests running now
    spent_total: int
    period_start: datetime | None  # None for "total"
    resets_at: datetime | None  # None for "total"

    @property
    def remaining(self) -> int | None:
        if self.limits.spend is None:
            return None
        return max(0, self.limits.spend - self.spent - self.held)


@dataclass(frozen=True)
class Room:
    """What a key lets one hold reserve: at most `most` tokens (its spend limit's room)."""

    limit_id: int
    account_id: int
    most: int
    spent: int  # this period's, after any reset
    period_start: datetime
    window_start: datetime
    window_requests: int
    window_tokens: int
    seen: tuple[int, int, int, int]  # held, spent, window requests, window tokens as read


def period_start(period: str, now: datetime) -> datetime:
    """The start of the period `now` is in (UTC): midnight, Monday's midnight, the 1st."""
    now = now.astimezone(UTC)
    day = datetime(now.year, now.month, now.day, tzinfo=UTC)
    if period == "daily":
        return day
    if period == "weekly":
        return day - timedelta(days=day.weekday())
    if period == "monthly":
        return day.replace(day=1)
    return EPOCH


def resets_at(period: str, now: datetime) -> datetime | None:
    """When the period `now` is in ends; None for "total", which never does."""
    start = period_start(period, now)
    if period == "daily":
        return start + timedelta(days=1)
    if period == "weekly":
        return start + timedelta(days=7)
    if period == "monthly":
        return (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else (start.replace(month=start.month + 1))
        )
    return None


def limits_of(row: KeyLimit) -> Limits:
    return Limits(
        spend=row.spend_limit,
        period=row.period,
        expires_at=row.expires_at,
        models=split_models(row.models),
        rpm=row.rpm,
        tpm=row.tpm,
    )


def split_models(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def check_expiry(expires_at: datetime | None, now: datetime) -> None:
    """Raise KeyExpired once `expires_at` has passed."""
    if expires_at is not None and now >= expires_at:
        raise KeyExpired(expires_at)


def check_model(models: tuple[str, ...], model: str) -> None:
    """Raise ModelNotAllowed for a model outside a non-empty list."""
    if models and model not in models:
        raise ModelNotAllowed(model, models)


# Setting limits: the CLI's options, the bot's text and the operator's defaults.


def parse(text: str) -> tuple[bool, dict[str, Any]]:
    """Limits written as a person would: `spend 500 daily; rpm 60; tpm 10000; models a,b;
    expires 2027-01-31`, with `clear` (everything off first) and `<limit> off`. Returns whether
    to clear and the changes, for `set_limits`; raises InvalidLimits with what was not understood.
    """
    clear = False
    changes: dict[str, Any] = {}
    for part in re.split(r"[;\n]+", text.strip()):
        words = part.replace("=", " ").split()
        if not words:
            continue
        name, args = words[0].lower(), words[1:]
        off = len(args) == 1 and args[0].lower() in ("off", "none", "no", "-")
        if name == "clear" and not args:
            clear = True
        elif name in ("spend", "limit"):
            if off:
                changes["spend"] = None
            elif len(args) in (1, 2) and args[0].isdigit():
                changes["spend"] = int(args[0])
                if len(args) == 2:
                    changes["period"] = _period(args[1])
            else:
                raise InvalidLimits(f"Write the spend limit as 'spend 500 daily', not {part!r}.")
        elif name == "period" and len(args) == 1:
            changes["period"] = _period(args[0])
        elif name in ("rpm", "tpm") and len(args) == 1:
            if off:
                changes[name] = None
            elif args[0].isdigit() and int(args[0]) > 0:
                changes[name] = int(args[0])
            else:
                raise InvalidLimits(f"The {name} limit must be a positive whole number.")
        elif name == "models":
            changes["models"] = () if off else split_models(",".join(args))
        elif name == "expires" and len(args) == 1:
            changes["expires_at"] = None if off else parse_time(args[0])
        else:
            raise InvalidLimits(f"Not understood: {part.strip()!r}.")
    return clear, changes


def _period(word: str) -> str:
    period = word.lower()
    if period not in PERIODS:
        raise InvalidLimits(f"The period must be one of {', '.join(PERIODS)}, not {word!r}.")
    return period


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """An ISO date or time (UTC unless it names a zone), or `30d` from now."""
    if re.fullmatch(r"\d+d", text):
        return (now or datetime.now(UTC)) + timedelta(days=int(text[:-1]))
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidLimits(
            f"Write the expiry as 2027-01-31 or 2027-01-31T12:00, not {text!r}."
        ) from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def applied(limits: Limits, *, clear: bool, changes: dict[str, Any]) -> Limits:
    """`limits` with `changes` made (after clearing every limit, with `clear`)."""
    return replace(Limits() if clear else limits, **changes)


def new_row(*, account_id: int, defaults: KeyDefaults | None, now: datetime) -> KeyLimit:
    """The row of a newly issued key, with the operator's defaults (`KEY_DEFAULT_LIMITS`)."""
    row = KeyLimit(account_id=account_id, period_start=EPOCH, updated_at=now)
    if defaults is not None:
        limits = defaults.for_key(now)
        _write_limits(row, limits)
        row.period_start = period_start(limits.period, now)
    return row


def _write_limits(row: KeyLimit, limits: Limits) -> None:
    row.spend_limit = limits.spend
    row.period = limits.period
    row.expires_at = limits.expires_at
    row.models = ",".join(limits.models) or None
    row.rpm = limits.rpm
    row.tpm = limits.tpm


def set_limits(
    *,
    session: Session,
    account_id: int,
    key_id: int,
    clear: bool = False,
    changes: dict[str, Any],
    now: datetime,
) -> KeyReport:
    """Change one live key's limits. A new period (or a new spend limit) counts this period's
    spend from the ledger, so a limit set at noon includes the morning; alerts start over."""
    lock_accounts(session, [account_id])
    key = session.get(ApiKey, key_id)
    if key is None or key.account_id != account_id or key.revoked_at is not None:
        raise KeyNotFound("No such live key.")
    row = session.get(KeyLimit, key.limit_id) if key.limit_id is not None else None
    if row is None:  # a key from before limits existed
        row = new_row(account_id=account_id, defaults=None, now=now)
        session.add(row)
        session.flush()
        key.limit_id = row.id
        session.add(key)
    before = limits_of(row)
    after = applied(before, clear=clear, changes=changes)
    _write_limits(row, after)
    if after.period != before.period or after.spend != before.spend:
        start = period_start(after.period, now)
        assert row.id is not None
        row.spent = (
            row.spent_total if after.period == "total" else _spent_since(session, row.id, start)
        )
        row.period_start = start
        row.alert_level, row.alert_period = 0, None
    if after.expires_at != before.expires_at:
        row.expiry_alerted_for = None
    row.updated_at = now
    session.add(row)
    session.flush()
    return describe_row(key_id, row, now)


def _spent_since(session: Session, limit_id: int, start: datetime) -> int:
    """What the row's holds placed since `start` were billed: a period's spend, from the books."""
    return int(
        session.execute(
            sa_select(func.coalesce(func.sum(Hold.used), 0)).where(
                col(Hold.key_limit_id) == limit_id,
                col(Hold.state) == "settled",
                col(Hold.created_at) >= start,
            )
        ).scalar_one()
    )


def report(*, session: Session, key_id: int, now: datetime) -> KeyReport | None:
    """A key's limits and spend this period; None for a key without a row."""
    row = session.execute(
        sa_select(KeyLimit)
        .join(ApiKey, col(ApiKey.limit_id) == KeyLimit.id)
        .where(col(ApiKey.id) == key_id)
    ).scalar_one_or_none()
    return None if row is None else describe_row(key_id, row, now)


def reports(*, session: Session, account_id: int, now: datetime) -> list[tuple[ApiKey, KeyReport]]:
    """Every live key of the account with its limits, oldest first."""
    rows = session.execute(
        sa_select(ApiKey, KeyLimit)
        .join(KeyLimit, col(ApiKey.limit_id) == KeyLimit.id)
        .where(col(ApiKey.account_id) == account_id, col(ApiKey.revoked_at).is_(None))
        .order_by(col(ApiKey.id))
    ).all()
    return [(key, describe_row(key.id or 0, row, now)) for key, row in rows]


def describe_row(key_id: int, row: KeyLimit, now: datetime) -> KeyReport:
    """Where the key of `row` stands at `now` (a period that has ended counts as 0 spent)."""
    assert row.id is not None
    start = period_start(row.period, now)
    current = row.period_start is not None and row.period_start >= start
    return KeyReport(
        key_id=key_id,
        limit_id=row.id,
        limits=limits_of(row),
        spent=row.spent if current or row.period == "total" else 0,
        held=row.held,
        spent_total=row.spent_total,
        period_start=None if row.period == "total" else start,
        resets_at=resets_at(row.period, now),
    )


# Holds: called by `ledger.hold` and `ledger._resolve` inside their transactions.

_ROW_OF_KEY = (
    sa_select(
        col(KeyLimit.id),
        col(KeyLimit.account_id),
        col(KeyLimit.spend_limit),
        col(KeyLimit.period),
        col(KeyLimit.period_start),
        col(KeyLimit.spent),
        col(KeyLimit.held),
        col(KeyLimit.expires_at),
        col(KeyLimit.models),
        col(KeyLimit.rpm),
        col(KeyLimit.tpm),
        col(KeyLimit.window_start),
        col(KeyLimit.window_requests),
        col(KeyLimit.window_tokens),
    )
    .join(ApiKey, col(ApiKey.limit_id) == KeyLimit.id)
    .where(col(ApiKey.id) == bindparam("key_id"))
)

_TAKE = (
    update(KeyLimit)
    .where(
        col(KeyLimit.id) == bindparam("limit_id"),
        col(KeyLimit.held) == bindparam("seen_held"),
        col(KeyLimit.spent) == bindparam("seen_spent"),
        col(KeyLimit.window_requests) == bindparam("seen_requests"),
        col(KeyLimit.window_tokens) == bindparam("seen_tokens"),
        # the guard: never more reserved and spent than the limit, whatever was read
        (col(KeyLimit.spend_limit).is_(None))
        | (
            bindparam("spent", type_=BigInteger)
            + col(KeyLimit.held)
            + bindparam("tokens", type_=BigInteger)
            <= KeyLimit.spend_limit
        ),
    )
    .values(
        held=KeyLimit.held + bindparam("tokens"),
        spent=bindparam("spent"),
        period_start=bindparam("period_start"),
        window_start=bindparam("window_start"),
        window_requests=bindparam("window_requests"),
        window_tokens=bindparam("window_tokens"),
    )
)

_RESOLVE = (
    update(KeyLimit)
    .where(col(KeyLimit.id) == bindparam("limit_id"))
    .values(
        held=KeyLimit.held - bindparam("amount"),
        spent_total=KeyLimit.spent_total + bindparam("charge"),
        # a hold placed in an earlier period counts in that one, which has ended
        spent=case(
            (
                col(KeyLimit.period_start).is_(None)
                | (col(KeyLimit.period_start) <= bindparam("created_at")),
                KeyLimit.spent + bindparam("charge"),
            ),
            else_=KeyLimit.spent,
        ),
        # what the hold did not use is given back to the minute it was counted in
        window_tokens=case(
            (
                (col(KeyLimit.window_start) <= bindparam("created_at"))
                & (col(KeyLimit.window_tokens) > bindparam("unused")),
                KeyLimit.window_tokens - bindparam("unused"),
            ),
            (col(KeyLimit.window_start) <= bindparam("created_at"), 0),
            else_=KeyLimit.window_tokens,
        ),
    )
)


def room(
    *,
    session: Session,
    key_id: int,
    account_id: int,
    model: str | None,
    min_tokens: int,
    max_tokens: int,
    now: datetime,
    account_locked: bool = False,
) -> Room | None:
    """What the key lets this hold reserve, or its refusal (KeyExpired, ModelNotAllowed,
    KeyRateLimited, KeyLimitReached); None for a key without limits' row. Read under the
    account's row lock, which every writer of the row takes first (`account_locked`: the caller
    took it already, as group commit does for its batch)."""
    if not account_locked:
        # Its own statement: a SELECT ... FOR UPDATE OF account joined to the key's row would
        # wait for the lock, then return the key's row as it was before the wait (PostgreSQL
        # re-reads only the rows it locks), and `take` would find it changed.
        lock_accounts(session, [account_id])
    row = session.connection().execute(_ROW_OF_KEY, {"key_id": key_id}).one_or_none()
    if row is None:
        return None
    (
        limit_id,
        owner,
        spend_limit,
        period,
        started,
        spent,
        held,
        expires_at,
        models,
        rpm,
        tpm,
        window_start,
        window_requests,
        window_tokens,
    ) = row
    check_expiry(expires_at, now)
    if model is not None:
        check_model(split_models(models), model)
    seen = (held, spent, window_requests, window_tokens)
    start = period_start(period, now)
    if started is None or started < start:
        spent = 0  # a new period
    if window_start is None or now >= window_start + RATE_WINDOW:
        window_start, window_requests, window_tokens = now, 0, 0
    else:
        retry_after = max(1, math.ceil((window_start + RATE_WINDOW - now).total_seconds()))
        if rpm is not None and window_requests >= rpm:
            raise KeyRateLimited(kind="requests", limit=rpm, retry_after=retry_after)
        if tpm is not None and window_tokens + min_tokens > tpm:
            raise KeyRateLimited(kind="tokens", limit=tpm, retry_after=retry_after)
    most = max_tokens
    if spend_limit is not None:
        most = min(max_tokens, spend_limit - spent - held)
        if most < min_tokens:
            raise KeyLimitReached(
                limit=spend_limit,
                period=period,
                spent=spent + held,
                needed=min_tokens,
                resets_at=resets_at(period, now),
            )
    assert limit_id is not None  # a primary key
    return Room(
        limit_id=limit_id,
        account_id=owner,
        most=most,
        spent=spent,
        period_start=start,
        window_start=window_start,
        window_requests=window_requests,
        window_tokens=window_tokens,
        seen=seen,
    )


def take(*, session: Session, room: Room, tokens: int) -> None:
    """Reserve `tokens` (at most `room.most`) from the key's row and count the request."""
    held, spent, requests, counted = room.seen
    taken = session.connection().execute(
        _TAKE,
        {
            "limit_id": room.limit_id,
            "seen_held": held,
            "seen_spent": spent,
            "seen_requests": requests,
            "seen_tokens": counted,
            "spent": room.spent,
            "tokens": tokens,
            "period_start": room.period_start,
            "window_start": room.window_start,
            "window_requests": room.window_requests + 1,
            "window_tokens": room.window_tokens + tokens,
        },
    )
    if taken.rowcount != 1:  # the account's lock makes this impossible; refuse rather than pass
        raise RuntimeError(f"key limit {room.limit_id} changed while its account was locked")


def resolved(
    *,
    session: Session,
    limit_id: int,
    amount: int,
    charge: int,
    created_at: datetime,
) -> None:
    """A hold of the key resolved: its `amount` is no longer held and `charge` was billed."""
    session.connection().execute(
        _RESOLVE,
        {
            "limit_id": limit_id,
            "amount": amount,
            "charge": charge,
            "created_at": created_at,
            "unused": amount - charge,
        },
    )


# The audit: each row's sums against the holds and the ledger.


def audit(*, session: Session) -> list[str]:
    """Every key limit row whose `held` is not its open holds', whose `spent_total` is not what
    the ledger billed its holds, or whose period spend exceeds that total."""
    open_holds = (
        sa_select(col(Hold.key_limit_id), func.sum(Hold.amount).label("total"))
        .where(col(Hold.state) == "held", col(Hold.key_limit_id).is_not(None))
        .group_by(col(Hold.key_limit_id))
        .subquery()
    )
    billed = (
        sa_select(col(Hold.key_limit_id), func.sum(-col(LedgerEntry.amount)).label("total"))
        .select_from(LedgerEntry)
        .join(Hold, col(Hold.id) == LedgerEntry.request_id)
        .where(col(LedgerEntry.kind) == "usage", col(Hold.key_limit_id).is_not(None))
        .group_by(col(Hold.key_limit_id))
        .subquery()
    )
    rows = session.execute(
        sa_select(
            col(KeyLimit.id),
            col(KeyLimit.held),
            col(KeyLimit.spent),
            col(KeyLimit.spent_total),
            func.coalesce(open_holds.c.total, 0),
            func.coalesce(billed.c.total, 0),
        )
        .outerjoin(open_holds, open_holds.c.key_limit_id == KeyLimit.id)
        .outerjoin(billed, billed.c.key_limit_id == KeyLimit.id)
        .order_by(col(KeyLimit.id))
    ).all()
    problems: list[str] = []
    for limit_id, held, spent, spent_total, holds_total, billed_total in rows:
        if held != holds_total:
            problems.append(f"key limit {limit_id}: held {held} != open holds {holds_total}")
        if spent_total != billed_total:
            problems.append(
                f"key limit {limit_id}: spent {spent_total} in all != ledger {billed_total}"
            )
        if spent > spent_total:
            problems.append(
                f"key limit {limit_id}: spent {spent} this period > {spent_total} in all"
            )
    return problems
