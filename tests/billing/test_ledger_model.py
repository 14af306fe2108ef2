"""A model check of the books: random sequences of credits, holds, settlements, releases,
refunds, key rotations and sweeps never break the ledger's invariants."""

from __future__ import annotations

import itertools
from datetime import timedelta

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
from sqlalchemy import Engine

from billing import keys, ledger
from billing.db import session_scope
from billing.errors import InsufficientBalance, InvalidKey
from billing.models import Account, utcnow
from billing.packs import Pack
from billing.purchases import credit_purchase

TTL = timedelta(minutes=5)
_serial = itertools.count()


def books_machine(engine: Engine, secret_key: bytes) -> type[RuleBasedStateMachine]:
    class Books(RuleBasedStateMachine):
        holds = Bundle("holds")
        charges = Bundle("charges")

        @initialize()
        def open_account(self) -> None:
            with session_scope(engine) as session:
                account = Account()
                session.add(account)
                session.flush()
                self.account_id = account.id
                self.key, _ = keys.ensure_key(
                    session=session, account_id=account.id, secret_key=secret_key
                )
            self.expected_balance = 0
            self.expected_held = 0
            self.open_holds: dict[str, int] = {}

        @rule(target=charges, tokens=st.integers(1, 5_000))
        def buy(self, tokens: int) -> str:
            charge_id = f"charge-{next(_serial)}"
            with session_scope(engine) as session:
                for _ in range(2):  # a repeated update credits once
                    credit_purchase(
                        session=session,
                        account_id=self.account_id,
                        charge_id=charge_id,
                        pack=Pack("p", "P", tokens, 1),
                    )
            self.expected_balance += tokens
            return charge_id

        @rule(target=holds, low=st.integers(1, 500), extra=st.integers(0, 3_000))
        def hold(self, low: int, extra: int) -> str:
            request_id = f"req-{next(_serial)}"
            available = self.expected_balance - self.expected_held
            try:
                with session_scope(engine) as session:
                    row = ledger.hold(
                        session=session,
                        account_id=self.account_id,
                        request_id=request_id,
                        min_tokens=low,
                        max_tokens=low + extra,
                        ttl=TTL,
                    )
                    amount = row.amount
            except InsufficientBalance:
                assert available < low
                return request_id
            assert amount == min(available, low + extra)
            self.expected_held += amount
            self.open_holds[request_id] = amount
            return request_id

        @rule(request_id=consumes(holds), fraction=st.floats(0, 1.5))
        def settle(self, request_id: str, fraction: float) -> None:
            amount = self.open_holds.pop(request_id, None)
            cost = int((amount or 0) * fraction)
            with session_scope(engine) as session:
                for _ in range(2):  # settling twice is a no-op
                    ledger.settle(session=session, hold_id=request_id, cost=cost)
            if amount is not None:
                self.expected_held -= amount
                self.expected_balance -= min(cost, amount)

        @rule(request_id=consumes(holds))
        def release(self, request_id: str) -> None:
            amount = self.open_holds.pop(request_id, None)
            with session_scope(engine) as session:
                released = ledger.release(session=session, hold_id=request_id)
            assert released == (amount is not None)
            if amount is not None:
                self.expected_held -= amount

        @rule(charge_id=consumes(charges))
        def refund(self, charge_id: str) -> None:
            with session_scope(engine) as session:
                result = ledger.refund_purchase(session=session, charge_id=charge_id)
            available = self.expected_balance - self.expected_held
            assert result.reversed_tokens == min(result.purchase.tokens, available)
            self.expected_balance -= result.reversed_tokens

        @rule()
        def rotate_key(self) -> None:
            with session_scope(engine) as session:
                new_key = keys.rotate_key(
                    session=session, account_id=self.account_id, secret_key=secret_key
                )
            with session_scope(engine) as session:
                try:
                    keys.authenticate(session=session, key=self.key)
                    raise AssertionError("a rotated key still authenticates")
                except InvalidKey:
                    pass
                assert keys.authenticate(session=session, key=new_key).account_id == self.account_id
            self.key = new_key

        @rule()
        def sweep_after_expiry(self) -> None:
            with session_scope(engine) as session:
                ledger.release_stale_holds(session=session, now=utcnow() + TTL * 2)
            self.expected_held = 0
            self.open_holds.clear()

        @invariant()
        def books_balance(self) -> None:
            with session_scope(engine) as session:
                balance = ledger.get_balance(session=session, account_id=self.account_id)
                assert ledger.audit(session=session) == []
            assert balance.balance == self.expected_balance >= 0
            assert 0 <= balance.held == self.expected_held <= balance.balance

    return Books


def test_random_sequences_of_operations_keep_the_books_balanced(engine, secret_key):
    run_state_machine_as_test(
        books_machine(engine, secret_key),
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
