"""The running batch of a fused-attention graph: one preallocated KV buffer, a row per sequence.

Each layer's `past_key`/`present_key` (and value) is bound, with ONNX Runtime's I/O binding, to
one numpy buffer `[slots, kv_heads, capacity, head_dim]`: attention appends in place, so a
decode step copies no cache. Row r holds one sequence's keys at `[0, length)` (right padding;
`seqlens_k` gives each row's length). Decoding sequences sit in rows `[0, decoding)` in the
order of `seqs`; a prompt being prefilled owns a row above them and is swapped down when
complete; a leaving sequence is replaced by the last decoding row; such moves copy one row, and
only when the batch changes. Capacity doubles (up to the context) when a row would overflow.
Where the graph returns the last position only, the logits are bound too, to one buffer
written in place by every call. A speculative step (`verify`) feeds each row its last token and
drafts, has the logits of all those positions, and keeps what the scheduler accepted (`settle`):
keys and values of rejected drafts stay past the row's length, where nothing reads them.
Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from api.engine.model.causal_lm import OnnxCausalLM
from api.engine.model.spec import LOGITS_POSITIONS, SEQLENS, TOTAL
from api.engine.runtime.mapped import unwritten
from api.engine.runtime.prefill import Grouping, Prefill, PrefillCall
from api.engine.runtime.prefix_cache import PrefixHit
from api.engine.runtime.sequence import Sequence

INITIAL_CAPACITY = 256
MAX_BINDINGS = 16  # cached I/O bindings, one per (first row, rows, capacity, logits positions)


class SlotBatch:
    """Decoding sequences and prompts being prefilled, over one shared KV buffer."""

    def __init__(self, model: OnnxCausalLM, slots: int, *, max_drafts: int = 0) -> None:
        spec = model.spec
        self.model = model
        self.capacity = min(INITIAL_CAPACITY, model.context_length)
        self._shape = (slots, spec.kv_heads, self.capacity, spec.head_dim)
        self._buffers = [unwritten(self._shape, spec.kv_dtype) for _ in spec.past_names]
        self._rows: list[Sequence | None] = [None] * slots
        self._lengths = np.zeros(slots, np.int64)  # tokens in the cache, per row
        self.seqs: list[Sequence] = []  # decoding, rows [0, len(seqs))
        # ONNX Runtime's attention takes one prompt per call; ours takes whole prompts of
        # different lengths left-padded in one (the weights are read once for all of them).
        self.grouping: Grouping = "padded" if model.spec.padded_prefill else "single"
        self._bindings: dict[tuple[int, int, int, int], ort.IOBinding] = {}
        # Drafts a step can verify: 0 where the graph returns one position only, or where a
        # position's logits would depend on the others in its call (the text must not change).
        verifies = model.logits_positions and model.positions_independent
        self.max_drafts = max_drafts if verifies else 0
        # None: ONNX Runtime allocates the logits
        self._logits = model.logits_buffer(slots * (self.max_drafts + 1))

    # ---- the scheduler's operations ----------------------------------------------------------

    def prefill(self, call: PrefillCall) -> np.ndarray:
        """Run the next `call.tokens` prompt tokens of the call's one request, or the whole
        prompts of several; last logits, a row per request (valid until the next graph call,
        like `decode`'s)."""
        if len(call.group) > 1:
            return self._prefill_whole(call.group, call.tokens)
        (item,) = call.group
        row = self._row_of(item.seq) if item.done else self._free_row(item.seq)
        end = item.done + call.tokens
        ids, positions = item.next_tokens(call.tokens)
        logits = self._run(row, ids, positions, np.array([end], np.int64))
        self._lengths[row] = end
        item.done = end
        return logits

    def _prefill_whole(self, items: list[Prefill], width: int) -> np.ndarray:
        """Whole prompts in one call over adjacent rows, each left-padded to `width` (padding
        is neither cached nor attended to: `csrc/attention.c`)."""
        first = self._free_block(items)
        if first is None:  # no adjacent free rows: one call each
            parts = [self.prefill(PrefillCall([item], item.remaining)).copy() for item in items]
            return np.concatenate(parts)
        ids = np.zeros((len(items), width), np.int64)
        positions = np.zeros_like(ids)
        totals = np.array([item.seq.prompt_len for item in items], np.int64)
        for row, item in enumerate(items):
            tokens, at = item.next_tokens(item.remaining)
            ids[row, width - tokens.shape[1] :] = tokens[0]
            positions[row, width - tokens.shape[1] :] = at[0]
        logits = self._run(first, ids, positions, totals)
        self._lengths[first : first + len(items)] = totals
        for item, total in zip(items, totals.tolist(), strict=True):
            item.done = total
        return logits

    def seed(self, item: Prefill, hit: PrefixHit) -> None:
        """Start `item`'s prompt from cached keys/values of its first `hit.tokens` positions."""
        row = self._free_row(item.seq)
        self._reserve(hit.tokens)
        for buffer, kv in zip(self._buffers, hit.kv, strict=True):
            buffer[row, :, : hit.tokens] = kv
        self._lengths[row] = item.done = hit.tokens

    def kv_of(self, seq: Sequence) -> list[np.ndarray]:
        """Views of the keys/values `seq` has computed, [kv_heads, positions, head_dim] each."""
        row = self._row_of(seq)
        return [buffer[row, :, : self._lengths[row]] for buffer in self._buffers]

    def prefilled_kv(self, item: Prefill) -> list[np.ndarray]:
        """The same for a prompt just completed, before it joins or is discarded."""
        return self.kv_of(item.seq)

    def join(self, items: list[Prefill]) -> None:
        """Completed prompts start decoding: their rows move to the end of the decoding block."""
        for item in items:
            self._swap(self._row_of(item.seq), len(self.seqs))
            self.seqs.append(item.seq)

    def discard(self, item: Prefill) -> None:
        """A prompt that will not decode (aborted, or finished at its first token)."""
        if item.done:
            self._rows[self._row_of(item.seq)] = None

    def decode(self) -> np.ndarray:
        """One token for every decoding sequence, in one call; logits in `seqs` order, in a
        buffer the next graph call overwrites."""
        count = len(self.seqs)
        ids = np.array([[s.last_token] for s in self.seqs], np.int64)
        positions = self._lengths[:count, None].copy()
        logits = self._run(0, ids, positions, self._lengths[:count] + 1)
        self._lengths[:count] += 1
        return logits

    def can_verify(self) -> bool:
        """Whether `verify` can run the batch as it is: ONNX Runtime's attention takes several
        new tokens over a cache for one row only; ours, for any."""
        return self.max_drafts > 0 and (self.model.spec.padded_prefill or len(self.seqs) == 1)

    def verify(self, drafts: list[list[int]]) -> np.ndarray:
        """Every decoding sequence's last token and its `drafts` in one call: logits
        `[rows, width, vocab]`, width one more than the longest draft list (a shorter one is
        padded; its padding's logits mean nothing). Position j's logits give the token after
        draft j (after the last token, for j = 0). Lengths stay until `settle`."""
        count, width = len(self.seqs), 1 + max(len(d) for d in drafts)
        ids = np.zeros((count, width), np.int64)
        for row, (seq, draft) in enumerate(zip(self.seqs, drafts, strict=True)):
            ids[row, 0] = seq.last_token
            ids[row, 1 : 1 + len(draft)] = draft
        positions = self._lengths[:count, None] + np.arange(width)
        return self._run(0, ids, positions, self._lengths[:count] + width, logits=width)

    def settle(self, kept: list[int]) -> None:
        """After `verify`: row r's cache holds its last token and its first `kept[r] - 1`
        drafts (the tokens it took, less the newest, which the next step feeds)."""
        self._lengths[: len(kept)] += np.array(kept, np.int64)

    def drop_finished(self) -> None:
        """Sequences that finished or were aborted leave; the last row fills each hole."""
        for seq in [s for s in self.seqs if s.finished or s.aborted]:
            row, last = self._row_of(seq), len(self.seqs) - 1
            self._move(last, row)
            self.seqs[row] = self.seqs[last]
            self.seqs.pop()
            self._rows[last] = None

    def clear(self) -> None:
        self._rows = [None] * len(self._rows)
        self.seqs = []

    # ---- rows ----------------------------------------------------------------------------------

    def _row_of(self, seq: Sequence) -> int:
        return next(r for r, s in enumerate(self._rows) if s is seq)

    def _free_row(self, seq: Sequence) -> int:
        free = (r for r in range(len(self.seqs), len(self._rows)) if self._rows[r] is None)
        row = next(free, None)
        if row is None:  # the scheduler admits no more than the rows: one was not given back
            raise RuntimeError(f"all {len(self._rows)} KV rows are taken: a row leaked")
        self._rows[row] = seq
        self._lengths[row] = 0
        return row

    def _free_block(self, items: list[Prefill]) -> int | None:
        """The first of `len(items)` adjacent free rows above the decoding ones, now theirs."""
        count = len(items)
        for first in range(len(self.seqs), len(self._rows) - count + 1):
            if all(row is None for row in self._rows[first : first + count]):
                for offset, item in enumerate(items):
                    self._rows[first + offset] = item.seq
                return first
        return None

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        filled = int(max(self._lengths[a], self._lengths[b]))
        for buffer in self._buffers:
            buffer[[a, b], :, :filled] = buffer[[b, a], :, :filled]
        self._lengths[[a, b]] = self._lengths[[b, a]]
        self._rows[a], self._rows[b] = self._rows[b], self._rows[a]

    def _move(self, src: int, dst: int) -> None:
        if src == dst:
            return
        filled = int(self._lengths[src])
        for buffer in self._buffers:
            buffer[dst, :, :filled] = buffer[src, :, :filled]
        self._lengths[dst] = filled
        self._rows[dst] = self._rows[src]

    def _reserve(self, needed: int) -> None:
        """Grow every buffer so `needed` positions fit (doubling, up to the context length).

        Only the rows a sequence holds are copied, each up to its own length, into buffers whose
        pages are allocated when first written: a row no sequence holds takes no memory.
        Copying every row to the longest one's length into `np.zeros` wrote into all of them
        (on 2 MB pages, all of each): 3.3 GB resident for one 2,000-token prompt on a
        Llama-3.2-3B shape (bench/results/2026-11-26-compare-llama-3.2-3b-zen4-99cd59b.md)."""
        if needed <= self.capacity:
            return
        capacity = min(max(needed, 2 * self.capacity), self.model.context_length)
        shape = (*self._shape[:2], capacity, self._shape[3])
        held = [r for r, seq in enumerate(self._rows) if seq is not None]
        rows = [(r, int(self._lengths[r])) for r in held if self._lengths[r]]
        for i, old in enumerate(self._buffers):
            new = unwritten(shape, old.dtype)
            for row, filled in rows:
                new[row, :, :filled] = old[row, :, :filled]
            self._buffers[i] = new
        self.capacity, self._shape = capacity, shape
        self._bindings.clear()  # they point into the old buffers

    # ---- the graph call ------------------------------------------------------------------------

    def _run(
        self,
        first_row: int,
        ids: np.ndarray,
        positions: np.ndarray,
        totals: np.ndarray,
        logits: int = 1,
    ) -> np.ndarray:
        """Run rows `[first_row, first_row + len(ids))` whose totals after this call are
        `totals`; the cache is read and written in place. The last position's logits `[rows,
        vocab]`, or, for `logits` > 1, the last `logits` positions' `[rows, logits, vocab]`."""
        self._reserve(int(totals.max()))
        model, spec = self.model, self.model.spec
        binding = self._cache_binding(first_row, len(ids), logits)
        if self._logits is None:
            binding.bind_output("logits")  # rebound in place: ONNX Runtime allocates it anew
        binding.bind_cpu_input("input_ids", ids.astype(spec.ids_dtype, copy=False))
        if spec.has_position_ids:  # else attention applies the rotary embedding itself
            binding.bind_cpu_input("position_ids", positions)
        binding.bind_cpu_input(SEQLENS, (totals - 1).astype(np.int32))
        binding.bind_cpu_input(TOTAL, np.array(totals.max(), np.int32))
        model.session.run_with_iobinding(binding)
        if self._logits is not None:
            out = self._logits[: len(ids) * logits].reshape(len(ids), logits, -1)
        else:
            out = binding.get_outputs()[0].numpy()
        if logits > 1:
            return out if out.dtype == np.float32 else out.astype(np.float32)
        return model.last_logits(out)

    def _cache_binding(self, first_row: int, rows: int, logits: int) -> ort.IOBinding:
        """A binding of rows `[first_row, first_row + rows)` of every cache buffer as both past
        and present, and of `logits` positions' logits a row. Kept while the rows and buffers
        stay the same (every decode step of a steady batch), since binding every buffer anew
        costs time each step (bench/results/2026-11-26-kernel-notes.md)."""
        key = (first_row, rows, self.capacity, logits)
        binding = self._bindings.get(key)
        if binding is not None:
            return binding
        spec = self.model.spec
        binding = self.model.session.io_binding()
        if self._logits is None:
            binding.bind_output("logits")  # first: outputs come back in binding order
        else:
            out = self._logits[: rows * logits]
            shape = [rows, logits, out.shape[-1]]
            binding.bind_output("logits", "cpu", 0, out.dtype, shape, out.ctypes.data)
        if self.model.logits_positions:
            binding.bind_cpu_input(LOGITS_POSITIONS, np.array([logits], np.int64))
        shape = [rows, *self._shape[1:]]
        for past, present, buffer in zip(
            spec.past_names, spec.present_names, self._buffers, strict=True
        ):
            pointer = buffer[first_row : first_row + rows].ctypes.data
            binding.bind_input(past, "cpu", 0, spec.kv_dtype, shape, pointer)
            binding.bind_output(present, "cpu", 0, spec.kv_dtype, shape, pointer)
        if len(self._bindings) >= MAX_BINDINGS:  # rows and widths come and go
            self._bindings.clear()
        self._bindings[key] = binding
        return binding
