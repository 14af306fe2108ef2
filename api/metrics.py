"""Prometheus metrics, in a registry of the app's own (several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.engine.protocol import EngineClient


class Metrics:
    def __init__(self, engines: Mapping[str, EngineClient]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tokenshop_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "tokenshop_tokens",
            "Tokens processed, by model and direction (prompt or completion).",
            ["model", "direction"],
            registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "tokenshop_time_to_first_token_seconds",
            "From request accepted to first generated token.",
            ["model"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.tokens_per_second = Histogram(
            "tokenshop_tokens_per_second",
            "Decode speed of each finished request.",
            ["model"],
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=self.registry,
        )
        self.registry.register(_EngineCollector(engines))


class _EngineCollector(Collector):
    """Reads the schedulers' live numbers at scrape time."""

    def __init__(self, engines: Mapping[str, EngineClient]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "tokenshop_active_sequences", "Sequences in the running batch.", labels=["model"]
        )
        queued = GaugeMetricFamily(
            "tokenshop_queued_sequences", "Sequences waiting to join.", labels=["model"]
        )
        batch = GaugeMetricFamily(
            "tokenshop_batch_size", "Sequences in the last decode step.", labels=["model"]
        )
        for name, engine in self.engines.items():
            stats = engine.stats()
            active.add_metric([name], stats.active_sequences)
            queued.add_metric([name], stats.queued_sequences)
            batch.add_metric([name], stats.last_batch_size)
        yield from (active, queued, batch)
