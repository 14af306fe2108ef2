"""A small OpenAI-compatible upstream that fails on purpose, run as its own process so a test
can kill it mid-answer: `python -m tests.fake_upstream --port N`.

Each answer is `max_tokens` words ("w0 w1 ..."), one chunk a word, sent `--delay` seconds apart,
ending "length". Its usage: prompt tokens = the words of every message plus 4 a message (a
count below any byte-length bound), completion tokens = words sent. `POST /_mode` picks the
next answers' fault:

- `ok`: streams honour `stream_options.include_usage`, non-streamed answers carry usage;
- `no_usage`: no usage anywhere;
- `status_500`, `status_400`: that status before anything (400 names the field `temperature`);
- `stall`: headers, then nothing;
- `cut`: the connection drops after `--cut-after` words.

With `tools` (and `tool_choice` not "none") it calls them instead: the function `tool_choice`
names, else both of the first two under "required" with `parallel_tool_calls` not false, else
the first, each with `call_arguments(name)`; streamed as OpenAI does (id, type and name in a
call's first delta, then its arguments in `ARGUMENT_PIECE`-character fragments, one chunk
each), finishing "tool_calls"; completion tokens = chunks sent. A conversation ending in a tool
result is answered "got <its content>", finishing "stop".

`POST /v1/embeddings` answers each input with an 8-wide vector made from its text (`data` in
reverse order, each with its `index`), in base64 when asked; its usage is the inputs' words
(`no_usage`: none), and it shares the faults `status_500` and `status_400` (which names
`input`). `_state` counts these requests in `embeddings` and keeps the last body.

`GET /_state` says how many answers started, are streaming now and were left by their client.
It checks `Authorization: Bearer $FAKE_UPSTREAM_KEY` when that variable is set.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import struct
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

STATE: dict[str, Any] = {
    "mode": "ok",
    "started": 0,
    "streaming": 0,
    "left": 0,
    "embeddings": 0,
    "bodies": [],
}
OPTIONS: dict[str, Any] = {"delay": 0.01, "cut_after": 3}


def prompt_tokens(body: dict[str, Any]) -> int:
    return sum(len(str(m.get("content") or "").split()) + 4 for m in body["messages"])


ARGUMENT_PIECE = 7


def call_arguments(name: str) -> str:
    return json.dumps({"city": "Paris", "function": name, "unit": "celsius"})


def chosen_tools(body: dict[str, Any]) -> list[str]:
    """The functions this answer calls (none: it answers with text)."""
    tools = [tool["function"]["name"] for tool in body.get("tools") or []]
    choice = body.get("tool_choice")
    if not tools or choice == "none" or body["messages"][-1]["role"] == "tool":
        return []
    if isinstance(choice, dict):
        return [choice["function"]["name"]]
    if choice == "required" and body.get("parallel_tool_calls") is not False:
        return tools[:2]
    return tools[:1]


def call_deltas(names: list[str]) -> list[dict[str, Any]]:
    """Each call's `delta.tool_calls` entries, one a chunk."""
    deltas: list[dict[str, Any]] = []
    for index, name in enumerate(names):
        deltas.append(
            {
                "index": index,
                "id": f"call_fake{index}",
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
        )
        text = call_arguments(name)
        for start in range(0, len(text), ARGUMENT_PIECE):
            piece = text[start : start + ARGUMENT_PIECE]
            deltas.append({"index": index, "function": {"arguments": piece}})
    return deltas


def chunk(
    content: str | None,
    finish: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> str:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    choices = (
        []
        if content is None and finish is None and tool_calls is None
        else [{"index": 0, "delta": delta, "finish_reason": finish}]
    )
    payload = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": choices,
        **extra,
    }
    return f"data: {json.dumps(payload)}\n\n"


async def completions(request: Request) -> Response:
    key = os.environ.get("FAKE_UPSTREAM_KEY")
    if key and request.headers.get("authorization") != f"Bearer {key}":
        return JSONResponse({"error": {"message": "bad key", "type": "auth"}}, status_code=401)
    body = await request.json()
    STATE["bodies"].append(body)
    STATE["started"] += 1
    mode = STATE["mode"]
    if mode == "status_500":
        return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
    if mode == "status_400":
        return JSONResponse(
            {
                "error": {
                    "message": "temperature is not supported by this upstream",
                    "type": "invalid_request_error",
                    "param": "temperature",
                    "code": "unsupported",
                }
            },
            status_code=400,
        )
    words = [f"w{i}" for i in range(body.get("max_tokens") or 16)]
    finish = "length"
    calls = chosen_tools(body)
    last = body["messages"][-1]
    if calls:
        finish = "tool_calls"
    elif body.get("tools") and last["role"] == "tool":
        words, finish = ["got", str(last["content"])], "stop"
    sent = len(call_deltas(calls)) if calls else len(words)
    usage = {
        "prompt_tokens": prompt_tokens(body),
        "completion_tokens": sent,
        "total_tokens": prompt_tokens(body) + sent,
    }
    if not body.get("stream") and calls:
        await asyncio.sleep(OPTIONS["delay"])
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_fake{index}",
                    "type": "function",
                    "function": {"name": name, "arguments": call_arguments(name)},
                }
                for index, name in enumerate(calls)
            ],
        }
        answer = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": "fake",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": message}],
        }
        if mode != "no_usage":
            answer["usage"] = usage
        return JSONResponse(answer)
    if not body.get("stream"):
        await asyncio.sleep(OPTIONS["delay"] * len(words))
        answer = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "message": {"role": "assistant", "content": " ".join(words)},
                }
            ],
        }
        if mode != "no_usage":
            answer["usage"] = usage
        return JSONResponse(answer)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events():
        STATE["streaming"] += 1
        finished = False
        try:
            yield chunk("")  # role-only first chunk, as servers send
            if mode == "stall":
                await asyncio.sleep(3600)
            for delta in call_deltas(calls):
                await asyncio.sleep(OPTIONS["delay"])
                yield chunk(None, tool_calls=[delta])
            for index, word in enumerate([] if calls else words):
                if mode == "cut" and index == OPTIONS["cut_after"]:
                    raise ConnectionAbortedError("cut on purpose")  # uvicorn drops the connection
                await asyncio.sleep(OPTIONS["delay"])
                yield chunk(("" if index == 0 else " ") + word)
            yield chunk(None, finish)
            if include_usage and mode != "no_usage":
                yield chunk(None, usage=usage)
            yield "data: [DONE]\n\n"
            finished = True
        finally:  # cancelled, or closed by a failed send: either way the client left
            STATE["streaming"] -= 1
            STATE["left"] += 0 if finished or mode == "cut" else 1

    return StreamingResponse(events(), media_type="text/event-stream")


def text_vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [(byte - 128) / 128 for byte in digest[:8]]


async def embeddings(request: Request) -> Response:
    key = os.environ.get("FAKE_UPSTREAM_KEY")
    if key and request.headers.get("authorization") != f"Bearer {key}":
        return JSONResponse({"error": {"message": "bad key", "type": "auth"}}, status_code=401)
    body = await request.json()
    STATE["bodies"].append(body)
    STATE["embeddings"] += 1
    mode = STATE["mode"]
    if mode == "status_500":
        return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
    if mode == "status_400":
        error = {"message": "input is too long for this upstream", "param": "input", "code": "long"}
        return JSONResponse({"error": error | {"type": "invalid_request_error"}}, status_code=400)
    texts = [text if isinstance(text, str) else str(text) for text in body["input"]]
    rows: list[Any] = [text_vector(text) for text in texts]
    if body.get("encoding_format") == "base64":
        rows = [base64.b64encode(struct.pack("<8f", *row)).decode() for row in rows]
    data = [{"object": "embedding", "embedding": row, "index": i} for i, row in enumerate(rows)]
    answer: dict[str, Any] = {"object": "list", "data": data[::-1], "model": body["model"]}
    if mode != "no_usage":
        words = sum(len(text.split()) for text in texts)
        answer["usage"] = {"prompt_tokens": words, "total_tokens": words}
    return JSONResponse(answer)


async def models(request: Request) -> Response:
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": "fake",
                    "object": "model",
                    "created": 0,
                    "owned_by": "me",
                    "max_model_len": 4096,
                }
            ],
        }
    )


async def mode(request: Request) -> Response:
    STATE["mode"] = (await request.json())["mode"]
    return JSONResponse({"mode": STATE["mode"]})


async def state(request: Request) -> Response:
    return JSONResponse(
        {k: v for k, v in STATE.items() if k != "bodies"}
        | {"last_body": STATE["bodies"][-1] if STATE["bodies"] else None, "time": time.time()}
    )


app = Starlette(
    routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models),
        Route("/_mode", mode, methods=["POST"]),
        Route("/_state", state),
    ]
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--cut-after", type=int, default=3)
    parser.add_argument("--mode", default="ok")
    args = parser.parse_args()
    OPTIONS.update(delay=args.delay, cut_after=args.cut_after)
    STATE["mode"] = args.mode
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
