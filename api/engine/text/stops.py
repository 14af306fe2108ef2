"""Stop strings: end generation at the first occurrence, never emitting any part of it.

Text arrives in deltas from the detokenizer. The tail of the text that is still a prefix of some
stop string is held back, because the next token may complete the stop string (and then that
text must never have been sent). Once it can no longer match, it is released.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Finds stop strings in streamed text and holds back what could still become one."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._stops = tuple(s for s in stop if s)
        self._held = ""
        self.matched: str | None = None  # the stop string found, once one is

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was found).

        When a stop string is found, the returned text ends right before it and generation ends.
        """
        if not self._stops:
            return delta, False
        text = self._held + delta
        first = -1
        for stop in self._stops:
            index = text.find(stop)
            if index != -1 and (first == -1 or index < first):
                first, self.matched = index, stop
        if first != -1:
            self._held = ""
            return text[:first], True
        keep = self._longest_partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """Generation ended for another reason: the held text was never a stop string."""
        held, self._held = self._held, ""
        return held

    def _longest_partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:length]):
                    best = length
                    break
        return best
