"""Concurrent settlements: one transaction each against group commit (`billing/group_commit.py`).

    .venv/bin/python bench/settle.py [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]

Places `--writers` holds on one account, then settles them all at once, `--rounds` times, in
two ways: each settlement its own transaction in its own thread (the API's write path before
group commit), and through `GroupCommit` (the API's now). Prints the median and worst wall
time of a burst, and the commits it took. Without `--url` it uses a fresh SQLite file; with a
PostgreSQL URL it works in a schema of its own and drops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, SQLModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import billing.models  # noqa: E402, F401  (registers the tables)
from billing import ledger  # noqa: E402
from billing.db import make_engine, session_scope  # noqa: E402
from billing.group_commit import GroupCommit  # noqa: E402
from billing.models import Account  # noqa: E402


@contextmanager
def database(url: str | None) -> Iterator[Engine]:
    """An engine on empty tables: a temporary SQLite file, or a new PostgreSQL schema."""
    if url is None:
        with tempfile.TemporaryDirectory() as tmp:
            engine = make_engine(f"sqlite:///{Path(tmp) / 'settle.db'}")
            SQLModel.metadata.create_all(engine)
            yield engine
            engine.dispose()
        return
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = make_engine(url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    engine = make_engine(scoped.render_as_string(hide_password=False))
    try:
        SQLModel.metadata.create_all(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def place_holds(engine: Engine, account_id: int, count: int) -> list[str]:
    with session_scope(engine) as session:
        return [
            ledger.hold(
                session=session,
                account_id=account_id,
                request_id=f"bench-{uuid.uuid4().hex}",
                min_tokens=10,
                max_tokens=100,
                ttl=timedelta(minutes=5),
            ).id
            for _ in range(count)
        ]


def settlement(hold_id: str) -> Callable[[Session], object]:
    return lambda session: ledger.settle(session=session, hold_id=hold_id, cost=40)


def separate(engine: Engine, holds: list[str]) -> None:
    def one(hold_id: str) -> None:
        with session_scope(engine) as session:
            settlement(hold_id)(session)

    with ThreadPoolExecutor(len(holds)) as pool:
        list(pool.map(one, holds))


def grouped(engine: Engine, holds: list[str]) -> None:
    async def burst() -> None:
        writes = GroupCommit(engine)
        await asyncio.gather(*(writes.run(settlement(hold_id)) for hold_id in holds))

    asyncio.run(burst())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a PostgreSQL URL (default: a temporary SQLite file)")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    ways = {"one transaction each": separate, "group commit": grouped}
    walls: dict[str, list[float]] = {name: [] for name in ways}
    commits: dict[str, list[int]] = {name: [] for name in ways}
    with database(args.url) as engine:
        seen: list[None] = []
        event.listen(engine, "commit", lambda _connection: seen.append(None))
        with session_scope(engine) as session:
            account = Account()
            session.add(account)
            session.flush()
            assert account.id is not None
            account_id = account.id
            ledger.grant(session=session, account_id=account_id, tokens=10**8)
        for _ in range(args.rounds):  # interleaved, so drift hits both alike
            for name, settle_all in ways.items():
                holds = place_holds(engine, account_id, args.writers)
                seen.clear()
                started = time.perf_counter()
                settle_all(engine, holds)
                walls[name].append(time.perf_counter() - started)
                commits[name].append(len(seen))
        backend = engine.url.get_backend_name()
    print(f"{args.writers} concurrent settlements of one account, {backend}, {args.rounds} rounds")
    print()
    print("| write path | median ms | worst ms | commits per burst (median) |")
    print("|---|---:|---:|---:|")
    for name in ways:
        median = statistics.median(walls[name]) * 1000
        worst = max(walls[name]) * 1000
        print(f"| {name} | {median:.1f} | {worst:.1f} | {statistics.median(commits[name]):g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
