"""Low-balance and empty-balance notices, sent once per crossing.

Usage is billed by the API process, so the bot cannot notice a crossing when it happens; a job
polls instead. `Account.notice_level` remembers the last level a buyer was told about ("ok",
"low", "empty"), and each change of level is claimed with a guarded UPDATE
(`WHERE notice_level = :seen`): of two bot processes polling at once only one claims it, so a
buyer hears about a crossing once. Only a fall (ok → low → empty) is announced; a top-up resets
the level silently, so the next fall is announced again.

The level follows the balance, not balance minus held: tokens reserved by a request in flight
would otherwise report a spurious "empty" for the few seconds the request runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import case, exists, func, literal, select, update
from sqlmodel import Session, col

from billing.models import Account, LedgerEntry

Level = Literal["ok", "low", "empty"]
_RANK: dict[str, int] = {"ok": 0, "low": 1, "empty": 2}
BATCH = 500


@dataclass(frozen=True)
class Notice:
    account_id: int
    telegram_id: int
    language: str | None
    level: Level  # "low" or "empty"
    balance: int


def level_for(balance: int, threshold: int) -> Level:
    if balance <= 0:
        return "empty"
    return "low" if balance < threshold else "ok"


def claim_notices(*, session: Session, threshold: int, limit: int = BATCH) -> list[Notice]:
    """Record every account's new level and return the falls to announce (claimed, so no other
    caller returns them). Accounts that were never credited have nothing to announce, and users
    who blocked the bot are left alone until they unblock it."""
    level = case(
        (col(Account.balance) <= 0, literal("empty")),
        (col(Account.balance) < threshold, literal("low")),
        else_=literal("ok"),
    )
    was_credited = exists().where(
        col(LedgerEntry.account_id) == Account.id, col(LedgerEntry.amount) > 0
    )
    rows = session.execute(
        select(
            col(Account.id),
            col(Account.telegram_id),
            func.coalesce(col(Account.chosen_language), col(Account.language)),
            col(Account.balance),
            col(Account.notice_level),
        )
        .where(
            col(Account.telegram_id).is_not(None),
            col(Account.blocked_at).is_(None),  # the user blocked the bot: nothing to send
            col(Account.notice_level) != level,
            was_credited,
        )
        .order_by(col(Account.id))
        .limit(limit)
    ).all()
    notices: list[Notice] = []
    for account_id, telegram_id, language, balance, seen in rows:
        new = level_for(balance, threshold)
        claimed = session.execute(
            update(Account)
            .where(col(Account.id) == account_id, col(Account.notice_level) == seen, level == new)
            .values(notice_level=new)
        )
        if claimed.rowcount == 1 and _RANK[new] > _RANK.get(seen, 0):  # type: ignore[attr-defined]
            notices.append(Notice(account_id, telegram_id, language, new, balance))
    return notices
