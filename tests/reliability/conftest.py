"""The API's live-server fixtures, shared with the reliability tests, and helpers to read the
books while the server writes them."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlmodel import Session

from billing import ledger
from billing.db import reading
from billing.models import Hold
from tests.api.conftest import (  # noqa: F401  (fixtures)
    api_key,
    api_settings,
    make_client,
    make_funded_key,
    server,
    start_server,
)


def poll(check: Callable[[], bool], *, within: float, what: str, every: float = 0.02) -> float:
    """Wait until `check()` holds, at most `within` seconds; returns the seconds it took."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > within:
            raise AssertionError(f"{what}: not within {within} s")
        time.sleep(every)
    return time.monotonic() - started


def hold_state(engine: Engine, hold_id: str) -> Hold | None:
    with Session(reading(engine), expire_on_commit=False) as session:
        return session.get(Hold, hold_id)


def audit(engine: Engine) -> list[str]:
    with Session(reading(engine)) as session:
        return ledger.audit(session=session)


def balance(engine: Engine, account_id: int) -> ledger.Balance:
    with Session(reading(engine)) as session:
        return ledger.get_balance(session=session, account_id=account_id)
