"""The operator's shop commands: promo codes, and the stray charges still owed back."""

from __future__ import annotations

from sqlmodel import Session

from billing import promos, stray_charges
from tests.factories import make_account


def test_an_operator_creates_and_lists_promo_codes(tokenshop, engine):
    made = tokenshop("promo", "create", "spring", "--tokens", "5000", "--uses", "20")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "promo SPRING: 5000 tokens, 20 uses, no expiry"

    again = tokenshop("promo", "create", "SPRING", "--tokens", "1", "--uses", "1")
    assert again.returncode == 2
    assert again.stderr.strip() == "tokenshop: error: The code SPRING exists already."

    with Session(engine) as session:
        account = make_account(session)
        assert account.id is not None
        promos.redeem(session=session, account_id=account.id, code="spring")
        session.commit()
    listed = tokenshop("promo", "list")
    assert listed.stdout.splitlines() == ["SPRING\t5000 tokens\t1/20\t-"]


def test_strays_lists_the_charges_still_owed_back(tokenshop, engine):
    assert tokenshop("strays").stdout.strip() == "strays: none owed"
    with Session(engine) as session:
        for charge_id in ("charge-owed", "charge-back"):
            stray_charges.record(
                session=session,
                charge_id=charge_id,
                telegram_id=42,
                amount=50,
                currency="XTR",
                payload="order",
                reason="paid",
            )
        stray_charges.mark_refunded(session=session, charge_id="charge-back")
        session.commit()

    owed = tokenshop("strays")

    assert owed.returncode == 1
    assert owed.stdout.splitlines() == ["charge-owed\tuser 42\t50 Stars\tpaid\tnot tried"]
    assert tokenshop("audit").stdout.strip() == "audit: ok"
