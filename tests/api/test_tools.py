"""Function calling and structured outputs through the official `openai` SDK, on the demo model.

The demo model has random weights: left alone it writes noise, so every valid object and call
below is the work of constrained decoding (llguidance), which is the point of these tests.
"""

from __future__ import annotations

import json
import shutil
from enum import StrEnum
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from sqlmodel import Session, select

from api.engine.text.chat_template import CHATML_TEMPLATE
from billing.models import LedgerEntry
from tests.api.conftest import DEMO_MODEL

TRIES = 50


class Color(StrEnum):
    red = "red"
    green = "green"
    blue = "blue"


class Verdict(BaseModel):
    color: Color
    score: int = Field(ge=1, le=10)
    approved: bool
    note: str = Field(max_length=20)


WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "MSK"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now.", "parameters": TIME_PARAMETERS},
}
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_parse_returns_the_pydantic_object_every_time_at_temperature_one(
    client: openai.OpenAI,
) -> None:
    for seed in range(TRIES):
        completion = client.chat.completions.parse(
            model="demo",
            messages=[{"role": "user", "content": "Rate the shop."}],
            response_format=Verdict,
            temperature=1.0,
            seed=seed,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        verdict = choice.message.parsed
        assert isinstance(verdict, Verdict)
        assert 1 <= verdict.score <= 10 and len(verdict.note) <= 20


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named"],
)
def test_forced_tool_calls_have_arguments_valid_for_the_schema(
    client: openai.OpenAI, tool_choice: Any
) -> None:
    names = set()
    for seed in range(TRIES):
        completion = client.chat.completions.create(
            model="demo",
            messages=ASK,
            tools=[WEATHER, TIME],
            tool_choice=tool_choice,
            temperature=1.0,
            seed=seed,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls, choice.message.content
        for call in choice.message.tool_calls:
            assert call.id.startswith("call_") and call.type == "function"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
            names.add(call.function.name)
    assert names == ({"get_weather", "get_time"} if tool_choice == "required" else {"get_time"})


def test_streamed_tool_call_deltas_assemble_to_the_same_calls(client: openai.OpenAI) -> None:
    for seed in range(5):
        request: dict[str, Any] = dict(
            model="demo", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", seed=seed
        )
        whole = client.chat.completions.create(**request).choices[0]
        calls: dict[int, dict[str, str]] = {}
        ids: dict[int, str] = {}
        content, finish = "", None
        for chunk in client.chat.completions.create(**request, stream=True):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                    if delta.id is not None:  # the id, type and name come once, first
                        assert delta.index not in ids and delta.type == "function"
                        ids[delta.index] = delta.id
                    assert delta.function is not None
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
        assert whole.message.tool_calls
        expected = [
            {"name": c.function.name, "arguments": c.function.arguments}
            for c in whole.message.tool_calls
        ]
        assert [calls[i] for i in sorted(calls)] == expected
        assert all(i.startswith("call_") for i in ids.values())
        assert content == (whole.message.content or "")
        assert finish == whole.finish_reason == "tool_calls"


def test_a_conversation_with_a_tool_result_is_answered(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="demo", messages=ASK, tools=[WEATHER], tool_choice="required", seed=1
    )
    call = first.choices[0].message.tool_calls[0]
    answer = client.chat.completions.create(
        model="demo",
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=8,
    )
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens


def test_json_object_content_always_parses(client: openai.OpenAI) -> None:
    """Any JSON object may be written, so the random demo model's strings run on: its one `"`
    token is 1 of 2,048. A `logit_bias` toward it (as a client may send) lets strings close;
    what the grammar then guarantees is that every answer is a JSON object."""
    quote = 4  # the demo tokenizer's `"`
    for seed in range(20):
        completion = client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "Answer in JSON."}],
            response_format={"type": "json_object"},
            logit_bias={str(quote): 5},
            seed=seed,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(json.loads(choice.message.content), dict)


def test_tool_call_tokens_are_billed_as_completion_tokens(
    server, api_key: str, client: openai.OpenAI, session: Session
) -> None:
    completion = client.chat.completions.create(
        model="demo", messages=ASK, tools=[WEATHER], tool_choice="required", seed=3
    )
    assert completion.choices[0].message.tool_calls
    session.expire_all()
    entry = session.exec(select(LedgerEntry).where(LedgerEntry.request_id == completion.id)).one()
    assert -entry.amount == completion.usage.total_tokens
    assert entry.completion_tokens == completion.usage.completion_tokens > 10


def test_a_schema_llguidance_cannot_take_is_a_400_naming_the_parameter(
    client: openai.OpenAI,
) -> None:
    lookbehind = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="demo",
            messages=ASK,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "thing", "schema": lookbehind},
            },
        )
    assert error.value.body["param"] == "response_format.json_schema.schema"
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": lookbehind}}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="demo", messages=ASK, tools=[WEATHER, bad_tool], tool_choice="required"
        )
    assert error.value.body["param"] == "tools[1].function.parameters"


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"logit_bias": {"12": 101}}, "logit_bias"),
        ({"logit_bias": {"2048": 1}}, "logit_bias"),  # past the demo's vocabulary
        ({"max_tokens": 10**12}, "max_tokens"),
        ({"max_completion_tokens": 131072}, "max_completion_tokens"),  # the demo's whole window
    ],
)  # fmt: skip
def test_options_that_cannot_be_honoured_are_refused_by_name(
    client: openai.OpenAI, changes: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="demo", messages=ASK, **changes)
    assert error.value.body["param"] == param


def test_a_tool_message_must_answer_an_earlier_call(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="demo",
            messages=[*ASK, {"role": "tool", "tool_call_id": "call_nope", "content": "x"}],
        )
    assert error.value.body["param"] == "messages[1].tool_call_id"


def test_logit_bias_of_100_picks_the_token(client: openai.OpenAI) -> None:
    token = 300
    completion = client.chat.completions.create(
        model="demo", messages=ASK, logit_bias={str(token): 100}, max_tokens=5, logprobs=True
    )
    assert completion.choices[0].logprobs is not None
    picked = {entry.token for entry in completion.choices[0].logprobs.content}
    assert len(picked) == 1


def test_the_fingerprint_is_a_string_on_every_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="demo", messages=ASK, max_tokens=2)
    assert isinstance(whole.system_fingerprint, str) and whole.system_fingerprint.startswith("fp_")
    stream = client.chat.completions.create(model="demo", messages=ASK, max_tokens=2, stream=True)
    assert {chunk.system_fingerprint for chunk in stream} == {whole.system_fingerprint}


def test_an_omitted_max_tokens_is_capped_to_the_room_left(
    start_server, api_key: str, make_client, tmp_path
) -> None:
    short = tmp_path / "short"  # the demo with a window shorter than the default max_tokens
    shutil.copytree(DEMO_MODEL, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 2048}))
    client = make_client(start_server(models=f"demo={short}"), api_key)
    completion = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "word " * 450}], seed=0
    )
    usage = completion.usage
    assert usage.prompt_tokens + usage.completion_tokens <= 2048


def test_a_model_whose_template_shows_no_tools_refuses_them(
    start_server, api_key: str, make_client, tmp_path
) -> None:
    """Neither a template without tools nor one whose call syntax is unknown here (calls could
    be neither read nor enforced) takes them."""
    plain, odd = tmp_path / "plain", tmp_path / "odd"
    for path, template in ((plain, ""), (odd, "{% if tools %}<<functions>>{% endif %}")):
        shutil.copytree(DEMO_MODEL, path)
        (path / "chat_template.jinja").write_text(template + CHATML_TEMPLATE)
    server = start_server(models=f"plain={plain},odd={odd}")
    client = make_client(server, api_key)
    for model in ("plain", "odd"):
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER])
        assert error.value.body["param"] == "tools"
    answer = client.chat.completions.create(model="plain", messages=ASK, max_tokens=3)
    assert answer.choices[0].message.tool_calls is None
