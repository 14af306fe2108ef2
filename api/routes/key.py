"""`GET /v1/key`: what the caller's account has left, what the calling key itself has used, and
its own limits with its spend this period, so a client can check without Telegram."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from api.deps import BooksDep, KeyDep
from api.protocol import KeyInfo, KeyLimits, KeySpend
from billing.key_limits import KeyReport
from billing.keys import mask_key

router = APIRouter(prefix="/v1", tags=["key"])


@router.get("/key", response_model=KeyInfo)
async def key_info(caller: KeyDep, books: BooksDep) -> KeyInfo:
    balance = await books.balance(caller.account_id)
    name, usage = await books.key_usage(caller.key_id) if caller.key_id else (None, None)
    report = await books.key_report(caller.key_id) if caller.key_id else None
    return KeyInfo(
        key=mask_key(caller.key),
        available_tokens=balance.available,
        held_tokens=balance.held,
        purchased_tokens=balance.purchased,
        granted_tokens=balance.granted,
        used_tokens=balance.used,
        refunded_tokens=balance.refunded,
        key_name=name,
        key_requests=usage.requests if usage else 0,
        key_used_tokens=usage.charged if usage else 0,
        id=caller.key_id,
        limits=_limits(report) if report else None,
        spend=_spend(report) if report else None,
    )


def _limits(report: KeyReport) -> KeyLimits:
    limits = report.limits
    return KeyLimits(
        spend_limit=limits.spend,
        period=limits.period,  # type: ignore[arg-type]
        expires_at=_unix(limits.expires_at),
        models=list(limits.models),
        rpm=limits.rpm,
        tpm=limits.tpm,
    )


def _spend(report: KeyReport) -> KeySpend:
    return KeySpend(
        period=report.limits.period,  # type: ignore[arg-type]
        spent_tokens=report.spent,
        held_tokens=report.held,
        remaining_tokens=report.remaining,
        period_start=_unix(report.period_start),
        resets_at=_unix(report.resets_at),
    )


def _unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None
