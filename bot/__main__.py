"""`python -m bot` / `tokenshop bot`: long polling by default, a webhook when WEBHOOK_URL is set."""

from __future__ import annotations

import logging
import sys
from typing import NoReturn
from urllib.parse import urlparse

from pydantic import ValidationError
from telegram.error import InvalidToken
from telegram.ext import Application

from bot.app import ALLOWED_UPDATES, build_application
from bot.logs import protect_handlers
from bot.settings import BotSettings

EXIT_CONFIG = 2


def main() -> None:
    try:
        settings = BotSettings()
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]).upper()
        reason = first["msg"].removeprefix("Value error, ")
        _stop(f"invalid configuration: {where}: {reason}" if where else reason)
    if settings.telegram_bot_token is None or not settings.token().strip():
        _stop(
            "TELEGRAM_BOT_TOKEN is not set; create a bot with @BotFather and put its token "
            "in the environment or .env"
        )
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO
    )
    protect_handlers(settings.token())
    application = build_application(settings)
    try:
        _run(application, settings)
    except InvalidToken:
        _stop("Telegram rejected TELEGRAM_BOT_TOKEN; check it with @BotFather")


def _run(application: Application, settings: BotSettings) -> None:  # type: ignore[type-arg]
    if settings.webhook_url:
        assert settings.webhook_secret_token is not None  # the settings insist on it
        application.run_webhook(
            listen=settings.webhook_listen,
            port=settings.webhook_port,
            url_path=urlparse(settings.webhook_url).path.lstrip("/"),
            webhook_url=settings.webhook_url,
            secret_token=settings.webhook_secret_token.get_secret_value(),
            allowed_updates=ALLOWED_UPDATES,
        )
    else:
        application.run_polling(allowed_updates=ALLOWED_UPDATES)


def _stop(message: str) -> NoReturn:
    print(f"tokenshop bot: {message}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG)


if __name__ == "__main__":
    main()
