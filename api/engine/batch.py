"""The KV cache of the running batch: left-padded arrays that rows join and leave.

The Optimum graph takes `past_key_values.{i}.key|value` shaped [batch, kv_heads, past, head_dim]
and one attention mask over past + new positions, so sequences of different lengths share one
array by left padding: row r's real tokens occupy the last `lengths[r]` columns and the mask is 0
on its padding. Position ids are each row's own length, so padding changes no result.

`filter` drops rows (finished or aborted) and trims columns that became padding for every row;
`concat` joins freshly prefilled rows, padding whichever side is shorter. Both copy, but only when
the batch changes; a decode step just swaps in the graph's `present` arrays (`advance`). A later
preallocated cache can replace this class behind the same three operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class KVCache:
    """Past keys/values of every layer (graph order) plus per-row padding bookkeeping."""

    past: list[np.ndarray]
    mask: np.ndarray  # [batch, past] int64, 0 on left padding
    lengths: np.ndarray  # [batch] int64, real tokens per row

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    @classmethod
    def from_prefill(cls, presents: list[np.ndarray], length: int) -> KVCache:
        """The cache of one sequence that was just prefilled alone (no padding)."""
        return cls(
            past=presents,
            mask=np.ones((1, length), np.int64),
            lengths=np.array([length], np.int64),
        )

    def step_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """Attention mask (past + the new token) and position ids for one decode step."""
        mask = np.concatenate([self.mask, np.ones((self.batch_size, 1), np.int64)], axis=1)
        return mask, self.lengths[:, None].copy()

    def advance(self, presents: list[np.ndarray], mask: np.ndarray) -> None:
        """Adopt the graph's outputs after a decode step that added one token to every row."""
        self.past = presents
        self.mask = mask
        self.lengths = self.lengths + 1

    def filter(self, keep: Sequence[int]) -> KVCache:
        """Keep only rows `keep` (in that order), trimming columns now padding for all of them."""
        index = np.asarray(keep, dtype=np.int64)
        lengths = self.lengths[index]
        start = self.width - int(lengths.max()) if len(index) else self.width
        past = [np.ascontiguousarray(a[index, :, start:, :]) for a in self.past]
        return KVCache(past=past, mask=self.mask[index, start:].copy(), lengths=lengths)

    @staticmethod
    def concat(caches: Sequence[KVCache]) -> KVCache:
        """Stack caches row-wise, left-padding each to the widest."""
        if len(caches) == 1:
            return caches[0]
        width = max(c.width for c in caches)
        rows = sum(c.batch_size for c in caches)
        past = []
        for layer in range(len(caches[0].past)):
            first = caches[0].past[layer]
            out = np.zeros((rows, first.shape[1], width, first.shape[3]), first.dtype)
            row = 0
            for cache in caches:
                out[row : row + cache.batch_size, :, width - cache.width :, :] = cache.past[layer]
                row += cache.batch_size
            past.append(out)
        mask = np.zeros((rows, width), np.int64)
        row = 0
        for cache in caches:
            mask[row : row + cache.batch_size, width - cache.width :] = cache.mask
            row += cache.batch_size
        lengths = np.concatenate([c.lengths for c in caches])
        return KVCache(past=past, mask=mask, lengths=lengths)
