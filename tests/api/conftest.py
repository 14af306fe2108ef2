"""The real app under uvicorn on a free loopback port, serving the bundled demo model, and
clients of the official `openai` SDK pointed at it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import uvicorn
from sqlmodel import Session

from api.engine.protocol import EngineClient
from api.main import create_app
from api.settings import ApiSettings
from tests.conftest import TEST_SECRET_KEY
from tests.factories import make_account, make_key

ROOT = Path(__file__).resolve().parents[2]
DEMO_MODEL = ROOT / "models" / "demo"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """uvicorn in a thread of the test process, stopped when the test ends."""

    def __init__(
        self,
        settings: ApiSettings,
        *,
        engines: dict[str, EngineClient] | None = None,
        **uvicorn_options: Any,
    ) -> None:
        self.port = free_port()
        self.app = create_app(settings, engines=engines)
        uvicorn_options.setdefault("log_level", "warning")
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, lifespan="on", **uvicorn_options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def services(self) -> Any:
        return self.app.state.services

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def api_settings(database_url: str, tmp_path: Path) -> ApiSettings:
    return ApiSettings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=database_url,
        secret_key=TEST_SECRET_KEY,
        secret_file=tmp_path / "secret",
        models=f"demo={DEMO_MODEL}",
        engine_cache_dir=str(tmp_path / "onnx-cache"),  # not the user's own cache
    )


@pytest.fixture
def start_server(engine, api_settings: ApiSettings) -> Iterator[Callable[..., LiveServer]]:
    """Start a server, optionally with settings changed: `start_server(max_queued=0)`, or with
    engines of the test's making instead of `settings.models`: `start_server(engines={...})`."""
    servers: list[LiveServer] = []

    def start(*, engines: dict[str, EngineClient] | None = None, **changes: Any) -> LiveServer:
        server = LiveServer(api_settings.model_copy(update=changes), engines=engines).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


@pytest.fixture
def server(start_server) -> LiveServer:
    return start_server()


@pytest.fixture
def make_funded_key(engine, secret_key) -> Callable[[int], str]:
    """A key on a new account holding `tokens`. It is written through a session of its own that
    takes SQLite's write lock up front: the test's `session` reads without it, and upgrading its
    snapshot while the server's sweeper writes fails at once with "database is locked"."""

    def make(tokens: int = 1_000_000) -> str:
        with Session(engine, expire_on_commit=False) as writer:
            return make_key(writer, make_account(writer, tokens=tokens), secret_key=secret_key)

    return make


@pytest.fixture
def api_key(make_funded_key) -> str:
    return make_funded_key()


@pytest.fixture
def make_client() -> Iterator[Callable[..., openai.OpenAI]]:
    """`make_client(server, key, **options)`: an SDK client, closed when the test ends."""
    clients: list[openai.OpenAI] = []

    def make(server: LiveServer, key: str, **options: Any) -> openai.OpenAI:
        options.setdefault("max_retries", 0)
        client = openai.OpenAI(base_url=server.base_url, api_key=key, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(server: LiveServer, api_key: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0) as client:
        yield client


@pytest.fixture
async def async_client(server: LiveServer, api_key: str):
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key=api_key, max_retries=0
    ) as client:
        yield client


@pytest.fixture
def fakes() -> Iterator[Callable[..., Any]]:
    """`fakes(**options)`: a fault-injecting upstream (`tests/fake_upstream.py`), started and
    ready; each is stopped after the test."""
    from tests.api.upstreams import FakeUpstream  # it imports this module: imported late

    started: list[FakeUpstream] = []

    def start(**options: Any) -> FakeUpstream:
        upstream = FakeUpstream(**options)
        started.append(upstream)
        return upstream.wait_ready()

    yield start
    for upstream in started:
        upstream.stop()
