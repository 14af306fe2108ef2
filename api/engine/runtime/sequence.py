"""One request's life inside the scheduler: its tokens, text state and stopping rules.

The scheduler hands each sampled token to `Sequence.append`, which decides whether generation ends
(EOS, stop string, a completed constraint, max_tokens, context window, in that order of
precedence) and builds the
`GenerationOutput` delta, so the batching loop stays free of per-request text logic.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import llguidance

from api.engine.protocol import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    TokenLogprob,
    TopLogprob,
)
from api.engine.runtime.sampling import SamplerState, TokenChoice
from api.engine.runtime.speculation import Drafting
from api.engine.text.stops import StopStringMatcher
from api.engine.text.tokenizer import IncrementalDetokenizer, TokenizerWrapper


@dataclass(eq=False)
class Sequence:
    """A request being generated, and where its outputs go."""

    request: GenerationRequest
    tokenizer: TokenizerWrapper
    eos_token_ids: frozenset[int]
    context_length: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    matcher: llguidance.LLMatcher | None = None  # the request's constraint, when it has one
    sampler: SamplerState = field(init=False)
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    aborted: bool = False
    cached_tokens: int = 0  # prompt tokens whose keys/values came from the prefix cache
    drafting: Drafting | None = None  # its prompt lookup, once it decodes with drafts
    _detok: IncrementalDetokenizer = field(init=False)
    _stops: StopStringMatcher = field(init=False)

    def __post_init__(self) -> None:
        self.sampler = SamplerState.create(self.request.params, self.matcher)
        self._detok = IncrementalDetokenizer(self.tokenizer)
        self._stops = StopStringMatcher(self.request.params.stop)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1]

    def fed_ids(self, count: int) -> list[int]:
        """The first `count` tokens the graph has seen: the prompt, then generated tokens."""
        ids = [*self.request.prompt_token_ids, *self.output_ids[:-1]]
        assert count <= len(ids), "the cache holds more positions than tokens were fed"
        return ids[:count]

    def append(self, choice: TokenChoice) -> GenerationOutput:
        """Take one generated token; return this step's delta (possibly with empty text)."""
        token = choice.token_id
        self.output_ids.append(token)
        reason: FinishReason | None = None
        if token in self.eos_token_ids:
            reason = "stop"
            text = self._stops.feed(self._detok.flush())[0] + self._stops.flush()
        else:
            text, stopped = self._stops.feed(self._detok.add(token))
            if stopped:
                reason = "stop"
            elif self.sampler.constraint_done:  # the grammar allows nothing more
                tail, stopped = self._stops.feed(self._detok.flush())
                text += tail if stopped else tail + self._stops.flush()
                reason = "stop"
            elif (
                len(self.output_ids) >= self.request.params.max_tokens
                or self.prompt_len + len(self.output_ids) >= self.context_length
            ):
                tail, stopped = self._stops.feed(self._detok.flush())
                text += tail if stopped else tail + self._stops.flush()
                reason = "stop" if stopped else "length"
        self.finished = reason is not None
        return GenerationOutput(
            text=text,
            token_ids=[token],
            prompt_tokens=self.prompt_len,
            completion_tokens=len(self.output_ids),
            finished=self.finished,
            finish_reason=reason,
            logprobs=self._logprobs(choice) if self.request.params.logprobs else None,
            cached_tokens=self.cached_tokens,
            stop_sequence=self._stops.matched if reason == "stop" else None,
        )

    def _logprobs(self, choice: TokenChoice) -> list[TokenLogprob]:
        def entry(token_id: int) -> tuple[str, list[int]]:
            raw = self.tokenizer.token_bytes(token_id)
            return raw.decode("utf-8", errors="replace"), list(raw)

        text, raw = entry(choice.token_id)
        top = []
        for token_id, logprob in choice.top:
            top_text, top_raw = entry(token_id)
            top.append(TopLogprob(token=top_text, logprob=logprob, bytes=top_raw))
        return [TokenLogprob(text, choice.logprob or 0.0, raw, top)]
