"""The token ledger: credits, holds and their settlement, refunds, balances and the audit.

Holds are two-phase transfers (TigerBeetle's pending transfers). `hold` reserves tokens with one
guarded UPDATE (`WHERE balance - held >= :n AND open_holds < :slots`) whose row count decides, so
concurrent requests can never reserve more than the balance, nor one key run more requests at
once than its limit, on either database and across any number of API processes. A hold resolves
exactly once: every resolution is an UPDATE `WHERE state = 'held'`, and only the caller whose
UPDATE changed the row moves tokens and frees the slot. Every transaction that touches a hold
locks its account row first (accounts in ascending id, `billing.locks`), so two transactions
never wait on each other in opposite orders.

A hold belongs to the process lease (`billing.leases`) of the API process that placed it; when
that lease lapses, any live process's sweep resolves it at its last checkpoint, whatever its
expiry. Expiries and sweeps use the database's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, insert, or_, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from billing import key_limits
from billing.errors import InsufficientBalance, InvalidAmount, PurchaseNotFound, TooManyRequests
from billing.locks import db_now, lock_accounts
from billing.models import Account, ApiProcess, Hold, LedgerEntry, Purchase, utcnow

HOLD_ATTEMPTS = 8
UNLIMITED = 2**31 - 1  # requests in flight per account when the caller sets no limit
SWEEP_BATCH = 500  # holds resolved per sweep transaction; the rest wait for the next sweep

# The statements of every request's hold, checkpoint and settlement, built once and run on the
# session's connection: through the ORM, building each statement and its ORM bookkeeping took
# 70% of a settlement (8 settlements in one transaction, SQLite: 25.8 -> 7.9 ms). None of
# them updates loaded objects: nothing here reads the ORM's copies of these rows after.
_AVAILABLE = sa_select(col(Account.balance) - col(Account.held), col(Account.open_holds)).where(
    col(Account.id) == bindparam("account_id")
)
_LOCK_ACCOUNT = (
    sa_select(col(Account.id)).where(col(Account.id) == bindparam("account_id")).with_for_update()
)
_RESERVE = (
    update(Account)
    .where(
        col(Account.id) == bindparam("account_id"),
        col(Account.balance) - col(Account.held) >= bindparam("tokens"),
        col(Account.open_holds) < bindparam("slots"),
    )
    .values(held=Account.held + bindparam("tokens"), open_holds=Account.open_holds + 1)
)
_INSERT_HOLD = insert(Hold)
_CHECKPOINT = (
    update(Hold)
    .where(
        col(Hold.id) == bindparam("hold_id"),
        col(Hold.state) == "held",
        col(Hold.amount) >= bindparam("tokens"),
    )
    .values(used=bindparam("tokens"), expires_at=bindparam("expiry"))
)
_OPEN_HOLD = sa_select(
    col(Hold.account_id),
    col(Hold.amount),
    col(Hold.model),
    col(Hold.key_limit_id),
    col(Hold.created_at),
).where(col(Hold.id) == bindparam("hold_id"), col(Hold.state) == "held")
_RESOLVE_HOLD = (
    update(Hold)
    .where(col(Hold.id) == bindparam("hold_id"), col(Hold.state) == "held")
    .values(state=bindparam("to_state"), used=bindparam("charge"), resolved_at=bindparam("at"))
)
_SETTLE_ACCOUNT = (
    update(Account)
    .where(col(Account.id) == bindparam("account_id"))
    .values(
        held=Account.held - bindparam("amount"),
        balance=Account.balance - bindparam("charge"),
        open_holds=Account.open_holds - 1,
    )
)
_INSERT_ENTRY = insert(LedgerEntry).returning(col(LedgerEntry.id))


@dataclass(frozen=True)
class Balance:
    """What an account has, as shown by `GET /v1/key`, the bot and the CLI."""

    balance: int  # credited minus spent
    held: int  # reserved by requests in flight
    purchased: int
    granted: int
    used: int
    refunded: int

    @property
    def available(self) -> int:
        return self.balance - self.held


@dataclass(frozen=True)
class RefundResult:
    purchase: Purchase
    reversed_tokens: int
    shortfall: int  # tokens of the pack already spent, which stay spent
    newly_refunded: bool


def credit(
    *,
    session: Session,
    account_id: int,
    tokens: int,
    kind: str,
    purchase_id: int | None = None,
    note: str | None = None,
) -> LedgerEntry:
    """Add tokens to an account with their ledger entry (purchases and operator grants)."""
    if tokens <= 0:
        raise InvalidAmount(f"Token amounts must be positive, got {tokens}.")
    lock_account(session, account_id)
    session.execute(
        update(Account)
        .where(col(Account.id) == account_id)
        .values(balance=Account.balance + tokens)
    )
    entry = LedgerEntry(
        account_id=account_id, kind=kind, amount=tokens, purchase_id=purchase_id, note=note
    )
    session.add(entry)
    session.flush()
    return entry


def grant(
    *, session: Session, account_id: int, tokens: int, note: str | None = None
) -> LedgerEntry:
    """Tokens given by the operator (support, promotions, CLI-made accounts)."""
    return credit(session=session, account_id=account_id, tokens=tokens, kind="grant", note=note)


def hold(
    *,
    session: Session,
    account_id: int,
    request_id: str,
    min_tokens: int,
    max_tokens: int,
    ttl: timedelta,
    model: str | None = None,
    limit: int | None = None,
    owner: str | None = None,
    key_id: int | None = None,
    now: datetime | None = None,
    account_locked: bool = False,
) -> Hold:
    """Reserve `min(available, max_tokens)` tokens, or raise InsufficientBalance below `min_tokens`,
    or TooManyRequests when the account already has `limit` holds open.

    The caller caps the generation to `hold.amount`, so a request can never cost more than
    it reserved. `owner` is the placing process's lease id; `key_id` the key that asked (its
    usage is that key's): its own limits (`billing.key_limits`) may refuse the hold or make it
    smaller, and the hold is reserved from them too. `now` is the clock the key's periods and
    minutes are counted by (the database's by default); expiries always use the database's.
    `account_locked`: the caller already holds the account's row lock (group commit's batch).
    """
    if min_tokens <= 0 or max_tokens < min_tokens:
        raise InvalidAmount(f"Bad hold bounds {min_tokens}..{max_tokens}.")
    session.flush()  # what the caller added goes first, as the ORM's autoflush would
    connection = session.connection()
    room = None
    if key_id is not None:
        now = now or db_now(session)  # one instant for the key's period, minute and the hold
        room = key_limits.room(
            session=session,
            key_id=key_id,
            account_id=account_id,
            model=model,
            min_tokens=min_tokens,
            max_tokens=max_tokens,
            now=now,
            account_locked=account_locked,
        )
        if room is not None:
            max_tokens = room.most
    slots = UNLIMITED if limit is None else limit
    available = 0
    for _ in range(HOLD_ATTEMPTS):
        available, in_flight = _available_and_in_flight(session, account_id)
        if in_flight >= slots:
            raise TooManyRequests(slots)
        if available < min_tokens:
            break
        amount = min(available, max_tokens)
        reserved = connection.execute(
            _RESERVE, {"account_id": account_id, "tokens": amount, "slots": slots}
        )
        if reserved.rowcount == 1:
            at = db_now(session)
            if room is not None:
                key_limits.take(session=session, room=room, tokens=amount)
            # a plain value, inserted by statement: the ORM's constructor took 80 us, as
            # long as the hold's statements together (nothing adds it to a session)
            row = Hold.model_construct(
                id=request_id,
                account_id=account_id,
                amount=amount,
                model=model,
                created_at=now or at,  # the clock of the key's periods: which one it counts in
                expires_at=at + ttl,
                owner=owner,
                key_id=key_id,
                key_limit_id=room.limit_id if room is not None else None,
            )
            connection.execute(_INSERT_HOLD, row.model_dump())
            return row
    raise InsufficientBalance(needed=min_tokens, available=max(available, 0))


def checkpoint(*, session: Session, hold_id: str, used: int, ttl: timedelta) -> bool:
    """Record usage so far and push the expiry out; a crash later bills `used`, not zero."""
    result = session.connection().execute(
        _CHECKPOINT, {"hold_id": hold_id, "tokens": used, "expiry": db_now(session) + ttl}
    )
    return result.rowcount == 1


def settle(
    *,
    session: Session,
    hold_id: str,
    cost: int,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
) -> LedgerEntry | None:
    """Charge `cost` (at most the hold) and release the rest; None if already resolved."""
    return _resolve(
        session=session,
        hold_id=hold_id,
        state="settled",
        cost=cost,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


def release(*, session: Session, hold_id: str) -> bool:
    """Give the whole hold back (nothing was generated); False if already resolved."""
    return _resolve(session=session, hold_id=hold_id, state="released", cost=0) is not None


def release_stale_holds(
    *,
    session: Session,
    now: datetime | None = None,
    skip_locked: bool = False,
    limit: int = SWEEP_BATCH,
) -> int:
    """Resolve the holds of processes that are gone: past their expiry, or owned by a lease that
    lapsed or ended. Each bills its last checkpoint and frees the rest.

    Their accounts are locked first, in ascending id; with `skip_locked` an account another
    transaction holds is left for the next sweep instead of waited for."""
    now = now or db_now(session)
    lapsed = sa_select(col(ApiProcess.id)).where(col(ApiProcess.expires_at) < now)
    stale = session.execute(
        sa_select(col(Hold.id), col(Hold.account_id), col(Hold.used))
        .where(
            col(Hold.state) == "held",
            or_(col(Hold.expires_at) < now, col(Hold.owner).in_(lapsed)),
        )
        .order_by(col(Hold.account_id), col(Hold.id))
        .limit(limit)
    ).all()
    locked = set(
        lock_accounts(session, (account for _, account, _ in stale), skip_locked=skip_locked)
    )
    resolved = 0
    for hold_id, account_id, used in stale:
        if account_id not in locked:
            continue
        state = "settled" if used > 0 else "released"
        if _resolve(session=session, hold_id=hold_id, state=state, cost=used) is not None:
            resolved += 1
    return resolved


def _resolve(
    *,
    session: Session,
    hold_id: str,
    state: str,
    cost: int,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
) -> LedgerEntry | None:
    session.flush()
    connection = session.connection()
    row = connection.execute(_OPEN_HOLD, {"hold_id": hold_id}).one_or_none()
    if row is None:
        return None
    account_id, amount, model, key_limit_id, created_at = row
    lock_account(session, account_id)
    charge = max(0, min(cost, amount))
    changed = connection.execute(
        _RESOLVE_HOLD,
        {"hold_id": hold_id, "to_state": state, "charge": charge, "at": db_now(session)},
    )
    if changed.rowcount != 1:
        return None  # another worker resolved it first
    connection.execute(
        _SETTLE_ACCOUNT, {"account_id": account_id, "amount": amount, "charge": charge}
    )
    if key_limit_id is not None:
        key_limits.resolved(
            session=session,
            limit_id=key_limit_id,
            amount=amount,
            charge=charge,
            created_at=created_at,
        )
    values = LedgerEntry.model_construct(  # plain values, as the hold's (`hold`)
        account_id=account_id,
        kind="usage",
        amount=-charge,
        request_id=hold_id,
        model=model,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        note=None if state == "settled" else "released",
    ).model_dump(exclude={"id"})
    entry_id = connection.execute(_INSERT_ENTRY, values).scalar_one()
    return LedgerEntry.model_construct(id=entry_id, **values)


def refund_purchase(*, session: Session, charge_id: str) -> RefundResult:
    """Reverse a purchase's tokens once; what was already spent stays spent (the shortfall)."""
    purchase = session.exec(
        select(Purchase).where(col(Purchase.telegram_payment_charge_id) == charge_id)
    ).first()
    if purchase is None:
        raise PurchaseNotFound(f"No purchase with charge id {charge_id!r}.")
    lock_account(session, purchase.account_id)
    marked = session.execute(
        update(Purchase)
        .where(col(Purchase.id) == purchase.id, col(Purchase.refunded_at).is_(None))
        .values(refunded_at=utcnow())
    )
    session.refresh(purchase)
    if marked.rowcount != 1:  # type: ignore[attr-defined]
        return RefundResult(purchase, purchase.refunded_tokens, purchase.refund_shortfall, False)
    reversible = max(0, min(purchase.tokens, _available(session, purchase.account_id)))
    shortfall = purchase.tokens - reversible
    session.execute(
        update(Account)
        .where(col(Account.id) == purchase.account_id)
        .values(balance=Account.balance - reversible)
    )
    purchase.refunded_tokens = reversible
    purchase.refund_shortfall = shortfall
    session.add(purchase)
    session.add(
        LedgerEntry(
            account_id=purchase.account_id,
            kind="refund",
            amount=-reversible,
            purchase_id=purchase.id,
            note=f"shortfall {shortfall}" if shortfall else None,
        )
    )
    session.flush()
    return RefundResult(purchase, reversible, shortfall, True)


def get_balance(*, session: Session, account_id: int) -> Balance:
    balance, held = session.execute(
        select(Account.balance, Account.held).where(col(Account.id) == account_id)
    ).one()
    sums = dict(
        session.execute(
            select(LedgerEntry.kind, func.coalesce(func.sum(LedgerEntry.amount), 0))
            .where(col(LedgerEntry.account_id) == account_id)
            .group_by(LedgerEntry.kind)
        ).all()
    )
    return Balance(
        balance=balance,
        held=held,
        purchased=int(sums.get("purchase", 0)),
        granted=int(sums.get("grant", 0)),
        used=-int(sums.get("usage", 0)),
        refunded=-int(sums.get("refund", 0)),
    )


def usage_history(*, session: Session, account_id: int, limit: int = 10) -> list[LedgerEntry]:
    """The latest settled requests, newest first."""
    return list(
        session.exec(
            select(LedgerEntry)
            .where(col(LedgerEntry.account_id) == account_id, col(LedgerEntry.kind) == "usage")
            .order_by(col(LedgerEntry.id).desc())
            .limit(limit)
        ).all()
    )


def audit(*, session: Session, now: datetime | None = None) -> list[str]:
    """Every inconsistency in the books, one line each; an empty list means they balance."""
    now = now or db_now(session)
    ledger_sum = (
        sa_select(col(LedgerEntry.account_id), func.sum(LedgerEntry.amount).label("total"))
        .group_by(col(LedgerEntry.account_id))
        .subquery()
    )
    live_holds = (
        sa_select(
            col(Hold.account_id),
            func.sum(Hold.amount).label("total"),
            func.count().label("count"),
        )
        .where(col(Hold.state) == "held")
        .group_by(col(Hold.account_id))
        .subquery()
    )
    rows = session.execute(
        sa_select(
            col(Account.id),
            col(Account.balance),
            col(Account.held),
            func.coalesce(ledger_sum.c.total, 0),
            func.coalesce(live_holds.c.total, 0),
            col(Account.open_holds),
            func.coalesce(live_holds.c.count, 0),
        )
        .outerjoin(ledger_sum, ledger_sum.c.account_id == Account.id)
        .outerjoin(live_holds, live_holds.c.account_id == Account.id)
        .order_by(col(Account.id))
    ).all()
    problems: list[str] = []
    for account_id, balance, held, ledger_total, holds_total, in_flight, holds_open in rows:
        if balance != ledger_total:
            problems.append(f"account {account_id}: balance {balance} != ledger sum {ledger_total}")
        if balance < 0:
            problems.append(f"account {account_id}: negative balance {balance}")
        if held != holds_total:
            problems.append(f"account {account_id}: held {held} != open holds {holds_total}")
        if held > balance:
            problems.append(f"account {account_id}: held {held} exceeds balance {balance}")
        if in_flight != holds_open:
            problems.append(
                f"account {account_id}: {in_flight} requests in flight != {holds_open} open holds"
            )
    expired = session.exec(
        select(Hold.id, Hold.account_id, Hold.expires_at).where(
            col(Hold.state) == "held", col(Hold.expires_at) < now
        )
    ).all()
    problems.extend(
        f"hold {hold_id} of account {account_id} expired at {expires_at:%Y-%m-%d %H:%M:%S} "
        "and is still open"
        for hold_id, account_id, expires_at in expired
    )
    problems.extend(key_limits.audit(session=session))
    return problems


def _available(session: Session, account_id: int) -> int:
    return _available_and_in_flight(session, account_id)[0]


def _available_and_in_flight(session: Session, account_id: int) -> tuple[int, int]:
    available, in_flight = (
        session.connection().execute(_AVAILABLE, {"account_id": account_id}).one()
    )
    return int(available), int(in_flight)


def lock_account(session: Session, account_id: int) -> None:
    """Take the account row's lock first (PostgreSQL; SQLite's BEGIN IMMEDIATE already did).

    Every writer locks the account before any row that refers to it: inserting such a row takes
    a key-share lock on the account, and taking the account's lock after that deadlocks against
    a writer doing the same in the other order."""
    session.connection().execute(_LOCK_ACCOUNT, {"account_id": account_id})
