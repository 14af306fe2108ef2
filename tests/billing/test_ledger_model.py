"""A model check of the books: random sequences of credits, purchases, holds, checkpoints,
settlements, releases, sweeps, refunds, key rotations, key limits, bursts of concurrent holds
and races to resolve one hold never break the ledger's invariants.

The machine keeps its own arithmetic model of one account and compares it with the database
after every step: the balance equals the model and the sum of the account's ledger entries, it is
never negative, the held tokens equal the open holds and never exceed the balance, and every
hold resolves exactly once (one usage entry per hold, whoever raced to resolve it). Holds made
through the account's key are held against its limits too: the key's row holds what its open
holds hold, has spent what its resolved holds were billed (across rotations, which keep it), and
never reserves past its spend limit.

`LEDGER_MODEL_EXAMPLES` sets the number of examples (1,000 by default, what CI runs on each
database); the README's Guarantees section records a long run.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, event, func
from sqlalchemy import select as sa_select
from sqlmodel import col, select

from billing import key_limits, keys, ledger
from billing.db import make_engine, session_scope
from billing.errors import InsufficientBalance, InvalidKey, KeyLimitReached
from billing.models import Account, Hold, LedgerEntry, utcnow
from billing.packs import Pack
from billing.purchases import credit_purchase

EXAMPLES = int(os.environ.get("LEDGER_MODEL_EXAMPLES", "1000"))
STEPS = 8  # per example: enough to interleave every rule, short enough for 1,000 examples
MAX_BURST = 64
TTL = timedelta(minutes=5)
_serial = itertools.count()

# Most bursts are small (cheap, and as racy: every thread waits on one barrier, then on one
# account row); one in eight goes up to 64 threads.
burst_sizes = st.one_of(*[st.integers(2, 8)] * 7, st.integers(9, MAX_BURST))


@dataclass
class OpenHold:
    amount: int
    used: int = 0  # the last checkpoint
    keyed: bool = False  # made through the key: held against its limits too


@dataclass
class Model:
    """What the books should say about the machine's account."""

    balance: int = 0
    holds: dict[str, OpenHold] = field(default_factory=dict)
    resolved: set[str] = field(default_factory=set)
    key_limit: int | None = None  # the key's spend limit (period "total")
    key_spent: int = 0  # billed through the key, across its rotations
    key_ceiling: int | None = None  # spent + held may not pass this: the limit, or what was
    # already spent and held when a lower limit was set

    @property
    def held(self) -> int:
        return sum(hold.amount for hold in self.holds.values())

    @property
    def key_held(self) -> int:
        return sum(hold.amount for hold in self.holds.values() if hold.keyed)

    @property
    def key_room(self) -> int | None:
        if self.key_limit is None:
            return None
        return self.key_limit - self.key_spent - self.key_held

    def resolve(self, request_id: str, charge: int) -> None:
        hold = self.holds.pop(request_id)
        self.balance -= charge
        if hold.keyed:
            self.key_spent += charge
        self.resolved.add(request_id)

    @property
    def available(self) -> int:
        return self.balance - self.held


def _least(*bounds: int | None) -> int:
    """The tightest of the bounds that are set."""
    return min(bound for bound in bounds if bound is not None)


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    """Threads for the bursts, started once: every example reuses them (and their connections,
    through the engine's pool)."""
    with ThreadPoolExecutor(max_workers=MAX_BURST, thread_name_prefix="burst") as executor:
        yield executor


def books_machine(
    engine: Engine, secret_key: bytes, pool: ThreadPoolExecutor
) -> type[RuleBasedStateMachine]:
    def together(count: int, work: Callable[[int], Any]) -> list[Any]:
        """Run `work(0..count-1)` on `count` threads released at the same instant."""
        start = threading.Barrier(count)

        def run(index: int) -> Any:
            start.wait(timeout=30)
            return work(index)

        return list(pool.map(run, range(count)))

    def try_hold(request_id: str, low: int, high: int, key_id: int | None = None) -> int | None:
        try:
            with session_scope(engine) as session:
                return ledger.hold(
                    session=session,
                    account_id=account_id_of[0],
                    request_id=request_id,
                    min_tokens=low,
                    max_tokens=high,
                    ttl=TTL,
                    key_id=key_id,
                ).amount
        except (InsufficientBalance, KeyLimitReached):
            return None

    account_id_of: list[int] = [0]  # the current example's account, for the helpers above

    class Books(RuleBasedStateMachine):
        holds = Bundle("holds")
        charges = Bundle("charges")

        @initialize(opening=st.integers(0, 20_000))
        def open_account(self, opening: int) -> None:
            """Usually with tokens already, so that holds, not refusals, fill most sequences."""
            with session_scope(engine) as session:
                account = Account()
                session.add(account)
                session.flush()
                assert account.id is not None
                self.account_id = account.id
                self.key, _ = keys.ensure_key(
                    session=session, account_id=account.id, secret_key=secret_key
                )
                if opening:
                    ledger.grant(session=session, account_id=account.id, tokens=opening)
            account_id_of[0] = self.account_id
            self.model = Model(balance=opening)
            self.key_id = self._key_id(self.key)

        # Money in.
        @rule(target=charges, tokens=st.integers(1, 5_000))
        def buy(self, tokens: int) -> str:
            charge_id = f"charge-{next(_serial)}"
            with session_scope(engine) as session:
                for _ in range(2):  # Telegram repeats the update: credited once
                    credit_purchase(
                        session=session,
                        account_id=self.account_id,
                        charge_id=charge_id,
                        pack=Pack("p", "P", tokens, 1),
                    )
            self.model.balance += tokens
            return charge_id

        @rule(tokens=st.integers(1, 2_000))
        def grant(self, tokens: int) -> None:
            with session_scope(engine) as session:
                ledger.grant(session=session, account_id=self.account_id, tokens=tokens)
            self.model.balance += tokens

        # Holds and their one resolution.
        @rule(target=holds, low=st.integers(1, 500), extra=st.integers(0, 3_000))
        def hold(self, low: int, extra: int) -> str:
            request_id = f"req-{next(_serial)}"
            available = self.model.available
            amount = try_hold(request_id, low, low + extra)
            if amount is None:
                assert available < low, "refused although the balance allowed it"
            else:
                assert amount == min(available, low + extra)
                self.model.holds[request_id] = OpenHold(amount)
            return request_id

        @rule(count=burst_sizes, low=st.integers(1, 300), extra=st.integers(0, 1_500))
        def burst_of_holds(self, count: int, low: int, extra: int) -> None:
            """`count` requests of one account reserving at the same instant, each on its own
            connection: together they never reserve more than was available."""
            ids = [f"burst-{next(_serial)}" for _ in range(count)]
            before = self.model.available
            amounts = together(count, lambda i: try_hold(ids[i], low, low + extra))
            granted = {
                rid: amount for rid, amount in zip(ids, amounts, strict=True) if amount is not None
            }
            assert sum(granted.values()) <= before
            assert all(low <= amount <= low + extra for amount in granted.values())
            self.model.holds.update({rid: OpenHold(amount) for rid, amount in granted.items()})
            if len(granted) < count:  # a refusal means the balance had truly run short
                assert self.model.available < low, "refused although the balance allowed it"
            with session_scope(engine) as session:
                refused = [rid for rid in ids if rid not in granted]
                assert not session.exec(select(Hold.id).where(col(Hold.id).in_(refused))).all()

        @rule(pick=st.integers(0, 1_000), fraction=st.floats(0, 1))
        def checkpoint(self, pick: int, fraction: float) -> None:
            if self._no_open_holds():
                return
            request_id = self._pick(pick)
            hold = self.model.holds[request_id]
            used = hold.used + int((hold.amount - hold.used) * fraction)
            with session_scope(engine) as session:
                assert ledger.checkpoint(session=session, hold_id=request_id, used=used, ttl=TTL)
            hold.used = used

        @rule(request_id=consumes(holds), fraction=st.floats(0, 1.5))
        def settle(self, request_id: str, fraction: float) -> None:
            hold = self.model.holds.get(request_id)
            cost = int((hold.amount if hold else 100) * fraction)
            with session_scope(engine) as session:
                first = ledger.settle(session=session, hold_id=request_id, cost=cost)
                again = ledger.settle(session=session, hold_id=request_id, cost=cost)
            assert again is None  # settling twice is a no-op
            assert (first is not None) == (hold is not None)
            if hold is not None:
                self.model.resolve(request_id, min(cost, hold.amount))

        @rule(request_id=consumes(holds))
        def release(self, request_id: str) -> None:
            hold = self.model.holds.get(request_id)
            with session_scope(engine) as session:
                released = ledger.release(session=session, hold_id=request_id)
            assert released == (hold is not None)
            if hold is not None:
                self.model.resolve(request_id, 0)

        @rule(
            pick=st.integers(0, 1_000),
            fraction=st.floats(0, 1),
            kinds=st.lists(st.sampled_from(["settle", "release"]), min_size=8, max_size=8),
            count=st.integers(2, 8),
        )
        def race_to_resolve(self, pick: int, fraction: float, kinds: list[str], count: int) -> None:
            """Settlers and releasers all try to resolve one hold at once (a request ending
            while its client disconnects): exactly one wins, and only its outcome is booked."""
            if self._no_open_holds():
                return
            request_id = self._pick(pick)
            hold = self.model.holds[request_id]
            cost = int(hold.amount * fraction)

            def resolve(index: int) -> tuple[str, bool]:
                kind = kinds[index]
                with session_scope(engine) as session:
                    if kind == "settle":
                        won = ledger.settle(session=session, hold_id=request_id, cost=cost)
                        return kind, won is not None
                    return kind, ledger.release(session=session, hold_id=request_id)

            outcomes = together(count, resolve)
            winners = [kind for kind, won in outcomes if won]
            assert len(winners) == 1, outcomes
            self.model.resolve(request_id, cost if winners[0] == "settle" else 0)

        @rule()
        def sweep_finds_nothing_stale_yet(self) -> None:
            with session_scope(engine) as session:
                ledger.release_stale_holds(session=session)
            # (other accounts' leftovers are long swept; ours are within their TTL)

        @rule()
        def sweep_after_expiry(self) -> None:
            """A crashed worker's holds: the checkpointed usage is billed, the rest freed."""
            with session_scope(engine) as session:
                ledger.release_stale_holds(session=session, now=utcnow() + TTL * 2)
            for request_id, hold in list(self.model.holds.items()):
                self.model.resolve(request_id, hold.used)

        # Refunds and keys.
        @rule(charge_id=consumes(charges))
        def refund(self, charge_id: str) -> None:
            available = self.model.available
            with session_scope(engine) as session:
                result = ledger.refund_purchase(session=session, charge_id=charge_id)
                again = ledger.refund_purchase(session=session, charge_id=charge_id)
            assert result.newly_refunded and not again.newly_refunded
            assert result.reversed_tokens == min(result.purchase.tokens, available)
            assert result.reversed_tokens + result.shortfall == result.purchase.tokens
            self.model.balance -= result.reversed_tokens

        @rule()
        def rotate_key(self) -> None:
            with session_scope(engine) as session:
                new_key = keys.rotate_key(
                    session=session, account_id=self.account_id, secret_key=secret_key
                )
            with session_scope(engine) as session:
                with pytest.raises(InvalidKey):  # RevokedKey is an InvalidKey
                    keys.authenticate(session=session, key=self.key)
                assert keys.authenticate(session=session, key=new_key).account_id == self.account_id
            self.key = new_key
            self.key_id = self._key_id(new_key)  # the new key has the old one's limits and spend

        @rule(spend=st.one_of(st.none(), st.integers(0, 6_000)))
        def limit_key(self, spend: int | None) -> None:
            """The buyer sets (or removes) the key's spend limit, over its whole life."""
            with session_scope(engine) as session:
                key_limits.set_limits(
                    session=session,
                    account_id=self.account_id,
                    key_id=self.key_id,
                    changes={"spend": spend, "period": "total"},
                    now=utcnow(),
                )
            self.model.key_limit = spend
            used = self.model.key_spent + self.model.key_held
            self.model.key_ceiling = None if spend is None else max(spend, used)

        @rule(target=holds, low=st.integers(1, 500), extra=st.integers(0, 3_000))
        def hold_through_key(self, low: int, extra: int) -> str:
            """A request made with the key: held against the balance and the key's limit."""
            request_id = f"keyed-{next(_serial)}"
            room = self.model.key_room
            most = _least(self.model.available, low + extra, room)
            amount = try_hold(request_id, low, low + extra, key_id=self.key_id)
            if amount is None:
                assert most < low, "refused although the balance and the key allowed it"
            else:
                assert amount == most
                self.model.holds[request_id] = OpenHold(amount, keyed=True)
            return request_id

        @rule(count=burst_sizes, low=st.integers(1, 300), extra=st.integers(0, 1_500))
        def burst_through_key(self, count: int, low: int, extra: int) -> None:
            """`count` requests of the key at once, each on its own connection: together they
            reserve no more than the balance, nor than the key's limit leaves."""
            ids = [f"keyburst-{next(_serial)}" for _ in range(count)]
            available, room = self.model.available, self.model.key_room
            amounts = together(count, lambda i: try_hold(ids[i], low, low + extra, self.key_id))
            granted = {
                rid: amount for rid, amount in zip(ids, amounts, strict=True) if amount is not None
            }
            assert sum(granted.values()) <= available
            if room is not None:
                assert sum(granted.values()) <= max(room, 0)
            self.model.holds.update(
                {rid: OpenHold(amount, keyed=True) for rid, amount in granted.items()}
            )
            if len(granted) < count:
                left = _least(self.model.available, self.model.key_room)
                assert left < low, "refused although the balance and the key allowed it"

        def _key_id(self, key: str) -> int:
            with session_scope(engine) as session:
                return keys.authenticate(session=session, key=key).key_id

        def _no_open_holds(self) -> bool:
            """Whether there is no hold to act on. Checked in the rule, not as a Hypothesis
            precondition: which racer wins `race_to_resolve` is up to the database, so the
            balance and hence later refusals differ between runs of the same example, and a
            precondition reading them makes Hypothesis's replay draw differently
            (FlakyStrategyDefinition, seen once on PostgreSQL in CI)."""
            return not self.model.holds

        def _pick(self, pick: int) -> str:
            """An open hold, chosen without drawing from the state: which burst request won
            which amount depends on thread timing, and Hypothesis needs draws it can replay."""
            return list(self.model.holds)[pick % len(self.model.holds)]

        # What must always hold.
        @invariant()
        def books_balance(self) -> None:
            with session_scope(engine) as session:
                balance = ledger.get_balance(session=session, account_id=self.account_id)
                open_holds = dict(
                    session.exec(
                        select(Hold.id, Hold.amount).where(
                            col(Hold.account_id) == self.account_id, col(Hold.state) == "held"
                        )
                    ).all()
                )
                entries = session.execute(
                    sa_select(
                        col(LedgerEntry.kind),
                        col(LedgerEntry.request_id),
                        func.sum(LedgerEntry.amount),
                        func.count(),
                    )
                    .where(col(LedgerEntry.account_id) == self.account_id)
                    .group_by(col(LedgerEntry.kind), col(LedgerEntry.request_id))
                ).all()
            ledger_sum = sum(total for _, _, total, _ in entries)
            usage = {rid: count for kind, rid, _, count in entries if kind == "usage"}
            assert balance.balance == ledger_sum == self.model.balance
            assert balance.balance >= 0
            assert balance.held == self.model.held == sum(open_holds.values())
            assert 0 <= balance.held <= balance.balance
            assert open_holds == {rid: hold.amount for rid, hold in self.model.holds.items()}
            # every resolved hold has exactly one usage entry, and open ones none
            assert usage == dict.fromkeys(self.model.resolved, 1)
            # the key's row, whichever of its rotations asked
            with session_scope(engine) as session:
                report = key_limits.report(session=session, key_id=self.key_id, now=utcnow())
            assert report is not None
            assert report.held == self.model.key_held
            assert report.spent == report.spent_total == self.model.key_spent
            assert report.limits.spend == self.model.key_limit
            if self.model.key_ceiling is not None:
                assert report.spent + report.held <= self.model.key_ceiling

        def teardown(self) -> None:
            """Close the example's holds (a long run outlives their TTL) and audit every book."""
            if not hasattr(self, "model"):
                return  # the example stopped before it opened its account
            with session_scope(engine) as session:
                for request_id in self.model.holds:
                    assert ledger.release(session=session, hold_id=request_id)
            with session_scope(engine) as session:
                assert ledger.audit(session=session) == []

    return Books


# Bounded by the number of examples, not by time: about 0.2 s each on SQLite and 0.5 s on
# PostgreSQL on a busy 2-core machine, so the suite's 600 s would cut a long run short.
@pytest.mark.slow  # 1,000 examples: minutes
@pytest.mark.timeout(max(600, 2 * EXAMPLES))
def test_random_sequences_of_operations_keep_the_books_balanced(
    engine: Engine, database_url: str, secret_key: bytes, pool: ThreadPoolExecutor
) -> None:
    # A pool as big as the largest burst: every thread keeps its connection from one burst to
    # the next instead of opening (and closing) an overflow connection each time.
    pooled = make_engine(database_url, pool_size=MAX_BURST, max_overflow=0, pool_pre_ping=False)
    event.listen(pooled, "connect", _commit_without_waiting_for_the_disk)
    try:
        _run(pooled, secret_key, pool)
    finally:
        pooled.dispose()


def _commit_without_waiting_for_the_disk(dbapi_connection: Any, _record: Any) -> None:
    """Commits that do not wait for fsync: the same isolation and locking (what the model
    checks), without a disk flush per step, which would make 1,000 examples take many minutes."""
    cursor = dbapi_connection.cursor()
    if isinstance(dbapi_connection, sqlite3.Connection):
        cursor.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, not commits
    else:
        cursor.execute("SET synchronous_commit TO off")
        dbapi_connection.commit()  # a SET rolled back with its transaction would not stick
    cursor.close()


def _run(engine: Engine, secret_key: bytes, pool: ThreadPoolExecutor) -> None:
    run_state_machine_as_test(
        books_machine(engine, secret_key, pool),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,  # no example database written into the checkout
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
