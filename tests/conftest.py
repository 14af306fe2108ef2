"""Shared fixtures: a fresh database per test, on SQLite or on PostgreSQL.

`TEST_DATABASE_URL` picks PostgreSQL (CI runs the suite on both). There each test gets its own
schema, named in the URL's `search_path`, so a server started in a subprocess sees the same
tables as the test that started it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, SQLModel

import billing.models  # noqa: F401  (registers the tables)
from billing.db import make_engine, reading
from billing.settings import BillingSettings

TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "").strip()
TEST_SECRET_KEY = "test-secret-key-for-tokenshop-tests-only-0123456789"


def pytest_report_header() -> str:
    backend = make_url(TEST_DATABASE_URL).get_backend_name() if TEST_DATABASE_URL else "sqlite"
    return f"database: {backend}"


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[Engine | None]:
    if not TEST_DATABASE_URL:
        yield None
        return
    engine = make_engine(TEST_DATABASE_URL)
    yield engine
    engine.dispose()


@pytest.fixture
def database_url(tmp_path, postgres_admin: Engine | None) -> Iterator[str]:
    """An empty database of the chosen backend, private to this test."""
    if postgres_admin is None:
        yield f"sqlite:///{tmp_path / 'tokenshop.db'}"
        return
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with postgres_admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(TEST_DATABASE_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    with postgres_admin.begin() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on a database with every table created."""
    engine = make_engine(database_url)
    SQLModel.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """The test's own session. Its reads take no SQLite write lock (see `billing.db.reading`),
    so it can stay open while the code under test writes from other threads or processes."""
    with Session(reading(engine), expire_on_commit=False) as session:
        yield session


@pytest.fixture
def billing_settings(database_url: str, tmp_path) -> BillingSettings:
    return BillingSettings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=database_url,
        secret_key=TEST_SECRET_KEY,
        secret_file=tmp_path / "secret",
    )


@pytest.fixture
def secret_key(billing_settings: BillingSettings) -> bytes:
    return billing_settings.resolved_secret_key()


@pytest.fixture
def tokenshop(engine: Engine, database_url: str, tmp_path) -> Callable[..., CompletedProcess[str]]:
    """Run `tokenshop ARGS` as the operator does (the installed command, a process of its own)
    against the test's database; returns the completed process."""
    command = Path(sys.executable).with_name("tokenshop")
    env = os.environ | {"DATABASE_URL": database_url, "SECRET_KEY": TEST_SECRET_KEY, "PACKS": ""}

    def run(*args: str, **env_overrides: str) -> CompletedProcess[str]:
        return subprocess.run(
            [str(command), *args],
            cwd=tmp_path,
            env=env | env_overrides,
            capture_output=True,
            text=True,
            timeout=120,  # generous: a loaded machine starts Python slowly
        )

    return run


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (`@pytest.mark.anyio`) run on asyncio, as uvicorn and the bot do."""
    return "asyncio"
