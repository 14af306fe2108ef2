"""Process leases: each API process says it is alive, and the others act when it stops saying so.

A process starts a lease (`start`), renews it every few seconds (`renew`), and ends it when it
exits (`end`). Its holds and idempotency claims carry the lease id. A lease whose `expires_at`
(the database's clock) has passed belongs to a process that died or lost the database; the
next sweep (`sweep`) ends it for good (a late heartbeat cannot revive it: that process starts a
new lease) and resolves its holds at their last checkpoint. A process started again under the
same name ends its previous incarnation's lease at once, so it frees that one's holds before
it serves instead of waiting for the lease to lapse.

The sweep also deletes what has served its time: idempotency records past their retention and
ended leases with nothing left open. One process sweeps at a time (an advisory lock); the others
skip their turn, and a sweep skips accounts another transaction holds rather than wait.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, exists, update
from sqlmodel import Session, col

from billing import idempotency, ledger
from billing.locks import SWEEP, db_now, lock_for_transaction, try_lock_for_transaction
from billing.models import ApiProcess, Hold

FORGET_ENDED_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class SweepReport:
    holds_resolved: int
    leases_ended: int
    idempotency_deleted: int


def start(*, session: Session, name: str, lease: timedelta) -> str:
    """Start a lease for a new incarnation of process `name`; its id. Earlier incarnations of the
    same name are ended: the caller sweeps next, which resolves what they left open."""
    now = db_now(session)
    session.execute(
        update(ApiProcess)
        .where(col(ApiProcess.name) == name, col(ApiProcess.stopped_at).is_(None))
        .values(stopped_at=now, expires_at=now)
    )
    process_id = secrets.token_hex(16)
    session.add(
        ApiProcess(
            id=process_id, name=name, started_at=now, heartbeat_at=now, expires_at=now + lease
        )
    )
    session.flush()
    return process_id


def renew(*, session: Session, process_id: str, lease: timedelta) -> bool:
    """Push the lease out; False if it was ended (a sweep found it lapsed): start a new one."""
    now = db_now(session)
    renewed = session.execute(
        update(ApiProcess)
        .where(col(ApiProcess.id) == process_id, col(ApiProcess.stopped_at).is_(None))
        .values(heartbeat_at=now, expires_at=now + lease)
    )
    return renewed.rowcount == 1  # type: ignore[attr-defined]


def end(*, session: Session, process_id: str) -> None:
    """End the lease at a clean exit; the sweep that follows resolves anything it left open."""
    now = db_now(session)
    session.execute(
        update(ApiProcess)
        .where(col(ApiProcess.id) == process_id, col(ApiProcess.stopped_at).is_(None))
        .values(stopped_at=now, expires_at=now)
    )


def sweep(
    *, session: Session, idempotency_retention: timedelta, wait: bool = False
) -> SweepReport | None:
    """Resolve the holds of processes that are gone and delete expired records; None if another
    process is sweeping now. With `wait` (start-up, shutdown) it waits for that process and for
    busy accounts instead of skipping them."""
    if wait:
        lock_for_transaction(session, SWEEP)
    elif not try_lock_for_transaction(session, SWEEP):
        return None
    now = db_now(session)
    ended = session.execute(
        update(ApiProcess)
        .where(col(ApiProcess.expires_at) < now, col(ApiProcess.stopped_at).is_(None))
        .values(stopped_at=now)
    ).rowcount  # type: ignore[attr-defined]
    resolved = ledger.release_stale_holds(session=session, now=now, skip_locked=not wait)
    deleted = idempotency.forget_older_than(session=session, before=now - idempotency_retention)
    open_holds = exists().where(col(Hold.owner) == ApiProcess.id, col(Hold.state) == "held")
    session.execute(
        delete(ApiProcess).where(col(ApiProcess.stopped_at) < now - FORGET_ENDED_AFTER, ~open_holds)
    )
    return SweepReport(holds_resolved=resolved, leases_ended=ended, idempotency_deleted=deleted)
