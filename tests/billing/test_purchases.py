"""Money moves once: purchases are credited once per Telegram charge id."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from billing import accounts, ledger, purchases
from billing.db import session_scope
from billing.errors import OrderError
from billing.packs import Pack
from tests.factories import make_account

PACK = Pack("starter", "Starter", 1_000, 50)


def test_the_same_charge_credited_twice_credits_once(session):
    account = make_account(session)
    first = purchases.credit_purchase(
        session=session, account_id=account.id, charge_id="ch-1", pack=PACK
    )
    again = purchases.credit_purchase(
        session=session, account_id=account.id, charge_id="ch-1", pack=PACK
    )
    session.commit()
    assert (first.newly_credited, again.newly_credited) == (True, False)
    assert first.purchase.id == again.purchase.id
    assert ledger.get_balance(session=session, account_id=account.id).purchased == 1_000


def test_two_different_charges_credit_twice(session):
    account = make_account(session)
    for charge in ("ch-1", "ch-2"):
        purchases.credit_purchase(
            session=session, account_id=account.id, charge_id=charge, pack=PACK
        )
    session.commit()
    assert ledger.get_balance(session=session, account_id=account.id).balance == 2_000


def test_the_same_charge_from_two_workers_at_once_credits_once(engine, session):
    account = make_account(session)

    def deliver(_: int) -> bool:
        with session_scope(engine) as worker:
            return purchases.credit_purchase(
                session=worker, account_id=account.id, charge_id="ch-race", pack=PACK
            ).newly_credited

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(deliver, range(8)))
    session.commit()
    assert results.count(True) == 1
    assert ledger.get_balance(session=session, account_id=account.id).balance == 1_000
    assert ledger.audit(session=session) == []


def _order(session, telegram_id: int, ttl: timedelta = timedelta(hours=1)):
    account = accounts.get_or_create_account(session=session, telegram_id=telegram_id)
    order = purchases.create_order(session=session, account_id=account.id, pack=PACK, ttl=ttl)
    session.commit()
    return order


def test_pre_checkout_accepts_the_buyers_own_unpaid_order_at_its_price(session):
    order = _order(session, telegram_id=42)
    checked = purchases.check_order_payable(
        session=session, order_id=order.id, telegram_id=42, amount=50, currency="XTR"
    )
    assert checked.id == order.id


@pytest.mark.parametrize(
    ("order_id", "telegram_id", "amount", "currency", "reason"),
    [
        ("no-such-order", 42, 50, "XTR", "not known"),
        (None, 43, 50, "XTR", "someone else"),
        (None, 42, 49, "XTR", "price has changed"),
        (None, 42, 50, "USD", "price has changed"),
    ],
)
def test_pre_checkout_refuses_forged_orders(
    session, order_id, telegram_id, amount, currency, reason
):
    order = _order(session, telegram_id=42)
    with pytest.raises(OrderError, match=reason):
        purchases.check_order_payable(
            session=session,
            order_id=order_id or order.id,
            telegram_id=telegram_id,
            amount=amount,
            currency=currency,
        )


def test_pre_checkout_refuses_an_expired_or_paid_order(session):
    expired = _order(session, telegram_id=42, ttl=timedelta(seconds=-1))
    with pytest.raises(OrderError, match="expired"):
        purchases.check_order_payable(
            session=session, order_id=expired.id, telegram_id=42, amount=50, currency="XTR"
        )
    order = _order(session, telegram_id=42)
    purchases.credit_order_payment(
        session=session, order_id=order.id, telegram_id=42, charge_id="ch-1"
    )
    session.commit()
    with pytest.raises(OrderError, match="already been paid"):
        purchases.check_order_payable(
            session=session, order_id=order.id, telegram_id=42, amount=50, currency="XTR"
        )


def test_a_paid_order_credits_its_snapshot_even_after_it_expired(session):
    order = _order(session, telegram_id=42, ttl=timedelta(seconds=-1))
    result = purchases.credit_order_payment(
        session=session, order_id=order.id, telegram_id=42, charge_id="ch-1"
    )
    session.commit()
    assert result.newly_credited and result.purchase.tokens == PACK.tokens
    assert result.purchase.order_id == order.id


def test_a_payment_for_someone_elses_order_is_refused(session):
    order = _order(session, telegram_id=42)
    with pytest.raises(OrderError):
        purchases.credit_order_payment(
            session=session, order_id=order.id, telegram_id=7, charge_id="ch-1"
        )
