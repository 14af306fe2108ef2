"""Settings of an API process (environment and `.env`); billing's settings are part of them."""

from __future__ import annotations

import os
import socket
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from api.engine.protocol import KvCacheDtype
from billing.settings import BillingSettings, parse_telegram_ids


class ApiSettings(BillingSettings):
    """One object per process, handed to `create_app(settings)`."""

    models: str = Field(
        default="models/demo,models/demo-embed",  # the demo chat and embedding models
        description="comma-separated export dirs",
    )
    default_max_tokens: int = 4096
    max_request_bytes: int = 2_000_000
    max_messages: int = 2048
    max_n: int = 8
    max_concurrent_per_key: int = 8
    max_generation_seconds: float = 600.0
    key_cache_seconds: float = 5.0  # a revoked key stops working within this long
    checkpoint_seconds: float = 5.0  # how often a long generation records its usage
    # how often this process tries to sweep (one process sweeps at a time): holds of a process
    # whose lease lapsed are resolved within lease_seconds + sweep_seconds of its death
    sweep_seconds: float = 5.0
    # Replicas (docs/deploying.md). A process's lease lapses lease_seconds after its last
    # heartbeat; instance_name names it across restarts (unique per replica: a restart under
    # the same name frees the previous incarnation's holds before it serves).
    instance_name: str = Field(default_factory=lambda: default_instance_name())
    lease_seconds: float = Field(default=10.0, gt=0)
    heartbeat_seconds: float = Field(default=2.0, gt=0)
    # on SIGTERM: /ready and new requests get 503 at once; running requests get this long
    shutdown_grace_seconds: float = Field(default=30.0, ge=0)
    idempotency_retention_hours: float = Field(default=24.0, gt=0)
    # stored Responses API answers (`store`) are deleted this long after they were made
    responses_retention_days: float = Field(default=30.0, gt=0)
    keepalive_seconds: float = 15.0
    max_active_sequences: int = 16
    max_queued: int = 256
    engine_threads: int = 0  # 0: ONNX Runtime's default
    max_prefill_tokens: int = Field(default=256, ge=16)  # longer prompts are prefilled in chunks
    # ONNX Runtime's optimized graphs, kept so a restart skips optimizing.
    # None: $XDG_CACHE_HOME/tokenshop/onnx; "": keep none.
    engine_cache_dir: str | None = None
    # Serve attention as ONNX Runtime's GroupQueryAttention over one preallocated KV buffer where
    # the graph allows (api/engine/graph/fused_attention.py); false serves every graph as exported.
    engine_fused_attention: bool = True
    # MB per model of finished conversations' keys/values, so a chat's next turn prefills only
    # its new tokens (api/engine/runtime/prefix_cache.py); 0 keeps none.
    engine_prefix_cache_mb: int = Field(default=256, ge=0)
    # How long an idle engine may wait for requests whose holds are being placed, so that
    # requests sent together are prefilled together (engine/runtime/scheduler.py); 0: never waits.
    engine_arrival_wait_ms: float = Field(default=50.0, ge=0)
    # Run int4 projections with our kernel where it is built and this CPU is one it was made
    # for (api/engine/graph/int4_matmul.py); false keeps ONNX Runtime's MatMulNBits everywhere.
    engine_int4_kernel: bool = True
    # Serve our ops' weights from copies on 2 MB pages (api/engine/ops/csrc/int4_matmul.c): faster
    # decoding, but each process holds its own copy where processes on one host would share the
    # model file's pages; false shares them.
    engine_huge_pages: bool = True
    # The KV cache's element type where every attention runs on our op (the int4 kernel's
    # library; float32 elsewhere). float16 halves its memory and what attention reads a step (8
    # streams at 2,000 tokens of context decode ~1.3x faster on 2 cores) at float16's rounding
    # of each key and value (tests/engine/model/test_half_cache.py bounds it); "auto" takes it for
    # quantized exports, whose weights already trade exactness, and keeps fp32 exports exact.
    engine_kv_cache_dtype: KvCacheDtype = "auto"
    # Most tokens a decode step drafts and verifies per sequence by prompt lookup (speculative
    # decoding, api/engine/runtime/speculation.py), where the graph can verify them and only
    # while they pay: the text is the same with or without; 0 turns it off.
    engine_speculative_tokens: int = Field(default=4, ge=0, le=16)
    # An embedding batch's rows times its longest row (api/engine/embedding/batcher.py): inputs
    # of every request are packed under it; one input past it runs alone.
    embedding_batch_tokens: int = Field(default=1024, ge=256)
    # Upstream OpenAI-compatible servers of the models file (api/engine/upstream/): how often
    # each is health-checked, how long a connection may take, how long the first token may take
    # before the request fails over to the next upstream, and the longest gap between tokens.
    upstream_health_seconds: float = Field(default=3.0, gt=0)
    upstream_connect_seconds: float = Field(default=3.0, gt=0)
    upstream_first_token_seconds: float = Field(default=60.0, gt=0)
    upstream_read_seconds: float = Field(default=60.0, gt=0)
    # Send an upstream request while its hold is placed, where the account's last hold covered
    # all it asked for (api/serving/chat.py `_dispatch_early`). Off: every request waits for its
    # hold, so an upstream that charges for a request it began (a provider) never gets one that
    # a refused hold then closes.
    upstream_early_dispatch: bool = True
    # The Telegram Mini App at /app (docs/miniapp.md). The bot's token checks the signature of
    # the `initData` a page sends and makes invoice links (the bot credits what is paid); without
    # it every /app/api route answers 401. ADMIN_TELEGRAM_IDS see the operator pages.
    telegram_bot_token: SecretStr | None = None
    telegram_api_base_url: str | None = None  # as the bot's: a self-hosted Bot API server
    admin_telegram_ids: Annotated[frozenset[int], NoDecode] = frozenset()
    app_init_data_max_age_seconds: int = Field(default=3600, gt=0)  # older initData: 401
    app_session_seconds: int = Field(default=900, gt=0)  # the page's session, then initData again

    @field_validator("admin_telegram_ids", mode="before")
    @classmethod
    def _split_admin_ids(cls, value: Any) -> Any:
        return parse_telegram_ids(value)


def default_instance_name() -> str:
    """The platform's name for this replica (`DYNO`), else host and `PORT`, else host and pid
    (a name no restart reuses: the previous incarnation's holds then wait for its lease)."""
    if dyno := os.environ.get("DYNO"):
        return dyno
    port = os.environ.get("PORT")
    return f"{socket.gethostname()}:{port}" if port else f"{socket.gethostname()}:pid{os.getpid()}"
