"""Errors of the billing domain. The API and the bot each map them to a reply once, at their edge.

BillingError
├── InvalidKey              malformed, unknown key (rejected before any lookup when malformed)
│   ├── RevokedKey          a key that was rotated or revoked
│   └── KeyExpired          a key past the expiry its owner set
├── KeyLimitError           a key's own limits refuse the request (`billing.key_limits`)
│   ├── KeyLimitReached     its spend limit for the period cannot cover the request
│   ├── KeyRateLimited      its requests or tokens per minute are used up
│   └── ModelNotAllowed     its model list leaves out the model asked for
├── InvalidLimits           limits that cannot be set (unknown period, negative number, ...)
├── KeyNotFound             a key id that is not a live key of the account
├── TooManyKeys             an account at its cap of live keys asks for another
├── AccountNotFound         no account with that id / Telegram id
├── InsufficientBalance     fewer tokens available than the request needs at the least
├── TooManyRequests         the key already has its limit of requests in flight
├── UnknownPack             a pack id that is not in the catalog
├── OrderError              an order that cannot be paid (unknown, expired, paid, wrong price)
├── TermsNotAccepted        an order asked for before the buyer accepted the terms
├── PurchaseNotFound        no purchase with that Telegram charge id
├── PromoError              a promo code that cannot be created or redeemed
└── InvalidAmount           a token amount that is not a positive whole number
"""

from __future__ import annotations

from datetime import datetime


class BillingError(Exception):
    """Base of every billing error."""


class InvalidKey(BillingError):
    """Raised when a presented API key is malformed or matches no stored key."""

    def __init__(self, message: str = "Incorrect API key provided.") -> None:
        super().__init__(message)


class RevokedKey(InvalidKey):
    """Raised when a presented key was rotated or revoked."""

    def __init__(self) -> None:
        super().__init__("This API key has been revoked.")


class KeyExpired(InvalidKey):
    """Raised when a presented key is past its expiry time (an API's 401, as any unusable key)."""

    def __init__(self, expires_at: datetime) -> None:
        super().__init__(f"This API key expired at {expires_at:%Y-%m-%d %H:%M} UTC.")
        self.expires_at = expires_at


class KeyLimitError(BillingError):
    """Base of the refusals a key's own limits make; the account may still have tokens."""


class KeyLimitReached(KeyLimitError):
    """Raised when a key's spend limit, less what it spent this period and holds, is below what
    the request needs at the least. Retrying before `resets_at` (None: never) cannot help."""

    def __init__(
        self, *, limit: int, period: str, spent: int, needed: int, resets_at: datetime | None
    ) -> None:
        when = f"it resets at {resets_at:%Y-%m-%d %H:%M} UTC" if resets_at else "it does not reset"
        span = "in all" if period == "total" else f"per {PERIOD_NOUNS.get(period, period)}"
        super().__init__(
            f"This key's spend limit of {limit} tokens {span} is reached: {spent} spent, and "
            f"this request needs at least {needed} more; {when}."
        )
        self.limit = limit
        self.period = period
        self.spent = spent
        self.needed = needed
        self.resets_at = resets_at


PERIOD_NOUNS = {"daily": "day", "weekly": "week", "monthly": "month"}


class KeyRateLimited(KeyLimitError):
    """Raised when a key has made its requests per minute (`kind` "requests") or used its
    tokens per minute ("tokens"); `retry_after` is the whole seconds until its minute ends."""

    def __init__(self, *, kind: str, limit: int, retry_after: int) -> None:
        super().__init__(
            f"Rate limit reached for this key: {limit} {kind} per minute. "
            f"Retry after {retry_after} s."
        )
        self.kind = kind
        self.limit = limit
        self.retry_after = retry_after


class ModelNotAllowed(KeyLimitError):
    """Raised when a key's model list does not include the model asked for."""

    def __init__(self, model: str, allowed: tuple[str, ...]) -> None:
        super().__init__(
            f"This key may not use the model '{model}'; it may use: {', '.join(allowed)}."
        )
        self.model = model
        self.allowed = allowed


class InvalidLimits(BillingError):
    """Raised when limits cannot be set: an unknown period, a negative number, a bad date."""


class KeyNotFound(BillingError):
    """Raised when a key id names no live key of the account (revoked, or someone else's)."""


class TooManyKeys(BillingError):
    """Raised when an account that holds the most live keys allowed asks for another."""


class AccountNotFound(BillingError):
    """Raised when an operation names an account that does not exist."""


class InsufficientBalance(BillingError):
    """Raised when a hold cannot reserve even the minimum the request needs."""

    def __init__(self, needed: int, available: int) -> None:
        super().__init__(
            f"Insufficient balance: this request needs at least {needed} tokens, "
            f"{available} available."
        )
        self.needed = needed
        self.available = available


class TooManyRequests(BillingError):
    """Raised when a hold would pass the account's limit of requests in flight (all replicas)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"Too many concurrent requests for this key (limit {limit}).")
        self.limit = limit


class UnknownPack(BillingError):
    """Raised when a pack id is not in the catalog."""


class OrderError(BillingError):
    """Raised when an order cannot be paid; the message is safe to show the buyer, and `reason`
    (unknown, someone_else, paid, expired, price) lets each edge say it in its own words."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class TermsNotAccepted(BillingError):
    """Raised when a buyer asks for an invoice before accepting the terms (the Mini App; the
    bot shows the terms instead of the packs)."""


class PromoError(BillingError):
    """Raised when a promo code cannot be created or redeemed; `reason` (invalid, exists,
    unknown, expired, used_up, already) lets each edge say it in its own words."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PurchaseNotFound(BillingError):
    """Raised when a refund names a charge id that was never credited."""


class InvalidAmount(BillingError):
    """Raised when a token amount is zero, negative or otherwise not usable."""


class IdempotencyMismatch(BillingError):
    """Raised when a retry reuses an Idempotency-Key with a different body."""

    def __init__(self) -> None:
        super().__init__(
            "Keys for idempotent requests can only be used with the same parameters "
            "they were first used with."
        )


class IdempotencyConflict(BillingError):
    """Raised when a retry arrives while the first request with its key is still running."""

    def __init__(self) -> None:
        super().__init__("A request with this Idempotency-Key is still being processed.")
