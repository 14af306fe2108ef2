"""Support inside the bot: a buyer's message reaches every operator, and an operator's reply to
it finds its way back.

Each copy shown to an operator is recorded by (chat, message id), so a reply in any bot process
finds the buyer from the database alone; the operator sees the buyer's charges and balance
beside the message (`context_of`). When the bot asks a buyer to write (`/paysupport`, the
Support button), the account remembers it (`open_prompt`), so the buyer's next plain message
goes to the operators whichever bot process receives it (`answers_prompt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from billing import ledger, stray_charges
from billing.models import Account, Purchase, StrayCharge, SupportCopy, SupportMessage, utcnow
from billing.purchases import recent_purchases

TEXT_LIMIT = 4096
# How long after the bot asked a buyer to write their next plain message still goes to support.
PROMPT_LIFETIME = timedelta(minutes=30)


@dataclass(frozen=True)
class BuyerContext:
    """What an operator needs beside a buyer's message."""

    account: Account
    available: int
    purchases: list[Purchase]
    strays: list[StrayCharge]


def open_prompt(*, session: Session, account_id: int, now: datetime | None = None) -> None:
    """The bot asked the buyer to write to support: their next plain message is for the
    operators, for `PROMPT_LIFETIME`."""
    session.execute(
        update(Account)
        .where(col(Account.id) == account_id)
        .values(support_prompt_at=now or utcnow())
    )


def answers_prompt(*, session: Session, account_id: int, now: datetime | None = None) -> bool:
    """Whether the buyer's plain message answers an open support prompt. True once per prompt:
    the prompt is closed by one guarded UPDATE, so of two bot processes given messages at once
    only one takes it."""
    since = (now or utcnow()) - PROMPT_LIFETIME
    result = session.execute(
        update(Account)
        .where(col(Account.id) == account_id, col(Account.support_prompt_at) >= since)
        .values(support_prompt_at=None)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def record_message(
    *, session: Session, account_id: int, text: str, operator_id: int | None = None
) -> SupportMessage:
    """A buyer's message (operator_id None), which answers any prompt still open, or an
    operator's reply."""
    if operator_id is None:
        session.execute(
            update(Account).where(col(Account.id) == account_id).values(support_prompt_at=None)
        )
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
