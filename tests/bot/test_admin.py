"""Operator commands: /stats and /grant for ADMIN_TELEGRAM_IDS, invisible to everyone else."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import Session

from billing import keys, ledger
from billing.models import utcnow
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack
from tests.factories import make_purchase

pytestmark = pytest.mark.anyio

UNKNOWN = "I don't know that command. Send /help to see what I can do."


@pytest.mark.parametrize("command", ["/stats", "/refund charge-1", "/grant 100001 5000"])
async def test_operator_commands_get_the_ordinary_reply_from_anyone_else(
    alice: TelegramUser, telegram: FakeTelegram, session: Session, command: str
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-1")

    await alice.send(command)

    assert telegram.last_text_to(alice.id) == UNKNOWN
    assert telegram.calls("refundStarPayment") == []
    account_id = account_of(session, alice).id
    assert account_id is not None
    assert ledger.get_balance(session=session, account_id=account_id).granted == 0


async def test_stats_count_buyers_revenue_and_tokens(
    alice: TelegramUser, boris: TelegramUser, operator: TelegramUser, telegram: FakeTelegram
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-a1")
    await buy_pack(alice, telegram, charge_id="charge-a2", pack="pro")
    await buy_pack(boris, telegram, charge_id="charge-b1")

    await operator.send("/stats")

    text = telegram.last_text_to(operator.id)
    today, total = text.split("All time")
    for block in (today, total):
        assert "Buyers: 2 · Purchases: 3" in block
        assert "Revenue: 800 ⭐ (refunded 0 ⭐)" in block
        assert "Tokens sold: 2,200,000 · granted: 0 · used: 0" in block


async def test_grant_credits_a_known_user_gives_a_key_and_tells_them(
    boris: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await boris.send("/start")

    await operator.send(f"/grant {boris.id} 5000")

    assert "Granted 5,000 tokens" in telegram.last_text_to(operator.id)
    assert "Вам начислено 5\u00a0000 токенов" in telegram.last_text_to(boris.id)
    account_id = account_of(session, boris).id
    assert account_id is not None
    assert ledger.get_balance(session=session, account_id=account_id).granted == 5_000
    assert keys.active_key(session=session, account_id=account_id) is not None


@pytest.mark.parametrize(
    ("command", "reply"),
    [
        ("/grant", "Usage: /grant"),
        ("/grant abc 10", "Usage: /grant"),
        ("/grant 100002 -5", "The amount must be a positive whole number"),
        ("/grant 999999 10", "Telegram user 999999 has not started the bot yet."),
    ],
)
async def test_grant_explains_what_is_wrong_with_a_bad_command(
    operator: TelegramUser, telegram: FakeTelegram, command: str, reply: str
) -> None:
    await operator.send(command)

    assert telegram.last_text_to(operator.id).startswith(reply)


async def test_stats_separate_today_from_all_time_and_count_refunds_and_usage(
    alice: TelegramUser, operator: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    invoice = await buy_pack(alice, telegram, charge_id="charge-today")
    account = account_of(session, alice)
    old = make_purchase(session, account, charge_id="charge-old", tokens=1_000, price=10)
    old.created_at = utcnow() - timedelta(days=2)
    session.add(old)
    session.commit()
    await alice.refunded(invoice.payload, invoice.amount, "charge-today")

    await operator.send("/stats")

    today, total = telegram.last_text_to(operator.id).split("All time")
    assert "Buyers: 1 · Purchases: 1" in today
    assert "Revenue: 50 ⭐ (refunded 50 ⭐)" in today
    assert "Buyers: 1 · Purchases: 2" in total
    assert "Revenue: 60 ⭐ (refunded 50 ⭐)" in total
    assert "Tokens sold: 101,000" in total
