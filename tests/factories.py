"""Factories for the rows tests need: `make_x(session, **overrides)`, committed and returned."""

from __future__ import annotations

import itertools
from typing import Any

from sqlmodel import Session

from billing import keys, ledger
from billing.models import Account, Purchase
from billing.packs import Pack
from billing.purchases import credit_purchase

_ids = itertools.count(1)


def make_account(session: Session, *, tokens: int = 0, **overrides: Any) -> Account:
    """An account, optionally granted `tokens`."""
    fields = {"telegram_id": 10_000 + next(_ids)} | overrides
    account = Account(**fields)
    session.add(account)
    session.flush()
    assert account.id is not None
    if tokens:
        ledger.grant(session=session, account_id=account.id, tokens=tokens)
    session.commit()
    session.refresh(account)
    return account


def make_key(session: Session, account: Account, *, secret_key: bytes) -> str:
    assert account.id is not None
    key, _ = keys.ensure_key(session=session, account_id=account.id, secret_key=secret_key)
    session.commit()
    return key


def make_purchase(
    session: Session,
    account: Account,
    *,
    charge_id: str | None = None,
    tokens: int = 1000,
    price: int = 10,
) -> Purchase:
    assert account.id is not None
    result = credit_purchase(
        session=session,
        account_id=account.id,
        charge_id=charge_id or f"charge-{next(_ids)}",
        pack=Pack("test", "Test pack", tokens, price),
    )
    session.commit()
    return result.purchase
