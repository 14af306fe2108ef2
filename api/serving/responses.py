"""The Responses API (`POST /v1/responses`): a second front door onto the chat serving path.

A Responses request is read into a chat request (`to_chat`) and then prepared, held, generated,
checkpointed and settled by `ChatService`, so there is one billing path and `usage` is what the
ledger records. This module shapes the response object and its stream around the items that
`response_items.py` reads and writes, and keeps stored responses (`billing/responses.py`) so that
`previous_response_id` continues a conversation on any replica: a stored row holds every input
item up to its answer, and the next turn is rendered by the chat template as a chat's next turn
is, so it starts from the prefix cache as that would.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio
from anyio import to_thread
from sqlalchemy import Engine
from sqlmodel import Session

from api.engine.protocol import GenerationOutput
from api.errors import (
    DATABASE_UNAVAILABLE,
    OpenAIError,
    describe_database_error,
    from_domain,
    invalid_request,
)
from api.protocol_responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseStatus,
    ResponseUsage,
)
from api.serving.chat import KEEPALIVE_EVENT, ChatService, PreparedChat
from api.serving.response_items import (
    ResponseEvents,
    input_items,
    output_items,
    refuse_unsupported,
    renamed,
    to_chat,
)
from api.serving.streams import KEEPALIVE
from api.serving.tools import StreamedCalls, delta_calls
from api.settings import ApiSettings
from billing import responses as stored
from billing.db import session_scope

logger = logging.getLogger("tokenshop.api")
T = TypeVar("T")


@dataclass
class PreparedResponse:
    """A Responses request that holds its tokens through the chat request it became."""

    id: str
    chat: PreparedChat
    request: ResponsesRequest
    conversation: list[dict[str, Any]]  # every input item up to this answer, for storing
    events: AsyncGenerator[str] | None = None


class ResponsesService:
    def __init__(self, *, chat: ChatService, db: Engine, settings: ApiSettings) -> None:
        self.chat = chat
        self.db = db
        self.settings = settings

    async def prepare(
        self, request: ResponsesRequest, account_id: int, key_id: int | None = None
    ) -> PreparedResponse:
        refuse_unsupported(request)
        history: list[dict[str, Any]] = []
        previous = request.previous_response_id
        if previous is not None:
            row = await self._run(
                lambda s: stored.find(session=s, account_id=account_id, response_id=previous)
            )
            if row is None:
                raise invalid_request(
                    f"Previous response with id '{previous}' not found.",
                    "previous_response_id",
                    "previous_response_not_found",
                )
            history = json.loads(row.conversation) + json.loads(row.response)["output"]
        if request.input is None and not history:
            raise invalid_request(
                "Missing required parameter: 'input'.", "input", "missing_required_parameter"
            )
        conversation = history + input_items(request)
        chat_request = to_chat(request, conversation, first_new=len(history))
        try:
            prepared = await self.chat.prepare(chat_request, account_id, key_id)
        except OpenAIError as exc:
            raise renamed(exc) from None
        response_id = "resp_" + prepared.id.removeprefix("chatcmpl-")  # its hold's id, renamed
        return PreparedResponse(response_id, prepared, request, conversation)

    async def create(self, prepared: PreparedResponse) -> ResponseObject:
        completion = await self.chat.complete(prepared.chat)  # settled when it returns
        choice = completion.choices[0]
        status: ResponseStatus = "incomplete" if choice.finish_reason == "length" else "completed"
        response = self.response(
            prepared,
            status=status,
            output=output_items(choice.message.content, choice.message.tool_calls, status),
        )
        await self._store(prepared, response)
        return response

    async def start_stream(self, prepared: PreparedResponse) -> AsyncIterator[str]:
        """Wait for the engine to accept the request (or refuse it: that error still gets its
        HTTP status), then hand back the SSE events."""
        outputs, first = await self.chat.started_outputs(prepared.chat)
        prepared.events = self._stream(prepared, outputs, first)
        return prepared.events

    async def _stream(
        self, prepared: PreparedResponse, outputs: AsyncGenerator[Any], first: Any
    ) -> AsyncGenerator[str]:
        """The semantic events in OpenAI's order; a failure after the first byte arrives as an
        `error` event and `response.failed`. The hold is settled before the last event, so the
        usage it carries is what the ledger has."""
        events = ResponseEvents(
            StreamedCalls(prepared.chat.plan) if prepared.chat.plan.format else None
        )
        try:
            opening = self.response(prepared, status="in_progress", output=[], usage=False)
            yield events.event("response.created", response=opening)
            yield events.event("response.in_progress", response=opening)
            item, finish = first, "length"
            while True:
                if item is KEEPALIVE:
                    yield KEEPALIVE_EVENT
                else:
                    output: GenerationOutput = item[1]
                    calls = delta_calls(output.tool_calls)
                    for event in events.feed(output.text, finished=output.finished, calls=calls):
                        yield event
                    if output.finished:
                        finish = output.finish_reason or "stop"
                try:
                    item = await anext(outputs)
                except StopAsyncIteration:
                    break
            status: ResponseStatus = "incomplete" if finish == "length" else "completed"
            for event in events.finish("incomplete" if status == "incomplete" else "completed"):
                yield event
            await self.chat.close(prepared.chat)  # settles: the usage below is the ledger's
            response = self.response(prepared, status=status, output=events.items)
            await self._store(prepared, response)
            yield events.event(f"response.{status}", response=response)
        except Exception as exc:  # the status line is gone: report in-band
            error = from_domain(exc)
            if error.status >= 500:
                logger.exception("response stream %s failed", prepared.id)
            body = error.body
            await self.chat.close(prepared.chat)  # settled before the client hears of it
            yield events.event("error", code=body.code, message=body.message, param=body.param)
            failed = self.response(
                prepared,
                status="failed",
                output=events.items,
                error=ResponseError(code=body.code or body.type, message=body.message),
            )
            yield events.event("response.failed", response=failed)
        finally:
            with anyio.CancelScope(shield=True):
                await outputs.aclose()
            await self.chat.close(prepared.chat)

    async def close(self, prepared: PreparedResponse) -> None:
        """After every streaming response: stop the stream if the client left it suspended,
        then settle (`ChatService.close`)."""
        events, prepared.events = prepared.events, None
        if events is not None:
            with anyio.CancelScope(shield=True):
                await events.aclose()
        await self.chat.close(prepared.chat)

    def response(
        self,
        prepared: PreparedResponse,
        *,
        status: ResponseStatus,
        output: list[OutputItem],
        usage: bool = True,
        error: ResponseError | None = None,
    ) -> ResponseObject:
        request = prepared.request
        tally = prepared.chat.tally
        text_format = request.text.format if request.text and request.text.format else None
        return ResponseObject(
            id=prepared.id,
            created_at=prepared.chat.created,
            status=status,
            error=error,
            incomplete_details=(
                IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
            ),
            instructions=request.instructions,
            max_output_tokens=request.max_output_tokens,
            model=request.model,
            output=output,
            parallel_tool_calls=request.parallel_tool_calls is not False,
            previous_response_id=request.previous_response_id,
            store=request.store,
            temperature=1.0 if request.temperature is None else request.temperature,
            text={
                "format": (
                    text_format.model_dump(by_alias=True, exclude_none=True)
                    if text_format
                    else {"type": "text"}
                )
            },
            tool_choice=(
                request.tool_choice.model_dump(exclude_none=True)
                if request.tool_choice is not None and not isinstance(request.tool_choice, str)
                else request.tool_choice or "auto"
            ),
            tools=[tool.model_dump(exclude_none=True) for tool in request.tools or []],
            top_p=1.0 if request.top_p is None else request.top_p,
            usage=(
                ResponseUsage(
                    input_tokens=tally.prompt_tokens,
                    input_tokens_details=InputTokensDetails(cached_tokens=tally.cached_tokens),
                    output_tokens=tally.completion_tokens,
                    total_tokens=tally.prompt_tokens + tally.completion_tokens,
                )
                if usage
                else None
            ),
            user=request.user,
            metadata=request.metadata or {},
        )

    async def _store(self, prepared: PreparedResponse, response: ResponseObject) -> None:
        """Keep the answer for `previous_response_id` and GET. The answer is generated and
        billed already: a database out of reach costs the stored copy, not the answer."""
        if not prepared.request.store:
            return
        conversation = json.dumps(prepared.conversation)
        body = response.model_dump_json()
        account_id = prepared.chat.account_id
        try:
            await self._run(
                lambda s: stored.save(
                    session=s,
                    account_id=account_id,
                    response_id=prepared.id,
                    conversation=conversation,
                    response=body,
                )
            )
        except DATABASE_UNAVAILABLE as exc:
            logger.warning("could not store %s: %s", prepared.id, describe_database_error(exc))

    async def retrieve(self, response_id: str, account_id: int) -> str:
        """The stored response's JSON as it was sent; another account's id is not found."""
        row = await self._run(
            lambda s: stored.find(session=s, account_id=account_id, response_id=response_id)
        )
        if row is None:
            raise response_not_found(response_id)
        return row.response

    async def delete(self, response_id: str, account_id: int) -> None:
        removed = await self._run(
            lambda s: stored.remove(session=s, account_id=account_id, response_id=response_id)
        )
        if not removed:
            raise response_not_found(response_id)

    async def forget_expired(self) -> int:
        before = datetime.now(UTC) - timedelta(days=self.settings.responses_retention_days)
        return await self._run(lambda s: stored.forget_older_than(session=s, before=before))

    async def forget_forever(self, every: float) -> None:
        """The retention loop of the lifespan: idempotent, so every replica may run it."""
        while True:
            try:
                deleted = await self.forget_expired()
                if deleted:
                    logger.info("deleted %d stored response(s) past retention", deleted)
            except DATABASE_UNAVAILABLE as exc:
                logger.warning("could not delete old responses: %s", describe_database_error(exc))
            except Exception:  # the next round tries again
                logger.exception("could not delete old responses")
            await asyncio.sleep(every)

    async def _run(self, work: Callable[[Session], T]) -> T:
        """One short transaction in a worker thread, as `Books` runs billing's."""

        def run() -> T:
            with session_scope(self.db) as session:
                return work(session)

        return await to_thread.run_sync(run)


def response_not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", param="response_id")
