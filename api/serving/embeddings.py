"""Embeddings: check, count, hold, embed, settle — chat's billing flow for one-shot work.

The hold is the request's cost as its engine counts the inputs (prompt tokens times the model's
prompt price; nothing is generated): exact for a local model or an upstream one with a
tokenizer, an upper bound for an upstream without (`EmbeddingClient.prepare`). It is placed with
the same `Books.hold` chat uses, so a key's balance and its limit of requests in flight cover
both; it is settled with the same `Books.settle` once the vectors are made, at the prompt tokens
the engine billed (an upstream's own usage, never more than held), before the answer is sent,
and released if they never are (an error, an upstream's refusal, the client gone). A settlement
the database cannot take now is retried in the background until it lands, as chat's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
from anyio import to_thread

from api.books import Books
from api.engine.embedding.pooling import normalized
from api.engine.embedding.protocol import EmbeddingClient, Prepared
from api.errors import (
    DATABASE_UNAVAILABLE,
    OpenAIError,
    describe_database_error,
    invalid_request,
    model_not_found,
    wrong_endpoint,
)
from api.metrics import Metrics
from api.protocol_embeddings import EmbeddingRequest
from api.settings import ApiSettings
from billing.prices import DEFAULT_PRICE

logger = logging.getLogger("tokenshop.api")

MAX_INPUTS = 2048  # OpenAI's limits on one request
MAX_REQUEST_TOKENS = 300_000
INLINE_TOKENIZE_CHARS = 2000  # more is tokenized in a worker thread (as chat's `_encode`)
INLINE_ANSWER_VALUES = 65536  # floats written on the event loop; more in a worker thread
SETTLE_RETRY_FIRST_SECONDS = 0.25
SETTLE_RETRY_MAX_SECONDS = 5.0


@dataclass(frozen=True)
class _Charge:
    hold_id: str
    account_id: int
    cost: int
    prompt_tokens: int


class EmbeddingsService:
    def __init__(
        self,
        *,
        embedders: Mapping[str, EmbeddingClient],
        chat_models: Collection[str],
        books: Books,
        metrics: Metrics,
        settings: ApiSettings,
    ) -> None:
        self.embedders = embedders
        self.chat_models = chat_models
        self.books = books
        self.metrics = metrics
        self.prices = settings.prices()
        self._settling: set[asyncio.Task[None]] = set()

    async def create(
        self, request: EmbeddingRequest, account_id: int, key_id: int | None = None
    ) -> bytes:
        """The answer's JSON, billed; raises an `OpenAIError` (or a domain error the edge maps)
        for anything refused, before any hold is placed."""
        engine = self.embedders.get(request.model)
        if engine is None:
            if request.model in self.chat_models:
                raise wrong_endpoint(request.model, "a chat model", "/v1/embeddings")
            raise model_not_found(request.model)
        self.books.check_key(key_id, model=request.model)  # expired, or a model it may not use
        prepared = await _prepared(engine, request)
        if request.dimensions is not None and engine.dimensions is not None:
            _check_dimensions(request.dimensions, engine.dimensions)
        held_tokens = sum(prepared.counts)
        price = self.prices.get(request.model, DEFAULT_PRICE)
        cost = price.cost(held_tokens, 0)
        request_id = f"embd-{secrets.token_urlsafe(18)}"
        await self.books.hold(
            account_id=account_id,
            key_id=key_id,
            request_id=request_id,
            min_cost=cost,
            max_cost=cost,
            model=request.model,
        )
        try:
            embedded = await engine.run(prepared)
            vectors = embedded.vectors
            if request.dimensions is not None:  # an upstream's width is known from its answer
                _check_dimensions(request.dimensions, vectors.shape[1])
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._release(_Charge(request_id, account_id, cost, held_tokens))
            raise
        prompt_tokens = min(embedded.prompt_tokens, held_tokens)
        charge = _Charge(request_id, account_id, price.cost(prompt_tokens, 0), prompt_tokens)
        with anyio.CancelScope(shield=True):  # made: billed whether or not the client stays
            await self._settle(charge)
        self.metrics.tokens.labels(request.model, "prompt").inc(prompt_tokens)
        if request.dimensions is not None:
            vectors = normalized(np.ascontiguousarray(vectors[:, : request.dimensions]))
        answer = (vectors, request.model, prompt_tokens, request.encoding_format)
        if vectors.size <= INLINE_ANSWER_VALUES:
            return _answer(*answer)
        return await to_thread.run_sync(_answer, *answer)

    async def _release(self, charge: _Charge) -> None:
        try:
            await self.books.release(charge.hold_id, account_id=charge.account_id)
        except Exception as exc:  # the sweeper releases it (nothing was checkpointed)
            logger.warning("could not release %s: %s", charge.hold_id, _describe(exc))

    async def _settle(self, charge: _Charge) -> None:
        try:
            await self._resolve(charge)
        except DATABASE_UNAVAILABLE as exc:
            logger.warning("could not settle %s, retrying: %s", charge.hold_id, _describe(exc))
            task = asyncio.get_running_loop().create_task(self._settle_later(charge))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    async def _resolve(self, charge: _Charge) -> None:
        if not await self.books.settle(
            charge.hold_id,
            account_id=charge.account_id,
            cost=charge.cost,
            prompt_tokens=charge.prompt_tokens,
            completion_tokens=0,
        ):
            logger.warning("%s was already resolved when settled", charge.hold_id)

    async def _settle_later(self, charge: _Charge) -> None:
        """Retry with capped backoff until the database takes it (a hold resolves once)."""
        delay = SETTLE_RETRY_FIRST_SECONDS
        while True:
            await asyncio.sleep(delay)
            try:
                await self._resolve(charge)
            except DATABASE_UNAVAILABLE:
                delay = min(delay * 2, SETTLE_RETRY_MAX_SECONDS)
                continue
            except Exception:
                logger.exception("could not settle %s; the sweeper will", charge.hold_id)
            return

    @property
    def settlements_pending(self) -> int:
        return len(self._settling)

    async def finish_settling(self, within: float) -> None:
        """At shutdown: give pending settlements a last chance (as `ChatService`'s)."""
        if not self._settling:
            return
        _, left = await asyncio.wait(set(self._settling), timeout=within)
        for task in left:
            task.cancel()


async def _prepared(engine: EmbeddingClient, request: EmbeddingRequest) -> Prepared:
    """Every input as its engine runs it, counted, within OpenAI's limits and the model's;
    errors name `input`."""
    raw: Any = request.input
    items: list[Any]
    if isinstance(raw, str):
        items = [raw]
    elif raw and all(isinstance(item, int) for item in raw):
        items = [raw]  # one input as token ids
    else:
        items = raw
    if not items:
        raise _input_error("input must not be empty.")
    if len(items) > MAX_INPUTS:
        raise _input_error(
            f"input has {len(items)} items; at most {MAX_INPUTS} are allowed per request."
        )
    for index, item in enumerate(items):
        if len(item) == 0:
            what = "an empty string" if isinstance(item, str) else "an empty token array"
            raise _input_error(f"input[{index}] is {what}; every input must have content.")
    if isinstance(items[0], str):
        texts: list[str] = items
        if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
            prepared = engine.prepare(texts)
        else:
            prepared = await to_thread.run_sync(engine.prepare, texts)
    else:
        lists = _checked_ids(engine, items)
        prepared = Prepared(lists, [len(ids) for ids in lists])
    if prepared.exact:  # an upper bound refuses nothing: the upstream counts and refuses
        _check_lengths(engine, prepared.counts)
    return prepared


def _checked_ids(engine: EmbeddingClient, items: Sequence[list[int]]) -> list[list[int]]:
    vocab = engine.vocab_size
    for index, ids in enumerate(items):
        array = np.asarray(ids, dtype=np.int64)
        if vocab is not None and (array.min() < 0 or array.max() >= vocab):
            bad = int(array[(array < 0) | (array >= vocab)][0])
            raise _input_error(
                f"input[{index}] has token id {bad}, which is not in this model's vocabulary "
                f"(0-{vocab - 1})."
            )
    if engine.truncate:
        return [ids[: engine.context_length] for ids in items]
    return list(items)


def _check_lengths(engine: EmbeddingClient, counts: Sequence[int]) -> None:
    limit = engine.context_length
    for index, count in enumerate(counts):
        if count > limit:
            raise _input_error(
                f"input[{index}] has {count} tokens; this model's maximum input length "
                f"is {limit} tokens. Please reduce the length of the input.",
                "context_length_exceeded",
            )
    total = sum(counts)
    if total > MAX_REQUEST_TOKENS:
        raise _input_error(
            f"Requested {total} tokens, max {MAX_REQUEST_TOKENS} tokens per request.",
            "max_tokens_per_request",
        )


def _check_dimensions(asked: int, width: int) -> None:
    if asked > width:
        raise invalid_request(
            f"dimensions is {asked}, more than this model's {width}.",
            "dimensions",
            "invalid_value",
        )


def _input_error(message: str, code: str = "invalid_value") -> OpenAIError:
    return invalid_request(message, "input", code)


def _answer(vectors: np.ndarray, model: str, prompt_tokens: int, encoding: str) -> bytes:
    """OpenAI's list of embeddings as JSON: floats, or base64 of little-endian float32."""
    rows: list[object]
    if encoding == "base64":
        little = vectors.astype("<f4", copy=False)
        rows = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:
        rows = vectors.tolist()
    body = {
        "object": "list",
        "data": [
            {"object": "embedding", "embedding": row, "index": index}
            for index, row in enumerate(rows)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _describe(exc: BaseException) -> str:
    return describe_database_error(exc) if isinstance(exc, DATABASE_UNAVAILABLE) else repr(exc)
