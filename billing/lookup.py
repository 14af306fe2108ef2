"""Small read queries the operator's tools need and billing's write paths keep private."""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, select

from billing.models import Account, Purchase


@dataclass(frozen=True)
class PurchaseOwner:
    purchase: Purchase
    telegram_id: int | None  # None for an account made by the CLI


def find_purchase(*, session: Session, charge_id: str) -> PurchaseOwner | None:
    """The purchase of a Telegram charge id and who paid it (a refund needs both)."""
    row = session.exec(
        select(Purchase, Account.telegram_id)
        .join(Account, col(Account.id) == Purchase.account_id)
        .where(col(Purchase.telegram_payment_charge_id) == charge_id)
    ).first()
    if row is None:
        return None
    purchase, telegram_id = row
    return PurchaseOwner(purchase, telegram_id)


def purchase_by_id(*, session: Session, purchase_id: int) -> PurchaseOwner | None:
    """A purchase by its row id (what a button carries: charge ids can pass 64 bytes)."""
    row = session.exec(
        select(Purchase, Account.telegram_id)
        .join(Account, col(Account.id) == Purchase.account_id)
        .where(col(Purchase.id) == purchase_id)
    ).first()
    if row is None:
        return None
    purchase, telegram_id = row
    return PurchaseOwner(purchase, telegram_id)
