"""Replicas: the API as 1, 2 and 3 processes on one PostgreSQL database (issue 28), then a table.

    .venv/bin/python bench/replicas.py [--replicas 1,2,3] [--clients 12] [--seconds 30]
    .venv/bin/python bench/replicas.py --stress 60      # the deadlock / books check, 60 s

Each replica is the Procfile's `web` line (uvicorn, `api.main:app_from_environment`) on a free
loopback port, with `ENGINE_THREADS` = cores / replicas (docs/deploying.md); the database is a
fresh schema of `--database-url` (PostgreSQL on this host by default), migrated with `tokenshop
migrate`, dropped at the end. Client i has a key of its own and goes to replica
`i mod replicas`, as a load balancer hashing the key sends one key to one replica.

Per replica count: requests/s over the run, time to first token (request sent to the first
event) and last token to the end of the response (the `finish_reason` event to `[DONE]` and the
close: the settlement sits in between), p50 and p99, by the raw-connection reader of
`bench/sse_client.py`. The replicas share this host's cores with the clients: on 2 cores a second
replica adds no compute, so throughput cannot grow; what it shows is what replicas cost.

`--stress S`: three replicas, 4 accounts of 3 clients each, every client sending each request to
the next replica, so every account's settlements come from all three processes at once, in
batches that mix accounts. It prints PostgreSQL's deadlock count before and after, the responses
that were not 200, and each account's ledger usage against what its clients were told.
`tests/api/test_replicas_stress.py` runs `stress` for 20 s and asserts the same.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/replicas.py` from anywhere
    sys.path.insert(0, str(ROOT))

from bench.sse_client import SseClient  # noqa: E402

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PROMPT = "Tell me a story about a lighthouse."


@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def v1(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def fresh_schema(database_url: str) -> Iterator[str]:
    """A new schema of `database_url`, migrated; the URL that uses it. Dropped at the end."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from billing.db import make_engine

    admin = make_engine(database_url)
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    rendered = url.render_as_string(hide_password=False)
    try:
        tokenshop = Path(sys.executable).with_name("tokenshop")
        env = os.environ | {"DATABASE_URL": rendered, "SECRET_KEY": "x" * 48}
        subprocess.run([str(tokenshop), "migrate"], env=env, cwd=ROOT, check=True)
        yield rendered
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def fund(database_url: str, secret_key: str, count: int, tokens: int) -> list[tuple[int, str]]:
    """`count` accounts with `tokens` each; (account id, key) for each."""
    from billing import accounts, keys, ledger
    from billing.db import make_engine, session_scope

    engine = make_engine(database_url)
    made = []
    try:
        with session_scope(engine) as session:
            for n in range(count):
                account = accounts.create_account(session=session, name=f"replicas-{n}")
                assert account.id is not None
                ledger.grant(session=session, account_id=account.id, tokens=tokens)
                key, _ = keys.ensure_key(
                    session=session, account_id=account.id, secret_key=secret_key.encode()
                )
                made.append((account.id, key))
    finally:
        engine.dispose()
    return made


@contextmanager
def replicas(
    database_url: str, secret_key: str, count: int, workdir: Path, **settings: str
) -> Iterator[list[Replica]]:
    """`count` API processes as the Procfile runs them, ready; stopped with SIGTERM at the end."""
    threads = max(1, (os.cpu_count() or 1) // count)
    started: list[Replica] = []
    try:
        for index in range(count):
            port = _free_port()
            log = workdir / f"replica-{index}.log"
            env = os.environ | {
                "PYTHONPATH": str(ROOT),
                "DATABASE_URL": database_url,
                "SECRET_KEY": secret_key,
                "MODELS": f"demo={ROOT / 'models' / 'demo'}",
                "ENGINE_THREADS": str(threads),
                "INSTANCE_NAME": f"replica-{index}",
                **settings,
            }
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "uvicorn", "api.main:app_from_environment"]
                    + ["--factory", "--host", "127.0.0.1", "--port", str(port)]
                    + ["--log-level", "warning"],
                    env=env,
                    cwd=workdir,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            started.append(Replica(f"replica-{index}", port, process, log))
        for replica in started:
            _wait_ready(replica)
        yield started
    finally:
        for replica in started:
            if replica.process.poll() is None:
                replica.process.terminate()
        for replica in started:
            try:
                replica.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait()


def _wait_ready(replica: Replica, within: float = 180) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if replica.process.poll() is not None:
            raise RuntimeError(f"{replica.name} exited:\n{replica.log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{replica.port}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{replica.name} did not become ready")


# Throughput and latency with 1, 2, 3 replicas.


@dataclass
class Run:
    replicas: int
    seconds: float = 0.0
    done: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ttft: list[float] = field(default_factory=list)
    tail: list[float] = field(default_factory=list)  # last token to the end of the response


async def _measure(servers: list[Replica], keys: list[str], seconds: float, max_tokens: int) -> Run:
    run = Run(replicas=len(servers))
    deadline = time.perf_counter() + seconds
    body = {"model": "demo", "messages": [{"role": "user", "content": PROMPT}]}
    body |= {"max_tokens": max_tokens, "stream": True}

    async def client_loop(index: int) -> None:
        server = servers[index % len(servers)]
        client = SseClient("127.0.0.1", server.port)
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            try:
                times = await client.stream(body, keys[index])
            except Exception as error:  # noqa: BLE001  (every failure is counted)
                run.errors[str(error)[:60]] += 1
                continue
            ended = time.perf_counter()
            run.done += 1
            run.ttft.append(times.first - sent)
            if times.last:
                run.tail.append(ended - times.last)

    started = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(len(keys))))
    run.seconds = time.perf_counter() - started
    return run


def _p(values: Sequence[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000:.0f}"


def _table(runs: list[Run]) -> str:
    lines = [
        "| replicas | requests | req/s | TTFT p50 ms | TTFT p99 ms | last token to [DONE] p50 ms "
        "| p99 ms | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in runs:
        errors = ", ".join(f"{k} x{v}" for k, v in run.errors.items()) or "0"
        lines.append(
            f"| {run.replicas} | {run.done} | {run.done / run.seconds:.1f} | {_p(run.ttft, 0.5)} "
            f"| {_p(run.ttft, 0.99)} | {_p(run.tail, 0.5)} | {_p(run.tail, 0.99)} | {errors} |"
        )
    return "\n".join(lines)


# The stress run: overlapping accounts settled from every replica at once.


@dataclass
class StressResult:
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    told: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # account -> tokens


async def stress(
    servers: list[Replica],
    accounts: list[tuple[int, str]],
    *,
    seconds: float,
    clients_per_account: int = 3,
    max_tokens: int = 12,
) -> StressResult:
    """Clients of each account send streaming requests back to back, each to the next replica;
    what each was told it used is summed per account."""
    result = StressResult()
    deadline = time.perf_counter() + seconds

    async def client_loop(account_id: int, key: str, offset: int) -> None:
        clients = [
            openai.AsyncOpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=120)
            for server in servers
        ]
        sent = offset
        try:
            while time.perf_counter() < deadline:
                client = clients[sent % len(clients)]
                sent += 1
                try:
                    stream = await client.chat.completions.create(
                        model="demo",
                        messages=[{"role": "user", "content": PROMPT}],
                        max_tokens=max_tokens,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    async for chunk in stream:
                        if chunk.usage is not None:
                            result.told[account_id] += chunk.usage.total_tokens
                    result.statuses[200] += 1
                except openai.APIStatusError as error:
                    result.statuses[error.status_code] += 1
                    result.errors.append(f"{error.status_code}: {str(error)[:120]}")
                except openai.APIError as error:  # an error event in the stream, a cut
                    result.statuses[0] += 1
                    result.errors.append(f"stream: {str(error)[:120]}")
        finally:
            for client in clients:
                await client.close()

    await asyncio.gather(
        *(
            client_loop(account_id, key, index)
            for account_id, key in accounts
            for index in range(clients_per_account)
        )
    )
    return result


def billed(database_url: str) -> dict[int, int]:
    """Each account's usage in the ledger, in tokens."""
    from sqlalchemy import func, select

    from billing.db import make_engine
    from billing.models import LedgerEntry

    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(LedgerEntry.account_id, func.sum(LedgerEntry.amount))
                .where(LedgerEntry.kind == "usage")
                .group_by(LedgerEntry.account_id)
            ).all()
    finally:
        engine.dispose()
    return {int(account): -int(total) for account, total in rows}


def deadlocks(database_url: str) -> int | None:
    """PostgreSQL's count of deadlocks detected in this database; None elsewhere."""
    from sqlalchemy import text

    from billing.db import make_engine

    engine = make_engine(database_url)
    try:
        if engine.dialect.name != "postgresql":
            return None
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_stat_clear_snapshot()"))
            return int(
                connection.execute(
                    text(
                        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--stress", type=float, default=0, help="run the stress check instead")
    parser.add_argument("--out", type=Path, help="write the table to this markdown file too")
    args = parser.parse_args(argv)
    secret_key = secrets.token_urlsafe(48)
    report: list[str] = []
    with fresh_schema(args.database_url) as url, tempfile.TemporaryDirectory() as tmp:
        if args.stress:
            accounts = fund(url, secret_key, 4, 50_000_000)
            before = deadlocks(url)
            with replicas(url, secret_key, 3, Path(tmp)) as servers:
                result = asyncio.run(stress(servers, accounts, seconds=args.stress))
            after = deadlocks(url)
            books = billed(url)
            report.append(f"stress: 3 replicas, 12 clients on 4 accounts, {args.stress:.0f} s")
            report.append(f"responses: {dict(result.statuses)}")
            report.append(f"deadlocks: {before} before, {after} after")
            for account_id, _ in accounts:
                told, ledger = result.told[account_id], books.get(account_id, 0)
                mark = "ok" if told == ledger else "MISMATCH"
                report.append(f"account {account_id}: told {told}, ledger {ledger} ({mark})")
            report.extend(result.errors[:10])
        else:
            runs = []
            for count in (int(n) for n in args.replicas.split(",")):
                keys = [key for _, key in fund(url, secret_key, args.clients, 50_000_000)]
                with replicas(url, secret_key, count, Path(tmp)) as servers:
                    runs.append(asyncio.run(_measure(servers, keys, args.seconds, args.max_tokens)))
            report.append(
                f"{args.clients} streaming clients, {args.max_tokens} tokens each, "
                f"{args.seconds:.0f} s per row, {os.cpu_count()} cores, "
                f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
            )
            report.append("")
            report.append(_table(runs))
    text = "\n".join(report)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
