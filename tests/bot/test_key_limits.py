"""My key's limits: the card shows them with the spend this period, 🚦 Limits sets them from a
reply, and the buyer hears once per period at 80% and 100% of a key's limit, and once three
days before it expires (real `Application`, Telegram answered by the fake Bot API)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from billing import key_limits, keys, ledger
from billing.db import session_scope
from billing.models import ApiKey
from bot.key_alerts import send_key_alerts
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import account_of, buy_pack
from tests.bot.test_key import key_id_on_card

pytestmark = pytest.mark.anyio
_requests = itertools.count()


def spend(engine: Engine, account_id: int, key_id: int, tokens: int) -> None:
    """What the API does for a request of the key that costs `tokens`: hold, then settle."""
    request_id = f"req-{next(_requests)}"
    with session_scope(engine) as session:
        ledger.hold(
            session=session,
            account_id=account_id,
            request_id=request_id,
            min_tokens=tokens,
            max_tokens=tokens,
            ttl=timedelta(minutes=5),
            key_id=key_id,
        )
    with session_scope(engine) as session:
        ledger.settle(session=session, hold_id=request_id, cost=tokens)


async def test_the_card_shows_limits_and_a_reply_sets_them(
    alice: TelegramUser, telegram: FakeTelegram, session: Session, engine: Engine
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-lim")
    await alice.send("/key")
    assert "🚦 <b>Limits</b>: none; this key can spend the whole balance." in (
        telegram.last_text_to(alice.id)
    )
    key_id = key_id_on_card(telegram)
    account_id = account_of(session, alice).id
    assert account_id is not None
    spend(engine, account_id, key_id, 120)

    await alice.tap(f"key:limits:{key_id}")
    prompt = telegram.sent_to(alice.id)[-1]
    assert prompt["text"].startswith("🚦 Limits for the key «default»")
    await alice.send("spend 5000 daily; rpm 60; models demo; expires 2099-01-31", reply_to=prompt)

    assert "🚦 The limits of «default» are set" in "\n".join(telegram.texts_to(alice.id))
    card = telegram.last_text_to(alice.id)
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d 00:00 UTC")
    assert f"spent 120 of 5,000 tokens this day (resets {tomorrow})" in card
    assert "expires 2099-01-31 00:00 UTC; models demo; 60 requests a minute" in card
    with session_scope(engine) as reader:
        report = key_limits.report(session=reader, key_id=key_id, now=datetime.now(UTC))
        assert report is not None
        assert (report.limits.spend, report.limits.period, report.limits.rpm) == (
            5000,
            "daily",
            60,
        )

    await alice.tap(f"key:limits:{key_id}")
    await alice.send("spend lots", reply_to=telegram.sent_to(alice.id)[-1])
    assert telegram.last_text_to(alice.id).startswith("🚦 Nothing changed: Write the spend limit")

    await alice.tap(f"key:limits:{key_id}")
    await alice.send("clear", reply_to=telegram.sent_to(alice.id)[-1])
    assert "🚦 <b>Limits</b>: none" in telegram.last_text_to(alice.id)


async def test_someone_elses_key_id_in_a_forged_reply_changes_nothing(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram, session: Session
) -> None:
    await buy_pack(boris, telegram, charge_id="charge-boris")
    await boris.send("/key")
    boris_key = key_id_on_card(telegram)
    await buy_pack(alice, telegram, charge_id="charge-alice")
    await alice.send("/key")
    alice_key = key_id_on_card(telegram)
    await alice.tap(f"key:limits:{alice_key}")
    prompt = telegram.sent_to(alice.id)[-1]
    prompt.params["text"] = prompt["text"].replace(f"#{alice_key}", f"#{boris_key}")

    await alice.send("spend 1 total", reply_to=prompt)

    assert telegram.last_text_to(alice.id) == "That key no longer exists."
    session.rollback()
    row = session.get(ApiKey, boris_key)
    assert row is not None and row.limit_id is not None
    report = key_limits.report(session=session, key_id=boris_key, now=datetime.now(UTC))
    assert report is not None and report.limits.spend is None


async def test_spend_alerts_arrive_once_at_80_and_100_percent_and_expiry_once(
    alice: TelegramUser, telegram: FakeTelegram, shop_bot, session: Session, engine: Engine
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-al")
    await alice.send("/key")
    key_id = key_id_on_card(telegram)
    account_id = account_of(session, alice).id
    assert account_id is not None
    with session_scope(engine) as writer:
        key_limits.set_limits(
            session=writer,
            account_id=account_id,
            key_id=key_id,
            changes={"spend": 1000, "period": "weekly"},
            now=datetime.now(UTC),
        )
    telegram.forget()

    spend(engine, account_id, key_id, 700)
    assert await send_key_alerts(shop_bot) == []  # 70%: nothing yet
    spend(engine, account_id, key_id, 150)
    first = await send_key_alerts(shop_bot)
    again = await send_key_alerts(shop_bot)
    spend(engine, account_id, key_id, 150)
    full = await send_key_alerts(shop_bot)
    after = await send_key_alerts(shop_bot)

    texts = telegram.texts_to(alice.id)
    assert [alert.level for alert in first] == [80] and again == []
    assert [alert.level for alert in full] == [100] and after == []
    assert len(texts) == 2
    assert texts[0].startswith("⚠️ Your key «default» (…")
    assert "has spent 850 of its 1,000 tokens this week: 80% of its limit" in texts[0]
    assert "has spent its limit of 1,000 tokens this week; it refuses requests" in texts[1]

    in_two_days = datetime.now(UTC) + timedelta(days=2)
    with session_scope(engine) as writer:
        key_limits.set_limits(
            session=writer,
            account_id=account_id,
            key_id=key_id,
            changes={"expires_at": in_two_days},
            now=datetime.now(UTC),
        )
    expiry = await send_key_alerts(shop_bot)
    assert [alert.kind for alert in expiry] == ["expiry"]
    assert await send_key_alerts(shop_bot) == []
    assert telegram.last_text_to(alice.id).startswith("⏳ Your key «default» (…")
    assert f"expires {in_two_days:%Y-%m-%d %H:%M} UTC" in telegram.last_text_to(alice.id)
    assert len(telegram.texts_to(alice.id)) == 3


async def test_operator_defaults_apply_to_a_buyers_first_key(
    bot_settings, engine: Engine, telegram: FakeTelegram, session: Session
) -> None:
    from tests.bot.stories import another_bot

    settings = bot_settings.model_copy(
        update={"key_default_limits": "spend 20000 daily; rpm 30; expires 90d"}
    )
    async with another_bot(settings) as bot:
        carol = TelegramUser(bot, id=100_003, first_name="Carol", language_code="en")
        await buy_pack(carol, telegram, charge_id="charge-def")
    account_id = account_of(session, carol).id
    assert account_id is not None
    (key,) = keys.live_keys(session=session, account_id=account_id)
    assert key.id is not None
    report = key_limits.report(session=session, key_id=key.id, now=datetime.now(UTC))
    assert report is not None
    assert (report.limits.spend, report.limits.period, report.limits.rpm) == (20000, "daily", 30)
    assert report.limits.expires_at is not None
    assert timedelta(days=89) < report.limits.expires_at - datetime.now(UTC) <= timedelta(days=90)
