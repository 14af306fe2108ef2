"""The contract between the serving layer and an inference engine.

The API's serving layer only ever talks to an `EngineClient`; the local ONNX Runtime engine is one
implementation, an upstream OpenAI-compatible server (vLLM, TGI) could be another. Keeping the
contract here, small and typed, is what lets the routes and the billing code ignore how tokens are
made (vLLM's `EngineClient` plays the same role).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# The KV cache's element type: float16 where every attention is ours (`use_half_cache` in
# attention_kernel.py), float32 otherwise; "auto": float16 for quantized exports (int4, int8),
# whose weights already trade exactness, float32 for the rest, which stay exact.
KvCacheDtype = Literal["auto", "float32", "float16"]

# "tool_calls": the answer ended by calling tools (an upstream says so itself; a local engine's
# calls are read out of its text by the serving layer, which sets it there).
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class ServingPath:
    """How an engine serves a model, for the start-up log, `/ready` and `/metrics`: the graph
    edits applied (`graph/pipeline.py`), whose kernels run it, and why any faster path was not
    taken (`fallbacks`; empty on the optimized path)."""

    graph_edits: tuple[str, ...]
    ops: Literal["tokenshop", "onnxruntime"]
    isa: str | None  # the instruction set our ops multiply with, where they run
    weights: str  # int4, int8, float, or unknown (a graph no edit could read)
    fallbacks: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made: `arguments` is JSON text, as the model wrote it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call an engine made itself (an upstream's structured `tool_calls`):
    the first piece of call `index` has its `id` and `name`, later ones only `arguments`
    fragments, which concatenate to the call's JSON text. A whole call is one piece."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ChatMessage:
    """One message as the API normalised it (parts joined, `developer` -> `system`).

    An assistant message may carry `tool_calls` (its content then often empty); a `tool`
    message answers the call `tool_call_id`, from the function `name`."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Constraint:
    """What the generated text must match: an llguidance grammar (`LLMatcher.grammar_from_*`:
    a JSON schema or a Lark grammar), and the request parameter it came from, which an error
    names (`response_format`, `tool_choice`, `tools[0].function.parameters`)."""

    grammar: str
    param: str


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. `temperature == 0` means greedy decoding."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # sample among the k likeliest tokens only; 0: all of them
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    constraint: Constraint | None = None  # masks every token that would break it
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, -100..100) added to the logits


# `GenerationRequest.extra`'s key for an Anthropic Messages body sent on as the client wrote it
# (to an engine whose `speaks_messages()`).
NATIVE_MESSAGES = "anthropic_messages"


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    # Requests of one scope may start from each other's computed prompts (`prefix_cache.py`);
    # None: this request neither uses nor leaves any.
    cache_scope: str | None = None
    # What an upstream engine sends on (`upstream/`): the conversation itself, whether the client
    # reads the answer as it is made (a non-streamed one is asked for in one response, which
    # carries the upstream's usage), and request fields forwarded verbatim (e.g.
    # `response_format`). A local engine reads only `prompt_token_ids`.
    messages: Sequence[ChatMessage] = ()
    stream: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)


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


@dataclass(slots=True)
class GenerationOutput:
    """What one decode step produced for one request: a delta, never the text so far.
    Not frozen, unlike the values around it: one is made a streamed token, and a frozen
    dataclass's `__init__` (one `object.__setattr__` a field) took 3.5x as long. Not changed
    after it is made.

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
    # Tool calls an engine returns structured (an upstream); counted in `completion_tokens`.
    # A local engine writes its calls as text, which the serving layer parses.
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # The stop string that ended it (finish_reason "stop"), where the engine knows which.
    stop_sequence: str | None = None


@dataclass(frozen=True)
class BackendStats:
    """One upstream server of a model, for /ready and /metrics (its URL, never its key)."""

    url: str
    up: bool
    in_flight: int
    requests: int
    failovers: int  # requests that left this backend for another before their first token
    errors: Mapping[str, int]  # by kind: connect, status, timeout, cut
    ttft_buckets: Sequence[tuple[float, int]]  # (upper bound in seconds, cumulative count)
    ttft_sum: float
    ttft_count: int


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics and /ready."""

    active_sequences: int
    queued_sequences: int
    last_batch_size: int
    steps: int
    # Prompt-lookup drafts verified and accepted (runtime/speculation.py); 0 where none are made
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


class EngineClient(ABC):
    """One served model."""

    model_id: str
    context_length: int
    created: int  # unix time the model was loaded, shown by /v1/models
    # True where `encode_chat` gives an upper bound of the prompt's length, not its tokens (an
    # upstream without a local tokenizer): the hold takes it, the context check is left to the
    # engine, which knows the real count.
    prompt_is_bound: bool = False

    @abstractmethod
    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Render the model's chat template (with the generation prompt) and tokenize it.
        `tools` are OpenAI function tools (`{"type": "function", "function": {...}}`) that the
        template renders; an engine that cannot show them raises `ToolsUnsupported`."""

    def prompt_to_hold(self, messages: Sequence[ChatMessage], counted: int) -> int:
        """The prompt tokens to hold for `messages`, which `encode_chat` counted `counted`: the
        same, where this process renders the prompt; an upstream adds what its own template
        counts beyond ours (`upstream/prompt_count.py`)."""
        return counted

    def speaks_messages(self) -> bool:
        """Whether a Messages request is sent to this engine as the client wrote it (an upstream
        that serves Anthropic's API: `GenerationRequest.extra["anthropic_messages"]`) rather
        than as the chat request it was translated into."""
        return False

    def fingerprint(self) -> str:
        """OpenAI's `system_fingerprint`: a short digest of the backend configuration that
        changes whenever the model, its precision or the engine settings do."""
        digest = hashlib.sha256(f"{type(self).__name__}:{self.model_id}".encode()).hexdigest()
        return f"fp_{digest[:10]}"

    def tool_format(self) -> str | None:
        """The chat template family whose tool-call syntax the model writes (`hermes`,
        `llama3`, `mistral`: `text/tool_calls.py`), or None where the serving layer should
        neither parse nor constrain tool calls (an upstream does that itself)."""
        return None

    async def check_constraint(self, constraint: Constraint) -> None:
        """Compile `constraint` ahead of `generate` (cached), raising `InvalidGrammar` when it
        cannot be enforced; an engine that does not constrain locally accepts any."""
        return None

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

    def serving_path(self) -> ServingPath | None:
        """How the model is served, where the engine can say (None: it cannot)."""
        return None

    @abstractmethod
    async def check_health(self) -> None:
        """Raise `EngineDead` if the engine can no longer serve."""

    @abstractmethod
    def stats(self) -> EngineStats: ...

    def backends(self) -> list[BackendStats]:
        """The upstream servers behind this model; none for a local engine."""
        return []

    @abstractmethod
    async def start(self) -> None:
        """Start the scheduler (called from the app's lifespan)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the scheduler; pending requests finish with an error."""


def _ignore() -> None:
    pass
