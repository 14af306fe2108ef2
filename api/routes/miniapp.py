"""`/app/api`: the Telegram Mini App's JSON API (docs/miniapp.md). Every route but `session`
takes `Authorization: tma <initData>` or `Bearer <session>` (401 otherwise); `operator` routes
are for ADMIN_TELEGRAM_IDS (403 otherwise). The page itself is static, mounted at /app."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from api.deps import AppUserDep, MiniAppDep, OperatorDep
from api.protocol_miniapp import (
    BalanceOut,
    Days,
    InvoiceOut,
    InvoiceRequest,
    KeyIssued,
    KeyName,
    KeyOut,
    LimitsText,
    Me,
    OperatorOut,
    SessionOut,
    ShopOut,
    SignIn,
    SupportOut,
    SupportSent,
    SupportWrite,
    UsageOut,
)

router = APIRouter(prefix="/app/api", tags=["mini app"])
DaysQuery = Annotated[Days, Query(description="the window: 7, 30 or 90 days")]


@router.post("/session", response_model=SessionOut)
async def sign_in(body: SignIn, miniapp: MiniAppDep) -> SessionOut:
    """Exchange Telegram's initData for a short session token."""
    return await miniapp.sign_in(body.init_data)


@router.get("/me", response_model=Me)
async def me(user: AppUserDep, miniapp: MiniAppDep) -> Me:
    return await miniapp.me(user)


@router.get("/balance", response_model=BalanceOut)
async def balance(user: AppUserDep, miniapp: MiniAppDep) -> BalanceOut:
    return await miniapp.balance(user)


@router.get("/usage", response_model=UsageOut)
async def usage(user: AppUserDep, miniapp: MiniAppDep, days: DaysQuery = Days.month) -> UsageOut:
    """Tokens per UTC day by model, prompt and completion apart, over 7, 30 or 90 days."""
    return await miniapp.usage(user, int(days))


@router.get("/usage.csv")
async def usage_csv(user: AppUserDep, miniapp: MiniAppDep) -> Response:
    """Every billed request, as the bot's CSV export."""
    return Response(
        await miniapp.usage_csv(user),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="tokenshop-usage.csv"'},
    )


@router.post("/usage.csv/send", status_code=status.HTTP_204_NO_CONTENT)
async def send_usage_csv(user: AppUserDep, miniapp: MiniAppDep) -> Response:
    """The same CSV, sent by the bot into the buyer's chat (webviews may not save files)."""
    await miniapp.send_usage_csv(user)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/keys", response_model=list[KeyOut])
async def list_keys(user: AppUserDep, miniapp: MiniAppDep) -> list[KeyOut]:
    return await miniapp.keys(user)


@router.post("/keys", response_model=KeyIssued, status_code=status.HTTP_201_CREATED)
async def create_key(body: KeyName, user: AppUserDep, miniapp: MiniAppDep) -> KeyIssued:
    return await miniapp.create_key(user, body.name)


@router.patch("/keys/{key_id}", response_model=KeyOut)
async def rename_key(key_id: int, body: KeyName, user: AppUserDep, miniapp: MiniAppDep) -> KeyOut:
    return await miniapp.rename_key(user, key_id, body.name)


@router.put("/keys/{key_id}/limits", response_model=KeyOut)
async def set_limits(
    key_id: int, body: LimitsText, user: AppUserDep, miniapp: MiniAppDep
) -> KeyOut:
    """The key's limits, written as the bot takes them (`spend 5000 daily; rpm 60`)."""
    return await miniapp.set_limits(user, key_id, body.text)


@router.post("/keys/{key_id}/rotate", response_model=KeyIssued)
async def rotate_key(key_id: int, user: AppUserDep, miniapp: MiniAppDep) -> KeyIssued:
    """A new key of the same name; the old one stops working at once."""
    return await miniapp.rotate_key(user, key_id)


@router.delete("/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_key(key_id: int, user: AppUserDep, miniapp: MiniAppDep) -> Response:
    await miniapp.revoke_key(user, key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/shop", response_model=ShopOut)
async def shop(user: AppUserDep, miniapp: MiniAppDep) -> ShopOut:
    return await miniapp.shop(user)


@router.post("/terms", status_code=status.HTTP_204_NO_CONTENT)
async def accept_terms(user: AppUserDep, miniapp: MiniAppDep) -> Response:
    await miniapp.accept_terms(user)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/invoice", response_model=InvoiceOut)
async def invoice(body: InvoiceRequest, user: AppUserDep, miniapp: MiniAppDep) -> InvoiceOut:
    """A Stars invoice link for a pack or a monthly plan; the bot credits the tokens when
    Telegram reports each payment, never this route or the page."""
    return InvoiceOut(
        invoice_link=await miniapp.invoice_link(user, pack_id=body.pack_id, plan_id=body.plan_id)
    )


@router.get("/support", response_model=SupportOut)
async def support(user: AppUserDep, miniapp: MiniAppDep) -> SupportOut:
    return await miniapp.support(user)


@router.post("/support", response_model=SupportSent)
async def write_support(body: SupportWrite, user: AppUserDep, miniapp: MiniAppDep) -> SupportSent:
    return SupportSent(delivered=await miniapp.write_support(user, body.text))


@router.get("/operator", response_model=OperatorOut)
async def operator(
    user: OperatorDep, miniapp: MiniAppDep, days: DaysQuery = Days.month
) -> OperatorOut:
    """Revenue, refunds, buyers, usage, top accounts, stray charges, the support queue, open
    holds and upstream health."""
    return await miniapp.operator(int(days))
