"""Merge the output streams of a request's choices into one, with keep-alives and a deadline;
start a stream ahead of its reader (`Started`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
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
    inbox = _Inbox()

    async def pump(index: int, stream: AsyncIterator[GenerationOutput]) -> None:
        try:
            async for output in stream:
                if on_output is not None:
                    on_output(index, output)
                inbox.put((index, output))
        except Exception as exc:  # handed to the consumer, which raises it
            inbox.put((index, exc))
            return
        inbox.put((index, _DONE))

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
                index, item = inbox.get_nowait() or await inbox.get(wait)
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
        inbox.close()
        with anyio.CancelScope(shield=True):
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in streams:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()


class _Inbox:
    """The pumps' outputs, in order, for one consumer. Its wait's timeout keeps one timer for
    many waits (moved on only when it fires early), not one per streamed token: with
    `asyncio.timeout` and `asyncio.Queue` the hand-off cost twice as much."""

    def __init__(self) -> None:
        self._items: deque[tuple[int, Any]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._due = math.inf  # when the wait in progress times out

    def put(self, item: tuple[int, Any]) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_nowait(self) -> tuple[int, Any] | None:
        return self._items.popleft() if self._items else None

    async def get(self, timeout: float) -> tuple[int, Any]:
        """The next item; TimeoutError if none comes within `timeout` seconds."""
        loop = asyncio.get_running_loop()
        while not self._items:
            self._due = loop.time() + timeout
            if self._due < self._timer_at:  # the timer would fire too late: set it earlier
                self._arm(loop, self._due)
            waiter = self._waiter = loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if math.isinf(when) else loop.call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        fired_for, self._timer, self._timer_at = self._timer_at, None, math.inf
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no wait in progress: the next one sets the timer again
        if self._due <= fired_for:
            waiter.set_exception(TimeoutError())
        else:  # set by an earlier wait: this one ends later
            self._arm(waiter.get_loop(), self._due)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf


class Started:
    """An engine stream whose first output is fetched at once, in a task of its own, so that an
    upstream request is on its way while the caller still waits on something else (the hold).
    Read it as the stream itself; `aclose` stops it whether or not anything was read, and a
    reader cancelled while it waits for the first output cancels that fetch with it."""

    def __init__(self, stream: AsyncIterator[GenerationOutput]) -> None:
        self._stream = stream
        self._first: asyncio.Task[GenerationOutput] | None = asyncio.ensure_future(_first(stream))

    def __aiter__(self) -> Started:
        return self

    async def __anext__(self) -> GenerationOutput:
        first, self._first = self._first, None
        if first is not None:
            return await first
        return await anext(self._stream)

    async def aclose(self) -> None:
        first, self._first = self._first, None
        if first is not None:
            first.cancel()
            await asyncio.wait([first])  # ends cancelled, or with what it had already
            if not first.cancelled():
                first.exception()  # read: nothing is reported as never retrieved
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def _first(stream: AsyncIterator[GenerationOutput]) -> GenerationOutput:
    return await anext(stream)
