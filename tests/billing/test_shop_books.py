"""The shop's books under races: keys, referral rewards, promo uses and stray-charge refunds
each move once, whichever of several transactions gets there first."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from billing import keys, ledger, promos, referrals, stray_charges
from billing.db import session_scope
from billing.errors import KeyNotFound, PromoError, TooManyKeys
from billing.models import LedgerEntry, Referral
from billing.packs import Pack
from billing.purchases import credit_purchase
from tests.factories import make_account

PACK = Pack("starter", "Starter", 100_000, 50)


def at_once(engine: Engine, count: int, work: Any) -> list[Any]:
    """`work(session, n)` in `count` threads, each in its own transaction; each result or error."""

    def one(n: int) -> Any:
        try:
            with session_scope(engine) as session:
                return work(session, n)
        except Exception as error:  # the race's losers are the point
            return error

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_an_account_holds_at_most_max_live_keys(session: Session, secret_key: bytes) -> None:
    account = make_account(session)
    assert account.id is not None
    for n in range(keys.MAX_LIVE_KEYS):
        keys.create_key(session=session, account_id=account.id, secret_key=secret_key, name=f"k{n}")
    with pytest.raises(TooManyKeys):
        keys.create_key(session=session, account_id=account.id, secret_key=secret_key)
    assert keys.revoke_key(session=session, account_id=account.id, key_id=None)
    assert keys.live_keys(session=session, account_id=account.id) == []


def test_two_rotations_of_one_key_racing_leave_one_replacement(
    engine: Engine, session: Session, secret_key: bytes
) -> None:
    account = make_account(session)
    assert account.id is not None
    account_id = account.id
    row, _ = keys.create_key(session=session, account_id=account_id, secret_key=secret_key)
    other, _ = keys.create_key(session=session, account_id=account_id, secret_key=secret_key)
    session.commit()

    results = at_once(
        engine,
        4,
        lambda s, _: keys.rotate_key(
            session=s, account_id=account_id, secret_key=secret_key, key_id=row.id
        ),
    )

    assert sum(isinstance(result, str) for result in results) == 1
    assert all(isinstance(r, str | KeyNotFound) for r in results)
    session.rollback()
    live = keys.live_keys(session=session, account_id=account_id)
    assert len(live) == 2 and other.id in {key.id for key in live}


def test_a_referral_is_rewarded_once_when_two_first_purchases_race(
    engine: Engine, session: Session
) -> None:
    referrer, buyer = make_account(session), make_account(session)
    assert referrer.id is not None and buyer.id is not None
    buyer_id = buyer.id
    code = referrals.code_of(session=session, account_id=referrer.id)
    assert referrals.link(session=session, account_id=buyer_id, code=code, share_percent=10)
    session.commit()

    at_once(
        engine,
        4,
        lambda s, n: credit_purchase(
            session=s, account_id=buyer_id, charge_id=f"charge-{n}", pack=PACK
        ),
    )

    session.rollback()
    rewards = session.exec(
        select(LedgerEntry).where(
            LedgerEntry.account_id == referrer.id, LedgerEntry.kind == "grant"
        )
    ).all()
    assert [entry.amount for entry in rewards] == [10_000]
    assert session.exec(select(Referral)).one().reward_tokens == 10_000
    assert ledger.audit(session=session) == []


def test_ten_accounts_racing_for_the_last_uses_of_a_code(engine: Engine, session: Session) -> None:
    accounts = [make_account(session) for _ in range(10)]
    ids = [account.id for account in accounts]
    promos.create_promo(session=session, code="THREE", tokens=7, max_uses=3)
    session.commit()

    results = at_once(
        engine, 10, lambda s, n: promos.redeem(session=s, account_id=ids[n], code="three")
    )

    assert sum(isinstance(result, promos.Redeemed) for result in results) == 3
    assert sorted(r.reason for r in results if isinstance(r, PromoError)) == ["used_up"] * 7
    session.rollback()
    granted = session.exec(select(LedgerEntry).where(LedgerEntry.note == "promo THREE")).all()
    assert len(granted) == 3
    assert ledger.audit(session=session) == []


def test_one_caller_of_many_claims_a_stray_charges_refund(engine: Engine, session: Session) -> None:
    recorded = at_once(
        engine,
        4,
        lambda s, _: (
            stray_charges.record(
                session=s,
                charge_id="charge-stray",
                telegram_id=7,
                amount=50,
                currency="XTR",
                payload=None,
                reason="paid",
            ).new
        ),
    )
    claims = at_once(
        engine, 4, lambda s, _: stray_charges.claim_refund(session=s, charge_id="charge-stray")
    )

    assert sorted(recorded) == [False, False, False, True]
    assert sorted(claims) == [False, False, False, True]
    with session_scope(engine) as writer:
        stray_charges.mark_failed(session=writer, charge_id="charge-stray", error="timed out")
    with session_scope(engine) as writer:  # a failed try frees the claim for a retry
        assert stray_charges.claim_refund(session=writer, charge_id="charge-stray")
        stray_charges.mark_refunded(session=writer, charge_id="charge-stray")
    with session_scope(engine) as writer:
        assert not stray_charges.claim_refund(session=writer, charge_id="charge-stray")
