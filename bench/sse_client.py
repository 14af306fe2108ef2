"""A streamed chat completion read as cheaply as a client can: a raw asyncio connection whose
bytes httptools (the C parser uvicorn serves with) turns into the response body, split into SSE
events and timed as they arrive.

The benchmark's client shares the server's 2 cores, so each microsecond it spends per token is
taken from the engine it measures. httpx's `aiter_lines` with `json.loads` per event used
124-140 us of CPU per streamed token, and its `aiter_raw` alone as much; this reader 35-40 us
(the demo model, 8 streams of 200 tokens, one process each way). Only events that are not a
plain content delta are parsed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httptools

CONTENT_DELTA = b'"finish_reason":null'  # every chunk but the last of a choice and the usage
# The opening chunk, which the server sends with its first keep-alive when a long prompt's
# prefill outlasts KEEPALIVE_SECONDS: no token yet, so it is not the first token's time.
ROLE_ONLY = b'"delta":{"role":"assistant","content":""}'


@dataclass
class StreamTimes:
    """When a streamed completion's events arrived (`time.perf_counter`) and what they said."""

    first: float = 0.0  # the first event past the role chunk: the first token exists
    last: float = 0.0  # the event with a `finish_reason`: the last token
    completion_tokens: int = 0
    cached_tokens: int = 0
    status: int = 0
    error: bytes = b""  # the body of a response that is not a 200


class _Reader(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None], started: asyncio.Event | None) -> None:
        self.done = done
        self.started = started
        self.times = StreamTimes()
        self.parser = httptools.HttpResponseParser(self)
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(ConnectionError(f"the server closed the stream early: {exc}"))

    def on_headers_complete(self) -> None:
        self.times.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.times.status != 200:
            self.times.error += body
            return
        now = time.perf_counter()
        *events, self.pending = (self.pending + body).split(b"\n\n")
        for event in events:
            if event.startswith(b"data: {"):
                self._event(event[6:], now)

    def on_message_complete(self) -> None:
        self._finish(None)

    def _event(self, data: bytes, now: float) -> None:
        times = self.times
        if not times.first and ROLE_ONLY not in data:
            times.first = now
            if self.started is not None:
                self.started.set()  # its first token exists: it is decoding now
        if CONTENT_DELTA in data:
            return
        chunk: dict[str, Any] = json.loads(data)
        if usage := chunk.get("usage"):
            times.completion_tokens = usage["completion_tokens"]
            times.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
        elif chunk["choices"] and chunk["choices"][0].get("finish_reason"):
            times.last = now

    def _finish(self, error: Exception | None) -> None:
        if self.done.done():
            return
        if error is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(error)


@dataclass
class SseClient:
    """Streams chat completions from one server, a new connection each (as a burst of separate
    clients would open them)."""

    host: str
    port: int

    async def stream(
        self, body: dict[str, Any], api_key: str, started: asyncio.Event | None = None
    ) -> StreamTimes:
        """POST `body` to /v1/chat/completions and read its SSE stream to the end; `started` is
        set when the first event arrives."""
        payload = json.dumps(body).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\n"
            f"Host: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {api_key}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        transport, reader = await loop.create_connection(
            lambda: _Reader(done, started), self.host, self.port
        )
        try:
            transport.write(head.encode() + payload)
            await done
        finally:
            transport.close()
        if reader.times.status != 200:
            raise RuntimeError(f"HTTP {reader.times.status}: {reader.times.error!r}")
        return reader.times
