"""Responses API items in and out: a Responses request read into the chat request that serves
it (messages from input items, tools, tool_choice, text.format), errors renamed back to the
parameters the client sent, and the answer written as output items, whole or as the semantic
stream events (`ResponseEvents`) in OpenAI's order.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from api.errors import OpenAIError, invalid_request, unsupported_parameter
from api.protocol import ChatCompletionRequest, DeltaToolCall, ToolCall
from api.protocol_responses import (
    ContentPart,
    FunctionCallItem,
    InputItem,
    ItemStatus,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponsesRequest,
    ResponseStatus,
)
from api.serving.tools import StreamedCalls

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
INCLUDES_WITHOUT_EFFECT = ("reasoning.encrypted_content",)  # no reasoning items are produced
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
# Chat parameter names in errors raised by the shared path, as a Responses client knows them.
RENAMED = (
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    (".function.parameters", ".parameters"),
    ("messages", "input"),
)


# ---- requests in ---------------------------------------------------------------------------


def refuse_unsupported(request: ResponsesRequest) -> None:
    if request.background:
        raise unsupported_parameter("background", "is not supported: answers are synchronous.")
    if request.conversation is not None:
        raise unsupported_parameter(
            "conversation", "is not supported: continue with 'previous_response_id'."
        )
    if request.prompt is not None:
        raise unsupported_parameter("prompt", "is not supported: send 'instructions' instead.")
    if request.top_logprobs:
        raise unsupported_parameter("top_logprobs", "is not supported by this service.")
    if request.max_tool_calls is not None:
        raise unsupported_parameter("max_tool_calls", "is not supported by this service.")
    if request.truncation == "auto":
        raise unsupported_parameter(
            "truncation", "'auto' is not supported: a conversation that does not fit is a 400."
        )
    for index, include in enumerate(request.include or []):
        if include not in INCLUDES_WITHOUT_EFFECT:
            raise unsupported_parameter(f"include[{index}]", f"'{include}' is not supported.")
    if request.text is not None and request.text.verbosity not in (None, "medium"):
        raise unsupported_parameter("text.verbosity", "is not supported by this service.")
    metadata = request.metadata or {}
    if len(metadata) > METADATA_PAIRS or any(
        len(key) > METADATA_KEY or len(value) > METADATA_VALUE for key, value in metadata.items()
    ):
        raise invalid_request(
            f"'metadata' takes at most {METADATA_PAIRS} pairs, keys of at most {METADATA_KEY} "
            f"characters and values of at most {METADATA_VALUE}.",
            "metadata",
            "invalid_value",
        )


def input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as item dicts (a string is one user message)."""
    if request.input is None:
        return []
    if isinstance(request.input, str):
        return [{"type": "message", "role": "user", "content": request.input}]
    return [item.model_dump(exclude_none=True) for item in request.input]


def to_chat(
    request: ResponsesRequest, conversation: list[dict[str, Any]], *, first_new: int
) -> ChatCompletionRequest:
    """The chat request that serves `request`. Items before `first_new` come from a stored
    response; errors name the new items by their place in `input`."""
    messages: list[dict[str, Any]] = []
    if request.instructions:  # as OpenAI does, a previous response's instructions stay behind
        messages.append({"role": "system", "content": request.instructions})
    for index, raw in enumerate(conversation):
        _add_item(messages, InputItem.model_validate(raw), f"input[{index - first_new}]")
    if not messages:
        raise invalid_request("'input' must not be empty.", "input")
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_completion_tokens": request.max_output_tokens,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "stream": request.stream,
        "user": request.user,
        "parallel_tool_calls": request.parallel_tool_calls,
        "tools": _tools(request) or None,
        "tool_choice": _tool_choice(request),
        "response_format": _response_format(request),
    }
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"])
        raise renamed(
            invalid_request(f"Invalid request at '{param}': {first['msg']}", param, "invalid_value")
        ) from None


def _add_item(messages: list[dict[str, Any]], item: InputItem, where: str) -> None:
    kind = item.type or "message"
    if kind == "message":
        if item.role not in ROLES:
            raise invalid_request(
                f"'{where}.role' must be one of {', '.join(ROLES)}.",
                f"{where}.role",
                "invalid_value",
            )
        content = _text(item.content, f"{where}.content")
        messages.append({"role": item.role, "content": content})
    elif kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if getattr(item, name) is None:
                raise invalid_request(
                    f"Missing required parameter: '{where}.{name}'.",
                    f"{where}.{name}",
                    "missing_required_parameter",
                )
        call = {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # its text, then its calls
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        if item.call_id is None or item.output is None:
            param = f"{where}.{'call_id' if item.call_id is None else 'output'}"
            raise invalid_request(
                f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
            )
        output = _text(item.output, f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    elif kind != "reasoning":  # reasoning items carry nothing a model here reads back
        raise unsupported_parameter(
            f"{where}.type",
            f"'{kind}' is not supported: input items are messages, 'function_call' and "
            "'function_call_output'.",
        )


def _text(content: str | list[ContentPart] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        text = part.refusal if part.type == "refusal" else part.text
        if (part.type not in TEXT_PARTS and part.type != "refusal") or text is None:
            raise unsupported_parameter(
                f"{where}[{index}]", f"of type '{part.type}' is not supported: only text parts are."
            )
        texts.append(text)
    return "".join(texts)


def _tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    tools = []
    for index, tool in enumerate(request.tools or []):
        if tool.type != "function":
            raise invalid_request(
                f"The tool type '{tool.type}' is not available on this service: only 'function' "
                "tools are.",
                f"tools[{index}].type",
                "unsupported_value",
            )
        if not tool.name:
            raise invalid_request(
                f"Missing required parameter: 'tools[{index}].name'.",
                f"tools[{index}].name",
                "missing_required_parameter",
            )
        function = {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict is not False,  # the Responses API's default is strict
        }
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(request: ResponsesRequest) -> str | dict[str, Any] | None:
    choice = request.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function" or not choice.name:
        raise unsupported_parameter(
            "tool_choice", f"of type '{choice.type}' is not supported: name a function."
        )
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(request: ResponsesRequest) -> dict[str, Any] | None:
    fmt = request.text.format if request.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if not fmt.name:
        raise invalid_request(
            "Missing required parameter: 'text.format.name'.",
            "text.format.name",
            "missing_required_parameter",
        )
    schema = {"name": fmt.name, "description": fmt.description, "schema": fmt.schema_}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v}}


def renamed(error: OpenAIError) -> OpenAIError:
    """An error of the chat path with the parameter names a Responses client sent."""
    body = error.body
    message, param = body.message, body.param
    for chat, responses in RENAMED:
        message = message.replace(chat, responses)
        param = param.replace(chat, responses) if param else param
    return OpenAIError(
        error.status, message, type=body.type, code=body.code, param=param, headers=error.headers
    )


# ---- answers out ---------------------------------------------------------------------------


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def output_items(
    content: str | None, calls: list[ToolCall] | None, status: ResponseStatus
) -> list[OutputItem]:
    """A whole answer's items: its text as a message, then one item per call; the last item is
    incomplete when the answer was cut."""
    items: list[OutputItem] = []
    if content or not calls:
        items.append(
            OutputMessage(
                id=_item_id("msg"), status="completed", content=[OutputText(text=content or "")]
            )
        )
    for call in calls or []:
        items.append(
            FunctionCallItem(
                id=_item_id("fc"),
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
        )
    if status == "incomplete":
        items[-1].status = "incomplete"
    return items


@dataclass
class ResponseEvents:
    """One response's stream events, numbered, with its output items as they are built: a
    message item is opened by its first text, a function_call item by its call's start, and
    each is closed (`.done` events) when the next opens or the answer ends."""

    calls: StreamedCalls | None  # parse tool calls out of the text, where tools are offered
    items: list[OutputItem] = field(default_factory=list)
    sequence: int = 0
    _open: OutputItem | None = None
    _text: list[str] = field(default_factory=list)

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence}
        for name, value in fields.items():
            data[name] = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    def feed(self, text: str, *, finished: bool, calls: Sequence[DeltaToolCall] = ()) -> list[str]:
        """Events for a piece of text, and for `calls` an engine made itself (an upstream)."""
        if self.calls is None:
            content, deltas = text, list[DeltaToolCall]()
        else:
            content, deltas = self.calls.feed(text, finished=finished)
        deltas += calls
        events = []
        if content:
            if not isinstance(self._open, OutputMessage):
                events += self._close("completed")
                events += self._open_message()
            assert self._open is not None
            self._text.append(content)
            events.append(
                self._delta(
                    "response.output_text.delta", content_index=0, delta=content, logprobs=[]
                )
            )
        for delta in deltas:
            if delta.id is not None:  # a call starts
                events += self._close("completed")
                name = delta.function.name if delta.function and delta.function.name else ""
                item = FunctionCallItem(
                    id=_item_id("fc"),
                    call_id=delta.id,
                    name=name,
                    arguments="",
                    status="in_progress",
                )
                events += self._add(item)
            arguments = delta.function.arguments if delta.function else None
            if arguments and isinstance(self._open, FunctionCallItem):
                self._text.append(arguments)
                events.append(
                    self._delta("response.function_call_arguments.delta", delta=arguments)
                )
        return events

    def finish(self, status: ItemStatus) -> list[str]:
        """Close the open item with `status`; an answer with no item gets an empty message."""
        if not self.items:
            return self._open_message() + self._close(status)
        return self._close(status)

    def _open_message(self) -> list[str]:
        events = self._add(OutputMessage(id=_item_id("msg"), status="in_progress", content=[]))
        events.append(
            self._delta("response.content_part.added", content_index=0, part=OutputText(text=""))
        )
        return events

    def _add(self, item: OutputItem) -> list[str]:
        self._open, self._text = item, []
        self.items.append(item)
        return [
            self.event("response.output_item.added", output_index=len(self.items) - 1, item=item)
        ]

    def _delta(self, kind: str, **fields: Any) -> str:
        assert self._open is not None
        return self.event(kind, item_id=self._open.id, output_index=len(self.items) - 1, **fields)

    def _close(self, status: ItemStatus) -> list[str]:
        item, text = self._open, "".join(self._text)
        if item is None:
            return []
        events = []
        if isinstance(item, OutputMessage):
            part = OutputText(text=text)
            events.append(
                self._delta("response.output_text.done", content_index=0, text=text, logprobs=[])
            )
            events.append(self._delta("response.content_part.done", content_index=0, part=part))
            item.content = [part]
        else:
            item.arguments = text
            events.append(
                self._delta("response.function_call_arguments.done", name=item.name, arguments=text)
            )
        item.status = status
        events.append(
            self.event("response.output_item.done", output_index=len(self.items) - 1, item=item)
        )
        self._open, self._text = None, []
        return events
