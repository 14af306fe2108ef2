"""Which prompt tokens to prefill in one scheduler iteration (chunked prefill).

Prefill is compute-bound: a 2,000-token prompt on a 0.5B model takes many seconds on a few cores,
and a decode step cannot run while it does. So every iteration spends at most
`max_prefill_tokens` prompt tokens, then runs the decode step of the running streams: a long
prompt is prefilled a chunk per iteration (its KV cache carried between chunks), and running
streams get a token after each chunk. Short prompts that fit the budget whole are prefilled
together in one call, left-padded to the longest of their group. Requests are served in arrival
order. A prompt is part-way through when it is the one being chunked, or when it started from a
cached prefix (`prefix_cache.py`); either is prefilled on its own, from where it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from api.engine.runtime.sequence import Sequence

if TYPE_CHECKING:
    from api.engine.runtime.padded_batch import KVCache

# Which whole prompts may share one prefill call: any (the graph masks left padding), only those
# of equal length, or none (a fused-attention graph prefills one prompt per call).
Grouping = Literal["padded", "equal", "single"]


@dataclass(eq=False)
class Prefill:
    """An admitted request whose prompt is not fully in the KV cache yet."""

    seq: Sequence
    done: int = 0  # prompt tokens already prefilled
    cache: KVCache | None = None  # their keys/values (batch of one), once done > 0

    @property
    def remaining(self) -> int:
        return self.seq.prompt_len - self.done

    def next_tokens(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Input ids and positions, each [1, count], of the next `count` prompt tokens."""
        end = self.done + count
        ids = np.array([self.seq.request.prompt_token_ids[self.done : end]], np.int64)
        return ids, np.arange(self.done, end, dtype=np.int64)[None]


@dataclass(frozen=True)
class PrefillCall:
    """One graph call: whole prompts of `group` (left-padded to `tokens`), or, for a single
    request, its next `tokens` prompt tokens."""

    group: list[Prefill]
    tokens: int

    @property
    def completes(self) -> bool:
        """Whether the call reaches the end of its prompts (then their first token is due)."""
        return self.tokens >= self.group[0].remaining


def plan_prefill(pending: list[Prefill], budget: int, *, grouping: Grouping) -> list[PrefillCall]:
    """The prefill calls of one iteration, in arrival order, within `budget` padded tokens."""
    calls: list[PrefillCall] = []
    index = 0
    while index < len(pending) and budget > 0:
        head = pending[index]
        if head.done or head.remaining > budget:
            tokens = min(budget, head.remaining)
            calls.append(PrefillCall([head], tokens))
            budget -= tokens
            index += 1
            continue
        group, width = [head], head.remaining
        for candidate in pending[index + 1 :]:
            padded = max(width, candidate.remaining)
            allowed = grouping == "padded" or (grouping == "equal" and candidate.remaining == width)
            if padded * (len(group) + 1) > budget or not allowed or candidate.done:
                break
            group.append(candidate)
            width = padded
        calls.append(PrefillCall(group, width))
        budget -= width * len(group)
        index += len(group)
    return calls
