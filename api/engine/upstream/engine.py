"""`UpstreamEngine`: a chat model served by one or more OpenAI-compatible servers (their
health, choice and refusals: `servers.py`, shared with embedding models).

Each choice of a request is one upstream chat completion. A request goes to a healthy upstream
with the fewest requests in flight; a refused connection, a 5xx, a 429 or no first token within
`first_token` seconds sends it to the next, so nothing reached the client before it fails over.
Once a token has arrived the request stays where it is: a break ends it with `UpstreamFailed`,
and what arrived is billed. Closing the stream (the client left) closes the upstream connection,
which stops the upstream's generation.

Usage: the upstream's own figures wherever it reports them (`stream_options.include_usage`, or
a non-streamed answer's `usage`); where it reports none, tokens counted here: the prompt by the
configured tokenizer plus what the upstream's template was seen to add (`prompt_count.py`), and
one token a chunk, or the tokenizer's count of it where larger, or the logprobs' count where
present, and, for an answer that ended at its length, the `max_tokens` it was given. Never above
`max_tokens`.
Tool calls the upstream returns structured (`tools` forwarded) count as completion tokens alike:
their arguments' text is counted with the chunk's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import string
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from api.engine.errors import (
    ContextLengthExceeded,
    ModelLoadError,
    UpstreamFailed,
)
from api.engine.protocol import (
    ChatMessage,
    EngineClient,
    EngineStats,
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    ToolCallDelta,
)
from api.engine.text.chat_template import ChatTemplate
from api.engine.text.tokenizer import TokenizerWrapper
from api.engine.upstream import http, messages_wire, wire
from api.engine.upstream.backend import Backend
from api.engine.upstream.config import UpstreamConfig, UpstreamTimeouts
from api.engine.upstream.prompt_count import CALIBRATION, PromptOverhead
from api.engine.upstream.servers import TryNext, UpstreamServers

logger = logging.getLogger("tokenshop.upstream")

_ID_ALPHABET = string.ascii_letters + string.digits
COUNT_CACHE_SIZE = 16384  # texts whose token count is kept (`count_tokens`)
COUNT_CACHE_CHARS = 32  # longer texts are counted each time
DRAIN_SECONDS = 0.5  # for the end of a body after `[DONE]`, which servers send at once
CALIBRATION_TRIES = 5  # start-up and health checks that may ask for `CALIBRATION`'s usage


class UpstreamEngine(UpstreamServers, EngineClient):
    def __init__(self, config: UpstreamConfig, *, timeouts: UpstreamTimeouts | None = None):
        super().__init__(config, timeouts=timeouts)
        self.tokenizer: TokenizerWrapper | None = None
        self.chat_template: ChatTemplate | None = None
        if config.tokenizer is not None:
            self.tokenizer, self.chat_template = _load_tokenizer(config)
        self.prompt_is_bound = self.tokenizer is None
        self.overhead = PromptOverhead()  # what its template counts beyond ours
        self._calibrated = False
        self._calibration_tries = 0
        self._completed = 0
        self._counts: dict[str, int] = {}  # `count_tokens`' short texts

    # -- the contract --------------------------------------------------------------------------

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """With a tokenizer: the prompt's tokens. Without: a stand-in whose length is an upper
        bound of what the upstream will count (`wire.prompt_bound`); only its length is used.
        Tools (forwarded in `GenerationRequest.extra`) count by their JSON's UTF-8 length."""
        tools_bound = len(json.dumps(list(tools)).encode()) if tools else 0
        if self.tokenizer is not None and self.chat_template is not None and not tools:
            return self.tokenizer.encode(self.chat_template.render(messages))
        return [0] * (wire.prompt_bound(messages) + tools_bound)

    def prompt_to_hold(self, messages: Sequence[ChatMessage], counted: int) -> int:
        if self.prompt_is_bound:  # an upper bound already
            return counted
        return self.overhead.to_hold(messages, counted=counted)

    def speaks_messages(self) -> bool:
        return self.config.messages_api

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if not request.messages:
            raise ValueError("an upstream request needs its messages")
        if request.params.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        prompt = len(request.prompt_token_ids)
        if self.tokenizer is not None and prompt >= self.context_length:
            raise ContextLengthExceeded(prompt, self.context_length)
        return self._run(request)

    async def abort(self, request_id: str) -> None:
        """Nothing to do: closing a request's stream closes its upstream connection."""

    def stats(self) -> EngineStats:
        in_flight = sum(backend.in_flight for backend in self.pool)
        return EngineStats(
            active_sequences=in_flight,
            queued_sequences=0,
            last_batch_size=in_flight,
            steps=self._completed,
        )

    async def start(self) -> None:
        await self._open()
        if not self.prompt_is_bound:  # before the first request is counted
            await self._calibrate()
        self._watch()

    def count_tokens(self, text: str) -> int:
        """The tokenizer's count of `text`. A chunk is mostly one token, whose text recurs: short
        texts' counts are kept (a look-up instead of ~30 us of tokenizing a chunk)."""
        assert self.tokenizer is not None
        if len(text) > COUNT_CACHE_CHARS:
            return len(self.tokenizer.encode(text))
        count = self._counts.get(text)
        if count is None:
            if len(self._counts) >= COUNT_CACHE_SIZE:
                self._counts.clear()
            count = self._counts[text] = len(self.tokenizer.encode(text))
        return count

    # -- routing and failover ------------------------------------------------------------------

    async def _run(self, request: GenerationRequest) -> AsyncGenerator[GenerationOutput]:
        assert self._pool is not None, "start() the engine first"
        tally = _Tally(self, request)
        tried: set[int] = set()
        reasons: list[str] = []
        while (index := self._pick(tried)) is not None:
            tried.add(index)
            backend = self.pool[index]
            backend.requests += 1
            backend.in_flight += 1
            try:
                async with contextlib.aclosing(self._attempt(backend, request, tally)) as outputs:
                    async for output in outputs:
                        yield output
                backend.up = True
                self._completed += 1
                return
            except TryNext as failure:
                reasons.append(self._failed_over(backend, failure, request.request_id))
            finally:
                backend.in_flight -= 1
        raise self._unavailable(len(reasons))

    async def _attempt(
        self, backend: Backend, request: GenerationRequest, tally: _Tally
    ) -> AsyncGenerator[GenerationOutput]:
        """One upstream's answer; raises `TryNext` for a failure before the first token."""
        assert self._pool is not None
        started = time.monotonic()
        # a Messages request to an upstream that serves Messages goes as the client sent it
        native = self.config.messages_api and messages_wire.NATIVE in request.extra
        model = self.config.upstream_model
        body = json.dumps(
            messages_wire.request_body(request, model)
            if native
            else wire.request_body(request, model),
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        parse = messages_wire.EventReader().parse if native else wire.parse_chunk
        response: http.Response | None = None
        try:
            try:
                async with asyncio.timeout(self.timeouts.first_token if request.stream else None):
                    response = await self._pool.post(
                        f"{backend.url}/messages" if native else f"{backend.url}/chat/completions",
                        body,
                        self._headers,
                        # the longest gap between tokens, timed by the connection itself
                        read_timeout=self.timeouts.read if request.stream else None,
                    )
                    await self._refuse_unless_ok(backend, response)
                    if not request.stream:
                        document = json.loads(await response.read())
                        read = messages_wire.parse_message if native else wire.parse_completion
                        first = read(document)
                    else:
                        first = await _first_piece(response, parse)
            except http.ConnectFailed as exc:
                backend.up = False
                raise TryNext("connect", str(exc)) from None
            except (TimeoutError, http.ReadTimeout):
                raise TryNext("timeout", "no first token in time") from None
            except (http.BrokenOff, ValueError, _StreamEnded) as exc:
                raise TryNext("cut", type(exc).__name__) from None
            backend.up = True
            if first.text or first.finish_reason or first.tool_calls:
                backend.observe_ttft(time.monotonic() - started)
            output = tally.add(first)
            if output is not None:
                yield output
            if not request.stream:
                yield tally.finish()
                return
            while not tally.done:
                try:
                    piece = await _next_piece(response, parse)
                except http.ReadTimeout:
                    backend.errors["timeout"] += 1
                    raise UpstreamFailed(
                        f"The upstream server of model '{self.model_id}' stopped sending "
                        "tokens mid-answer."
                    ) from None
                except (http.BrokenOff, ValueError):
                    backend.errors["cut"] += 1
                    raise UpstreamFailed(
                        f"The upstream server of model '{self.model_id}' broke off its answer."
                    ) from None
                if piece is None:  # `[DONE]`, or the body's end
                    break
                if piece.error is not None:
                    backend.errors["cut"] += 1
                    raise UpstreamFailed(
                        f"The upstream server of model '{self.model_id}' failed mid-answer: "
                        f"{piece.error[:300]}"
                    )
                output = tally.add(piece)
                if output is not None:
                    yield output
            if tally.finish_reason is None:
                backend.errors["cut"] += 1
                raise UpstreamFailed(
                    f"The upstream server of model '{self.model_id}' broke off its answer."
                )
            yield tally.finish()
        finally:
            if response is not None:
                await response.aclose()  # unread: the connection closes, generation stops

    # -- health --------------------------------------------------------------------------------

    async def _between_checks(self) -> None:
        if not self.prompt_is_bound and not self._calibrated:
            await self._calibrate()

    async def _calibrate(self) -> None:
        """Learn what an upstream's template adds to our prompt count (`prompt_count.py`)
        from its usage of one-token answers to `CALIBRATION`, once one is up; after
        `CALIBRATION_TRIES` failed tries, holds keep their margin and answers teach it."""
        assert self._client is not None
        self._calibration_tries += 1
        if self._calibration_tries > CALIBRATION_TRIES:
            logger.warning(
                "upstream model %s gave no usage to calibrate by: its prompts are held with a "
                "margin until its answers report usage",
                self.model_id,
            )
            self._calibrated = True
            return
        timeout = httpx.Timeout(self.timeouts.first_token, connect=self.timeouts.connect)
        for messages in CALIBRATION:
            backend = next((b for b in self.pool if b.up), None)
            if backend is None:
                return
            body = {
                "model": self.config.upstream_model,
                "messages": [{"role": m.role, "content": m.content} for m in messages],
                "max_tokens": 1,
                "temperature": 0,
            }
            try:
                response = await self._client.post(
                    f"{backend.url}/chat/completions",
                    json=body,
                    headers=self._headers,
                    timeout=timeout,
                )
                reported = int(response.json()["usage"]["prompt_tokens"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return  # tried again after the next health check
            counted = len(self.encode_chat(messages))
            self.overhead.learn(messages, counted=counted, reported=reported)
            logger.info(
                "upstream %s counts %+d prompt tokens against ours for %d message(s)",
                backend.url,
                reported - counted,
                len(messages),
            )
        self._calibrated = True


class _StreamEnded(Exception):
    """The upstream closed its stream before sending anything to show."""


async def _next_piece(
    response: http.Response, parse: Callable[[bytes], wire.Piece]
) -> wire.Piece | None:
    """A stream's next `data:` event; None after `[DONE]`, whose body's end is read too
    (briefly), so the connection goes back to the pool instead of being closed."""
    data = await response.next_data()
    if data is None:
        return None
    if data == b"[DONE]":
        await response.finish(DRAIN_SECONDS)
        return None
    return parse(data)


async def _first_piece(response: http.Response, parse: Callable[[bytes], wire.Piece]) -> wire.Piece:
    """Read until something counts: text, a finish, usage (role-only chunks do not)."""
    while (piece := await _next_piece(response, parse)) is not None:
        if piece.error is not None:
            raise _StreamEnded(piece.error)
        if (
            piece.text
            or piece.tool_calls
            or piece.finish_reason
            or piece.logprobs
            or piece.completion_tokens
        ):
            return piece
    raise _StreamEnded("the stream ended before its first token")


@dataclass
class _Tally:
    """One choice's tokens as they arrive: counted here, replaced by the upstream's usage."""

    engine: UpstreamEngine
    request: GenerationRequest
    counted: int = 0
    reported_prompt: int | None = None
    reported_completion: int | None = None
    finish_reason: str | None = None
    done: bool = False
    calls: set[int] = field(default_factory=set)  # indices of the tool calls started

    @property
    def prompt_tokens(self) -> int:
        """The upstream's count; where it reported none, ours with what its template adds."""
        if self.reported_prompt:
            return self.reported_prompt
        counted = len(self.request.prompt_token_ids)
        if self.engine.prompt_is_bound:
            return counted
        return self.engine.overhead.estimate(self.request.messages, counted=counted)

    @property
    def completion_tokens(self) -> int:
        cap = self.request.params.max_tokens
        if self.reported_completion is not None:
            return min(self.reported_completion, cap)
        counted = self.counted
        if self.finish_reason == "length":  # it generated all it was allowed to
            room = self.engine.context_length - len(self.request.prompt_token_ids)
            counted = max(counted, min(cap, room))
        return min(counted, cap)

    def add(self, piece: wire.Piece) -> GenerationOutput | None:
        if piece.prompt_tokens is not None and piece.completion_tokens is not None:
            self.reported_prompt = piece.prompt_tokens
            self.reported_completion = piece.completion_tokens
            if not self.engine.prompt_is_bound and piece.prompt_tokens > 0:
                self.engine.overhead.learn(
                    self.request.messages,
                    counted=len(self.request.prompt_token_ids),
                    reported=piece.prompt_tokens,
                )
        calls = self._calls(piece.tool_calls) if piece.tool_calls else ()
        if piece.text or piece.logprobs or calls:
            self.counted += self._count(piece, calls)
        if piece.finish_reason:
            self.finish_reason = piece.finish_reason
        if not piece.text and not piece.logprobs and not calls:
            return None
        return self._output(piece.text, piece.logprobs, calls, finished=False)

    def finish(self) -> GenerationOutput:
        self.done = True
        return self._output("", None, (), finished=True)

    def _calls(self, deltas: Sequence[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
        """The upstream's call fragments as OpenAI streams them: a call's first piece with its
        id (one made here if the upstream gave none) and name, the rest only arguments."""
        calls = []
        for delta in deltas:
            if delta.index not in self.calls:
                self.calls.add(delta.index)
                call_id = delta.id or "call_" + "".join(
                    secrets.choice(_ID_ALPHABET) for _ in range(24)
                )
                calls.append(ToolCallDelta(delta.index, delta.arguments, call_id, delta.name or ""))
            elif delta.arguments:
                calls.append(ToolCallDelta(delta.index, delta.arguments))
        return tuple(calls)

    def _count(self, piece: wire.Piece, calls: Sequence[ToolCallDelta]) -> int:
        if piece.logprobs:
            return len(piece.logprobs)
        if self.engine.tokenizer is None:
            return 1
        text = piece.text + "".join(call.arguments for call in calls)
        return max(1, self.engine.count_tokens(text))

    def _output(
        self, text: str, logprobs: Any, calls: tuple[ToolCallDelta, ...], *, finished: bool
    ) -> GenerationOutput:
        reason: FinishReason | None = None
        if finished:
            if self.finish_reason == "length":
                reason = "length"
            elif self.finish_reason == "tool_calls" or self.calls:
                reason = "tool_calls"
            else:
                reason = "stop"
        return GenerationOutput(
            text=text,
            token_ids=[],
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            finished=finished,
            finish_reason=reason,
            logprobs=logprobs,
            tool_calls=calls,
        )


def _load_tokenizer(config: UpstreamConfig) -> tuple[TokenizerWrapper, ChatTemplate]:
    """A tokenizer.json, or a dir with one (and its tokenizer_config.json's chat template;
    without one, ChatML)."""
    from api.engine.local_engine import TOKENIZER_FILE, load_chat_template

    assert config.tokenizer is not None
    path = config.tokenizer
    directory = path if path.is_dir() else path.parent
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        raise ModelLoadError(
            f"model {config.name!r}: tokenizer {str(path)!r} has no {TOKENIZER_FILE}"
        )
    return TokenizerWrapper.from_file(file), load_chat_template(directory)
