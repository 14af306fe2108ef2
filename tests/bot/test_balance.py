"""Balance: what is left, what is reserved, and the usage the API billed by day and model."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from billing import ledger
from billing.db import session_scope
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack

pytestmark = pytest.mark.anyio


def api_request(engine: Engine, account_id: int, request_id: str, *, cost: int, hold: int) -> None:
    """What the API process does for one request: hold, generate, settle."""
    with session_scope(engine) as session:
        ledger.hold(
            session=session,
            account_id=account_id,
            request_id=request_id,
            min_tokens=1,
            max_tokens=hold,
            ttl=timedelta(minutes=5),
            model="demo",
        )
    if cost:
        with session_scope(engine) as session:
            ledger.settle(session=session, hold_id=request_id, cost=cost, prompt_tokens=cost)


async def test_balance_shows_the_figures_and_the_last_requests(
    alice: TelegramUser, telegram: FakeTelegram, engine: Engine, session: Session
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-b")
    account_id = account_of(session, alice).id
    assert account_id is not None
    session.rollback()
    api_request(engine, account_id, "req-1", cost=1_234, hold=2_000)
    api_request(engine, account_id, "req-2", cost=0, hold=500)  # still running

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
