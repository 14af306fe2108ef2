"""`GET /v1/models`: the loaded models, no key needed (as OpenAI-compatible servers do), in
Anthropic's shape when the request carries `anthropic-version` (its SDKs and Claude Code)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response

from api.deps import ServicesDep
from api.errors import model_not_found
from api.errors_anthropic import from_openai
from api.protocol import Model, ModelList
from api.protocol_anthropic import ModelInfo
from api.protocol_anthropic import ModelList as AnthropicModelList

router = APIRouter(prefix="/v1", tags=["models"])
AnthropicVersion = Annotated[str | None, Header(include_in_schema=False)]


@router.get("/models", response_model=ModelList)
async def list_models(
    services: ServicesDep, anthropic_version: AnthropicVersion = None
) -> ModelList | Response:
    if anthropic_version is not None:
        data = [_anthropic(name, engine.created) for name, engine in services.engines.items()]
        listing = AnthropicModelList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
        )
        return JSONResponse(listing.model_dump())
    chat = [Model(id=name, created=engine.created) for name, engine in services.engines.items()]
    embedding = [Model(id=name, created=e.created) for name, e in services.embedders.items()]
    return ModelList(data=chat + embedding)


@router.get("/models/{model_id:path}", response_model=Model)
async def retrieve_model(
    model_id: str, services: ServicesDep, anthropic_version: AnthropicVersion = None
) -> Model | Response:
    engine = services.engines.get(model_id)
    if engine is None and anthropic_version is None and model_id in services.embedders:
        return Model(id=model_id, created=services.embedders[model_id].created)
    if engine is None:
        if anthropic_version is not None:
            return from_openai(model_not_found(model_id)).response()
        raise model_not_found(model_id)
    if anthropic_version is not None:
        return JSONResponse(_anthropic(model_id, engine.created).model_dump())
    return Model(id=model_id, created=engine.created)


def _anthropic(name: str, created: int) -> ModelInfo:
    when = datetime.fromtimestamp(created, UTC).isoformat().replace("+00:00", "Z")
    return ModelInfo(id=name, display_name=name, created_at=when)
