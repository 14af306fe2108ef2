"""Prometheus metrics, in a registry of the app's own (several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
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
        self.registry.register(_UpstreamCollector(engines))


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
        path_info = GaugeMetricFamily(
            "tokenshop_engine_path_info",
            "How each model is served (always 1): its graph edits, kernels and weights.",
            labels=["model", "ops", "isa", "weights", "graph_edits"],
        )
        drafts = CounterMetricFamily(
            "tokenshop_engine_draft_tokens",
            "Tokens drafted by prompt lookup and verified (speculative decoding).",
            labels=["model"],
        )
        accepted = CounterMetricFamily(
            "tokenshop_engine_accepted_draft_tokens",
            "Drafted tokens that matched what the model generated.",
            labels=["model"],
        )
        fallbacks = GaugeMetricFamily(
            "tokenshop_engine_fallbacks",
            "Ways a model's serving path falls short of the optimized one (0: none).",
            labels=["model"],
        )
        for name, engine in self.engines.items():
            stats = engine.stats()
            active.add_metric([name], stats.active_sequences)
            queued.add_metric([name], stats.queued_sequences)
            batch.add_metric([name], stats.last_batch_size)
            drafts.add_metric([name], stats.draft_tokens)
            accepted.add_metric([name], stats.accepted_draft_tokens)
            path = engine.serving_path()
            if path is not None:
                edits = ",".join(path.graph_edits)
                labels = [name, path.ops, path.isa or "", path.weights, edits]
                path_info.add_metric(labels, 1)
                fallbacks.add_metric([name], len(path.fallbacks))
        yield from (active, queued, batch, path_info, fallbacks, drafts, accepted)


class _UpstreamCollector(Collector):
    """Each upstream server of each model, labelled by its URL (which never holds a key)."""

    def __init__(self, engines: Mapping[str, EngineClient]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "backend"]
        up = GaugeMetricFamily(
            "tokenshop_upstream_up", "1 if the upstream is healthy.", labels=labels
        )
        in_flight = GaugeMetricFamily(
            "tokenshop_upstream_in_flight", "Requests in flight to the upstream.", labels=labels
        )
        requests = CounterMetricFamily(
            "tokenshop_upstream_requests", "Requests sent to the upstream.", labels=labels
        )
        failovers = CounterMetricFamily(
            "tokenshop_upstream_failovers",
            "Requests that left the upstream for another before their first token.",
            labels=labels,
        )
        errors = CounterMetricFamily(
            "tokenshop_upstream_errors",
            "Upstream failures by kind: connect, status (5xx, 429), timeout, cut (mid-answer).",
            labels=[*labels, "kind"],
        )
        ttft = HistogramMetricFamily(
            "tokenshop_upstream_time_to_first_token_seconds",
            "From sending to the upstream to its first token.",
            labels=labels,
        )
        for name, engine in self.engines.items():
            for backend in engine.backends():
                key = [name, backend.url]
                up.add_metric(key, 1 if backend.up else 0)
                in_flight.add_metric(key, backend.in_flight)
                requests.add_metric(key, backend.requests)
                failovers.add_metric(key, backend.failovers)
                for kind, count in backend.errors.items():
                    errors.add_metric([*key, kind], count)
                buckets = [
                    ("+Inf" if bound == float("inf") else str(bound), count)
                    for bound, count in backend.ttft_buckets
                ]
                ttft.add_metric(key, buckets, backend.ttft_sum)
        yield from (up, in_flight, requests, failovers, errors, ttft)
