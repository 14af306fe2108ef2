"""`LocalEmbeddingEngine`: the `EmbeddingClient` that serves one embedding export.

It owns the tokenizer, the model runner and the batcher; it checks the export at load by
embedding a two-token input, so a graph that loads but cannot run fails at start-up, naming the
dir, never on a customer's first request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from api.engine.embedding.batcher import BatchLimits, EmbeddingBatcher
from api.engine.embedding.model import OnnxEmbedder
from api.engine.embedding.pooling import MODULES_FILE, max_seq_length
from api.engine.embedding.protocol import EmbeddingClient, EmbeddingStats
from api.engine.errors import EngineDead, ModelLoadError

TOKENIZER_FILE = "tokenizer.json"
_UNBOUNDED = 1_000_000  # tokenizer_config's model_max_length when it sets none (1e30)


def is_embedding_export(path: Path) -> bool:
    """Whether an export dir holds an embedding model rather than a chat one: it has
    sentence-transformers' module list, or its graph gives no logits."""
    if (path / MODULES_FILE).is_file():
        return True
    from api.engine.embedding.model import graph_outputs

    return (path / "model.onnx").is_file() and "logits" not in graph_outputs(path)


class LocalEmbeddingEngine(EmbeddingClient):
    def __init__(
        self,
        model_id: str,
        path: Path,
        *,
        threads: int | None = None,
        cache_dir: Path | None = None,
        limits: BatchLimits | None = None,
        truncate: bool = False,
    ) -> None:
        if not path.is_dir():
            raise ModelLoadError(f"{path}: not a directory (expected an Optimum ONNX export)")
        self.model_id = model_id
        self.path = path
        self.truncate = truncate
        config = _json(path / "config.json")
        tokenizer_config = _json(path / "tokenizer_config.json")
        self.context_length = _context_length(path, config, tokenizer_config)
        self._tokenizer = _tokenizer(path / TOKENIZER_FILE)
        if truncate:
            self._tokenizer.enable_truncation(self.context_length)
        self.vocab_size = int(
            config.get("vocab_size") or self._tokenizer.get_vocab_size(with_added_tokens=True)
        )
        self.model = OnnxEmbedder(
            path,
            pad_id=_pad_id(self._tokenizer, config, tokenizer_config),
            threads=threads,
            cache_dir=cache_dir,
        )
        try:
            probe = self.model.run([self.tokenize(["ok"])[0][:2] or [0]])
        except Exception as exc:
            raise ModelLoadError(f"{path}: the export loads but does not run: {exc}") from exc
        self.dimensions = int(probe.shape[1])
        self.created = int(time.time())
        self.batcher = EmbeddingBatcher(self.model.run, limits or BatchLimits(), name=model_id)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        return [encoding.ids for encoding in encodings]

    async def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        # the serving layer refuses these with the client's 400; here they would fail the
        # whole batch they landed in, other clients' inputs with them
        if not inputs or any(not 0 < len(tokens) <= self.context_length for tokens in inputs):
            raise ValueError(f"every input must have 1 to {self.context_length} tokens")
        future = self.batcher.submit(inputs)
        try:
            return await future
        finally:
            future.cancel()  # no-op once done; otherwise the batcher drops what is left

    async def check_health(self) -> None:
        if not self.batcher.alive:
            raise EngineDead(f"the embedding engine of {self.model_id} is not running")

    def stats(self) -> EmbeddingStats:
        return self.batcher.stats()

    async def start(self) -> None:
        self.batcher.start()

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.batcher.stop)


def _json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{file}: unreadable JSON: {exc}") from exc
    return value if isinstance(value, dict) else {}


def _tokenizer(file: Path) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{file}: missing (the tokenizer of the export)") from exc
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise ModelLoadError(f"{file}: not a usable tokenizers file: {exc}") from exc
    tokenizer.no_padding()  # the batcher pads; lengths must be the real ones
    tokenizer.no_truncation()  # too long is the client's 400, or cut where the entry says
    return tokenizer


def _context_length(path: Path, config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int:
    """The most tokens an input may have: sentence-transformers' own limit, else the
    tokenizer's, else the model's positions (RoBERTa's count the padding offset: 514 -> 512)."""
    limits: list[int] = []
    if (length := max_seq_length(path)) is not None:
        limits.append(length)
    model_max = tokenizer_config.get("model_max_length")
    if isinstance(model_max, int) and 0 < model_max < _UNBOUNDED:
        limits.append(model_max)
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        offset = 2 if config.get("model_type") in ("roberta", "xlm-roberta", "camembert") else 0
        limits.append(positions - offset)
    if not limits:
        raise ModelLoadError(
            f"{path}: cannot tell the model's input length (no sentence_bert_config.json "
            "max_seq_length, tokenizer_config.json model_max_length or config.json "
            "max_position_embeddings)"
        )
    return min(limits)


def _pad_id(tokenizer: Tokenizer, config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int:
    """The id sentence-transformers pads with (the tokenizer's pad token), so that models
    that read it (XLM-RoBERTa's positions skip it) see the same rows."""
    pad = tokenizer_config.get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    if isinstance(pad, str) and (token_id := tokenizer.token_to_id(pad)) is not None:
        return token_id
    value = config.get("pad_token_id")
    return value if isinstance(value, int) else 0
