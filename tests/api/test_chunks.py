"""A streamed token's event is byte for byte the chunk the protocol model renders."""

from __future__ import annotations

import json

import pytest

from api.protocol import ChunkChoice, Delta
from api.serving.chunks import ChunkEvents

TEXTS = [
    "Hello",
    " world",
    "",
    'a "quoted" word',
    "back\\slash",
    "line\nbreak\ttab\r",
    "\x00\x01\x1f control",
    "</script>",
    "naïve café 😀 中文",
    "\u2028\u2029",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("index", [0, 3])
def test_a_content_delta_renders_as_the_chunk_model_does(text: str, index: int) -> None:
    events = ChunkEvents(chat_id="chatcmpl-abc", created=1_700_000_000, model="demo")
    expected = events.chunk(ChunkChoice(index=index, delta=Delta(content=text)))
    assert events.content(index, text) == expected
    assert events.content(index, text) == expected  # and again, from the kept template


def test_each_choice_gets_its_own_index() -> None:
    events = ChunkEvents(chat_id="chatcmpl-abc", created=1, model="demo")
    first, second = events.content(0, "a"), events.content(1, "b")
    choices = [json.loads(e.removeprefix("data: "))["choices"][0] for e in (first, second)]
    assert [(c["index"], c["delta"]) for c in choices] == [
        (0, {"content": "a"}),
        (1, {"content": "b"}),
    ]
