"""`POST /v1/embeddings`: parse, call the serving layer, send its JSON."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from api.deps import EmbeddingsDep, KeyDep
from api.protocol import ErrorResponse
from api.protocol_embeddings import EmbeddingRequest, EmbeddingResponse

router = APIRouter(prefix="/v1", tags=["embeddings"])

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)
}


@router.post("/embeddings", response_model=EmbeddingResponse, responses=ERRORS)
async def create_embeddings(
    body: EmbeddingRequest, caller: KeyDep, embeddings: EmbeddingsDep
) -> Response:
    content = await embeddings.create(body, caller.account_id, caller.key_id)
    return Response(content, media_type="application/json")
