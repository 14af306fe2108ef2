"""Factories for the rows tests need: `make_x(session, **overrides)`, committed and returned."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from billing import key_limits, keys, ledger
from billing.db import session_scope
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


def bill_request(
    engine: Engine,
    account_id: int,
    request_id: str,
    *,
    cost: int,
    hold: int | None = None,
    model: str = "demo",
    prompt_tokens: int | None = None,
    completion_tokens: int = 0,
) -> None:
    """What the API process does for one request to `model`: hold `hold` tokens (`cost` by
    default), then settle `cost` (all of it prompt tokens unless told otherwise), each in its own
    transaction, as the API commits them. Cost 0 leaves the request running."""
    with session_scope(engine) as session:
        ledger.hold(
            session=session,
            account_id=account_id,
            request_id=request_id,
            min_tokens=1,
            max_tokens=hold or cost,
            ttl=timedelta(minutes=5),
            model=model,
        )
    if cost:
        with session_scope(engine) as session:
            ledger.settle(
                session=session,
                hold_id=request_id,
                cost=cost,
                prompt_tokens=cost if prompt_tokens is None else prompt_tokens,
                completion_tokens=completion_tokens,
            )


def limit_key(
    engine: Engine, account_id: int, key_id: int, text: str, now: datetime | None = None
) -> None:
    """Set a key's limits as the bot and the Mini App do, from text (`spend 500 daily; rpm 3`)."""
    clear, changes = key_limits.parse(text)
    with session_scope(engine) as session:
        key_limits.set_limits(
            session=session,
            account_id=account_id,
            key_id=key_id,
            clear=clear,
            changes=changes,
            now=now or datetime.now(UTC),
        )
