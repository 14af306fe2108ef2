"""Balance: what is left, what is reserved, and the usage the API billed by day and model."""

from __future__ import annotations

import csv
import io

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buttons, buy_pack
from tests.factories import bill_request

pytestmark = pytest.mark.anyio


async def test_balance_shows_the_figures_and_the_last_requests(
    alice: TelegramUser, telegram: FakeTelegram, engine: Engine, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-b")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    bill_request(engine, account_id, "req-1", cost=1_234, hold=2_000)
    bill_request(engine, account_id, "req-2", cost=0, hold=500)  # still running

    await alice.send("💰 Balance")

    text = telegram.last_text_to(alice.id)
    assert "Available: 98,266 tokens" in text
    assert "In use by running requests: 500" in text
    assert "Purchased: 100,000" in text
    assert "Used: 1,234" in text
    assert "Usage by day and model" in text
    assert "· demo · 1 req · prompt 1,234 · completion 0 · billed 1,234" in text


async def test_a_new_buyer_has_an_empty_balance_and_no_history(
    boris: TelegramUser, telegram: FakeTelegram
) -> None:
    await boris.send("/balance")

    text = telegram.last_text_to(boris.id)
    assert "Доступно: 0 токенов" in text
    assert "Запросов пока не было." in text
    assert "Баланс пуст" in text


async def test_usage_by_day_and_model_pages_and_exports_as_csv(
    alice: TelegramUser, telegram: FakeTelegram, engine: Engine, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-u")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    models = [f"model-{n:02d}" for n in range(12)]
    # each request: 7 prompt and 3 completion tokens, billed at price 2
    for n, model in enumerate(models):
        bill_request(
            engine,
            account_id,
            f"req-{n}",
            cost=20,
            model=model,
            prompt_tokens=7,
            completion_tokens=3,
        )
    bill_request(
        engine,
        account_id,
        "req-again",
        cost=20,
        model="model-00",
        prompt_tokens=7,
        completion_tokens=3,
    )

    await alice.send("/balance")

    first = telegram.last_text_to(alice.id)
    assert "· model-00 · 2 req · prompt 14 · completion 6 · billed 40" in first
    assert "model-09" in first and "model-10" not in first
    assert buttons(telegram) == ["usage:page:1", "usage:csv"]
    await alice.tap("usage:page:1")
    second = telegram.last_text_to(alice.id)
    assert "model-10" in second and "model-11" in second and "model-00" not in second
    assert buttons(telegram) == ["usage:page:0", "usage:csv"]

    await alice.tap("usage:csv")

    document = telegram.last("sendDocument")
    assert int(document["chat_id"]) == alice.id
    assert document["document"]["filename"] == "tokenshop-usage.csv"
    rows = list(csv.DictReader(io.StringIO(document["document"]["content"].decode())))
    assert len(rows) == 13
    assert rows[0]["request_id"] == "req-0" and rows[0]["model"] == "model-00"
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"], rows[0]["charged"]) == (
        "7",
        "3",
        "20",
    )
