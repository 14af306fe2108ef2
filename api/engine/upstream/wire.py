"""The OpenAI wire format as spoken to an upstream: request bodies, streamed chunks, errors.

Plain dicts on purpose: upstreams add fields of their own (vLLM's `max_model_len`, SGLang's
`meta_info`), and only the few read here matter.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic_core import from_json

from api.engine.protocol import (
    ChatMessage,
    GenerationRequest,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)

# Added to the UTF-8 length of a ChatML rendering when no tokenizer counts the prompt. Every
# token of a byte-level or byte-fallback vocabulary covers at least one byte, ChatML's markers
# (~30 bytes a message) exceed the few tokens other templates add per message, and this covers
# a template's default system prompt (Qwen's and Llama 3's take 20-30 tokens).
PROMPT_BOUND_MARGIN = 128


def prompt_bound(messages: Sequence[ChatMessage]) -> int:
    """Prompt tokens an upstream can count at most for `messages`, without its tokenizer."""
    rendered = "".join(
        f"<|im_start|>{m.role}\n{json.dumps(_message(m), ensure_ascii=False)}<|im_end|>\n"
        for m in messages
    )
    return len((rendered + "<|im_start|>assistant\n").encode("utf-8")) + PROMPT_BOUND_MARGIN


def request_body(request: GenerationRequest, model: str) -> dict[str, Any]:
    """The chat completion request for one choice (`n` choices go as n requests, so each is one
    stream with its own seed and its own usage)."""
    params = request.params
    body: dict[str, Any] = {
        "model": model,
        "messages": [_message(message) for message in request.messages],
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": request.stream,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    if params.top_k:
        body["top_k"] = params.top_k
    if params.seed is not None:
        body["seed"] = params.seed - 2**64 if params.seed >= 2**63 else params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.presence_penalty:
        body["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        body["frequency_penalty"] = params.frequency_penalty
    if params.logprobs:
        body["logprobs"] = True
        if params.top_logprobs:
            body["top_logprobs"] = params.top_logprobs
    body.update(request.extra)
    return body


def _message(message: ChatMessage) -> dict[str, Any]:
    """A message as OpenAI's API takes it: an assistant's calls with `content` null where it
    wrote none, a tool result with its `tool_call_id` (and no `name`, which OpenAI's tool
    messages do not have)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


@dataclass
class Piece:
    """What one upstream chunk (or a whole non-streamed answer) carried."""

    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_tokens: int | None = None  # the upstream's usage, where it sent one
    completion_tokens: int | None = None
    error: str | None = None  # an error event in the stream
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # as sent: fragments or whole


def parse_chunk(data: str | bytes) -> Piece:
    """One `data:` payload of a stream (raises ValueError on one that is not JSON)."""
    try:
        document = from_json(data)  # a third of `json.loads`' time, once a streamed token
    except ValueError:  # or what only `json` takes: a lone surrogate's escape
        document = json.loads(data)
    if not isinstance(document, dict):
        raise ValueError("a chunk is not a JSON object")
    if "error" in document:
        return Piece(error=error_message(document))
    piece = _usage(document)
    for choice in document.get("choices") or []:
        delta = choice.get("delta") or {}
        piece.text += delta.get("content") or ""
        if calls := delta.get("tool_calls"):
            piece.tool_calls += _tool_calls(calls, streamed=True)
        piece.finish_reason = choice.get("finish_reason") or piece.finish_reason
        logprobs = choice.get("logprobs")
        piece.logprobs = _logprobs(logprobs) if logprobs else None
    return piece


def parse_completion(document: dict[str, Any]) -> Piece:
    """A non-streamed answer."""
    piece = _usage(document)
    for choice in document.get("choices") or []:
        message = choice.get("message") or {}
        piece.text += message.get("content") or ""
        piece.tool_calls += _tool_calls(message.get("tool_calls"), streamed=False)
        piece.finish_reason = choice.get("finish_reason") or piece.finish_reason
        piece.logprobs = _logprobs(choice.get("logprobs"))
    return piece


def _tool_calls(raw: Any, *, streamed: bool) -> list[ToolCallDelta]:
    """`delta.tool_calls` fragments (each with its `index`), or a message's whole calls (their
    position is the index). Anything that is not a call is skipped."""
    if not isinstance(raw, list):
        return []
    calls = []
    for position, call in enumerate(raw):
        if not isinstance(call, dict):
            continue
        function: dict[str, Any] = call.get("function") or {}
        if not isinstance(function, dict):
            function = {}
        index = call.get("index") if streamed else position
        name, arguments, call_id = function.get("name"), function.get("arguments"), call.get("id")
        calls.append(
            ToolCallDelta(
                index=index if isinstance(index, int) else position,
                arguments=arguments if isinstance(arguments, str) else "",
                id=call_id if isinstance(call_id, str) and call_id else None,
                name=name if isinstance(name, str) and name else None,
            )
        )
    return calls


def _usage(document: dict[str, Any]) -> Piece:
    usage = document.get("usage") or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return Piece(prompt_tokens=prompt, completion_tokens=completion)
    return Piece()


def _logprobs(raw: Any) -> list[TokenLogprob] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("content"), list):
        return None
    return [
        TokenLogprob(
            token=item.get("token", ""),
            logprob=float(item.get("logprob", 0.0)),
            bytes=list(item.get("bytes") or []),
            top_logprobs=[
                TopLogprob(
                    token=top.get("token", ""),
                    logprob=float(top.get("logprob", 0.0)),
                    bytes=list(top.get("bytes") or []),
                )
                for top in item.get("top_logprobs") or []
            ],
        )
        for item in raw["content"]
    ]


def error_message(document: Any) -> str:
    """The message of an error body: OpenAI's `{"error": {...}}`, vLLM's `{"message": ...}`,
    FastAPI's `{"detail": ...}`."""
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if isinstance(document.get(key), str):
                return document[key]
        if document.get("detail") is not None:
            return json.dumps(document["detail"])[:500]
    return "The upstream server refused the request."


def error_fields(document: Any) -> tuple[str | None, str | None]:
    """`(param, code)` of an OpenAI-shaped error body, where it has them."""
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        return None, None
    param, code = error.get("param"), error.get("code")
    return (
        param if isinstance(param, str) else None,
        code if isinstance(code, str) else None,
    )


# -- embeddings ----------------------------------------------------------------------------------


def embeddings_body(model: str, inputs: Sequence[str] | Sequence[Sequence[int]]) -> dict[str, Any]:
    """One upstream embeddings request: texts as texts (llama-cpp-python takes no token ids),
    token ids as ids, vectors asked for as floats (what every server speaks); `dimensions` is
    applied by the caller, not sent (TEI and most models have no use for it)."""
    return {
        "model": model,
        "input": [text if isinstance(text, str) else list(text) for text in inputs],
        "encoding_format": "float",
    }


def parse_embeddings(document: Any, count: int) -> tuple[np.ndarray, int | None]:
    """An embeddings answer's `count` vectors in input order (floats, or base64 of little-endian
    float32 where a server sends that anyway) and its `usage.prompt_tokens` where it reports a
    positive one. ValueError for an answer of another shape."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list) or len(data) != count:
        raise ValueError(f"an embeddings answer without {count} vectors")
    rows: dict[int, np.ndarray] = {}
    for position, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError("an embeddings answer whose data are not objects")
        index, raw = item.get("index", position), item.get("embedding")
        if not isinstance(index, int) or not 0 <= index < count or index in rows:
            raise ValueError("an embeddings answer with a wrong or repeated index")
        if isinstance(raw, str):
            rows[index] = np.frombuffer(base64.b64decode(raw), dtype="<f4")
        elif isinstance(raw, list):
            rows[index] = np.asarray(raw, dtype=np.float32)  # a token's vectors fail below
        else:
            raise ValueError("an embeddings answer with a vector that is not one")
    ordered = [rows[index] for index in range(count)]
    width = ordered[0].size
    if not width or any(row.ndim != 1 or row.size != width for row in ordered):
        raise ValueError("an embeddings answer whose vectors are not one width")
    usage = document.get("usage")
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    reported = prompt if isinstance(prompt, int) and prompt > 0 else None
    return np.stack(ordered).astype(np.float32, copy=False), reported
