"""Engines as `billing.db.make_engine` makes them."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from billing.db import lazily_flushed, make_engine, reading, session_scope


def test_a_pooled_connection_whose_ping_fails_is_replaced_not_raised(database_url: str) -> None:
    """A PostgreSQL connection cut mid-ping can fail with a ProgrammingError (psycopg resetting
    `autocommit` on a connection still ACTIVE) that the driver does not call a disconnect: the
    pool must open a new connection, not hand the caller that error (a 500 where an outage gives
    503s, and a checkpoint that should have failed quietly). Here the pooled connection is left
    inside a transaction, which makes the ping's `autocommit` change fail the same way."""
    if make_url(database_url).get_backend_name() != "postgresql":
        pytest.skip("PostgreSQL's pre-ping: SQLite engines do not ping their connections")
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as connection:
            pooled = connection.connection.dbapi_connection
        pooled.execute("SELECT 1")  # opens a transaction behind the pool's back
        with engine.connect() as connection:
            assert connection.execute(text("SELECT 2")).scalar() == 2
            assert connection.connection.dbapi_connection is not pooled
    finally:
        engine.dispose()


def test_a_lazily_flushed_commit_skips_the_flush_and_the_next_flushes_again(
    database_url: str,
) -> None:
    """SQLite: a hold's commit need not wait for the disk (`lazily_flushed`); the connection it
    used goes back to flushing for every other write."""
    if make_url(database_url).get_backend_name() != "sqlite":
        pytest.skip("PostgreSQL flushes every commit")
    engine = make_engine(database_url, pool_size=1)
    synchronous = text("PRAGMA synchronous")
    try:
        with session_scope(lazily_flushed(engine)) as session:
            assert session.execute(synchronous).scalar() == 1  # NORMAL
        with session_scope(engine) as session:
            assert session.execute(synchronous).scalar() == 2  # FULL
        with session_scope(reading(engine)) as session:
            assert session.execute(synchronous).scalar() == 2
    finally:
        engine.dispose()
