"""The HTTP/1.1 client of upstream chat completions: httptools parses what asyncio's protocol
callbacks hand it, and finished connections stay open for the next request.

Why not httpx on this path: a streamed token read through httpx went through httpcore's h11
parser, anyio's per-read timeout and four async generators, the largest share of what the API
spent per token (profile: bench/results/2026-11-26-gateway-amx-xeon-6ecf728.md). Here a token
is one `data_received` call, one parser callback and one future woken. What it keeps of httpx's
behaviour: a connect timeout, a timeout on each gap between reads, keep-alive reuse (a reused
connection the server had already closed is retried once on a new one, before anything was
read), gzip or deflate bodies, TLS for `https` URLs. It sends no `Accept-Encoding` and reads
no proxy settings: connections go straight to the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

MAX_IDLE = 64  # idle connections kept per upstream
PAUSE_AT = 256  # body pieces waiting to be read before the socket stops being read


class UpstreamHTTPError(Exception):
    """Base of the transport failures below (a status the upstream answers is not one)."""


class ConnectFailed(UpstreamHTTPError):
    """No connection within the connect timeout, or the upstream refused it."""


class ReadTimeout(UpstreamHTTPError):
    """Nothing arrived for longer than the read timeout."""


class BrokenOff(UpstreamHTTPError):
    """The connection closed before the response was complete, or the response was not HTTP."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def split_url(url: str) -> tuple[Origin, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Origin(parts.scheme, parts.hostname, port), path


class Pool:
    """Connections to upstreams, the idle ones reused (at most `MAX_IDLE` per origin)."""

    def __init__(self, *, connect_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        read_timeout: float | None,
    ) -> Response:
        """Send the request; returns once the response's status and headers arrived."""
        origin, path = split_url(url)
        head = _head(origin, path, len(body), headers)
        for reused in (True, False):
            connection = self._take_idle(origin) if reused else None
            if reused and connection is None:
                continue
            if connection is None:
                connection = await self._connect(origin)
            connection.read_timeout = read_timeout
            connection.transport.write(head + body)
            try:
                await connection.headers()
            except BrokenOff:
                if reused and connection.nothing_read:  # the server had closed it while idle
                    continue
                raise
            except BaseException:
                connection.abort()
                raise
            return Response(self, origin, connection)
        raise AssertionError("unreachable")

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.reusable:
                connection.reset()
                return connection
            connection.abort()
        return None

    def _put_idle(self, origin: Origin, connection: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) < MAX_IDLE:
            idle.append(connection)
        else:
            connection.abort()

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        if origin.scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    _Connection, origin.host, origin.port, ssl=context
                )
        except TimeoutError:
            raise ConnectFailed("connect timeout") from None
        except OSError as exc:
            raise ConnectFailed(type(exc).__name__) from None
        return connection

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.abort()
        self._idle.clear()


class Response:
    """A response whose body is read as it arrives; `aclose` puts a fully read connection back
    in the pool and closes any other at once (an upstream stops generating then)."""

    def __init__(self, pool: Pool, origin: Origin, connection: _Connection) -> None:
        self._pool = pool
        self._origin = origin
        self._connection: _Connection | None = connection
        self.status = connection.status
        self._encoded = connection.content_encoding not in (b"", b"identity")
        self._decoder: zlib._Decompress | None = None  # made by `next_data` when first needed
        self._events: deque[bytes] = deque()  # `next_data`'s payloads, read but not yet taken
        self._pending = b""  # the start of a line whose end has not arrived
        self._ended = False

    async def read(self) -> bytes:
        """The whole body."""
        pieces = []
        async for piece in self.body():
            pieces.append(piece)
        return b"".join(pieces)

    async def body(self) -> AsyncGenerator[bytes]:
        connection = self._connection
        assert connection is not None, "the response was closed"
        decoder = _decoder(connection.content_encoding)
        while (piece := await connection.next_piece()) is not None:
            yield piece if decoder is None else _decompress(decoder, piece)

    async def data(self) -> AsyncGenerator[bytes]:
        """The payloads of a server-sent event stream's `data:` lines, as bytes, stripped."""
        while (payload := await self.next_data()) is not None:
            yield payload

    async def next_data(self) -> bytes | None:
        """The next `data:` payload of a server-sent event stream, stripped; None at the body's
        end. A coroutine, not a generator: an upstream's token is read through no generator."""
        events = self._events
        while not events:
            connection = self._connection
            if connection is None or self._ended:
                return None
            piece = await connection.next_piece()
            if piece is None:
                self._ended = True
                piece = b"\n"  # the last line, if the body did not end with one
            elif self._encoded:
                if self._decoder is None:
                    self._decoder = _decoder(connection.content_encoding)
                assert self._decoder is not None
                piece = _decompress(self._decoder, piece)
            *lines, self._pending = (self._pending + piece).split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    events.append(line[5:].strip())
        return events.popleft()

    async def finish(self, within: float) -> None:
        """Read what is left of the body for up to `within` seconds, so that the connection
        can be reused (a server sends the body's end right after `[DONE]`)."""
        connection = self._connection
        if connection is None or connection.complete:
            return
        with contextlib.suppress(TimeoutError, UpstreamHTTPError):
            async with asyncio.timeout(within):
                while await connection.next_piece() is not None:
                    pass

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.reusable:
            self._pool._put_idle(self._origin, connection)
        else:
            connection.abort()


class _Connection(asyncio.Protocol):
    """One connection: the parser's callbacks fill `pieces`; a reader waits on one future."""

    transport: asyncio.Transport

    def __init__(self) -> None:
        self.read_timeout: float | None = None
        self.lost = False
        self._timer: asyncio.TimerHandle | None = None  # one for many waits (`_wait`)
        self._timer_at = math.inf
        self._due = math.inf  # when the wait in progress times out
        self.reset()

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.pieces: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: UpstreamHTTPError | None = None
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.paused = False
        self.nothing_read = True
        self.content_encoding = b""
        self.until_close = True  # a body that ends when the connection does (no length)
        self._header_name = b""

    # -- asyncio's side ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.nothing_read = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(BrokenOff("the upstream's response is not HTTP/1.1"))
            self.transport.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.headers_done and self.until_close and not self.complete:
            self.complete = True  # the body ran to the connection's end, as it said it would
            self._wake()
        elif not self.complete:
            self._fail(BrokenOff("the upstream closed the connection"))

    # -- httptools' side --------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-encoding":
            self.content_encoding = value.strip().lower()
        elif name == b"content-length" or (
            name == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self.until_close = False

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)
        if len(self.pieces) >= PAUSE_AT and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # only known inside the callback
        self.complete = True
        self._wake()

    # -- the reader's side ------------------------------------------------------------------

    @property
    def reusable(self) -> bool:
        return (
            self.complete
            and not self.lost
            and not self.until_close
            and self.keep_alive
            and not self.transport.is_closing()
        )

    async def headers(self) -> None:
        while not self.headers_done:
            await self._wait()

    async def next_piece(self) -> bytes | None:
        """The next piece of the body; None at its end."""
        while not self.pieces:
            if self.complete:
                return None
            await self._wait()
        if self.paused and len(self.pieces) <= 1:
            self.paused = False
            self.transport.resume_reading()
        return self.pieces.popleft()

    async def _wait(self) -> None:
        """Until the parser has news; ReadTimeout after `read_timeout` seconds without. The
        timer is set again only when it would fire too late, not once a token: one set by an
        earlier wait that fires before this one is due moves on to when it is."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        timeout = self.read_timeout
        self._due = math.inf if timeout is None else loop.time() + timeout
        if self._due < self._timer_at:
            self._arm(loop, self._due)
        waiter = self.waiter = loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if math.isinf(when) else loop.call_at(when, self._time_out)
        self._timer_at = when

    def _time_out(self) -> None:
        fired_for, self._timer, self._timer_at = self._timer_at, None, math.inf
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # no wait in progress: the next one sets the timer again
        if self._due <= fired_for:
            waiter.set_exception(ReadTimeout("no data within the read timeout"))
        else:
            self._arm(waiter.get_loop(), self._due)

    def _fail(self, error: UpstreamHTTPError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def abort(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf
        self.transport.abort()


def _head(origin: Origin, path: str, length: int, headers: Mapping[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {origin.host_header}",
        "Accept: application/json, text/event-stream",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        "User-Agent: tokenshop",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _decompress(decoder: zlib._Decompress, piece: bytes) -> bytes:
    try:
        return decoder.decompress(piece)
    except zlib.error:
        raise BrokenOff("the body does not decompress") from None


def _decoder(encoding: bytes) -> zlib._Decompress | None:
    if encoding in (b"", b"identity"):
        return None
    if encoding in (b"gzip", b"x-gzip", b"deflate"):
        return zlib.decompressobj(zlib.MAX_WBITS | 32)  # a gzip or zlib header, detected
    raise BrokenOff(f"the upstream sent a {encoding.decode('latin-1')!r} body")
