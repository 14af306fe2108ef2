"""Settings shared by every process that touches the books (API, bot, CLI)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from billing.errors import InvalidLimits
from billing.key_limits import KeyDefaults, parse_defaults
from billing.packs import Pack, parse_catalog
from billing.plans import Plan, parse_plans
from billing.prices import Price, parse_model_prices, price_table

DEFAULT_SECRET_FILE = Path(".tokenshop-secret")
PLACEHOLDER_SECRETS = {"", "changeme", "change-me", "secret", "dev", "development", "test"}
MIN_SECRET_LENGTH = 32


class BillingSettings(BaseSettings):
    """Read from the environment and `.env`.

    `SECRET_KEY` derives every API key, so losing it makes the keys shown in Telegram unshowable
    and changing it invalidates all of them. In development a random one is generated once and
    kept in `.tokenshop-secret` (mode 0600); in production it must be set explicitly.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    database_url: str = "sqlite:///./tokenshop.db"
    secret_key: SecretStr | None = None
    environment: Literal["development", "production"] = "development"
    packs: str | None = None
    plans: str | None = None  # monthly plans, `id:tokens:stars[:title]` like PACKS; unset: none
    hold_ttl_seconds: int = 300
    secret_file: Path = DEFAULT_SECRET_FILE
    # The served models (docs/upstreams.md); its price fields and MODEL_PRICES ("big=2.5,...",
    # one multiplier for prompt and completion) price every request, and the bot shows them.
    models_file: str | None = None
    model_prices: str = ""
    # Limits every new key starts with (docs/keys.md), e.g. "spend 100000 daily; rpm 60;
    # expires 90d"; a buyer or operator changes them per key. Empty: none.
    key_default_limits: str = ""
    # Tokens given to every new account (0: none), on its first contact with the bot or the
    # Mini App, whichever comes first.
    starter_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _require_real_secret_in_production(self) -> BillingSettings:
        if self.environment == "production":
            value = self.secret_key.get_secret_value() if self.secret_key else ""
            if value.strip().lower() in PLACEHOLDER_SECRETS or len(value) < MIN_SECRET_LENGTH:
                raise ValueError(
                    "SECRET_KEY must be set to a random value of at least "
                    f"{MIN_SECRET_LENGTH} characters in production"
                )
        return self

    @field_validator("packs")
    @classmethod
    def _packs_parse(cls, value: str | None) -> str | None:
        parse_catalog(value)
        return value

    @field_validator("plans")
    @classmethod
    def _plans_parse(cls, value: str | None) -> str | None:
        parse_plans(value)
        return value

    @field_validator("key_default_limits")
    @classmethod
    def _key_defaults_parse(cls, value: str) -> str:
        try:
            parse_defaults(value)
        except InvalidLimits as exc:
            raise ValueError(str(exc)) from exc
        return value

    def key_defaults(self) -> KeyDefaults | None:
        return parse_defaults(self.key_default_limits)

    @field_validator("model_prices")
    @classmethod
    def _prices_parse(cls, value: str) -> str:
        parse_model_prices(value)
        return value

    def prices(self) -> dict[str, Price]:
        """Each priced model's price (a model left out costs 1 per token)."""
        return price_table(models_file=self.models_file, model_prices=self.model_prices)

    def catalog(self) -> tuple[Pack, ...]:
        return parse_catalog(self.packs)

    def plan_catalog(self) -> tuple[Plan, ...]:
        return parse_plans(self.plans)

    def resolved_secret_key(self) -> bytes:
        """The key material, generating the development secret file on first use."""
        if self.secret_key is not None:
            return self.secret_key.get_secret_value().encode()
        return _development_secret(self.secret_file)


def _development_secret(path: Path) -> bytes:
    """Read the development secret, making it on first use. It is written to a private temporary
    file and linked into place, so concurrent first runs (API, bot, CLI) all end up reading the
    same complete value."""
    if not path.exists():
        fd, temporary = tempfile.mkstemp(dir=path.parent or ".", prefix=".tokenshop-secret-")
        try:
            with os.fdopen(fd, "w") as handle:  # mkstemp makes it 0600
                handle.write(secrets.token_urlsafe(48) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            os.unlink(temporary)
    return path.read_text().strip().encode()


def parse_telegram_ids(value: object) -> object:
    """`ADMIN_TELEGRAM_IDS=123,456` (commas or spaces), as an operator would write it; read the
    same way by the bot (its operators) and the API (the Mini App's operator pages)."""
    if isinstance(value, str):
        parts = [part for part in re.split(r"[,\s]+", value.strip()) if part]
        if not all(part.lstrip("-").isdigit() for part in parts):
            raise ValueError("must be Telegram user ids separated by commas, e.g. 123,456")
        return frozenset(int(part) for part in parts)
    return value
