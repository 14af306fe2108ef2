"""The running batch of a graph served as exported: left-padded KV arrays that rows join and leave.

The Optimum graph takes `past_key_values.{i}.key|value` shaped [batch, kv_heads, past, head_dim]
and one attention mask over past + new positions, so sequences of different lengths share one
array by left padding: row r's real tokens occupy the last `lengths[r]` columns and the mask is 0
on its padding. Position ids are each row's own length, so padding changes no result.

`filter` drops rows (finished or aborted) and trims columns that became padding for every row;
`concat` joins freshly prefilled rows, padding whichever side is shorter. Both copy, but only when
the batch changes; a decode step just swaps in the graph's `present` arrays (`advance`), which
the graph made by concatenating the whole past (the cost `slot_batch.py` removes where the
graph's attention can be fused). `PaddedBatch` runs prefill and decode calls over such a cache.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence as Rows
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from api.engine.model.causal_lm import OnnxCausalLM
    from api.engine.runtime.prefill import Grouping, Prefill, PrefillCall
    from api.engine.runtime.prefix_cache import PrefixHit
    from api.engine.runtime.sequence import Sequence


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

    def filter(self, keep: Rows[int]) -> KVCache:
        """Keep only rows `keep` (in that order), trimming columns now padding for all of them."""
        index = np.asarray(keep, dtype=np.int64)
        lengths = self.lengths[index]
        start = self.width - int(lengths.max()) if len(index) else self.width
        past = [np.ascontiguousarray(a[index, :, start:, :]) for a in self.past]
        return KVCache(past=past, mask=self.mask[index, start:].copy(), lengths=lengths)

    @staticmethod
    def concat(caches: Rows[KVCache]) -> KVCache:
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


class PaddedBatch:
    """Decoding sequences over a left-padded `KVCache`, for graphs run as exported.

    The same operations as `kv_slots.SlotBatch`, so the scheduler does not care which it has.
    """

    def __init__(self, model: OnnxCausalLM) -> None:
        self.model = model
        self.seqs: list[Sequence] = []  # decoding, in cache row order
        self._cache: KVCache | None = None
        # Without position ids or a mask, rows of different lengths cannot share a call.
        self.pads = model.spec.has_position_ids and model.spec.has_attention_mask
        self.grouping: Grouping = "padded" if self.pads else "equal"

    def prefill(self, call: PrefillCall) -> np.ndarray:
        """Run the call (a chunk of one prompt, or whole prompts left-padded); last logits."""
        head = call.group[0]
        if head.done or not call.completes:
            return self._chunk(head, call.tokens)
        return self._whole(call.group)

    def join(self, items: list[Prefill]) -> None:
        caches = [self._cache] if self._cache is not None else []
        for item in items:
            assert item.cache is not None
            caches.append(item.cache)
            self.seqs.append(item.seq)
        if caches:
            self._cache = KVCache.concat(caches)

    def discard(self, item: Prefill) -> None:
        item.cache = None

    def seed(self, item: Prefill, hit: PrefixHit) -> None:
        """Start `item`'s prompt from cached keys/values of its first `hit.tokens` positions."""
        past = [np.ascontiguousarray(kv[None]) for kv in hit.kv]
        item.cache = KVCache.from_prefill(past, hit.tokens)
        item.done = hit.tokens

    def prefilled_kv(self, item: Prefill) -> list[np.ndarray]:
        """Keys/values of a prompt just completed, before it joins or is discarded."""
        assert item.cache is not None
        return [array[0] for array in item.cache.past]  # one row, no padding

    def kv_of(self, seq: Sequence) -> list[np.ndarray]:
        """Views of the keys/values `seq` has computed, [kv_heads, positions, head_dim] each."""
        assert self._cache is not None
        row = self.seqs.index(seq)
        start = self._cache.width - int(self._cache.lengths[row])
        return [array[row, :, start:, :] for array in self._cache.past]

    def decode(self) -> np.ndarray:
        """One token for every sequence, in one graph call when the graph allows. Logits are
        in the order of `seqs` as it was when called (the caller samples them for that list)."""
        assert self._cache is not None
        if self.pads or len(set(self._cache.lengths.tolist())) == 1:
            return self._step(self._cache, self.seqs)
        # Positions come from the cache width (no position_ids) or padding cannot be masked:
        # decode each group of equal-length rows unpadded, then rejoin, grouped.
        groups: dict[int, list[int]] = defaultdict(list)
        for row, length in enumerate(self._cache.lengths.tolist()):
            groups[length].append(row)
        caches, parts, order = [], [], []
        for rows in groups.values():
            sub = self._cache.filter(rows)
            parts.append(self._step(sub, [self.seqs[r] for r in rows]))
            caches.append(sub)
            order.extend(rows)
        self._cache = KVCache.concat(caches)
        self.seqs = [self.seqs[r] for r in order]
        grouped = np.concatenate(parts, axis=0)
        logits = np.empty_like(grouped)
        logits[np.asarray(order)] = grouped  # back in the caller's row order
        return logits

    def drop_finished(self) -> None:
        keep = [i for i, s in enumerate(self.seqs) if not (s.finished or s.aborted)]
        if len(keep) == len(self.seqs):
            return
        self._cache = self._cache.filter(keep) if keep and self._cache is not None else None
        self.seqs = [self.seqs[i] for i in keep]

    def clear(self) -> None:
        self._cache = None
        self.seqs = []

    def _step(self, cache: KVCache, seqs: list[Sequence]) -> np.ndarray:
        mask, positions = cache.step_inputs()
        ids = np.array([[s.last_token] for s in seqs], dtype=np.int64)
        logits, presents = self.model.forward(ids, mask, positions, cache.past)
        cache.advance(presents, mask)
        return logits

    def _chunk(self, item: Prefill, tokens: int) -> np.ndarray:
        """The next `tokens` prompt tokens of `item`, on top of the KV cache of the ones before."""
        end = item.done + tokens
        ids, positions = item.next_tokens(tokens)
        mask = np.ones((1, end), np.int64)
        past = item.cache.past if item.cache is not None else self.model.empty_past(1)
        logits, presents = self.model.forward(ids, mask, positions, past)
        item.cache = KVCache.from_prefill(presents, end)
        item.done = end
        return logits

    def _whole(self, group: list[Prefill]) -> np.ndarray:
        """Prompts of `group` from scratch, left-padded to the longest, in one graph call; each
        item gets its own rows of the resulting cache."""
        seqs = [p.seq for p in group]
        lengths = np.array([s.prompt_len for s in seqs], np.int64)
        width = int(lengths.max())
        ids = np.zeros((len(seqs), width), np.int64)
        mask = np.zeros((len(seqs), width), np.int64)
        positions = np.zeros((len(seqs), width), np.int64)
        for row, seq in enumerate(seqs):
            start = width - seq.prompt_len
            ids[row, start:] = seq.request.prompt_token_ids
            mask[row, start:] = 1
            positions[row, start:] = np.arange(seq.prompt_len)
        logits, presents = self.model.forward(
            ids, mask, positions, self.model.empty_past(len(seqs))
        )
        for row, length in enumerate(lengths.tolist()):
            if length < width:  # padding rows attended to nothing: keep no NaN or garbage around
                for array in presents:
                    array[row, :, : width - length, :] = 0
        cache = KVCache(past=presents, mask=mask, lengths=lengths)
        for row, item in enumerate(group):
            item.cache = cache.filter([row]) if len(group) > 1 else cache
            item.done = item.seq.prompt_len
        return logits
