"""Models served by upstream OpenAI-compatible servers (vLLM, SGLang, llama.cpp, a provider),
behind the same `EngineClient` contract as the local engine, so billing stays one code path;
embedding models behind `EmbeddingClient` (`embedding.py`)."""

from api.engine.upstream.backend import Backend
from api.engine.upstream.config import UpstreamConfig, UpstreamTimeouts
from api.engine.upstream.embedding import UpstreamEmbeddingEngine
from api.engine.upstream.engine import UpstreamEngine

__all__ = [
    "Backend",
    "UpstreamConfig",
    "UpstreamEmbeddingEngine",
    "UpstreamEngine",
    "UpstreamTimeouts",
]
