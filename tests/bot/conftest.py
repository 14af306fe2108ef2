"""Fixtures for the bot's stories: a real python-telegram-bot `Application` on a test database,
talking through its real httpx layer to a Telegram that respx plays (no network)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import respx
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlmodel import Session
from telegram.ext import Application

from billing import ledger
from billing.db import reading
from billing.settings import BillingSettings
from bot.app import build_application
from bot.settings import BotSettings
from tests.bot.double import API_BASE_URL, BOT_TOKEN, FakeTelegram, TelegramUser

ADMIN_ID = 500_001
PUBLIC_API = "https://api.tokenshop.test/v1"
LOW_BALANCE = 1_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def bot_settings(billing_settings: BillingSettings) -> BotSettings:
    return BotSettings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=billing_settings.database_url,
        secret_key=billing_settings.secret_key,
        secret_file=billing_settings.secret_file,
        telegram_bot_token=SecretStr(BOT_TOKEN),
        telegram_api_base_url=API_BASE_URL,
        admin_telegram_ids=frozenset({ADMIN_ID}),
        public_api_base_url=PUBLIC_API,
        low_balance_tokens=LOW_BALANCE,
        packs="starter:100000:50:Starter,pro:2000000:700:Pro",
    )


@pytest.fixture(autouse=True)
def books_balance_after_every_story(request: pytest.FixtureRequest) -> Iterator[None]:
    """What `tokenshop audit` checks (billing.ledger.audit), after every story that touched a
    database: whatever a story did, the books still balance."""
    engine: Engine | None = (
        request.getfixturevalue("engine") if "engine" in request.fixturenames else None
    )
    yield
    if engine is not None:
        with Session(reading(engine)) as session:
            assert ledger.audit(session=session) == []


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    """Telegram's Bot API; any request to another host fails the test (respx mocks them all)."""
    fake = FakeTelegram()
    with respx.mock(assert_all_called=False) as router:
        fake.install(router)
        yield fake


@pytest.fixture
async def shop_bot(
    bot_settings: BotSettings, engine: Engine, telegram: FakeTelegram
) -> AsyncIterator[Application]:  # type: ignore[type-arg]
    """The bot as `run_polling` would start it (initialize, post_init), minus the polling:
    the tests hand it updates themselves and await each one."""
    application = build_application(bot_settings)
    await application.initialize()
    assert application.post_init is not None
    await application.post_init(application)
    telegram.forget()  # getMe and the command menus
    yield application
    assert application.post_shutdown is not None
    await application.post_shutdown(application)
    await application.shutdown()


@pytest.fixture
def alice(shop_bot: Application) -> TelegramUser:  # type: ignore[type-arg]
    return TelegramUser(shop_bot, id=100_001, first_name="Alice", language_code="en")


@pytest.fixture
def boris(shop_bot: Application) -> TelegramUser:  # type: ignore[type-arg]
    return TelegramUser(shop_bot, id=100_002, first_name="Борис", language_code="ru")


@pytest.fixture
def operator(shop_bot: Application) -> TelegramUser:  # type: ignore[type-arg]
    return TelegramUser(shop_bot, id=ADMIN_ID, first_name="Olga", language_code="en")
