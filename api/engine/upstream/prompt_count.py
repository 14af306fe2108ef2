"""What an upstream counts in a prompt beyond what our tokenizer and template count.

The tokenizer configured for an upstream model counts its prompts here, for the hold and for
streams that carry no usage. The upstream renders the same messages with its own template
(llama.cpp's `--chat_format`, a vLLM `--chat-template`), which may add tokens ours does not: a
BOS, a default system prompt where the conversation has none, other role markers. Such tokens
depend on the conversation's shape, not its text: seen on llama-cpp-python's `chatml` against
the demo template, 9 more without a system message and none with one, for 1 to 6 messages. So
the difference the upstream's own usage shows is kept by shape (a system message first or not,
and the number of messages) and added to later counts of that shape, or of the nearest shape
seen: holds then cover what the upstream will bill, and a stream without usage is billed what
the upstream would have reported. Before any usage was seen, the hold adds a margin instead.
`UpstreamEngine` asks each upstream for two one-token answers when it first comes up, so the
first requests are counted right too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from api.engine.protocol import ChatMessage

# Before an upstream has reported any usage, its prompts are held for this much more than
# counted here: the larger of a few template tokens and a share of the prompt.
MARGIN_TOKENS = 32
MARGIN_SHARE = 0.10
MAX_KEPT = 256  # shapes whose overhead is kept
# The conversations of the first count: one of each shape a template treats apart.
CALIBRATION: tuple[tuple[ChatMessage, ...], ...] = (
    (ChatMessage(role="user", content="Hi"),),
    (ChatMessage(role="system", content="Hi"), ChatMessage(role="user", content="Hi")),
)

Shape = tuple[bool, int]  # (a system message first, messages)


def shape_of(messages: Sequence[ChatMessage]) -> Shape:
    return (bool(messages) and messages[0].role in ("system", "developer"), len(messages))


class PromptOverhead:
    """The upstream's prompt count minus ours, by the conversation's shape, as last reported."""

    def __init__(self) -> None:
        self._by_shape: dict[Shape, int] = {}

    @property
    def learned(self) -> bool:
        return bool(self._by_shape)

    def learn(self, messages: Sequence[ChatMessage], *, counted: int, reported: int) -> None:
        shape = shape_of(messages)
        if len(self._by_shape) >= MAX_KEPT and shape not in self._by_shape:
            self._by_shape.clear()
        self._by_shape[shape] = reported - counted

    def known(self, messages: Sequence[ChatMessage]) -> int | None:
        """The overhead for a conversation of this shape: as reported for it, else for the
        nearest shape reported (a system message alike first, then the number of messages,
        the larger on a tie); None before any report."""
        if not self._by_shape:
            return None
        system, count = shape_of(messages)
        nearest = min(
            self._by_shape, key=lambda shape: (shape[0] != system, abs(shape[1] - count), -shape[1])
        )
        return self._by_shape[nearest]

    def estimate(self, messages: Sequence[ChatMessage], *, counted: int) -> int:
        """The upstream's count of a prompt counted `counted` here, as far as it is known."""
        return max(0, counted + (self.known(messages) or 0))

    def to_hold(self, messages: Sequence[ChatMessage], *, counted: int) -> int:
        """The prompt tokens to hold: the estimate, or the margin before anything is known."""
        overhead = self.known(messages)
        if overhead is None:
            return counted + max(MARGIN_TOKENS, math.ceil(counted * MARGIN_SHARE))
        return max(counted, counted + overhead)
