"""Running the bot: the token stays out of the logs, webhooks need Telegram's secret, a missing
token stops it with one line, and a failing handler costs one apology, not the bot."""

from __future__ import annotations

import io
import logging
import re
import socket

import httpx
import pytest
from sqlalchemy import Engine
from telegram.ext import Application

import bot.handlers.balance
import bot.handlers.payments
from bot.__main__ import main
from bot.app import build_application
from bot.logs import REDACTED, protect_handlers
from bot.settings import BotSettings
from tests.bot.double import API_BASE_URL, BOT_TOKEN, FakeTelegram, TelegramUser
from tests.bot.stories import buy_pack, order_pack, pre_checkout_answer

pytestmark = pytest.mark.anyio


async def test_neither_the_token_nor_a_key_reaches_the_logs_even_at_debug(
    bot_settings: BotSettings,
    engine: Engine,
    telegram: FakeTelegram,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    shop_bot = build_application(bot_settings)  # logs its Bot API URL at DEBUG
    caplog.set_level(logging.DEBUG, logger="httpx")  # an operator turns request logs back on
    alice = TelegramUser(shop_bot, id=100_001)
    await shop_bot.initialize()
    assert shop_bot.post_init is not None
    await shop_bot.post_init(shop_bot)
    try:
        await buy_pack(alice, telegram, charge_id="charge-log")
        await alice.send("/key")
    finally:
        assert shop_bot.post_shutdown is not None
        await shop_bot.post_shutdown(shop_bot)
        await shop_bot.shutdown()

    assert "HTTP Request: POST https://telegram.test/bot" in caplog.text
    assert f"/bot{REDACTED}/sendInvoice" in caplog.text
    assert "Calling Bot API endpoint `sendMessage`" in caplog.text
    key = re.search(r"sk-tks-\w+", " ".join(telegram.texts_to(alice.id)))
    assert key is not None
    assert key.group(0) not in caplog.text
    assert BOT_TOKEN not in caplog.text
    assert BOT_TOKEN.split(":")[1] not in caplog.text


async def test_httpx_request_lines_are_off_by_default(
    alice: TelegramUser, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    await alice.send("/start")

    assert "HTTP Request" not in caplog.text


def test_the_root_handlers_redact_the_token_from_any_logger_and_traceback() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("tests.bot.redaction")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        protect_handlers(BOT_TOKEN, logger)
        logger.error("calling %s", f"https://api.telegram.org/bot{BOT_TOKEN}/getMe")
        try:
            raise RuntimeError(f"failed for bot{BOT_TOKEN}")
        except RuntimeError:
            logger.exception("request failed")
    finally:
        logger.removeHandler(handler)

    assert BOT_TOKEN not in stream.getvalue()
    assert stream.getvalue().count(REDACTED) == 2


async def test_webhook_mode_refuses_updates_without_telegrams_secret_token(
    shop_bot: Application,  # type: ignore[type-arg]
    telegram: FakeTelegram,
) -> None:
    assert telegram.router is not None and shop_bot.updater is not None
    telegram.router.route(host="127.0.0.1").pass_through()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await shop_bot.updater.start_webhook(
        listen="127.0.0.1",
        port=port,
        url_path="telegram",
        webhook_url="https://bot.example.test/telegram",
        secret_token="s3cret-token",
    )
    try:
        assert telegram.last("setWebhook")["secret_token"] == "s3cret-token"
        update = {"update_id": 1, "message": None}
        url = f"http://127.0.0.1:{port}/telegram"
        async with httpx.AsyncClient() as client:
            missing = await client.post(url, json=update)
            wrong = await client.post(
                url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "guess"}
            )
            right = await client.post(
                url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret-token"}
            )
    finally:
        await shop_bot.updater.stop()

    assert (missing.status_code, wrong.status_code, right.status_code) == (403, 403, 200)


def test_a_missing_token_stops_the_bot_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)

    with pytest.raises(SystemExit) as stopped:
        main()

    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "TELEGRAM_BOT_TOKEN is not set" in error


def test_a_webhook_without_a_secret_is_refused_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", BOT_TOKEN)
    monkeypatch.setenv("WEBHOOK_URL", "https://bot.example.test/telegram")
    monkeypatch.delenv("WEBHOOK_SECRET_TOKEN", raising=False)

    with pytest.raises(SystemExit) as stopped:
        main()

    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "WEBHOOK_SECRET_TOKEN" in error


def test_settings_read_operator_ids_as_written(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADMIN_TELEGRAM_IDS", "111, 222 333")

    settings = BotSettings()

    assert settings.admin_telegram_ids == frozenset({111, 222, 333})
    assert settings.public_api_base_url == "http://localhost:8000/v1"


def test_building_without_a_token_is_refused(bot_settings: BotSettings) -> None:
    with pytest.raises(ValueError, match="TELEGRAM_BOT_TOKEN"):
        build_application(bot_settings.model_copy(update={"telegram_bot_token": None}))


async def test_a_failing_handler_costs_an_apology_and_the_bot_keeps_running(
    alice: TelegramUser,
    telegram: FakeTelegram,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(**_: object) -> None:
        raise RuntimeError("database on fire")

    monkeypatch.setattr(bot.handlers.balance.ledger, "get_balance", broken)

    await alice.send("/balance")

    assert telegram.last_text_to(alice.id).startswith("Sorry, something went wrong")
    assert "database on fire" in caplog.text
    await alice.send("/help")
    assert "How it works" in telegram.last_text_to(alice.id)


async def test_a_failing_pre_checkout_check_still_answers_and_refuses(
    alice: TelegramUser, telegram: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> None:
    invoice = await order_pack(alice, telegram)

    def broken(**_: object) -> None:
        raise RuntimeError("database on fire")

    monkeypatch.setattr(bot.handlers.payments, "check_order_payable", broken)

    await alice.pre_checkout(invoice.payload, invoice.amount)

    assert pre_checkout_answer(telegram) == (
        False,
        "This invoice cannot be paid. Please choose a pack again.",
    )


def test_a_token_telegram_rejects_stops_the_bot_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
    telegram: FakeTelegram,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", BOT_TOKEN)
    monkeypatch.setenv("TELEGRAM_API_BASE_URL", API_BASE_URL)
    monkeypatch.setenv("DATABASE_URL", database_url)
    telegram.fail("getMe", "Unauthorized", status=401)

    with pytest.raises(SystemExit) as stopped:
        main()  # long polling, as `tokenshop bot` runs it

    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert (
        error == "tokenshop bot: Telegram rejected TELEGRAM_BOT_TOKEN; check it with @BotFather\n"
    )
