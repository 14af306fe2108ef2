"""The Grafana dashboard and the Prometheus alert rules in deploy/ query only metrics that
/metrics exposes once the service has served: a local model, an embedding model, an upstream
model with one server up and one refusing connections, and a scrape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import DEMO_MODEL, free_port
from tests.api.upstreams import FakeUpstream, models_toml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tokenshop.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
HELLO = [{"role": "user", "content": "hello there"}]
# a name right before a label matcher or a range: a series selector, i.e. a metric
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(?=\{|\[)")
_METRIC = re.compile(r"\btokenshop_[a-z0-9_]+\b")


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    variables = dashboard["templating"]["list"]
    queries += [v["definition"] for v in variables if v["type"] == "query"]
    return queries


def alert_queries() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def metrics_in(query: str) -> set[str]:
    """The metric names a PromQL query reads (label names inside `{}` left aside)."""
    without_matchers = re.sub(r"\{[^}]*\}", "{}", query)
    selectors = {name for name in _SELECTOR.findall(without_matchers)}
    return selectors | set(_METRIC.findall(without_matchers))


def exposed(text: str) -> set[str]:
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


@pytest.fixture
def upstream():
    server = FakeUpstream().wait_ready()
    yield server
    server.stop()


def test_every_metric_the_dashboard_and_alerts_query_is_exposed(
    start_server, tmp_path, upstream, api_key
):
    refused = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: connect errors, down
    models = tmp_path / "models.toml"
    models.write_text(
        f'[[model]]\nname = "demo"\npath = "{DEMO_MODEL}"\n\n'
        f'[[model]]\nname = "embed"\npath = "{ROOT / "models" / "demo-embed"}"\n\n'
        + models_toml("big", [refused, upstream.base_url], upstream_model="fake")
    )
    server = start_server(models_file=str(models), upstream_health_seconds=3600)
    with openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0) as client:
        for model in ("demo", "big"):
            client.chat.completions.create(model=model, messages=HELLO, max_tokens=4)
        client.embeddings.create(model="embed", input=["hello there", "a second text"])
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    available = exposed(text)

    queries = dashboard_queries() + alert_queries()
    assert len(queries) >= 30
    queried = set().union(*(metrics_in(query) for query in queries))
    assert {"tokenshop_open_holds", "tokenshop_ledger_entries_total"} <= queried
    assert {
        "tokenshop_request_duration_seconds_bucket",
        "tokenshop_upstream_errors_total",
        "tokenshop_time_to_first_token_seconds_bucket",
        "tokenshop_embedding_padded_tokens_total",
    } <= queried
    assert queried - available == set()
