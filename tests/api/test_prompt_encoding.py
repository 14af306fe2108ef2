"""Prompts are tokenized where it costs least: short ones on the event loop, long ones beside it."""

from __future__ import annotations

import asyncio
import threading

from api.engine.protocol import ChatMessage
from api.serving.chat import INLINE_TOKENIZE_CHARS, _encode


class RecordingEngine:
    """Stands in for an engine's tokenizer: which thread tokenized each prompt."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def encode_chat(self, messages: list[ChatMessage]) -> list[int]:
        self.threads.append(threading.current_thread())
        return [len(m.content) for m in messages]


def test_a_long_prompt_is_tokenized_off_the_event_loop_and_a_short_one_on_it() -> None:
    engine = RecordingEngine()
    short = [ChatMessage(role="user", content="hello")]
    long = [ChatMessage(role="system", content="x" * INLINE_TOKENIZE_CHARS)] + short

    async def both() -> threading.Thread:
        assert await _encode(engine, short) == [5]  # type: ignore[arg-type]
        assert await _encode(engine, long) == [INLINE_TOKENIZE_CHARS, 5]  # type: ignore[arg-type]
        return threading.current_thread()

    loop_thread = asyncio.run(both())
    assert engine.threads[0] is loop_thread
    assert engine.threads[1] is not loop_thread
