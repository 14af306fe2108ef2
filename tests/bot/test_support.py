"""Support inside the bot: a buyer's message reaches every operator with the buyer's charges
and balance, and an operator's reply to it reaches the buyer; no SUPPORT_CONTACT needed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlmodel import Session, select

from billing.models import SupportMessage
from bot.settings import BotSettings
from tests.bot.conftest import ADMIN_ID
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import another_bot, buttons, buy_pack

pytestmark = pytest.mark.anyio


def messages(session: Session) -> list[tuple[int | None, str]]:
    session.rollback()
    rows = session.exec(select(SupportMessage).order_by(SupportMessage.id)).all()
    return [(row.operator_id, row.text) for row in rows]


async def test_a_support_message_and_the_operators_reply_make_the_round_trip(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-help")
    await alice.send("/paysupport")
    assert "support:write" in buttons(telegram)

    await alice.tap("support:write")  # the Support button asks for the message
    prompt = telegram.sent_to(alice.id)[-1]
    assert prompt["reply_markup"]["force_reply"] is True
    await alice.send("My <key> stopped working & I paid twice?", reply_to=prompt)

    card = telegram.sent_to(operator.id)[-1]
    assert "Support message</b> from Alice (id 100001, en)" in card["text"]
    assert "Available: 100,000 tokens" in card["text"]
    assert "Starter · 50 ⭐ · <code>charge-help</code>" in card["text"]
    assert "My &lt;key&gt; stopped working &amp; I paid twice?" in card["text"]
    assert "passed to the operators" in telegram.last_text_to(alice.id)

    await operator.send("Your key works again; only one charge was taken.", reply_to=card)

    assert telegram.last_text_to(alice.id) == (
        "💬 <b>Support</b>:\nYour key works again; only one charge was taken."
    )
    assert telegram.last_text_to(operator.id) == "✅ Sent to Alice."
    assert messages(session) == [
        (None, "My <key> stopped working & I paid twice?"),
        (ADMIN_ID, "Your key works again; only one charge was taken."),
    ]


async def test_after_paysupport_the_next_plain_message_reaches_every_operator_from_any_process(
    bot_settings: BotSettings, engine: Engine, telegram: FakeTelegram, session: Session
) -> None:
    """Most people write right after the command. Two bot processes share the database: the
    one that gets the message is not the one that answered `/paysupport`."""
    second_operator = ADMIN_ID + 1
    settings = bot_settings.model_copy(
        update={"admin_telegram_ids": frozenset({ADMIN_ID, second_operator})}
    )
    async with another_bot(settings) as here, another_bot(settings) as there:
        alice_here = TelegramUser(here, id=100_001, first_name="Alice")
        alice_there = TelegramUser(there, id=100_001, first_name="Alice")
        await buy_pack(alice_here, telegram, charge_id="charge-late")
        await alice_here.send("/paysupport")

        await alice_there.send("My payment did not arrive")

        for operator_id in (ADMIN_ID, second_operator):
            card = telegram.last_text_to(operator_id)
            assert "Support message</b> from Alice (id 100001, en)" in card
            assert "Available: 100,000 tokens" in card
            assert "Starter · 50 ⭐ · <code>charge-late</code>" in card
            assert "My payment did not arrive" in card
        assert "passed to the operators" in telegram.last_text_to(alice_here.id)

        pavel = TelegramUser(here, id=second_operator, first_name="Pavel")
        await pavel.send("Found it: credited now.", reply_to=telegram.sent_to(second_operator)[-1])
        assert telegram.last_text_to(alice_here.id) == "💬 <b>Support</b>:\nFound it: credited now."

        await alice_there.send("ok thanks")  # the prompt was answered: no second message
    assert "How it works" in telegram.last_text_to(alice_here.id)
    assert messages(session) == [
        (None, "My payment did not arrive"),
        (second_operator, "Found it: credited now."),
    ]


async def test_the_support_buttons_prompt_takes_the_next_message_without_a_reply(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram
) -> None:
    await alice.send("/paysupport")
    await alice.tap("support:write")
    assert telegram.last_text_to(alice.id).startswith("💬 Write your message to support")

    await alice.send("Where do I find my key?")

    assert "Where do I find my key?" in telegram.last_text_to(operator.id)
    assert "passed to the operators" in telegram.last_text_to(alice.id)


async def test_a_plain_message_without_a_prompt_gets_the_help(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram
) -> None:
    await alice.send("hello")

    assert "How it works" in telegram.last_text_to(alice.id)
    assert telegram.texts_to(operator.id) == []


async def test_paysupport_with_text_sends_it_at_once_even_without_a_support_contact(
    boris: TelegramUser, operator: TelegramUser, telegram: FakeTelegram
) -> None:
    await boris.send("/paysupport Где мои токены?")

    assert "Где мои токены?" in telegram.last_text_to(operator.id)
    assert "Сообщение передано операторам" in telegram.last_text_to(boris.id)


async def test_a_reply_to_anything_else_is_not_passed_on(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram
) -> None:
    await alice.send("/help")
    help_message = telegram.sent_to(alice.id)[-1]

    await alice.send("thanks", reply_to=help_message)
    await operator.send("hello?", reply_to=help_message)

    assert all("thanks" not in text for text in telegram.texts_to(operator.id))
    assert "How it works" in telegram.last_text_to(alice.id)


def test_production_refuses_to_start_without_operators(bot_settings: BotSettings) -> None:
    fields = bot_settings.model_dump() | {
        "environment": "production",
        "secret_key": "x7" * 20,
        "admin_telegram_ids": frozenset(),
    }
    with pytest.raises(ValidationError, match="ADMIN_TELEGRAM_IDS is required in production"):
        BotSettings(_env_file=None, **fields)  # type: ignore[call-arg]


async def test_a_reply_to_the_operators_answer_continues_the_thread(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await alice.send("/paysupport Is the pro pack monthly?")
    await operator.send("No, tokens never expire.", reply_to=telegram.sent_to(operator.id)[-1])
    answer = telegram.sent_to(alice.id)[-1]

    await alice.send("Thanks! And can I pay in another currency?", reply_to=answer)

    assert "can I pay in another currency?" in telegram.last_text_to(operator.id)
    assert [text for _, text in messages(session)][-1] == (
        "Thanks! And can I pay in another currency?"
    )
