"""Support inside the bot: a buyer's message reaches every operator, and an operator's reply to
it finds its way back.

Each copy shown to an operator is recorded by (chat, message id), so a reply in any bot process
finds the buyer from the database alone; the operator sees the buyer's charges and balance
beside the message (`context_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing import ledger, stray_charges
from billing.models import Account, Purchase, StrayCharge, SupportCopy, SupportMessage
from billing.purchases import recent_purchases

TEXT_LIMIT = 4096


@dataclass(frozen=True)
class BuyerContext:
    """What an operator needs beside a buyer's message."""

    account: Account
    available: int
    purchases: list[Purchase]
    strays: list[StrayCharge]


def record_message(
    *, session: Session, account_id: int, text: str, operator_id: int | None = None
) -> SupportMessage:
    """A buyer's message (operator_id None) or an operator's reply."""
    message = SupportMessage(account_id=account_id, operator_id=operator_id, text=text[:TEXT_LIMIT])
    session.add(message)
    session.flush()
    return message


def record_copy(
    *, session: Session, support_message_id: int, chat_id: int, message_id: int
) -> None:
    try:
        with session.begin_nested():
            session.add(
                SupportCopy(
                    support_message_id=support_message_id, chat_id=chat_id, message_id=message_id
                )
            )
    except IntegrityError:
        pass  # recorded already


def buyer_of_copy(*, session: Session, chat_id: int, message_id: int) -> Account | None:
    """The buyer whose message the operator's chat shows as `message_id`, if it is one."""
    return session.exec(
        select(Account)
        .join(SupportMessage, col(SupportMessage.account_id) == Account.id)
        .join(SupportCopy, col(SupportCopy.support_message_id) == SupportMessage.id)
        .where(col(SupportCopy.chat_id) == chat_id, col(SupportCopy.message_id) == message_id)
    ).first()


def context_of(*, session: Session, account_id: int, limit: int = 5) -> BuyerContext:
    account = session.get(Account, account_id)
    assert account is not None
    strays = (
        stray_charges.of_user(session=session, telegram_id=account.telegram_id, limit=limit)
        if account.telegram_id is not None
        else []
    )
    return BuyerContext(
        account=account,
        available=ledger.get_balance(session=session, account_id=account_id).available,
        purchases=recent_purchases(session=session, account_id=account_id, limit=limit),
        strays=strays,
    )
