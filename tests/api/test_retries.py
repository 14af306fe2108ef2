"""The official `openai` SDK with its default retries (2) against failures before generation:
the retried request is billed once and the failed attempts cost nothing; an empty balance is
tried once, not three times.

Failures are injected from outside the API: a reverse proxy in front of it answers chosen
attempts itself (5xx, or no answer until the client's timeout), and an engine handed to
`create_app` refuses chosen requests after their hold was placed, as a full queue does. The
proxy counts the attempts that really reached it, whatever the SDK reports."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from billing import ledger
from billing.db import reading
from billing.models import Hold, LedgerEntry
from tests.api.conftest import DEMO_MODEL, LiveServer
from tests.faults import FaultyProxy, RefusingEngine, ThreadedServer, demo_engine

PROMPT = [{"role": "user", "content": "Hello!"}]
CHAT = "/v1/chat/completions"


@pytest.fixture
def server(start_server) -> LiveServer:
    return start_server()


@pytest.fixture
def proxy(server: LiveServer) -> Iterator[tuple[FaultyProxy, str]]:
    """The faulty proxy in front of the server, and the base URL a client should use."""
    faulty = FaultyProxy(f"http://127.0.0.1:{server.port}", hang_seconds=3)
    with ThreadedServer(faulty) as running:
        yield faulty, f"http://127.0.0.1:{running.port}/v1"


def sdk(base_url: str, key: str, **options: object) -> openai.OpenAI:
    """The SDK as a user has it: default retries (2) and backoff."""
    return openai.OpenAI(base_url=base_url, api_key=key, **options)  # type: ignore[arg-type]


def ask(client: openai.OpenAI, *, stream: bool) -> dict[str, int]:
    """One chat completion; the usage the client was told."""
    if not stream:
        reply = client.chat.completions.create(model="demo", messages=PROMPT, max_tokens=12)  # type: ignore[arg-type]
        assert reply.usage is not None
        return reply.usage.model_dump()
    usage = None
    for chunk in client.chat.completions.create(
        model="demo",
        messages=PROMPT,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    ):
        usage = chunk.usage or usage
    assert usage is not None
    return usage.model_dump()


def books(db: Engine) -> tuple[list[LedgerEntry], list[Hold]]:
    with Session(reading(db), expire_on_commit=False) as session:
        entries = session.exec(select(LedgerEntry).where(col(LedgerEntry.kind) == "usage"))
        return list(entries), list(session.exec(select(Hold)))


def audit(db: Engine) -> list[str]:
    with Session(reading(db)) as session:
        return ledger.audit(session=session)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_server_errors_before_the_api_are_retried_and_billed_once(
    proxy, make_funded_key, engine: Engine, stream: bool
) -> None:
    faulty, base_url = proxy
    faulty.fail_next("502", "503")
    with sdk(base_url, make_funded_key(10_000)) as client:
        usage = ask(client, stream=stream)

    assert faulty.tried(CHAT) == 3 and faulty.forwarded(CHAT) == 1
    (entry,), (hold,) = books(engine)
    assert hold.state == "settled" and entry.request_id == hold.id
    assert -entry.amount == usage["total_tokens"]
    assert audit(engine) == []


def test_a_timed_out_attempt_is_retried_and_billed_once(
    proxy, make_funded_key, engine: Engine
) -> None:
    faulty, base_url = proxy
    faulty.fail_next("hang")
    with sdk(base_url, make_funded_key(10_000), timeout=1.0) as client:
        usage = ask(client, stream=False)

    assert faulty.tried(CHAT) == 2 and faulty.forwarded(CHAT) == 1
    (entry,), (hold,) = books(engine)
    assert hold.state == "settled"
    assert -entry.amount == usage["total_tokens"]
    assert audit(engine) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_refusal_after_the_hold_is_retried_and_the_refused_attempts_cost_nothing(
    start_server, make_funded_key, engine: Engine, stream: bool
) -> None:
    refusing = RefusingEngine(demo_engine(str(DEMO_MODEL)))
    server = start_server(engines={"demo": refusing})
    refusing.refuse(2)
    with sdk(server.base_url, make_funded_key(10_000)) as client:
        usage = ask(client, stream=stream)

    assert refusing.refused == 2
    entries, holds = books(engine)
    assert sorted(h.state for h in holds) == ["released", "released", "settled"]
    # the released holds left a zero entry each: nothing was charged for them
    assert sorted(-e.amount for e in entries) == [0, 0, usage["total_tokens"]]
    assert audit(engine) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_empty_balance_is_answered_once_and_not_retried(
    proxy, make_funded_key, engine: Engine, stream: bool
) -> None:
    faulty, base_url = proxy
    with sdk(base_url, make_funded_key(3)) as client, pytest.raises(openai.RateLimitError) as err:
        ask(client, stream=stream)

    assert err.value.status_code == 429
    assert err.value.code == "insufficient_quota"
    assert faulty.tried(CHAT) == 1  # the SDK did not retry
    assert books(engine) == ([], [])
