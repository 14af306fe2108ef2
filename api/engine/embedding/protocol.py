"""The contract between the serving layer and an embedding engine (the chat one is
`api/engine/protocol.py`): tokenize, embed a batch of token lists, report health and stats."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EmbeddingStats:
    """A snapshot for /metrics and /ready."""

    queued_inputs: int
    batches: int
    inputs: int
    tokens: int  # tokens embedded, padding excluded
    padded_tokens: int  # tokens the model ran, padding included


class EmbeddingClient(ABC):
    """One served embedding model."""

    model_id: str
    context_length: int  # the most tokens one input may have
    dimensions: int  # the width of its vectors
    vocab_size: int  # token-id inputs must lie in 0..vocab_size-1
    created: int  # unix time the model was loaded, shown by /v1/models
    truncate: bool = False  # inputs past `context_length` are cut instead of refused

    @abstractmethod
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's tokens as the model's tokenizer makes them (special tokens included),
        cut to `context_length` where `truncate` is set."""

    @abstractmethod
    async def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """The vectors of `inputs` (float32, [len(inputs), dimensions]), pooled and normalized
        as the model's files say. Raises `EngineOverloaded` when too much is queued; cancelling
        the call drops what of it was not yet run."""

    @abstractmethod
    async def check_health(self) -> None:
        """Raise `EngineDead` if the engine can no longer serve."""

    @abstractmethod
    def stats(self) -> EmbeddingStats: ...

    @abstractmethod
    async def start(self) -> None:
        """Start the worker (called from the app's lifespan)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the worker; pending calls fail with `EngineDead`."""
