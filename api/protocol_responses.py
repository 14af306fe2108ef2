"""OpenAI's Responses API on the wire: the request, the response object, its items and usage.

Kept beside `api/protocol.py` (Chat Completions) rather than inside it: the two front doors
share no model, and the Responses shapes are about as long again. Requests ignore unknown
fields and check the JSON types of known ones, as `protocol._Lenient` does; fields this
service cannot honour are declared so `serving/responses.py` refuses them by name. Input items
are one lenient model read by their `type`, so a bad item is a 400 naming `input[i]`, not a
validation error listing every member of a union.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ContentPart(_Lenient):
    """`input_text` (and `output_text` / `refusal` of an assistant turn sent back)."""

    type: str
    text: str | None = None
    refusal: str | None = None


class InputItem(_Lenient):
    """A message (`type` "message" or left out), a `function_call`, a `function_call_output`.
    Output items of an earlier response read as input items unchanged."""

    type: str | None = None
    role: str | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    id: str | None = None
    status: str | None = None


class FunctionTool(_Lenient):
    """A function tool, flat as the Responses API writes it (no `function` wrapper). Other
    `type`s are built-in tools (web search, file search, ...), refused by name."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceObject(_Lenient):
    type: str
    name: str | None = None


class TextFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(_Lenient):
    model: str = Field(min_length=1)
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceObject | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None  # effort for reasoning models; ours do not reason
    truncation: Literal["auto", "disabled"] | None = None
    # Declared only to be refused by name: this service cannot honour them.
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = OutputMessage | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # input tokens read from the prefix cache (billed alike)


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


ResponseStatus = Literal["completed", "incomplete", "in_progress", "failed"]


class ResponseObject(BaseModel):
    """OpenAI's `Response`; the request's settings are echoed as OpenAI echoes them."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    store: bool = True
    temperature: float = 1.0
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float = 1.0
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True
