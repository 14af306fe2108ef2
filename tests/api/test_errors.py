"""Every error reaches the `openai` SDK as its matching exception, in OpenAI's body shape."""

from __future__ import annotations

import httpx
import openai
import pytest

from billing import keys
from billing.db import session_scope
from tests.api.conftest import DEMO_MODEL
from tests.factories import make_account, make_key
from tests.faults import GatedEngine, demo_engine

HELLO = [{"role": "user", "content": "hello"}]


def _raw(server, key: str | None, body, **headers) -> httpx.Response:
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if isinstance(body, bytes):
        headers.setdefault("Content-Type", "application/json")
        return httpx.post(f"{server.base_url}/chat/completions", content=body, headers=headers)
    return httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers)


def _assert_openai_shape(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code:
        assert error["code"] == code
    assert "Traceback" not in response.text
    assert response.headers["x-request-id"]
    return error


@pytest.mark.parametrize(
    "key",
    [
        "",
        "not-a-key",
        "sk-tks-" + "A" * 46,  # bad checksum
        keys.derive_key(b"another shop's secret", "salt"),  # well formed, unknown
    ],
)
def test_a_bad_key_is_an_authentication_error(make_client, server, key):
    with pytest.raises(openai.AuthenticationError) as refused:
        make_client(server, key or "x").chat.completions.create(model="demo", messages=HELLO)
    assert refused.value.code == "invalid_api_key"
    if key:
        assert key not in str(refused.value.body)
    missing = _raw(server, None, {"model": "demo", "messages": HELLO})
    _assert_openai_shape(missing, 401, "invalid_api_key")


def test_a_revoked_key_is_refused(make_client, server, session, secret_key, engine):
    account = make_account(session, tokens=10_000)
    key = make_key(session, account, secret_key=secret_key)
    client = make_client(server, key)
    client.chat.completions.create(model="demo", messages=HELLO, max_tokens=1)
    server.services.books._key_cache.clear()  # the 5-second cache, elapsed
    with session_scope(engine) as writer:
        keys.revoke_key(session=writer, account_id=account.id)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=1)


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-9", messages=HELLO)
    assert missing.value.code == "model_not_found"
    assert missing.value.body["param"] == "model"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools.0.function.name"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"temperature": 3}, "temperature"),
        ({"n": 0}, "n"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ],
)
def test_bad_parameters_are_bad_requests_naming_the_parameter(client, extra, param):
    body = {"model": "demo", "messages": HELLO} | extra
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**body)
    assert refused.value.body["param"] == param
    assert refused.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b'"text"', b'{"model": 5, "messages": "x"}', b"\xff\xfe"],
)
def test_malformed_bodies_are_400_never_422(server, api_key, body):
    _assert_openai_shape(_raw(server, api_key, body), 400)


def test_a_body_over_the_limit_is_413(make_client, start_server, api_key):
    server = start_server(max_request_bytes=10_000)
    huge = {"model": "demo", "messages": [{"role": "user", "content": "x" * 20_000}]}
    _assert_openai_shape(_raw(server, api_key, huge), 413, "request_too_large")
    with pytest.raises(openai.APIStatusError) as refused:
        make_client(server, api_key).chat.completions.create(**huge)
    assert refused.value.status_code == 413


def test_a_prompt_past_the_context_window_is_400(client, server):
    window = server.services.engines["demo"].context_length
    long_prompt = [{"role": "user", "content": "word " * (window * 2)}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="demo", messages=long_prompt)
    assert refused.value.code == "context_length_exceeded"


def test_max_tokens_past_the_window_is_refused_and_an_omitted_one_capped(client, server):
    """As OpenAI and vLLM answer: an explicit limit the window cannot hold is the client's
    error; the default limit is cut to what the prompt leaves."""
    window = server.services.engines["demo"].context_length
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=window * 10)
    assert refused.value.body["param"] == "max_tokens"
    assert refused.value.code == "context_length_exceeded"
    completion = client.chat.completions.create(model="demo", messages=HELLO, temperature=0)
    assert completion.usage.total_tokens <= window


def test_an_empty_balance_is_insufficient_quota_and_not_retried(
    make_client, server, make_funded_key
):
    key = make_funded_key(3)
    attempts = []
    client = make_client(
        server,
        key,
        max_retries=3,
        http_client=httpx.Client(event_hooks={"request": [attempts.append]}),
    )
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="demo", messages=HELLO)
    assert refused.value.code == "insufficient_quota"
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert "3 remain" in refused.value.message
    assert len(attempts) == 1


def test_too_many_concurrent_requests_per_key_are_rate_limited(make_client, start_server, api_key):
    """The first request is held after its first token, so it is surely still in flight when
    the second arrives: the demo model could otherwise finish it into the socket's buffers."""
    held = GatedEngine(demo_engine(str(DEMO_MODEL)), let_through=1)
    server = start_server(engines={"demo": held}, max_concurrent_per_key=1)
    client = make_client(server, api_key)
    stream = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=20, stream=True
    )
    next(iter(stream))  # the first request is generating
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=1)
    held.gate.set()
    assert sum(1 for _ in stream) > 0  # the first request is served to its end
    assert limited.value.code == "rate_limit_exceeded"
    assert limited.value.response.headers["retry-after"] == "1"


def test_a_full_queue_is_503(make_client, start_server, api_key):
    server = start_server(max_queued=0, max_active_sequences=1)
    client = make_client(server, api_key)
    with pytest.raises(openai.InternalServerError) as overloaded:
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=1)
    assert overloaded.value.status_code == 503


def test_unknown_routes_are_404_in_openai_shape(server):
    response = httpx.get(f"{server.base_url}/engines")
    _assert_openai_shape(response, 404)
