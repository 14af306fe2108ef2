"""An upstream that serves Anthropic's Messages API itself (`messages_api = true`): Messages
requests go to its own `/v1/messages` as the client sent them, and are billed from its usage.

The upstream is a second Tokenshop server on the demo model, a real Messages server nobody
mocked; it keeps its own books on an account of its own (the operator's key there).
"""

from __future__ import annotations

import re
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from sqlmodel import Session, select

from billing.models import LedgerEntry
from tests.api.conftest import LiveServer
from tests.api.test_messages import HELLO, WEATHER, WEATHER_SCHEMA

GREEDY = {"temperature": 0}  # the SDK sends no sampling settings; the API takes them


@pytest.fixture
def peer(start_server, make_funded_key, tmp_path, monkeypatch) -> tuple[LiveServer, LiveServer]:
    """(the upstream, the front server whose model `peer` it serves)."""
    upstream = start_server()
    monkeypatch.setenv("PEER_KEY", make_funded_key())
    models = tmp_path / "models.toml"
    models.write_text(
        "[[model]]\n"
        'name = "peer"\n'
        f'upstreams = ["{upstream.base_url}"]\n'
        'upstream_model = "demo"\n'
        'api_key_env = "PEER_KEY"\n'
        "messages_api = true\n"
    )
    return upstream, start_server(models_file=str(models))


def client(server: LiveServer, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url.removesuffix("/v1"), api_key=key, max_retries=0
    )


def served_messages(server: LiveServer) -> float:
    """How many `/v1/messages` requests `server` answered 200 (its /metrics)."""
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    line = r'^tokenshop_requests_total\{route="/v1/messages",status="200"\} (\S+)$'
    found = re.search(line, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def entry(engine: Any, message_id: str) -> LedgerEntry:
    request_id = "chatcmpl-" + message_id.removeprefix("msg_")
    with Session(engine) as session:
        return session.exec(select(LedgerEntry).where(LedgerEntry.request_id == request_id)).one()


def test_messages_go_to_the_upstreams_own_messages_api_and_are_billed_its_usage(
    peer, api_key, engine
):
    upstream, front = peer
    ask: dict[str, Any] = {"max_tokens": 12, "messages": HELLO, "extra_body": GREEDY}
    with client(front, api_key) as claude:
        before = served_messages(upstream)
        message = claude.messages.create(model="peer", **ask)
        with claude.messages.stream(model="peer", **ask) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert served_messages(upstream) == before + 2  # its Messages API, not its chat
    with client(upstream, api_key) as direct:
        own = direct.messages.create(model="demo", **ask)
    text = own.content[0].text
    assert message.content[0].text == streamed == text
    assert message.stop_reason == final.stop_reason == own.stop_reason
    for answer in (message, final):
        usage, booked = answer.usage, entry(engine, answer.id)
        prompt = own.usage.input_tokens + own.usage.cache_read_input_tokens
        assert (booked.prompt_tokens, booked.completion_tokens) == (prompt, own.usage.output_tokens)
        assert usage.input_tokens + usage.cache_read_input_tokens == prompt


def test_a_tool_use_comes_back_from_the_upstream_as_a_tool_use(peer, api_key):
    _, front = peer
    with client(front, api_key) as claude:
        message = claude.messages.create(
            model="peer",
            max_tokens=300,
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[WEATHER],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        )
        with claude.messages.stream(
            model="peer",
            max_tokens=300,
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
        ) as stream:
            final = stream.get_final_message()
    for answer in (message, final):
        assert answer.stop_reason == "tool_use"
        [call] = [block for block in answer.content if block.type == "tool_use"]
        assert call.id.startswith("toolu_") and call.name == "get_weather"
        jsonschema.validate(call.input, WEATHER_SCHEMA)
