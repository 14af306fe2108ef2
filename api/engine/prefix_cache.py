"""Keys and values of finished conversations, kept so the next turn skips prefilling them.

A chat client sends the whole conversation every turn, so turn k's prompt starts with turn k-1's
prompt and reply. On a CPU, prefill is the cost a user waits for (a 512-token prompt is 1-3 s
on 2 cores), so each prompt stores its keys/values once it is complete (requests that arrive
meanwhile may share its system prompt), each sequence that leaves the batch stores those of every
position it computed (replacing its prompt's entry), and a new prompt starts from the longest
stored prefix it shares (llama.cpp's prompt cache and vLLM's automatic prefix caching do the
same; this one matches whole token prefixes, not blocks). Only the tokens after the match are
prefilled.

Entries are kept per scope (the API uses the account): a prefix found in another account's
conversation would make time to first token tell one customer what another one sent. The store
is bounded in bytes and forgets the least recently used entry first. It is only used from the
scheduler's thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Shorter matches are not worth a lookup's copy: a chat template's fixed head is about that long.
MIN_PREFIX = 16


@dataclass(frozen=True)
class _Entry:
    scope: str
    tokens: np.ndarray  # int64 [n]
    kv: np.ndarray  # [past inputs, kv_heads, n, head_dim], every layer's in one array


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

    def lookup(self, scope: str, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest stored prefix of `prompt` in `scope`, leaving at least its last token to
        prefill (its logits give the first generated token)."""
        ids = np.asarray(prompt, np.int64)
        best, best_len = None, MIN_PREFIX - 1
        for key, entry in self._entries.items():
            if entry.scope == scope:
                length = _common_prefix(entry.tokens, ids[:-1])
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
        for key, entry in list(self._entries.items()):
            if entry.scope != scope:
                continue
            shared = _common_prefix(entry.tokens, ids)
            if shared == len(ids):
                self._entries.move_to_end(key)
                return
            if shared == len(entry.tokens):
                self._remove(key)
        while self._entries and self.nbytes + size > self.max_bytes:
            self._remove(next(iter(self._entries)))
        self._entries[self._next_id] = _Entry(scope, ids, np.stack(kv))
        self._next_id += 1
        self.nbytes += size

    def __len__(self) -> int:
        return len(self._entries)

    def _remove(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).kv.nbytes


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
