"""Build the served models from the `MODELS` setting: chat and embedding models alike.

`MODELS` is a comma-separated list of export dirs; a dir's name is its model id unless the entry is
`name=path`. Relative paths are resolved against the working directory, then the project root, so
the default `models/demo` works from anywhere. An export is an embedding model when its files say
so (`embedding.engine.is_embedding_export`), so one list names both kinds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from api.engine.embedding.batcher import BatchLimits
from api.engine.embedding.engine import LocalEmbeddingEngine, is_embedding_export
from api.engine.embedding.protocol import EmbeddingClient
from api.engine.errors import ModelLoadError
from api.engine.local_engine import LocalEngine
from api.engine.model.session_cache import default_cache_dir
from api.engine.protocol import EngineClient, KvCacheDtype
from api.engine.runtime.scheduler import SchedulerLimits

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class EngineConfig:
    """Limits applied to every served model."""

    max_active_sequences: int = 16  # sequences decoded together in one step
    max_queued: int = 64  # waiting requests beyond that; more raise EngineOverloaded
    threads: int | None = None  # ONNX Runtime intra-op threads (None: one per physical core)
    max_prefill_tokens: int = 256  # prompt tokens prefilled per iteration (longer prompts: chunks)
    # ONNX Runtime's optimized graphs, kept so a restart skips optimizing (None: not kept)
    cache_dir: Path | None = field(default_factory=default_cache_dir)
    fused_attention: bool = True  # GroupQueryAttention over a shared KV buffer, where it applies
    prefix_cache_mb: int = 256  # finished conversations' keys/values, per model (0: none)
    arrival_wait_ms: float = 50.0  # an idle batch's wait for requests on their way (0: none)
    ops_library: Path | None = None  # our ops (`ops/library.py`); None: ONNX Runtime's
    ops_missing: str | None = None  # why ops_library is None, for each model's serving path
    kv_cache_dtype: KvCacheDtype = "auto"  # the KV cache's element type (protocol.KvCacheDtype)
    speculative_tokens: int = 4  # drafts a decode step may verify per sequence (0: none)
    embedding_batch_tokens: int = 1024  # an embedding batch's rows x longest row

    @property
    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(
            max_active_sequences=self.max_active_sequences,
            max_queued=self.max_queued,
            max_prefill_tokens=self.max_prefill_tokens,
            prefix_cache_bytes=self.prefix_cache_mb << 20,
            arrival_wait_seconds=self.arrival_wait_ms / 1000,
            speculative_tokens=self.speculative_tokens,
        )


def parse_models_spec(spec: str) -> list[tuple[str, Path]]:
    """`"models/demo,big=/srv/qwen"` -> [("demo", models/demo), ("big", /srv/qwen)]."""
    entries: list[tuple[str, Path]] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, location = item.partition("=")
        path = Path(os.path.expanduser((location if sep else name).strip()))
        if not path.is_absolute() and not path.exists() and (PROJECT_ROOT / path).exists():
            path = PROJECT_ROOT / path
        model_id = name.strip() if sep else path.resolve().name
        if not model_id:
            raise ModelLoadError(f"MODELS entry {item!r} has no model name")
        if any(model_id == existing for existing, _ in entries):
            raise ModelLoadError(f"MODELS names model {model_id!r} twice")
        entries.append((model_id, path))
    if not entries:
        raise ModelLoadError("MODELS is empty: name at least one export dir")
    return entries


@dataclass
class LoadedModels:
    """The served models by kind (names are unique across both)."""

    engines: dict[str, EngineClient] = field(default_factory=dict)
    embedders: dict[str, EmbeddingClient] = field(default_factory=dict)

    def add(self, model_id: str, model: EngineClient | EmbeddingClient) -> None:
        if isinstance(model, EmbeddingClient):
            self.embedders[model_id] = model
        else:
            self.engines[model_id] = model


def load_models(spec: str, config: EngineConfig | None = None) -> LoadedModels:
    """Load every model of `spec` (not started: call `await engine.start()` in the lifespan)."""
    config = config or EngineConfig()
    loaded = LoadedModels()
    for model_id, path in parse_models_spec(spec):
        loaded.add(model_id, load_export(model_id, path, config))
    return loaded


def load_engines(spec: str, config: EngineConfig | None = None) -> dict[str, EngineClient]:
    """The chat models of `spec` (`load_models` for both kinds)."""
    return load_models(spec, config).engines


def load_export(
    model_id: str, path: Path, config: EngineConfig, *, truncate: bool = False
) -> LocalEngine | LocalEmbeddingEngine:
    """One export dir, served as the kind of model it holds. `truncate` (an embedding model's
    models-file entry) cuts inputs past the model's length instead of refusing them."""
    if path.is_dir() and is_embedding_export(path):
        return load_embedding(model_id, path, config, truncate=truncate)
    if truncate:
        raise ModelLoadError(f"model {model_id!r}: truncate applies only to embedding models")
    return load_local(model_id, path, config)


def load_embedding(
    model_id: str, path: Path, config: EngineConfig, *, truncate: bool = False
) -> LocalEmbeddingEngine:
    """One embedding export dir as a `LocalEmbeddingEngine` (not started)."""
    return LocalEmbeddingEngine(
        model_id,
        path,
        threads=config.threads,
        cache_dir=config.cache_dir,
        limits=BatchLimits(batch_tokens=config.embedding_batch_tokens),
        truncate=truncate,
    )


def load_local(model_id: str, path: Path, config: EngineConfig) -> LocalEngine:
    """One export dir as a `LocalEngine` (not started)."""
    return LocalEngine(
        model_id,
        path,
        limits=config.limits,
        threads=config.threads,
        cache_dir=config.cache_dir,
        fused_attention=config.fused_attention,
        ops_library=config.ops_library,
        ops_missing=config.ops_missing,
        kv_cache_dtype=config.kv_cache_dtype,
    )
