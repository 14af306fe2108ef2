"""API keys: format, checksum, storage and authentication.

A key is `sk-tks-` + 40 base62 characters of secret + 6 base62 characters of CRC32 checksum.
The checksum lets us reject typos and random probes without touching the database. The secret
is HMAC(SECRET_KEY, salt), so the database holds only the salt and a SHA-256 of the key: a
leaked database reveals no usable key, yet the bot can show the buyer their key again.

An account holds up to `MAX_LIVE_KEYS` named keys. Every change to an account's keys locks the
account row first, so two changes at once (two rotations, a creation racing the cap) take turns.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import zlib
from dataclasses import dataclass

from sqlalchemy import update
from sqlmodel import Session, col, select

from billing.errors import AccountNotFound, InvalidKey, KeyNotFound, RevokedKey, TooManyKeys
from billing.ledger import lock_account
from billing.models import Account, ApiKey, utcnow

KEY_PREFIX = "sk-tks-"
SECRET_LENGTH = 40
CHECKSUM_LENGTH = 6
HINT_LENGTH = 4
MAX_LIVE_KEYS = 10
NAME_LENGTH = 64
DEFAULT_NAME = "default"
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_KEY_PATTERN = re.compile(
    rf"^{re.escape(KEY_PREFIX)}([0-9A-Za-z]{{{SECRET_LENGTH}}})([0-9A-Za-z]{{{CHECKSUM_LENGTH}}})$"
)


@dataclass(frozen=True)
class KeyIdentity:
    """Who a valid key belongs to."""

    account_id: int
    key_id: int


def _base62(number: int, width: int) -> str:
    digits = []
    for _ in range(width):
        number, digit = divmod(number, 62)
        digits.append(_ALPHABET[digit])
    return "".join(reversed(digits))


def _checksum(secret: str) -> str:
    return _base62(zlib.crc32(secret.encode()), CHECKSUM_LENGTH)


def derive_key(secret_key: bytes, salt: str) -> str:
    """The key for a salt; the same SECRET_KEY and salt always give the same key."""
    digest = hmac.new(secret_key, salt.encode(), hashlib.sha256).digest()
    secret = _base62(int.from_bytes(digest, "big"), SECRET_LENGTH)
    return f"{KEY_PREFIX}{secret}{_checksum(secret)}"


def is_well_formed(key: str) -> bool:
    match = _KEY_PATTERN.match(key)
    if match is None:
        return False
    return hmac.compare_digest(_checksum(match.group(1)), match.group(2))


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def mask_key(key: str) -> str:
    """A form safe to show anywhere: the prefix and the last characters."""
    return f"{KEY_PREFIX}…{key[-HINT_LENGTH:]}"


def authenticate(*, session: Session, key: str) -> KeyIdentity:
    """Find the live key; raises InvalidKey (malformed or unknown) or RevokedKey."""
    if not is_well_formed(key):
        raise InvalidKey()
    presented_hash = hash_key(key)
    row = session.exec(select(ApiKey).where(ApiKey.key_hash == presented_hash)).first()
    if row is None or not hmac.compare_digest(row.key_hash, presented_hash):
        raise InvalidKey()
    if row.revoked_at is not None:
        raise RevokedKey()
    assert row.id is not None
    return KeyIdentity(account_id=row.account_id, key_id=row.id)


def live_keys(*, session: Session, account_id: int) -> list[ApiKey]:
    """The account's keys that work, oldest first."""
    return list(
        session.exec(
            select(ApiKey)
            .where(col(ApiKey.account_id) == account_id, col(ApiKey.revoked_at).is_(None))
            .order_by(col(ApiKey.id))
        ).all()
    )


def active_key(*, session: Session, account_id: int) -> ApiKey | None:
    """The account's oldest live key (the one the CLI and a first purchase show)."""
    found = live_keys(session=session, account_id=account_id)
    return found[0] if found else None


def show_key(*, session: Session, account_id: int, secret_key: bytes) -> str | None:
    """The account's oldest live key, re-derived from its salt, or None if it has none."""
    row = active_key(session=session, account_id=account_id)
    return derive_key(secret_key, row.salt) if row else None


def key_of(*, session: Session, account_id: int, key_id: int, secret_key: bytes) -> str:
    """One live key of the account, in full; raises KeyNotFound."""
    return derive_key(secret_key, _live(session, account_id, key_id).salt)


def ensure_key(*, session: Session, account_id: int, secret_key: bytes) -> tuple[str, bool]:
    """The live key, issuing one if the account has none; the flag says whether it is new."""
    lock_account(session, account_id)  # two first purchases at once issue one key
    existing = show_key(session=session, account_id=account_id, secret_key=secret_key)
    if existing is not None:
        return existing, False
    return _issue(session=session, account_id=account_id, secret_key=secret_key), True


def create_key(
    *, session: Session, account_id: int, secret_key: bytes, name: str = DEFAULT_NAME
) -> tuple[ApiKey, str]:
    """A new named key beside the others; raises TooManyKeys at `MAX_LIVE_KEYS`."""
    lock_account(session, account_id)
    if len(live_keys(session=session, account_id=account_id)) >= MAX_LIVE_KEYS:
        raise TooManyKeys(f"An account can hold {MAX_LIVE_KEYS} live keys; revoke one first.")
    key = _issue(session=session, account_id=account_id, secret_key=secret_key, name=name)
    row = session.exec(select(ApiKey).where(col(ApiKey.key_hash) == hash_key(key))).one()
    return row, key


def rename_key(*, session: Session, account_id: int, key_id: int, name: str) -> ApiKey:
    row = _live(session, account_id, key_id)
    row.name = clean_name(name)
    session.add(row)
    session.flush()
    return row


def rotate_key(
    *, session: Session, account_id: int, secret_key: bytes, key_id: int | None = None
) -> str:
    """Replace one key (by default the oldest live one) with a new key of the same name, in one
    transaction; with no live key, issue one. Raises KeyNotFound for a key that is not live."""
    lock_account(session, account_id)
    row = (
        _live(session, account_id, key_id)
        if key_id is not None
        else active_key(session=session, account_id=account_id)
    )
    if row is None:
        return _issue(session=session, account_id=account_id, secret_key=secret_key)
    assert row.id is not None
    if not _revoke(session, account_id, row.id):
        raise KeyNotFound("That key was revoked meanwhile.")
    return _issue(session=session, account_id=account_id, secret_key=secret_key, name=row.name)


def revoke_key(*, session: Session, account_id: int, key_id: int | None = None) -> bool:
    """Revoke one key, or every live key of the account when `key_id` is None; False if there
    was nothing live to revoke. No replacement is issued."""
    return _revoke(session, account_id, key_id)


def clean_name(name: str) -> str:
    """A key's name as shown: one line, trimmed, at most NAME_LENGTH characters."""
    return " ".join(name.split())[:NAME_LENGTH] or DEFAULT_NAME


def _revoke(session: Session, account_id: int, key_id: int | None) -> bool:
    statement = update(ApiKey).where(
        col(ApiKey.account_id) == account_id, col(ApiKey.revoked_at).is_(None)
    )
    if key_id is not None:
        statement = statement.where(col(ApiKey.id) == key_id)
    result = session.execute(statement.values(revoked_at=utcnow()))
    return result.rowcount > 0  # type: ignore[attr-defined]


def _live(session: Session, account_id: int, key_id: int) -> ApiKey:
    row = session.get(ApiKey, key_id)
    if row is None or row.account_id != account_id or row.revoked_at is not None:
        raise KeyNotFound("No such live key.")
    return row


def _issue(
    *, session: Session, account_id: int, secret_key: bytes, name: str = DEFAULT_NAME
) -> str:
    if session.get(Account, account_id) is None:
        raise AccountNotFound(f"No account {account_id}.")
    salt = secrets.token_hex(16)
    key = derive_key(secret_key, salt)
    session.add(
        ApiKey(
            account_id=account_id,
            name=clean_name(name),
            salt=salt,
            key_hash=hash_key(key),
            hint=key[-HINT_LENGTH:],
        )
    )
    session.flush()
    return key
