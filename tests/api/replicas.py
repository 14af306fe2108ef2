"""Several API processes on one database, each started as the Procfile's `web` line starts it
(`uvicorn api.main:app_from_environment --factory`), configured by the environment, killed
with real signals. Started together, so their model loads overlap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import Engine, text

from tests.api.conftest import DEMO_MODEL, ROOT, free_port
from tests.conftest import TEST_SECRET_KEY
from tests.faults import poll


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    base: str  # http://127.0.0.1:port
    log: Path

    @property
    def v1(self) -> str:
        return f"{self.base}/v1"

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.base}/ready", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        """SIGKILL: no `finally`, no shutdown hook, no last heartbeat."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def environment(database_url: str, **settings: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "SECRET_KEY": TEST_SECRET_KEY,
        "MODELS": f"demo={DEMO_MODEL}",
        "ENGINE_THREADS": "1",  # cores / replicas, as docs/deploying.md says
        "ENGINE_CACHE_DIR": "",  # not the user's cache
        **settings,
    }


@contextmanager
def replicas(
    database_url: str, workdir: Path, count: int = 3, **settings: str
) -> Iterator[list[Replica]]:
    """`count` API processes named replica-0..n, each ready to serve; killed at the end."""
    started: list[Replica] = []
    try:
        for index in range(count):
            name = f"replica-{index}"
            started.append(start(database_url, workdir, name, **settings))
        for replica in started:
            wait_ready(replica)
        yield started
    finally:
        for replica in started:
            stop(replica)


def start(database_url: str, workdir: Path, name: str, **settings: str) -> Replica:
    port = free_port()
    log = workdir / f"{name}-{port}.log"
    with log.open("wb") as out:  # a file: a full pipe would stall it
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "api.main:app_from_environment", "--factory"]
            + ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            cwd=workdir,  # no stray .env is read
            env=environment(database_url, INSTANCE_NAME=name, **settings),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Replica(name, process, f"http://127.0.0.1:{port}", log)


def wait_ready(replica: Replica) -> None:
    poll(
        lambda: replica.process.poll() is not None or replica.ready(),
        within=120,
        what=f"{replica.name} ready",
        every=0.1,
    )
    assert replica.process.poll() is None, replica.output()


def stop(replica: Replica) -> None:
    if replica.process.poll() is None:
        replica.process.terminate()
        try:
            replica.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            replica.process.kill()
            replica.process.wait(timeout=30)


def audit_cli(database_url: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    return tokenshop(database_url, workdir, "audit")


def tokenshop(database_url: str, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator's CLI, as a separate process."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("tokenshop")), *args],
        cwd=workdir,
        env={
            "PATH": os.environ.get("PATH", ""),
            "DATABASE_URL": database_url,
            "SECRET_KEY": TEST_SECRET_KEY,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def deadlocks(engine: Engine) -> int | None:
    """PostgreSQL's count of deadlocks detected in this database; None on SQLite."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            connection.execute(
                text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )
