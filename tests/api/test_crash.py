"""A server killed (SIGKILL) in the middle of generations, then started again: the holds it
left are resolved before the new process serves, each killed request is billed its last
checkpoint, no purchase or usage entry is lost or doubled, and `tokenshop audit` passes.

The server runs as operators run it, `python -m uvicorn api.main:app_from_environment
--factory` configured by the environment, so the kill is a real process death: no `finally`,
no shutdown hook. Holds expire `HOLD_TTL_SECONDS` after their last checkpoint; the test uses
3 s so the holds of the dead process expire quickly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from billing.db import reading
from billing.models import Hold, LedgerEntry, utcnow
from tests.api.conftest import DEMO_MODEL, ROOT, free_port
from tests.conftest import TEST_SECRET_KEY
from tests.factories import make_account, make_key, make_purchase
from tests.faults import GatedEngine, demo_engine, poll

STREAMS = 3
PROMPT = [{"role": "user", "content": "Tell me a long story."}]


@contextmanager
def api_process(database_url: str, workdir: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """The API in its own process, ready to serve; killed at the end if still alive."""
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "SECRET_KEY": TEST_SECRET_KEY,
        "MODELS": f"demo={DEMO_MODEL}",
        "HOLD_TTL_SECONDS": "3",
        "CHECKPOINT_SECONDS": "0.2",
        "SWEEP_SECONDS": "0.5",
    }
    log = (workdir / f"api-{port}.log").open("wb")  # a file: a full pipe would stall it
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api.main:app_from_environment", "--factory"]
        + ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=workdir,  # no stray .env is read
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        poll(lambda: _ready(base) or process.poll() is not None, within=60, what="the API started")
        assert process.poll() is None, (workdir / f"api-{port}.log").read_text()
        yield process, base
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        log.close()


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


class Stream(threading.Thread):
    """A streaming request that counts the tokens it receives, until the server dies."""

    def __init__(self, base: str, key: str) -> None:
        super().__init__(daemon=True)
        self.base, self.key = base, key
        self.chat_id = ""
        self.received = 0
        self.finished = False

    def run(self) -> None:
        body = {
            "model": "demo",
            "messages": PROMPT,
            "max_tokens": 2000,
            "temperature": 0,
            "logprobs": True,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.key}"}
        try:
            with httpx.stream(
                "POST", f"{self.base}/v1/chat/completions", json=body, headers=headers, timeout=60
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        self.chat_id = chunk["id"]
                        for choice in chunk["choices"]:
                            content = (choice.get("logprobs") or {}).get("content") or []
                            self.received += len(content)
                    elif line == "data: [DONE]":
                        self.finished = True
        except httpx.TransportError:
            pass  # the server died under us: what this test is about


def short_answer(base: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "demo", "messages": PROMPT, "max_tokens": 8},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def holds(db: Engine) -> dict[str, Hold]:
    with Session(reading(db), expire_on_commit=False) as session:
        return {h.id: h for h in session.exec(select(Hold))}


def entries(db: Engine) -> list[LedgerEntry]:
    with Session(reading(db), expire_on_commit=False) as session:
        return list(session.exec(select(LedgerEntry).order_by(col(LedgerEntry.id))))


def audit_cli(database_url: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("tokenshop")), "audit"],
        cwd=workdir,
        env={
            "PATH": os.environ.get("PATH", ""),
            "DATABASE_URL": database_url,
            "SECRET_KEY": TEST_SECRET_KEY,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow  # two server processes, one killed mid-stream
def test_a_killed_server_leaves_nothing_open_after_a_restart(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer)
        for _ in range(2):
            make_purchase(writer, account, tokens=20_000)
        key = make_key(writer, account, secret_key=secret_key)
    before = entries(engine)

    with api_process(database_url, tmp_path) as (process, base):
        finished = short_answer(base, key)
        assert finished.status_code == 200
        streams = [Stream(base, key) for _ in range(STREAMS)]
        for stream in streams:
            stream.start()
        # kill once every stream is generating and has checkpointed its usage at least once
        poll(
            lambda: (
                all(s.received > 20 for s in streams)
                and sum(h.state == "held" and h.used > 0 for h in holds(engine).values()) == STREAMS
            ),
            within=30,
            what="every stream generating and checkpointed",
        )
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        for stream in streams:
            stream.join(timeout=30)

    assert not any(s.finished for s in streams), "a stream ended before the kill"
    left = {hold_id: hold for hold_id, hold in holds(engine).items() if hold.state == "held"}
    assert set(left) == {s.chat_id for s in streams}
    # each checkpoint covers the prompt and some of what its client had received
    assert all(hold.used > 0 for hold in left.values())

    # start again once the dead process's holds have expired: they are resolved before it serves
    latest = max(hold.expires_at for hold in left.values())
    poll(lambda: _naive(utcnow()) > _naive(latest), within=10, what="the holds expired")
    with api_process(database_url, tmp_path) as (_, base):
        after = holds(engine)
        assert all(after[hold_id].state == "settled" for hold_id in left)
        again = short_answer(base, key)
        assert again.status_code == 200

    # the books: the purchases as they were, one usage entry per request, each killed request
    # billed exactly its last checkpoint
    final = entries(engine)
    assert purchases(final) == purchases(before) and len(purchases(final)) == 2
    usage = [e for e in final if e.kind == "usage"]
    assert sorted(e.request_id or "" for e in usage) == sorted(
        [finished.json()["id"], again.json()["id"], *left]
    )
    for entry in usage:
        if entry.request_id in left:
            assert -entry.amount == left[entry.request_id].used
    result = audit_cli(database_url, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "audit: ok" in result.stdout


def purchases(rows: list[LedgerEntry]) -> list[tuple[int | None, int, int | None]]:
    return [(e.id, e.amount, e.purchase_id) for e in rows if e.kind == "purchase"]


def _naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


def test_the_sweeper_leaves_a_live_request_alone_however_long_it_waits(
    start_server, make_funded_key, engine: Engine
) -> None:
    """The other side of the start-up sweep: a hold expires only when its process stopped
    checkpointing. A request that waits with nothing to show for longer than the hold TTL is
    still alive, keeps its hold, and is billed in full for what it then generates."""
    gated = GatedEngine(demo_engine(str(DEMO_MODEL)))
    ttl, sweep = 2, 0.2
    server = start_server(
        engines={"demo": gated}, hold_ttl_seconds=ttl, checkpoint_seconds=0.2, sweep_seconds=sweep
    )
    key = make_funded_key(100_000)
    answers: list[httpx.Response] = []
    asker = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                f"{server.base_url}/chat/completions",
                json={"model": "demo", "messages": PROMPT, "max_tokens": 50},
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
        )
    )
    asker.start()
    poll(lambda: len(holds(engine)) == 1, within=30, what="the hold placed")
    (placed,) = holds(engine).values()
    # wait until its first expiry is well past, and the sweeper has run several times since
    past = _naive(placed.expires_at) + timedelta(seconds=3 * sweep)
    poll(lambda: _naive(utcnow()) > past, within=30, what="the first expiry passed")
    gated.gate.set()
    asker.join(timeout=60)

    (answer,) = answers
    assert answer.status_code == 200
    (entry,) = [e for e in entries(engine) if e.kind == "usage"]
    assert entry.request_id == answer.json()["id"]
    assert -entry.amount == answer.json()["usage"]["total_tokens"]
    assert [hold.state for hold in holds(engine).values()] == ["settled"]
