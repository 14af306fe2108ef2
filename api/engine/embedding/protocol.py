"""The contract between the serving layer and an embedding engine (the chat one is
`api/engine/protocol.py`): count a request's inputs for the hold, embed them, report the
tokens billed, health and stats.

A local engine tokenizes and embeds token lists (`tokenize`, `embed`); `prepare` and `run`
default to exactly that. An upstream engine (`api/engine/upstream/embedding.py`) overrides
them: it sends texts as texts, counts them with a tokenizer where one is configured or by an
upper bound where not, and reports the prompt tokens the upstream's usage says.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from api.engine.protocol import BackendStats

# What `run` embeds: token lists, or (an upstream's) texts as the client sent them.
Inputs = Sequence[Sequence[int]] | Sequence[str]


@dataclass(frozen=True)
class Prepared:
    """A request's inputs as its engine runs them, and each one's tokens for the hold."""

    inputs: Inputs
    counts: Sequence[int]  # exact, or upper bounds where `exact` is False
    exact: bool = True


@dataclass(frozen=True)
class Embedded:
    """Vectors, and the prompt tokens billed for them (never more than were held)."""

    vectors: np.ndarray  # float32, [inputs, width]
    prompt_tokens: int


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
    dimensions: int | None  # the width of its vectors (None: an upstream's, not yet seen)
    vocab_size: int | None  # token-id inputs must lie in 0..vocab_size-1 (None: unknown here)
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

    def prepare(self, texts: Sequence[str]) -> Prepared:
        """What `run` takes for these texts, and their counts for the hold: the local engine's
        tokens (exact). May take a while for long texts: called in a worker thread then."""
        tokens = self.tokenize(texts)
        return Prepared(tokens, [len(ids) for ids in tokens])

    async def run(self, prepared: Prepared) -> Embedded:
        """`prepared`'s vectors, billed as counted (an upstream bills its own usage)."""
        inputs = cast(Sequence[Sequence[int]], prepared.inputs)
        return Embedded(await self.embed(inputs), sum(prepared.counts))

    def backends(self) -> list[BackendStats]:
        """The upstream servers behind this model; none for a local engine."""
        return []

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
