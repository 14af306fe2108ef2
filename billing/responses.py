"""Stored Responses API answers: kept per account, read back and deleted only by their owner.

A row holds the whole conversation up to its answer (earlier turns' items included), so
continuing from it is one read, on whichever replica takes the next request. Another
account's id reads as absent, exactly like an id that never existed.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlmodel import Session, col, select

from billing.models import StoredResponse


def save(
    *, session: Session, account_id: int, response_id: str, conversation: str, response: str
) -> None:
    session.add(
        StoredResponse(
            id=response_id, account_id=account_id, conversation=conversation, response=response
        )
    )


def find(*, session: Session, account_id: int, response_id: str) -> StoredResponse | None:
    return session.exec(
        select(StoredResponse).where(
            col(StoredResponse.id) == response_id, col(StoredResponse.account_id) == account_id
        )
    ).first()


def remove(*, session: Session, account_id: int, response_id: str) -> bool:
    """Delete the account's response; False if it has none by that id."""
    deleted = session.execute(
        delete(StoredResponse).where(
            col(StoredResponse.id) == response_id, col(StoredResponse.account_id) == account_id
        )
    )
    return bool(deleted.rowcount)  # type: ignore[attr-defined]


def forget_older_than(*, session: Session, before: datetime) -> int:
    """Delete the responses stored before `before` (the retention period has passed)."""
    deleted = session.execute(delete(StoredResponse).where(col(StoredResponse.created_at) < before))
    return int(deleted.rowcount)  # type: ignore[attr-defined]
