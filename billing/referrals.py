"""Referral links and first contact: `/start ref_<code>` ties a new buyer to whoever shared the
link, and the referrer gets a share of that buyer's first purchase, once.

The share is the operator's setting when the link is followed, kept on the referral, so every
path that credits a purchase (the payment update, reconciliation) rewards the same way without
knowing the settings. The reward is claimed with a guarded UPDATE (`WHERE rewarded_at IS NULL`)
in the transaction that credits the purchase, so it is paid once whatever races.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing.accounts import find_telegram_account
from billing.ledger import grant
from billing.models import Account, Purchase, Referral, utcnow

CODE_LENGTH = 10
_ALPHABET = string.ascii_letters + string.digits
LINK_PREFIX = "ref_"


@dataclass(frozen=True)
class FirstContact:
    account: Account
    created: bool
    starter_tokens: int  # granted now, on creation


@dataclass(frozen=True)
class Reward:
    referrer_id: int
    referrer_telegram_id: int | None
    referrer_language: str | None
    tokens: int


def open_account(
    *,
    session: Session,
    telegram_id: int,
    name: str | None = None,
    language: str | None = None,
    starter_tokens: int = 0,
) -> FirstContact:
    """The user's account, created on first contact (with `starter_tokens`, if the operator
    gives any); safe when two updates of a new user race."""
    account = find_telegram_account(session=session, telegram_id=telegram_id)
    created = False
    if account is None:
        try:
            with session.begin_nested():
                account = Account(telegram_id=telegram_id, name=name, language=language)
                session.add(account)
            created = True
        except IntegrityError:
            account = find_telegram_account(session=session, telegram_id=telegram_id)
            assert account is not None
    assert account.id is not None
    if language and account.language != language:
        account.language = language
        session.add(account)
    granted = 0
    if created and starter_tokens > 0:
        grant(session=session, account_id=account.id, tokens=starter_tokens, note="starter")
        granted = starter_tokens
    return FirstContact(account, created, granted)


def code_of(*, session: Session, account_id: int) -> str:
    """The account's referral code, made on first use."""
    account = session.get(Account, account_id)
    assert account is not None
    while account.referral_code is None:
        try:
            with session.begin_nested():
                account.referral_code = "".join(
                    secrets.choice(_ALPHABET) for _ in range(CODE_LENGTH)
                )
                session.add(account)
        except IntegrityError:  # a collision (1 in 62**10): draw again
            session.refresh(account)
    return account.referral_code


def link(*, session: Session, account_id: int, code: str, share_percent: int) -> bool:
    """Tie a buyer who has bought nothing yet to the owner of `code`; False when the code is
    unknown or the buyer's own, the buyer has bought before, was referred already, or the
    operator gives no share."""
    if share_percent <= 0:
        return False
    referrer = session.exec(select(Account).where(col(Account.referral_code) == code)).first()
    if referrer is None or referrer.id is None or referrer.id == account_id:
        return False
    bought = session.exec(select(Purchase.id).where(col(Purchase.account_id) == account_id)).first()
    if bought is not None:
        return False
    try:
        with session.begin_nested():
            session.add(
                Referral(
                    referrer_id=referrer.id,
                    referred_id=account_id,
                    share_percent=min(share_percent, 100),
                )
            )
    except IntegrityError:
        return False  # referred already
    return True


def referrer_of(*, session: Session, account_id: int) -> int | None:
    """The account to reward on this account's first purchase, if it is still to be rewarded
    (its row is locked with the buyer's, before anything is written)."""
    return session.exec(
        select(Referral.referrer_id).where(
            col(Referral.referred_id) == account_id, col(Referral.rewarded_at).is_(None)
        )
    ).first()


def reward(*, session: Session, purchase: Purchase) -> Reward | None:
    """Pay the referrer's share of this purchase if it is the referred buyer's first rewarded
    one; None when there is nothing (more) to pay."""
    referral = session.exec(
        select(Referral).where(col(Referral.referred_id) == purchase.account_id)
    ).first()
    if referral is None or referral.rewarded_at is not None:
        return None
    tokens = purchase.tokens * referral.share_percent // 100
    claimed = session.execute(
        update(Referral)
        .where(col(Referral.id) == referral.id, col(Referral.rewarded_at).is_(None))
        .values(rewarded_at=utcnow(), reward_tokens=tokens, purchase_id=purchase.id)
    )
    if claimed.rowcount != 1 or tokens <= 0:  # type: ignore[attr-defined]
        return None
    grant(
        session=session,
        account_id=referral.referrer_id,
        tokens=tokens,
        note=f"referral: purchase {purchase.id}",
    )
    referrer = session.get(Account, referral.referrer_id)
    assert referrer is not None
    return Reward(referral.referrer_id, referrer.telegram_id, referrer.language, tokens)


def counts(*, session: Session, account_id: int) -> tuple[int, int]:
    """How many buyers this account brought, and the tokens their first purchases earned it."""
    rows = session.exec(
        select(Referral.reward_tokens).where(col(Referral.referrer_id) == account_id)
    ).all()
    return len(rows), sum(rows)
