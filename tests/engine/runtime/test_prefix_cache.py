"""A chat's next turn starts from the keys/values its previous turn computed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from api.engine.protocol import GenerationRequest
from api.engine.runtime.prefix_cache import MIN_PREFIX, PrefixCache
from tests.engine.conftest import collect, greedy, make_engine, run_steps, token_ids
from tests.engine.helpers import FIRST_PROMPT, FOLLOW_UP, scoped

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def cached_and_fresh(path: Path, *, fused: bool = True) -> AsyncIterator[tuple]:
    """Two started engines of one export: with the prefix cache, and without any."""
    engine = make_engine(path, fused_attention=fused)
    fresh = make_engine(path, fused_attention=fused, prefix_cache_bytes=0)
    await engine.start()
    await fresh.start()
    try:
        yield engine, fresh
    finally:
        await engine.shutdown()
        await fresh.shutdown()


async def ids_and_cached(engine, request: GenerationRequest) -> tuple[list[int], int]:
    outputs = await collect(engine, request)
    return token_ids(outputs), outputs[0].cached_tokens


@pytest.mark.parametrize("fused", [True, False], ids=["fused-attention", "as-exported"])
async def test_the_second_turn_prefills_only_its_new_tokens_and_answers_the_same(
    tiny_exports, fused: bool
) -> None:
    async with cached_and_fresh(tiny_exports["llama"].path, fused=fused) as (engine, fresh):
        reply, cached = await ids_and_cached(engine, scoped(greedy("t1", FIRST_PROMPT, 10), "a"))
        assert cached == 0
        second_prompt = [*FIRST_PROMPT, *reply, *FOLLOW_UP]

        answer, cached = await ids_and_cached(engine, scoped(greedy("t2", second_prompt, 12), "a"))
        expected, _ = await ids_and_cached(fresh, scoped(greedy("t2", second_prompt, 12), "a"))

    # Every position turn 1 fed the graph: its prompt and all but its last reply token.
    assert cached == len(FIRST_PROMPT) + len(reply) - 1
    assert answer == expected


async def test_a_prefix_is_never_shared_across_scopes_nor_kept_without_one(tiny_exports) -> None:
    engine = make_engine(tiny_exports["llama"].path)
    await engine.start()
    try:
        await collect(engine, scoped(greedy("alice-1", FIRST_PROMPT, 6), "alice"))
        prompt = [*FIRST_PROMPT, *FOLLOW_UP]
        _, bob = await ids_and_cached(engine, scoped(greedy("bob", prompt, 4), "bob"))
        _, anonymous = await ids_and_cached(engine, scoped(greedy("anon", prompt, 4), None))
        _, alice = await ids_and_cached(engine, scoped(greedy("alice-2", prompt, 4), "alice"))
    finally:
        await engine.shutdown()

    assert (bob, anonymous) == (0, 0)
    assert alice == len(FIRST_PROMPT)


async def test_concurrent_conversations_each_resume_their_own_cache(tiny_exports) -> None:
    """Two conversations decode side by side; each next turn finds its own prefix."""
    prompts = {"x": FIRST_PROMPT, "y": [p + 1 for p in FIRST_PROMPT]}
    async with cached_and_fresh(tiny_exports["qwen2"].path) as (engine, fresh):
        firsts = await asyncio.gather(
            *(ids_and_cached(engine, scoped(greedy(k, p, 8), "a")) for k, p in prompts.items())
        )
        seconds = {k: [*p, *firsts[i][0], *FOLLOW_UP] for i, (k, p) in enumerate(prompts.items())}
        answers = await asyncio.gather(
            *(ids_and_cached(engine, scoped(greedy(k, p, 8), "a")) for k, p in seconds.items())
        )
        expected = [(await ids_and_cached(fresh, greedy(k, p, 8)))[0] for k, p in seconds.items()]

    assert [a for a, _ in answers] == expected
    assert [c for _, c in answers] == [len(FIRST_PROMPT) + len(f) - 1 for f, _ in firsts]


@pytest.mark.parametrize("fused", [True, False], ids=["fused-attention", "as-exported"])
async def test_a_request_arriving_while_another_decodes_starts_from_its_prompt(
    tiny_exports, fused: bool
) -> None:
    """An app sends every end user's message behind one system prompt, from one account."""
    system = FIRST_PROMPT
    async with cached_and_fresh(tiny_exports["llama"].path, fused=fused) as (engine, fresh):
        first = engine.generate(scoped(greedy("user-1", [*system, 5, 6, 7], 40), "app"))
        await anext(first)  # its prompt is complete; it keeps decoding meanwhile
        second, cached = await ids_and_cached(
            engine, scoped(greedy("user-2", [*system, 8, 9], 6), "app")
        )
        await first.aclose()
        expected, _ = await ids_and_cached(fresh, greedy("user-2", [*system, 8, 9], 6))

    assert cached == len(system)
    assert second == expected


def kv(tokens: int, fill: float = 1.0) -> list[np.ndarray]:
    return [np.full((2, tokens, 4), fill, np.float32) for _ in range(2)]  # 64 bytes a token


def test_the_store_forgets_the_least_recently_used_conversation_first() -> None:
    cache = PrefixCache(max_bytes=64 * 100)
    a, b, c = ([n] * 40 for n in (1, 2, 3))
    cache.store("s", a, kv(40))
    cache.store("s", b, kv(40))
    assert cache.lookup("s", [*a, 9]) is not None  # a is now the most recently used
    cache.store("s", c, kv(40))  # 120 tokens do not fit 100: b goes

    assert cache.lookup("s", [*b, 9]) is None
    assert cache.lookup("s", [*a, 9]) is not None
    assert cache.lookup("s", [*c, 9]) is not None
    assert cache.nbytes == 64 * 80


def resident_mb() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def test_an_evicted_conversation_gives_its_memory_back_to_the_system() -> None:
    """The budget is what the server pays: evicted entries leave the process, not the cache
    only. (From malloc they stayed: a block freed from its own mapping raises glibc's mmap
    threshold, and entries below it sat in the heap between other arrays.)"""
    np.ones(8 << 20, np.uint8)  # such a block, freed: the threshold is past these entries now
    cache = PrefixCache(max_bytes=32 << 20)
    others = []
    for n in range(12):  # 12 conversations of 1 MB each, the engine's other arrays between them
        cache.store("s", [n] * 256, [np.ones((4, 256, 256), np.float16) for _ in range(2)])
        others.append(np.ones(64 << 10, np.uint8))
    held = resident_mb()

    cache.max_bytes = 1 << 20  # the next store makes room: all 12 go
    cache.store("s", [99] * 16, [np.ones((4, 16, 256), np.float16) for _ in range(2)])

    assert len(cache) == 1
    assert held - resident_mb() >= 9  # of the 12 MB they held


def test_a_longer_turn_replaces_the_entry_it_extends_and_a_match_leaves_a_token_to_prefill() -> (
    None
):
    cache = PrefixCache(max_bytes=1 << 20)
    turn1 = list(range(100, 130))
    turn2 = [*turn1, *range(200, 220)]
    cache.store("s", turn1, kv(len(turn1), 1.0))
    cache.store("s", turn2, kv(len(turn2), 2.0))
    assert len(cache) == 1

    hit = cache.lookup("s", turn2)  # the whole prompt is stored: its last token is not taken
    assert hit is not None and hit.tokens == len(turn2) - 1
    assert hit.kv[0].shape == (2, len(turn2) - 1, 4) and float(hit.kv[0].max()) == 2.0
    assert cache.lookup("s", [*turn1[: MIN_PREFIX - 1], 999, 999]) is None  # too short a match


def test_a_next_turn_arriving_with_new_prompts_answers_the_same_and_frees_its_row(
    tiny_exports, library
) -> None:
    """A burst where a new conversation comes first and a next turn second, twice, in a
    three-row batch: the next turn answers as if prefilled whole, and every row comes back.
    (With our attention op, whole prompts of a burst share a prefill call.)"""
    path = tiny_exports["llama"].path
    engine = make_engine(path, ops_library=library, max_active_sequences=3)
    fresh = make_engine(path, ops_library=library, prefix_cache_bytes=0)
    assert engine.scheduler._batch.grouping == "padded"
    outputs, _ = run_steps(engine, {0: [scoped(greedy("t1", FIRST_PROMPT, 10), "a")]})
    second_prompt = [*FIRST_PROMPT, *token_ids(outputs["t1"]), *FOLLOW_UP]

    for burst in range(2):
        newcomer = scoped(greedy(f"new-{burst}", FOLLOW_UP * 2, 6), f"n{burst}")
        next_turn = scoped(greedy(f"t2-{burst}", second_prompt, 6), "a")
        outputs, _ = run_steps(engine, {0: [newcomer, next_turn]})
        expected, _ = run_steps(fresh, {0: [next_turn]})

        assert outputs[next_turn.request_id][0].cached_tokens > len(FIRST_PROMPT)
        assert token_ids(outputs[next_turn.request_id]) == token_ids(expected[next_turn.request_id])

    full = [greedy(f"after-{i}", FOLLOW_UP, 4) for i in range(3)]
    assert run_steps(engine, {0: full})[1] == 3  # a leaked row would leave two


def test_among_many_conversations_sharing_a_system_prompt_each_finds_its_own() -> None:
    """An app's end users all start with its system prompt: every turn must still resume its
    own conversation, the oldest as well as the newest, wherever the two part in a block."""
    system = list(range(1000, 1000 + 3 * MIN_PREFIX + 5))  # not a whole number of blocks
    rng = np.random.default_rng(3)
    chats = [[*system, *rng.integers(2000, 9000, 30).tolist()] for _ in range(300)]
    cache = PrefixCache(max_bytes=1 << 30)
    for chat in chats:
        cache.store("app", chat, kv(len(chat)))

    for chat in (chats[0], chats[150], chats[-1]):
        hit = cache.lookup("app", [*chat, 5, 6])
        assert hit is not None and hit.tokens == len(chat)
    # a prompt that leaves the oldest conversation in the middle of a block
    parted = [*chats[0][:-3], 1, 2, 3, 4]
    hit = cache.lookup("app", parted)
    assert hit is not None and hit.tokens == len(chats[0]) - 3
    assert cache.lookup("other", [*chats[0], 5]) is None


def test_a_turn_replaces_the_entries_it_covers_but_not_a_longer_one() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    prompt = list(range(100, 140))
    cache.store("s", prompt, kv(len(prompt)))
    whole = [*prompt, *range(300, 320)]
    cache.store("s", whole, kv(len(whole)))
    assert len(cache) == 1  # the prompt's entry is covered by the whole turn's
    cache.store("s", prompt[:35], kv(35))  # covered by the stored turn: nothing new is kept
    assert len(cache) == 1 and cache.nbytes == 64 * len(whole)
