"""Idempotency keys for non-streaming completions (Stripe's pattern).

The first request with a key claims it (a unique row per account and key); its answer is stored
when it ends. A retry with the same key and body gets the stored answer and is not billed again;
a different body is a client bug (400); a retry while the first is still running gets 409.
A first attempt that fails gives the key up, so the client can simply retry.

A claim names the process lease (`billing.leases`) of the process running the first attempt. If
that process died, the claim is taken over by the retry that finds it (a live process, any
replica) instead of answering 409 forever; the dead attempt's hold is billed at its last
checkpoint by the sweep, as every crashed request is. Records are deleted after a retention
period (`IDEMPOTENCY_RETENTION_HOURS`, 24 as Stripe keeps them) by the sweep.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing.errors import IdempotencyConflict, IdempotencyMismatch
from billing.locks import db_now
from billing.models import ApiProcess, IdempotentRequest

MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class StoredAnswer:
    status_code: int
    body: str


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def claim(
    *, session: Session, account_id: int, key: str, digest: str, owner: str | None = None
) -> StoredAnswer | None:
    """Claim `key` for a new request (None), or return the answer of the finished first one.
    `owner` is the claiming process's lease id; a claim whose owner's lease has lapsed is
    taken over."""
    try:
        with session.begin_nested():
            session.add(
                IdempotentRequest(account_id=account_id, key=key, body_hash=digest, owner=owner)
            )
        return None
    except IntegrityError:
        pass
    row = session.exec(
        select(IdempotentRequest).where(
            col(IdempotentRequest.account_id) == account_id, col(IdempotentRequest.key) == key
        )
    ).first()
    if row is None:  # the first attempt failed and gave the key up meanwhile
        return claim(session=session, account_id=account_id, key=key, digest=digest, owner=owner)
    if row.body_hash != digest:
        raise IdempotencyMismatch()
    if row.status_code is None or row.response is None:
        if owner is not None and _owner_gone(session, row.owner):
            taken = session.execute(
                update(IdempotentRequest)
                .where(
                    col(IdempotentRequest.id) == row.id,
                    col(IdempotentRequest.status_code).is_(None),
                    col(IdempotentRequest.owner) == row.owner,
                )
                .values(owner=owner)
            )
            if taken.rowcount == 1:  # type: ignore[attr-defined]
                return None
        raise IdempotencyConflict()
    return StoredAnswer(row.status_code, row.response)


def _owner_gone(session: Session, owner: str | None) -> bool:
    """The claim's process lease lapsed or ended (or was forgotten). A claim without an owner
    (made before leases, or outside an API process) is never taken over."""
    if owner is None:
        return False
    expires_at = session.exec(
        select(ApiProcess.expires_at).where(col(ApiProcess.id) == owner)
    ).first()
    return expires_at is None or expires_at < db_now(session)


def forget_older_than(*, session: Session, before: datetime) -> int:
    """Delete the records made before `before` (the retention period has passed)."""
    deleted = session.execute(
        delete(IdempotentRequest).where(col(IdempotentRequest.created_at) < before)
    )
    return int(deleted.rowcount)  # type: ignore[attr-defined]


def store(*, session: Session, account_id: int, key: str, status_code: int, body: str) -> None:
    session.execute(
        update(IdempotentRequest)
        .where(col(IdempotentRequest.account_id) == account_id, col(IdempotentRequest.key) == key)
        .values(status_code=status_code, response=body)
    )


def give_up(*, session: Session, account_id: int, key: str) -> None:
    session.execute(
        delete(IdempotentRequest).where(
            col(IdempotentRequest.account_id) == account_id,
            col(IdempotentRequest.key) == key,
            col(IdempotentRequest.status_code).is_(None),
        )
    )
