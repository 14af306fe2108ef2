"""Key alerts: a buyer hears once per period when a key has spent 80% and 100% of its limit, and
once, three days ahead, that a key expires.

Usage is billed by the API processes, so the bot polls, as it does for balance notices
(`bot.jobs`); each alert is claimed in the database with a guarded UPDATE
(`billing.key_limits.claim_alerts`), so of several bot processes only one sends it, and the job
runs in one process at a time besides.
"""

from __future__ import annotations

import logging

from telegram.error import TelegramError
from telegram.ext import Application, ContextTypes

from billing.key_alerts import KeyAlert, claim_alerts
from billing.models import utcnow
from bot.jobs import alone
from bot.runtime import runtime_of
from bot.texts import Html, language_for, number, plain, t, when

logger = logging.getLogger(__name__)

KEY_ALERTS_LOCK = "tokenshop.bot.key-alerts"


async def send_key_alerts(application: Application) -> list[KeyAlert]:  # type: ignore[type-arg]
    """Claim and send the key alerts due now; the ones sent (none if another process runs)."""
    shop = runtime_of(application.bot_data)
    async with alone(shop, KEY_ALERTS_LOCK) as mine:
        if not mine:
            return []
        alerts = await shop.run(lambda s: claim_alerts(session=s, now=utcnow()))
    for alert in alerts:
        try:
            await application.bot.send_message(alert.telegram_id, alert_text(alert))
        except TelegramError:
            logger.info("could not send a key alert to %s", alert.telegram_id)
    return alerts


def alert_text(alert: KeyAlert) -> Html:
    language = language_for(alert.language)
    report = alert.report
    names = {"name": alert.key_name, "hint": alert.hint}
    if alert.kind == "expiry":
        assert report.limits.expires_at is not None
        return t(language, "key_alert_expiry", when=when(report.limits.expires_at), **names)
    limits = report.limits
    assert limits.spend is not None
    figures = {
        "spent": number(language, report.spent),
        "limit": number(language, limits.spend),
        **names,
    }
    if limits.period == "total" or report.resets_at is None:
        return t(language, f"key_alert_{alert.level}_total", **figures)
    return t(
        language,
        f"key_alert_{alert.level}",
        period=plain(language, f"period_{limits.period}"),
        resets=when(report.resets_at),
        **figures,
    )


async def key_alerts_job(context: ContextTypes.DEFAULT_TYPE) -> None:
    await send_key_alerts(context.application)
