"""`/v1/responses`: create (JSON or SSE), retrieve and delete; parse, call serving, shape."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from api.deps import KeyDep, ResponsesDep
from api.protocol_responses import DeletedResponse, ResponseObject, ResponsesRequest
from api.routes.chat import ERRORS
from api.routes.streaming import EventStream

router = APIRouter(prefix="/v1", tags=["responses"])


@router.post("/responses", response_model=ResponseObject, responses=ERRORS)
async def create_response(
    body: ResponsesRequest, caller: KeyDep, service: ResponsesDep
) -> Response:
    prepared = await service.prepare(body, caller.account_id, caller.key_id)
    if body.stream:
        events = await service.start_stream(prepared)
        return EventStream(events, close=partial(service.close, prepared))
    response = await service.create(prepared)
    return JSONResponse(response.model_dump(mode="json"))


@router.get("/responses/{response_id}", response_model=ResponseObject, responses=ERRORS)
async def retrieve_response(response_id: str, caller: KeyDep, service: ResponsesDep) -> Response:
    body = await service.retrieve(response_id, caller.account_id)
    return Response(body, media_type="application/json")


@router.delete("/responses/{response_id}", response_model=DeletedResponse, responses=ERRORS)
async def delete_response(
    response_id: str, caller: KeyDep, service: ResponsesDep
) -> DeletedResponse:
    await service.delete(response_id, caller.account_id)
    return DeletedResponse(id=response_id)
