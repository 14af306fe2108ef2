"""`POST /v1/chat/completions`: parse, call the serving layer, shape the answer."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response

from api.deps import ChatDep, KeyDep
from api.protocol import ChatCompletion, ChatCompletionRequest, ErrorResponse
from api.routes.streaming import EventStream

router = APIRouter(prefix="/v1", tags=["chat"])

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 409, 413, 429, 500, 503)
}


@router.post("/chat/completions", response_model=ChatCompletion, responses=ERRORS)
async def create_chat_completion(
    body: ChatCompletionRequest,
    caller: KeyDep,
    chat: ChatDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    if body.stream:
        prepared = await chat.prepare(body, caller.account_id, caller.key_id)
        events = await chat.start_stream(prepared)
        return EventStream(events, close=partial(chat.close, prepared))
    if idempotency_key:
        status, content = await chat.complete_once(
            body, caller.account_id, idempotency_key, caller.key_id
        )
        return Response(content, status_code=status, media_type="application/json")
    prepared = await chat.prepare(body, caller.account_id, caller.key_id)
    completion = await chat.complete(prepared)
    return JSONResponse(completion.model_dump(mode="json"))
