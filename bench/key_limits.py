"""What a key's limits cost a request's hold and settlement (`billing/key_limits.py`).

    .venv/bin/python bench/key_limits.py [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]

One account, `--requests` holds each settled at once, one transaction each as the API's group
commit runs a lone write (the account locked first), in three arms taking turns request by
request: no key (the ledger as before keys had limits), a key with no limits set (its row is
still read, reserved from and settled to, so its spend counts), and a key with a spend limit,
RPM and TPM. Prints the median and 90th percentile of a hold and of a settlement per arm.
Without `--url` it uses a fresh SQLite file; with a PostgreSQL URL it works in a schema of its
own and drops it after.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url
from sqlmodel import SQLModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import billing.models  # noqa: E402, F401  (registers the tables)
from billing import key_limits, keys, ledger  # noqa: E402
from billing.db import make_engine, session_scope  # noqa: E402
from billing.locks import lock_accounts  # noqa: E402
from billing.models import Account  # noqa: E402

TTL = timedelta(minutes=5)
SECRET = b"bench-secret-key-0123456789abcdef0123456789"


@contextmanager
def database(url: str | None) -> Iterator[Engine]:
    if url is None:
        with tempfile.TemporaryDirectory() as folder:
            engine = make_engine(f"sqlite:///{folder}/bench.db")
            SQLModel.metadata.create_all(engine)
            yield engine
            engine.dispose()
        return
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = make_engine(url)
    with admin.begin() as connection:
        connection.execute(text(f"CREATE SCHEMA {schema}"))
    engine = make_engine(url)

    @event.listens_for(engine, "connect")
    def _search_path(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET search_path TO {schema}")
        cursor.close()
        dbapi_connection.commit()

    try:
        SQLModel.metadata.create_all(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None)
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    name = make_url(args.url).get_backend_name() if args.url else "sqlite"
    with database(args.url) as engine:
        with session_scope(engine) as session:
            account = Account()
            session.add(account)
            session.flush()
            assert account.id is not None
            account_id = account.id
            ledger.grant(session=session, account_id=account_id, tokens=10**12)
            plain, _ = keys.create_key(session=session, account_id=account_id, secret_key=SECRET)
            limited, _ = keys.create_key(session=session, account_id=account_id, secret_key=SECRET)
            assert plain.id is not None and limited.id is not None
            key_limits.set_limits(
                session=session,
                account_id=account_id,
                key_id=limited.id,
                changes={"spend": 10**11, "period": "daily", "rpm": 10**6, "tpm": 10**9},
                now=datetime.now(UTC),
            )
        arms = {"no key": None, "key, no limits": plain.id, "key with limits": limited.id}
        timings: dict[str, tuple[list[float], list[float]]] = {arm: ([], []) for arm in arms}
        serial = itertools.count()
        for _ in range(args.requests):
            for arm, key_id in arms.items():
                request_id = f"bench-{next(serial)}"
                started = time.perf_counter()
                with session_scope(engine) as session:
                    lock_accounts(session, [account_id])  # as group commit's batch does
                    ledger.hold(
                        session=session,
                        account_id=account_id,
                        request_id=request_id,
                        min_tokens=20,
                        max_tokens=200,
                        ttl=TTL,
                        model="demo",
                        key_id=key_id,
                        account_locked=True,
                    )
                held = time.perf_counter()
                with session_scope(engine) as session:
                    ledger.settle(session=session, hold_id=request_id, cost=120)
                settled = time.perf_counter()
                timings[arm][0].append((held - started) * 1000)
                timings[arm][1].append((settled - held) * 1000)
        with session_scope(engine) as session:
            assert ledger.audit(session=session) == []
    print(f"{name}, {args.requests} requests per arm: hold / settle, ms (median, p90)")
    for arm, (holds, settles) in timings.items():
        print(f"  {arm:16} hold {_figures(holds)}   settle {_figures(settles)}")


def _figures(values: list[float]) -> str:
    deciles = statistics.quantiles(values, n=10)
    return f"{statistics.median(values):6.3f} {deciles[-1]:6.3f}"


if __name__ == "__main__":
    main()
