"""What the models file says about one upstream-served model, and the timeouts of its calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# Where neither the models file nor the upstream says how long a context is: the upstream
# refuses a longer prompt itself (its 400 reaches the client), so this only caps holds.
DEFAULT_CONTEXT_LENGTH = 32768
# Inputs in one upstream embedding request where the models file sets no `batch_size`:
# text-embeddings-inference's default `--max-client-batch-size`.
DEFAULT_EMBEDDING_BATCH = 32


@dataclass(frozen=True)
class UpstreamTimeouts:
    connect: float = 3.0  # a connection that takes longer fails over
    first_token: float = 60.0  # a streamed answer whose first token takes longer fails over
    read: float = 60.0  # the longest gap between tokens once the first arrived
    health_every: float = 3.0  # seconds between health checks of each upstream


@dataclass(frozen=True)
class UpstreamConfig:
    name: str  # the id clients send
    upstreams: tuple[str, ...]  # base URLs, e.g. "http://gpu-a:8000/v1"
    upstream_model: str  # the id the upstreams know
    api_key: str | None = field(default=None, repr=False)  # read from `api_key_env`, never shown
    tokenizer: Path | None = None  # tokenizer.json (or its dir) to count prompts locally
    context_length: int | None = None  # None: the upstream's `max_model_len`, else the default
    # The upstreams serve Anthropic's `/v1/messages` too: Messages requests go there as sent
    # (`messages_wire.py`) instead of being translated to chat completions.
    messages_api: bool = False
    kind: Literal["chat", "embedding"] = "chat"  # "embedding": served at /v1/embeddings
    dimensions: int | None = None  # an embedding model's width; None: learned from its answers
    batch_size: int = DEFAULT_EMBEDDING_BATCH  # inputs per upstream embedding request
