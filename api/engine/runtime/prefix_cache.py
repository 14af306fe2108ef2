"""Keys and values of finished conversations, kept so the next turn skips prefilling them.

A chat client sends the whole conversation every turn. Each prompt stores its keys/values once
complete, each sequence that leaves the batch stores those of every position it computed, and a
new prompt starts from the longest stored prefix it shares (llama.cpp's prompt cache, vLLM's
prefix caching); only the tokens after the match are prefilled. Entries are kept per scope (the
API uses the account), never shared across scopes, bounded in bytes, least recently used out
first, and used only from the scheduler's thread. They are found through chained hashes of
their `MIN_PREFIX`-token blocks (vLLM's block hashes), so a lookup or store costs a dict lookup
per block however many entries are kept; within the last, partial block the most recent
candidates are compared, so a match may fall short of the longest by less than a block.
Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np

from api.engine.runtime.mapped import unwritten

# Shorter matches are not worth a lookup's copy: a chat template's fixed head is about that long.
# Also the block size of the index, so every stored entry has at least one whole block.
MIN_PREFIX = 16
# Entries this large get a mapping of their own (`_stacked`): at most one per 256 KB of budget.
MAPPED_ENTRY_BYTES = 256 << 10
# Entries sharing a prompt's whole blocks compared token by token for the last, partial block.
_CANDIDATES = 8


@dataclass(frozen=True)
class _Entry:
    scope: str
    tokens: np.ndarray  # int64 [n]
    kv: np.ndarray  # [past inputs, kv_heads, n, head_dim], every layer's in one array
    blocks: list[int]  # chained hashes of its whole blocks of tokens


@dataclass(frozen=True)
class PrefixHit:
    """The first `tokens` positions of a prompt, already computed: views into an entry."""

    tokens: int
    kv: list[np.ndarray]  # [kv_heads, tokens, head_dim] each


class PrefixCache:
    """Stored keys/values of token sequences, looked up by longest common prefix."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next_id = 0
        # (scope, chained hash of blocks 0..i) -> entries holding those blocks (oldest first)
        self._sharing: dict[tuple[str, int], dict[int, None]] = {}
        # (scope, chained hash of an entry's last whole block) -> those entries
        self._ending: dict[tuple[str, int], dict[int, None]] = {}

    def lookup(self, scope: str, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest stored prefix of `prompt` in `scope`, leaving at least its last token to
        prefill (its logits give the first generated token)."""
        ids = np.asarray(prompt, np.int64)[:-1]
        best, best_len = None, MIN_PREFIX - 1
        for key in self._deepest_sharing(scope, _block_hashes(ids)):
            length = _common_prefix(self._entries[key].tokens, ids)
            if length > best_len:
                best, best_len = key, length
        if best is None:
            return None
        self._entries.move_to_end(best)
        entry = self._entries[best]
        return PrefixHit(best_len, list(entry.kv[:, :, :best_len]))

    def store(self, scope: str, tokens: Sequence[int], kv: Sequence[np.ndarray]) -> None:
        """Keep a copy of `kv` (positions of `tokens`), unless an entry already covers it;
        entries it covers are dropped."""
        ids = np.asarray(tokens, np.int64)
        size = sum(a.nbytes for a in kv)
        if len(ids) < MIN_PREFIX or size > self.max_bytes:
            return
        blocks = _block_hashes(ids)
        for key in self._deepest_sharing(scope, blocks):
            if _common_prefix(self._entries[key].tokens, ids) == len(ids):
                self._entries.move_to_end(key)
                return
        for block in blocks:  # an entry it covers ends its whole blocks at one of its own
            for key in list(self._ending.get((scope, block), ())):
                entry = self._entries[key]
                if _common_prefix(entry.tokens, ids) == len(entry.tokens):
                    self._remove(key)
        while self._entries and self.nbytes + size > self.max_bytes:
            self._remove(next(iter(self._entries)))
        key, self._next_id = self._next_id, self._next_id + 1
        self._entries[key] = _Entry(scope, ids, _stacked(kv), blocks)
        for block in blocks:
            self._sharing.setdefault((scope, block), {})[key] = None
        self._ending.setdefault((scope, blocks[-1]), {})[key] = None
        self.nbytes += size

    def __len__(self) -> int:
        return len(self._entries)

    def _deepest_sharing(self, scope: str, blocks: list[int]) -> Iterable[int]:
        """The most recent entries sharing the longest run of these chained blocks, at most
        `_CANDIDATES` of them; none when no entry shares even the first block."""
        found: dict[int, None] = {}
        for block in blocks:
            sharing = self._sharing.get((scope, block))
            if sharing is None:
                break
            found = sharing
        return islice(reversed(found), _CANDIDATES)

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.kv.nbytes
        for block in entry.blocks:
            _discard(self._sharing, (entry.scope, block), key)
        _discard(self._ending, (entry.scope, entry.blocks[-1]), key)


def _discard(index: dict[tuple[str, int], dict[int, None]], at: tuple[str, int], key: int) -> None:
    keys = index[at]
    del keys[key]
    if not keys:
        del index[at]


def _stacked(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """`np.stack(arrays)`, from an anonymous mapping of its own where it is large: unmapped
    when the entry goes, its pages leave the process.

    From malloc they stayed: glibc serves a block below its mmap threshold from the heap and
    raises that threshold to the largest block freed (up to 32 MB), so after the first eviction
    entries landed among short-lived arrays and their pages could not be given back. Serving a
    Qwen2.5-0.5B int4 export, the 256 MB budget cost 331-362 MB of RSS that way, 216-275 MB
    mapped (bench/results/2026-11-27-server-rss-vm.md). Small entries stay on the heap, so a
    large budget of small entries cannot run into the kernel's limit on mappings."""
    shape = (len(arrays), *arrays[0].shape)
    if math.prod(shape) * arrays[0].itemsize < MAPPED_ENTRY_BYTES:
        return np.stack(arrays)
    try:
        out = unwritten(shape, arrays[0].dtype)
    except OSError:  # out of mappings: the heap still works
        return np.stack(arrays)
    np.stack(arrays, out=out)
    return out


def _block_hashes(ids: np.ndarray) -> list[int]:
    """Hashes of `ids`'s whole blocks, each over the one before it: equal hashes at block i
    mean (but for a collision, which the token comparisons catch) equal tokens up to it."""
    hashes, previous = [], 0
    for start in range(0, len(ids) - MIN_PREFIX + 1, MIN_PREFIX):
        previous = hash((previous, ids[start : start + MIN_PREFIX].tobytes()))
        hashes.append(previous)
    return hashes


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
