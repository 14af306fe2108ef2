"""Faults the reliability tests inject from outside the product: a TCP proxy that can cut a
database off, an HTTP reverse proxy that fails chosen attempts, and an engine that refuses
chosen requests. Each is handed to the product the way a deployment would (a URL, a base URL,
`create_app(engines=...)`), so no product code is patched."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from api.engine.errors import EngineOverloaded
from api.engine.protocol import (
    ChatMessage,
    EngineClient,
    EngineStats,
    GenerationOutput,
    GenerationRequest,
)


def poll(check: Callable[[], bool], *, within: float, what: str, every: float = 0.01) -> float:
    """Wait until `check()` holds, at most `within` seconds; the seconds it took. A deadline,
    not a sleep: the test goes on the moment the condition is true."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > within:
            raise AssertionError(f"{what}: not within {within} s")
        time.sleep(every)
    return time.monotonic() - started


class TcpProxy:
    """Forwards a loopback port to `target`; `cut()` resets every connection and refuses new
    ones (accepted, then reset at once) until `restore()`. The database server itself is never
    touched, so other tests sharing it are not disturbed."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._down = threading.Event()
        self._silent = False
        self._silenced: list[socket.socket] = []
        self._closing = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut(self, *, silent: bool = False) -> None:
        """Reset every connection. New ones are reset too or, `silent`, accepted and never
        answered: a host that stopped responding, which only a client's timeout ends."""
        self._silent = silent
        self._down.set()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _reset(sock)

    def restore(self) -> None:
        self._down.clear()
        silenced, self._silenced = self._silenced, []
        for sock in silenced:
            _reset(sock)

    def close(self) -> None:
        self._closing = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                if self._silent:
                    self._silenced.append(client)  # kept open, never read
                else:
                    _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with self._lock:
                    self._sockets.discard(sock)
                _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Close with RST rather than FIN: what a dead host or a dropped route looks like."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class ThreadedServer:
    """Any ASGI app under uvicorn on a free loopback port, in a thread of the test process."""

    def __init__(self, app: Any) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port: int = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        poll(lambda: self.server.started, within=30, what="the proxy started")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class FaultyProxy:
    """A reverse proxy in front of the API that answers the next attempts with planned faults
    before they reach it: `fail_next("500", "hang")`. It counts every attempt it receives, so a
    test sees how many times a client tried, whatever the client library reports."""

    def __init__(self, upstream: str, *, hang_seconds: float = 3.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.hang_seconds = hang_seconds
        self.attempts: list[tuple[str, str]] = []  # (path, what the proxy did)
        self._plan: list[str] = []
        self._lock = threading.Lock()

    def fail_next(self, *faults: str) -> None:
        """Faults for the next attempts, in order: an HTTP status ("500", "502", "503"), or
        "hang" (no answer for `hang_seconds`, longer than the client's timeout)."""
        with self._lock:
            self._plan.extend(faults)

    def forwarded(self, path: str) -> int:
        return sum(1 for p, what in self.attempts if p == path and what == "forwarded")

    def tried(self, path: str) -> int:
        return sum(1 for p, _ in self.attempts if p == path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        path = request.url.path
        with self._lock:
            fault = self._plan.pop(0) if self._plan else None
            self.attempts.append((path, fault or "forwarded"))
        if fault == "hang":
            await asyncio.sleep(self.hang_seconds)
            response: Response = JSONResponse({"error": "too late"}, status_code=504)
        elif fault is not None:
            response = JSONResponse(
                {"error": {"message": "injected", "type": "server_error", "param": None}},
                status_code=int(fault),
            )
        else:
            response = await self._forward(request)
        await response(scope, receive, send)

    async def _forward(self, request: Request) -> Response:
        client = httpx.AsyncClient(timeout=60)
        headers = [
            (name, value)
            for name, value in request.headers.raw
            if name.lower() not in (b"host", b"content-length")
        ]
        upstream = await client.send(
            client.build_request(
                request.method,
                self.upstream + request.url.path,
                params=request.query_params,
                headers=headers,
                content=await request.body(),
            ),
            stream=True,
        )

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        passed = {
            name: value
            for name, value in upstream.headers.items()
            if name.lower() not in ("content-length", "transfer-encoding", "connection")
        }
        return StreamingResponse(body(), status_code=upstream.status_code, headers=passed)


class DelegatingEngine(EngineClient):
    """Passes everything to `inner`; subclasses change one call to watch or break it."""

    def __init__(self, inner: EngineClient) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.context_length = inner.context_length
        self.created = inner.created

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self.inner.encode_chat(messages)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return self.inner.generate(request)

    def expect(self) -> Callable[[], None]:
        return self.inner.expect()

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def check_health(self) -> None:
        await self.inner.check_health()

    def stats(self) -> EngineStats:
        return self.inner.stats()

    async def start(self) -> None:
        await self.inner.start()

    async def shutdown(self) -> None:
        await self.inner.shutdown()


class RefusingEngine(DelegatingEngine):
    """Answers the next `refuse(n)` requests with `EngineOverloaded` (what a full queue says),
    after the API has placed their hold; the rest go to `inner`."""

    def __init__(self, inner: EngineClient) -> None:
        super().__init__(inner)
        self.refused = 0
        self._to_refuse = 0

    def refuse(self, count: int) -> None:
        self._to_refuse += count

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if self._to_refuse:
            self._to_refuse -= 1
            self.refused += 1
            raise EngineOverloaded("injected: the queue is full")
        return self.inner.generate(request)


class GatedEngine(DelegatingEngine):
    """Lets the first `let_through` outputs of each request pass, then holds the rest back until
    `gate` opens: to the serving layer the request is alive and has nothing more to show, as when
    it waits behind a full batch."""

    def __init__(self, inner: EngineClient, let_through: int = 0) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.let_through = let_through

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return self._gated(self.inner.generate(request))

    async def _gated(
        self, stream: AsyncIterator[GenerationOutput]
    ) -> AsyncIterator[GenerationOutput]:
        passed = 0
        try:
            while True:
                while passed >= self.let_through and not self.gate.is_set():
                    await asyncio.sleep(0.01)
                try:
                    output = await anext(stream)
                except StopAsyncIteration:
                    return
                passed += 1
                yield output
        finally:
            await stream.aclose()  # type: ignore[attr-defined]


def demo_engine(path: str, **config: Any) -> EngineClient:
    """The demo model loaded as the server would (`MODELS`), with engine limits changed."""
    from api.engine.registry import EngineConfig, load_engines

    return load_engines(f"demo={path}", EngineConfig(**config))["demo"]
