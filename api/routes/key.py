"""`GET /v1/key`: what the caller's account has left, and what the calling key itself has used,
so a client can check without Telegram."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import BooksDep, KeyDep
from api.protocol import KeyInfo
from billing.keys import mask_key

router = APIRouter(prefix="/v1", tags=["key"])


@router.get("/key", response_model=KeyInfo)
async def key_info(caller: KeyDep, books: BooksDep) -> KeyInfo:
    balance = await books.balance(caller.account_id)
    name, usage = await books.key_usage(caller.key_id) if caller.key_id else (None, None)
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
    )
