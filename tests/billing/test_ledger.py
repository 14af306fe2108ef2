"""The ledger's promises to a buyer and to the operator: never overdraw, resolve once, balance."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import Session

from billing import ledger
from billing.errors import InsufficientBalance, PurchaseNotFound
from billing.models import Hold, utcnow
from tests.factories import make_account, make_purchase

TTL = timedelta(minutes=5)


def _hold(session: Session, account_id: int, request_id: str, lo: int, hi: int) -> Hold:
    row = ledger.hold(
        session=session,
        account_id=account_id,
        request_id=request_id,
        min_tokens=lo,
        max_tokens=hi,
        ttl=TTL,
    )
    session.commit()
    return row


def test_hold_reserves_what_is_asked_and_settle_charges_only_what_was_used(session):
    account = make_account(session, tokens=1_000)
    held = _hold(session, account.id, "req-1", 10, 300)
    assert held.amount == 300
    assert ledger.get_balance(session=session, account_id=account.id).available == 700

    entry = ledger.settle(
        session=session, hold_id="req-1", cost=120, prompt_tokens=20, completion_tokens=100
    )
    session.commit()

    assert entry is not None and entry.amount == -120
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.held, balance.available, balance.used) == (880, 0, 880, 120)
    assert ledger.audit(session=session) == []


def test_hold_is_capped_to_what_is_available(session):
    account = make_account(session, tokens=50)
    held = _hold(session, account.id, "req-1", 10, 4_096)
    assert held.amount == 50


def test_hold_below_the_minimum_is_refused_with_the_numbers(session):
    account = make_account(session, tokens=50)
    with pytest.raises(InsufficientBalance) as refused:
        _hold(session, account.id, "req-1", 51, 4_096)
    assert (refused.value.needed, refused.value.available) == (51, 50)
    assert ledger.get_balance(session=session, account_id=account.id).held == 0


def test_settling_twice_charges_once(session):
    account = make_account(session, tokens=1_000)
    _hold(session, account.id, "req-1", 1, 100)
    assert ledger.settle(session=session, hold_id="req-1", cost=40) is not None
    assert ledger.settle(session=session, hold_id="req-1", cost=40) is None
    assert ledger.release(session=session, hold_id="req-1") is False
    session.commit()
    assert ledger.get_balance(session=session, account_id=account.id).balance == 960
    assert ledger.audit(session=session) == []


def test_settle_never_charges_more_than_the_hold(session):
    account = make_account(session, tokens=1_000)
    _hold(session, account.id, "req-1", 1, 100)
    ledger.settle(session=session, hold_id="req-1", cost=10_000)
    session.commit()
    assert ledger.get_balance(session=session, account_id=account.id).balance == 900


def test_release_gives_everything_back(session):
    account = make_account(session, tokens=1_000)
    _hold(session, account.id, "req-1", 1, 100)
    assert ledger.release(session=session, hold_id="req-1") is True
    session.commit()
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.held) == (1_000, 0)


def test_sweeper_releases_a_hold_older_than_its_expiry(session):
    account = make_account(session, tokens=1_000)
    _hold(session, account.id, "crashed", 1, 100)
    assert ledger.release_stale_holds(session=session) == 0  # not yet expired

    later = utcnow() + TTL + timedelta(seconds=1)
    assert ledger.audit(session=session, now=later) != []  # an open, expired hold is a problem
    assert ledger.release_stale_holds(session=session, now=later) == 1
    session.commit()
    assert session.get(Hold, "crashed", populate_existing=True).state == "released"
    assert ledger.get_balance(session=session, account_id=account.id).available == 1_000
    assert ledger.audit(session=session, now=later) == []


def test_a_crash_after_a_checkpoint_bills_what_was_generated(session):
    account = make_account(session, tokens=1_000)
    _hold(session, account.id, "long", 1, 500)
    assert ledger.checkpoint(session=session, hold_id="long", used=200, ttl=TTL)
    session.commit()

    later = utcnow() + TTL + timedelta(seconds=1)
    assert ledger.release_stale_holds(session=session, now=later) == 1
    session.commit()
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.held, balance.used) == (800, 0, 200)


def test_refund_reverses_a_purchase_once(session):
    account = make_account(session)
    purchase = make_purchase(session, account, charge_id="ch-1", tokens=1_000)
    first = ledger.refund_purchase(session=session, charge_id="ch-1")
    second = ledger.refund_purchase(session=session, charge_id="ch-1")
    session.commit()
    assert (first.newly_refunded, first.reversed_tokens, first.shortfall) == (True, 1_000, 0)
    assert second.newly_refunded is False
    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.purchased, balance.refunded) == (0, 1_000, 1_000)
    assert purchase.id is not None
    assert ledger.audit(session=session) == []


def test_refund_after_spending_keeps_the_balance_at_zero_and_records_the_shortfall(session):
    account = make_account(session)
    make_purchase(session, account, charge_id="ch-1", tokens=1_000)
    _hold(session, account.id, "spend", 1, 700)
    ledger.settle(session=session, hold_id="spend", cost=700)
    session.commit()

    result = ledger.refund_purchase(session=session, charge_id="ch-1")
    session.commit()
    assert (result.reversed_tokens, result.shortfall) == (300, 700)
    assert ledger.get_balance(session=session, account_id=account.id).balance == 0
    assert ledger.audit(session=session) == []


def test_refund_leaves_tokens_held_by_requests_in_flight(session):
    account = make_account(session)
    make_purchase(session, account, charge_id="ch-1", tokens=1_000)
    _hold(session, account.id, "in-flight", 1, 400)
    result = ledger.refund_purchase(session=session, charge_id="ch-1")
    ledger.settle(session=session, hold_id="in-flight", cost=400)
    session.commit()
    assert (result.reversed_tokens, result.shortfall) == (600, 400)
    assert ledger.get_balance(session=session, account_id=account.id).balance == 0
    assert ledger.audit(session=session) == []


def test_refund_of_an_unknown_charge_is_refused(session):
    with pytest.raises(PurchaseNotFound):
        ledger.refund_purchase(session=session, charge_id="nope")


def test_audit_reports_a_balance_that_disagrees_with_the_ledger(session):
    account = make_account(session, tokens=100)
    account.balance = 150
    session.add(account)
    session.commit()
    problems = ledger.audit(session=session)
    assert problems == [f"account {account.id}: balance 150 != ledger sum 100"]


def test_usage_history_lists_the_latest_requests_first(session):
    account = make_account(session, tokens=1_000)
    for n in range(3):
        _hold(session, account.id, f"req-{n}", 1, 10)
        ledger.settle(
            session=session, hold_id=f"req-{n}", cost=n + 1, prompt_tokens=1, completion_tokens=n
        )
    session.commit()
    history = ledger.usage_history(session=session, account_id=account.id, limit=2)
    assert [entry.request_id for entry in history] == ["req-2", "req-1"]


def test_a_balance_past_two_billion_tokens_is_credited_held_and_billed(session):
    """A big account (32-bit integers stop at 2,147,483,647) loses no purchase and no usage."""
    account = make_account(session, tokens=2_000_000_000)
    make_purchase(session, account, tokens=500_000_000)
    _hold(session, account.id, "req-big", 1, 2_400_000_000)
    ledger.settle(
        session=session,
        hold_id="req-big",
        cost=2_300_000_000,
        prompt_tokens=10,
        completion_tokens=5,
    )
    session.commit()

    balance = ledger.get_balance(session=session, account_id=account.id)
    assert (balance.balance, balance.held) == (200_000_000, 0)
    assert ledger.audit(session=session) == []
