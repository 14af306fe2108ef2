"""Promo codes: tokens an operator gives away, each code redeemed once per account.

A code has a number of uses and an optional expiry. Redeeming takes a use with one guarded
UPDATE (`WHERE uses < max_uses AND not expired`), whose row count decides: of ten buyers racing
for a code's last use exactly one gets it, on either database. The redemption row is unique per
(code, account), and everything (the use, the redemption, the grant) commits together or not
at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing.errors import InvalidAmount, PromoError
from billing.ledger import grant, lock_account
from billing.models import PromoCode, PromoRedemption, utcnow

_CODE = re.compile(r"^[A-Z0-9_-]{3,32}$")


@dataclass(frozen=True)
class Redeemed:
    code: str
    tokens: int


def normalize(code: str) -> str:
    """Codes are case-insensitive: stored and compared in upper case."""
    return code.strip().upper()


def create_promo(
    *,
    session: Session,
    code: str,
    tokens: int,
    max_uses: int,
    expires_at: datetime | None = None,
    created_by: int | None = None,
) -> PromoCode:
    """A new code; raises PromoError ("invalid", "exists") or InvalidAmount."""
    code = normalize(code)
    if not _CODE.match(code):
        raise PromoError("A code is 3-32 letters, digits, _ or -.", "invalid")
    if tokens <= 0 or max_uses <= 0:
        raise InvalidAmount("Tokens and uses must be positive whole numbers.")
    promo = PromoCode(
        code=code, tokens=tokens, max_uses=max_uses, expires_at=expires_at, created_by=created_by
    )
    try:
        with session.begin_nested():
            session.add(promo)
    except IntegrityError:
        raise PromoError(f"The code {code} exists already.", "exists") from None
    return promo


def redeem(*, session: Session, account_id: int, code: str) -> Redeemed:
    """Credit a code's tokens to the account once; raises PromoError with reason "unknown",
    "expired", "used_up" or "already"."""
    now = utcnow()
    promo = session.exec(select(PromoCode).where(col(PromoCode.code) == normalize(code))).first()
    if promo is None or promo.id is None:
        raise PromoError("No such code.", "unknown")
    lock_account(session, account_id)  # one account's attempts take turns
    if _redeemed(session, promo.id, account_id):
        raise PromoError("This code was already redeemed by this account.", "already")
    if promo.expires_at is not None and promo.expires_at <= now:
        raise PromoError("This code has expired.", "expired")
    taken = session.execute(
        update(PromoCode)
        .where(
            col(PromoCode.id) == promo.id,
            col(PromoCode.uses) < col(PromoCode.max_uses),
            or_(col(PromoCode.expires_at).is_(None), col(PromoCode.expires_at) > now),
        )
        .values(uses=PromoCode.uses + 1)
    )
    if taken.rowcount != 1:  # type: ignore[attr-defined]
        raise PromoError("This code has been used up.", "used_up")
    session.add(PromoRedemption(promo_id=promo.id, account_id=account_id))
    session.flush()
    grant(session=session, account_id=account_id, tokens=promo.tokens, note=f"promo {promo.code}")
    return Redeemed(promo.code, promo.tokens)


def list_promos(*, session: Session, limit: int = 20) -> list[PromoCode]:
    """The newest codes, for the operator."""
    return list(
        session.exec(select(PromoCode).order_by(col(PromoCode.id).desc()).limit(limit)).all()
    )


def _redeemed(session: Session, promo_id: int, account_id: int) -> bool:
    return (
        session.exec(
            select(PromoRedemption.id).where(
                col(PromoRedemption.promo_id) == promo_id,
                col(PromoRedemption.account_id) == account_id,
            )
        ).first()
        is not None
    )
