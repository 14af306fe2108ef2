"""Errors of the billing domain. The API and the bot each map them to a reply once, at their edge.

BillingError
├── InvalidKey              malformed, unknown key (rejected before any lookup when malformed)
│   └── RevokedKey          a key that was rotated or revoked
├── KeyNotFound             a key id that is not a live key of the account
├── TooManyKeys             an account at its cap of live keys asks for another
├── AccountNotFound         no account with that id / Telegram id
├── InsufficientBalance     fewer tokens available than the request needs at the least
├── TooManyRequests         the key already has its limit of requests in flight
├── UnknownPack             a pack id that is not in the catalog
├── OrderError              an order that cannot be paid (unknown, expired, paid, wrong price)
├── PurchaseNotFound        no purchase with that Telegram charge id
├── PromoError              a promo code that cannot be created or redeemed
└── InvalidAmount           a token amount that is not a positive whole number
"""

from __future__ import annotations


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
