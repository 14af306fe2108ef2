"""Logging for API processes: keys and bearer tokens are redacted from every record."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

# keys, bearer tokens (the Mini App's sessions among them), bot tokens, Mini App initData
_SECRETS = re.compile(
    r"(sk-tks-)[0-9A-Za-z]+|(Bearer\s+)\S+|(bot)\d+:[\w-]+|(tma\s+)\S+|(tks-app\.)[\w.-]+",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """The text with keys and tokens replaced. A key can arrive percent-encoded in a URL's query
    string (`sk%2Dtks%2D...`), which the access log writes as sent: such a line is decoded
    before it is redacted."""
    cleaned = _SECRETS.sub(_mark, text)
    if "%" in cleaned:
        decoded = unquote(cleaned)
        if _SECRETS.search(decoded):
            cleaned = _SECRETS.sub(_mark, decoded)
    return cleaned


def _mark(match: re.Match[str]) -> str:
    return next(group for group in match.groups() if group) + "[redacted]"


class RedactSecrets(logging.Filter):
    """Rewrites a record's message so no key, bearer token or bot token reaches a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
