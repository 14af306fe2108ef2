"""Greedy decoding through the engine picks exactly the tokens transformers' PyTorch picks.

Each architecture is a tiny random-weight model exported by optimum-onnx in the session fixture.
The batched cases place joins at exact scheduler steps, so sequences of different lengths share
decode steps with left padding, and each must still match its own unbatched PyTorch run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.conftest import TinyExport, collect, greedy, make_engine, run_steps
from tests.engine.helpers import (
    ARCHITECTURES,
    AlwaysVerify,
    assert_same_tokens,
    draft_from,
    random_prompt,
    tokens_of,
    transformers_greedy,
)


@pytest.fixture(params=ARCHITECTURES)
def export(request: pytest.FixtureRequest, tiny_exports) -> TinyExport:
    return tiny_exports[request.param]


def test_one_sequence_matches_transformers_greedy(export: TinyExport) -> None:
    engine = make_engine(export.path)
    prompt = random_prompt(export, 11, seed=1)
    outputs, _ = run_steps(engine, {0: [greedy("solo", prompt, 24)]})
    want = transformers_greedy(export, prompt, 24)
    assert_same_tokens(export, prompt, tokens_of(outputs["solo"]), want)


def test_sequences_joining_the_batch_at_different_steps_each_match_transformers(
    export: TinyExport,
) -> None:
    engine = make_engine(export.path, max_active_sequences=8)
    plan = [  # (join step, prompt length, max tokens)
        (0, 5, 20),
        (2, 17, 14),
        (3, 9, 18),
        (7, 30, 10),
        (7, 2, 12),
    ]
    prompts = {f"r{i}": random_prompt(export, n, seed=10 + i) for i, (_, n, _) in enumerate(plan)}
    joins: dict[int, list] = {}
    for i, (step, _, max_tokens) in enumerate(plan):
        joins.setdefault(step, []).append(greedy(f"r{i}", prompts[f"r{i}"], max_tokens))

    outputs, largest_batch = run_steps(engine, joins)

    assert largest_batch >= 4
    for i, (_, _, max_tokens) in enumerate(plan):
        prompt = prompts[f"r{i}"]
        want = transformers_greedy(export, prompt, max_tokens)
        assert_same_tokens(export, prompt, tokens_of(outputs[f"r{i}"]), want)


def test_a_crowd_of_sequences_with_speculation_on_each_match_transformers(
    export: TinyExport, library: Path
) -> None:
    """Speculation on, as served, with a crowd: eight prompts arrive at once and more join
    later, so rows of many lengths decode together, some of equal lengths apart. Where the graph's
    attention is ours, every row verifies its drafts in the same call: each drafts
    transformers' own continuation with every third token wrong, so each step meets accepted
    drafts, a rejection and rows of different widths. Where it is not (gpt2, gemma), the rows
    of equal length decode in groups, whose logits must come back to their own rows."""
    engine = make_engine(
        export.path, max_active_sequences=16, speculative_tokens=4, ops_library=library
    )
    fused = "fused-attention" in engine.model.serving_path.graph_edits
    assert (engine.scheduler.speculator is not None) == fused
    if fused:
        engine.scheduler.speculator = AlwaysVerify(4)
    lengths = [5, 12, 5, 21, 12, 8, 37, 8]  # equal lengths apart: rows grouped out of order
    plan = [(0, n, 12 + i) for i, n in enumerate(lengths)] + [(2, 17, 14), (5, 2, 12), (5, 30, 10)]
    prompts = {f"r{i}": random_prompt(export, n, seed=40 + i) for i, (_, n, _) in enumerate(plan)}
    wants = {
        f"r{i}": transformers_greedy(export, prompts[f"r{i}"], max_tokens)
        for i, (_, _, max_tokens) in enumerate(plan)
    }
    joins: dict[int, list] = {}
    for i, (step, _, max_tokens) in enumerate(plan):
        joins.setdefault(step, []).append(greedy(f"r{i}", prompts[f"r{i}"], max_tokens))

    outputs, largest_batch = run_steps(engine, joins, prepare=draft_from(wants))

    assert largest_batch >= 8
    if fused:
        assert engine.scheduler.speculator.accepted > 0
    for name, want in wants.items():
        assert_same_tokens(export, prompts[name], tokens_of(outputs[name]), want)


@pytest.mark.anyio
async def test_concurrent_streams_on_the_scheduler_thread_match_transformers(tiny_exports):
    export = tiny_exports["llama"]
    engine = make_engine(export.path)
    prompts = [random_prompt(export, n, seed=n) for n in (3, 8, 21, 13)]
    await engine.start()
    try:
        import anyio

        results: dict[int, list[int]] = {}

        async def run(i: int) -> None:
            results[i] = tokens_of(await collect(engine, greedy(f"c{i}", prompts[i], 16)))

        async with anyio.create_task_group() as group:
            for i in range(len(prompts)):
                group.start_soon(run, i)
    finally:
        await engine.shutdown()
    for i, prompt in enumerate(prompts):
        assert_same_tokens(export, prompt, results[i], transformers_greedy(export, prompt, 16))


def test_a_prompt_prefilled_in_chunks_gives_the_tokens_of_an_unchunked_prefill(
    export: TinyExport,
) -> None:
    """Chunks of 7 tokens carry the KV cache between graph calls; a short prompt that joins
    while the long one is part-way through waits its turn and decodes beside it."""
    long_prompt = random_prompt(export, 40, seed=5)
    short_prompt = random_prompt(export, 6, seed=6)
    plan = {0: [greedy("long", long_prompt, 12)], 2: [greedy("short", short_prompt, 10)]}

    chunked, _ = run_steps(make_engine(export.path, max_prefill_tokens=7), plan)
    whole, _ = run_steps(make_engine(export.path, max_prefill_tokens=64), plan)

    for name, prompt, max_tokens in (("long", long_prompt, 12), ("short", short_prompt, 10)):
        assert tokens_of(chunked[name]) == tokens_of(whole[name])
        want = transformers_greedy(export, prompt, max_tokens)
        assert_same_tokens(export, prompt, tokens_of(chunked[name]), want)
