"""Requests sent together reach the engine together: before placing a request's hold, the API
tells the engine the request is on its way, so an idle engine can wait for a burst's stragglers
and prefill their prompts in one call. Every such notice must be closed once the request is
submitted or turned away, whatever turned it away: a notice left open would make every later
prefill from an idle batch sit out the engine's whole wait. And a burst's requests that carry one
key the server has not cached share one read of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import openai
import pytest
from sqlalchemy import event as sql_event

from api.engine.protocol import EngineClient, GenerationOutput, GenerationRequest
from tests.api.conftest import DEMO_MODEL
from tests.faults import RefusingEngine, demo_engine

MESSAGES = [{"role": "user", "content": "Say something."}]


class ArrivalLog(RefusingEngine):
    """Logs, in order, each notice that a request is on its way, each submission, and each
    notice closed."""

    def __init__(self, inner: EngineClient) -> None:
        super().__init__(inner)
        self.log: list[tuple[str, int | str]] = []
        self.expected = 0

    def expect(self) -> Callable[[], None]:
        number = self.expected = self.expected + 1
        self.log.append(("expect", number))
        arrived = self.inner.expect()

        def logged() -> None:
            self.log.append(("arrived", number))
            arrived()

        return logged

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        self.log.append(("generate", request.request_id))
        return super().generate(request)

    def first_arrivals(self) -> list[int]:
        """Each notice's number, in the order they were first closed."""
        closed: list[int] = []
        for event, number in self.log:
            if event == "arrived" and number not in closed:
                closed.append(number)  # type: ignore[arg-type]
        return closed


def test_every_request_on_its_way_arrives_or_is_called_off(start_server, make_funded_key) -> None:
    watched = ArrivalLog(demo_engine(str(DEMO_MODEL)))
    server = start_server(engines={"demo": watched})
    client = openai.OpenAI(base_url=server.base_url, api_key=make_funded_key(), max_retries=0)
    poor = openai.OpenAI(base_url=server.base_url, api_key=make_funded_key(3), max_retries=0)
    ask = {"model": "demo", "messages": MESSAGES, "max_tokens": 4}

    client.chat.completions.create(**ask)
    assert "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**ask, stream=True)
        if c.choices
    )
    with client.chat.completions.create(**ask | {"max_tokens": 500}, stream=True) as stream:
        next(iter(stream))  # the client hangs up after its first chunk
    with pytest.raises(openai.RateLimitError):  # its hold is refused: too few tokens left
        poor.chat.completions.create(**ask)
    with pytest.raises(openai.BadRequestError):  # refused after the notice, before any hold
        client.chat.completions.create(**ask, n=99)
    watched.refuse(1)
    with pytest.raises(openai.APIStatusError) as overloaded:  # the engine's queue is full
        client.chat.completions.create(**ask, stream=True)
    client.close()
    poor.close()

    assert overloaded.value.status_code == 503
    assert (
        sorted(watched.first_arrivals())
        == list(range(1, watched.expected + 1))
        == [1, 2, 3, 4, 5, 6]
    )
    assert watched.inner.scheduler.expected == 0  # type: ignore[attr-defined]
    # Each notice is closed after its request was submitted, never before: the engine's wait
    # ends only once the request can be admitted.
    submitted = [i for i, (event, _) in enumerate(watched.log) if event == "generate"]
    closed = {n: watched.log.index(("arrived", n)) for n in watched.first_arrivals()}
    assert len(submitted) == 4  # the refused request was submitted, then turned away
    assert all(closed[n] > submitted[i] for i, n in enumerate((1, 2, 3, 6)))


@pytest.mark.anyio
async def test_a_burst_with_one_key_reads_that_key_once(server, api_key) -> None:
    """Eight requests with a key the server has not seen yet (its balance, say, asked by eight
    workers at once): one database read answers them all (the read is slowed down here so that
    every request arrives while it runs)."""
    lookups: list[str] = []

    def slow_key_read(_conn, _cursor, statement: str, *_args) -> None:
        # the authenticating read, by the key's hash (/key then reads the key's name by id)
        if "FROM api_key" in statement and "key_hash =" in statement.split("WHERE", 1)[-1]:
            lookups.append(statement)
            time.sleep(0.3)

    sql_event.listen(server.services.db, "before_cursor_execute", slow_key_read)
    try:
        async with httpx.AsyncClient(
            base_url=server.base_url, headers={"Authorization": f"Bearer {api_key}"}
        ) as client:
            answers = await asyncio.gather(*(client.get("/key") for _ in range(8)))
    finally:
        sql_event.remove(server.services.db, "before_cursor_execute", slow_key_read)
    assert [a.status_code for a in answers] == [200] * 8
    assert len(lookups) == 1
