"""Key alerts, claimed for the bot's job (`bot.key_alerts`): 80% and 100% of a key's spend limit
once per period, and its expiry once, `EXPIRY_WARNING` ahead.

Usage is billed by the API processes, so the bot polls, as it does for balance notices
(`billing.notices`); each alert is claimed with a guarded UPDATE on the key's row (`alert_level`
and `alert_period`, `expiry_alerted_for`), so of several bot processes only one sends it. The
claim locks the rows' accounts first, in ascending id, as every writer of a key's row does, so
it never waits in a circle with a batch of the API's holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from billing.key_limits import KeyReport, describe_row, period_start
from billing.locks import lock_accounts
from billing.models import Account, ApiKey, KeyLimit

ALERT_LEVELS = (80, 100)  # percent of the spend limit announced once per period
EXPIRY_WARNING = timedelta(days=3)
ALERT_BATCH = 500


@dataclass(frozen=True)
class KeyAlert:
    """A buyer to tell that a key reached a share of its limit, or expires soon."""

    telegram_id: int
    language: str | None
    key_name: str
    hint: str
    kind: str  # "spend" or "expiry"
    level: int  # 80 or 100 (spend)
    report: KeyReport


def claim_alerts(*, session: Session, now: datetime, limit: int = ALERT_BATCH) -> list[KeyAlert]:
    """The alerts due now, each claimed with a guarded UPDATE so that of two bot processes
    only one sends it: 80% and 100% of a spend limit once per period, and an expiry within
    `EXPIRY_WARNING` once per expiry time. Buyers who blocked the bot are left out."""
    rows = session.execute(
        sa_select(
            KeyLimit,
            col(ApiKey.id),
            col(ApiKey.name),
            col(ApiKey.hint),
            col(Account.telegram_id),
            func.coalesce(col(Account.chosen_language), col(Account.language)),
        )
        .join(ApiKey, col(ApiKey.limit_id) == KeyLimit.id)
        .join(Account, col(Account.id) == KeyLimit.account_id)
        .where(
            col(ApiKey.revoked_at).is_(None),
            col(Account.telegram_id).is_not(None),
            col(Account.blocked_at).is_(None),
            col(KeyLimit.spend_limit).is_not(None) | col(KeyLimit.expires_at).is_not(None),
        )
        .order_by(col(KeyLimit.id))
        .limit(limit)
    ).all()
    alerts: list[KeyAlert] = []
    # Every writer of a key's row locks its account first (`billing.locks`); the accounts
    # another transaction holds now (a batch of holds) are left for the next run.
    locked = set(lock_accounts(session, (row.account_id for row, *_ in rows), skip_locked=True))
    for row, key_id, name, hint, telegram_id, language in rows:
        if row.account_id not in locked:
            continue
        key_report = describe_row(key_id, row, now)
        found = []
        level = _spend_level(key_report)
        start = period_start(row.period, now)
        seen = row.alert_level if row.alert_period is not None and row.alert_period >= start else 0
        if level > seen:
            claimed = session.execute(
                update(KeyLimit)
                .where(
                    col(KeyLimit.id) == row.id,
                    col(KeyLimit.alert_level) == row.alert_level,
                    col(KeyLimit.alert_period).is_not_distinct_from(row.alert_period),
                )
                .values(alert_level=level, alert_period=start)
            )
            if claimed.rowcount == 1:  # type: ignore[attr-defined]
                found.append(("spend", level))
        expires = row.expires_at
        if (
            expires is not None
            and expires - EXPIRY_WARNING <= now < expires
            and row.expiry_alerted_for != expires
        ):
            claimed = session.execute(
                update(KeyLimit)
                .where(
                    col(KeyLimit.id) == row.id,
                    col(KeyLimit.expiry_alerted_for).is_not_distinct_from(row.expiry_alerted_for),
                )
                .values(expiry_alerted_for=expires)
            )
            if claimed.rowcount == 1:  # type: ignore[attr-defined]
                found.append(("expiry", 0))
        alerts.extend(
            KeyAlert(telegram_id, language, name, hint, kind, level, key_report)
            for kind, level in found
        )
    return alerts


def _spend_level(key_report: KeyReport) -> int:
    limit = key_report.limits.spend
    if not limit:
        return 0
    reached = [level for level in ALERT_LEVELS if key_report.spent * 100 >= level * limit]
    return max(reached, default=0)
