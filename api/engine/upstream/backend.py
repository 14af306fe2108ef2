"""One upstream server of a model: its health, its load and its counters."""

from __future__ import annotations

import bisect
from collections import Counter

from api.engine.protocol import BackendStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ERROR_KINDS = ("connect", "status", "timeout", "cut")


class Backend:
    """A base URL (`http://gpu-a:8000/v1`); `up` is what the last health check or request saw."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.up = True  # optimistic until a check or a request says otherwise
        self.in_flight = 0
        self.requests = 0
        self.failovers = 0
        self.errors: Counter[str] = Counter({kind: 0 for kind in ERROR_KINDS})
        self._ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self._ttft_sum = 0.0

    def observe_ttft(self, seconds: float) -> None:
        self._ttft_counts[bisect.bisect_left(TTFT_BUCKETS, seconds)] += 1
        self._ttft_sum += seconds

    def stats(self) -> BackendStats:
        cumulative, buckets = 0, []
        for bound, count in zip((*TTFT_BUCKETS, float("inf")), self._ttft_counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        return BackendStats(
            url=self.url,
            up=self.up,
            in_flight=self.in_flight,
            requests=self.requests,
            failovers=self.failovers,
            errors=dict(self.errors),
            ttft_buckets=buckets,
            ttft_sum=self._ttft_sum,
            ttft_count=cumulative,
        )
