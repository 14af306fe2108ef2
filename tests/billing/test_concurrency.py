"""200 requests racing for one balance, each on its own connection: nobody overdraws."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from sqlalchemy import Engine

from billing import ledger
from billing.db import session_scope
from billing.errors import InsufficientBalance
from tests.factories import make_account

BALANCE = 5_000
REQUESTS = 200
WANT = 60  # 200 x 60 = 12,000 tokens asked for against 5,000


def _try_hold(engine: Engine, account_id: int, n: int) -> int:
    try:
        with session_scope(engine) as session:
            row = ledger.hold(
                session=session,
                account_id=account_id,
                request_id=f"race-{n}",
                min_tokens=WANT,
                max_tokens=WANT,
                ttl=timedelta(minutes=5),
            )
            return row.amount
    except InsufficientBalance:
        return 0


def test_200_concurrent_holds_never_reserve_more_than_the_balance(engine, session):
    account = make_account(session, tokens=BALANCE)
    with ThreadPoolExecutor(max_workers=32) as pool:
        amounts = list(pool.map(lambda n: _try_hold(engine, account.id, n), range(REQUESTS)))

    assert sum(amounts) <= BALANCE
    assert sum(amounts) == (BALANCE // WANT) * WANT  # every token that could be held was
    session.commit()  # end the test's read snapshot, to see what the threads wrote
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert balance.held == sum(amounts)
    assert balance.balance == BALANCE

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(lambda n: _settle(engine, n), range(REQUESTS)))
    session.commit()
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert balance.held == 0
    assert balance.balance == BALANCE - 7 * sum(1 for amount in amounts if amount)
    assert balance.balance >= 0
    with session_scope(engine) as fresh:
        assert ledger.audit(session=fresh) == []


def _settle(engine: Engine, n: int) -> None:
    with session_scope(engine) as session:
        ledger.settle(session=session, hold_id=f"race-{n}", cost=7)
