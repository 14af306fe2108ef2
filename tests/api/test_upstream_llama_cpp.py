"""A real upstream nobody here wrote: llama-cpp-python's OpenAI-compatible server, serving a
tiny random-weight GGUF made with the demo tokenizer (models/make_gguf.py). Its streams carry no
usage and its non-streamed answers do, so both ways of billing meet a real server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from sqlmodel import select

from api.engine.local_engine import load_chat_template
from api.engine.protocol import ChatMessage
from api.engine.text.tokenizer import TokenizerWrapper
from billing.db import session_scope
from billing.models import Hold, LedgerEntry
from tests.api.conftest import DEMO_MODEL
from tests.api.upstreams import UpstreamProcess, llama_cpp_server, make_gguf, models_toml
from tests.faults import poll

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hello there, how are the tokens today?"}]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return make_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def llama(gguf: Path) -> Iterator[UpstreamProcess]:
    yield from serve_gguf(gguf)


@pytest.fixture(scope="module")
def llama_chatml(gguf: Path) -> Iterator[UpstreamProcess]:
    """The same model under llama-cpp-python's own ChatML format, which counts more prompt
    tokens than the demo template for a conversation without a system message."""
    yield from serve_gguf(gguf, "--chat_format", "chatml")


def serve_gguf(gguf: Path, *options: str) -> Iterator[UpstreamProcess]:
    server = llama_cpp_server(gguf, "--interrupt_requests", "False", *options)
    try:
        yield server.wait_ready(within=120)
    finally:
        server.stop()


@pytest.fixture
def direct(llama) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=llama.base_url, api_key="none", max_retries=0) as client:
        yield client


@pytest.fixture
def through(llama, start_server, tmp_path, api_key) -> Iterator[openai.OpenAI]:
    path = tmp_path / "models.toml"
    path.write_text(models_toml("tiny", [llama.base_url], tokenizer=str(DEMO_MODEL)))
    server = start_server(models_file=str(path))
    with openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0) as client:
        client.port = server.port  # type: ignore[attr-defined]
        yield client


def booked(engine, request_id: str) -> LedgerEntry:
    with session_scope(engine) as session:
        return session.exec(select(LedgerEntry).where(LedgerEntry.request_id == request_id)).one()


def local_prompt_tokens(messages: list[dict[str, str]]) -> int:
    tokenizer = TokenizerWrapper.from_file(DEMO_MODEL / "tokenizer.json")
    rendered = load_chat_template(DEMO_MODEL).render([ChatMessage(**m) for m in messages])
    return len(tokenizer.encode(rendered))


def test_greedy_text_through_tokenshop_equals_the_upstreams_own(direct, through):
    own = direct.chat.completions.create(model="tiny", messages=HELLO, max_tokens=24, temperature=0)
    answer = through.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=24, temperature=0
    )
    streamed = through.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=24, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert own.choices[0].message.content
    assert answer.choices[0].message.content == own.choices[0].message.content
    assert text == own.choices[0].message.content


def test_a_non_streamed_answer_is_billed_exactly_the_upstreams_usage(direct, through, engine):
    own = direct.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, temperature=0)
    answer = through.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=16, temperature=0
    )
    assert answer.usage.prompt_tokens == own.usage.prompt_tokens
    assert answer.usage.completion_tokens == own.usage.completion_tokens
    entry = booked(engine, answer.id)
    assert (entry.prompt_tokens, entry.completion_tokens, -entry.amount) == (
        own.usage.prompt_tokens,
        own.usage.completion_tokens,
        own.usage.total_tokens,
    )


def test_a_stream_without_upstream_usage_is_billed_the_tokenizers_count(direct, through, engine):
    own = direct.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, temperature=0)
    chunks = list(
        through.chat.completions.create(
            model="tiny",
            messages=HELLO,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage.prompt_tokens == local_prompt_tokens(HELLO)
    # the tokenizer is the one the GGUF was made with, so the counts agree with the upstream's
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        own.usage.prompt_tokens,
        own.usage.completion_tokens,
    )
    entry = booked(engine, chunks[0].id)
    assert (entry.prompt_tokens, entry.completion_tokens, -entry.amount) == (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.total_tokens,
    )


def test_the_upstream_streams_every_token_as_it_comes(direct):
    # the premise of the next test: llama-cpp-python's server sees a client leave only between
    # the chunks it sends, and after a token that is not a whole character it holds back the
    # rest of the answer (its chunks then come at the end, with no text). models/make_gguf.py
    # keeps the tiny model from writing such tokens, so every token's chunk carries its text.
    chunks = direct.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=200, temperature=0, stream=True
    )
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    own = direct.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=200, temperature=0
    )
    assert len(pieces) == own.usage.completion_tokens
    assert "".join(pieces) == own.choices[0].message.content


def test_a_dropped_stream_frees_the_upstreams_slot_within_a_second(llama, through, engine):
    with httpx.stream(
        "POST",
        f"http://127.0.0.1:{through.port}/v1/chat/completions",
        headers={"Authorization": f"Bearer {through.api_key}"},
        json={
            "model": "tiny",
            "messages": HELLO,
            "max_tokens": 1500,
            "temperature": 0,
            "stream": True,
        },
        timeout=60,
    ) as response:
        for received, _ in enumerate(response.iter_lines()):
            if received == 8:
                break
    dropped = time.monotonic()
    # the server answers one request at a time: this one waits unless the stream stopped (its
    # 1,500 tokens would hold the slot for tens of seconds); a bound above the 1 s the slot
    # takes on a quiet host, so that a loaded CI host does not fail it for its own slowness
    answer = httpx.post(
        f"{llama.base_url}/chat/completions",
        json={"model": "tiny", "messages": HELLO, "max_tokens": 1},
        timeout=httpx.Timeout(10.0),
    )
    assert answer.status_code == 200
    assert time.monotonic() - dropped < 5.0
    poll(lambda: _open_holds(engine) == 0, within=5, what="the dropped stream settled")
    with session_scope(engine) as session:
        [entry] = session.exec(select(LedgerEntry).where(LedgerEntry.kind == "usage")).all()
    assert 1 <= entry.completion_tokens < 1500


def _open_holds(engine) -> int:
    with session_scope(engine) as session:
        return len(session.exec(select(Hold).where(Hold.state == "held")).all())


SYSTEM_FIRST = [{"role": "system", "content": "Be brief."}, *HELLO]
LONGER = [*HELLO, {"role": "assistant", "content": "Fine."}, {"role": "user", "content": "More?"}]


@pytest.mark.parametrize("messages", [HELLO, SYSTEM_FIRST, LONGER], ids=["user", "system", "3"])
def test_with_the_upstreams_own_chat_format_usage_and_ledger_are_its_count(
    llama_chatml, start_server, tmp_path, api_key, engine, messages
):
    """llama-cpp-python's `chatml` counts a prompt differently from the demo template: the
    answer's usage and the bill are the upstream's count, streamed (its streams carry no
    usage) and not."""
    path = tmp_path / "models.toml"
    path.write_text(models_toml("tiny", [llama_chatml.base_url], tokenizer=str(DEMO_MODEL)))
    server = start_server(models_file=str(path))
    direct = openai.OpenAI(base_url=llama_chatml.base_url, api_key="none", max_retries=0)
    through = openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0)
    own = direct.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0
    )
    if messages is not SYSTEM_FIRST:  # the case at hand: the counts differ
        assert own.usage.prompt_tokens != local_prompt_tokens(messages)

    answer = through.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0
    )
    chunks = list(
        through.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    for usage, request_id in ((answer.usage, answer.id), (chunks[-1].usage, chunks[0].id)):
        assert (usage.prompt_tokens, usage.completion_tokens) == (
            own.usage.prompt_tokens,
            own.usage.completion_tokens,
        )
        entry = booked(engine, request_id)
        assert (entry.prompt_tokens, entry.completion_tokens, -entry.amount) == (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens,
        )


def test_a_message_through_the_upstream_is_its_text_billed_its_usage(direct, through, engine):
    """Anthropic's Messages on a model served by an upstream that speaks only chat
    completions: translated onto the same path, whole and streamed."""
    own = direct.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, temperature=0)
    ask: dict = {"model": "tiny", "max_tokens": 16, "messages": HELLO}
    greedy = {"temperature": 0}  # the SDK sends no sampling settings; the API takes them
    base = f"http://127.0.0.1:{through.port}"
    with anthropic.Anthropic(base_url=base, api_key=through.api_key, max_retries=0) as claude:
        message = claude.messages.create(**ask, extra_body=greedy)
        with claude.messages.stream(**ask, extra_body=greedy) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert message.content[0].text == streamed == own.choices[0].message.content
    ended = "max_tokens" if own.choices[0].finish_reason == "length" else "end_turn"
    assert message.stop_reason == final.stop_reason == ended
    for answer in (message, final):
        usage = answer.usage
        entry = booked(engine, "chatcmpl-" + answer.id.removeprefix("msg_"))
        assert (usage.input_tokens + usage.cache_read_input_tokens, usage.output_tokens) == (
            own.usage.prompt_tokens,
            own.usage.completion_tokens,
        )
        assert (entry.prompt_tokens, entry.completion_tokens) == (
            own.usage.prompt_tokens,
            own.usage.completion_tokens,
        )
