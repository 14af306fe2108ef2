"""First contact: /start, the menu, help and terms, and replies to what the bot does not know."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from billing.accounts import find_telegram_account
from tests.bot.double import FakeTelegram, TelegramUser

pytestmark = pytest.mark.anyio


def menu_buttons(telegram: FakeTelegram) -> list[str]:
    keyboard = telegram.last("sendMessage")["reply_markup"]["keyboard"]
    return [button["text"] for row in keyboard for button in row]


async def test_start_greets_by_name_shows_the_menu_and_records_the_account(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("/start")

    assert "Hi, Alice!" in telegram.last_text_to(alice.id)
    assert menu_buttons(telegram) == [
        "🛒 Buy tokens",
        "🔑 My key",
        "💰 Balance",
        "💬 Support",
        "❓ Help",
    ]
    assert telegram.last("sendMessage")["parse_mode"] == "HTML"
    account = find_telegram_account(session=session, telegram_id=alice.id)
    assert account is not None and account.name == "Alice" and account.language == "en"


async def test_a_russian_speaker_gets_russian_texts_and_menu(
    boris: TelegramUser, telegram: FakeTelegram
) -> None:
    await boris.send("/start")

    assert "Привет, Борис!" in telegram.last_text_to(boris.id)
    assert menu_buttons(telegram) == [
        "🛒 Купить токены",
        "🔑 Мой ключ",
        "💰 Баланс",
        "💬 Поддержка",
        "❓ Помощь",
    ]

    await boris.send("❓ Помощь")
    assert "Как это работает" in telegram.last_text_to(boris.id)


async def test_help_terms_and_privacy(alice: TelegramUser, telegram: FakeTelegram) -> None:
    await alice.send("❓ Help")
    assert "/paysupport" in telegram.last_text_to(alice.id)

    await alice.send("/terms")
    assert "Terms of service" in telegram.last_text_to(alice.id)

    await alice.send("/privacy")
    assert "Privacy policy" in telegram.last_text_to(alice.id)


async def test_an_unknown_command_gets_a_pointer_to_help(
    alice: TelegramUser, telegram: FakeTelegram
) -> None:
    await alice.send("/frobnicate")

    assert telegram.last_text_to(alice.id).startswith("I don't know that command")


async def test_a_name_with_markup_is_shown_as_text(shop_bot, telegram: FakeTelegram) -> None:
    mallory = TelegramUser(shop_bot, id=100_666, first_name="<b>Mal</b> & co")

    await mallory.send("/start")

    assert "Hi, &lt;b&gt;Mal&lt;/b&gt; &amp; co!" in telegram.last_text_to(mallory.id)
