"""Chat completions through the official `openai` SDK, as a developer switching from OpenAI."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

HELLO = [{"role": "user", "content": "Say hello to the shop."}]


def test_a_completion_has_openais_shape(client: openai.OpenAI):
    completion = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=12, temperature=0
    )
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == "demo"
    [choice] = completion.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens > 0


def test_max_tokens_ends_generation_with_length(client: openai.OpenAI):
    completion = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=5, temperature=0, stop=None
    )
    if completion.choices[0].finish_reason == "length":
        assert completion.usage.completion_tokens == 5
    else:  # the demo model chose to stop early
        assert completion.usage.completion_tokens < 5


def test_max_completion_tokens_is_the_same_limit(client: openai.OpenAI):
    completion = client.chat.completions.create(
        model="demo", messages=HELLO, max_completion_tokens=3, temperature=0
    )
    assert completion.usage.completion_tokens <= 3


def test_streamed_deltas_add_up_to_the_same_text_as_a_plain_answer(client: openai.OpenAI):
    plain = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=40, temperature=0.8, seed=7
    )
    stream = client.chat.completions.create(
        model="demo",
        messages=HELLO,
        max_tokens=40,
        temperature=0.8,
        seed=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == plain.choices[0].message.content
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1
    assert finishing[0].choices[0].finish_reason == plain.choices[0].finish_reason
    # The same prompt again: its usage may differ only in the prompt tokens found cached.
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump(exclude={"prompt_tokens_details"}) == plain.usage.model_dump(
        exclude={"prompt_tokens_details"}
    )
    assert {chunk.id for chunk in chunks} == {chunks[0].id}


def test_the_raw_stream_is_server_sent_events_ending_in_done(server, api_key):
    with httpx.stream(
        "POST",
        f"{server.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": "demo", "messages": HELLO, "max_tokens": 6, "stream": True},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = chunks[-1]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] in ("stop", "length")
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)


def test_stop_strings_end_the_answer_before_the_stop(client: openai.OpenAI):
    free = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=30, temperature=0
    )
    text = free.choices[0].message.content
    if len(text) < 4:
        pytest.fail(f"the demo model answered too little to test stop strings: {text!r}")
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=30, temperature=0, stop=[stop, "\u2603never"]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]


def test_n_choices_are_returned_and_billed_together(client: openai.OpenAI):
    completion = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=8, n=3, temperature=1.0, seed=1
    )
    assert [choice.index for choice in completion.choices] == [0, 1, 2]
    assert 3 <= completion.usage.completion_tokens <= 3 * 8
    assert len({choice.message.content for choice in completion.choices}) > 1  # seeds differ


def test_n_choices_stream_with_their_indexes(client: openai.OpenAI):
    stream = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=5, n=2, stream=True
    )
    chunks = list(stream)
    finished = sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason)
    assert finished == [0, 1]


def test_same_seed_same_answer(client: openai.OpenAI):
    answers = {
        client.chat.completions.create(
            model="demo", messages=HELLO, max_tokens=20, temperature=1.0, seed=42
        )
        .choices[0]
        .message.content
        for _ in range(2)
    }
    assert len(answers) == 1


def test_logprobs_are_returned_when_asked(client: openai.OpenAI):
    completion = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = completion.choices[0].logprobs.content
    assert len(content) == completion.usage.completion_tokens
    assert all(item.logprob <= 0 and len(item.top_logprobs) == 2 for item in content)


def test_content_parts_and_developer_role_are_accepted(client: openai.OpenAI):
    completion = client.chat.completions.create(
        model="demo",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
        max_tokens=3,
    )
    assert completion.choices[0].message.role == "assistant"


@pytest.mark.anyio
async def test_the_async_client_streams_too(async_client: openai.AsyncOpenAI):
    stream = await async_client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=6, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    completion = await async_client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=3
    )
    assert completion.usage.completion_tokens <= 3


CONVERSATION = [
    {
        "role": "system",
        "content": "You are the shop's assistant. You answer questions about token packs, "
        "keys, balances and the models on sale, briefly and politely, in plain words.",
    },
    {"role": "user", "content": "Which pack should I buy for a small chatbot?"},
]


def test_the_next_turn_of_a_conversation_reports_its_prompt_as_cached(
    client: openai.OpenAI, server, make_client, make_funded_key
):
    first = client.chat.completions.create(
        model="demo", messages=CONVERSATION, max_tokens=8, temperature=0
    )
    next_turn = [
        *CONVERSATION,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And how long does it last?"},
    ]
    second = client.chat.completions.create(
        model="demo", messages=next_turn, max_tokens=8, temperature=0
    )
    stranger = make_client(server, make_funded_key()).chat.completions.create(
        model="demo", messages=next_turn, max_tokens=8, temperature=0
    )

    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # The first turn's prompt was computed once; only where the reply's text re-tokenizes
    # differently from the tokens generated can a few of its last positions be computed again.
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 2 <= cached < second.usage.prompt_tokens
    assert stranger.usage.prompt_tokens_details.cached_tokens == 0  # another account's cache
    assert stranger.choices[0].message.content == second.choices[0].message.content
