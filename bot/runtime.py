"""What every handler needs: the settings, the database, and the caller's account and language.

The engine belongs to the application's lifecycle (`post_init` makes it, `post_shutdown`
disposes of it) and lives in `bot_data`. Database work is synchronous SQLAlchemy, so handlers
run it in a worker thread, one short transaction per call, and the event loop (which must answer
pre-checkout queries within Telegram's 10 seconds) never waits on a lock.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing import accounts
from billing.db import reading, session_scope
from billing.models import Account
from billing.packs import Pack
from bot.settings import BotSettings
from bot.texts import Lang, language_for

T = TypeVar("T")
Item = TypeVar("Item")
RUNTIME = "tokenshop.runtime"
SETTINGS = "tokenshop.settings"
NAME_LIMIT = 255


@dataclass
class Runtime:
    settings: BotSettings
    engine: Engine
    secret_key: bytes
    catalog: tuple[Pack, ...]

    async def run(self, work: Callable[[Session], T]) -> T:
        """Run `work(session)` in one transaction on a worker thread."""
        return await asyncio.to_thread(self.run_sync, work)

    async def run_each(self, items: list[Item], work: Callable[[Session, Item], T]) -> list[T]:
        """`work(session, item)` for each item, each in its own short transaction."""

        def loop() -> list[T]:
            return [self.run_sync(functools.partial(_with_item, work, item)) for item in items]

        return await asyncio.to_thread(loop)

    async def read(self, work: Callable[[Session], T]) -> T:
        """Like `run` for work that only reads: on SQLite it takes no write lock."""
        return await asyncio.to_thread(self.run_sync, work, reading(self.engine))

    def run_sync(self, work: Callable[[Session], T], engine: Engine | None = None) -> T:
        with session_scope(engine or self.engine) as session:
            return work(session)


def _with_item(work: Callable[[Session, Item], T], item: Item, session: Session) -> T:
    return work(session, item)


def runtime(context: ContextTypes.DEFAULT_TYPE) -> Runtime:
    return runtime_of(context.bot_data)


def runtime_of(bot_data: Mapping[str, Any]) -> Runtime:
    return bot_data[RUNTIME]


def lang(update: Update) -> Lang:
    user = update.effective_user
    return language_for(user.language_code if user else None)


async def account_of(update: Update, context: ContextTypes.DEFAULT_TYPE) -> Account:
    """The sender's account, created on first contact and kept up to date with their language."""
    user = update.effective_user
    assert user is not None
    name = user.full_name[:NAME_LIMIT]

    def work(session: Session) -> Account:
        return accounts.get_or_create_account(
            session=session, telegram_id=user.id, name=name, language=user.language_code
        )

    return await runtime(context).run(work)
