"""Anthropic's Messages API (`POST /v1/messages`): a third front door onto the chat serving
path, as the Responses API is the second.

A Messages request is read into a chat request (`message_blocks.to_chat`) and then prepared,
held, generated, checkpointed and settled by `ChatService`, so there is one billing path and
`usage` is what the ledger records. A whole answer and a stream are read from the same engine
outputs by the same `MessageBlocks`; this module shapes the message and its events around them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from api.engine.protocol import GenerationOutput
from api.errors_anthropic import anthropic_error
from api.protocol_anthropic import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    Usage,
)
from api.serving.chat import ChatService, PreparedChat
from api.serving.message_blocks import PING_EVENT, MessageBlocks, event, to_chat
from api.serving.streams import KEEPALIVE
from api.serving.tools import StreamedCalls
from api.settings import ApiSettings

logger = logging.getLogger("tokenshop.api")


@dataclass
class PreparedMessage:
    """A Messages request that holds its tokens through the chat request it became."""

    id: str
    chat: PreparedChat
    request: MessagesRequest
    blocks: MessageBlocks
    events: AsyncGenerator[str] | None = None


class MessagesService:
    def __init__(self, *, chat: ChatService, settings: ApiSettings) -> None:
        self.chat = chat
        self.settings = settings

    async def prepare(
        self,
        request: MessagesRequest,
        account_id: int,
        key_id: int | None = None,
        *,
        body: Mapping[str, Any] | None = None,
    ) -> PreparedMessage:
        """Translate and hold. `max_tokens` past what the context leaves is cut to the room:
        Claude Code asks for 32,000 whatever the model. `body`, the request as it came, is
        what an upstream that serves Messages itself gets."""
        chat_request = to_chat(request)
        prepared = await self.chat.prepare(
            chat_request, account_id, key_id, clamp_max_tokens=True, native_messages=body
        )
        plan = prepared.plan
        blocks = MessageBlocks(StreamedCalls(plan) if plan.format else None)
        message_id = "msg_" + prepared.id.removeprefix("chatcmpl-")  # its hold's id, renamed
        return PreparedMessage(message_id, prepared, request, blocks)

    async def count_tokens(self, request: CountTokensRequest) -> int:
        return await self.chat.count_prompt(to_chat(request))

    async def create(self, prepared: PreparedMessage) -> Message:
        """The whole answer, settled before it is returned."""
        outputs = self.chat.outputs(prepared.chat, keepalive=None)
        try:
            async for _, output in outputs:
                prepared.blocks.feed(output)
            prepared.blocks.finish()
        finally:
            with anyio.CancelScope(shield=True):
                await outputs.aclose()
            await self.chat.close(prepared.chat)
        return self.message(prepared)

    async def start_stream(self, prepared: PreparedMessage) -> AsyncIterator[str]:
        """Wait for the engine to accept the request (or refuse it: that error still gets its
        HTTP status), then hand back the SSE events."""
        outputs, first = await self.chat.started_outputs(prepared.chat)
        prepared.events = self._stream(prepared, outputs, first)
        return prepared.events

    async def _stream(
        self, prepared: PreparedMessage, outputs: AsyncGenerator[Any], first: Any
    ) -> AsyncGenerator[str]:
        """Anthropic's events in order: `message_start` (with the prompt's usage), the content
        blocks, `message_delta` (stop reason, usage) and `message_stop`; `ping` while the
        engine is silent; a failure after the first byte is an `error` event. The hold is
        settled before `message_delta`, so the usage it carries is what the ledger has."""
        blocks = prepared.blocks
        try:
            opening = self.message(prepared, stop_reason=False)
            yield event("message_start", message=opening)
            item = first
            while True:
                if item is KEEPALIVE:
                    yield PING_EVENT
                else:
                    output: GenerationOutput = item[1]
                    pieces = blocks.feed(output)
                    if pieces:  # what one output makes goes out in one write
                        yield pieces[0] if len(pieces) == 1 else "".join(pieces)
                try:
                    item = await anext(outputs)
                except StopAsyncIteration:
                    break
            closing = blocks.finish()
            if closing:
                yield "".join(closing)
            await self.chat.close(prepared.chat)  # settles: the usage below is the ledger's
            delta = {"stop_reason": blocks.stop_reason, "stop_sequence": blocks.stop_sequence}
            usage = self.usage(prepared)
            yield event("message_delta", delta=delta, usage=usage) + event("message_stop")
        except Exception as exc:  # the status line is gone: report in-band
            error = anthropic_error(exc)
            await self.chat.close(prepared.chat)  # settled before the client hears of it
            yield event("error", error=error.body.error)
        finally:
            with anyio.CancelScope(shield=True):
                await outputs.aclose()
            await self.chat.close(prepared.chat)

    async def close(self, prepared: PreparedMessage) -> None:
        """After every streaming response: stop the stream if the client left it suspended,
        then settle (`ChatService.close`)."""
        events, prepared.events = prepared.events, None
        if events is not None:
            with anyio.CancelScope(shield=True):
                await events.aclose()
        await self.chat.close(prepared.chat)

    def message(self, prepared: PreparedMessage, *, stop_reason: bool = True) -> Message:
        blocks = prepared.blocks
        return Message(
            id=prepared.id,
            content=list(blocks.blocks) if stop_reason else [],
            model=prepared.request.model,
            stop_reason=blocks.stop_reason if stop_reason else None,
            stop_sequence=blocks.stop_sequence if stop_reason else None,
            usage=self.usage(prepared),
        )

    def usage(self, prepared: PreparedMessage) -> Usage:
        """The prompt in Anthropic's parts (computed + read from the cache), and the answer."""
        tally = prepared.chat.tally
        return Usage(
            input_tokens=tally.prompt_tokens - tally.cached_tokens,
            cache_read_input_tokens=tally.cached_tokens,
            output_tokens=tally.completion_tokens,
        )
