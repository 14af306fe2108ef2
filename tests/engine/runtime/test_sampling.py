"""Sampling on raw logits: greedy, temperature, top_p, penalties, seeds, logprobs."""

from __future__ import annotations

import numpy as np
import pytest

from api.engine.protocol import SamplingParams
from api.engine.runtime.sampling import SamplerState, _top_k_mask, _top_p_mask, sample


def state(**params) -> SamplerState:
    return SamplerState.create(SamplingParams(max_tokens=10, **params))


def test_temperature_zero_is_argmax_per_row() -> None:
    logits = np.array([[0.0, 3.0, 1.0], [5.0, 1.0, 4.9]], np.float32)
    choices = sample(logits, [state(temperature=0), state(temperature=0)])
    assert [c.token_id for c in choices] == [1, 0]


def test_greedy_and_sampled_rows_share_one_call() -> None:
    logits = np.zeros((3, 50), np.float32)
    logits[:, 7] = 100.0  # every row is certain, sampled or not
    choices = sample(logits, [state(temperature=0), state(seed=1), state(seed=2, top_p=0.5)])
    assert [c.token_id for c in choices] == [7, 7, 7]


def test_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([[0.7, 0.2, 0.1, 1e-9]], np.float32))
    s = state(seed=0)
    picks = [sample(logits, [s])[0].token_id for _ in range(4000)]
    freq = np.bincount(picks, minlength=4) / len(picks)
    assert freq[3] == 0
    np.testing.assert_allclose(freq[:3], [0.7, 0.2, 0.1], atol=0.03)


def test_low_temperature_sharpens() -> None:
    logits = np.log(np.array([[0.6, 0.4]], np.float32))
    s = state(seed=0, temperature=0.05)
    assert {sample(logits, [s])[0].token_id for _ in range(200)} == {0}


@pytest.mark.parametrize("vocab", [10, 5000])  # inside and beyond the partial-sort shortcut
def test_top_p_keeps_the_smallest_set_reaching_p(vocab: int) -> None:
    probs = np.full(vocab, 1e-7)
    probs[[3, 1, 8]] = [0.5, 0.3, 0.2]
    masked = _top_p_mask(probs, 0.79)
    assert set(np.flatnonzero(masked)) == {3, 1}
    masked = _top_p_mask(probs, 0.81)
    assert set(np.flatnonzero(masked)) == {3, 1, 8}


def test_top_p_falls_back_to_a_full_sort_when_the_head_is_too_light() -> None:
    probs = np.full(1000, 1.0)
    masked = _top_p_mask(probs, 0.9)
    assert np.count_nonzero(masked) == 900


def test_top_k_keeps_the_k_likeliest_and_one_is_greedy() -> None:
    probs = np.array([0.1, 0.4, 0.05, 0.3, 0.15])
    assert set(np.flatnonzero(_top_k_mask(probs, 2))) == {1, 3}
    logits = np.log(np.array([[0.3, 0.35, 0.35 - 1e-3]], np.float32))
    s = state(seed=0, top_k=1)
    assert {sample(logits, [s])[0].token_id for _ in range(100)} == {1}


def test_same_seed_same_tokens() -> None:
    logits = np.random.default_rng(0).normal(size=(1, 300)).astype(np.float32)
    first, second, other = state(seed=5), state(seed=5), state(seed=6)
    run = [sample(logits, [first])[0].token_id for _ in range(30)]
    assert run == [sample(logits, [second])[0].token_id for _ in range(30)]
    assert run != [sample(logits, [other])[0].token_id for _ in range(30)]


def test_frequency_and_presence_penalties_follow_openai() -> None:
    logits = np.array([[2.0, 1.9, 0.0]], np.float32)
    s = state(temperature=0, frequency_penalty=0.5, presence_penalty=0.0)
    s.output_counts.update({0: 1})
    assert sample(logits, [s])[0].token_id == 1  # 2.0 - 0.5 < 1.9
    p = state(temperature=0, presence_penalty=0.05)
    p.output_counts.update({0: 3})
    assert sample(logits, [p])[0].token_id == 0  # presence counts once: 1.95 > 1.9


def test_logprobs_are_the_model_distribution() -> None:
    logits = np.log(np.array([[0.5, 0.25, 0.125, 0.125]], np.float32))
    choice = sample(logits, [state(temperature=0, logprobs=True, top_logprobs=2)])[0]
    assert choice.token_id == 0
    assert choice.logprob == pytest.approx(np.log(0.5), abs=1e-6)
    assert [t for t, _ in choice.top] == [0, 1]
    assert choice.top[1][1] == pytest.approx(np.log(0.25), abs=1e-6)
