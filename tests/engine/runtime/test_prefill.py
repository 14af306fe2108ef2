"""Planning one iteration's prefill: whole prompts batched, long ones chunked, within a budget."""

from __future__ import annotations

from api.engine.runtime.prefill import Prefill, plan_prefill
from tests.engine.conftest import DEMO_DIR, greedy, make_engine, manual_sequence


def pending(*lengths: int) -> list[Prefill]:
    engine = make_engine(DEMO_DIR)
    return [
        Prefill(manual_sequence(engine, greedy(f"r{i}", [5] * n, 4))) for i, n in enumerate(lengths)
    ]


def shape(calls) -> list[tuple[list[int], int, bool]]:
    return [([p.seq.prompt_len for p in c.group], c.tokens, c.completes) for c in calls]


def test_next_prefill_respects_token_budget() -> None:
    # 10 and 8 share a call padded to 10 (20 tokens); 9 more would make 30: the 4 tokens left
    # start the third prompt as a chunk.
    assert shape(plan_prefill(pending(10, 8, 9), 24, grouping="padded")) == [
        ([10, 8], 10, True),
        ([9], 4, False),
    ]


def test_a_long_prompt_takes_the_whole_budget_as_a_chunk() -> None:
    assert shape(plan_prefill(pending(100, 3), 32, grouping="padded")) == [([100], 32, False)]


def test_a_part_done_prompt_finishes_before_the_next_starts() -> None:
    queue = pending(40, 3)
    queue[0].done = 32
    assert shape(plan_prefill(queue, 32, grouping="padded")) == [([40], 8, True), ([3], 3, True)]


def test_a_prompt_resumed_from_a_cached_prefix_is_never_grouped_with_whole_ones() -> None:
    # Its cached keys sit in a row of its own: a padded group would prefill its remaining
    # tokens into a fresh row as if they were the whole prompt.
    queue = pending(3, 40, 5)
    queue[1].done = 32
    assert shape(plan_prefill(queue, 64, grouping="padded")) == [
        ([3], 3, True),
        ([40], 8, True),
        ([5], 5, True),
    ]


def test_without_padding_only_equal_lengths_share_a_call() -> None:
    assert shape(plan_prefill(pending(4, 4, 5), 64, grouping="equal")) == [
        ([4, 4], 4, True),
        ([5], 5, True),
    ]


def test_fused_attention_prefills_one_prompt_per_call() -> None:
    assert shape(plan_prefill(pending(4, 4, 5), 64, grouping="single")) == [
        ([4], 4, True),
        ([4], 4, True),
        ([5], 5, True),
    ]
