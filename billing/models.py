"""Every table of Tokenshop. Billing owns them; the API and the bot go through billing's functions.

Amounts are whole tokens. Times are aware UTC datetimes (`utcnow()`), stored as UTC.
The CHECK constraints are the second line of defence behind the guarded UPDATEs in `ledger.py`:
if a bug ever tried to overdraw, the database refuses the write instead of recording it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, CheckConstraint, Column, Integer, UniqueConstraint
from sqlmodel import Field, SQLModel

# Token amounts are 64-bit: PostgreSQL's INTEGER stops at 2,147,483,647, which a big account's
# balance can pass (a purchase credited past it failed). SQLite's INTEGER is 64-bit already.
TOKENS = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Account(SQLModel, table=True):
    """A buyer: one per Telegram user, or made by the operator's CLI without one."""

    __tablename__ = "account"
    __table_args__ = (
        CheckConstraint("balance >= 0", name="ck_account_balance_nonnegative"),
        CheckConstraint("held >= 0", name="ck_account_held_nonnegative"),
        CheckConstraint("held <= balance", name="ck_account_held_within_balance"),
        CheckConstraint("open_holds >= 0", name="ck_account_open_holds_nonnegative"),
    )

    id: int | None = Field(default=None, primary_key=True)
    telegram_id: int | None = Field(
        default=None, sa_column=Column(BigInteger, unique=True, nullable=True)
    )
    name: str | None = Field(default=None, max_length=255)
    language: str | None = Field(default=None, max_length=16)
    # the cached sum of ledger entries; checked by `audit`
    balance: int = Field(default=0, sa_type=TOKENS)
    held: int = Field(default=0, sa_type=TOKENS)  # reserved by in-flight requests
    # requests in flight (open holds), capped per key in the statement that places a hold
    open_holds: int = 0
    terms_accepted_at: datetime | None = None
    notice_level: str = Field(default="ok", max_length=16)  # last balance notice sent
    chosen_language: str | None = Field(default=None, max_length=16)  # the bot's language picker
    # the code in this buyer's referral link, /start ref_<code>
    referral_code: str | None = Field(default=None, max_length=32, unique=True, index=True)
    blocked_at: datetime | None = None  # the user blocked the bot: no notices until unblocked
    # the bot asked this buyer to write to support: their next plain message goes to operators
    support_prompt_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)


class ApiKey(SQLModel, table=True):
    """A key's salt and hash; the key itself is HMAC(SECRET_KEY, salt) and is never stored.
    An account has several named keys; `billing.keys` caps how many are live at once."""

    __tablename__ = "api_key"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="account.id", index=True)
    name: str = Field(default="default", max_length=64)
    salt: str = Field(max_length=64)
    key_hash: str = Field(max_length=64, unique=True)
    hint: str = Field(max_length=8)  # last characters, for the masked form
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None
    # its limits and spend (`billing.key_limits`), shared with the keys it was rotated from
    limit_id: int | None = Field(default=None, foreign_key="key_limit.id", index=True)


class KeyLimit(SQLModel, table=True):
    """A key's limits and what it has spent against them (`billing.key_limits`). A rotated key's
    successor points at the same row, so rotating a key keeps its spend. `held` and `spent` move
    with the key's holds, under the same guarded UPDATEs as the account's (`billing.ledger`)."""

    __tablename__ = "key_limit"
    __table_args__ = (
        CheckConstraint("held >= 0 AND spent >= 0 AND spent_total >= 0", name="ck_key_limit_sums"),
        CheckConstraint(
            "period IN ('daily', 'weekly', 'monthly', 'total')", name="ck_key_limit_period"
        ),
        CheckConstraint(
            "(spend_limit IS NULL OR spend_limit >= 0) AND (rpm IS NULL OR rpm > 0) "
            "AND (tpm IS NULL OR tpm > 0)",
            name="ck_key_limit_values",
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="account.id", index=True)
    spend_limit: int | None = Field(default=None, sa_type=TOKENS)  # None: the balance's
    period: str = Field(default="total", max_length=16)  # when `spent` starts again from 0
    period_start: datetime | None = None  # the period `spent` belongs to (None: total)
    spent: int = Field(default=0, sa_type=TOKENS)  # billed this period
    held: int = Field(default=0, sa_type=TOKENS)  # reserved by the key's open holds
    spent_total: int = Field(default=0, sa_type=TOKENS)  # billed ever; checked by `audit`
    expires_at: datetime | None = None
    models: str | None = Field(default=None, max_length=1024)  # comma-separated; None: all
    rpm: int | None = None  # requests per minute
    tpm: int | None = Field(default=None, sa_type=TOKENS)  # tokens per minute
    window_start: datetime | None = None  # the minute RPM and TPM count in
    window_requests: int = 0
    window_tokens: int = Field(default=0, sa_type=TOKENS)  # held and billed in that minute
    alert_level: int = 0  # percent of the limit last announced this period (0, 80, 100)
    alert_period: datetime | None = None  # the period `alert_level` belongs to
    expiry_alerted_for: datetime | None = None  # the expiry time the buyer was warned of
    updated_at: datetime = Field(default_factory=utcnow)


class Order(SQLModel, table=True):
    """A pack the buyer chose; the invoice payload is this row's opaque id."""

    __tablename__ = "order"
    __table_args__ = (CheckConstraint("tokens > 0 AND price > 0", name="ck_order_positive"),)

    id: str = Field(primary_key=True, max_length=64)
    account_id: int = Field(foreign_key="account.id", index=True)
    pack_id: str = Field(max_length=64)
    pack_title: str = Field(max_length=255)
    tokens: int = Field(sa_type=TOKENS)
    price: int
    currency: str = Field(default="XTR", max_length=8)
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime
    paid_at: datetime | None = None
    # set for a monthly plan: the invoice link asks Telegram to charge again every this many
    # seconds, and every charge names this order (billing.subscriptions)
    subscription_period: int | None = None


class Purchase(SQLModel, table=True):
    """A successful payment, with a snapshot of the pack as it was sold."""

    __tablename__ = "purchase"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="account.id", index=True)
    order_id: str | None = Field(default=None, foreign_key="order.id", max_length=64)
    telegram_payment_charge_id: str = Field(max_length=255, unique=True)
    provider_payment_charge_id: str | None = Field(default=None, max_length=255)
    pack_id: str = Field(max_length=64)
    pack_title: str = Field(max_length=255)
    tokens: int = Field(sa_type=TOKENS)
    price: int
    currency: str = Field(default="XTR", max_length=8)
    created_at: datetime = Field(default_factory=utcnow)
    refunded_at: datetime | None = None
    refunded_tokens: int = Field(default=0, sa_type=TOKENS)
    # tokens already spent when the refund came
    refund_shortfall: int = Field(default=0, sa_type=TOKENS)
    # a monthly plan's charge (its first or a renewal); None for a pack
    subscription_id: int | None = Field(default=None, foreign_key="subscription.id", index=True)


class LedgerEntry(SQLModel, table=True):
    """One append-only movement of tokens; an account's balance is the sum of its entries."""

    __tablename__ = "ledger_entry"
    __table_args__ = (
        UniqueConstraint("kind", "purchase_id", name="uq_ledger_once_per_purchase"),
        UniqueConstraint("kind", "request_id", name="uq_ledger_once_per_request"),
        CheckConstraint("kind IN ('purchase', 'grant', 'usage', 'refund')", name="ck_ledger_kind"),
    )

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="account.id", index=True)
    kind: str = Field(max_length=16)
    amount: int = Field(sa_type=TOKENS)  # signed: credits > 0, usage and refunds < 0
    purchase_id: int | None = Field(default=None, foreign_key="purchase.id")
    request_id: str | None = Field(default=None, max_length=64)
    model: str | None = Field(default=None, max_length=255)
    prompt_tokens: int | None = Field(default=None, sa_type=TOKENS)
    completion_tokens: int | None = Field(default=None, sa_type=TOKENS)
    note: str | None = Field(default=None, max_length=255)
    created_at: datetime = Field(default_factory=utcnow, index=True)


class Hold(SQLModel, table=True):
    """A reservation for one request (a pending transfer): it resolves exactly once."""

    __tablename__ = "hold"
    __table_args__ = (
        CheckConstraint("amount > 0", name="ck_hold_amount_positive"),
        CheckConstraint("used >= 0 AND used <= amount", name="ck_hold_used_within_amount"),
        CheckConstraint("state IN ('held', 'settled', 'released')", name="ck_hold_state"),
    )

    id: str = Field(primary_key=True, max_length=64)  # the request id
    account_id: int = Field(foreign_key="account.id", index=True)
    amount: int = Field(sa_type=TOKENS)
    used: int = Field(default=0, sa_type=TOKENS)  # last checkpointed usage; a crash bills this much
    state: str = Field(default="held", max_length=16, index=True)
    model: str | None = Field(default=None, max_length=255)
    # the key that asked; its usage entry (request_id = this id) is that key's usage
    key_id: int | None = Field(default=None, index=True)  # an api_key.id; keys are never deleted
    key_limit_id: int | None = Field(default=None, index=True)  # the key's `KeyLimit`
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime = Field(index=True)
    resolved_at: datetime | None = None
    # the `ApiProcess` that placed it: when that lease lapses, another process resolves it
    owner: str | None = Field(default=None, max_length=64, index=True)


class IdempotentRequest(SQLModel, table=True):
    """A non-streaming request sent with an `Idempotency-Key`: a retry replays its answer."""

    __tablename__ = "idempotent_request"
    __table_args__ = (
        UniqueConstraint("account_id", "key", name="uq_idempotent_request_per_account"),
    )

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="account.id")
    key: str = Field(max_length=255)
    body_hash: str = Field(max_length=64)
    status_code: int | None = None  # None while the first attempt is running
    response: str | None = None  # the JSON body that was sent
    created_at: datetime = Field(default_factory=utcnow, index=True)  # deleted after retention
    owner: str | None = Field(default=None, max_length=64)  # the `ApiProcess` running it


class ApiProcess(SQLModel, table=True):
    """One incarnation of an API process: its lease, kept alive by a heartbeat.

    Times are the database's clock. When `expires_at` passes (a crash, a lost network) any live
    process resolves the holds this one owned; a process started again under the same `name`
    ends its previous incarnation's lease before it serves."""

    __tablename__ = "api_process"

    id: str = Field(primary_key=True, max_length=64)
    name: str = Field(max_length=255, index=True)
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime = Field(index=True)
    stopped_at: datetime | None = None


class JobState(SQLModel, table=True):
    """Where a background job stopped (the bot's reconciliation offset), kept across restarts
    and shared by every bot process."""

    __tablename__ = "job_state"

    name: str = Field(primary_key=True, max_length=64)
    position: int = Field(default=0, sa_type=TOKENS)
    updated_at: datetime = Field(default_factory=utcnow)


class ReportedProblem(SQLModel, table=True):
    """A problem a job told the operators about, once: the same problem is not reported again."""

    __tablename__ = "reported_problem"

    id: int | None = Field(default=None, primary_key=True)
    job: str = Field(max_length=64)
    digest: str = Field(max_length=64, unique=True)  # SHA-256 of job and message
    charge_id: str | None = Field(default=None, max_length=255, index=True)
    message: str
    reported_at: datetime = Field(default_factory=utcnow)


class StrayCharge(SQLModel, table=True):
    """A paid charge that could not be credited (its order was already paid, unknown, of
    someone else): recorded once per charge id and paid back, never left in limbo."""

    __tablename__ = "stray_charge"

    id: int | None = Field(default=None, primary_key=True)
    telegram_payment_charge_id: str = Field(max_length=255, unique=True)
    telegram_id: int = Field(sa_type=BigInteger, index=True)
    account_id: int | None = Field(default=None, foreign_key="account.id", index=True)
    amount: int  # Stars
    currency: str = Field(default="XTR", max_length=8)
    payload: str | None = Field(default=None, max_length=255)
    reason: str = Field(max_length=32)  # paid, unknown, someone_else, ...
    created_at: datetime = Field(default_factory=utcnow)
    refund_tried_at: datetime | None = None  # the last claim to refund it (one caller at a time)
    refunded_at: datetime | None = None
    refund_error: str | None = Field(default=None, max_length=255)


class SupportMessage(SQLModel, table=True):
    """A message between a buyer and the operators, written in the bot."""

    __tablename__ = "support_message"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="account.id", index=True)
    operator_id: int | None = Field(default=None, sa_type=BigInteger)  # None: from the buyer
    text: str = Field(max_length=4096)
    created_at: datetime = Field(default_factory=utcnow)


class SupportCopy(SQLModel, table=True):
    """Where a buyer's message was shown to an operator, so that a reply to it finds the buyer."""

    __tablename__ = "support_copy"
    __table_args__ = (UniqueConstraint("chat_id", "message_id", name="uq_support_copy_message"),)

    id: int | None = Field(default=None, primary_key=True)
    support_message_id: int = Field(foreign_key="support_message.id", index=True)
    chat_id: int = Field(sa_type=BigInteger)
    message_id: int = Field(sa_type=BigInteger)


class PromoCode(SQLModel, table=True):
    """Tokens an operator gives away: each account redeems a code once, `max_uses` in all."""

    __tablename__ = "promo_code"
    __table_args__ = (
        CheckConstraint("tokens > 0 AND max_uses > 0", name="ck_promo_code_positive"),
        CheckConstraint("uses >= 0 AND uses <= max_uses", name="ck_promo_code_uses_within_max"),
    )

    id: int | None = Field(default=None, primary_key=True)
    code: str = Field(max_length=32, unique=True)
    tokens: int = Field(sa_type=TOKENS)
    max_uses: int
    uses: int = 0
    expires_at: datetime | None = None
    created_by: int | None = Field(default=None, sa_type=BigInteger)
    created_at: datetime = Field(default_factory=utcnow)


class PromoRedemption(SQLModel, table=True):
    __tablename__ = "promo_redemption"
    __table_args__ = (
        UniqueConstraint("promo_id", "account_id", name="uq_promo_redemption_once_per_account"),
    )

    id: int | None = Field(default=None, primary_key=True)
    promo_id: int = Field(foreign_key="promo_code.id")
    account_id: int = Field(foreign_key="account.id", index=True)
    created_at: datetime = Field(default_factory=utcnow)


class Referral(SQLModel, table=True):
    """Who brought whom; the referrer is rewarded once, on the referred buyer's first purchase,
    with the share that was in force when the link was followed."""

    __tablename__ = "referral"
    __table_args__ = (
        CheckConstraint("share_percent >= 0 AND share_percent <= 100", name="ck_referral_share"),
    )

    id: int | None = Field(default=None, primary_key=True)
    referrer_id: int = Field(foreign_key="account.id", index=True)
    referred_id: int = Field(foreign_key="account.id", unique=True)
    share_percent: int
    created_at: datetime = Field(default_factory=utcnow)
    rewarded_at: datetime | None = None
    reward_tokens: int = Field(default=0, sa_type=TOKENS)
    purchase_id: int | None = Field(default=None, foreign_key="purchase.id")


class StoredResponse(SQLModel, table=True):
    """A Responses API answer kept for its account (`store`, the default): the conversation up to
    it, so `previous_response_id` continues it on any replica. Deleted after retention."""

    __tablename__ = "stored_response"

    id: str = Field(primary_key=True, max_length=64)  # resp_...
    account_id: int = Field(foreign_key="account.id", index=True)
    created_at: datetime = Field(default_factory=utcnow, index=True)
    conversation: str  # JSON: the input items that led to it, earlier turns included
    response: str  # JSON: the response object as it was sent


class Subscription(SQLModel, table=True):
    """A monthly plan bought with Telegram Stars: started by its order's first charge and charged
    again by Telegram every period until the buyer cancels. Each charge is a `Purchase` naming
    it; the plan is snapshotted like a pack (billing.subscriptions)."""

    __tablename__ = "subscription"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="account.id", index=True)
    order_id: str = Field(foreign_key="order.id", max_length=64, unique=True)  # every payload
    plan_id: str = Field(max_length=64)
    plan_title: str = Field(max_length=255)
    tokens: int = Field(sa_type=TOKENS)  # credited by each charge
    price: int  # Stars per period
    period_seconds: int
    # the first charge's id: editUserStarSubscription names the subscription by it
    first_charge_id: str | None = Field(default=None, max_length=255, unique=True)
    expires_at: datetime = Field(index=True)  # the paid period's end: Telegram charges again then
    canceled_at: datetime | None = None  # cancelled in the bot: it ends at `expires_at`
    reminded_for: datetime | None = None  # the period end whose renewal notice was sent
    created_at: datetime = Field(default_factory=utcnow)
