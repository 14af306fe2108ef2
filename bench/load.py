"""Load: C concurrent streaming clients against the API for T seconds (issue 7), then a table.

    .venv/bin/python bench/load.py [--clients 64] [--seconds 60] [--max-tokens 32]
    .venv/bin/python bench/load.py --base-url http://host:8000/v1 --api-key sk-tks-... [...]

By default it starts the real server itself: `tokenshop migrate` and `tokenshop serve` in
subprocesses, on a free loopback port, with a fresh SQLite database in a temporary directory and
one funded key per client (made with the billing functions, as `tokenshop keys issue` does), so
the per-key concurrency limit does not turn the load into 429s. With `--base-url` it drives an
existing server with the keys given (repeat `--api-key`, or separate them with commas).

Every client is the official `openai` SDK (no retries, so every failure is counted) streaming
`stream_options.include_usage` completions back to back. The table: requests done, errors by
status, p50/p95/p99 time to first token and latency, completion tokens per second over the
wall time, and the server's resident memory before and after (from /proc, when it is ours).

`tests/api/test_load.py` runs the same driver (`drive`), bounded, and checks the books.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/load.py` from anywhere
    sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Tell me a story about a lighthouse.",
    "List three uses of a paperclip.",
    "What is the capital of the moon?",
    "Explain continuous batching to a child.",
]


@dataclass(frozen=True)
class Outcome:
    """One request as its client saw it."""

    status: int  # 200, an HTTP error status, or 0 for a connection failure / timeout
    latency: float  # seconds from sending to the end of the stream (or the error)
    first_token: float | None  # seconds to the first content chunk
    prompt_tokens: int = 0  # from the usage chunk
    completion_tokens: int = 0
    error: str | None = None
    client: int = -1  # which client sent it (client i uses key i mod len(keys))


@dataclass
class LoadResult:
    """All the outcomes of a run, and the figures the table shows."""

    clients: int
    elapsed: float
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> list[Outcome]:
        return [outcome for outcome in self.outcomes if outcome.status == 200]

    def errors(self) -> Counter[int]:
        return Counter(outcome.status for outcome in self.outcomes if outcome.status != 200)

    def billed_tokens(self) -> int:
        """What the clients were told they used: the sum of every usage chunk."""
        return sum(o.prompt_tokens + o.completion_tokens for o in self.outcomes)

    def table(self, rss_before: int | None = None, rss_after: int | None = None) -> str:
        ok = self.ok
        completion = sum(o.completion_tokens for o in ok)
        ttft = [o.first_token for o in ok if o.first_token is not None]
        latency = [o.latency for o in ok]
        errors = ", ".join(
            f"{status or 'conn'}: {n}" for status, n in sorted(self.errors().items())
        )
        rows = [
            ("clients", f"{self.clients}"),
            ("wall time", f"{self.elapsed:.1f} s"),
            ("requests done (200)", f"{len(ok)}"),
            ("errors by status", errors or "none"),
            ("time to first token p50 / p95 / p99", _percentiles(ttft)),
            ("latency p50 / p95 / p99", _percentiles(latency)),
            ("completion tokens", f"{completion}"),
            ("completion tokens/s (aggregate)", f"{completion / self.elapsed:.1f}"),
            ("requests/s", f"{len(ok) / self.elapsed:.2f}"),
        ]
        if rss_before is not None and rss_after is not None:
            rows.append(("server RSS before / after", f"{_mib(rss_before)} / {_mib(rss_after)}"))
        width = max(len(name) for name, _ in rows)
        lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|---:|"]
        lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
        return "\n".join(lines)


def _percentiles(values: Sequence[float]) -> str:
    if len(values) < 2:
        return "n/a"
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return " / ".join(f"{cuts[p - 1]:.2f}" for p in (50, 95, 99)) + " s"


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


async def stream_once(
    client: openai.AsyncOpenAI, *, model: str, prompt: str, max_tokens: int, index: int = -1
) -> Outcome:
    """One streaming completion, timed; an HTTP error or a dropped connection is an outcome."""
    started = time.perf_counter()
    first: float | None = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        prompt_tokens = completion_tokens = 0
        async for chunk in stream:
            if first is None and any(choice.delta.content for choice in chunk.choices):
                first = time.perf_counter() - started
            if chunk.usage is not None:
                prompt_tokens = chunk.usage.prompt_tokens
                completion_tokens = chunk.usage.completion_tokens
    except openai.APIStatusError as error:
        elapsed = time.perf_counter() - started
        return Outcome(error.status_code, elapsed, first, error=str(error), client=index)
    except (openai.APIConnectionError, openai.APITimeoutError) as error:
        elapsed = time.perf_counter() - started
        return Outcome(0, elapsed, first, error=repr(error), client=index)
    elapsed = time.perf_counter() - started
    return Outcome(200, elapsed, first, prompt_tokens, completion_tokens, client=index)


async def drive(
    base_url: str,
    keys: Sequence[str],
    *,
    clients: int,
    seconds: float | None = None,
    requests: int | None = None,
    model: str = "demo",
    max_tokens: int = 32,
    timeout: float = 120,
) -> LoadResult:
    """`clients` concurrent clients, client i using key i mod len(keys), each sending requests
    back to back until `seconds` have passed or `requests` have been sent in all."""
    if (seconds is None) == (requests is None):
        raise ValueError("give exactly one of seconds and requests")
    deadline = time.perf_counter() + seconds if seconds is not None else None
    budget = [requests or 0]
    result = LoadResult(clients=clients, elapsed=0.0)

    def another() -> bool:
        if deadline is not None:
            return time.perf_counter() < deadline
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        return True

    async def client_loop(index: int) -> None:
        async with openai.AsyncOpenAI(
            base_url=base_url,
            api_key=keys[index % len(keys)],
            max_retries=0,
            timeout=timeout,
        ) as client:
            sent = 0
            while another():
                prompt = PROMPTS[(index + sent) % len(PROMPTS)]
                outcome = await stream_once(
                    client, model=model, prompt=prompt, max_tokens=max_tokens, index=index
                )
                result.outcomes.append(outcome)
                sent += 1

    started = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    result.elapsed = time.perf_counter() - started
    return result


# The server this script starts, when no --base-url is given.


@dataclass
class ServerProcess:
    base_url: str
    keys: list[str]
    process: subprocess.Popen[bytes]
    log: Path

    def rss(self) -> int:
        """Resident memory of the server process, in bytes, from /proc/<pid>/status."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS line")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fund_keys(database_url: str, secret_key: str, count: int, tokens: int) -> list[str]:
    """`count` accounts with `tokens` each and a key each, through the billing functions."""
    from billing import accounts, keys, ledger
    from billing.db import make_engine, session_scope

    engine = make_engine(database_url)
    made = []
    try:
        with session_scope(engine) as session:
            for n in range(count):
                account = accounts.create_account(session=session, name=f"load-{n}")
                assert account.id is not None
                ledger.grant(session=session, account_id=account.id, tokens=tokens)
                key, _ = keys.ensure_key(
                    session=session, account_id=account.id, secret_key=secret_key.encode()
                )
                made.append(key)
    finally:
        engine.dispose()
    return made


@contextmanager
def local_server(
    keys_wanted: int,
    tokens: int,
    *,
    models: str = f"demo={ROOT / 'models' / 'demo'}",
    settings: dict[str, str] | None = None,
    ready_within: float = 120,
) -> Iterator[ServerProcess]:
    """`tokenshop serve` on a free port, a fresh SQLite database, `models` (`MODELS`'s form;
    default the demo model) and any other `settings` as environment variables."""
    tokenshop = Path(sys.executable).with_name("tokenshop")
    with tempfile.TemporaryDirectory(prefix="tokenshop-load-") as tmp:
        database_url = f"sqlite:///{Path(tmp) / 'load.db'}"
        secret_key = secrets.token_urlsafe(48)
        env = os.environ | {
            "DATABASE_URL": database_url,
            "SECRET_KEY": secret_key,
            "MODELS": models,
            **(settings or {}),
        }
        subprocess.run(
            [str(tokenshop), "migrate"], env=env, cwd=ROOT, check=True, capture_output=True
        )
        keys = fund_keys(database_url, secret_key, keys_wanted, tokens)
        port = _free_port()
        log = Path(tmp) / "server.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(tokenshop), "serve", "--port", str(port)],
                env=env,
                cwd=tmp,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = ServerProcess(f"http://127.0.0.1:{port}/v1", keys, process, log)
        try:
            _wait_ready(server, within=ready_within)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(server: ServerProcess, within: float = 120) -> None:
    deadline = time.monotonic() + within
    ready = server.base_url.removesuffix("/v1") + "/ready"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{server.log.read_text()[-3000:]}")
        try:
            if httpx.get(ready, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--base-url", help="drive this server instead of starting one")
    parser.add_argument("--api-key", action="append", default=[], help="with --base-url")
    args = parser.parse_args(argv)

    if args.base_url:
        keys = [k for given in args.api_key for k in given.split(",") if k.strip()]
        if not keys:
            parser.error("--base-url needs --api-key")
        result = asyncio.run(
            drive(
                args.base_url,
                keys,
                clients=args.clients,
                seconds=args.seconds,
                model=args.model,
                max_tokens=args.max_tokens,
            )
        )
        print(result.table())
        return 0

    with local_server(args.clients, tokens=100_000_000) as server:
        before = server.rss()
        result = asyncio.run(
            drive(
                server.base_url,
                server.keys,
                clients=args.clients,
                seconds=args.seconds,
                model=args.model,
                max_tokens=args.max_tokens,
            )
        )
        after = server.rss()
    print(f"{args.clients} clients x {args.seconds:g} s, max_tokens {args.max_tokens}, demo model")
    print(result.table(before, after))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
