"""Anthropic's Messages API (`/v1/messages`) through the official `anthropic` SDK, on the demo
model, against the real server.

The demo model has random weights: its text is noise, so what these tests check is what a
client relies on: the message and its blocks, the stream's events and their order, stop
reasons, usage against the ledger, tool calls made valid by constrained decoding, and errors
arriving as the SDK's own exception classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from sqlalchemy import Engine
from sqlmodel import Session, select

from billing.models import Hold, LedgerEntry
from tests.api.conftest import DEMO_MODEL, LiveServer
from tests.api.test_fuzzing import EXAMPLES, schema  # noqa: F401 (a fixture)
from tests.api.test_responses import WEATHER_PARAMETERS, BreakingEngine
from tests.faults import GatedEngine, demo_engine

HELLO = [{"role": "user", "content": "Hello there, how are the tokens today?"}]
WEATHER_SCHEMA = WEATHER_PARAMETERS  # the Responses tests' tool, in Anthropic's shape below
WEATHER = {
    "name": "get_weather",
    "description": "The forecast for a city.",
    "input_schema": WEATHER_SCHEMA,
}


@pytest.fixture
def make_anthropic() -> Iterator[Callable[..., anthropic.Anthropic]]:
    """`make_anthropic(server, key, **options)`: an SDK client, closed when the test ends."""
    clients: list[anthropic.Anthropic] = []

    def make(server: LiveServer, key: str | None = None, **options: Any) -> anthropic.Anthropic:
        options.setdefault("max_retries", 0)
        base = server.base_url.removesuffix("/v1")
        client = anthropic.Anthropic(base_url=base, api_key=key, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def claude(server: LiveServer, api_key: str, make_anthropic) -> anthropic.Anthropic:
    return make_anthropic(server, api_key)


def ledger(engine: Engine, message_id: str) -> LedgerEntry:
    """The usage entry of a message (its hold is the chat request it became)."""
    request_id = "chatcmpl-" + message_id.removeprefix("msg_")
    with Session(engine) as session:
        return session.exec(select(LedgerEntry).where(LedgerEntry.request_id == request_id)).one()


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_a_message_from_string_and_block_content_with_system_blocks(claude, engine):
    message = claude.messages.create(
        model="demo",
        max_tokens=12,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12;"},
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
            {"role": "user", "content": [{"type": "text", "text": "How are the tokens?"}]},
        ],
        metadata={"user_id": "someone"},
        output_config={"effort": "low"},
        extra_body={"temperature": 0, "context_management": {"edits": []}},
    )
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == "demo"
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    usage = message.usage
    entry = ledger(engine, message.id)
    assert usage.input_tokens + usage.cache_read_input_tokens == entry.prompt_tokens
    assert usage.cache_creation_input_tokens == 0
    assert usage.output_tokens == entry.completion_tokens <= 12


def test_max_tokens_ends_with_max_tokens_and_a_stop_sequence_with_stop_sequence(claude):
    # the SDK no longer sends sampling settings; the API still takes them
    ask = {"model": "demo", "messages": HELLO, "extra_body": {"temperature": 0}}
    cut = claude.messages.create(max_tokens=16, **ask)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 16
    text = text_of(cut)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = claude.messages.create(max_tokens=16, stop_sequences=["\x07never", stop], **ask)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert text_of(stopped) == text[: text.index(stop)]


def test_top_k_of_one_samples_the_greedy_answer(claude):
    ask = {"model": "demo", "max_tokens": 16, "messages": HELLO}
    greedy = claude.messages.create(**ask, extra_body={"temperature": 0})
    sampled = claude.messages.create(**ask, extra_body={"temperature": 1, "top_k": 1})
    assert text_of(sampled) == text_of(greedy)


def test_a_max_tokens_past_the_context_is_cut_to_the_room_not_refused(claude):
    # stopped early by any of the demo's common characters: the point is the 200, not a long wait
    message = claude.messages.create(
        model="demo",
        max_tokens=200_000,  # past the demo's 131,072
        messages=HELLO,
        stop_sequences=["a", "e", " ", "."],
        timeout=60,
    )
    assert message.stop_reason in ("stop_sequence", "end_turn")


def test_a_stream_sends_anthropics_events_in_order_and_bills_what_it_reports(claude, engine):
    with claude.messages.stream(model="demo", max_tokens=24, messages=HELLO) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events if event.type != "ping"]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert deltas and "".join(deltas) == text_of(final)
    start = events[0].message
    assert start.content == [] and start.stop_reason is None
    assert start.usage.input_tokens + start.usage.cache_read_input_tokens > 0
    entry = ledger(engine, final.id)
    usage = final.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == entry.prompt_tokens
    assert usage.output_tokens == entry.completion_tokens
    assert -entry.amount == entry.prompt_tokens + entry.completion_tokens


def test_a_stream_that_fails_midway_ends_with_an_error_event_and_bills_what_it_sent(
    start_server, api_key, make_anthropic, engine
):
    server = start_server(engines={"demo": BreakingEngine(demo_engine(str(DEMO_MODEL)), 4)})
    events = []
    claude = make_anthropic(server, api_key)
    with (
        pytest.raises(anthropic.APIStatusError) as failed,  # the SDK's answer to `error`
        claude.messages.stream(model="demo", max_tokens=32, messages=HELLO) as stream,
    ):
        events.extend(stream)
    assert failed.value.body["error"]["type"] == "api_error"
    assert "not available" in failed.value.body["error"]["message"]
    assert events[0].type == "message_start"
    assert "message_stop" not in [event.type for event in events]
    with Session(engine) as session:
        [entry] = session.exec(select(LedgerEntry).where(LedgerEntry.kind == "usage")).all()
        assert entry.completion_tokens == 4
        assert session.exec(select(Hold).where(Hold.state == "held")).all() == []


def test_tool_choice_any_gives_a_tool_use_whose_input_fits_its_schema_and_a_result_is_answered(
    claude,
):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = claude.messages.create(
        model="demo",
        max_tokens=400,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},  # one call, then done
    )
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 degrees."}
    answer = claude.messages.create(
        model="demo",
        max_tokens=8,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            *ask,
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {"role": "user", "content": [result, {"type": "text", "text": "And tomorrow?"}]},
        ],
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert all(block.type == "text" for block in answer.content)


def test_a_streamed_tool_use_arrives_as_input_json_deltas(claude):
    with claude.messages.stream(
        model="demo",
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    [call] = final.content
    assert call.type == "tool_use" and final.stop_reason == "tool_use"
    assert partial and call.input == stream_input(partial)
    jsonschema.validate(call.input, WEATHER_SCHEMA)


def stream_input(partial: list[str]) -> Any:
    import json

    return json.loads("".join(partial))


def test_count_tokens_is_the_same_requests_input(claude):
    ask: dict[str, Any] = {
        "model": "demo",
        "system": "Answer in one word.",
        "messages": [{"role": "user", "content": "Name a colour, please."}],
        "tools": [WEATHER],
    }
    counted = claude.messages.count_tokens(**ask)
    message = claude.messages.create(max_tokens=1, **ask)
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens > 20


def test_the_key_works_as_x_api_key_and_as_bearer(server, api_key, make_anthropic):
    for client in (make_anthropic(server, api_key), make_anthropic(server, auth_token=api_key)):
        assert client.messages.create(model="demo", max_tokens=1, messages=HELLO).content


def test_models_are_listed_in_anthropics_shape(claude):
    [model] = claude.models.list().data
    assert (model.type, model.id, model.display_name) == ("model", "demo", "demo")
    assert model.created_at.year >= 2026
    assert claude.models.retrieve("demo").id == "demo"
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("nope")


def test_errors_are_anthropics_with_a_request_id(server, api_key, make_anthropic):
    bad = make_anthropic(server, "sk-tks-" + "0" * 40)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        bad.messages.create(model="demo", max_tokens=1, messages=HELLO)
    assert refused.value.body["error"]["type"] == "authentication_error"
    assert refused.value.request_id and refused.value.request_id.startswith("req_")
    assert "sk-tks-" not in refused.value.message

    claude = make_anthropic(server, api_key)
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="no-such-model", max_tokens=1, messages=HELLO)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as invalid:
        claude.messages.create(model="demo", max_tokens=0, messages=HELLO)
    assert "max_tokens" in invalid.value.message
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(anthropic.BadRequestError) as media:
        claude.messages.create(
            model="demo", max_tokens=1, messages=[{"role": "user", "content": [image]}]
        )
    assert "messages[0].content[0]" in media.value.message

    raw = httpx.post(
        f"{server.base_url}/messages",
        headers={"x-api-key": api_key, "anthropic-version": "2023-06-01"},
        json={"model": "demo", "messages": HELLO},  # no max_tokens
    )
    assert raw.status_code == 400 and raw.headers["request-id"]
    assert raw.json()["type"] == "error"
    assert raw.json()["error"] == {
        "type": "invalid_request_error",
        "message": raw.json()["error"]["message"],
    }
    assert "max_tokens" in raw.json()["error"]["message"]


def test_a_balance_too_low_is_a_400_the_sdk_does_not_retry(server, make_funded_key, make_anthropic):
    attempts: list[httpx2.Request] = []
    client = make_anthropic(
        server,
        make_funded_key(3),
        max_retries=3,
        http_client=httpx2.Client(event_hooks={"request": [attempts.append]}),  # the SDK's httpx
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="demo", max_tokens=10, messages=HELLO)
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "balance is too low" in refused.value.message and "3 remain" in refused.value.message
    assert len(attempts) == 1


def test_a_key_over_its_concurrency_is_a_rate_limit_error(start_server, api_key, make_anthropic):
    held = GatedEngine(demo_engine(str(DEMO_MODEL)), let_through=1)
    server = start_server(engines={"demo": held}, max_concurrent_per_key=1)
    client = make_anthropic(server, api_key)
    with client.messages.stream(model="demo", max_tokens=20, messages=HELLO) as stream:
        next(iter(stream))  # the first request is generating
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(model="demo", max_tokens=1, messages=HELLO)
        held.gate.set()
        assert stream.get_final_message().usage.output_tokens > 0
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    assert limited.value.response.headers["retry-after"] == "1"


def test_a_full_queue_is_529_overloaded(start_server, api_key, make_anthropic):
    server = start_server(max_queued=0, max_active_sequences=1)
    client = make_anthropic(server, api_key)
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        client.messages.create(model="demo", max_tokens=1, messages=HELLO)
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"


def test_a_body_over_the_limit_is_request_too_large(start_server, api_key, make_anthropic):
    server = start_server(max_request_bytes=10_000)
    client = make_anthropic(server, api_key)
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(
            model="demo", max_tokens=1, messages=[{"role": "user", "content": "x" * 20_000}]
        )
    assert refused.value.status_code == 413
    assert refused.value.body["error"]["type"] == "request_too_large"


@pytest.mark.slow  # hundreds of generated requests per endpoint
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzzed_messages_never_get_a_5xx_and_errors_are_anthropics(
    schema,  # noqa: F811
    server,
    api_key,
    path,
    mode,
):
    operation = schema[path]["POST"]
    base = server.base_url.removesuffix("/v1")
    keys = st.sampled_from([{"x-api-key": api_key}, {"Authorization": f"Bearer {api_key}"}, {}])

    @given(case=operation.as_strategy(generation_mode=mode), headers=keys)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case, headers: dict[str, str]) -> None:
        if isinstance(case.body, dict) and isinstance(case.body.get("max_tokens"), int):
            case.body["max_tokens"] = min(case.body["max_tokens"], 4)  # short: parsing is the point
        response = case.call(base_url=base, headers=headers, timeout=30)
        assert response.status_code < 500, response.text
        [request_id] = response.headers["request-id"]  # schemathesis: each header's values
        if response.status_code >= 400:
            body = response.json()
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
            assert body["request_id"] == request_id

    fuzz()
    assert server.services.engines["demo"].stats().active_sequences == 0
