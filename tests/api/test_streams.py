"""A request's choices merged into one stream: in arrival order, with keep-alives when idle and
one TIMEOUT at the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from api.engine.protocol import GenerationOutput
from api.serving.streams import KEEPALIVE, TIMEOUT, merge_outputs

pytestmark = pytest.mark.anyio


def output(text: str) -> GenerationOutput:
    return GenerationOutput(text=text, token_ids=[], prompt_tokens=1, completion_tokens=1)


async def tokens(*texts: str, every: float = 0.0, then: asyncio.Event | None = None):
    for text in texts:
        await asyncio.sleep(every)
        yield output(text)
    if then is not None:
        await then.wait()
        yield output("after")


async def collect(stream: AsyncIterator) -> list:
    seen = []
    async for item in stream:
        seen.append(item if item in (KEEPALIVE, TIMEOUT) else (item[0], item[1].text))
    return seen


async def test_choices_arrive_in_order_and_the_merge_ends_with_the_last():
    merged = merge_outputs(
        [tokens("a", "b"), tokens("x")], keepalive=10, deadline=time.monotonic() + 10
    )
    seen = await collect(merged)
    assert sorted(seen) == [(0, "a"), (0, "b"), (1, "x")]
    assert seen.index((0, "a")) < seen.index((0, "b"))


async def test_tokens_closer_together_than_the_keepalive_get_none_between_them():
    """One timer serves many waits: set by the first, it fires before a later wait is due and
    must wait on, not end that wait."""
    texts = [str(n) for n in range(40)]
    merged = merge_outputs(
        [tokens(*texts, every=0.01)], keepalive=0.1, deadline=time.monotonic() + 30
    )
    assert await collect(merged) == [(0, text) for text in texts]


async def test_an_idle_stream_gets_keepalives_and_goes_on_after_them():
    resume = asyncio.Event()
    seen = []
    merged = merge_outputs(
        [tokens("a", then=resume)], keepalive=0.02, deadline=time.monotonic() + 30
    )
    async for item in merged:
        seen.append(item if item is KEEPALIVE else item[1].text)
        if seen.count(KEEPALIVE) == 2:
            resume.set()
    assert seen == ["a", KEEPALIVE, KEEPALIVE, "after"]


async def test_the_deadline_yields_timeout_once_and_closes_the_streams():
    closed = asyncio.Event()

    async def forever():
        try:
            yield output("a")
            await asyncio.Event().wait()
            yield output("never")
        finally:
            closed.set()

    stream = forever()
    merged = merge_outputs([stream], keepalive=None, deadline=time.monotonic() + 0.05)
    assert await collect(merged) == [(0, "a"), TIMEOUT]
    assert closed.is_set()


async def test_an_error_in_a_stream_is_raised_to_the_consumer():
    async def broken():
        yield output("a")
        raise RuntimeError("upstream broke")

    seen = []
    with pytest.raises(RuntimeError, match="upstream broke"):
        async for item in merge_outputs([broken()], keepalive=10, deadline=time.monotonic() + 10):
            seen.append(item[1].text)
    assert seen == ["a"]
