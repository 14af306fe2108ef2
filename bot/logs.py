"""Keeping the bot token and the buyers' API keys out of the logs.

Bot API URLs contain the token (`https://api.telegram.org/bot<token>/sendMessage`): httpx logs
every request URL at INFO, and python-telegram-bot logs its base URL and every call's parameters
(the text of a message that shows a key, say) at DEBUG. Two layers: httpx's request log is
turned down to WARNING, and a filter rewrites the token and anything shaped like an API key
wherever it still appears (a message, its arguments, a traceback). A logger's filters see only
records logged on that very logger, so the filter goes on each logger that can carry them and,
in `__main__`, on the root handlers that every record passes through.
"""

from __future__ import annotations

import logging
import re

from billing.keys import CHECKSUM_LENGTH, KEY_PREFIX, SECRET_LENGTH, mask_key

REDACTED = "<bot-token>"
LOGGERS = ("httpx", "httpcore", "telegram.Bot", "telegram.ext.ExtBot")
_API_KEY = re.compile(rf"{re.escape(KEY_PREFIX)}[0-9A-Za-z]{{{SECRET_LENGTH + CHECKSUM_LENGTH}}}")


class Redact(logging.Filter):
    """Rewrite the bot token and API keys in a record before any handler formats it."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def clean(self, text: str) -> str:
        text = text.replace(self.token, REDACTED)
        return _API_KEY.sub(lambda match: mask_key(match.group(0)), text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = self.clean(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.clean(record.exc_text)
        return True

    def __eq__(self, other: object) -> bool:  # adding the same filter twice is a no-op
        return isinstance(other, Redact) and other.token == self.token

    def __hash__(self) -> int:
        return hash(self.token)


def protect_token(token: str) -> None:
    """Quiet httpx's request log and redact the libraries' records that can carry secrets."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for name in LOGGERS:
        logging.getLogger(name).addFilter(Redact(token))


def protect_handlers(token: str, logger: logging.Logger | None = None) -> None:
    """Redact every record that reaches `logger`'s handlers (the root's): our own loggers too."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(Redact(token))
