"""`GET /v1/models`: the loaded models, no key needed (as OpenAI-compatible servers do)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ServicesDep
from api.errors import model_not_found
from api.protocol import Model, ModelList

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models", response_model=ModelList)
async def list_models(services: ServicesDep) -> ModelList:
    chat = [Model(id=name, created=engine.created) for name, engine in services.engines.items()]
    embedding = [Model(id=name, created=e.created) for name, e in services.embedders.items()]
    return ModelList(data=chat + embedding)


@router.get("/models/{model_id:path}", response_model=Model)
async def retrieve_model(model_id: str, services: ServicesDep) -> Model:
    engine = services.engines.get(model_id)
    if engine is None and model_id in services.embedders:
        return Model(id=model_id, created=services.embedders[model_id].created)
    if engine is None:
        raise model_not_found(model_id)
    return Model(id=model_id, created=engine.created)
