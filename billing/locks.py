"""How processes sharing one database coordinate: its clock, advisory locks, one lock order.

- **One clock.** Leases, hold expiries and sweeps compare times taken from the database
  (`now()`, the transaction's start on PostgreSQL), so replicas on hosts whose clocks drift
  apart still agree on what has expired.
- **Advisory locks** make a job run in one process at a time (the sweep, the bot's jobs). A
  transaction-level lock ends with its transaction; a session-level one is held on a
  connection of its own for as long as a job runs.
- **One lock order.** A transaction that writes for several accounts locks all of their rows
  first, in ascending id, in one statement (`lock_accounts`); every row a write touches after
  that (a hold, a ledger entry, an idempotency record) belongs to an account it already holds.
  Two transactions can then never wait for each other in a circle: PostgreSQL counted 44
  deadlocks in 45 s of two replicas batching the same accounts in arrival order.

SQLite has one writer at a time (`BEGIN IMMEDIATE`, `billing.db`), so there the locks are
no-ops and the clock is this process's: it serves one process, where they would change nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from billing.models import Account, utcnow

SWEEP = "tokenshop.sweep"

_NOW = text("SELECT now()")
_TRY_XACT_LOCK = text("SELECT pg_try_advisory_xact_lock(:key)")
_XACT_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
_UNLOCK = text("SELECT pg_advisory_unlock(:key)")
_LOCK_ACCOUNTS = (
    sa_select(col(Account.id))
    .where(col(Account.id).in_(bindparam("ids", expanding=True)))
    .order_by(col(Account.id))
    .with_for_update()
)
_LOCK_ACCOUNTS_SKIPPING = (
    sa_select(col(Account.id))
    .where(col(Account.id).in_(bindparam("ids", expanding=True)))
    .order_by(col(Account.id))
    .with_for_update(skip_locked=True)
)


def _postgres(connection: Connection) -> bool:
    return connection.dialect.name == "postgresql"


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for `name`."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def db_now(session: Session) -> datetime:
    """The database's time (its transaction's start on PostgreSQL), as an aware datetime."""
    connection = session.connection()
    if _postgres(connection):
        return connection.execute(_NOW).scalar_one()
    return utcnow()


def try_lock_for_transaction(session: Session, name: str) -> bool:
    """Take `name`'s advisory lock until this transaction ends; False if another holds it."""
    connection = session.connection()
    if not _postgres(connection):
        return True
    return bool(connection.execute(_TRY_XACT_LOCK, {"key": lock_key(name)}).scalar_one())


def lock_for_transaction(session: Session, name: str) -> None:
    """Wait for `name`'s advisory lock and hold it until this transaction ends."""
    connection = session.connection()
    if _postgres(connection):
        connection.execute(_XACT_LOCK, {"key": lock_key(name)})


@contextmanager
def single_runner(engine: Engine, name: str) -> Iterator[bool]:
    """Yield True while this process alone runs the job `name`, False if another runs it.

    The lock lives on a connection of its own, outside any transaction, for as long as the job
    runs, and ends with that connection if the process dies. It needs a session-level
    connection: through PgBouncer in transaction mode, connect the bot directly."""
    if engine.dialect.name != "postgresql":
        yield True
        return
    key = lock_key(name)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        held = bool(connection.execute(_TRY_LOCK, {"key": key}).scalar_one())
        try:
            yield held
        finally:
            if held:
                connection.execute(_UNLOCK, {"key": key})


def lock_accounts(
    session: Session, account_ids: Iterable[int], *, skip_locked: bool = False
) -> list[int]:
    """Lock these accounts' rows in ascending id, in one statement; the ids locked.

    With `skip_locked`, rows another transaction holds are left out instead of waited for
    (sweeps: what is busy now is swept next time)."""
    ids = sorted(set(account_ids))
    if not ids:
        return []
    connection = session.connection()
    if not _postgres(connection):
        return ids
    statement = _LOCK_ACCOUNTS_SKIPPING if skip_locked else _LOCK_ACCOUNTS
    return [int(row[0] or 0) for row in connection.execute(statement, {"ids": ids})]
