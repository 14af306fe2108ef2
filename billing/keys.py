"""API keys: format, checksum, storage and authentication.

A key is `sk-tks-` + 40 base62 characters of secret + 6 base62 characters of CRC32 checksum.
The checksum lets us reject typos and random probes without touching the database. The secret
is HMAC(SECRET_KEY, salt), so the database holds only the salt and a SHA-256 of the key: a
leaked database reveals no usable key, yet the bot can show the buyer their key again.

An account holds up to `MAX_LIVE_KEYS` named keys. Every change to an account's keys locks the
account row first, so two changes at once (two rotations, a creation racing the cap) take turns.
Each key is issued with a row of limits (`billing.key_limits`, the operator's defaults), which
its successor inherits when it is rotated: the spend and limits belong to the key's place, not to
its secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import zlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import update
from sqlmodel import Session, col, select

from billing import key_limits
from billing.errors import AccountNotFound, InvalidKey, KeyNotFound, RevokedKey, TooManyKeys
from billing.key_limits import KeyDefaults
from billing.ledger import lock_account
from billing.models import Account, ApiKey, KeyLimit, utcnow

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
    """Who a valid key belongs to, and the limits the API checks before it holds any tokens
    (the hold checks them again, as they are in the database then)."""

    account_id: int
    key_id: int
    expires_at: datetime | None = None
    models: tuple[str, ...] = ()

    def check(self, *, model: str | None = None, now: datetime | None = None) -> None:
        """Raise KeyExpired past the expiry, ModelNotAllowed for a model outside the list."""
        key_limits.check_expiry(self.expires_at, now or utcnow())
        if model is not None:
            key_limits.check_model(self.models, model)


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


def authenticate(*, session: Session, key: str, now: datetime | None = None) -> KeyIdentity:
    """Find the live key; raises InvalidKey (malformed or unknown), RevokedKey or KeyExpired."""
    if not is_well_formed(key):
        raise InvalidKey()
    presented_hash = hash_key(key)
    found = session.exec(
        select(ApiKey, KeyLimit)
        .outerjoin(KeyLimit, col(KeyLimit.id) == ApiKey.limit_id)
        .where(ApiKey.key_hash == presented_hash)
    ).first()
    if found is None or not hmac.compare_digest(found[0].key_hash, presented_hash):
        raise InvalidKey()
    row, limits = found
    if row.revoked_at is not None:
        raise RevokedKey()
    assert row.id is not None
    identity = KeyIdentity(
        account_id=row.account_id,
        key_id=row.id,
        expires_at=limits.expires_at if limits else None,
        models=key_limits.split_models(limits.models) if limits else (),
    )
    identity.check(now=now)
    return identity


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


def ensure_key(
    *, session: Session, account_id: int, secret_key: bytes, defaults: KeyDefaults | None = None
) -> tuple[str, bool]:
    """The live key, issuing one if the account has none (with the operator's `defaults`
    limits); the flag says whether it is new."""
    lock_account(session, account_id)  # two first purchases at once issue one key
    existing = show_key(session=session, account_id=account_id, secret_key=secret_key)
    if existing is not None:
        return existing, False
    return _issue(
        session=session, account_id=account_id, secret_key=secret_key, defaults=defaults
    ), True


def create_key(
    *,
    session: Session,
    account_id: int,
    secret_key: bytes,
    name: str = DEFAULT_NAME,
    defaults: KeyDefaults | None = None,
) -> tuple[ApiKey, str]:
    """A new named key beside the others; raises TooManyKeys at `MAX_LIVE_KEYS`."""
    lock_account(session, account_id)
    if len(live_keys(session=session, account_id=account_id)) >= MAX_LIVE_KEYS:
        raise TooManyKeys(f"An account can hold {MAX_LIVE_KEYS} live keys; revoke one first.")
    key = _issue(
        session=session, account_id=account_id, secret_key=secret_key, name=name, defaults=defaults
    )
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
    """Replace one key (by default the oldest live one) with a new key of the same name, limits
    and spend, in one transaction; with no live key, issue one. Raises KeyNotFound for a key
    that is not live."""
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
    return _issue(
        session=session,
        account_id=account_id,
        secret_key=secret_key,
        name=row.name,
        limit_id=row.limit_id,
    )


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
    *,
    session: Session,
    account_id: int,
    secret_key: bytes,
    name: str = DEFAULT_NAME,
    defaults: KeyDefaults | None = None,
    limit_id: int | None = None,
) -> str:
    """A new key row; its limits are `limit_id`'s (a rotation) or a new row of `defaults`."""
    if session.get(Account, account_id) is None:
        raise AccountNotFound(f"No account {account_id}.")
    if limit_id is None:
        limits = key_limits.new_row(account_id=account_id, defaults=defaults, now=utcnow())
        session.add(limits)
        session.flush()
        limit_id = limits.id
    salt = secrets.token_hex(16)
    key = derive_key(secret_key, salt)
    session.add(
        ApiKey(
            account_id=account_id,
            name=clean_name(name),
            salt=salt,
            key_hash=hash_key(key),
            hint=key[-HINT_LENGTH:],
            limit_id=limit_id,
        )
    )
    session.flush()
    return key
