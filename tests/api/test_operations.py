"""What an operator's platform and monitoring see: health, readiness, metrics, clean logs."""

from __future__ import annotations

import logging

import httpx

from api.logging import RedactSecrets, redact


def test_health_and_ready(server):
    root = server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{root}/ready")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "model:demo": "ok"}


def test_the_optimized_graph_is_kept_where_the_operator_said(start_server, tmp_path):
    start_server(engine_cache_dir=str(tmp_path / "graphs"))
    assert any((tmp_path / "graphs").iterdir()), "a restart would optimize the graph again"


def test_an_empty_engine_cache_dir_keeps_no_graph(start_server, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # where the default would go
    start_server(engine_cache_dir="")
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "onnx-cache").exists()


def test_metrics_count_requests_and_tokens(server, client):
    completion = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    assert 'tokenshop_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    completion_line = 'tokenshop_tokens_total{direction="completion",model="demo"}'
    assert f"{completion_line} {float(completion.usage.completion_tokens)}" in text
    assert "tokenshop_time_to_first_token_seconds_count" in text
    assert 'tokenshop_active_sequences{model="demo"}' in text
    drafted, accepted = (
        float(text.split(f'tokenshop_engine_{name}_total{{model="demo"}} ')[1].split()[0])
        for name in ("draft_tokens", "accepted_draft_tokens")
    )
    assert 0 <= accepted <= drafted  # prompt-lookup drafts, verified and accepted


def test_every_response_carries_a_request_id(server):
    response = httpx.get(f"{server.base_url}/models", headers={"x-request-id": "trace-123"})
    assert response.headers["x-request-id"] == "trace-123"
    assert httpx.get(f"{server.base_url}/models").headers["x-request-id"].startswith("req_")


def test_keys_and_tokens_are_redacted_from_log_records(api_key, caplog):
    logger = logging.getLogger("tokenshop.test")
    logger.addFilter(RedactSecrets())
    try:
        with caplog.at_level(logging.INFO):
            logger.info('127.0.0.1 - "GET /v1/key?api_key=%s HTTP/1.1" 200', api_key)
            logger.info("Authorization: Bearer %s", api_key)
    finally:
        logger.filters.clear()
    assert api_key not in caplog.text
    assert "sk-tks-[redacted]" in caplog.text
    assert redact("https://x/bot123456:AAE-secret_token/getMe") == "https://x/bot[redacted]/getMe"
