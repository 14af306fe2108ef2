"""The Alembic migrations build exactly the schema the models describe, on either database."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlmodel import SQLModel

from billing.db import make_engine

ROOT = Path(__file__).resolve().parents[2]


def _config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = url
    config.attributes["skip_logging"] = True
    return config


def test_upgrade_head_builds_the_schema_of_the_models(database_url):
    command.upgrade(_config(database_url), "head")
    engine = make_engine(database_url)
    with engine.connect() as connection:
        drift = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    engine.dispose()
    assert drift == [], "models and migrations differ: run `alembic revision --autogenerate`"


def test_downgrade_to_base_removes_every_table(database_url):
    command.upgrade(_config(database_url), "head")
    command.downgrade(_config(database_url), "base")
    engine = make_engine(database_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()
