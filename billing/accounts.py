"""Accounts: found by id or Telegram id, created on first contact."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from billing.errors import AccountNotFound
from billing.models import Account, utcnow


def create_account(*, session: Session, name: str | None = None) -> Account:
    """An account with no Telegram user behind it (made by the operator's CLI)."""
    account = Account(name=name)
    session.add(account)
    session.flush()
    return account


def get_or_create_account(
    *, session: Session, telegram_id: int, name: str | None = None, language: str | None = None
) -> Account:
    """The account of a Telegram user, created on first contact; safe when two updates race."""
    account = find_telegram_account(session=session, telegram_id=telegram_id)
    if account is None:
        try:
            with session.begin_nested():
                account = Account(telegram_id=telegram_id, name=name, language=language)
                session.add(account)
        except IntegrityError:
            account = find_telegram_account(session=session, telegram_id=telegram_id)
            assert account is not None
    if language and account.language != language:
        account.language = language
        session.add(account)
    return account


def find_telegram_account(*, session: Session, telegram_id: int) -> Account | None:
    return session.exec(select(Account).where(Account.telegram_id == telegram_id)).first()


def get_account(
    *, session: Session, account_id: int | None = None, telegram_id: int | None = None
) -> Account:
    """Look an account up by exactly one of its ids; raises AccountNotFound."""
    if (account_id is None) == (telegram_id is None):
        raise ValueError("give exactly one of account_id and telegram_id")
    if account_id is not None:
        account = session.get(Account, account_id)
        label = f"id {account_id}"
    else:
        assert telegram_id is not None
        account = find_telegram_account(session=session, telegram_id=telegram_id)
        label = f"Telegram id {telegram_id}"
    if account is None:
        raise AccountNotFound(f"No account with {label}.")
    return account


def accept_terms(*, session: Session, account_id: int) -> None:
    account = get_account(session=session, account_id=account_id)
    if account.terms_accepted_at is None:
        account.terms_accepted_at = utcnow()
        session.add(account)
