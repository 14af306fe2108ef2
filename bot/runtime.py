"""What every handler needs: the settings, the database, and the caller's account and language.

The engine belongs to the application's lifecycle (`post_init` makes it, `post_shutdown`
disposes of it) and lives in `bot_data`. Database work is synchronous SQLAlchemy, so handlers
run it in a worker thread, one short transaction per call, and the event loop (which must answer
pre-checkout queries within Telegram's 10 seconds) never waits on a lock.

A buyer's language is the one chosen in the picker, else their Telegram client's. The choice is
in the database; each process keeps the choices it has read (`Runtime.languages`), filled by
`remember_language`, which runs ahead of every handler for a user it has not seen yet.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing import keys, referrals
from billing.accounts import find_telegram_account
from billing.db import reading, session_scope
from billing.models import Account
from billing.packs import Pack
from billing.plans import Plan
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
    plans: tuple[Plan, ...] = ()  # monthly plans (PLANS), sold beside the packs
    # Telegram id -> the language chosen in the picker ("" for none), as last read or set
    languages: dict[int, str] = field(default_factory=dict)

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


def lang(update: Update, context: ContextTypes.DEFAULT_TYPE) -> Lang:
    """The language to answer this update's sender in: chosen, else their client's."""
    user = update.effective_user
    if user is None:
        return language_for(None)
    chosen = runtime(context).languages.get(user.id) if RUNTIME in context.bot_data else None
    return language_for(chosen or user.language_code)


async def remember_language(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Group -2: read the sender's chosen language once per process (pre-checkout excluded: it
    must answer fast and reads nothing it does not need)."""
    user = update.effective_user
    if user is None or update.pre_checkout_query is not None or RUNTIME not in context.bot_data:
        return
    shop = runtime(context)
    if user.id in shop.languages:
        return

    def work(session: Session) -> str:
        account = find_telegram_account(session=session, telegram_id=user.id)
        return (account.chosen_language or "") if account else ""

    shop.languages[user.id] = await shop.read(work)


async def first_contact(
    update: Update, context: ContextTypes.DEFAULT_TYPE
) -> referrals.FirstContact:
    """The sender's account, created on first contact (with the operator's starter tokens) and
    kept up to date with their name and language."""
    user = update.effective_user
    assert user is not None
    name = user.full_name[:NAME_LIMIT]
    shop = runtime(context)
    starter = shop.settings.starter_tokens

    def work(session: Session) -> referrals.FirstContact:
        contact = referrals.open_account(
            session=session,
            telegram_id=user.id,
            name=name,
            language=user.language_code,
            starter_tokens=starter,
        )
        if contact.starter_tokens:  # tokens to try the API with, and the key to use them
            assert contact.account.id is not None
            keys.ensure_key(
                session=session,
                account_id=contact.account.id,
                secret_key=shop.secret_key,
                defaults=shop.settings.key_defaults(),
            )
        return contact

    contact = await shop.run(work)
    shop.languages[user.id] = contact.account.chosen_language or ""
    return contact


async def account_of(update: Update, context: ContextTypes.DEFAULT_TYPE) -> Account:
    """The sender's account, created on first contact and kept up to date with their language."""
    return (await first_contact(update, context)).account
