"""The bot's settings: the billing settings plus what talking to Telegram needs.

One object per process, built from the environment (and `.env`) in `__main__` and handed to
`build_application`, so tests build their own without touching the environment.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from billing.settings import BillingSettings, parse_telegram_ids

_SECRET_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


class BotSettings(BillingSettings):
    """Environment variables of `tokenshop bot` (see the README's configuration table)."""

    telegram_bot_token: SecretStr | None = None
    # A self-hosted Bot API server (or a test double), e.g. `http://localhost:8081/bot`.
    # The token is appended, or put where `{token}` appears.
    telegram_api_base_url: str | None = None
    admin_telegram_ids: Annotated[frozenset[int], NoDecode] = frozenset()
    public_api_base_url: str = "http://localhost:8000/v1"
    snippet_model: str = "demo"  # the model named in the ready-to-paste snippet
    # e.g. "@shop_support" or an e-mail address, shown by /paysupport beside the in-bot support
    support_contact: str = ""
    # The Mini App's address (https, e.g. https://shop.example.com/app/, docs/miniapp.md): the
    # menu button and buttons under My key and Balance open it. Unset: the bot works as before.
    public_app_url: str | None = None

    webhook_url: str | None = None  # set to run in webhook mode instead of long polling
    webhook_secret_token: SecretStr | None = None  # required with WEBHOOK_URL
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = 8443  # the local path served is WEBHOOK_URL's path

    low_balance_tokens: int = Field(default=10_000, ge=0)  # 0: only the "ran out" notice
    notice_interval_seconds: float = Field(default=60, gt=0)
    reconcile_interval_seconds: float = Field(default=3600, gt=0)
    # how long before a plan renews its buyer is told (what it costs, how to cancel)
    plan_reminder_hours: float = Field(default=48, gt=0)

    # Refunds the terms promise: within this many days of a purchase, while the buyer's available
    # balance still covers the pack (Stars refunds are all or nothing).
    refund_window_days: int = Field(default=14, ge=0)
    # Under that rule a buyer's request is refunded at once; False: every request waits for an
    # operator's tap.
    refund_automatically: bool = True
    # Growth: the referrer's share (percent of the tokens) of a referred buyer's first purchase
    # (STARTER_TOKENS, for every new account, is one of the billing settings).
    referral_share_percent: int = Field(default=10, ge=0, le=100)

    @field_validator("admin_telegram_ids", mode="before")
    @classmethod
    def _split_ids(cls, value: Any) -> Any:
        return parse_telegram_ids(value)

    @field_validator("public_app_url")
    @classmethod
    def _app_url_is_https(cls, value: str | None) -> str | None:
        if value and not value.startswith("https://"):
            raise ValueError("PUBLIC_APP_URL must be an https:// address: Telegram opens no other")
        return value or None

    @model_validator(mode="after")
    def _production_needs_operators(self) -> BotSettings:
        """Support messages, stray charges and refunds go to the operators: a shop that sells
        without anyone to receive them is not allowed to start."""
        if self.environment == "production" and not self.admin_telegram_ids:
            raise ValueError(
                "ADMIN_TELEGRAM_IDS is required in production: support messages, refunds and "
                "payment alerts go to the operators"
            )
        return self

    @model_validator(mode="after")
    def _webhook_needs_secret(self) -> BotSettings:
        if self.webhook_url:
            secret = (
                self.webhook_secret_token.get_secret_value() if self.webhook_secret_token else ""
            )
            if not _SECRET_TOKEN.match(secret):
                raise ValueError(
                    "WEBHOOK_SECRET_TOKEN (1-256 of A-Z, a-z, 0-9, _ and -) is required with "
                    "WEBHOOK_URL, so that only Telegram can post updates"
                )
        return self

    def token(self) -> str:
        """The bot token; callers check `telegram_bot_token` first."""
        assert self.telegram_bot_token is not None
        return self.telegram_bot_token.get_secret_value()
