"""Anthropic's Messages API on the wire: the request, the message, its content blocks, usage,
stream events, token counts, models and errors.

Kept beside `api/protocol.py` (Chat Completions) and `api/protocol_responses.py`: the shapes
are Anthropic's own. Requests ignore unknown fields (Claude Code sends `context_management`,
`output_config` and betas this service has no use for) and check the JSON types of known
ones. Content blocks are one lenient model read by their `type`, so a bad block is a 400 naming
`messages[i].content[j]`, not a validation error listing every member of a union.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ContentBlock(_Lenient):
    """`text`, `image`, `document`, `tool_use`, `tool_result`, `thinking`, ... by `type`."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None  # tool_result
    is_error: bool | None = None  # tool_result
    source: dict[str, Any] | None = None  # image, document


class InputMessage(_Lenient):
    role: str
    content: str | list[ContentBlock]


class ToolDefinition(_Lenient):
    """A client tool (`type` left out or "custom"); any other `type` is one of Anthropic's
    server tools (web search, code execution), which this service does not run."""

    name: str = Field(min_length=1, max_length=128)
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(_Lenient):
    """The body of `/v1/messages/count_tokens`: a Messages request without `max_tokens`."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None  # accepted: a model that does not think answers


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


OutputBlock = TextBlock | ToolUseBlock
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(BaseModel):
    """Anthropic counts the prompt in three parts that add up to it: `input_tokens` computed,
    `cache_read_input_tokens` read from the prefix cache, `cache_creation_input_tokens`
    written to it (none here: the cache keeps what it computed without a charge of its own)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[OutputBlock]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: Usage


class TokenCount(BaseModel):
    input_tokens: int


class ModelInfo(BaseModel):
    type: Literal["model"] = "model"
    id: str
    display_name: str
    created_at: str  # RFC 3339


class ModelList(BaseModel):
    data: list[ModelInfo]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class ErrorBody(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorBody
    request_id: str | None = None
