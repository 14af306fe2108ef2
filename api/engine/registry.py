"""Build the served models from the `MODELS` setting.

`MODELS` is a comma-separated list of export dirs; a dir's name is its model id unless the entry is
`name=path`. Relative paths are resolved against the working directory, then the project root, so
the default `models/demo` works from anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

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


def load_engines(spec: str, config: EngineConfig | None = None) -> dict[str, EngineClient]:
    """Load every model of `spec` (not started: call `await engine.start()` in the lifespan)."""
    config = config or EngineConfig()
    return {
        model_id: load_local(model_id, path, config) for model_id, path in parse_models_spec(spec)
    }


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
