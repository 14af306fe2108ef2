"""Idempotency keys for non-streaming completions (Stripe's pattern).

The first request with a key claims it (a unique row per account and key); its answer is stored
when it ends. A retry with the same key and body gets the stored answer and is not billed again;
a different body is a client bug (400); a retry while the first is still running gets 409.
A first attempt that fails gives the key up, so the client can simply retry.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing.errors import IdempotencyConflict, IdempotencyMismatch
from billing.models import IdempotentRequest

MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class StoredAnswer:
    status_code: int
    body: str


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def claim(*, session: Session, account_id: int, key: str, digest: str) -> StoredAnswer | None:
    """Claim `key` for a new request (None), or return the answer of the finished first one."""
    try:
        with session.begin_nested():
            session.add(IdempotentRequest(account_id=account_id, key=key, body_hash=digest))
        return None
    except IntegrityError:
        pass
    row = session.exec(
        select(IdempotentRequest).where(
            col(IdempotentRequest.account_id) == account_id, col(IdempotentRequest.key) == key
        )
    ).first()
    if row is None:  # the first attempt failed and gave the key up meanwhile
        return claim(session=session, account_id=account_id, key=key, digest=digest)
    if row.body_hash != digest:
        raise IdempotencyMismatch()
    if row.status_code is None or row.response is None:
        raise IdempotencyConflict()
    return StoredAnswer(row.status_code, row.response)


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
