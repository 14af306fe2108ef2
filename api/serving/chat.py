"""Chat completions: template, hold, generate, settle — the flow of DESIGN.md in one place.

Money first: the hold is placed before any byte of the answer is sent, the generation is capped
to what the hold covers, long generations checkpoint their usage, and the hold is settled with
the real usage whatever happens (done, error, client gone), under a cancel shield so a
disconnect cannot skip it. An upstream request may leave while its hold is being placed
(`_dispatch_early`); nothing it sends is read before the hold is in place.

When the database is unreachable, generation is never the thing that gives: a failed checkpoint
is logged and the stream goes on (the hold still caps it), and a failed settlement is retried in
the background until it lands, so the whole generation is billed once the database is back. Only
if this process dies before then does the sweeper bill the last checkpoint instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio import to_thread

from api.books import Books
from api.engine.errors import ContextLengthExceeded
from api.engine.protocol import (
    NATIVE_MESSAGES,
    ChatMessage,
    EngineClient,
    GenerationOutput,
    GenerationRequest,
    ToolCallDelta,
)
from api.errors import (
    DATABASE_UNAVAILABLE,
    OpenAIError,
    describe_database_error,
    from_domain,
    model_not_found,
    wrong_endpoint,
)
from api.metrics import Metrics
from api.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from api.serving import requests, tools
from api.serving.chunks import ChunkEvents
from api.serving.streams import KEEPALIVE, TIMEOUT, Started, merge_outputs
from api.serving.tools import StreamedCalls, ToolPlan
from api.settings import ApiSettings
from billing.idempotency import body_hash
from billing.prices import DEFAULT_PRICE, Price

KEEPALIVE_EVENT = ": keep-alive\n\n"  # an SSE comment: clients skip it, proxies see bytes
logger = logging.getLogger("tokenshop.api")

SETTLE_RETRY_FIRST_SECONDS = 0.25
SETTLE_RETRY_MAX_SECONDS = 5.0
INLINE_TOKENIZE_CHARS = 2000  # up to ~1 ms of tokenizing on the event loop (`_encode`)
MAX_REMEMBERED_ACCOUNTS = 100_000  # `ChatService._covered`: forgotten all at once past this


@dataclass
class Tally:
    """What a request has used so far, in tokens and in billed cost."""

    prompt_tokens: int
    price: Price
    completion: dict[int, int] = field(default_factory=dict)
    cached_tokens: int = 0  # of the prompt, read from the engine's prefix cache (billed alike)
    first_token_at: float | None = None

    @property
    def completion_tokens(self) -> int:
        return sum(self.completion.values())

    def cost(self) -> int:
        return self.price.cost(self.prompt_tokens, self.completion_tokens)

    def usage(self) -> Usage:
        completion = self.completion_tokens
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=self.cached_tokens),
        )


@dataclass
class PreparedChat:
    """A request that passed validation and holds its tokens; `close` resolves it once."""

    id: str
    created: int
    model: str
    account_id: int
    engine: EngineClient
    requests: list[GenerationRequest]
    tally: Tally
    include_usage: bool
    want_logprobs: bool
    accepted_at: float = field(default_factory=time.monotonic)
    closed: bool = False
    last_checkpoint: float = field(default_factory=time.monotonic)
    events: AsyncGenerator[str] | None = None  # the SSE stream, once started
    outputs: AsyncGenerator[Any] | None = None  # the engine outputs it reads
    started: list[Started] | None = None  # its engine streams, where sent before the hold
    arrived: Callable[[], None] = field(default=lambda: None)  # from `EngineClient.expect`
    plan: ToolPlan = field(default_factory=ToolPlan)  # tools and formats (`serving/tools.py`)
    chunks: ChunkEvents = field(init=False)
    streamed_calls: dict[int, StreamedCalls] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.chunks = ChunkEvents(
            chat_id=self.id,
            created=self.created,
            model=self.model,
            fingerprint=self.engine.fingerprint(),
        )


class ChatService:
    def __init__(
        self,
        *,
        engines: Mapping[str, EngineClient],
        books: Books,
        metrics: Metrics,
        settings: ApiSettings,
        embedding_models: Collection[str] = (),
    ) -> None:
        self.engines = engines
        self.embedding_models = embedding_models  # a 400 naming `model`, not a 404
        self.books = books
        self.metrics = metrics
        self.settings = settings
        self.prices = settings.prices()
        self._settling: set[asyncio.Task[None]] = set()
        self._covered: set[int] = set()  # accounts whose last hold here covered all it asked

    async def prepare(
        self,
        request: ChatCompletionRequest,
        account_id: int,
        key_id: int | None = None,
        *,
        clamp_max_tokens: bool = False,
        native_messages: Mapping[str, Any] | None = None,
    ) -> PreparedChat:
        """Validate, tokenize and hold; raises an error the client gets as an HTTP status.
        `key_id` is the key that asked: its usage is that key's. `clamp_max_tokens`: a limit
        past the room the prompt leaves is cut to the room, not refused (Anthropic's way).
        `native_messages`: the Anthropic body `request` was translated from, sent instead to an
        engine that speaks Messages (`EngineClient.speaks_messages`)."""
        engine = self.engines.get(request.model)
        if engine is None:
            if request.model in self.embedding_models:
                raise wrong_endpoint(request.model, "an embedding model", "/v1/chat/completions")
            raise model_not_found(request.model)
        self.books.check_key(key_id, model=request.model)  # expired, or a model it may not use
        # From here until `_outputs` submits it, the engine counts this request as on its way,
        # so a burst sent together is prefilled together (`Scheduler._wait_for_expected`).
        arrived = engine.expect()
        try:
            prepared = await self._prepare(
                engine,
                request,
                account_id,
                key_id,
                clamp_max_tokens=clamp_max_tokens,
                native_messages=native_messages,
            )
        except BaseException:
            arrived()
            raise
        prepared.arrived = arrived
        return prepared

    async def _prepare(
        self,
        engine: EngineClient,
        request: ChatCompletionRequest,
        account_id: int,
        key_id: int | None,
        *,
        clamp_max_tokens: bool = False,
        native_messages: Mapping[str, Any] | None = None,
    ) -> PreparedChat:
        messages, plan, prompt_ids = await self._render(engine, request)
        requests.stop_strings(request)
        forwarded = _forwarded(request, engine)
        if native_messages is not None and engine.speaks_messages():
            forwarded = {NATIVE_MESSAGES: native_messages}
        if plan.constraint is not None:  # a schema llguidance cannot take is a 400, before the hold
            await engine.check_constraint(plan.constraint)
        prompt = len(prompt_ids)
        if prompt >= engine.context_length and not engine.prompt_is_bound:
            raise ContextLengthExceeded(prompt, engine.context_length)
        n = request.n
        room = engine.context_length - (0 if engine.prompt_is_bound else prompt)
        max_new = requests.requested_max_tokens(
            request, self.settings.default_max_tokens, room=room, clamp=clamp_max_tokens
        )
        price = self.prices.get(request.model, DEFAULT_PRICE)
        chat_id = f"chatcmpl-{secrets.token_urlsafe(18)}"
        held_prompt = engine.prompt_to_hold(messages, prompt)  # what the engine will count
        max_cost = price.cost(held_prompt, n * max_new)

        def generation_requests(max_tokens: int) -> list[GenerationRequest]:
            return [
                GenerationRequest(
                    request_id=f"{chat_id}-{index}",
                    prompt_token_ids=prompt_ids,
                    params=requests.sampling_params(
                        request, max_tokens=max_tokens, choice=index, plan=plan
                    ),
                    cache_scope=f"account-{account_id}",  # never another customer's prefixes
                    messages=messages,
                    stream=request.stream,
                    extra=forwarded,
                )
                for index in range(n)
            ]

        wanted = generation_requests(max_new)
        early = self._dispatch_early(engine, account_id, wanted)
        try:
            # the key's limit of requests in flight is enforced by the hold's own statement
            hold = await self.books.hold(
                account_id=account_id,
                key_id=key_id,
                request_id=chat_id,
                min_cost=price.cost(held_prompt, n),
                max_cost=max_cost,
                model=request.model,
            )
        except BaseException:
            self._remember_cover(account_id, covered=False)
            await _close_all(early)
            raise
        self._remember_cover(account_id, covered=hold.amount >= max_cost)
        affordable = max_new
        while price.cost(held_prompt, n * affordable) > hold.amount:
            left = (hold.amount - held_prompt * price.prompt) / price.completion
            affordable = min(affordable - 1, int(left) // n)
        if affordable < max_new:  # what left early asked for more than the hold covers
            await _close_all(early)
            early = None
        return PreparedChat(
            id=chat_id,
            created=int(time.time()),
            model=request.model,
            account_id=account_id,
            engine=engine,
            requests=wanted if affordable == max_new else generation_requests(affordable),
            started=early,
            tally=Tally(prompt_tokens=prompt, price=price),
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            want_logprobs=request.logprobs,
            plan=plan,
        )

    async def _render(
        self, engine: EngineClient, request: ChatCompletionRequest
    ) -> tuple[list[ChatMessage], ToolPlan, list[int]]:
        """The request checked, its messages and tools, and its prompt's tokens."""
        requests.refuse_unsupported(
            request, max_n=self.settings.max_n, max_messages=self.settings.max_messages
        )
        messages = requests.chat_messages(request)
        plan = tools.plan(request, engine)
        return messages, plan, await _encode(engine, messages, plan.tools)

    async def count_prompt(self, request: ChatCompletionRequest) -> int:
        """The prompt tokens `prepare` would hold for, with nothing held (Anthropic's
        `count_tokens`): exact on a local engine; for an upstream, its template's count as
        learned (`prompt_to_hold`), or an upper bound where no tokenizer is configured."""
        engine = self.engines.get(request.model)
        if engine is None:
            raise model_not_found(request.model)
        messages, _, prompt_ids = await self._render(engine, request)
        return engine.prompt_to_hold(messages, len(prompt_ids))

    def _dispatch_early(
        self, engine: EngineClient, account_id: int, wanted: list[GenerationRequest]
    ) -> list[Started] | None:
        """Send an upstream-served request on its way before its hold is placed, where the
        account's last hold here covered everything it asked for: the hold's transaction then
        overlaps the upstream's time to the first token instead of adding to it. Nothing is
        read from these streams (so nothing reaches the client or is counted) until the hold
        is in place; a hold refused, or one covering fewer tokens than were asked for, closes
        them, which stops the upstream. An account whose last hold fell short waits for its
        hold first, so one without the balance never reaches the upstream at all."""
        if not self.settings.upstream_early_dispatch:
            return None
        if not engine.backends() or account_id not in self._covered:
            return None
        try:
            streams = [engine.generate(request) for request in wanted]
        except Exception:  # refused as it is: the usual path, after the hold, says why
            return None
        return [Started(stream) for stream in streams]

    def _remember_cover(self, account_id: int, *, covered: bool) -> None:
        if not covered:
            self._covered.discard(account_id)
            return
        if len(self._covered) >= MAX_REMEMBERED_ACCOUNTS:
            self._covered.clear()
        self._covered.add(account_id)

    async def complete(self, prepared: PreparedChat) -> ChatCompletion:
        texts: dict[int, list[str]] = {i: [] for i in range(len(prepared.requests))}
        finish: dict[int, str] = {}
        logprobs: dict[int, list[TokenLogprob]] = {i: [] for i in range(len(prepared.requests))}
        calls: dict[int, list[ToolCallDelta]] = {i: [] for i in range(len(prepared.requests))}
        try:
            async for index, output in self._outputs(prepared, keepalive=None):
                texts[index].append(output.text)
                calls[index].extend(output.tool_calls)
                logprobs[index].extend(_logprobs(output))
                if output.finished:
                    finish[index] = output.finish_reason or "stop"
            await self._settle(prepared)
        finally:
            await self._settle_shielded(prepared)
        return ChatCompletion(
            id=prepared.id,
            created=prepared.created,
            model=prepared.model,
            choices=[
                _choice(
                    prepared,
                    index,
                    "".join(texts[index]),
                    finish.get(index, "length"),
                    logprobs[index],
                    calls[index],
                )
                for index in range(len(prepared.requests))
            ],
            usage=prepared.tally.usage(),
            system_fingerprint=prepared.engine.fingerprint(),
        )

    async def start_stream(self, prepared: PreparedChat) -> AsyncIterator[str]:
        """Wait for the engine to accept the request (or refuse it: that error still gets its
        HTTP status), then hand back the SSE events."""
        outputs, first = await self.started_outputs(prepared)
        prepared.events = self._stream(prepared, outputs, first)
        return prepared.events

    async def _stream(
        self, prepared: PreparedChat, outputs: AsyncGenerator[Any], first: Any
    ) -> AsyncGenerator[str]:
        """SSE events; an error after the first byte arrives as an error event before [DONE],
        sent once what was generated is booked. What one output makes goes out in one write,
        the role chunks with the first: each write wakes the client, which on a 2-vCPU host
        cost 70-130 us of the sender's time."""
        failure: OpenAIError | None = None
        try:
            role = Delta(role="assistant", content="")
            opening = [
                prepared.chunks.chunk(ChunkChoice(index=index, delta=role))
                for index in range(len(prepared.requests))
            ]
            item = first
            while True:
                events = [KEEPALIVE_EVENT] if item is KEEPALIVE else self._events(prepared, *item)
                if opening:
                    events, opening = opening + events, []
                if events:
                    yield events[0] if len(events) == 1 else "".join(events)
                try:
                    item = await anext(outputs)
                except StopAsyncIteration:
                    break
            await self._settle(prepared)
            if prepared.include_usage:
                yield prepared.chunks.chunk(None, usage=prepared.tally.usage())
        except Exception as exc:  # the status line is gone: report in-band, once settled
            failure = from_domain(exc)
            if failure.status >= 500:
                logger.exception("stream %s failed", prepared.id)
        finally:
            with anyio.CancelScope(shield=True):
                await outputs.aclose()
            await self._settle_shielded(prepared)
        if failure is not None:  # booked before the client hears of it, as usage is
            yield failure.sse_event()
        yield "data: [DONE]\n\n"

    def _events(self, prepared: PreparedChat, index: int, output: GenerationOutput) -> list[str]:
        if prepared.plan.format is not None:
            return _tool_events(prepared, index, output)
        events = []
        chunks = prepared.chunks
        if output.tool_calls:  # an upstream's own calls, with any text of the same chunk
            logprobs = ChoiceLogprobs(content=_logprobs(output)) if prepared.want_logprobs else None
            delta = Delta(
                content=output.text or None, tool_calls=tools.delta_calls(output.tool_calls)
            )
            events.append(chunks.chunk(ChunkChoice(index=index, delta=delta, logprobs=logprobs)))
        elif prepared.want_logprobs and (output.text or output.logprobs):
            logprobs = ChoiceLogprobs(content=_logprobs(output))
            delta = Delta(content=output.text)
            events.append(chunks.chunk(ChunkChoice(index=index, delta=delta, logprobs=logprobs)))
        elif output.text:
            events.append(chunks.content(index, output.text))
        if output.finished:
            finish_reason = output.finish_reason or "stop"
            choice = ChunkChoice(index=index, delta=Delta(), finish_reason=finish_reason)
            events.append(chunks.chunk(choice))
        return events

    async def complete_once(
        self, request: ChatCompletionRequest, account_id: int, key: str, key_id: int | None = None
    ) -> tuple[int, str]:
        """A non-streaming completion under an Idempotency-Key: replayed, never billed twice."""
        digest = body_hash(request.model_dump_json().encode())
        stored = await self.books.claim_idempotency(account_id, key, digest)
        if stored is not None:
            return stored.status_code, stored.body
        try:
            completion = await self.complete(await self.prepare(request, account_id, key_id))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.books.give_up_idempotency(account_id, key)
            raise
        body = completion.model_dump_json()
        await self.books.store_idempotency(account_id, key, 200, body)
        return 200, body

    async def started_outputs(
        self, prepared: PreparedChat
    ) -> tuple[AsyncGenerator[tuple[int, GenerationOutput]], Any]:
        """For a stream, this one's or another front door's: `_outputs` once the engine
        accepted the request, with its first item (a keep-alive or an output); a refusal is
        raised with the request closed, so that error still gets its HTTP status. `close` ends
        the outputs if the stream never runs."""
        outputs = self._outputs(prepared, keepalive=self.settings.keepalive_seconds)
        try:
            first = await anext(outputs)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await outputs.aclose()
            await self.close(prepared)
            raise
        prepared.outputs = outputs
        return outputs, first

    def outputs(
        self, prepared: PreparedChat, keepalive: float | None
    ) -> AsyncGenerator[tuple[int, GenerationOutput]]:
        """`_outputs` for another front door (`serving/responses.py`), which shapes them
        itself and then ends the request with `close`, which settles it."""
        return self._outputs(prepared, keepalive)

    async def _outputs(
        self, prepared: PreparedChat, keepalive: float | None
    ) -> AsyncGenerator[tuple[int, GenerationOutput]]:
        """Every choice's outputs as they come; checkpoints usage and enforces the time limit.

        A request with nothing to show (queued behind a full batch, or prefilling a long
        prompt) still checkpoints every `checkpoint_seconds`, which pushes its hold's expiry
        out: otherwise the sweeper would take the hold of a live request that waited longer
        than the hold TTL, and what it then generated would never be billed."""
        deadline = prepared.accepted_at + self.settings.max_generation_seconds
        try:
            streams: list[Any] = prepared.started or [
                prepared.engine.generate(request) for request in prepared.requests
            ]
            prepared.started = None  # `merged` closes them from here on
        finally:
            prepared.arrived()
        finished: set[int] = set()
        checkpoint_seconds = self.settings.checkpoint_seconds
        merged = merge_outputs(
            streams,
            keepalive=min(keepalive or math.inf, checkpoint_seconds),
            deadline=deadline,
            on_output=lambda index, output: self._count(prepared, index, output),
        )
        last_yield = time.monotonic()
        try:
            async for item in merged:
                if item is TIMEOUT:  # out of time: the unfinished choices end as "length"
                    for index in set(range(len(streams))) - finished:
                        yield index, self._cut(prepared, index)
                    return
                if time.monotonic() - prepared.last_checkpoint >= checkpoint_seconds:
                    await self._checkpoint(prepared)
                if item is KEEPALIVE:
                    idle = time.monotonic() - last_yield
                    if keepalive is None or idle < keepalive:
                        continue  # a checkpoint tick, not yet the client's keep-alive
                else:
                    index, output = item
                    if output.finished:
                        finished.add(index)
                last_yield = time.monotonic()
                yield item
        finally:
            with anyio.CancelScope(shield=True):
                await merged.aclose()
                for request in prepared.requests:
                    await prepared.engine.abort(request.request_id)

    def _cut(self, prepared: PreparedChat, index: int) -> GenerationOutput:
        return GenerationOutput(
            text="",
            token_ids=[],
            prompt_tokens=prepared.tally.prompt_tokens,
            completion_tokens=prepared.tally.completion.get(index, 0),
            finished=True,
            finish_reason="length",
        )

    def _count(self, prepared: PreparedChat, index: int, output: GenerationOutput) -> None:
        tally = prepared.tally
        if tally.first_token_at is None and output.completion_tokens:
            tally.first_token_at = time.monotonic()
            self.metrics.time_to_first_token.labels(prepared.model).observe(
                tally.first_token_at - prepared.accepted_at
            )
        tally.completion[index] = output.completion_tokens
        if output.prompt_tokens > 0:  # the engine's count: an upstream's own, where it differs
            tally.prompt_tokens = output.prompt_tokens
        tally.cached_tokens = max(tally.cached_tokens, output.cached_tokens)

    async def _checkpoint(self, prepared: PreparedChat) -> None:
        """Record the usage so far (the caller checks it is due: no coroutine a token)."""
        prepared.last_checkpoint = time.monotonic()
        # nothing generated yet: only extend the hold (a crash now must not bill the prompt)
        used = prepared.tally.cost() if prepared.tally.completion_tokens else 0
        try:
            await self.books.checkpoint(prepared.id, used, account_id=prepared.account_id)
        except DATABASE_UNAVAILABLE as exc:  # the hold still caps it; settling bills it all
            logger.warning(
                "checkpoint of %s failed, generation goes on: %s",
                prepared.id,
                describe_database_error(exc),
            )
            # the next try waits a full interval after this one gave up, so a database
            # that times out does not stall the stream on every output
            prepared.last_checkpoint = time.monotonic()

    async def close(self, prepared: PreparedChat) -> None:
        """End the request: stop its SSE stream if the server left it suspended (the client
        went away while a write was waiting, so nothing resumed the generator to run its
        `finally`), then settle. The route runs this after every streaming response, so
        generation stops and the bill is final without waiting for garbage collection."""
        events, prepared.events = prepared.events, None
        outputs, prepared.outputs = prepared.outputs, None
        with anyio.CancelScope(shield=True):
            if events is not None:
                await events.aclose()
            if outputs is not None:  # the stream never started: its `finally` did not run
                await outputs.aclose()
        await self._settle_shielded(prepared)

    async def _settle(self, prepared: PreparedChat) -> None:
        """Settle the hold with what was generated (release it if nothing was), once. If the
        database is unreachable, keep trying in the background (see the module docstring)."""
        if prepared.closed:
            return
        prepared.closed = True
        prepared.arrived()  # in case it never reached `_outputs`
        started, prepared.started = prepared.started, None
        await _close_all(started)  # sent early, never read: nothing of them is billed
        try:
            await self._resolve_hold(prepared)
        except DATABASE_UNAVAILABLE as exc:
            logger.warning(
                "could not settle %s, retrying: %s", prepared.id, describe_database_error(exc)
            )
            task = asyncio.get_running_loop().create_task(self._settle_later(prepared))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            return
        except Exception:
            # The hold stays open with its last checkpoint; the sweeper resolves it.
            logger.exception("could not settle %s; the sweeper will", prepared.id)
            return
        self._observe(prepared)

    async def _resolve_hold(self, prepared: PreparedChat) -> None:
        tally = prepared.tally
        if tally.completion_tokens == 0:
            await self.books.release(prepared.id, account_id=prepared.account_id)
        elif not await self.books.settle(
            prepared.id,
            account_id=prepared.account_id,
            cost=tally.cost(),
            prompt_tokens=tally.prompt_tokens,
            completion_tokens=tally.completion_tokens,
        ):
            # already resolved: by an earlier attempt whose reply was lost, or by the sweeper
            # (the hold expired while the database was out of reach for longer than the hold
            # TTL), which billed the last checkpoint; either way it stands
            logger.warning(
                "%s was already resolved when settled (%d tokens used); if the sweeper did "
                "it, the last checkpoint was billed",
                prepared.id,
                tally.prompt_tokens + tally.completion_tokens,
            )

    async def _settle_later(self, prepared: PreparedChat) -> None:
        """Retry a settlement with capped backoff until the database takes it. A settlement is
        idempotent (the hold resolves once), so racing the sweeper cannot bill twice."""
        delay = SETTLE_RETRY_FIRST_SECONDS
        while True:
            await asyncio.sleep(delay)
            try:
                await self._resolve_hold(prepared)
            except DATABASE_UNAVAILABLE:
                delay = min(delay * 2, SETTLE_RETRY_MAX_SECONDS)
                continue
            except Exception:
                logger.exception("could not settle %s; the sweeper will", prepared.id)
                return
            logger.info("settled %s after the database came back", prepared.id)
            self._observe(prepared)
            return

    @property
    def settlements_pending(self) -> int:
        """Settlements waiting for the database (shown by /ready)."""
        return len(self._settling)

    async def finish_settling(self, within: float) -> None:
        """At shutdown: give pending settlements a last chance, then leave them to the
        sweeper of the next process (which bills their last checkpoint)."""
        if not self._settling:
            return
        _, left = await asyncio.wait(set(self._settling), timeout=within)
        for task in left:
            task.cancel()
        if left:
            logger.warning("%d settlement(s) left to the sweeper at shutdown", len(left))

    async def _settle_shielded(self, prepared: PreparedChat) -> None:
        with anyio.CancelScope(shield=True):
            await self._settle(prepared)

    def _observe(self, prepared: PreparedChat) -> None:
        tally = prepared.tally
        self.metrics.tokens.labels(prepared.model, "prompt").inc(tally.prompt_tokens)
        self.metrics.tokens.labels(prepared.model, "completion").inc(tally.completion_tokens)
        if tally.first_token_at is not None and tally.completion_tokens > 1:
            elapsed = time.monotonic() - tally.first_token_at
            if elapsed > 0:
                self.metrics.tokens_per_second.labels(prepared.model).observe(
                    (tally.completion_tokens - 1) / elapsed
                )


# What an upstream engine enforces itself, sent on as the client wrote it; its tool calls come
# back structured (`GenerationOutput.tool_calls`).
UPSTREAM_FIELDS = {
    "response_format",
    "logit_bias",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}


def _forwarded(request: ChatCompletionRequest, engine: EngineClient) -> dict[str, Any]:
    """The request fields an upstream-served model gets verbatim (none for a local engine)."""
    if not engine.backends():
        return {}
    return request.model_dump(
        include=UPSTREAM_FIELDS, exclude_none=True, by_alias=True, mode="json"
    )


async def _encode(
    engine: EngineClient,
    messages: list[ChatMessage],
    tool_list: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt's tokens: short chats on the event loop, long ones in a worker thread.

    Tokenizing reads about 0.4 us a character here (1000 characters: 0.4 ms), less than a
    thread hop, which under load took 2-5 ms and by different amounts per request: requests
    sent together reached their holds and the engine apart, and the engine prefilled them in
    separate calls."""
    if tool_list:  # only engines asked to render tools must take them
        return await to_thread.run_sync(engine.encode_chat, messages, tool_list)
    if sum(len(message.content) for message in messages) <= INLINE_TOKENIZE_CHARS:
        return engine.encode_chat(messages)
    return await to_thread.run_sync(engine.encode_chat, messages)


async def _close_all(streams: list[Started] | None) -> None:
    with anyio.CancelScope(shield=True):
        for stream in streams or ():
            await stream.aclose()


def _choice(
    prepared: PreparedChat,
    index: int,
    text: str,
    finish_reason: str,
    logprobs: list[TokenLogprob],
    engine_calls: list[ToolCallDelta],
) -> Choice:
    """A whole answer, its tool calls read out of the text where the request has tools, or
    the calls the engine returned itself (an upstream)."""
    calls = tools.whole_calls(engine_calls)
    if calls is not None:
        content: str | None = text or None
        if finish_reason == "stop":
            finish_reason = "tool_calls"
    else:
        content, calls, finish_reason = tools.split_answer(prepared.plan, text, finish_reason)
    return Choice(
        index=index,
        message=AssistantMessage(content=content, tool_calls=calls),
        finish_reason=finish_reason,  # type: ignore[arg-type]
        logprobs=ChoiceLogprobs(content=logprobs) if prepared.want_logprobs else None,
    )


def _tool_events(prepared: PreparedChat, index: int, output: GenerationOutput) -> list[str]:
    """A streamed answer with tools: content and `delta.tool_calls`; text that may open a call
    is held back until it is known (`text/tool_calls.py`)."""
    calls = prepared.streamed_calls.get(index)
    if calls is None:
        calls = prepared.streamed_calls[index] = StreamedCalls(prepared.plan)
    content, deltas = calls.feed(output.text, finished=output.finished)
    logprobs = ChoiceLogprobs(content=_logprobs(output)) if prepared.want_logprobs else None
    events = []
    if content or deltas or (logprobs and output.logprobs):
        delta = Delta(content=content or None, tool_calls=deltas or None)
        if logprobs is not None and not content and not deltas:
            delta = Delta(content="")
        choice = ChunkChoice(index=index, delta=delta, logprobs=logprobs)
        events.append(prepared.chunks.chunk(choice))
    if output.finished:
        reason = calls.finish_reason(output.finish_reason or "stop")
        choice = ChunkChoice(index=index, delta=Delta(), finish_reason=reason)  # type: ignore[arg-type]
        events.append(prepared.chunks.chunk(choice))
    return events


def _logprobs(output: GenerationOutput) -> list[TokenLogprob]:
    return [
        TokenLogprob(
            token=item.token,
            logprob=item.logprob,
            bytes=item.bytes,
            top_logprobs=[
                TopLogprob(token=top.token, logprob=top.logprob, bytes=top.bytes)
                for top in item.top_logprobs
            ],
        )
        for item in output.logprobs or []
    ]
