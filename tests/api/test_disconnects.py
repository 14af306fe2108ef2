"""Clients that hang up mid-stream: generation stops within 1 s, every hold is resolved within
2 s, each request is billed its prompt plus the tokens generated before the server saw the
hang-up, nothing stays in the batch, and a client streaming alongside gets its whole answer.

The clients are raw httpx streams, so the test decides the exact moment each one hangs up. They
ask for `logprobs`, which makes the server send one chunk per generated token (a token whose
text is still held back, as part of a UTF-8 character, still gets its chunk): the client then
knows exactly how many tokens it received."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from api.engine.protocol import EngineClient, GenerationOutput, GenerationRequest
from billing.db import reading
from billing.models import Hold, LedgerEntry
from tests.api.conftest import DEMO_MODEL
from tests.faults import DelegatingEngine, demo_engine

pytestmark = pytest.mark.anyio

CLIENTS = 200
WAVE = 25  # clients streaming at once
MOST_CHUNKS = 40  # each hangs up after 1..MOST_CHUNKS tokens (seeded)
STOP_WITHIN = 1.0  # seconds from a hang-up until its sequence has left the batch
SETTLE_WITHIN = 2.0  # seconds from a hang-up until its hold is settled or released
LONG = 2000  # max_tokens: at temperature 0 the demo model never says EOS this soon
PROMPT = [{"role": "user", "content": "Tell me a long story."}]


@dataclass
class Trace:
    """What the engine handed the serving layer for one request, and when it was stopped."""

    pulled: list[tuple[float, int]] = field(default_factory=list)  # (when, tokens so far)
    closed_at: float | None = None

    def tokens_by(self, moment: float) -> int:
        return max([0] + [tokens for at, tokens in self.pulled if at <= moment])

    @property
    def tokens(self) -> int:
        return self.pulled[-1][1] if self.pulled else 0


class WatchedEngine(DelegatingEngine):
    """Records, per request, each output the serving layer takes from the engine and when it
    closes the stream (which aborts the sequence). Runs in the server's event loop, in this
    process, so its clock is the test's."""

    def __init__(self, inner: EngineClient) -> None:
        super().__init__(inner)
        self.traces: dict[str, Trace] = {}

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        trace = self.traces.setdefault(request.request_id, Trace())
        return _Watched(self.inner.generate(request), trace)


class _Watched:
    def __init__(self, stream: AsyncIterator[GenerationOutput], trace: Trace) -> None:
        self.stream, self.trace = stream, trace

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> GenerationOutput:
        output = await self.stream.__anext__()
        self.trace.pulled.append((time.monotonic(), output.completion_tokens))
        return output

    async def aclose(self) -> None:
        if self.trace.closed_at is None:
            self.trace.closed_at = time.monotonic()
        await self.stream.aclose()  # type: ignore[attr-defined]


@dataclass
class Dropped:
    chat_id: str
    received: int  # tokens the client got before hanging up
    dropped_at: float


def long_stream(**options: object) -> dict:
    """A streamed greedy request far longer than any client here waits for; `logprobs` gives
    one entry per token, so a client counts tokens exactly."""
    return {
        "model": "demo",
        "messages": PROMPT,
        "max_tokens": LONG,
        "temperature": 0,
        "logprobs": True,
        "stream": True,
        **options,
    }


async def stream_then_hang_up(http: httpx.AsyncClient, key: str, tokens: int) -> Dropped:
    """Stream until `tokens` tokens have arrived, then close the connection."""
    body = long_stream()
    headers = {"Authorization": f"Bearer {key}"}
    chat_id, received, buffer = "", 0, b""
    async with http.stream("POST", "/chat/completions", json=body, headers=headers) as response:
        assert response.status_code == 200
        async for data in response.aiter_raw():
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                if not chat_id and event.startswith(b"data: {"):
                    chat_id = json.loads(event[6:])["id"]
                # one logprob entry per token, each with its own "top_logprobs" list; counted
                # without parsing, so 25 clients in the server's process take little of its CPU
                received += event.count(b'"top_logprobs":')
            if received >= tokens:
                break
        dropped_at = time.monotonic()
    return Dropped(chat_id, received, dropped_at)


async def stream_to_the_end(http: httpx.AsyncClient, key: str) -> dict:
    """An undisturbed client: the whole answer, its finish reason and its usage."""
    body = {
        "model": "demo",
        "messages": PROMPT,
        "max_tokens": LONG,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {key}"}
    answer: dict = {"text": "", "finish_reason": None, "usage": None, "done": False}
    async with http.stream("POST", "/chat/completions", json=body, headers=headers) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                answer["done"] = True
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                answer["id"] = chunk["id"]
                answer["usage"] = chunk.get("usage") or answer["usage"]
                for choice in chunk["choices"]:
                    answer["text"] += choice["delta"].get("content") or ""
                    answer["finish_reason"] = choice.get("finish_reason") or answer["finish_reason"]
    return answer


async def wait_until(check, *, within: float, what: str) -> float:  # type: ignore[no-untyped-def]
    """Poll `check()` (run in a thread: it may read the database) until true; seconds taken."""
    started = time.monotonic()
    while not await asyncio.to_thread(check):
        if time.monotonic() - started > within:
            raise AssertionError(f"{what}: not within {within} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def open_holds(db: Engine, ignore: set[str]) -> int:
    with Session(reading(db)) as session:
        query = select(func.count()).select_from(Hold).where(col(Hold.state) == "held")
        if ignore:
            query = query.where(col(Hold.id).not_in(ignore))
        return int(session.exec(query).one())


def usage_entries(db: Engine, chat_ids: list[str]) -> dict[str, list[LedgerEntry]]:
    with Session(reading(db), expire_on_commit=False) as session:
        rows = session.exec(select(LedgerEntry).where(col(LedgerEntry.request_id).in_(chat_ids)))
        found: dict[str, list[LedgerEntry]] = {}
        for row in rows:
            found.setdefault(row.request_id or "", []).append(row)
        return found


@pytest.mark.slow  # waves of clients hanging up mid-stream: tens of seconds
async def test_clients_that_hang_up_stop_generation_and_pay_for_what_was_generated(
    start_server, make_funded_key, engine
) -> None:
    watched = WatchedEngine(demo_engine(str(DEMO_MODEL), max_active_sequences=WAVE + 1))
    server = start_server(engines={"demo": watched})
    demo = server.services.engines["demo"]
    # many buyers, one stream each per wave, as 200 clients usually are; one buyer with 25
    # streams at once works too, but their settlements queue on that account's row lock
    key = make_funded_key(100_000)
    buyers = [make_funded_key(100_000) for _ in range(WAVE)]
    rng = random.Random(20261121)
    dropped: list[Dropped] = []
    stop_times: list[float] = []
    settle_times: list[float] = []

    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        control = asyncio.create_task(stream_to_the_end(http, key))
        while not any(not t.closed_at and t.pulled for t in watched.traces.values()):
            await asyncio.sleep(0.01)  # the undisturbed client is generating
        control_id = next(iter(watched.traces)).removesuffix("-0")

        for _ in range(CLIENTS // WAVE):
            wave = await asyncio.gather(
                *(stream_then_hang_up(http, buyer, rng.randint(1, MOST_CHUNKS)) for buyer in buyers)
            )
            dropped.extend(wave)
            last = max(d.dropped_at for d in wave)
            # polled from the moment the last of the wave hung up
            await wait_until(
                lambda: demo.stats().active_sequences <= (0 if control.done() else 1),
                within=STOP_WITHIN,
                what="the dropped sequences left the batch",
            )
            stop_times.append(time.monotonic() - last)
            await wait_until(
                lambda: open_holds(engine, {control_id}) == 0,
                within=SETTLE_WITHIN,
                what="every dropped request's hold resolved",
            )
            settle_times.append(time.monotonic() - last)
        answer = await control

    # Each request stopped within 1 s of its hang-up (its stream was closed, which aborts the
    # sequence at the engine's next step), and is billed once: its prompt plus every token the
    # engine made for it, which is at least what the client received and at most what was made
    # by the time the server stopped it.
    entries = usage_entries(engine, [d.chat_id for d in dropped] + [control_id])
    for d in dropped:
        trace = watched.traces[f"{d.chat_id}-0"]
        assert trace.closed_at is not None
        assert trace.closed_at - d.dropped_at <= STOP_WITHIN
        (entry,) = entries[d.chat_id]
        assert entry.completion_tokens == trace.tokens
        assert d.received <= entry.completion_tokens <= trace.tokens_by(trace.closed_at) + 1
        assert -entry.amount == entry.prompt_tokens + entry.completion_tokens  # type: ignore[operator]

    # the batch is empty and nothing is held
    assert demo.stats().active_sequences == demo.stats().queued_sequences == 0
    assert open_holds(engine, set()) == 0

    # the client that stayed got its whole answer, billed as its usage said
    assert answer["done"] and answer["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == LONG
    (control_entry,) = entries[control_id]
    assert -control_entry.amount == answer["usage"]["total_tokens"]

    late = [trace_lag(watched, d) for d in dropped]
    print(
        f"\nstop after hang-up: max {max(late):.3f} s; batch empty after a wave: max "
        f"{max(stop_times):.3f} s; holds resolved after a wave: max {max(settle_times):.3f} s; "
        f"billed beyond received: max {max(extra(entries, d) for d in dropped)} tokens; "
        f"generated between hang-up and stop: max {max(after_hang_up(watched, d) for d in dropped)}"
    )


def trace_lag(watched: WatchedEngine, d: Dropped) -> float:
    closed = watched.traces[f"{d.chat_id}-0"].closed_at
    return (closed or d.dropped_at) - d.dropped_at


def after_hang_up(watched: WatchedEngine, d: Dropped) -> int:
    trace = watched.traces[f"{d.chat_id}-0"]
    return trace.tokens - trace.tokens_by(d.dropped_at)


def extra(entries: dict[str, list[LedgerEntry]], d: Dropped) -> int:
    return (entries[d.chat_id][0].completion_tokens or 0) - d.received


async def test_a_client_that_stops_reading_then_hangs_up_stops_its_generation(
    start_server, make_funded_key, engine
) -> None:
    """The server is stuck writing to a client that reads nothing (its buffers are full) when
    the client hangs up: the answer's generator never resumes, yet generation stops and the
    hold is settled for what was made."""
    watched = WatchedEngine(demo_engine(str(DEMO_MODEL)))
    server = start_server(engines={"demo": watched})
    demo = server.services.engines["demo"]
    key = make_funded_key(1_000_000)
    # about 1.5 kB a token: the socket buffers fill long before the end
    body = long_stream(top_logprobs=20)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        async with http.stream(
            "POST", "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            assert response.status_code == 200
            raw = response.aiter_raw()  # kept: dropping it would close the connection
            first = await raw.__anext__()
            chat_id = json.loads(first.split(b"\n\n")[0][6:])["id"]
            trace = watched.traces[f"{chat_id}-0"]
            await wait_until(lambda: trace.tokens >= 400, within=30, what="generation ran ahead")
        dropped_at = time.monotonic()

    await wait_until(lambda: trace.closed_at is not None, within=STOP_WITHIN, what="stopped")
    await wait_until(
        lambda: demo.stats().active_sequences == 0, within=STOP_WITHIN, what="left the batch"
    )
    await wait_until(
        lambda: open_holds(engine, set()) == 0, within=SETTLE_WITHIN, what="hold resolved"
    )
    assert trace.tokens < LONG  # it did not run to the end
    (entry,) = usage_entries(engine, [chat_id])[chat_id]
    assert entry.completion_tokens == trace.tokens
    print(f"\nstalled client: stopped {trace.closed_at - dropped_at:.3f} s after hanging up")  # type: ignore[operator]
