"""Anthropic's Messages in and out of the chat path: a Messages request read into the chat
request that serves it (system blocks, content blocks, tools, tool_choice), and the answer
written as content blocks, whole or as Anthropic's stream events (`MessageBlocks`).

Claude Code opens `system` with a per-request attribution line (`x-anthropic-billing-header:
...`); it is left out of the prompt, as vLLM does, so that a session's next request starts from
the prefix cache instead of prefilling everything after a line that changed.

A NUL character, which the chat path refuses in what a client writes, reads as U+FFFD here: an
agent sends back what a model wrote and what its tools read (a binary file), and one such
character must not end its session with a 400.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_json

from api.engine.protocol import GenerationOutput
from api.errors import invalid_request
from api.protocol import ChatCompletionRequest, DeltaToolCall
from api.protocol_anthropic import (
    ContentBlock,
    CountTokensRequest,
    InputMessage,
    MessagesRequest,
    OutputBlock,
    StopReason,
    TextBlock,
    ToolUseBlock,
)
from api.serving.tools import StreamedCalls, delta_calls

ATTRIBUTION_PREFIX = "x-anthropic-billing-header:"
IGNORED_BLOCKS = ("thinking", "redacted_thinking")  # a model here neither reads nor writes them
MEDIA_BLOCKS = ("image", "document")
_ID_ALPHABET = string.ascii_letters + string.digits


# ---- requests in ---------------------------------------------------------------------------


def to_chat(request: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that serves `request` (or counts its prompt, for count_tokens)."""
    messages: list[dict[str, Any]] = []
    system = _system(request.system)
    if system:
        messages.append({"role": "system", "content": system})
    for index, message in enumerate(request.messages):
        messages.extend(_messages(index, message))
    if not messages:
        raise invalid_request("messages: at least one message is required.", "messages")
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "tools": _tools(request) or None,
        "tool_choice": _tool_choice(request),
    }
    if request.tool_choice is not None and request.tool_choice.disable_parallel_tool_use:
        body["parallel_tool_calls"] = False
    if isinstance(request, MessagesRequest):
        body.update(
            max_tokens=request.max_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k,
            stop=request.stop_sequences or None,
            stream=request.stream,
        )
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"])
        param = "stop_sequences" if param.startswith("stop") else param
        raise invalid_request(f"{param}: {first['msg']}", param, "invalid_value") from None


def _system(system: str | list[ContentBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return _clean(system or "")
    texts = []
    for index, block in enumerate(system):
        if block.type != "text" or block.text is None:
            raise invalid_request(
                f"system[{index}]: only text blocks are allowed in 'system'.", f"system[{index}]"
            )
        if not block.text.startswith(ATTRIBUTION_PREFIX):
            texts.append(_clean(block.text))
    return "\n".join(texts)


def _messages(index: int, message: InputMessage) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user turn's tool results become `tool`
    messages (before its text, as Anthropic orders them), an assistant turn's `tool_use`
    blocks its `tool_calls`."""
    where = f"messages[{index}]"
    if message.role not in ("user", "assistant", "system"):
        raise invalid_request(
            f"{where}.role: '{message.role}' is not one of 'user', 'assistant'.", f"{where}.role"
        )
    if isinstance(message.content, str):
        return [{"role": message.role, "content": _clean(message.content)}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for part, block in enumerate(message.content):
        at = f"{where}.content[{part}]"
        if block.type == "text" and block.text is not None:
            texts.append(_clean(block.text))
        elif block.type == "tool_use" and message.role == "assistant":
            calls.append(_call(block, at))
        elif block.type == "tool_result" and message.role == "user":
            results.append(_result(block, at))
        elif block.type in MEDIA_BLOCKS:
            raise _media(block, at)
        elif block.type not in IGNORED_BLOCKS:
            raise invalid_request(
                f"{at}: a block of type '{block.type}' is not supported in a "
                f"{message.role} message.",
                at,
            )
    out = list(results)
    if message.role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    elif texts or not results:
        out.append({"role": message.role, "content": "\n".join(texts)})
    return out


def _call(block: ContentBlock, at: str) -> dict[str, Any]:
    if not block.id or not block.name:
        raise invalid_request(f"{at}: a tool_use block needs 'id' and 'name'.", at)
    arguments = json.dumps(block.input or {}, ensure_ascii=False)
    return {
        "id": block.id,
        "type": "function",
        "function": {"name": block.name, "arguments": arguments},
    }


def _result(block: ContentBlock, at: str) -> dict[str, Any]:
    if not block.tool_use_id:
        raise invalid_request(f"{at}: a tool_result block needs 'tool_use_id'.", at)
    content = block.content
    if isinstance(content, list):
        texts = []
        for part, inner in enumerate(content):
            if inner.type in MEDIA_BLOCKS:
                raise _media(inner, f"{at}.content[{part}]")
            if inner.type != "text" or inner.text is None:
                raise invalid_request(
                    f"{at}.content[{part}]: a tool result holds text blocks.", f"{at}.content"
                )
            texts.append(inner.text)
        content = "\n".join(texts)
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": _clean(content or "")}


def _clean(text: str) -> str:
    return text.replace("\x00", "\ufffd")


def _media(block: ContentBlock, at: str) -> Exception:
    return invalid_request(
        f"{at}: this model takes text only; '{block.type}' blocks are not supported.", at
    )


def _tools(request: CountTokensRequest) -> list[dict[str, Any]]:
    tools = []
    for index, tool in enumerate(request.tools or []):
        if tool.type not in (None, "custom"):
            raise invalid_request(
                f"tools[{index}]: the server tool '{tool.type}' is not available on this "
                "service; only client tools (with 'input_schema') are.",
                f"tools[{index}].type",
            )
        function = {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.input_schema or {"type": "object"},
        }
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(request: CountTokensRequest) -> str | dict[str, Any] | None:
    choice = request.tool_choice
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise invalid_request("tool_choice.name: required for type 'tool'.", "tool_choice")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


# ---- answers out ---------------------------------------------------------------------------


def tool_use_id() -> str:
    return "toolu_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def event(kind: str, **fields: Any) -> str:
    """One SSE event; pydantic models among `fields` are written as their JSON."""
    return f"event: {kind}\ndata: {to_json({'type': kind, **fields}).decode()}\n\n"


def text_delta(index: int, text: str) -> str:
    """The event of one token's text, written without building a dict: a stream sends one a
    token (the chat path's `ChunkEvents.content` does the same for its chunks)."""
    return (
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
        f'{index},"delta":{{"type":"text_delta","text":{to_json(text).decode()}}}}}\n\n'
    )


PING_EVENT = event("ping")


@dataclass
class MessageBlocks:
    """One answer's content blocks as they are made, and the stream events that make them: a
    text block is opened by its first text, a tool_use block by its call's start, and each is
    stopped when the next opens or the answer ends. A whole answer is the same blocks with the
    events thrown away, so the two cannot disagree."""

    calls: StreamedCalls | None  # parse tool calls out of the text, where tools are offered
    blocks: list[OutputBlock] = field(default_factory=list)
    finish_reason: str = "length"  # until the engine says it finished
    stop_sequence: str | None = None
    _open: type[TextBlock] | type[ToolUseBlock] | None = None
    _pieces: list[str] = field(default_factory=list)  # the open block's text or arguments

    def feed(self, output: GenerationOutput) -> list[str]:
        """Events for one engine output: its text, its calls (parsed, or an upstream's own)."""
        if output.finished:
            self.finish_reason = output.finish_reason or "stop"
            self.stop_sequence = output.stop_sequence
        if self.calls is None and not output.tool_calls:  # plain text: one event a token
            if not output.text:
                return []
            if self._open is TextBlock:
                self._pieces.append(output.text)
                return [text_delta(len(self.blocks) - 1, output.text)]
            content, deltas = output.text, list[DeltaToolCall]()
        elif self.calls is None:
            content, deltas = output.text, delta_calls(output.tool_calls)
        else:
            content, deltas = self.calls.feed(output.text, finished=output.finished)
            deltas += delta_calls(output.tool_calls)
        events = []
        if content:
            if self._open is not TextBlock:
                events += self._stop()
                events += self._start(TextBlock(text=""))
            self._pieces.append(content)
            events.append(text_delta(len(self.blocks) - 1, content))
        for call in deltas:
            if call.id is not None:  # a call starts
                events += self._stop()
                name = call.function.name if call.function and call.function.name else ""
                events += self._start(ToolUseBlock(id=tool_use_id(), name=name, input={}))
            arguments = call.function.arguments if call.function else None
            if arguments and self._open is ToolUseBlock:
                self._pieces.append(arguments)
                delta = {"type": "input_json_delta", "partial_json": arguments}
                events.append(event("content_block_delta", index=len(self.blocks) - 1, delta=delta))
        return events

    def finish(self) -> list[str]:
        """Stop the open block."""
        return self._stop()

    @property
    def stop_reason(self) -> StopReason:
        if self.finish_reason == "length":
            return "max_tokens"
        if self.stop_sequence is not None:
            return "stop_sequence"
        if any(isinstance(block, ToolUseBlock) for block in self.blocks):
            return "tool_use"
        return "end_turn"

    def _start(self, block: OutputBlock) -> list[str]:
        self.blocks.append(block)
        self._open, self._pieces = type(block), []
        return [event("content_block_start", index=len(self.blocks) - 1, content_block=block)]

    def _stop(self) -> list[str]:
        """Close the open block: its text, or its arguments read as its `input`."""
        if self._open is None:
            return []
        block = self.blocks[-1]
        if isinstance(block, ToolUseBlock):
            block.input = _input(self._pieces)
        else:
            block.text = "".join(self._pieces)
        self._open, self._pieces = None, []
        return [event("content_block_stop", index=len(self.blocks) - 1)]


def _input(arguments: Sequence[str]) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is; a call cut short by
    `max_tokens` is not valid JSON yet, and stands as an empty object."""
    try:
        value = json.loads("".join(arguments))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
