"""Billing shared by several API processes: the key's limit of requests in flight is a
condition of the hold itself, a process's holds belong to its lease and are resolved when it
lapses (or when the process comes back under its name), a claim of a dead process is taken
over, old records are deleted, and one process sweeps at a time. Each step is its own
transaction, as each process's would be."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from billing import idempotency, leases, ledger
from billing.db import session_scope
from billing.errors import IdempotencyConflict, TooManyRequests
from billing.locks import SWEEP, lock_for_transaction
from billing.models import Hold, IdempotentRequest
from tests.conftest import TEST_DATABASE_URL
from tests.factories import make_account

T = TypeVar("T")
TTL = timedelta(minutes=5)
LONG = timedelta(minutes=5)  # a lease that stays alive for the test
LAPSED = timedelta(0)  # a lease that has lapsed by the next transaction
DAY = timedelta(hours=24)


def run(engine: Engine, work: Callable[[Session], T]) -> T:
    with session_scope(engine) as session:
        return work(session)


def funded(engine: Engine, tokens: int = 10_000) -> int:
    account = run(engine, lambda s: make_account(s, tokens=tokens))
    assert account.id is not None
    return account.id


def place(
    engine: Engine, account_id: int, request_id: str, *, owner: str | None, limit: int = 4
) -> Hold:
    return run(
        engine,
        lambda s: ledger.hold(
            session=s,
            account_id=account_id,
            request_id=request_id,
            min_tokens=10,
            max_tokens=100,
            ttl=TTL,
            limit=limit,
            owner=owner,
        ),
    )


def state(engine: Engine, hold_id: str) -> str:
    return run(engine, lambda s: s.get(Hold, hold_id).state)  # type: ignore[union-attr]


def sweep(engine: Engine) -> leases.SweepReport | None:
    return run(engine, lambda s: leases.sweep(session=s, idempotency_retention=DAY))


def test_a_key_gets_no_more_requests_in_flight_than_its_limit_until_one_resolves(engine):
    account = funded(engine)
    for n in range(3):
        place(engine, account, f"req-{n}", owner=None, limit=3)
    with pytest.raises(TooManyRequests):
        place(engine, account, "req-3", owner=None, limit=3)

    run(engine, lambda s: ledger.settle(session=s, hold_id="req-0", cost=40))
    place(engine, account, "req-3", owner=None, limit=3)  # the settlement freed a slot
    assert run(engine, lambda s: ledger.audit(session=s)) == []


def test_the_holds_of_a_process_whose_lease_lapsed_are_resolved_at_their_checkpoint(engine):
    account = funded(engine)
    dead = run(engine, lambda s: leases.start(session=s, name="web.1", lease=LAPSED))
    alive = run(engine, lambda s: leases.start(session=s, name="web.2", lease=LONG))
    place(engine, account, "of-the-dead", owner=dead)
    place(engine, account, "of-the-living", owner=alive)
    run(engine, lambda s: ledger.checkpoint(session=s, hold_id="of-the-dead", used=30, ttl=TTL))

    report = sweep(engine)  # long before either hold's expiry

    assert report is not None and report.holds_resolved == 1 and report.leases_ended == 1
    assert state(engine, "of-the-dead") == "settled"
    assert state(engine, "of-the-living") == "held"
    balance = run(engine, lambda s: ledger.get_balance(session=s, account_id=account))
    assert (balance.used, balance.held) == (30, 100)
    # the dead process's late heartbeat cannot revive its lease: it must start a new one
    assert not run(engine, lambda s: leases.renew(session=s, process_id=dead, lease=LONG))
    assert run(engine, lambda s: leases.renew(session=s, process_id=alive, lease=LONG))
    assert run(engine, lambda s: ledger.audit(session=s)) == []


def test_a_process_started_again_under_its_name_frees_its_previous_incarnations_holds(engine):
    account = funded(engine)
    before = run(engine, lambda s: leases.start(session=s, name="web.1", lease=LONG))
    place(engine, account, "killed", owner=before)
    assert sweep(engine) == leases.SweepReport(0, 0, 0)  # its lease is still good

    run(engine, lambda s: leases.start(session=s, name="web.1", lease=LONG))  # the restart
    report = sweep(engine)

    assert report is not None and report.holds_resolved == 1
    assert state(engine, "killed") == "released"  # nothing was checkpointed: nothing billed


def test_a_claim_whose_process_died_is_taken_over_and_a_live_ones_is_not(engine):
    account = funded(engine)
    dead = run(engine, lambda s: leases.start(session=s, name="web.1", lease=LAPSED))
    alive = run(engine, lambda s: leases.start(session=s, name="web.2", lease=LONG))

    def claim(key: str, owner: str) -> idempotency.StoredAnswer | None:
        return run(
            engine,
            lambda s: idempotency.claim(
                session=s, account_id=account, key=key, digest="d", owner=owner
            ),
        )

    assert claim("first-died", dead) is None
    assert claim("first-alive", alive) is None
    assert claim("first-died", alive) is None  # taken over: this retry runs it
    with pytest.raises(IdempotencyConflict):
        claim("first-alive", dead)


def test_idempotency_records_past_their_retention_are_deleted_by_the_sweep(engine):
    account = funded(engine)

    def claim(s: Session, key: str) -> None:
        idempotency.claim(session=s, account_id=account, key=key, digest="d")

    run(engine, lambda s: claim(s, "old"))
    run(engine, lambda s: claim(s, "new"))
    with session_scope(engine) as session:  # the first was made a day and a minute ago
        old = session.exec(select(IdempotentRequest).where(IdempotentRequest.key == "old")).one()
        old.created_at = old.created_at - DAY - timedelta(minutes=1)
        session.add(old)

    report = sweep(engine)

    assert report is not None and report.idempotency_deleted == 1
    keys = run(engine, lambda s: [r.key for r in s.exec(select(IdempotentRequest))])
    assert keys == ["new"]


@pytest.mark.skipif(
    not TEST_DATABASE_URL,
    reason="PostgreSQL only: SQLite serves one process, where the sweep lock is a no-op",
)
def test_one_process_sweeps_at_a_time(engine):
    with session_scope(engine) as other:
        lock_for_transaction(other, SWEEP)  # another process is sweeping
        assert sweep(engine) is None
    assert sweep(engine) is not None
