"""Per-key concurrency: one key cannot take the whole batch from everybody else."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from api.errors import rate_limited


@dataclass
class ConcurrencyLimiter:
    """Counts requests in flight per account in this process (each web process has its own)."""

    limit: int
    _active: Counter[int] = field(default_factory=Counter)

    def acquire(self, account_id: int) -> None:
        if self._active[account_id] >= self.limit:
            raise rate_limited(self.limit)
        self._active[account_id] += 1

    def release(self, account_id: int) -> None:
        self._active[account_id] -= 1
        if self._active[account_id] <= 0:
            del self._active[account_id]
