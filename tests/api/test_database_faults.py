"""The database out of reach for a moment: requests get clean 503s in OpenAI's shape with a
Retry-After, nothing is generated without a hold, /ready says 503, and the same server recovers
by itself. A stream whose settlement fails is billed in full once the database is back.

On PostgreSQL the server talks to the database through a TCP proxy that the test cuts (every
connection reset, new ones refused) and restores; the shared database server is never touched.
On SQLite another connection holds the database EXCLUSIVE for longer than the server's busy
timeout (set short through the URL's own `timeout` parameter), so every write fails with
"database is locked"."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from typing import Protocol

import httpx
import openai
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlmodel import Session, col, select

from billing import ledger
from billing.db import reading
from billing.models import Hold, LedgerEntry
from tests.faults import TcpProxy, poll

PROMPT = [{"role": "user", "content": "Tell me a long story."}]
LEAKS = ("Traceback", "sqlalchemy", "SELECT", "UPDATE", "psycopg", "sqlite3", "locked", "File ")


class Outage(Protocol):
    server_url: str

    def begin(self) -> None: ...

    def end(self) -> None: ...


class ProxyOutage:
    """PostgreSQL behind a TCP proxy that can be cut."""

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        self.proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
        self.server_url = url.set(host="127.0.0.1", port=self.proxy.port).render_as_string(
            hide_password=False
        )

    def begin(self) -> None:
        self.proxy.cut()

    def end(self) -> None:
        self.proxy.restore()

    def close(self) -> None:
        self.proxy.close()


class LockOutage:
    """SQLite held EXCLUSIVE by another connection; the server gives up after 0.3 s."""

    def __init__(self, database_url: str) -> None:
        self.path = make_url(database_url).database or ""
        self.server_url = f"{database_url}?timeout=0.3"
        self.holder: sqlite3.Connection | None = None

    def begin(self) -> None:
        self.holder = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        self.holder.execute("BEGIN EXCLUSIVE")

    def end(self) -> None:
        if self.holder is not None:
            self.holder.execute("ROLLBACK")
            self.holder.close()
            self.holder = None

    def close(self) -> None:
        self.end()


@pytest.fixture
def outage(database_url: str, engine: Engine) -> Iterator[Outage]:
    kind = ProxyOutage if make_url(database_url).get_backend_name() == "postgresql" else LockOutage
    made = kind(database_url)
    yield made
    made.close()


def post(base_url: str, key: str, **body: object) -> httpx.Response:
    body = {"model": "demo", "messages": PROMPT, "max_tokens": 16} | body
    return httpx.post(
        f"{base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def ready(base_url: str) -> int:
    return httpx.get(base_url.removesuffix("/v1") + "/ready", timeout=30).status_code


def usage_entries(db: Engine) -> list[LedgerEntry]:
    with Session(reading(db), expire_on_commit=False) as session:
        return list(session.exec(select(LedgerEntry).where(col(LedgerEntry.kind) == "usage")))


def hold_states(db: Engine) -> dict[str, str]:
    with Session(reading(db)) as session:
        return {h.id: h.state for h in session.exec(select(Hold))}


def audit(db: Engine) -> list[str]:
    with Session(reading(db)) as session:
        return ledger.audit(session=session)


def assert_clean_503(response: httpx.Response) -> None:
    """What OpenAI sends when it is down: a retryable server_error, in words for a human."""
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert error["message"] and error["message"][0].isupper()
    assert not any(leak in response.text for leak in LEAKS), response.text


def test_an_outage_gives_clean_503s_and_the_server_recovers_by_itself(
    start_server, make_funded_key, engine: Engine, outage: Outage
) -> None:
    server = start_server(database_url=outage.server_url)
    demo = server.services.engines["demo"]
    known, fresh = make_funded_key(100_000), make_funded_key(100_000)
    assert post(server.base_url, known).status_code == 200  # its key is now cached
    assert ready(server.base_url) == 200
    steps = demo.stats().steps

    outage.begin()
    try:
        for key in (known, fresh):  # a cached key gets as far as the hold, a fresh one not
            assert_clean_503(post(server.base_url, key))
            assert_clean_503(post(server.base_url, key, stream=True))
        sdk = openai.OpenAI(base_url=server.base_url, api_key=known, max_retries=0)
        with sdk, pytest.raises(openai.InternalServerError) as refused:
            sdk.chat.completions.create(model="demo", messages=PROMPT, max_tokens=8)  # type: ignore[arg-type]
        assert refused.value.status_code == 503
        assert ready(server.base_url) == 503
        # nothing was generated while no hold could be placed
        assert demo.stats().steps == steps
    finally:
        outage.end()

    # the same process recovers: ready again, then serving and billing as before
    poll(lambda: ready(server.base_url) == 200, within=10, what="/ready back to 200", every=0.1)
    for key in (known, fresh):
        answer = post(server.base_url, key)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] > 0
    entries = usage_entries(engine)
    assert len(entries) == 3  # the request before and the two after: one entry each
    assert all(-e.amount == e.prompt_tokens + e.completion_tokens for e in entries)  # type: ignore[operator]
    assert set(hold_states(engine).values()) == {"settled"}
    assert audit(engine) == []


def test_a_stream_whose_settlement_fails_is_billed_in_full_when_the_database_returns(
    start_server, make_funded_key, engine: Engine, outage: Outage
) -> None:
    server = start_server(database_url=outage.server_url, checkpoint_seconds=0.2)
    key = make_funded_key(100_000)
    body = {
        "model": "demo",
        "messages": PROMPT,
        "max_tokens": 600,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    lines: list[str] = []
    with httpx.stream(
        "POST",
        f"{server.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        try:
            for line in filter(None, response.iter_lines()):
                lines.append(line)
                if len(lines) == 20:  # mid-stream: cut the database
                    outage.begin()
            # the stream went on to the end: checkpoints failed quietly, the hold capped it
            events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
            assert lines[-1] == "data: [DONE]"
            assert not any("error" in e for e in events)
            usage = events[-1]["usage"]
            assert usage["completion_tokens"] == 600
            chat_id = events[-1]["id"]
            # settling ran before the usage chunk was sent, and could not land: still open
            assert hold_states(engine)[chat_id] == "held"
        finally:
            outage.end()

    # the server keeps trying and bills the whole generation once the database is back
    assert_billed_in_full(engine, chat_id, usage)


def test_an_answer_whose_settlement_fails_is_sent_and_billed_when_the_database_returns(
    start_server, make_funded_key, engine: Engine, outage: Outage
) -> None:
    server = start_server(database_url=outage.server_url, checkpoint_seconds=0.2)
    demo = server.services.engines["demo"]
    key = make_funded_key(100_000)
    steps = demo.stats().steps
    answers: list[httpx.Response] = []
    asker = threading.Thread(
        target=lambda: answers.append(post(server.base_url, key, max_tokens=600, temperature=0))
    )
    asker.start()
    try:
        poll(lambda: demo.stats().steps > steps + 20, within=30, what="generation under way")
        outage.begin()  # mid-generation
        asker.join(timeout=60)
        # the client gets its answer: it was generated, and it will be paid for
        (answer,) = answers
        assert answer.status_code == 200, answer.text
        usage, chat_id = answer.json()["usage"], answer.json()["id"]
        assert usage["completion_tokens"] == 600
        assert hold_states(engine)[chat_id] == "held"
    finally:
        outage.end()

    assert_billed_in_full(engine, chat_id, usage)


def assert_billed_in_full(engine: Engine, chat_id: str, usage: dict) -> None:
    """The request's hold settles once the database is back, for exactly what the client was
    told it used, and the books balance."""
    poll(
        lambda: hold_states(engine)[chat_id] == "settled",
        within=10,
        what=f"the hold of {chat_id} settled",
        every=0.1,
    )
    (entry,) = usage_entries(engine)
    assert entry.request_id == chat_id
    assert entry.completion_tokens == usage["completion_tokens"]
    assert -entry.amount == usage["total_tokens"]
    assert audit(engine) == []


def test_a_database_that_stops_answering_gives_503s_not_hung_requests(
    start_server, make_funded_key, database_url: str, engine: Engine
) -> None:
    """A host that accepts connections and never answers (not a refusal): the connect
    timeout (1 s here, through the URL; 5 s by default) turns it into a 503 too."""
    if make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("a network fault: SQLite has no network (the lock test covers it)")
    outage = ProxyOutage(database_url)
    try:
        url = make_url(outage.server_url)
        server_url = url.update_query_dict({"connect_timeout": "1"}).render_as_string(
            hide_password=False
        )
        server = start_server(database_url=server_url)
        key = make_funded_key(10_000)
        assert post(server.base_url, key).status_code == 200
        outage.proxy.cut(silent=True)
        try:
            assert_clean_503(post(server.base_url, key))
            assert ready(server.base_url) == 503
        finally:
            outage.end()
        poll(lambda: ready(server.base_url) == 200, within=10, what="/ready back", every=0.1)
        assert post(server.base_url, key).status_code == 200
        assert audit(engine) == []
    finally:
        outage.close()
