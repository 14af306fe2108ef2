"""Everything a running API process holds, built once in the lifespan and passed to routes."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from api.books import Books
from api.engine.embedding.protocol import EmbeddingClient
from api.engine.protocol import EngineClient
from api.metrics import Metrics
from api.serving.chat import ChatService
from api.serving.embeddings import EmbeddingsService
from api.serving.messages import MessagesService
from api.serving.miniapp import MiniApp
from api.serving.responses import ResponsesService
from api.settings import ApiSettings


@dataclass
class Services:
    settings: ApiSettings
    db: Engine
    engines: dict[str, EngineClient]
    books: Books
    chat: ChatService
    metrics: Metrics
    responses: ResponsesService
    embedders: dict[str, EmbeddingClient]  # the embedding models, beside `engines`' chat ones
    embeddings: EmbeddingsService
    miniapp: MiniApp
    messages: MessagesService
