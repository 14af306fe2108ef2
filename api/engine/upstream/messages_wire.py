"""Anthropic's Messages API as spoken to an upstream that serves it (`messages_api = true` in
the models file): the client's request sent on as it came, and the answer read back into the
same `wire.Piece`s a chat completion gives, so billing and failover are the chat path's.

The request body is the client's own (`GenerationRequest.extra[NATIVE]`, put there by the
serving layer), with `model` the upstream's, `max_tokens` the one the hold covers and `stream`
as asked. Usage is the upstream's: its three input figures added up are the prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import from_json

from api.engine.protocol import NATIVE_MESSAGES as NATIVE
from api.engine.protocol import GenerationRequest, ToolCallDelta
from api.engine.upstream.wire import Piece, error_message

FINISH = {
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "model_context_window_exceeded": "length",
}


def request_body(request: GenerationRequest, model: str) -> dict[str, Any]:
    body = dict(request.extra[NATIVE])
    body.update(model=model, max_tokens=request.params.max_tokens, stream=request.stream)
    return body


def prompt_tokens(usage: dict[str, Any]) -> int:
    return sum(
        int(usage.get(name) or 0)
        for name in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )


def parse_message(document: dict[str, Any]) -> Piece:
    """A non-streamed message: its text, its tool_use blocks as whole calls, its usage."""
    piece = Piece(finish_reason=_finish(document.get("stop_reason")))
    calls = 0
    for block in document.get("content") or []:
        if block.get("type") == "text":
            piece.text += block.get("text") or ""
        elif block.get("type") == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            piece.tool_calls.append(
                ToolCallDelta(calls, arguments, id=block.get("id"), name=block.get("name"))
            )
            calls += 1
    usage = document.get("usage") or {}
    piece.prompt_tokens = prompt_tokens(usage)
    piece.completion_tokens = int(usage.get("output_tokens") or 0)
    return piece


@dataclass
class EventReader:
    """One stream's events, each read into a `Piece`: the state carried between them is which
    content block is which tool call, and the prompt's usage from `message_start`, reported
    with the output's in `message_delta`."""

    prompt: int | None = None
    calls: dict[int, int] = field(default_factory=dict)  # content block index -> call index

    def parse(self, data: str | bytes) -> Piece:
        try:
            event = from_json(data)
        except ValueError:
            event = json.loads(data)
        if not isinstance(event, dict):
            raise ValueError("an event is not a JSON object")
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                return Piece(text=delta.get("text") or "")
            index = self.calls.get(event.get("index", -1))
            if delta.get("type") == "input_json_delta" and index is not None:
                return Piece(tool_calls=[ToolCallDelta(index, delta.get("partial_json") or "")])
            return Piece()  # thinking: a model here shows none of it
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "text" and block.get("text"):
                return Piece(text=block["text"])
            if block.get("type") == "tool_use":
                index = self.calls[event.get("index", -1)] = len(self.calls)
                call = ToolCallDelta(index, "", id=block.get("id"), name=block.get("name"))
                return Piece(tool_calls=[call])
            return Piece()
        if kind == "message_start":
            usage = (event.get("message") or {}).get("usage") or {}
            self.prompt = prompt_tokens(usage)
            return Piece()
        if kind == "message_delta":
            usage = event.get("usage") or {}
            prompt = prompt_tokens(usage) or self.prompt or 0
            return Piece(
                finish_reason=_finish((event.get("delta") or {}).get("stop_reason")),
                prompt_tokens=prompt,
                completion_tokens=int(usage.get("output_tokens") or 0),
            )
        if kind == "error":
            return Piece(error=error_message(event))
        return Piece()  # ping, content_block_stop, message_stop


def _finish(stop_reason: Any) -> str:
    return FINISH.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"
