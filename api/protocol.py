"""OpenAI's wire format: every request, response, chunk and error the API speaks, in one place.

Requests accept what OpenAI accepts and ignore unknown fields, as OpenAI does. Fields this
service cannot honour are declared so they can be refused by name (`serving/chat.py`), never
silently dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)


class _Lenient(BaseModel):
    """Unknown fields are ignored, as OpenAI does; known ones must have their JSON type
    (strict), so `"max_tokens": true` or `"logprobs": "yes"` is a 400, not a silent 1 or True."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Lenient):
    type: str
    text: str | None = None


class FunctionCall(_Lenient):
    """A call as OpenAI writes it: `arguments` is JSON text (the model's, not yet validated)."""

    name: str
    arguments: str


class ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this message answers
    function_call: FunctionCall | None = None  # legacy assistant call (`functions`)


class FunctionDefinition(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of the arguments object
    strict: bool | None = None


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Lenient):
    include_usage: bool = False


class ChatCompletionRequest(_Lenient):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)  # vLLM's and llama.cpp's extension; 0: off
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # OpenAI's int64
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[FunctionDefinition] | None = None  # legacy: refused by name
    function_call: Literal["none", "auto"] | NamedFunction | None = None  # legacy `tool_choice`
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, float] | None = None
    # Declared only to be refused by name: this service cannot honour them.
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return value


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens read from the prefix cache instead of computed


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None  # left out when the answer made no call

    @model_serializer(mode="wrap")
    def _drop_no_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("tool_calls") is None:
            out.pop("tool_calls", None)
        return out


FinishReason = Literal["stop", "length", "tool_calls"]


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None


class _SparseModel(BaseModel):
    """Only the fields that are set are sent, as OpenAI's stream does."""

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaFunction(_SparseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_SparseModel):
    """A call's first delta has its id, type and name; the next ones argument fragments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction | None = None


class Delta(_SparseModel):
    """Only the fields that changed are sent, as OpenAI does (`{}` on the last chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tokenshop"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class KeyLimits(BaseModel):
    """A key's own limits (docs/keys.md); null or empty: that limit is off."""

    spend_limit: int | None = None  # tokens per `period`
    period: Literal["daily", "weekly", "monthly", "total"] = "total"
    expires_at: int | None = None  # Unix seconds
    models: list[str] = []
    rpm: int | None = None
    tpm: int | None = None


class KeySpend(BaseModel):
    """What the key has spent against its limit this period."""

    period: Literal["daily", "weekly", "monthly", "total"]
    spent_tokens: int  # billed this period
    held_tokens: int  # reserved by the key's requests running now
    remaining_tokens: int | None  # null: no spend limit (the balance is the limit)
    period_start: int | None  # Unix seconds; null for "total"
    resets_at: int | None  # Unix seconds; null for "total", which never resets


class KeyInfo(BaseModel):
    """`GET /v1/key`: what the caller's key has left."""

    object: Literal["key"] = "key"
    key: str  # masked
    available_tokens: int
    held_tokens: int
    purchased_tokens: int
    granted_tokens: int
    used_tokens: int
    refunded_tokens: int
    # the calling key's own figures (the ones above are the account's, all keys together)
    key_name: str | None = None
    key_requests: int = 0
    key_used_tokens: int = 0
    id: int | None = None  # the key's id: what `tokenshop keys limit --key-id` takes
    limits: KeyLimits | None = None
    spend: KeySpend | None = None


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
