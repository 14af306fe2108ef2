"""Writes that arrive together share a commit, and still succeed or fail one by one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, event
from sqlmodel import Session

from billing import ledger
from billing.errors import InsufficientBalance
from billing.group_commit import GroupCommit
from tests.factories import make_account

pytestmark = pytest.mark.anyio

TTL = timedelta(minutes=5)


@pytest.fixture
def commits(engine: Engine) -> Iterator[list[None]]:
    """One entry per transaction the database committed."""
    seen: list[None] = []

    def count(_connection: object) -> None:
        seen.append(None)

    event.listen(engine, "commit", count)
    yield seen
    event.remove(engine, "commit", count)


def hold(account_id: int, request_id: str, tokens: int) -> Callable[[Session], str]:
    def work(session: Session) -> str:
        return ledger.hold(
            session=session,
            account_id=account_id,
            request_id=request_id,
            min_tokens=tokens,
            max_tokens=tokens,
            ttl=TTL,
        ).id

    return work


def settle(hold_id: str, cost: int) -> Callable[[Session], object]:
    return lambda session: ledger.settle(session=session, hold_id=hold_id, cost=cost)


class Gate:
    """A write that keeps its batch's transaction open until `open()`, so the writes queued
    meanwhile are known to form the next batch together."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()

    def __call__(self, _session: Session) -> None:
        self.entered.set()
        self._released.wait(timeout=30)

    def open(self) -> None:
        self._released.set()


async def behind_gate(writes: GroupCommit, *works: Callable[[Session], object]) -> list:
    """Run `works` as one batch (behind a gate); their results or errors, in order."""
    gate = Gate()
    first = asyncio.create_task(writes.run(gate))
    await asyncio.to_thread(gate.entered.wait, 30)
    tasks = [asyncio.create_task(writes.run(work)) for work in works]
    await asyncio.sleep(0)
    gate.open()
    await first
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_eight_settlements_finishing_together_share_commits(engine, session, commits):
    account = make_account(session, tokens=10_000)
    writes = GroupCommit(engine)
    holds = await asyncio.gather(*(writes.run(hold(account.id, f"req-{n}", 100)) for n in range(8)))
    commits.clear()

    await asyncio.gather(*(writes.run(settle(hold_id, cost=40)) for hold_id in holds))

    assert len(commits) < 8, "each settlement committed on its own"
    session.commit()  # end the test's read snapshot
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.held) == (10_000 - 8 * 40, 0)
    assert ledger.audit(session=session) == []


async def test_a_refused_hold_does_not_undo_the_batch_around_it(engine, session, commits):
    account = make_account(session, tokens=1_000)
    writes = GroupCommit(engine)
    commits.clear()

    first, refused, last = await behind_gate(
        writes,
        hold(account.id, "fits", 600),
        hold(account.id, "too-big", 600),  # only 400 left after the first
        hold(account.id, "fits-too", 400),
    )

    assert (first, last) == ("fits", "fits-too")
    assert isinstance(refused, InsufficientBalance)
    assert len(commits) == 1  # the three in one transaction (the gate wrote nothing)
    session.commit()
    assert ledger.get_balance(session=session, account_id=account.id).held == 1_000


async def test_a_write_that_fails_halfway_leaves_nothing_of_itself(engine, session):
    account = make_account(session, tokens=1_000)
    writes = GroupCommit(engine)

    def grant_then_fail(s: Session) -> None:
        ledger.grant(session=s, account_id=account.id, tokens=5_000)
        raise ValueError("failed after writing")

    failed, held = await behind_gate(
        writes, grant_then_fail, hold(account.id, "after-the-failure", 300)
    )

    assert isinstance(failed, ValueError)
    assert held == "after-the-failure"
    session.commit()
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.held) == (1_000, 300)
    assert ledger.audit(session=session) == []


async def test_a_failed_commit_fails_every_write_of_its_batch_and_lands_none(engine, session):
    """As when the disk fills or the connection drops at COMMIT: no caller is told its write
    landed, and none did; the next batch works again."""
    account = make_account(session, tokens=1_000)
    writes = GroupCommit(engine)
    commits = iter(["the gate's", "the batch's"])

    def fail_the_batch(s: Session) -> None:
        if not s.in_nested_transaction() and next(commits, None) == "the batch's":
            raise OSError("no space left on device")

    event.listen(Session, "before_commit", fail_the_batch)
    try:
        results = await behind_gate(writes, hold(account.id, "a", 100), hold(account.id, "b", 100))
    finally:
        event.remove(Session, "before_commit", fail_the_batch)

    assert [type(r) for r in results] == [OSError, OSError]
    session.commit()
    assert ledger.get_balance(session=session, account_id=account.id).held == 0
    assert await writes.run(hold(account.id, "a", 100)) == "a"


async def test_a_caller_cancelled_while_queued_writes_nothing(engine, session):
    account = make_account(session, tokens=1_000)
    writes = GroupCommit(engine)
    gate = Gate()
    first = asyncio.create_task(writes.run(gate))
    await asyncio.to_thread(gate.entered.wait, 30)
    gone = asyncio.create_task(writes.run(hold(account.id, "gone", 100)))
    stays = asyncio.create_task(writes.run(hold(account.id, "stays", 100)))
    await asyncio.sleep(0)
    gone.cancel()
    gate.open()
    await first

    assert await stays == "stays"
    with pytest.raises(asyncio.CancelledError):
        await gone
    session.commit()
    assert ledger.get_balance(session=session, account_id=account.id).held == 100


async def test_a_write_alone_runs_without_a_savepoint_and_fails_alone(engine, session):
    account = make_account(session, tokens=1_000)
    writes = GroupCommit(engine)
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement.split()[0].upper())

    def grant_then_fail(s: Session) -> None:
        ledger.grant(session=s, account_id=account.id, tokens=5_000)
        raise ValueError("failed after writing")

    event.listen(engine, "before_cursor_execute", record)
    try:
        assert await writes.run(hold(account.id, "alone", 300), accounts=(account.id,)) == "alone"
        with pytest.raises(ValueError):
            await writes.run(grant_then_fail, accounts=(account.id,))
    finally:
        event.remove(engine, "before_cursor_execute", record)

    assert "SAVEPOINT" not in statements
    session.commit()
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.held) == (1_000, 300)
    assert ledger.audit(session=session) == []


async def test_a_batch_skips_the_disk_flush_only_when_all_its_writes_may(engine, session):
    """SQLite: `durable=False` writes (holds) commit without waiting for the disk, unless a
    write that must (a settlement, a purchase) shares their batch."""
    if engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL flushes every commit")
    writes = GroupCommit(engine)

    def synchronous(s: Session) -> int:
        return int(s.connection().exec_driver_sql("PRAGMA synchronous").scalar_one())

    assert await writes.run(synchronous, durable=False) == 1  # NORMAL
    assert await writes.run(synchronous) == 2  # FULL

    async def batch(*durable: bool) -> list[int]:
        gate = Gate()
        first = asyncio.create_task(writes.run(gate))
        await asyncio.to_thread(gate.entered.wait, 30)
        tasks = [asyncio.create_task(writes.run(synchronous, durable=d)) for d in durable]
        await asyncio.sleep(0)
        gate.open()
        await first
        return await asyncio.gather(*tasks)

    assert await batch(False, False) == [1, 1]
    assert await batch(False, True) == [2, 2]
