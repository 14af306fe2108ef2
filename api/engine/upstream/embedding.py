"""`UpstreamEmbeddingEngine`: an embedding model served by text-embeddings-inference, vLLM
(`--task embed`), infinity, llama.cpp's server or a provider, all through OpenAI's
`POST {base}/embeddings`, behind the same `EmbeddingClient` as the local engine.

Counting for the hold (`prepare`): with a `tokenizer`, its tokens with special tokens, as the
local engine counts; without one, an upper bound no tokenizer exceeds: the text's UTF-8 length
(every token of a byte-level, byte-fallback or WordPiece vocabulary covers at least one byte)
plus `SPECIAL_TOKENS_BOUND` (a model's own markers, SentencePiece's leading space), at most
`context_length` (a longer input is refused or cut by the upstream). Token ids count as sent.

Billing (`run`): each upstream request's `usage.prompt_tokens`; where a server reports none,
the count held. Never more than was held. Inputs go in slices of `batch_size`, up to
`PARALLEL_BATCHES` at once, each failing over like a chat request before its first token
(`servers.py`); one slice failing fails the request, and nothing of it is billed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from api.engine.embedding.protocol import Embedded, EmbeddingClient, EmbeddingStats, Prepared
from api.engine.errors import ModelLoadError
from api.engine.upstream import wire
from api.engine.upstream.config import UpstreamConfig, UpstreamTimeouts
from api.engine.upstream.servers import UpstreamServers

logger = logging.getLogger("tokenshop.upstream")

SPECIAL_TOKENS_BOUND = 8  # tokens a model adds to an input beyond its text's bytes, at most
PARALLEL_BATCHES = 4  # upstream requests one client request has in flight at once


class UpstreamEmbeddingEngine(UpstreamServers, EmbeddingClient):
    def __init__(self, config: UpstreamConfig, *, timeouts: UpstreamTimeouts | None = None):
        super().__init__(config, timeouts=timeouts)
        self.dimensions = config.dimensions
        self.vocab_size = None  # token ids are checked by the upstream, which knows its vocab
        self.truncate = False
        self._tokenizer = _load_tokenizer(config) if config.tokenizer is not None else None
        self._batches = 0
        self._inputs = 0
        self._tokens = 0

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        if self._tokenizer is None:
            raise RuntimeError(f"model {self.model_id!r} has no tokenizer configured")
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        return [encoding.ids for encoding in encodings]

    def prepare(self, texts: Sequence[str]) -> Prepared:
        """The texts themselves; counted by the tokenizer, else bounded (module docstring)."""
        if self._tokenizer is not None:
            return Prepared(list(texts), [len(ids) for ids in self.tokenize(texts)])
        limit = self.context_length
        bounds = [min(len(text.encode()) + SPECIAL_TOKENS_BOUND, limit) for text in texts]
        return Prepared(list(texts), bounds, exact=False)

    async def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        return (await self.run(Prepared(inputs, [len(ids) for ids in inputs]))).vectors

    async def run(self, prepared: Prepared) -> Embedded:
        size = self.config.batch_size
        starts = range(0, len(prepared.inputs), size)
        request_id = f"embd-up-{secrets.token_hex(6)}"  # names the request in failover logs
        limiter = asyncio.Semaphore(PARALLEL_BATCHES)

        async def one(start: int) -> tuple[np.ndarray, int]:
            inputs = prepared.inputs[start : start + size]
            held = sum(prepared.counts[start : start + size])
            body = wire.embeddings_body(self.config.upstream_model, inputs)
            async with limiter:
                vectors, reported = await self._post_json(
                    "/embeddings",
                    body,
                    lambda doc: wire.parse_embeddings(doc, len(inputs)),
                    request_id,
                )
            return vectors, held if reported is None else min(reported, held)

        tasks = [asyncio.ensure_future(one(start)) for start in starts]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        vectors = np.concatenate([part for part, _ in results])
        billed = sum(tokens for _, tokens in results)
        self._learn_width(vectors.shape[1])
        self._batches += len(results)
        self._inputs += len(prepared.inputs)
        self._tokens += billed
        return Embedded(vectors, billed)

    def _learn_width(self, width: int) -> None:
        if self.dimensions != width:
            if self.dimensions is not None:
                logger.warning(
                    "upstream model %s answers %d-wide vectors, not the %d its entry says",
                    self.model_id,
                    width,
                    self.dimensions,
                )
            self.dimensions = width

    def _answers(self, status: int) -> bool:
        """text-embeddings-inference has no `/models`: its 404 says it is up all the same."""
        return status in (200, 404)

    def stats(self) -> EmbeddingStats:
        return EmbeddingStats(
            queued_inputs=0,
            batches=self._batches,
            inputs=self._inputs,
            tokens=self._tokens,
            padded_tokens=self._tokens,
        )

    async def start(self) -> None:
        await self._open()
        self._watch()


def _load_tokenizer(config: UpstreamConfig) -> Tokenizer:
    """A tokenizer.json, or a dir with one, counting as the model does: special tokens, no
    padding, no truncation."""
    assert config.tokenizer is not None
    path = config.tokenizer
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        tokenizer = Tokenizer.from_file(str(Path(file)))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise ModelLoadError(f"model {config.name!r}: tokenizer {str(path)!r}: {exc}") from exc
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer
