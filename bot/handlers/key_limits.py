"""A key's limits in My keys: its card shows them with its spend this period, and 🚦 Limits asks
for changes as a reply (`spend 5000 daily; rpm 60; models demo`), read by
`billing.key_limits.parse`, the same words `KEY_DEFAULT_LIMITS` takes. Every API replica applies
them within its KEY_CACHE_SECONDS.

The prompt names the key's row id (`#12`), as the rename prompt does; the reply (handled beside
the rename's, in `bot.handlers.key`) changes nothing unless it is a live key of the sender.
"""

from __future__ import annotations

import re

from sqlmodel import Session
from telegram import ForceReply, Update
from telegram.ext import ContextTypes

from billing import key_limits
from billing.key_limits import KeyReport
from billing.models import ApiKey, utcnow
from bot.runtime import lang
from bot.texts import LANGUAGES, Html, Lang, number, plain, t, when

_KEY_ID = re.compile(r"#(\d+)")


def describe(language: Lang, report: KeyReport | None) -> Html:
    """The card's line: each limit that is on, with the spend this period."""
    if report is None or not report.limits.any:
        return t(language, "key_limits_none")
    limits = report.limits
    parts: list[str] = []
    if limits.spend is not None and limits.period == "total":
        parts.append(
            plain(
                language,
                "limit_spend_total",
                spent=number(language, report.spent),
                limit=number(language, limits.spend),
            )
        )
    elif limits.spend is not None and report.resets_at is not None:
        parts.append(
            plain(
                language,
                "limit_spend",
                spent=number(language, report.spent),
                limit=number(language, limits.spend),
                period=plain(language, f"period_{limits.period}"),
                resets=when(report.resets_at),
            )
        )
    if limits.expires_at is not None:
        parts.append(plain(language, "limit_expires", when=when(limits.expires_at)))
    if limits.models:
        parts.append(plain(language, "limit_models", models=", ".join(limits.models)))
    if limits.rpm is not None:
        parts.append(plain(language, "limit_rpm", rpm=number(language, limits.rpm)))
    if limits.tpm is not None:
        parts.append(plain(language, "limit_tpm", tpm=number(language, limits.tpm)))
    return t(language, "key_limits", limits="; ".join(parts))


def read_report(session: Session, key_id: int) -> KeyReport | None:
    return key_limits.report(session=session, key_id=key_id, now=utcnow())


async def ask(update: Update, context: ContextTypes.DEFAULT_TYPE, name: str, key_id: int) -> None:
    """🚦 Limits: the prompt a buyer replies to."""
    assert update.effective_message is not None
    await update.effective_message.reply_text(
        plain(lang(update, context), "limits_prompt", name=name, id=key_id),
        reply_markup=ForceReply(input_field_placeholder="spend 5000 daily; rpm 60"),
    )


def is_limits_prompt(text: str | None) -> bool:
    if not text or _KEY_ID.search(text) is None:
        return False
    prefixes = {plain(code, "limits_prompt", name="", id="").split("«")[0] for code in LANGUAGES}
    return any(text.startswith(prefix) for prefix in prefixes)


def set_from_text(session: Session, *, account_id: int, key_id: int, text: str) -> str:
    """Apply a buyer's reply to one of their live keys; the key's name. Raises InvalidLimits
    (with what was not understood) or KeyNotFound."""
    clear, changes = key_limits.parse(text)
    key_limits.set_limits(
        session=session,
        account_id=account_id,
        key_id=key_id,
        clear=clear,
        changes=changes,
        now=utcnow(),
    )
    key = session.get(ApiKey, key_id)
    assert key is not None
    return key.name


def key_id_in_prompt(text: str | None) -> int:
    found = _KEY_ID.search(text or "")
    assert found is not None
    return int(found.group(1))
