"""SIGTERM, as a platform stops a replica: `/ready` turns 503 at once, so the load balancer
sends nothing more; a request that still arrives gets 503 with `Retry-After`, to retry on
another replica; a stream already running finishes within SHUTDOWN_GRACE_SECONDS (or is cut
there and billed for what it got), and the process exits with its lease ended and nothing left
open in the books."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from billing.db import reading
from billing.models import ApiProcess, Hold
from tests.api.replicas import Replica, audit_cli, start, stop, wait_ready
from tests.factories import make_account, make_key
from tests.faults import poll

PROMPT = [{"role": "user", "content": "Tell me a long story."}]

pytestmark = pytest.mark.slow  # a model-serving process per test


class Stream(threading.Thread):
    """A client that reads a few events, then stops reading until `resume` is set: with 20 top
    logprobs per token its 2,000 events outgrow the socket buffers, so the stream is surely
    still running on the server meanwhile (the demo model would otherwise finish it at once)."""

    def __init__(self, server: Replica, key: str) -> None:
        super().__init__(daemon=True)
        self.server, self.key = server, key
        self.resume = threading.Event()
        self.events = 0
        self.finish_reasons: list[str] = []
        self.done = False
        self.cut = False

    def run(self) -> None:
        body = {
            "model": "demo",
            "messages": PROMPT,
            "max_tokens": 2000,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 20,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST",
                f"{self.server.v1}/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {self.key}"},
                timeout=60,
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        self.events += 1
                        if self.events == 5:
                            self.resume.wait(timeout=120)
                        if '"finish_reason":"' in line:
                            self.finish_reasons.append(line.split('"finish_reason":"')[1][:6])
                    elif line == "data: [DONE]":
                        self.done = True
        except httpx.TransportError:
            self.cut = True


def funded_key(engine: Engine, secret_key: bytes) -> str:
    with Session(engine, expire_on_commit=False) as writer:
        return make_key(writer, make_account(writer, tokens=1_000_000), secret_key=secret_key)


def books_closed(engine: Engine) -> None:
    with Session(reading(engine)) as session:
        assert [h for h in session.exec(select(Hold)) if h.state == "held"] == []
        (lease,) = session.exec(select(ApiProcess)).all()
        assert lease.stopped_at is not None  # ended at exit, not left to lapse


def test_sigterm_turns_ready_503_refuses_new_requests_and_lets_a_stream_finish(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    key = funded_key(engine, secret_key)
    server = start(database_url, tmp_path, "web.1", SHUTDOWN_GRACE_SECONDS="60")
    try:
        wait_ready(server)
        stream = Stream(server, key)
        stream.start()
        poll(lambda: stream.events >= 5, within=60, what="the stream generating")

        server.process.send_signal(signal.SIGTERM)
        poll(
            lambda: httpx.get(f"{server.base}/ready", timeout=5).status_code == 503,
            within=5,
            what="/ready 503",
        )
        refused = httpx.post(
            f"{server.v1}/chat/completions",
            json={"model": "demo", "messages": PROMPT, "max_tokens": 4},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "service_unavailable"
        assert not stream.done  # the running stream was not cut by any of that

        stream.resume.set()
        stream.join(timeout=120)
        server.process.wait(timeout=60)
    finally:
        stop(server)

    assert stream.done and not stream.cut
    assert stream.finish_reasons == ["length"]  # it ran to its max_tokens
    books_closed(engine)
    audit = audit_cli(database_url, tmp_path)
    assert audit.returncode == 0 and "audit: ok" in audit.stdout, audit.stdout + audit.stderr


def test_a_stream_longer_than_the_grace_is_cut_there_and_billed_for_what_it_got(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    key = funded_key(engine, secret_key)
    server = start(database_url, tmp_path, "web.1", SHUTDOWN_GRACE_SECONDS="1")
    try:
        wait_ready(server)
        stream = Stream(server, key)
        stream.start()
        poll(lambda: stream.events >= 5, within=60, what="the stream generating")
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=60)
        stream.resume.set()
        stream.join(timeout=60)
    finally:
        stop(server)

    assert not stream.done and not stream.finish_reasons  # cut before its end
    books_closed(engine)
    with Session(reading(engine)) as session:
        (hold,) = session.exec(select(Hold)).all()
        assert hold.state == "settled" and hold.used > 0  # what was generated is billed
    audit = audit_cli(database_url, tmp_path)
    assert audit.returncode == 0 and "audit: ok" in audit.stdout, audit.stdout + audit.stderr
