"""Tool calls in each template family's syntax: parsed whole and streamed alike, text that may
open a call held back (never sent and then taken back), and grammars that force valid calls."""

from __future__ import annotations

import json

import llguidance
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.engine.text.tool_calls import (
    FORMATS,
    HERMES,
    LLAMA3,
    MISTRAL,
    CallArguments,
    CallStart,
    Content,
    Event,
    FunctionSpec,
    ParsedCall,
    ToolCallFormat,
    ToolCallParser,
    call_grammar,
    detect_format,
    parse,
)
from tests.engine.conftest import DEMO_DIR

HERMES_ANSWER = (
    "Let me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, {"a": "}"}]}}'
    "\n</tool_call>\n<tool_call>\n"
    '{"name": "get_time", "arguments": {}}\n</tool_call>'
)
ANSWERS = {
    "hermes": HERMES_ANSWER,
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "get_time", "parameters": {}}',
    "mistral": '[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_time", "arguments": {}}]',
}


def stream(fmt: ToolCallFormat, pieces: list[str]) -> tuple[list[Event], ToolCallParser]:
    parser = ToolCallParser(fmt)
    events: list[Event] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish(), parser


def test_each_family_is_told_apart_by_its_template() -> None:
    assert detect_format((DEMO_DIR / "chat_template.jinja").read_text()) is HERMES
    assert detect_format("{{ messages }}") is None  # no tools: no calls to look for
    assert detect_format("{% if tools %}[TOOL_CALLS]{% endif %}") is MISTRAL
    assert detect_format("{% if tools %}<|python_tag|>{% endif %}") is LLAMA3


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_calls_are_read_with_their_arguments_as_written(name: str) -> None:
    content, calls = parse(FORMATS[name], ANSWERS[name])
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments)["city"] == "Paris"
    assert calls[1].arguments == "{}"
    assert content == ("Let me look.\n" if name == "hermes" else "")


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_a_stream_cut_anywhere_gives_the_whole_answer(name: str) -> None:
    fmt = FORMATS[name]
    whole_content, whole_calls = parse(fmt, ANSWERS[name])
    text = ANSWERS[name]
    for size in (1, 2, 3, 7):
        events, parser = stream(fmt, [text[i : i + size] for i in range(0, len(text), size)])
        assert "".join(e.text for e in events if isinstance(e, Content)) == whole_content
        assert parser.calls == whole_calls
        starts = [e for e in events if isinstance(e, CallStart)]
        assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_time")]
        for call in starts:
            fragments = [e.text for e in events if isinstance(e, CallArguments)]
            assert fragments and call.index in {0, 1}
        assembled = {
            i: "".join(e.text for e in events if isinstance(e, CallArguments) and e.index == i)
            for i in (0, 1)
        }
        assert [assembled[0].strip(), assembled[1].strip()] == [c.arguments for c in whole_calls]


def test_text_that_only_looked_like_a_call_is_content_in_full() -> None:
    for text in ("a <tool_ca b", "x <tool_call> not json", '<tool_call>\n{"nam": 1}'):
        content, calls = parse(HERMES, text)
        assert (content, calls) == (text, [])
    assert parse(LLAMA3, 'hello {"name": "f"}') == ('hello {"name": "f"}', [])
    assert parse(MISTRAL, "[1, 2]") == ("[1, 2]", [])


def test_text_that_may_open_a_call_is_held_back_not_retracted() -> None:
    parser = ToolCallParser(HERMES)
    assert parser.feed("Hi <tool") == [Content("Hi ")]
    assert parser.feed("_ca") == []
    assert parser.feed("ll>\n{") == []
    assert parser.feed('"name": "f", "arguments": {') == [CallStart(0, "f"), CallArguments(0, "{")]


@given(st.text(alphabet=st.sampled_from(list('<>tool_cal{}"\n :,namergus[]TOCLS x')), max_size=60))
def test_streaming_never_differs_from_parsing_whole(text: str) -> None:
    for fmt in FORMATS.values():
        content, calls = parse(fmt, text)
        events, parser = stream(fmt, list(text))
        assert "".join(e.text for e in events if isinstance(e, Content)) == content
        assert parser.calls == calls


WEATHER = FunctionSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)


@pytest.fixture(scope="module")
def demo_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer((DEMO_DIR / "tokenizer.json").read_text(), eos_token=2)


def accepts(tokenizer: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    tokens = tokenizer.tokenize_str(text)
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_required_grammar_takes_valid_calls_only(
    demo_tokenizer: llguidance.LLTokenizer, name: str
) -> None:
    fmt = FORMATS[name]
    grammar = call_grammar(fmt, [WEATHER], mode="required", parallel=True)
    call = fmt.header("get_weather") + '{"city": "Oslo", "days": 3}}' + fmt.close
    two = fmt.list_open + call + fmt.separator + call + fmt.list_close
    assert accepts(demo_tokenizer, grammar, two)
    assert parse(fmt, two)[1] == [ParsedCall("get_weather", '{"city": "Oslo", "days": 3}')] * 2
    bad_city = fmt.list_open + call.replace('"Oslo"', '"Reykjavik"') + fmt.list_close
    assert not accepts(demo_tokenizer, grammar, bad_city)  # past maxLength
    assert not accepts(demo_tokenizer, grammar, "Sure!")
    single = call_grammar(fmt, [WEATHER], mode="required", parallel=False)
    assert not accepts(demo_tokenizer, single, two)


def test_under_auto_text_passes_and_an_opened_call_must_be_valid(
    demo_tokenizer: llguidance.LLTokenizer,
) -> None:
    grammar = call_grammar(HERMES, [WEATHER], mode="auto", parallel=True)
    assert accepts(demo_tokenizer, grammar, "Just text, no call.")
    good = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert accepts(demo_tokenizer, grammar, good)
    assert not accepts(demo_tokenizer, grammar, good.replace('"city"', '"town"'))
