"""Every error of the Messages API in Anthropic's shape, mapped once from the OpenAI errors
that `api.errors.from_domain` makes of domain errors.

Mapping by status, not by error class, keeps this in step with `from_domain`: an error added
there with its status reaches Anthropic's clients as the type Anthropic gives that status. Two
differ on purpose: a balance too low is Anthropic's 400 (a client must not retry it), and an
engine with a full queue is Anthropic's 529 `overloaded_error`, which its SDKs retry.
"""

from __future__ import annotations

import logging

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import OpenAIError, from_domain
from api.protocol_anthropic import ErrorBody, ErrorResponse
from billing.errors import InsufficientBalance

logger = logging.getLogger("tokenshop.api")

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
OVERLOADED = 529


class AnthropicError(Exception):
    """An error ready to send in Anthropic's shape: status, body and headers."""

    def __init__(self, status: int, type: str, message: str, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorResponse(error=ErrorBody(type=type, message=message))
        self.headers = headers

    def response(self, request_id: str | None = None) -> JSONResponse:
        body = self.body.model_copy(update={"request_id": request_id})
        headers = dict(self.headers)
        if request_id is not None:
            headers["request-id"] = request_id
        return JSONResponse(
            body.model_dump(exclude_none=True), status_code=self.status, headers=headers
        )


def anthropic_error(exc: Exception) -> AnthropicError:
    """The Anthropic error for any exception the serving path raises; an unknown one is a 500
    without internals (and logged)."""
    if isinstance(exc, AnthropicError):
        return exc
    if isinstance(exc, InsufficientBalance):
        return AnthropicError(
            400,
            "invalid_request_error",
            f"Your credit balance is too low: this request needs at least {exc.needed} tokens "
            f"and {exc.available} remain. Buy a token pack to continue.",
            {"x-should-retry": "false"},
        )
    if isinstance(exc, RequestValidationError):
        return AnthropicError(400, "invalid_request_error", _invalid_body(exc), {})
    if isinstance(exc, StarletteHTTPException):  # e.g. a body FastAPI could not decode
        return from_openai(OpenAIError(exc.status_code, str(exc.detail)))
    error = from_domain(exc)
    if error.status >= 500 and not isinstance(exc, OpenAIError):
        logger.error("messages request failed", exc_info=exc)
    return from_openai(error)


def from_openai(error: OpenAIError) -> AnthropicError:
    status = error.status
    if status == 503 and error.body.code == "overloaded":
        status = OVERLOADED
    kind = TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return AnthropicError(status, kind, error.body.message, error.headers)


def _invalid_body(exc: RequestValidationError) -> str:
    """Anthropic's way of naming a bad field: `messages.0.content: Field required`."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON."
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    if not where:
        return "The request body must be a JSON object."
    return f"{where}: {first.get('msg', 'invalid value')}"
