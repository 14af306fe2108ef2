"""Stress: three API processes, twelve clients on four accounts, every client sending each request
to the next replica, so each account is settled by all three processes at once, in group-commit
batches that mix accounts. No deadlock (PostgreSQL's own count), no 5xx, and every account's
ledger usage equals, to the token, what its clients were told they used.

20 s here; `bench/replicas.py --stress 60` runs the same driver for the full minute."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from bench.replicas import billed, stress
from billing import ledger
from billing.db import reading
from tests.api.replicas import audit_cli, deadlocks, replicas
from tests.factories import make_account, make_key

SECONDS = 20
ACCOUNTS = 4

pytestmark = pytest.mark.slow  # three model-serving processes for 20 s


def test_replicas_settling_the_same_accounts_never_deadlock_and_bill_every_token(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    accounts = []
    with Session(engine, expire_on_commit=False) as writer:
        for _ in range(ACCOUNTS):
            account = make_account(writer, tokens=50_000_000)
            assert account.id is not None
            accounts.append((account.id, make_key(writer, account, secret_key=secret_key)))
    before = deadlocks(engine)

    with replicas(database_url, tmp_path) as servers:
        result = asyncio.run(stress(servers, accounts, seconds=SECONDS))  # type: ignore[arg-type]

    assert deadlocks(engine) == before  # None == None on SQLite: one writer at a time
    assert set(result.statuses) == {200}, result.errors[:5]
    assert result.statuses[200] > 12 * 3  # every client was served, many times over
    books = billed(database_url)
    for account_id, _ in accounts:
        assert result.told[account_id] > 0
        assert books[account_id] == result.told[account_id]
    with Session(reading(engine)) as session:
        assert ledger.audit(session=session) == []
    audit = audit_cli(database_url, tmp_path)
    assert audit.returncode == 0 and "audit: ok" in audit.stdout, audit.stdout + audit.stderr
