"""Turn an OpenAI chat request into what the engine takes, refusing what it cannot honour.

Every refusal names the parameter, so a developer sees at once which field to drop; nothing a
client asked for is silently ignored.
"""

from __future__ import annotations

from api.engine.protocol import ChatMessage, SamplingParams
from api.errors import invalid_request, unsupported_parameter
from api.protocol import ChatCompletionRequest, Message
from api.serving import tools

ROLE_ALIASES = {"developer": "system"}


def refuse_unsupported(request: ChatCompletionRequest, *, max_n: int, max_messages: int) -> None:
    if request.audio is not None or (request.modalities and request.modalities != ["text"]):
        raise unsupported_parameter("modalities", "only text output is supported.")
    if request.prediction is not None:
        raise unsupported_parameter("prediction", "is not supported by this service.")
    if request.n > max_n:
        raise invalid_request(f"'n' must be at most {max_n} on this service.", "n", "invalid_value")
    if len(request.messages) > max_messages:
        raise invalid_request(
            f"At most {max_messages} messages are allowed per request.", "messages"
        )
    if request.top_logprobs and not request.logprobs:
        raise invalid_request(
            "'top_logprobs' requires 'logprobs' to be true.", "top_logprobs", "invalid_value"
        )
    if request.stream_options is not None and not request.stream:
        raise invalid_request(
            "'stream_options' is only allowed when 'stream' is true.", "stream_options"
        )


def chat_messages(request: ChatCompletionRequest) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for index, message in enumerate(request.messages):
        messages.append(_message(index, message, messages))
    return messages


def _message(index: int, message: Message, earlier: list[ChatMessage]) -> ChatMessage:
    if message.role == "function":
        raise unsupported_parameter(
            f"messages[{index}].role",
            "'function' is deprecated and not supported: answer calls with role 'tool'.",
        )
    if message.role == "tool":
        return tools.tool_result(index, message, _text(index, message), earlier)
    calls = tools.assistant_calls(index, message) if message.role == "assistant" else ()
    return ChatMessage(
        role=ROLE_ALIASES.get(message.role, message.role),
        content=_text(index, message),
        tool_calls=calls,
    )


def _text(index: int, message: Message) -> str:
    if message.content is None:
        if message.role == "assistant":
            return ""
        raise invalid_request(
            f"messages[{index}].content must be a string or a list of text parts.",
            f"messages[{index}].content",
        )
    if isinstance(message.content, str):
        return _clean(index, message.content)
    texts = []
    for part_index, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise unsupported_parameter(
                f"messages[{index}].content[{part_index}]",
                f"of type '{part.type}' is not supported: only text parts are.",
            )
        texts.append(_clean(index, part.text))
    return "".join(texts)


def _clean(index: int, text: str) -> str:
    if "\x00" in text:
        raise invalid_request(
            f"messages[{index}].content contains a NUL character.", f"messages[{index}].content"
        )
    if not _is_utf8(text):  # JSON's "\ud800" escapes decode to lone surrogates
        raise invalid_request(
            f"messages[{index}].content is not valid Unicode (a lone surrogate).",
            f"messages[{index}].content",
        )
    return text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def stop_strings(request: ChatCompletionRequest) -> tuple[str, ...]:
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if any(not stop for stop in stops):
        raise invalid_request("Stop sequences must not be empty.", "stop", "invalid_value")
    if not all(_is_utf8(stop) for stop in stops):
        raise invalid_request("Stop sequences must be valid Unicode.", "stop", "invalid_value")
    return tuple(stops)


def sampling_params(
    request: ChatCompletionRequest, *, max_tokens: int, choice: int, plan: tools.ToolPlan
) -> SamplingParams:
    """Each choice gets its own seed (seed + index), so n choices differ yet stay reproducible.
    OpenAI's seeds are signed 64-bit; the sampler's generator takes unsigned ones."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k or 0,
        seed=None if request.seed is None else (request.seed + choice) % 2**64,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        stop=stop_strings(request),
        logprobs=request.logprobs,
        top_logprobs=request.top_logprobs or 0,
        constraint=plan.constraint,
        logit_bias=plan.logit_bias,
    )


def requested_max_tokens(
    request: ChatCompletionRequest, default: int, *, room: int, clamp: bool = False
) -> int:
    """The completion's limit: the client's, which must fit the `room` the prompt leaves in
    the context window (a 400 naming it, as OpenAI answers; cut to the room where `clamp`,
    as Anthropic does), else the default, capped."""
    for param in ("max_completion_tokens", "max_tokens"):
        asked = getattr(request, param)
        if asked is not None:
            if asked > room and clamp:
                return room
            if asked > room:
                raise invalid_request(
                    f"'{param}' is {asked}, but the prompt leaves room for at most {room} "
                    "completion tokens in this model's context window.",
                    param,
                    "context_length_exceeded",
                )
            return int(asked)
    return min(default, room)
