"""The SSE response of the streaming routes: its closing step runs however the response ends.

Starlette runs a response's `background` only after the body was sent in full. A stream cut
by a draining server (or any cancellation while a write waits on a client that stopped
reading) skips it, and the suspended generator would settle only when garbage collection
closed it, after the process's lease had already released the hold unbilled. Here the close
(stop generation, settle the hold) runs, shielded, on every way out.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    """`text/event-stream` of `events`; `close()` is awaited once the response ends."""

    def __init__(self, events: AsyncIterable[Any], *, close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()
