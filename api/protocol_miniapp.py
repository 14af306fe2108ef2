"""The Mini App's JSON API on the wire (`/app/api`): every figure the page shows is one of these,
so a test reads the same numbers without a browser. Errors keep the API's one shape
(`{"error": {"message", "type", "code"}}`, api/errors.py)."""

from __future__ import annotations

from datetime import datetime
from enum import IntEnum

from pydantic import BaseModel, Field, model_validator


class Days(IntEnum):
    """The windows the pages offer."""

    week = 7
    month = 30
    quarter = 90


class SignIn(BaseModel):
    init_data: str = Field(description="Telegram.WebApp.initData, as the page received it")


class Me(BaseModel):
    telegram_id: int
    name: str | None
    language: str | None
    operator: bool  # ADMIN_TELEGRAM_IDS: the operator pages are open to this user
    terms_accepted: bool


class SessionOut(BaseModel):
    token: str  # send as `Authorization: Bearer <token>` until `expires_at`
    expires_at: datetime
    me: Me


class BalanceOut(BaseModel):
    available: int
    held: int  # reserved by requests in flight
    purchased: int
    granted: int
    used: int
    refunded: int


class ModelSeries(BaseModel):
    """One model's tokens per day, aligned with `UsageOut.days` (0 on a day without use)."""

    model: str
    prompt: list[int]
    completion: list[int]
    charged: list[int]  # balance tokens billed: the model's prices applied
    requests: list[int]


class UsageOut(BaseModel):
    days: list[str]  # every UTC day of the window, oldest first (YYYY-MM-DD)
    models: list[ModelSeries]


class KeyLimitsOut(BaseModel):
    """A key's own limits (billing.key_limits) and where it stands; None: that limit is off."""

    spend: int | None  # tokens per period
    period: str  # daily, weekly, monthly or total
    spent: int  # billed this period
    held: int  # reserved by the key's running requests
    remaining: int | None
    resets_at: datetime | None
    expires_at: datetime | None
    models: list[str]  # empty: every model
    rpm: int | None
    tpm: int | None


class KeyOut(BaseModel):
    id: int
    name: str
    masked: str  # sk-tks-…abcd; the full key only in KeyIssued, once
    created_at: datetime
    requests: int
    charged: int
    limits: KeyLimitsOut | None = None  # None: a key from before limits existed


class LimitsText(BaseModel):
    """Limits written as the bot takes them: `spend 5000 daily; rpm 60; models demo; expires
    2027-01-31`, `<limit> off`, `clear`."""

    text: str = Field(min_length=1, max_length=2048)


class KeyIssued(BaseModel):
    """A new key (create, rotate): the one time the page sees it in full."""

    key: KeyOut
    secret: str


class KeyName(BaseModel):
    name: str = Field(default="default", max_length=200)


class PackOut(BaseModel):
    id: str
    title: str
    tokens: int
    price: int  # Telegram Stars


class PlanOut(PackOut):
    """A monthly plan: `tokens` for `price` Stars every `period_days`, until cancelled."""

    period_days: int


class ShopOut(BaseModel):
    packs: list[PackOut]
    plans: list[PlanOut] = []
    terms_accepted: bool


class InvoiceRequest(BaseModel):
    """A pack (`pack_id`) or a monthly plan (`plan_id`), one of the two."""

    pack_id: str | None = None
    plan_id: str | None = None

    @model_validator(mode="after")
    def _one_of_the_two(self) -> InvoiceRequest:
        if (self.pack_id is None) == (self.plan_id is None):
            raise ValueError("send pack_id or plan_id")
        return self


class InvoiceOut(BaseModel):
    invoice_link: str  # for Telegram.WebApp.openInvoice; tokens come with the bot's credit


class SupportMessageOut(BaseModel):
    from_operator: bool
    text: str
    at: datetime


class SupportOut(BaseModel):
    messages: list[SupportMessageOut]  # oldest first


class SupportWrite(BaseModel):
    text: str = Field(min_length=1, max_length=4096)


class SupportSent(BaseModel):
    delivered: int  # operators who received it


class PackDayOut(BaseModel):
    day: str
    pack: str
    purchases: int
    stars: int


class RefundsOut(BaseModel):
    day: str
    refunds: int
    stars: int


class BuyersDayOut(BaseModel):
    day: str
    new: int
    paying: int


class TopAccountOut(BaseModel):
    account_id: int
    telegram_id: int | None
    name: str | None
    used: int
    stars: int


class StrayOut(BaseModel):
    charge_id: str
    telegram_id: int
    stars: int
    reason: str
    at: datetime
    error: str | None


class WaitingOut(BaseModel):
    account_id: int
    telegram_id: int | None
    name: str | None
    text: str
    at: datetime


class HoldsOut(BaseModel):
    holds: int
    tokens: int
    oldest: datetime | None


class UpstreamOut(BaseModel):
    model: str
    url: str
    up: bool
    in_flight: int


class OperatorOut(BaseModel):
    """The operator's pages over the last `days`."""

    days: list[str]
    revenue: int  # Stars in the window
    sales: list[PackDayOut]
    refunds: list[RefundsOut]
    buyers: list[BuyersDayOut]
    usage: UsageOut  # tokens per day per model, every account
    top_accounts: list[TopAccountOut]
    stray_charges: list[StrayOut]  # not refunded yet
    support_queue: list[WaitingOut]
    open_holds: HoldsOut
    upstreams: list[UpstreamOut]
