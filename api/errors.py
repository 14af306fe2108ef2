"""Every error the API sends, in OpenAI's shape, mapped from domain errors in one place.

The SDKs decide what to do from the status code and the `x-should-retry` header: an empty
balance says `false`, so clients do not retry in vain; overload and rate limits say when to retry.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.engine.errors import (
    ContextLengthExceeded,
    EngineDead,
    EngineError,
    EngineOverloaded,
    InvalidParameter,
    ToolsUnsupported,
    UpstreamFailed,
    UpstreamRejected,
    UpstreamUnavailable,
)
from api.engine.text.chat_template import ChatTemplateError
from api.miniapp.auth import AppAuthError
from api.miniapp.telegram import TelegramUnavailable
from api.protocol import ErrorBody, ErrorResponse
from billing.errors import (
    BillingError,
    IdempotencyConflict,
    IdempotencyMismatch,
    InsufficientBalance,
    InvalidKey,
    KeyExpired,
    KeyLimitReached,
    KeyRateLimited,
    ModelNotAllowed,
    TooManyRequests,
)

logger = logging.getLogger("tokenshop.api")

# The database could not be reached or is busy (connection refused or reset, pool exhausted,
# SQLite's "database is locked"): a moment's trouble, worth a retry, never the client's fault.
# Other database errors (a constraint, bad SQL) are bugs and stay 500s.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError)
DATABASE_RETRY_AFTER_SECONDS = 2


class OpenAIError(Exception):
    """An error ready to send: status, OpenAI's body fields and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, param=param, code=code)
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(
            ErrorResponse(error=self.body).model_dump(),
            status_code=self.status,
            headers=self.headers,
        )

    def sse_event(self) -> str:
        return f"data: {json.dumps(ErrorResponse(error=self.body).model_dump())}\n\n"


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def unsupported_parameter(param: str, why: str) -> OpenAIError:
    return invalid_request(
        f"Unsupported parameter: '{param}' {why}", param, "unsupported_parameter"
    )


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def wrong_endpoint(model: str, kind: str, endpoint: str) -> OpenAIError:
    """A model asked for on the other kind's endpoint: an embedding model for a chat, a chat
    model for embeddings."""
    return invalid_request(
        f"The model '{model}' is {kind} and cannot be used with {endpoint}.",
        "model",
        "model_not_supported",
    )


def rate_limited(limit: int, retry_after: int = 1) -> OpenAIError:
    return OpenAIError(
        429,
        f"Too many concurrent requests for this key (limit {limit}). Retry shortly.",
        type="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after)},
    )


def missing_key() -> OpenAIError:
    return OpenAIError(
        401,
        "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
        code="invalid_api_key",
    )


def internal_error() -> OpenAIError:
    return OpenAIError(
        500,
        "The server had an error while processing your request. Sorry about that!",
        type="server_error",
        code="internal_error",
    )


def database_unavailable() -> OpenAIError:
    return OpenAIError(
        503,
        "The service is temporarily unable to reach its database. Please retry shortly.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
    )


def describe_database_error(exc: BaseException) -> str:
    """One log line for a database failure: the driver's error, never the SQL or its
    parameters (which hold key hashes and account ids)."""
    cause = getattr(exc, "orig", None) or exc
    first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return f"{type(cause).__name__}: {first_line}"[:300]


def from_domain(exc: Exception) -> OpenAIError:
    """The OpenAI error for a domain error; anything unknown is a 500 without internals."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, KeyExpired):
        return OpenAIError(401, str(exc), code="key_expired")
    if isinstance(exc, InvalidKey):
        return OpenAIError(401, str(exc), code="invalid_api_key")
    if isinstance(exc, KeyLimitReached):  # the key's own limit: no retry helps before its reset
        return OpenAIError(
            429,
            str(exc),
            type="insufficient_quota",
            code="insufficient_quota",
            headers={"x-should-retry": "false"},
        )
    if isinstance(exc, KeyRateLimited):
        return OpenAIError(
            429,
            str(exc),
            type=exc.kind,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(exc.retry_after)},
        )
    if isinstance(exc, ModelNotAllowed):
        return OpenAIError(403, str(exc), param="model", code="model_not_allowed")
    if isinstance(exc, InsufficientBalance):
        return OpenAIError(
            429,
            f"You exceeded your current quota: this request needs at least {exc.needed} tokens "
            f"and {exc.available} remain. Buy a token pack to continue.",
            type="insufficient_quota",
            code="insufficient_quota",
            headers={"x-should-retry": "false"},
        )
    if isinstance(exc, TooManyRequests):
        return rate_limited(exc.limit)
    if isinstance(exc, IdempotencyMismatch):
        return invalid_request(str(exc), code="idempotency_key_reused")
    if isinstance(exc, IdempotencyConflict):
        return OpenAIError(409, str(exc), code="idempotency_conflict")
    if isinstance(exc, ChatTemplateError):  # the model's template refused the conversation
        return invalid_request(str(exc), "messages", "invalid_messages")
    if isinstance(exc, ContextLengthExceeded):
        return invalid_request(str(exc), "messages", "context_length_exceeded")
    if isinstance(exc, InvalidParameter):  # e.g. a schema llguidance cannot enforce
        return invalid_request(str(exc), exc.param, "invalid_value")
    if isinstance(exc, ToolsUnsupported):
        return unsupported_parameter("tools", f"is not supported by this model: {exc}.")
    if isinstance(exc, EngineOverloaded):
        return OpenAIError(
            503,
            "The server is overloaded with requests. Please retry shortly.",
            type="server_error",
            code="overloaded",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return database_unavailable()
    if isinstance(exc, UpstreamRejected):  # the upstream's own 4xx, its message as it wrote it
        return OpenAIError(exc.status, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, UpstreamUnavailable):
        return OpenAIError(
            503,
            str(exc),
            type="server_error",
            code="upstream_unavailable",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, UpstreamFailed):
        return OpenAIError(502, str(exc), type="server_error", code="upstream_error")
    if isinstance(exc, EngineDead):
        return OpenAIError(503, "The model is not available right now.", type="server_error")
    if isinstance(exc, AppAuthError):  # the Mini App's initData or session (api/miniapp/auth)
        return OpenAIError(401, str(exc), code="invalid_init_data")
    if isinstance(exc, TelegramUnavailable):
        return OpenAIError(502, str(exc), type="server_error", code="telegram_unavailable")
    if isinstance(exc, BillingError):
        return invalid_request(str(exc))
    return internal_error()


def _validation_error(exc: RequestValidationError) -> OpenAIError:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return invalid_request("We could not parse the JSON body of your request.")
    param = ".".join(loc) or None
    if param is None:
        return invalid_request("The request body must be a JSON object.")
    message = first.get("msg", "Invalid request.")
    where = f" at '{param}'" if param else ""
    return invalid_request(f"Invalid request{where}: {message}", param, "invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(BillingError)
    async def _billing(_: Request, exc: BillingError) -> JSONResponse:
        return from_domain(exc).response()

    @app.exception_handler(EngineError)
    async def _engine(_: Request, exc: EngineError) -> JSONResponse:
        return from_domain(exc).response()

    @app.exception_handler(AppAuthError)
    async def _app_auth(_: Request, exc: AppAuthError) -> JSONResponse:
        return from_domain(exc).response()

    @app.exception_handler(TelegramUnavailable)
    async def _telegram(_: Request, exc: TelegramUnavailable) -> JSONResponse:
        return from_domain(exc).response()

    @app.exception_handler(ChatTemplateError)
    async def _template(_: Request, exc: ChatTemplateError) -> JSONResponse:
        return from_domain(exc).response()

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        logger.warning(
            "database unavailable on %s %s: %s",
            request.method,
            request.url.path,
            describe_database_error(exc),
        )
        return database_unavailable().response()

    for error_type in DATABASE_UNAVAILABLE:
        app.add_exception_handler(error_type, _database)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = {404: "Unknown request URL.", 405: "Method not allowed."}.get(
            exc.status_code, str(exc.detail)
        )
        return OpenAIError(exc.status_code, message, headers=dict(exc.headers or {})).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        error = from_domain(exc)
        if error.status >= 500:
            logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error.response()
