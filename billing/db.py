"""Engines and sessions for SQLite (default) and PostgreSQL (production).

SQLite needs three things to survive concurrent writers (API workers, the bot, the sweeper):
WAL so readers do not block the writer, a busy timeout so a writer waits instead of failing with
"database is locked", and `BEGIN IMMEDIATE` so a transaction takes the write lock when it starts
rather than upgrading a read lock later (the upgrade is what deadlocks). SQLAlchemy's pysqlite
recipe: turn off the driver's own transaction handling and emit BEGIN ourselves.

The busy timeout is 30 s unless the URL says otherwise with the driver's own parameter
(`sqlite:///tokenshop.db?timeout=5`, in seconds): past it a request gets a clean 503.

Every commit waits for the disk (`synchronous=FULL`), except on an engine from
`lazily_flushed`: there SQLite's WAL commits without the flush (`synchronous=NORMAL`), still
atomic and surviving a crash of any process, lost only if the machine itself goes down before
the next flushed commit of any connection (which flushes the WAL before it, in order).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlmodel import Session, create_engine

SQLITE_BUSY_TIMEOUT_MS = 30_000
# libpq: seconds to establish a connection; ms that sent data may stay unacknowledged (a dead
# peer on an open connection) before the connection counts as broken.
PG_TIMEOUTS = {"connect_timeout": 5, "tcp_user_timeout": 10_000}


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine configured for safe concurrent use of `url`."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _make_sqlite_engine(url, **kwargs)
    kwargs.setdefault("pool_pre_ping", True)
    if parsed.get_backend_name() == "postgresql":
        # Without these a database host that stops answering (rather than refusing) makes
        # requests wait for minutes; with them they fail, as 503s, within seconds. The URL
        # may set either (`?connect_timeout=2`).
        connect_args = kwargs.setdefault("connect_args", {})
        for name, value in PG_TIMEOUTS.items():
            if name not in parsed.query:
                connect_args.setdefault(name, value)
    engine = create_engine(url, **kwargs)
    event.listen(engine, "handle_error", _failed_ping_is_a_disconnect)
    return engine


def _failed_ping_is_a_disconnect(context: ExceptionContext) -> None:
    """A pre-ping that fails in any way means a connection not to use: the pool replaces it (and
    a database out of reach then fails the new connection, a clean OperationalError). psycopg's
    ping can fail with a ProgrammingError the dialect does not count as a disconnect: a
    connection cut while the ping ran stays ACTIVE, and resetting its autocommit raises."""
    if context.is_pre_ping:
        context.is_disconnect = True


def _make_sqlite_engine(url: str, **kwargs: Any) -> Engine:
    connect_args = kwargs.pop("connect_args", {})
    connect_args.setdefault("check_same_thread", False)
    in_url = make_url(url).query.get("timeout")
    timeout = float(in_url if isinstance(in_url, str) else SQLITE_BUSY_TIMEOUT_MS / 1000)
    connect_args.setdefault("timeout", timeout)
    busy_timeout_ms = int(float(connect_args["timeout"]) * 1000)
    engine = create_engine(url, connect_args=connect_args, **kwargs)
    in_memory = make_url(url).database in (None, "", ":memory:")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        options = connection.get_execution_options()
        synchronous = options.get("sqlite_synchronous", "FULL")
        if connection.info.get("synchronous", "FULL") != synchronous:  # only outside a transaction
            connection.connection.dbapi_connection.execute(f"PRAGMA synchronous={synchronous}")
            connection.info["synchronous"] = synchronous
        connection.exec_driver_sql(f"BEGIN {options.get('sqlite_begin', 'IMMEDIATE')}")

    return engine


def reading(engine: Engine) -> Engine:
    """The same engine for read-only work: on SQLite its transactions take no write lock, so a
    long-lived reader (a test, a report) never stalls the writers. Elsewhere it changes nothing."""
    return engine.execution_options(sqlite_begin="DEFERRED")


def lazily_flushed(engine: Engine) -> Engine:
    """The same engine for writes whose commit need not wait for the disk: on SQLite, whose
    writers all run on this machine, a commit lost with the machine was lost with every process
    that could have acted on it. Elsewhere it changes nothing: a PostgreSQL server can fail while
    the API lives on, and a hold lost there would leave the answer streamed under it unbilled."""
    return engine.execution_options(sqlite_synchronous="NORMAL")


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One short transaction: commit on success, roll back on error.

    Callers keep these short; in particular, no transaction stays open while a model generates.
    """
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
