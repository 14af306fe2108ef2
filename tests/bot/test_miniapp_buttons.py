"""The Mini App in the bot: with PUBLIC_APP_URL the menu button and the buttons under My key and
Balance open it; without it the bot is the chat it always was."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlmodel import Session
from telegram.ext import Application

from bot.app import build_application
from bot.settings import BotSettings
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack
from tests.factories import bill_request

pytestmark = pytest.mark.anyio
APP_URL = "https://shop.tokenshop.test/app/"


@pytest.fixture
async def app_bot(
    bot_settings: BotSettings, engine: Engine, telegram: FakeTelegram
) -> AsyncIterator[Application]:  # type: ignore[type-arg]
    """The bot as it starts with PUBLIC_APP_URL set (what post_init told Telegram is kept)."""
    application = build_application(bot_settings.model_copy(update={"public_app_url": APP_URL}))
    await application.initialize()
    assert application.post_init is not None
    await application.post_init(application)
    yield application
    assert application.post_shutdown is not None
    await application.post_shutdown(application)
    await application.shutdown()


def web_app_buttons(telegram: FakeTelegram) -> list[str]:
    keyboard = telegram.last("sendMessage")["reply_markup"]["inline_keyboard"]
    return [button["web_app"]["url"] for row in keyboard for button in row if "web_app" in button]


async def test_the_menu_button_and_the_balance_and_key_buttons_open_the_app(
    app_bot: Application,  # type: ignore[type-arg]
    telegram: FakeTelegram,
    engine: Engine,
    session: Session,
) -> None:
    menu = telegram.last("setChatMenuButton")["menu_button"]
    assert menu == {"type": "web_app", "text": "Open app", "web_app": {"url": APP_URL}}

    alice = TelegramUser(app_bot, id=100_001, first_name="Alice", language_code="en")
    await buy_pack(alice, telegram, charge_id="charge-app")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    bill_request(engine, account_id, "req-app", cost=100)

    await alice.send("/balance")
    assert web_app_buttons(telegram) == [f"{APP_URL}?page=usage"]
    await alice.send("/key")
    assert web_app_buttons(telegram) == [f"{APP_URL}?page=keys"]


async def test_without_an_app_url_the_bot_keeps_its_commands_menu(
    bot_settings: BotSettings, engine: Engine, telegram: FakeTelegram
) -> None:
    application = build_application(bot_settings)
    await application.initialize()
    assert application.post_init is not None
    await application.post_init(application)
    try:
        assert telegram.last("setChatMenuButton")["menu_button"] == {"type": "default"}
        alice = TelegramUser(application, id=100_001)
        await alice.send("/balance")
        assert "web_app" not in str(telegram.last("sendMessage").get("reply_markup"))
    finally:
        assert application.post_shutdown is not None
        await application.post_shutdown(application)
        await application.shutdown()


def test_the_app_url_must_be_https(bot_settings: BotSettings) -> None:
    fields = bot_settings.model_dump() | {"public_app_url": "http://shop.tokenshop.test/app/"}
    with pytest.raises(ValidationError, match="https"):
        BotSettings(_env_file=None, **fields)  # type: ignore[call-arg]
