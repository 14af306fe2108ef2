"""My key: offered with the first pack, shown masked and behind a spoiler, rotated on request."""

from __future__ import annotations

import re

import pytest
from sqlmodel import Session

from billing import keys
from billing.errors import RevokedKey
from tests.bot.conftest import PUBLIC_API
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack

pytestmark = pytest.mark.anyio


def card_buttons(telegram: FakeTelegram, method: str = "sendMessage") -> list[str]:
    keyboard = telegram.last(method)["reply_markup"]["inline_keyboard"]
    return [button["callback_data"] for row in keyboard for button in row]


def key_id_on_card(telegram: FakeTelegram, method: str = "sendMessage") -> int:
    snippet = next(data for data in card_buttons(telegram, method) if "snippet" in data)
    return int(snippet.rsplit(":", 1)[1])


def revealed_key(text: str) -> str:
    found = re.search(r"<tg-spoiler>(sk-tks-\w+)</tg-spoiler>", text)
    assert found is not None, text
    return found.group(1)


async def test_before_any_purchase_my_key_says_it_comes_with_the_first_pack(
    alice: TelegramUser, telegram: FakeTelegram
) -> None:
    await alice.send("🔑 My key")

    assert telegram.last_text_to(alice.id).startswith("You get an API key with your first pack")
    buttons = telegram.last("sendMessage")["reply_markup"]["inline_keyboard"]
    assert [row[0]["callback_data"] for row in buttons] == ["pack:starter", "pack:pro"]


async def test_my_key_shows_a_masked_preview_and_the_key_behind_a_spoiler(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-k")

    await alice.send("🔑 My key")

    card = telegram.last_text_to(alice.id)
    key = revealed_key(card)
    assert f"<code>{keys.mask_key(key)}</code>" in card
    assert card.count(key) == 1  # only behind the spoiler
    assert f"<code>{PUBLIC_API}</code>" in card
    assert keys.authenticate(session=session, key=key).account_id == account_of(session, alice).id
    key_id = key_id_on_card(telegram)
    assert card_buttons(telegram) == [
        f"key:snippet:{key_id}",
        f"key:rename:{key_id}",
        f"key:rotate:{key_id}",
        f"key:revoke:{key_id}",
        "key:new",
    ]

    await alice.tap(f"key:snippet:{key_id}")
    assert f"Bearer {key}" in telegram.last_text_to(alice.id)


async def test_rotating_asks_first_then_the_old_key_stops_working(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-r")
    await alice.send("/key")
    old_key = revealed_key(telegram.last_text_to(alice.id))
    key_id = key_id_on_card(telegram)

    await alice.tap(f"key:rotate:{key_id}")
    assert telegram.last_text_to(alice.id).startswith("Rotate the key «default»?")
    confirm = card_buttons(telegram, "editMessageText")
    assert confirm == [f"key:rotate-yes:{key_id}", "key:cancel"]

    await alice.tap(f"key:rotate-yes:{key_id}")

    rotated = telegram.last_text_to(alice.id)
    new_key = re.search(r"<code>(sk-tks-\w+)</code>", rotated)
    assert new_key is not None and new_key.group(1) != old_key
    session.rollback()
    with pytest.raises(RevokedKey):
        keys.authenticate(session=session, key=old_key)
    assert keys.authenticate(session=session, key=new_key.group(1)).account_id == (
        account_of(session, alice).id
    )
    await alice.send("/key")
    assert revealed_key(telegram.last_text_to(alice.id)) == new_key.group(1)


async def test_cancelling_a_rotation_keeps_the_key(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-c")
    await alice.send("/key")
    key = revealed_key(telegram.last_text_to(alice.id))

    await alice.tap(f"key:rotate:{key_id_on_card(telegram)}")
    await alice.tap("key:cancel")

    assert telegram.last_text_to(alice.id) == "The key was not changed."
    session.rollback()
    assert keys.authenticate(session=session, key=key)


async def test_a_russian_speaker_sees_the_key_card_in_russian(
    boris: TelegramUser, telegram: FakeTelegram
) -> None:
    await buy_pack(boris, telegram, charge_id="charge-ru")
    assert "Оплата получена: +100\u00a0000 токенов." in telegram.texts_to(boris.id)[-2]

    await boris.send("🔑 Мой ключ")

    assert "Нажмите, чтобы показать" in telegram.last_text_to(boris.id)
