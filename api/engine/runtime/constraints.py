"""Constrained decoding with llguidance: grammars compiled once, token masks filled per batch.

A request's `Constraint` carries an llguidance grammar (a JSON schema or a Lark grammar already
serialised by `LLMatcher.grammar_from_*`). `Grammars` compiles each distinct grammar once against
the model's tokenizer and keeps the compiled matcher; a request gets a cheap `deep_copy` of it.
Each step, `fill_masks` computes the allowed-token bitmask of every constrained row of the batch
in one call to llguidance's parallel executor (it releases the GIL), and `apply_masks` sets the
disallowed logits to -inf before penalties, temperature and top_p. Unconstrained rows are left
untouched, so their tokens are exactly what they would be without any constraint in the batch.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

from api.engine.errors import InvalidGrammar
from api.engine.protocol import Constraint

COMPILED_GRAMMARS = 256  # distinct grammars kept compiled per model (least recently used go)
# llguidance's thread pool fills rows in parallel where there are cores to spare; on a few cores
# handing rows to it cost more than it saved, so they are filled in this thread, one by one
# (bench/results/2026-11-26-constrained-epyc-avx2-b93272c.md).
PARALLEL_FILL_MIN_CPUS = 8


class Grammars:
    """A model's llguidance tokenizer and its cache of compiled grammars (thread-safe)."""

    def __init__(
        self, tokenizer_file: Path, *, vocab_size: int, eos_token_ids: Sequence[int]
    ) -> None:
        self._tokenizer_file = tokenizer_file
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def tokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (~50 ms for a 150k vocabulary): unconstrained serving never pays."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.LLTokenizer(
                    self._tokenizer_file.read_text(encoding="utf-8"),
                    n_vocab=self._vocab_size,
                    eos_token=self._eos or None,
                )
            return self._tokenizer

    def compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        """The compiled matcher of `constraint`'s grammar, from the cache when it is there.
        Raises `InvalidGrammar` naming `constraint.param` when llguidance cannot take it."""
        with self._lock:
            matcher = self._compiled.get(constraint.grammar)
            if matcher is not None:
                self._compiled.move_to_end(constraint.grammar)
                return matcher
        matcher = llguidance.LLMatcher(self.tokenizer(), constraint.grammar, log_level=0)
        if matcher.is_error():
            raise InvalidGrammar(constraint.param, _first_line(matcher.get_error()))
        with self._lock:
            self._compiled[constraint.grammar] = matcher
            while len(self._compiled) > COMPILED_GRAMMARS:
                self._compiled.popitem(last=False)
        return matcher

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher for one request (a copy of the compiled one)."""
        return self.compile(constraint).deep_copy()


_executor: llguidance.LLExecutor | None = None
_CPUS = os.cpu_count() or 1  # read once: in a container each call reads cgroup files
_MASK_TERMS = np.array([-np.inf, 0.0], dtype=np.float32)  # by bit: disallowed, allowed


def executor() -> llguidance.LLExecutor:
    """The process's llguidance thread pool, made on first use."""
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor()
    return _executor


def _first_line(error: str) -> str:
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return " ".join(lines[:4])[:500]


def fill_masks(
    executor: llguidance.LLExecutor,
    matchers: Sequence[llguidance.LLMatcher | None],
    vocab_size: int,
) -> np.ndarray | None:
    """The bitmask [rows, ceil(vocab/32)] int32 of every row with a matcher (rows without one
    allow everything), or None when no row is constrained."""
    rows = [(matcher, row) for row, matcher in enumerate(matchers) if matcher is not None]
    if not rows:
        return None
    mask = allocate_token_bitmask(len(matchers), vocab_size)
    if len(rows) > 1 and _CPUS >= PARALLEL_FILL_MIN_CPUS:
        fill_next_token_bitmask_par(executor, rows, mask)
    else:  # `fill_next_token_bitmask` without its per-call checks (a third of the cost)
        row_bytes = mask.shape[1] * mask.itemsize
        base = mask.ctypes.data
        for matcher, row in rows:
            matcher.unsafe_compute_mask_ptr(base + row * row_bytes, row_bytes)
    return mask


def apply_masks(logits: np.ndarray, mask: np.ndarray, rows: Sequence[int]) -> None:
    """Set to -inf, in place, the logits of `rows` whose token is not allowed by `mask`."""
    vocab = logits.shape[1]
    rows = list(rows)
    whole = len(rows) == logits.shape[0]  # every row: no gather and scatter
    bits = np.unpackbits((mask if whole else mask[rows]).view(np.uint8), axis=1, bitorder="little")
    width = min(bits.shape[1], vocab)
    # adding 0 or -inf looked up by bit: a few times faster than putmask or boolean indexing
    if whole:
        logits[:, :width] += _MASK_TERMS[bits[:, :width]]
    else:
        logits[rows, :width] += _MASK_TERMS[bits[:, :width]]
    if width < vocab:  # logits wider than the masks: ids past the tokenizer are never allowed
        logits[rows, width:] = -np.inf
