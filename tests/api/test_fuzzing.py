"""Property-based fuzzing from the app's own OpenAPI schema (schemathesis): requests that follow
the schema and requests that break it, with and without a key, never get a 5xx, and every 4xx
is in OpenAI's error shape."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

EXAMPLES = 100  # per operation and mode: the whole file runs in well under a minute


@pytest.fixture
def schema(server):
    root = server.base_url.removesuffix("/v1")
    return schemathesis.openapi.from_url(f"{root}/openapi.json")


def _check(response: httpx.Response | object) -> None:
    status = response.status_code  # type: ignore[attr-defined]
    text = response.text  # type: ignore[attr-defined]
    assert status < 500, text
    assert status != 422, text
    assert "Traceback" not in text
    if status >= 400:
        body = response.json()  # type: ignore[attr-defined]
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert isinstance(body["error"]["message"], str)


@pytest.mark.slow  # hundreds of generated requests per endpoint: a minute each on 2 cores
@pytest.mark.parametrize(
    ("path", "method", "mode"),
    [
        ("/v1/chat/completions", "POST", GenerationMode.POSITIVE),
        ("/v1/chat/completions", "POST", GenerationMode.NEGATIVE),
        ("/v1/responses", "POST", GenerationMode.POSITIVE),
        ("/v1/responses", "POST", GenerationMode.NEGATIVE),
        ("/v1/responses/{response_id}", "GET", GenerationMode.POSITIVE),
        ("/v1/responses/{response_id}", "DELETE", GenerationMode.POSITIVE),
        ("/v1/models/{model_id}", "GET", GenerationMode.POSITIVE),  # any string is a valid id
        ("/v1/models", "GET", GenerationMode.POSITIVE),
        ("/v1/key", "GET", GenerationMode.POSITIVE),
    ],
)
def test_fuzzed_requests_never_get_a_5xx_and_errors_look_like_openais(
    schema, server, api_key, path, method, mode
):
    operation = schema[path][method]
    base = server.base_url.removesuffix("/v1")
    keyed = st.sampled_from([f"Bearer {api_key}", "Bearer sk-proj-abc", ""])

    @given(case=operation.as_strategy(generation_mode=mode), authorization=keyed)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case, authorization: str) -> None:
        if isinstance(case.body, dict) and path == "/v1/chat/completions":
            # keep generations short: the point is the parsing and the refusals
            case.body["max_tokens"] = case.body.get("max_tokens", 2)
            if isinstance(case.body["max_tokens"], int) and case.body["max_tokens"] > 4:
                case.body["max_tokens"] = 4
        headers = {"Authorization": authorization} if authorization else {}
        _check(case.call(base_url=base, headers=headers, timeout=30))

    fuzz()
    assert httpx.get(f"{base}/ready").status_code == 200
    stats = server.services.engines["demo"].stats()
    assert stats.active_sequences == 0
