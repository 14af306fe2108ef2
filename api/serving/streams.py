"""Merge the output streams of a request's choices into one, with keep-alives and a deadline."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

import anyio

from api.engine.protocol import GenerationOutput

KEEPALIVE: Any = object()  # nothing arrived for `keepalive` seconds
TIMEOUT: Any = object()  # the deadline passed; the streams were closed
_DONE: Any = object()

Item = tuple[int, GenerationOutput]


async def merge_outputs(
    streams: Sequence[AsyncIterator[GenerationOutput]],
    *,
    keepalive: float | None,
    deadline: float,
    on_output: Callable[[int, GenerationOutput], None] | None = None,
) -> AsyncGenerator[Item]:
    """Yield `(choice index, output)` as each stream produces, KEEPALIVE when idle, TIMEOUT once
    at the deadline. An error in any stream is raised here; leaving early closes every stream.

    `on_output` sees every output the moment it leaves the engine, before it waits here for the
    consumer: billing counts there, so outputs still queued when the client leaves are billed."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[GenerationOutput]) -> None:
        try:
            async for output in stream:
                if on_output is not None:
                    on_output(index, output)
                queue.put_nowait((index, output))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, _DONE))

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    running = len(tasks)
    try:
        while running:
            left = deadline - time.monotonic()
            wait = min(left, keepalive if keepalive else math.inf)
            if left <= 0:
                yield TIMEOUT
                return
            try:
                index, item = queue.get_nowait() if queue.qsize() else await _get(queue, wait)
            except TimeoutError:
                yield TIMEOUT if time.monotonic() >= deadline else KEEPALIVE
                if time.monotonic() >= deadline:
                    return
                continue
            if item is _DONE:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        with anyio.CancelScope(shield=True):
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in streams:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()


async def _get(queue: asyncio.Queue[tuple[int, Any]], timeout: float) -> tuple[int, Any]:
    """`queue.get()` within `timeout` seconds. Not `asyncio.wait_for`, which wraps the get in a
    new task: this runs once per streamed token, and the task cost more than the wait."""
    async with asyncio.timeout(None if math.isinf(timeout) else timeout):
        return await queue.get()
