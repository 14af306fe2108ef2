"""My key: offered with the first pack, shown masked and behind a spoiler, rotated on request."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from billing import keys, ledger
from billing.db import session_scope
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
        f"key:limits:{key_id}",
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


def api_request(
    engine: Engine, account_id: int, key_id: int, request_id: str, **usage: int
) -> None:
    """What the API does for a request made with this key: hold, then settle its usage."""
    prompt, completion, cost = usage["prompt"], usage["completion"], usage["cost"]
    with session_scope(engine) as session:
        ledger.hold(
            session=session,
            account_id=account_id,
            request_id=request_id,
            min_tokens=cost,
            max_tokens=cost,
            ttl=timedelta(minutes=5),
            model="demo",
            key_id=key_id,
        )
    with session_scope(engine) as session:
        ledger.settle(
            session=session,
            hold_id=request_id,
            cost=cost,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )


async def test_a_buyer_with_two_keys_sees_each_keys_usage(
    alice: TelegramUser, telegram: FakeTelegram, session: Session, engine: Engine
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-two")
    await alice.send("/key")
    first = key_id_on_card(telegram)
    await alice.tap("key:new")
    assert telegram.last_text_to(alice.id).startswith("➕ New key created.")
    second = key_id_on_card(telegram, "editMessageText")
    assert second != first
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    api_request(engine, account_id, first, "req-a", prompt=100, completion=20, cost=120)
    api_request(engine, account_id, first, "req-b", prompt=10, completion=5, cost=15)
    api_request(engine, account_id, second, "req-c", prompt=300, completion=200, cost=1_000)

    await alice.send("/key")

    listed = telegram.last_text_to(alice.id)
    assert "<b>default</b>" in listed and "· 2 requests · 135 tokens" in listed
    assert "<b>key 2</b>" in listed and "· 1 requests · 1,000 tokens" in listed
    assert card_buttons(telegram) == [f"key:show:{first}", f"key:show:{second}", "key:new"]

    await alice.tap(f"key:show:{second}")
    card = telegram.last_text_to(alice.id)
    assert "<b>This key</b>: 1 requests, 1,000 tokens billed" in card
    assert "· demo · 1 req · prompt 300 · completion 200 · billed 1,000" in card
    await alice.tap(f"key:show:{first}")
    card = telegram.last_text_to(alice.id)
    assert "<b>This key</b>: 2 requests, 135 tokens billed" in card
    assert "· demo · 2 req · prompt 110 · completion 25 · billed 135" in card


async def test_revoking_a_key_leaves_no_replacement_and_the_others_working(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-rv")
    await alice.send("/key")
    first = key_id_on_card(telegram)
    first_key = revealed_key(telegram.last_text_to(alice.id))
    await alice.tap("key:new")
    second_key = revealed_key(telegram.last_text_to(alice.id))

    await alice.tap(f"key:revoke:{first}")
    assert telegram.last_text_to(alice.id).startswith("Revoke the key «default»?")
    await alice.tap(f"key:revoke-yes:{first}")

    assert "The key «default» was revoked." in telegram.last_text_to(alice.id)
    session.rollback()
    with pytest.raises(RevokedKey):
        keys.authenticate(session=session, key=first_key)
    assert keys.authenticate(session=session, key=second_key)
    account_id = account_of(session, alice).id
    assert account_id is not None
    assert len(keys.live_keys(session=session, account_id=account_id)) == 1

    await alice.send("/key")
    [card_id] = [data for data in card_buttons(telegram) if data.startswith("key:snippet:")]
    await alice.tap(card_id.replace("snippet", "revoke-yes"))
    await alice.send("/key")
    assert telegram.last_text_to(alice.id) == "You have no live keys. Create one below."
    assert card_buttons(telegram) == ["key:new"]


async def test_a_key_is_renamed_by_replying_to_the_prompt(
    alice: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-nm")
    await alice.send("/key")
    key_id = key_id_on_card(telegram)

    await alice.tap(f"key:rename:{key_id}")
    prompt = telegram.sent_to(alice.id)[-1]
    await alice.send("  laptop \n script ", reply_to=prompt)

    assert "✏️ The key is now called «laptop script»." in telegram.texts_to(alice.id)
    assert "🔑 <b>laptop script</b>" in telegram.last_text_to(alice.id)
