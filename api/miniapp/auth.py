"""Who is calling the Mini App's JSON API: Telegram's signed `initData`, then a short session.

Telegram signs the launch parameters it hands the page (`Telegram.WebApp.initData`): `hash` is
HMAC-SHA256 of the other `key=value` pairs sorted by key and joined by newlines (`signature`,
Telegram's own Ed25519 signature for third parties, stays among them), under a secret that is
HMAC-SHA256 of the bot token keyed by the string `WebAppData`. Only the bot's owner can make a
valid one, so the user it names is the user who opened the page; `initDataUnsafe` is never read.
`auth_date` older than the configured age is refused, so a leaked string stops working.

A page that proved itself gets a session token: HMAC-signed (under a key derived from
SECRET_KEY), stateless, so any replica accepts it, and short-lived, after which the page signs
in again with `initData`. Each request carries one of them, in Telegram's documented shape:
`Authorization: tma <initData>` or `Authorization: Bearer <session>`. Neither is ever logged
(api.logging redacts both).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl

SESSION_PREFIX = "tks-app."
CLOCK_SKEW = timedelta(minutes=5)  # auth_date this far ahead of our clock is still accepted


class AppAuthError(Exception):
    """Base of the Mini App's authentication errors; each is a 401 at the edge, with a message
    that says what to do and nothing of the secret."""


class MissingCredentials(AppAuthError):
    """Raised when a request carries neither initData nor a session token."""


class InvalidInitData(AppAuthError):
    """Raised when initData is malformed or its hash does not match (tampered, another bot's)."""


class StaleInitData(AppAuthError):
    """Raised when initData's auth_date is older than the allowed age."""


class InvalidSession(AppAuthError):
    """Raised when a session token is malformed, forged or expired."""


@dataclass(frozen=True)
class TelegramUser:
    """The user a valid initData names."""

    id: int
    first_name: str
    last_name: str | None = None
    username: str | None = None
    language_code: str | None = None

    @property
    def full_name(self) -> str:
        return " ".join(part for part in (self.first_name, self.last_name) if part)


def _secret(bot_token: str) -> bytes:
    return hmac.new(b"WebAppData", bot_token.encode(), hashlib.sha256).digest()


def _hash(fields: dict[str, str], bot_token: str) -> str:
    check = "\n".join(f"{key}={value}" for key, value in sorted(fields.items()))
    return hmac.new(_secret(bot_token), check.encode(), hashlib.sha256).hexdigest()


def verify_init_data(
    init_data: str, *, bot_token: str, max_age: timedelta, now: datetime | None = None
) -> TelegramUser:
    """The user of a genuine, fresh initData; raises InvalidInitData or StaleInitData."""
    try:
        pairs = parse_qsl(init_data, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise InvalidInitData("initData is not a query string.") from None
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise InvalidInitData("initData repeats a field.")
    presented = fields.pop("hash", "")
    if not hmac.compare_digest(_hash(fields, bot_token), presented):
        raise InvalidInitData("initData's signature does not match.")
    try:
        signed_at = datetime.fromtimestamp(int(fields["auth_date"]), UTC)
        user = json.loads(fields["user"])
        telegram_user = TelegramUser(
            id=int(user["id"]),
            first_name=str(user.get("first_name") or ""),
            last_name=user.get("last_name"),
            username=user.get("username"),
            language_code=user.get("language_code"),
        )
    except (KeyError, ValueError, TypeError, OverflowError):
        raise InvalidInitData("initData has no valid auth_date and user.") from None
    now = now or datetime.now(UTC)
    if now - signed_at > max_age:
        raise StaleInitData("initData is too old; open the app from Telegram again.")
    if signed_at - now > CLOCK_SKEW:
        raise InvalidInitData("initData is dated in the future.")
    return telegram_user


@dataclass(frozen=True)
class Session:
    """What a session token says: whose it is and until when."""

    telegram_id: int
    account_id: int
    expires_at: datetime


def _session_key(secret_key: bytes) -> bytes:
    return hmac.new(secret_key, b"tokenshop mini app session", hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue_session(
    *, secret_key: bytes, telegram_id: int, account_id: int, lifetime: timedelta
) -> tuple[str, Session]:
    expires = datetime.now(UTC) + lifetime
    body = _b64(
        json.dumps({"t": telegram_id, "a": account_id, "e": int(expires.timestamp())}).encode()
    )
    mac = hmac.new(_session_key(secret_key), body.encode(), hashlib.sha256).digest()
    at = datetime.fromtimestamp(int(expires.timestamp()), UTC)
    session = Session(telegram_id, account_id, at)
    return f"{SESSION_PREFIX}{body}.{_b64(mac)}", session


def read_session(token: str, *, secret_key: bytes, now: datetime | None = None) -> Session:
    """The session a token carries; raises InvalidSession if forged, malformed or expired."""
    body, _, mac = token.removeprefix(SESSION_PREFIX).partition(".")
    if not token.startswith(SESSION_PREFIX) or not body or not mac:
        raise InvalidSession("The session token is malformed.")
    expected = hmac.new(_session_key(secret_key), body.encode(), hashlib.sha256).digest()
    try:
        valid = hmac.compare_digest(expected, _unb64(mac))
        claims = json.loads(_unb64(body)) if valid else None
        session = (
            Session(int(claims["t"]), int(claims["a"]), datetime.fromtimestamp(claims["e"], UTC))
            if claims
            else None
        )
    except (ValueError, KeyError, TypeError, OverflowError):
        session = None
    if session is None:
        raise InvalidSession("The session token is not valid.")
    if session.expires_at <= (now or datetime.now(UTC)):
        raise InvalidSession("The session has expired; sign in again.")
    return session
