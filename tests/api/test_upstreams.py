"""A model served by upstream OpenAI-compatible servers, against a fault-injecting upstream of
our own (`tests/fake_upstream.py`, a process of its own): billing exactly as for local models,
failover before the first token, an error event after it, and the books matching every
client's usage to the token."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from sqlmodel import select

from api.engine.protocol import ChatMessage
from api.engine.text.tokenizer import TokenizerWrapper
from api.engine.upstream.wire import prompt_bound
from billing import ledger
from billing.db import session_scope
from billing.locks import lock_accounts
from billing.models import Hold, LedgerEntry
from tests import fake_upstream
from tests.api.conftest import DEMO_MODEL, free_port
from tests.api.upstreams import models_toml
from tests.conftest import TEST_SECRET_KEY
from tests.faults import poll

HELLO = [{"role": "user", "content": "hello there"}]
UPSTREAM_PROMPT = 2 + 4  # the fake upstream's count of HELLO: two words, four a message
WORDS = " ".join(f"w{i}" for i in range(8))


@pytest.fixture
def serve(start_server, tmp_path):
    """`serve(url, ..., price_completion=3, upstream_first_token_seconds=1)`: the API with a
    models file naming model "big" on those upstreams (fields) and settings changed (upstream_*)."""

    def serve(*urls: str, **options: Any):
        settings = {k: v for k, v in options.items() if k.startswith("upstream_")}
        fields = {k: v for k, v in options.items() if k not in settings}
        path = tmp_path / "models.toml"
        path.write_text(models_toml("big", urls, upstream_model="fake", **fields))
        return start_server(models_file=str(path), **settings)

    return serve


def entry(engine, request_id: str) -> LedgerEntry | None:
    with session_scope(engine) as session:
        return session.exec(
            select(LedgerEntry).where(LedgerEntry.request_id == request_id)
        ).one_or_none()


def assert_booked_as_told(engine, request_id: str, usage: Any) -> None:
    """The ledger's usage entry of `request_id` is the usage its client was told, and (at
    these models' price of 1) the tokens charged are their total."""
    booked = entry(engine, request_id)
    told = (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    assert (booked.prompt_tokens, booked.completion_tokens, -booked.amount) == told


def balance(engine) -> ledger.Balance:
    with session_scope(engine) as session:
        return ledger.get_balance(session=session, account_id=1)


def open_holds(engine) -> int:
    with session_scope(engine) as session:
        return len(session.exec(select(Hold).where(Hold.state == "held")).all())


def audit(database_url: str, tmp_path) -> subprocess.CompletedProcess[str]:
    """`tokenshop audit` on the test's database."""
    env = os.environ | {"DATABASE_URL": database_url, "SECRET_KEY": TEST_SECRET_KEY}
    return subprocess.run(
        [sys.executable, "-c", "from tokenshop.cli import main; main()", "audit"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_streamed_answer_is_billed_the_upstreams_usage_at_its_prices(
    fakes, serve, make_funded_key, make_client, engine
):
    upstream = fakes()
    server = serve(upstream.base_url, price_prompt=1.0, price_completion=3.0)
    client = make_client(server, make_funded_key(10_000))
    stream = client.chat.completions.create(
        model="big",
        messages=HELLO,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.2,
        seed=7,
        top_p=0.9,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text == WORDS
    assert (usage.prompt_tokens, usage.completion_tokens) == (UPSTREAM_PROMPT, 8)
    booked = entry(engine, chunks[0].id)
    assert (booked.prompt_tokens, booked.completion_tokens) == (UPSTREAM_PROMPT, 8)
    assert -booked.amount == UPSTREAM_PROMPT * 1 + 8 * 3
    assert balance(engine).available == 10_000 - (UPSTREAM_PROMPT + 24)
    sent = upstream.state()["last_body"]
    assert (sent["temperature"], sent["seed"], sent["top_p"], sent["max_tokens"]) == (
        0.2,
        7,
        0.9,
        8,
    )
    assert sent["stream_options"] == {"include_usage": True}


def test_a_non_streamed_answer_is_billed_exactly_the_upstreams_usage(
    fakes, serve, api_key, make_client, engine
):
    server = serve(fakes().base_url)
    completion = make_client(server, api_key).chat.completions.create(
        model="big", messages=HELLO, max_tokens=5
    )
    assert completion.choices[0].message.content == "w0 w1 w2 w3 w4"
    assert completion.choices[0].finish_reason == "length"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (6, 5)
    booked = entry(engine, completion.id)
    assert (booked.prompt_tokens, booked.completion_tokens, -booked.amount) == (6, 5, 11)


def test_a_stream_without_usage_is_billed_the_tokens_counted_and_the_prompts_bound(
    fakes, serve, api_key, make_client, engine
):
    server = serve(fakes(mode="no_usage").base_url)
    chunks = list(
        make_client(server, api_key).chat.completions.create(
            model="big",
            messages=HELLO,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    bound = prompt_bound([ChatMessage(role="user", content="hello there")])
    assert (usage.prompt_tokens, usage.completion_tokens) == (bound, 8)
    booked = entry(engine, chunks[0].id)
    assert (booked.prompt_tokens, booked.completion_tokens) == (bound, 8)
    assert -booked.amount == usage.total_tokens


def test_a_5xx_or_a_refused_connection_fails_over_before_the_first_token(
    fakes, serve, api_key, make_client, engine
):
    broken, healthy = fakes(mode="status_500"), fakes()
    refused = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    server = serve(refused, broken.base_url, healthy.base_url, upstream_health_seconds=3600)
    client = make_client(server, api_key)
    for _ in range(3):
        chunks = list(
            client.chat.completions.create(
                model="big",
                messages=HELLO,
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            "w0 w1 w2 w3"
        )
        assert entry(engine, chunks[0].id).completion_tokens == 4
    metrics = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    assert f'tokenshop_upstream_failovers_total{{backend="{broken.base_url}",model="big"}}' in (
        metrics
    )
    assert (
        f'tokenshop_upstream_errors_total{{backend="{refused}",kind="connect",model="big"}} '
        in (metrics)
    )


def test_all_upstreams_down_is_a_503_in_openais_shape_and_nothing_billed(
    fakes, serve, api_key, make_client, engine
):
    server = serve(fakes(mode="status_500").base_url, f"http://127.0.0.1:{free_port()}/v1")
    client = make_client(server, api_key)
    with pytest.raises(openai.InternalServerError) as failure:
        client.chat.completions.create(model="big", messages=HELLO, max_tokens=4, stream=True)
    assert failure.value.status_code == 503
    assert failure.value.body["code"] == "upstream_unavailable"
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="big", messages=HELLO, max_tokens=4)
    books = balance(engine)
    assert (books.used, books.held, open_holds(engine)) == (0, 0, 0)


def test_a_stall_before_the_first_token_fails_over(fakes, serve, api_key, make_client, engine):
    stalled, healthy = fakes(mode="stall"), fakes()
    server = serve(stalled.base_url, healthy.base_url, upstream_first_token_seconds=2)
    client = make_client(server, api_key)
    answers = [
        client.chat.completions.create(model="big", messages=HELLO, max_tokens=3) for _ in range(2)
    ]
    # non-streamed answers wait for the whole answer: no first-token timeout, so both
    # went where they could; streamed ones leave the stalled upstream
    assert all(a.choices[0].message.content == "w0 w1 w2" for a in answers)
    for _ in range(2):
        chunks = list(
            client.chat.completions.create(
                model="big",
                messages=HELLO,
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage.completion_tokens == 3
    assert poll(lambda: stalled.state()["streaming"] == 0, within=5, what="stall closed") >= 0


def test_a_cut_mid_stream_ends_with_an_error_event_and_bills_what_arrived(
    fakes, serve, api_key, engine
):
    server = serve(fakes(mode="cut", cut_after=3).base_url)
    with httpx.stream(
        "POST",
        f"{server.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": "big", "messages": HELLO, "max_tokens": 8, "stream": True},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "upstream_error"
    chat_id = json.loads(events[0])["id"]
    text = "".join(
        choice["delta"].get("content", "")
        for event in events[:-2]
        for choice in json.loads(event)["choices"]
    )
    assert text == "w0 w1 w2"
    booked = entry(engine, chat_id)
    assert booked.completion_tokens == 3
    assert open_holds(engine) == 0


def test_a_refused_field_is_the_upstreams_4xx_and_the_prompt_is_not_billed(
    fakes, serve, api_key, make_client, engine
):
    server = serve(fakes(mode="status_400").base_url)
    client = make_client(server, api_key)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="big", messages=HELLO, max_tokens=4, temperature=0.3, stream=stream
            )
        assert refused.value.body["message"] == "temperature is not supported by this upstream"
        assert refused.value.body["param"] == "temperature"
    assert (balance(engine).used, open_holds(engine)) == (0, 0)


def test_a_client_that_leaves_closes_the_upstream_connection(fakes, serve, api_key, engine):
    upstream = fakes(delay=0.05)
    server = serve(upstream.base_url)
    with httpx.stream(
        "POST",
        f"{server.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": "big", "messages": HELLO, "max_tokens": 3000, "stream": True},
        timeout=30,
    ) as response:
        received = 0
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                received += 1
            if received == 5:
                break
    poll(lambda: upstream.state()["left"] == 1, within=5, what="the upstream saw the client leave")
    poll(lambda: open_holds(engine) == 0, within=5, what="the hold settled")
    [booked] = _usage_entries(engine)
    assert 5 <= booked.completion_tokens < 3000  # what the upstream sent, not the hold


def test_two_upstreams_one_killed_mid_run_books_match_every_clients_usage(
    fakes, serve, make_funded_key, make_client, engine, database_url, tmp_path
):
    first, second = fakes(delay=0.02), fakes(delay=0.02)
    server = serve(first.base_url, second.base_url, upstream_health_seconds=0.2)
    client = make_client(server, make_funded_key(1_000_000))
    results: list[tuple[str, Any]] = []

    def ask(index: int) -> None:
        try:
            chunks = []
            for chunk in client.chat.completions.create(
                model="big",
                messages=HELLO,
                max_tokens=40,
                stream=True,
                stream_options={"include_usage": True},
            ):
                chunks.append(chunk)
            results.append(("ok", chunks))
        except openai.APIError as exc:
            results.append(("error", (exc, chunks)))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads[:4]:
        thread.start()
    poll(lambda: first.state()["streaming"] >= 1, within=10, what="a stream on the first")
    first.kill()
    for thread in threads[4:]:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # later requests all succeed on the survivor; only streams cut on the killed one failed
    oks = [chunks for kind, chunks in results if kind == "ok"]
    failed = [value for kind, value in results if kind == "error"]
    assert len(oks) + len(failed) == 8 and len(oks) >= 4
    assert all(chunks for _, chunks in failed), "a request failed before it started streaming"
    for chunks in oks:
        assert_booked_as_told(engine, chunks[0].id, chunks[-1].usage)
    for _, chunks in failed:
        received = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
        assert entry(engine, chunks[0].id).completion_tokens >= received
    poll(lambda: open_holds(engine) == 0, within=5, what="every hold resolved")
    result = audit(database_url, tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "audit: ok")


def test_models_ready_and_metrics_show_the_upstreams_and_never_their_key(
    fakes, serve, api_key, make_client, caplog, monkeypatch
):
    secret = "sk-upstream-secret-0123456789abcdef"
    monkeypatch.setenv("BIG_UPSTREAM_KEY", secret)
    good = fakes(env={"FAKE_UPSTREAM_KEY": secret})
    wrong = fakes(env={"FAKE_UPSTREAM_KEY": "another"})  # refuses our key: a 401
    caplog.set_level(logging.DEBUG)
    server = serve(wrong.base_url, good.base_url, api_key_env="BIG_UPSTREAM_KEY")
    client = make_client(server, api_key)
    assert [m.id for m in client.models.list().data] == ["big"]
    answers = [
        client.chat.completions.create(model="big", messages=HELLO, max_tokens=2) for _ in range(3)
    ]
    assert all(a.choices[0].message.content == "w0 w1" for a in answers)
    ready = httpx.get(f"http://127.0.0.1:{server.port}/ready").json()
    assert ready["backends"]["big"][good.base_url] == "up"
    metrics = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    labels = f'backend="{good.base_url}",model="big"'
    for name in ("requests_total", "in_flight", "time_to_first_token_seconds_count"):
        assert f"tokenshop_upstream_{name}{{{labels}}}" in metrics
    server.__exit__()  # logs of shutdown too
    assert secret not in metrics + json.dumps(ready) + caplog.text
    assert secret not in "".join(a.model_dump_json() for a in answers)


def _usage_entries(engine) -> list[LedgerEntry]:
    with session_scope(engine) as session:
        return list(session.exec(select(LedgerEntry).where(LedgerEntry.kind == "usage")).all())


def test_response_format_goes_upstream_as_written(fakes, serve, api_key, make_client, engine):
    upstream = fakes()
    client = make_client(serve(upstream.base_url), api_key)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    client.chat.completions.create(
        model="big", messages=HELLO, max_tokens=2, response_format=response_format
    )
    assert upstream.state()["last_body"]["response_format"] == response_format
    assert (balance(engine).held, open_holds(engine)) == (0, 0)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


def _assembled(chunks: list[Any]) -> dict[int, dict[str, Any]]:
    """Streamed `delta.tool_calls` put together as a client does; id, type and name must come
    once per call, in its first delta."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.index not in calls:
                assert delta.id and delta.type == "function" and delta.function.name
                calls[delta.index] = {
                    "id": delta.id,
                    "type": delta.type,
                    "name": delta.function.name,
                    "arguments": delta.function.arguments or "",
                }
            else:
                assert (delta.id, delta.type, delta.function.name) == (None, None, None)
                calls[delta.index]["arguments"] += delta.function.arguments or ""
    return calls


def test_a_forced_tool_call_comes_back_as_tool_calls_and_is_billed_as_booked(
    fakes, serve, api_key, make_client, engine
):
    upstream = fakes()
    client = make_client(serve(upstream.base_url), api_key)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    answer = client.chat.completions.create(
        model="big",
        messages=HELLO,
        max_tokens=50,
        tools=[WEATHER, TIME],
        tool_choice=choice,
        parallel_tool_calls=False,
    )
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    [call] = message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_fake0", "function", "get_weather")
    assert json.loads(call.function.arguments) == {
        "city": "Paris",
        "function": "get_weather",
        "unit": "celsius",
    }
    sent = upstream.state()["last_body"]
    assert (sent["tools"], sent["tool_choice"], sent["parallel_tool_calls"]) == (
        [WEATHER, TIME],
        choice,
        False,
    )
    assert_booked_as_told(engine, answer.id, answer.usage)
    assert answer.usage.completion_tokens == len(fake_upstream.call_deltas(["get_weather"]))
    assert (balance(engine).held, open_holds(engine)) == (0, 0)


def test_streamed_tool_call_deltas_assemble_to_the_calls_of_a_whole_answer(
    fakes, serve, api_key, make_client, engine
):
    upstream = fakes()
    client = make_client(serve(upstream.base_url), api_key)
    ask = {
        "model": "big",
        "messages": HELLO,
        "max_tokens": 100,
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
    }
    whole = client.chat.completions.create(**ask).choices[0]
    chunks = list(
        client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    streamed = _assembled(chunks)
    assert [(c["id"], c["type"], c["name"], c["arguments"]) for c in streamed.values()] == [
        (c.id, c.type, c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert [c["name"] for c in streamed.values()] == ["get_weather", "get_time"]
    assert list(streamed) == [0, 1]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"] == [whole.finish_reason]
    usage = chunks[-1].usage
    assert_booked_as_told(engine, chunks[0].id, usage)
    assert usage.completion_tokens == len(fake_upstream.call_deltas(["get_weather", "get_time"]))


@pytest.mark.parametrize("stream", [True, False])
def test_tool_calls_without_upstream_usage_are_billed_the_tokenizers_count_of_their_arguments(
    stream, fakes, serve, api_key, make_client, engine
):
    server = serve(fakes(mode="no_usage").base_url, tokenizer=str(DEMO_MODEL))
    client = make_client(server, api_key)
    ask = {"model": "big", "messages": HELLO, "max_tokens": 200, "tools": [WEATHER, TIME]}
    ask["tool_choice"] = "required"
    tokenizer = TokenizerWrapper.from_file(DEMO_MODEL / "tokenizer.json")
    deltas = fake_upstream.call_deltas(["get_weather", "get_time"])
    if stream:
        chunks = list(
            client.chat.completions.create(
                **ask, stream=True, stream_options={"include_usage": True}
            )
        )
        assert len(_assembled(chunks)) == 2
        answer_id, usage = chunks[0].id, chunks[-1].usage
        # one chunk a fragment, each at least one token
        counted = sum(max(1, len(tokenizer.encode(d["function"]["arguments"]))) for d in deltas)
    else:
        answer = client.chat.completions.create(**ask)
        assert len(answer.choices[0].message.tool_calls) == 2
        answer_id, usage = answer.id, answer.usage
        arguments = "".join(fake_upstream.call_arguments(n) for n in ("get_weather", "get_time"))
        counted = len(tokenizer.encode(arguments))
    assert usage.completion_tokens == counted
    assert_booked_as_told(engine, answer_id, usage)
    assert (balance(engine).held, open_holds(engine)) == (0, 0)


def test_a_conversation_with_a_tool_result_is_forwarded_as_sent_and_answered(
    fakes, serve, api_key, make_client, engine
):
    upstream = fakes()
    client = make_client(serve(upstream.base_url), api_key)
    call = {
        "id": "call_fake0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_fake0", "content": "18C"},
    ]
    answer = client.chat.completions.create(
        model="big", messages=messages, max_tokens=20, tools=[WEATHER]
    )
    assert answer.choices[0].message.content == "got 18C"
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"
    assert upstream.state()["last_body"]["messages"] == messages
    booked = entry(engine, answer.id)
    assert (booked.prompt_tokens, booked.completion_tokens) == (
        answer.usage.prompt_tokens,
        answer.usage.completion_tokens,
    )
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (
        fake_upstream.prompt_tokens({"messages": messages}),
        2,
    )


def test_a_prompt_held_at_its_bound_is_billed_the_upstreams_count_and_not_refused_here(
    fakes, serve, api_key, make_client, engine
):
    # 6,000 bytes against the upstream's 4,096-token context: only the upstream can tell
    long = [{"role": "user", "content": "hello " * 1000}]
    server = serve(fakes().base_url)
    answer = make_client(server, api_key).chat.completions.create(
        model="big", messages=long, max_tokens=3
    )
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (1004, 3)
    assert -entry(engine, answer.id).amount == 1007


def test_n_choices_are_n_upstream_requests_billed_for_one_prompt(
    fakes, serve, api_key, make_client, engine
):
    upstream = fakes()
    answer = make_client(serve(upstream.base_url), api_key).chat.completions.create(
        model="big", messages=HELLO, max_tokens=3, n=2, seed=40
    )
    assert [c.message.content for c in answer.choices] == ["w0 w1 w2", "w0 w1 w2"]
    assert upstream.state()["started"] == 2
    assert upstream.state()["last_body"]["seed"] in (40, 41)  # seed + choice index
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (UPSTREAM_PROMPT, 6)
    assert -entry(engine, answer.id).amount == UPSTREAM_PROMPT + 6


def test_the_responses_api_returns_an_upstreams_calls_as_function_call_items(
    fakes, serve, api_key, make_client, engine
):
    client = make_client(serve(fakes().base_url), api_key)
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["function"]["parameters"],
    }
    ask = {"model": "big", "input": "hello there", "tools": [tool], "tool_choice": "required"}
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    done = next(e for e in events if e.type == "response.completed").response
    for response in (whole, done):
        [item] = response.output
        assert (item.type, item.call_id, item.name) == (
            "function_call",
            "call_fake0",
            "get_weather",
        )
        assert item.arguments == fake_upstream.call_arguments("get_weather")
        assert response.usage.output_tokens == len(fake_upstream.call_deltas(["get_weather"]))
    streamed = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert streamed == fake_upstream.call_arguments("get_weather")
    assert (balance(engine).held, open_holds(engine)) == (0, 0)


@contextmanager
def holds_waiting(engine) -> Iterator[None]:
    """While open, a hold on account 1 waits: this transaction locks the account's row (on
    SQLite, the whole database's write lock, which its BEGIN IMMEDIATE takes)."""
    with session_scope(engine) as session:
        lock_accounts(session, [1])
        yield


def hold_elsewhere(engine, *, leaving: int) -> None:
    """Another request holds all of account 1's balance but `leaving` tokens."""
    with session_scope(engine) as session:
        held = ledger.get_balance(session=session, account_id=1).available - leaving
        ledger.hold(
            session=session,
            account_id=1,
            request_id="chatcmpl-elsewhere",
            min_tokens=held,
            max_tokens=held,
            ttl=timedelta(hours=1),
        )


@pytest.mark.parametrize("early", [True, False], ids=["early dispatch", "told to wait"])
def test_a_request_leaves_for_the_upstream_while_its_hold_waits_unless_told_not_to(
    early, fakes, serve, api_key, make_client, engine
):
    upstream = fakes()
    client = make_client(serve(upstream.base_url, upstream_early_dispatch=early), api_key)
    client.chat.completions.create(model="big", messages=HELLO, max_tokens=2)  # held in full
    answers: list[Any] = []
    asking = threading.Thread(
        target=lambda: answers.append(
            client.chat.completions.create(model="big", messages=HELLO, max_tokens=4)
        )
    )
    with holds_waiting(engine):
        asking.start()
        if early:
            poll(
                lambda: upstream.state()["started"] == 2,
                within=10,
                what="the upstream taking the request while its hold waits",
            )
        else:
            asking.join(0.5)  # as long as the request gets
            assert upstream.state()["started"] == 1
        assert answers == []  # nothing comes back before the hold is in place
    asking.join(30)
    [completion] = answers
    assert completion.choices[0].message.content == "w0 w1 w2 w3"
    assert_booked_as_told(engine, completion.id, completion.usage)
    assert open_holds(engine) == 0


def test_a_hold_refused_after_the_request_left_stops_it_and_bills_nothing(
    fakes, serve, make_funded_key, make_client, engine
):
    upstream = fakes(delay=0.05)
    client = make_client(serve(upstream.base_url), make_funded_key(1_000))
    client.chat.completions.create(model="big", messages=HELLO, max_tokens=2)  # held in full
    hold_elsewhere(engine, leaving=0)
    used = balance(engine).used
    with pytest.raises(openai.RateLimitError, match="quota"):
        client.chat.completions.create(model="big", messages=HELLO, max_tokens=8, stream=True)
    poll(lambda: upstream.state()["streaming"] == 0, within=5, what="the upstream stopping")
    started = upstream.state()["started"]
    with pytest.raises(openai.RateLimitError, match="quota"):  # its last hold fell short:
        client.chat.completions.create(model="big", messages=HELLO, max_tokens=8)  # it waits
    assert upstream.state()["started"] == started  # and never reaches the upstream
    assert (balance(engine).used, open_holds(engine)) == (used, 1)  # the other request's


def test_a_hold_covering_fewer_tokens_than_asked_sends_the_upstream_only_those(
    fakes, serve, make_funded_key, make_client, engine
):
    upstream = fakes()
    client = make_client(serve(upstream.base_url), make_funded_key(1_000))
    client.chat.completions.create(model="big", messages=HELLO, max_tokens=2)  # held in full
    bound = prompt_bound([ChatMessage(role="user", content="hello there")])
    hold_elsewhere(engine, leaving=bound + 3)
    chunks = list(
        client.chat.completions.create(
            model="big",
            messages=HELLO,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "w0 w1 w2"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert upstream.state()["last_body"]["max_tokens"] == 3
    assert_booked_as_told(engine, chunks[0].id, chunks[-1].usage)
    poll(lambda: upstream.state()["streaming"] == 0, within=5, what="the upstream stopping")
