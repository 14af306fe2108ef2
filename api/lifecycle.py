"""An API process among its replicas: its lease, the sweeps, and a graceful exit on SIGTERM.

- **Lease.** Before serving, the process starts its lease, which ends its previous incarnation's
  (same `INSTANCE_NAME`), and sweeps, waiting for any other sweeper, so what a crash of that
  incarnation left open is resolved before the first request. A heartbeat renews the lease
  every `HEARTBEAT_SECONDS`; if the lease was ended meanwhile (this process lost the database
  for longer than `LEASE_SECONDS` and another swept its holds) it starts a new one.
- **Sweeps.** Every `SWEEP_SECONDS` the process tries to sweep (`billing.leases.sweep`); one
  process sweeps at a time, so replicas add no load by sweeping too.
- **Draining.** On SIGTERM `/ready` answers 503 at once and new requests get 503 with
  `Retry-After` (the load balancer sends them to another replica); requests already running get
  `SHUTDOWN_GRACE_SECONDS` to finish, then are cancelled (their holds settle as a disconnect's
  do); then uvicorn is told to exit, and the lifespan ends the lease and resolves what is left.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.books import Books
from api.errors import DATABASE_UNAVAILABLE, OpenAIError, describe_database_error

logger = logging.getLogger("tokenshop.api")

OPERATIONS = frozenset({"/health", "/ready", "/metrics"})  # answered while draining
DRAINING_RETRY_AFTER_SECONDS = 1
CLOSE_AFTER_CUT_SECONDS = 5.0  # what a cut response (and its connection) may take to end


@dataclass
class Lifecycle:
    """Whether this process is draining, and the requests it is running."""

    grace_seconds: float
    draining: bool = False
    _running: set[asyncio.Task[Any]] = field(default_factory=set)
    _cut: set[asyncio.Task[Any]] = field(default_factory=set)  # cancelled after the grace
    _idle: asyncio.Event | None = None

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def drain(self) -> None:
        """Refuse new requests from now on; wait for the running ones up to the grace period,
        then cancel those left."""
        self.draining = True
        self._idle = asyncio.Event()
        if self._running:
            with suppress(TimeoutError):
                async with asyncio.timeout(self.grace_seconds):
                    await self._idle.wait()
        left = list(self._running)
        if left:
            logger.warning("cancelling %d request(s) still running after the grace", len(left))
            for task in left:
                self._cut.add(task)
                task.cancel()

    def _started(self, task: asyncio.Task[Any]) -> None:
        self._running.add(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not self._running and self._idle is not None:
            self._idle.set()

    def on_sigterm(self, exit_server: Callable[[], None]) -> Callable[[], None]:
        """Make SIGTERM drain, then call `exit_server`; the callable undoes it. Only the main
        thread receives signals: elsewhere (a test's server thread) it changes nothing."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)
        drained: list[asyncio.Task[None]] = []

        async def drain_then_exit() -> None:
            await self.drain()
            exit_server()

        def start() -> None:
            if drained:  # a second SIGTERM: stop waiting
                exit_server()
                return
            logger.info("SIGTERM: draining (up to %.0f s for running requests)", self.grace_seconds)
            drained.append(loop.create_task(drain_then_exit()))

        def handler(_sig: int, _frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(start)

        signal.signal(signal.SIGTERM, handler)

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        return restore


def uvicorn_exit() -> Callable[[], None]:
    """What tells the server to exit: its own SIGTERM handler (uvicorn's, installed before the
    lifespan starts), or the default action where there is none."""
    previous = signal.getsignal(signal.SIGTERM)
    if callable(previous):
        _bound_connection_wait(previous)
        return lambda: previous(signal.SIGTERM, None)

    def default() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    return default


def _bound_connection_wait(handler: Callable[..., Any]) -> None:
    """uvicorn waits for every connection to close before it runs the lifespan's shutdown,
    without limit unless `--timeout-graceful-shutdown` was given. A client that stopped reading
    keeps a cut stream's unsent bytes in its socket, so that connection never closes and the
    process would neither end its lease nor exit: where the server set no limit, set one."""
    config = getattr(getattr(handler, "__self__", None), "config", None)
    if config is not None and getattr(config, "timeout_graceful_shutdown", 0) is None:
        config.timeout_graceful_shutdown = CLOSE_AFTER_CUT_SECONDS


class Draining:
    """ASGI middleware: counts the requests running, and refuses new ones while draining."""

    def __init__(self, app: ASGIApp, *, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPERATIONS:
            await self.app(scope, receive, send)
            return
        if self.lifecycle.draining:
            await _draining().response()(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        response = {"started": False, "complete": False}

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                response["complete"] = True
            await send(message)

        self.lifecycle._started(task)
        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if task not in self.lifecycle._cut:
                raise
            task.uncancel()  # cut by `drain` after the grace: end the response cleanly
            with suppress(TimeoutError):  # unless the client stopped reading
                async with asyncio.timeout(CLOSE_AFTER_CUT_SECONDS):
                    if not response["started"]:
                        await _draining().response()(scope, receive, send)
                    elif not response["complete"]:  # a stream ends here, without its [DONE]
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.lifecycle._ended(task)


def _draining() -> OpenAIError:
    return OpenAIError(
        503,
        "This server is shutting down. Please retry; another server will answer.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": str(DRAINING_RETRY_AFTER_SECONDS)},
    )


async def start_lease(books: Books, name: str) -> None:
    """Start the lease and resolve what earlier incarnations left, before serving. Without the
    database the process starts anyway; the heartbeat starts the lease once it is back."""
    await _guarded("starting the lease", _start(books, name))


async def _start(books: Books, name: str) -> None:
    await books.start_lease(name)
    await _sweep(books, wait=True)


async def sweep_once(books: Books, *, wait: bool = False) -> None:
    await _guarded("hold sweep", _sweep(books, wait=wait))


async def _sweep(books: Books, *, wait: bool) -> None:
    report = await books.sweep(wait=wait)
    if report and report.holds_resolved:
        logger.info("resolved %d hold(s) of processes gone", report.holds_resolved)


async def sweep_forever(books: Books, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        await sweep_once(books)


async def heartbeat_forever(books: Books, name: str, every: float) -> None:
    """Renew the lease; start a new one if it was ended while this process was out of reach."""
    while True:
        await asyncio.sleep(every)
        await _guarded("heartbeat", _beat(books, name))


async def _beat(books: Books, name: str) -> None:
    if not await books.renew_lease():
        logger.warning("this process's lease had lapsed and was ended; starting a new one")
        await books.start_lease(name)


async def stop_lease(books: Books) -> None:
    """At a clean exit: end the lease and resolve what this process still holds."""
    await _guarded("ending the lease", books.end_lease())
    await sweep_once(books, wait=True)


async def _guarded(what: str, work: Awaitable[None]) -> None:
    try:
        await work
    except DATABASE_UNAVAILABLE as exc:
        logger.warning("%s failed: %s", what, describe_database_error(exc))
    except Exception:
        logger.exception("%s failed", what)
