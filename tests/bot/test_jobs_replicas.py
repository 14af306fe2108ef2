"""The bot's jobs across bot processes: the reconciliation's position and the problems it
reported live in the database, so a restarted (or second) bot goes on where the first stopped
and tells the operators nothing twice; and a job runs in one process at a time."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from telegram.ext import Application

from billing.locks import single_runner
from bot.jobs import RECONCILE_LOCK, reconcile_star_transactions
from bot.settings import BotSettings
from tests.bot.conftest import ADMIN_ID
from tests.bot.double import FakeTelegram, TelegramUser, star_payment
from tests.bot.stories import another_bot, buy_pack, order_pack
from tests.conftest import TEST_DATABASE_URL

pytestmark = pytest.mark.anyio


def alerts(telegram: FakeTelegram) -> list[str]:
    return [text for text in telegram.texts_to(ADMIN_ID) if "Star transactions" in text]


async def test_a_restarted_bot_goes_on_where_the_last_run_stopped_and_reports_nothing_twice(
    shop_bot: Application,  # type: ignore[type-arg]
    bot_settings: BotSettings,
    alice: TelegramUser,
    telegram: FakeTelegram,
) -> None:
    invoice = await order_pack(alice, telegram)
    telegram.star_transactions += [
        star_payment("charge-stray-1", alice, 50, "not-an-order"),
        star_payment("charge-cheap", alice, 1, invoice.payload),
    ]
    first = await reconcile_star_transactions(shop_bot)
    assert first.seen == 2 and len(first.problems) == 2
    assert len(alerts(telegram)) == 1

    async with another_bot(bot_settings) as restarted:
        again = await reconcile_star_transactions(restarted)
        assert again.seen == 0  # the position came from the database, not from memory
        telegram.star_transactions.append(star_payment("charge-stray-2", alice, 50, "nothing"))
        later = await reconcile_star_transactions(restarted)

    assert later.seen == 1 and len(later.problems) == 1
    told = alerts(telegram)
    assert len(told) == 2
    assert "charge-stray-2" in told[1] and "charge-stray-1" not in told[1]


@pytest.mark.skipif(
    not TEST_DATABASE_URL,
    reason="PostgreSQL only: on SQLite one bot process runs (its advisory locks are no-ops)",
)
async def test_a_job_another_bot_process_is_running_is_skipped_here(
    shop_bot: Application,  # type: ignore[type-arg]
    alice: TelegramUser,
    telegram: FakeTelegram,
    engine: Engine,
) -> None:
    await buy_pack(alice, telegram, charge_id="charge-1")
    telegram.star_transactions.append(star_payment("charge-stray", alice, 50, "not-an-order"))
    telegram.forget()

    with single_runner(engine, RECONCILE_LOCK) as held:  # the other process's run, in progress
        assert held
        skipped = await reconcile_star_transactions(shop_bot)
    assert skipped.skipped and skipped.seen == 0
    assert telegram.calls("getStarTransactions") == []

    ran = await reconcile_star_transactions(shop_bot)  # that run ended: the next one is ours
    assert not ran.skipped and ran.seen == 1
