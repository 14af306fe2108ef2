"""The contract between the serving layer and an inference engine.

The API's serving layer only ever talks to an `EngineClient`; the local ONNX Runtime engine is one
implementation, an upstream OpenAI-compatible server (vLLM, TGI) could be another. Keeping the
contract here, small and typed, is what lets the routes and the billing code ignore how tokens are
made (vLLM's `EngineClient` plays the same role).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

# The KV cache's element type: float16 where every attention is ours (`use_half_cache` in
# attention_kernel.py), float32 otherwise; "auto": float16 for quantized exports (int4, int8),
# whose weights already trade exactness, float32 for the rest, which stay exact.
KvCacheDtype = Literal["auto", "float32", "float16"]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class ChatMessage:
    """One message as the API normalised it (parts joined, `developer` -> `system`)."""

    role: str
    content: str


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. `temperature == 0` means greedy decoding."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    # Requests of one scope may start from each other's computed prompts (`prefix_cache.py`);
    # None: this request neither uses nor leaves any.
    cache_scope: str | None = None


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int]


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class GenerationOutput:
    """What one decode step produced for one request: a delta, never the text so far.

    `text` is safe to send as is: it never ends in a partial UTF-8 character nor in a prefix of a
    stop string, and the deltas of a request concatenate to exactly its final text.
    `completion_tokens` counts every token generated so far, including ones whose text is still
    held back, so billing can checkpoint usage from any output.
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finished: bool = False
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache, not prefilled


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics and /ready."""

    active_sequences: int
    queued_sequences: int
    last_batch_size: int
    steps: int


class EngineClient(ABC):
    """One served model."""

    model_id: str
    context_length: int
    created: int  # unix time the model was loaded, shown by /v1/models

    @abstractmethod
    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Render the model's chat template (with the generation prompt) and tokenize it."""

    @abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Queue a request and yield its outputs as they are made; the last one has `finished`.

        Raises `EngineOverloaded` when the queue is full and `ContextLengthExceeded` when the
        prompt alone does not fit. Closing the iterator early (client gone) aborts the request:
        its sequence leaves the batch at the next step.
        """

    def expect(self) -> Callable[[], None]:
        """Say a request is on its way (validated, its hold being placed); the returned call
        says it was passed to `generate` or will not come, and may be called more than once.

        An engine may let an idle batch wait a moment for expected requests, so that a burst's
        prompts are prefilled together; one that does not batch ignores it."""
        return _ignore

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a request; its iterator ends at the next step."""

    @abstractmethod
    async def check_health(self) -> None:
        """Raise `EngineDead` if the engine can no longer serve."""

    @abstractmethod
    def stats(self) -> EngineStats: ...

    @abstractmethod
    async def start(self) -> None:
        """Start the scheduler (called from the app's lifespan)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the scheduler; pending requests finish with an error."""


def _ignore() -> None:
    pass
