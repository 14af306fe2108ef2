"""Tools, response formats and logit_bias of a chat request: what the engine must enforce, and
tool calls read back out of the answer (whole or streamed) in OpenAI's shapes.

`plan` decides once per request: the tools the chat template shows, the constraint the engine
enforces (llguidance grammar: `response_format`, `tool_choice` "required" or named, strict
functions under "auto"), and the tool-call syntax of the model (`engine.tool_format()`) to parse.
Every option accepted is enforced; one that cannot be is refused by name.
"""

from __future__ import annotations

import functools
import json
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import llguidance

from api.engine.protocol import ChatMessage, Constraint, EngineClient, ToolCallDelta
from api.engine.protocol import ToolCall as EngineToolCall
from api.engine.text import tool_calls
from api.engine.text.tool_calls import (
    CallArguments,
    CallStart,
    Content,
    ToolCallFormat,
    ToolCallParser,
)
from api.errors import invalid_request, unsupported_parameter
from api.protocol import (
    ChatCompletionRequest,
    DeltaFunction,
    DeltaToolCall,
    FunctionCall,
    Message,
    ToolCall,
)

_ID_ALPHABET = string.ascii_letters + string.digits
LOGIT_BIAS_LIMIT = 100.0


@dataclass(frozen=True)
class ToolPlan:
    """What a request asks of tools and output formats."""

    tools: list[dict[str, Any]] | None = None  # OpenAI function tools, for the chat template
    constraint: Constraint | None = None
    format: ToolCallFormat | None = None  # parse calls out of the answer in this syntax
    single_call: bool = False  # parallel_tool_calls false: the first call only
    logit_bias: tuple[tuple[int, float], ...] = ()


def plan(request: ChatCompletionRequest, engine: EngineClient) -> ToolPlan:
    """Validate the request's tools, tool_choice, response_format and logit_bias."""
    _refuse_legacy(request)
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) != len(names):
        raise invalid_request("Function names in 'tools' must be unique.", "tools")
    choice = request.tool_choice
    if not tools and choice not in (None, "none", "auto"):
        raise invalid_request(
            "'tool_choice' is only allowed when 'tools' are specified.", "tool_choice"
        )
    named = None if choice is None or isinstance(choice, str) else choice.function.name
    if named is not None and named not in names:
        raise invalid_request(
            f"'tool_choice' names the function '{named}', which is not in 'tools'.",
            "tool_choice",
            "invalid_value",
        )
    fmt_name = engine.tool_format()
    fmt = tool_calls.FORMATS.get(fmt_name) if fmt_name else None
    parallel = request.parallel_tool_calls is not False
    calling = bool(tools) and choice != "none"
    constraint = None
    if calling and fmt is not None:
        constraint = _tool_constraint(fmt, tools, choice, named, parallel)
    if constraint is None or constraint.param == "tools":  # the answer may be content
        constraint = _format_constraint(request) or constraint
    return ToolPlan(
        tools=tools or None,
        constraint=constraint,
        format=fmt if calling else None,
        single_call=not parallel,
        logit_bias=_logit_bias(request),
    )


def _refuse_legacy(request: ChatCompletionRequest) -> None:
    """The deprecated `functions` API would need its own answer shape (`function_call`,
    finish_reason "function_call"); clients are pointed at its replacement instead."""
    if request.functions is not None:
        raise unsupported_parameter(
            "functions", "is deprecated and not supported: send 'tools' instead."
        )
    if request.function_call is not None:
        raise unsupported_parameter(
            "function_call", "is deprecated and not supported: send 'tool_choice' instead."
        )


def _tool_constraint(
    fmt: ToolCallFormat,
    tools: list[dict[str, Any]],
    choice: Any,
    named: str | None,
    parallel: bool,
) -> Constraint | None:
    functions = tool_calls.functions_of(tools)
    strict = [tool["function"].get("strict") for tool in tools]
    for index, function in enumerate(functions):
        # only schemas that will be enforced must compile: a loose function's is not
        enforced = named == function.name or choice == "required" or strict[index]
        if function.parameters is not None and enforced:
            _check_schema(function.parameters, f"tools[{index}].function.parameters")
    if named is not None:
        chosen = [f for f in functions if f.name == named]
        grammar = tool_calls.call_grammar(fmt, chosen, mode="required", parallel=False)
        return Constraint(_lark(grammar), "tool_choice")
    if choice == "required":
        grammar = tool_calls.call_grammar(fmt, functions, mode="required", parallel=parallel)
        return Constraint(_lark(grammar), "tool_choice")
    if not any(strict):
        return None  # "auto" without strict functions: calls are parsed, not enforced
    loose = [
        tool_calls.FunctionSpec(f.name, f.parameters if is_strict else None)
        for f, is_strict in zip(functions, strict, strict=True)
    ]
    grammar = tool_calls.call_grammar(fmt, loose, mode="auto", parallel=parallel)
    return Constraint(_lark(grammar), "tools")


def _format_constraint(request: ChatCompletionRequest) -> Constraint | None:
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None
    schema: dict[str, Any] = {"type": "object"}
    if response_format.type == "json_object":
        if not any("json" in _plain_text(m).lower() for m in request.messages):
            raise invalid_request(
                "'messages' must contain the word 'json' in some form, to use "
                "'response_format' of type 'json_object'.",
                "messages",
            )
    else:
        if response_format.json_schema is None:
            raise invalid_request(
                "'response_format' of type 'json_schema' needs 'json_schema'.",
                "response_format.json_schema",
            )
        schema = response_format.json_schema.schema_ or schema
    param = (
        "response_format"
        if response_format.type == "json_object"
        else ("response_format.json_schema.schema")
    )
    grammar = _check_schema(tool_calls.with_spacing(schema, ",", ":"), param)
    return Constraint(grammar, param)


def _check_schema(schema: Mapping[str, Any], param: str) -> str:
    """The llguidance grammar of `schema`, or a 400 naming `param` when llguidance cannot
    enforce it (checked without a tokenizer; each distinct schema once per process)."""
    text = json.dumps(schema, sort_keys=True)
    grammar, error = _schema_grammar(text)
    if error:
        raise invalid_request(
            f"'{param}' is a JSON schema this service cannot enforce: {error}",
            param,
            "invalid_value",
        )
    return grammar


@functools.lru_cache(maxsize=1024)
def _schema_grammar(schema: str) -> tuple[str, str]:
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    except ValueError as exc:
        return "", str(exc)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return grammar, " ".join(lines[:4])[:500]


def _lark(grammar: str) -> str:
    return str(llguidance.LLMatcher.grammar_from_lark(grammar))


def _plain_text(message: Message) -> str:
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text or "" for part in message.content or [])


def _logit_bias(request: ChatCompletionRequest) -> tuple[tuple[int, float], ...]:
    bias = []
    for key, value in (request.logit_bias or {}).items():
        if not key.isdigit():
            raise invalid_request(
                f"'logit_bias' keys must be token ids; '{key}' is not.", "logit_bias"
            )
        if not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            raise invalid_request(
                f"'logit_bias' values must be between -100 and 100; {value} is not.",
                "logit_bias",
                "invalid_value",
            )
        bias.append((int(key), float(value)))
    return tuple(bias)


# ---- messages in --------------------------------------------------------------------------


def assistant_calls(index: int, message: Message) -> tuple[EngineToolCall, ...]:
    """An assistant message's calls, for the template to show again."""
    if message.function_call is not None:
        raise unsupported_parameter(
            f"messages[{index}].function_call", "is deprecated and not supported: use 'tool_calls'."
        )
    return tuple(
        EngineToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
        for call in message.tool_calls or []
    )


def tool_result(
    index: int, message: Message, content: str, messages: Sequence[ChatMessage]
) -> ChatMessage:
    """A `tool` message, with the name of the function whose call it answers."""
    if not message.tool_call_id:
        raise invalid_request(
            f"messages[{index}] has role 'tool' and needs 'tool_call_id'.",
            f"messages[{index}].tool_call_id",
        )
    name = next(
        (
            call.name
            for earlier in reversed(messages)
            for call in earlier.tool_calls
            if call.id == message.tool_call_id
        ),
        None,
    )
    if name is None:
        raise invalid_request(
            f"messages[{index}].tool_call_id '{message.tool_call_id}' answers no tool call of "
            "an earlier assistant message.",
            f"messages[{index}].tool_call_id",
        )
    return ChatMessage(role="tool", content=content, tool_call_id=message.tool_call_id, name=name)


# ---- answers out ---------------------------------------------------------------------------


def call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def split_answer(
    plan: ToolPlan, text: str, finish_reason: str
) -> tuple[str | None, list[ToolCall] | None, str]:
    """A whole answer's content, tool calls and finish reason ("tool_calls" when it made calls
    and ended by itself)."""
    if plan.format is None:
        return text, None, finish_reason
    content, parsed = tool_calls.parse(plan.format, text)
    if plan.single_call:
        parsed = parsed[:1]
    if not parsed:
        return content, None, finish_reason
    calls = [
        ToolCall(id=call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
        for c in parsed
    ]
    return content or None, calls, "tool_calls" if finish_reason == "stop" else finish_reason


@dataclass
class StreamedCalls:
    """One choice's streamed answer turned into content and `delta.tool_calls` pieces."""

    plan: ToolPlan
    parser: ToolCallParser = field(init=False)
    calls: int = 0

    def __post_init__(self) -> None:
        assert self.plan.format is not None
        self.parser = ToolCallParser(self.plan.format)

    def feed(self, text: str, *, finished: bool) -> tuple[str, list[DeltaToolCall]]:
        events = self.parser.feed(text)
        if finished:
            events += self.parser.finish()
        content: list[str] = []
        deltas: list[DeltaToolCall] = []
        for event in events:
            if isinstance(event, Content):
                content.append(event.text)
            elif self.plan.single_call and event.index > 0:
                continue
            elif isinstance(event, CallStart):
                self.calls += 1
                deltas.append(
                    DeltaToolCall(
                        index=event.index,
                        id=call_id(),
                        type="function",
                        function=DeltaFunction(name=event.name, arguments=""),
                    )
                )
            elif isinstance(event, CallArguments):
                deltas.append(
                    DeltaToolCall(index=event.index, function=DeltaFunction(arguments=event.text))
                )
        return "".join(content), deltas

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason


# ---- calls an engine made itself (an upstream's structured tool_calls) ----------------------


def delta_calls(calls: Sequence[ToolCallDelta]) -> list[DeltaToolCall]:
    """An engine's call pieces as `delta.tool_calls`: id, type and name once, then arguments."""
    return [
        DeltaToolCall(
            index=call.index,
            id=call.id,
            type="function" if call.id is not None else None,
            function=DeltaFunction(name=call.name, arguments=call.arguments),
        )
        for call in calls
    ]


def whole_calls(calls: Sequence[ToolCallDelta]) -> list[ToolCall] | None:
    """An engine's call pieces assembled into whole calls, in index order (None: no calls)."""
    started: dict[int, ToolCallDelta] = {}
    arguments: dict[int, list[str]] = {}
    for call in calls:
        if call.id is not None:
            started.setdefault(call.index, call)
        arguments.setdefault(call.index, []).append(call.arguments)
    return [
        ToolCall(
            id=call.id or call_id(),
            function=FunctionCall(name=call.name or "", arguments="".join(arguments[index])),
        )
        for index, call in sorted(started.items())
    ] or None
