"""ASGI middleware: request ids, the body size limit and request metrics, before any route."""

from __future__ import annotations

import re
import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import OpenAIError
from api.errors_anthropic import from_openai
from api.metrics import Metrics

ANTHROPIC_PATHS = "/v1/messages"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_ROUTES = {
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/models",
    "/v1/key",
    "/health",
    "/ready",
    "/metrics",
}


def _route(path: str) -> str:
    if path in _ROUTES:
        return path
    for prefix in ("/v1/models/", "/v1/responses/"):  # one label per route, not per id
        if path.startswith(prefix):
            return prefix + "{id}"
    if path.startswith("/app/api/"):  # the Mini App's JSON API, and its page's files
        return "/app/api"
    if path == "/app" or path.startswith("/app/"):
        return "/app"
    return "other"


class RequestContext:
    """Gives every response an `x-request-id`, counts it, and refuses bodies over the limit."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, max_body: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = self._request_id(scope)
        started = time.perf_counter()
        scope.setdefault("state", {})["request_id"] = request_id  # `request.state.request_id`
        status = {"code": 500}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            body = await self._read_limited(scope, receive)
        except OpenAIError as error:
            if scope["path"].startswith(ANTHROPIC_PATHS):  # Anthropic's clients, its shape
                answer = from_openai(error).response(request_id)
            else:
                answer = error.response()
            await answer(scope, receive, send_with_id)
        else:
            await self.app(scope, body or receive, send_with_id)
        finally:
            route = _route(scope["path"])
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - started)

    def _request_id(self, scope: Scope) -> str:
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                candidate = value.decode("latin-1")
                if _REQUEST_ID.match(candidate):
                    return candidate
        return f"req_{secrets.token_hex(12)}"

    async def _read_limited(self, scope: Scope, receive: Receive) -> Receive | None:
        """Buffer a request body up to the limit (413 beyond it), declared length or not."""
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return None
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                raise _too_large(self.max_body)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _too_large(self.max_body)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"The request body is larger than the {limit} bytes this server accepts.",
        code="request_too_large",
    )
