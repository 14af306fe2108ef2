"""Tokenizer wrapper and incremental detokenization.

Serving uses the `tokenizers` library directly (no transformers), reading `tokenizer.json` from the
export dir. Streaming needs text per step, but a token is not always a whole character: byte-level
BPE splits multi-byte UTF-8 characters across tokens, and SentencePiece-style decoders change a
token's text depending on what precedes it. `IncrementalDetokenizer` therefore decodes a small
sliding window of tokens and only emits text once it is final (vLLM and TGI do the same), so the
deltas never contain a broken character and concatenate exactly to `decode(all tokens)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from api.engine.errors import ModelLoadError

_REPLACEMENT = "\ufffd"
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table inverted: printable char of a byte-level BPE -> its byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _uses_byte_level(tokenizer_json: dict) -> bool:
    decoder = tokenizer_json.get("decoder") or {}
    text = json.dumps(decoder)
    return '"ByteLevel"' in text


class TokenizerWrapper:
    """The export's `tokenizer.json`, with the few operations the engine needs."""

    def __init__(self, tokenizer: Tokenizer, *, byte_level: bool) -> None:
        self._tokenizer = tokenizer
        self._byte_level = byte_level
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: Path) -> TokenizerWrapper:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            tokenizer = Tokenizer.from_str(json.dumps(raw))
        except FileNotFoundError as exc:
            raise ModelLoadError(f"{path}: missing (the tokenizer of the export)") from exc
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise ModelLoadError(f"{path}: not a usable tokenizers file: {exc}") from exc
        return cls(tokenizer, byte_level=_uses_byte_level(raw))

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered chat text; special tokens come from the template, not added here."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (OpenAI's `logprobs[].bytes`)."""
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            table = _byte_level_decoder()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        match = _BYTE_TOKEN.match(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def token_text(self, token_id: int) -> str:
        """A token as a display string; partial UTF-8 bytes become U+FFFD, as in OpenAI's output."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that are final when emitted.

    `prefix_offset..read_offset` is a window of already-emitted tokens decoded again as context,
    so a token whose text depends on its neighbours (leading-space rules, byte pieces) is decoded
    the same way `decode(all)` would. Text ending in U+FFFD is an incomplete character: held back.
    """

    def __init__(self, tokenizer: TokenizerWrapper) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_id: int) -> str:
        """Add one token; return the text that became final (often the token's text, maybe "")."""
        self._ids.append(token_id)
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """At the end of generation: whatever is held back (an incomplete character decodes as
        U+FFFD, exactly as `decode(all)` shows it)."""
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]
