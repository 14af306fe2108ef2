"""Prometheus metrics, in a registry of the app's own (several apps can live in one process).
`deploy/grafana/tokenshop.json` draws them and `deploy/prometheus/alerts.yml` alerts on them
(docs/deploying.md); tests/api/test_dashboards.py keeps those to metrics that exist."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC

from anyio import to_thread
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from api.engine.embedding.protocol import EmbeddingClient
from api.engine.protocol import EngineClient
from billing import reports
from billing.db import reading, session_scope
from billing.models import utcnow

logger = logging.getLogger("tokenshop.api")


class Metrics:
    def __init__(
        self,
        engines: Mapping[str, EngineClient],
        embedders: Mapping[str, EmbeddingClient] | None = None,
    ) -> None:
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
        self.request_seconds = Histogram(
            "tokenshop_request_duration_seconds",
            "From a request's arrival to its response's last byte (a stream's end), by route.",
            ["route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.books = _BooksCollector()
        embedders = {} if embedders is None else embedders
        self.registry.register(_EngineCollector(engines))
        self.registry.register(_EmbeddingCollector(embedders))
        self.registry.register(_UpstreamCollector(engines, embedders))
        self.registry.register(self.books)

    async def read_books(self, db: Engine) -> None:
        """Read the books' figures for this scrape (one short read; every replica reads the
        same shared figures, so dashboards take their max). A database out of reach leaves
        them out of this scrape rather than failing it."""

        def read() -> _BooksFigures:
            with session_scope(reading(db)) as session:
                holds = reports.open_holds(session=session)
                entries = reports.ledger_entries(session=session)
            placed = holds.oldest
            if placed is not None and placed.tzinfo is None:  # SQLite gives naive UTC back
                placed = placed.replace(tzinfo=UTC)
            oldest = (utcnow() - placed).total_seconds() if placed else 0.0
            return _BooksFigures(holds.holds, holds.tokens, max(oldest, 0.0), entries)

        try:
            self.books.figures = await to_thread.run_sync(read)
        except Exception as error:
            logger.warning("metrics: could not read the books: %s", type(error).__name__)
            self.books.figures = None


@dataclass(frozen=True)
class _BooksFigures:
    open_holds: int
    held_tokens: int
    oldest_hold_seconds: float
    ledger_entries: int


class _BooksCollector(Collector):
    """Open holds and ledger writes, as the database has them at the last `read_books`."""

    def __init__(self) -> None:
        self.figures: _BooksFigures | None = None

    def collect(self) -> Iterator[Metric]:
        figures = self.figures
        if figures is None:
            return
        yield GaugeMetricFamily(
            "tokenshop_open_holds",
            "Holds of requests in flight, every replica's.",
            figures.open_holds,
        )
        yield GaugeMetricFamily(
            "tokenshop_held_tokens", "Tokens reserved by open holds.", figures.held_tokens
        )
        yield GaugeMetricFamily(
            "tokenshop_oldest_open_hold_seconds",
            "Age of the oldest open hold (past the hold TTL: the sweeper is not resolving them).",
            figures.oldest_hold_seconds,
        )
        yield CounterMetricFamily(
            "tokenshop_ledger_entries",
            "Ledger entries ever written (purchases, grants, usage, refunds).",
            figures.ledger_entries,
        )


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


class _EmbeddingCollector(Collector):
    """Each embedding model's batches: what waits, and what ran (padding apart, so a dashboard
    shows the share of the work that was padding; an upstream's batches are its requests)."""

    def __init__(self, embedders: Mapping[str, EmbeddingClient]) -> None:
        self.embedders = embedders

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            "tokenshop_embedding_queued_inputs", "Inputs waiting for a batch.", labels=["model"]
        )
        batches = CounterMetricFamily(
            "tokenshop_embedding_batches", "Embedding batches run.", labels=["model"]
        )
        inputs = CounterMetricFamily(
            "tokenshop_embedding_inputs", "Inputs embedded.", labels=["model"]
        )
        tokens = CounterMetricFamily(
            "tokenshop_embedding_tokens", "Tokens embedded, padding excluded.", labels=["model"]
        )
        padded = CounterMetricFamily(
            "tokenshop_embedding_padded_tokens",
            "Tokens the model ran, padding included.",
            labels=["model"],
        )
        for name, embedder in self.embedders.items():
            stats = embedder.stats()
            queued.add_metric([name], stats.queued_inputs)
            batches.add_metric([name], stats.batches)
            inputs.add_metric([name], stats.inputs)
            tokens.add_metric([name], stats.tokens)
            padded.add_metric([name], stats.padded_tokens)
        yield from (queued, batches, inputs, tokens, padded)


class _UpstreamCollector(Collector):
    """Each upstream server of each model, labelled by its URL (which never holds a key)."""

    def __init__(
        self, engines: Mapping[str, EngineClient], embedders: Mapping[str, EmbeddingClient]
    ) -> None:
        self.engines = engines
        self.embedders = embedders

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
        upstreams = {name: engine.backends() for name, engine in self.engines.items()}
        upstreams |= {name: embedder.backends() for name, embedder in self.embedders.items()}
        for name, backends in upstreams.items():
            for backend in backends:
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
