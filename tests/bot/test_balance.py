"""Balance: what is left, what is reserved, and the usage the API billed by day and model."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack
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
