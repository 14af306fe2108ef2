"""`POST /v1/messages` and `/v1/messages/count_tokens`, Anthropic's Messages API: parse, call
the serving layer, shape the answer. Every error of these routes, from the key check and body
validation on, leaves in Anthropic's shape with its `request-id` (`AnthropicRoute`)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from api.deps import AnthropicKeyDep, MessagesDep
from api.errors_anthropic import anthropic_error
from api.protocol_anthropic import (
    CountTokensRequest,
    ErrorResponse,
    Message,
    MessagesRequest,
    TokenCount,
)
from api.routes.streaming import EventStream


class AnthropicRoute(APIRoute):
    """A route whose errors (the key, the body, the serving path) are Anthropic's, and whose
    every answer carries `request-id`, as Anthropic's do."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handler(request: Request) -> Response:
            request_id = getattr(request.state, "request_id", None)
            try:
                response = await handle(request)
            except Exception as exc:
                return anthropic_error(exc).response(request_id)
            if request_id is not None:
                response.headers["request-id"] = request_id
            return response

        return handler


router = APIRouter(prefix="/v1", tags=["messages"], route_class=AnthropicRoute)

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 529)
}


@router.post("/messages", response_model=Message, responses=ERRORS)
async def create_message(
    body: MessagesRequest, caller: AnthropicKeyDep, service: MessagesDep, request: Request
) -> Response:
    raw = await request.json()  # parsed already: Starlette keeps the body
    prepared = await service.prepare(body, caller.account_id, caller.key_id, body=raw)
    if body.stream:
        events = await service.start_stream(prepared)
        return EventStream(events, close=partial(service.close, prepared))
    message = await service.create(prepared)
    return JSONResponse(message.model_dump(mode="json"))


@router.post("/messages/count_tokens", response_model=TokenCount, responses=ERRORS)
async def count_tokens(
    body: CountTokensRequest, caller: AnthropicKeyDep, service: MessagesDep
) -> TokenCount:
    return TokenCount(input_tokens=await service.count_tokens(body))
