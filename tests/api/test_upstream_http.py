"""The upstream HTTP client (`api/engine/upstream/http.py`) against a small server on a real
socket: keep-alive reuse, a stale idle connection, closing an unread stream, gzip, timeouts."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable

import pytest

from api.engine.upstream import http

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


class Server:
    """Counts connections; `handler` answers each request of a connection in turn."""

    def __init__(
        self,
        handler: Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]],
    ):
        self.handler = handler
        self.connections = 0
        self.closed_by_client = asyncio.Event()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await self.handler(self, reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.set()
        except asyncio.CancelledError:
            pass  # the test ended
        finally:
            writer.close()


async def answer_sse(
    server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> bool:
    await read_request(reader)
    writer.write(SSE_HEAD + chunked(b'data: {"a": 1}\r\n\r\n', b"data: [DONE]\r\n\r\n"))
    await writer.drain()
    return True


def test_a_finished_connection_serves_the_next_request() -> None:
    async def run() -> None:
        server = Server(answer_sse)
        async with server as url:
            pool = http.Pool(connect_timeout=2)
            for _ in range(3):
                response = await pool.post(url, b"{}", {}, read_timeout=2)
                assert [data async for data in response.data()] == [b'{"a": 1}', b"[DONE]"]
                await response.aclose()
            pool.close()
        assert server.connections == 1

    asyncio.run(run())


def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def once(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        await answer_sse(server, reader, writer)
        return False  # then close, as a server's keep-alive timeout does

    async def run() -> None:
        server = Server(once)
        async with server as url:
            pool = http.Pool(connect_timeout=2)
            for _ in range(2):
                response = await pool.post(url, b"{}", {}, read_timeout=2)
                assert await response.read()
                await response.aclose()
            pool.close()
        assert server.connections == 2

    asyncio.run(run())


def test_closing_an_unread_stream_closes_its_connection() -> None:
    async def endless(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        await read_request(reader)
        writer.write(SSE_HEAD)
        while True:
            writer.write(chunked(b'data: {"a": 1}\n\n')[:-5])  # one chunk, no end
            await writer.drain()
            await asyncio.sleep(0.01)

    async def run() -> None:
        server = Server(endless)
        async with server as url:
            pool = http.Pool(connect_timeout=2)
            response = await pool.post(url, b"{}", {}, read_timeout=2)
            events = response.data()
            assert await anext(events) == b'{"a": 1}'
            await events.aclose()
            await response.aclose()
            await asyncio.wait_for(server.closed_by_client.wait(), 5)
            pool.close()

    asyncio.run(run())


def test_a_gzip_body_is_decoded() -> None:
    async def gzipped(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        await read_request(reader)
        body = gzip.compress(b'{"choices": []}')
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(gzipped) as url:
            pool = http.Pool(connect_timeout=2)
            response = await pool.post(url, b"{}", {}, read_timeout=2)
            assert await response.read() == b'{"choices": []}'
            await response.aclose()
            pool.close()

    asyncio.run(run())


def test_a_gap_longer_than_the_read_timeout_raises() -> None:
    async def stalls(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        await read_request(reader)
        writer.write(SSE_HEAD)
        await writer.drain()
        await asyncio.sleep(5)
        return False

    async def run() -> None:
        async with Server(stalls) as url:
            pool = http.Pool(connect_timeout=2)
            response = await pool.post(url, b"{}", {}, read_timeout=0.1)
            with pytest.raises(http.ReadTimeout):
                await response.read()
            await response.aclose()
            pool.close()

    asyncio.run(run())


def test_a_refused_connection_raises_connect_failed() -> None:
    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(http.ConnectFailed):
            await http.Pool(connect_timeout=2).post(
                f"http://127.0.0.1:{port}/v1/chat/completions", b"{}", {}, read_timeout=None
            )

    asyncio.run(run())


def test_gaps_shorter_than_the_read_timeout_never_raise_however_long_the_stream() -> None:
    """The read timeout's timer is set for many reads at once: when it fires before the read in
    progress is due, it moves on instead of ending that read."""

    async def trickles(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        await read_request(reader)
        writer.write(SSE_HEAD)
        for n in range(30):
            await asyncio.sleep(0.01)
            writer.write(chunked(b'data: {"n": %d}\r\n\r\n' % n)[:-5])  # no terminator yet
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(trickles) as url:
            pool = http.Pool(connect_timeout=2)
            response = await pool.post(url, b"{}", {}, read_timeout=0.1)
            events = [event async for event in response.data()]
            assert events == [b'{"n": %d}' % n for n in range(30)]
            await response.aclose()
            pool.close()

    asyncio.run(run())
