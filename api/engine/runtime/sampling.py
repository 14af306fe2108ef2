"""Pick the next token for every sequence of a batch from raw logits, in numpy.

Sampling runs on the logits ONNX Runtime returns, with no second tensor library: on a few cores
a torch thread pool would compete with ONNX Runtime's (see FACTS.md), and full-vocabulary ops
are cheap in numpy when done once per step for the whole batch. Rows at temperature 0 are
greedy (argmax of the penalised logits, exactly what transformers' greedy search picks).

Each sampled request owns a `numpy.random.Generator` seeded from its `seed`, drawing one uniform
per step, so the same seed gives the same tokens whatever else shares the batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import llguidance
import numpy as np

from api.engine.protocol import SamplingParams
from api.engine.runtime import constraints

# The nucleus of top_p is looked for among this many most likely tokens first (a partial sort);
# only when their mass falls short of top_p is the whole vocabulary sorted. Exact either way.
_TOP_P_CANDIDATES = 256


@dataclass
class SamplerState:
    """Per-request sampling state that survives across steps."""

    params: SamplingParams
    rng: np.random.Generator | None = None
    output_counts: Counter[int] = field(default_factory=Counter)
    # llguidance's state of the request's constraint (`constraints.py`), advanced per token
    matcher: llguidance.LLMatcher | None = None
    bias_ids: np.ndarray | None = None  # logit_bias: token ids and the values added to them
    bias_values: np.ndarray | None = None

    @classmethod
    def create(
        cls, params: SamplingParams, matcher: llguidance.LLMatcher | None = None
    ) -> SamplerState:
        rng = None if params.temperature == 0 else np.random.default_rng(params.seed)
        state = cls(params=params, rng=rng, matcher=matcher)
        if params.logit_bias:
            state.bias_ids = np.array([i for i, _ in params.logit_bias], dtype=np.int64)
            state.bias_values = np.array([v for _, v in params.logit_bias], dtype=np.float32)
        return state

    @property
    def constraint_done(self) -> bool:
        """The constraint is complete (nothing may follow) or was broken: generation ends."""
        return self.matcher is not None and (self.matcher.is_stopped() or self.matcher.is_error())

    @property
    def has_penalties(self) -> bool:
        return bool(self.params.presence_penalty or self.params.frequency_penalty)

    def record(self, token_id: int) -> None:
        if self.has_penalties:
            self.output_counts[token_id] += 1
        if self.matcher is not None and not self.matcher.is_stopped():
            self.matcher.consume_token(token_id)  # an EOS it allowed stops it


@dataclass(frozen=True)
class TokenChoice:
    """A sampled token with, when asked for, its logprob and the top alternatives."""

    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


def _constrain(logits: np.ndarray, states: Sequence[SamplerState]) -> np.ndarray:
    """Each row's llguidance mask (disallowed tokens to -inf), then its logit_bias; rows with
    neither are untouched, and when no row has either the logits are returned as they came."""
    matchers = [s.matcher for s in states]
    constrained = [row for row, m in enumerate(matchers) if m is not None]
    biased = [row for row, s in enumerate(states) if s.bias_ids is not None]
    if not constrained and not biased:
        return logits
    logits = logits.copy()
    if constrained:
        mask = constraints.fill_masks(constraints.executor(), matchers, logits.shape[1])
        assert mask is not None
        constraints.apply_masks(logits, mask, constrained)
    for row in biased:
        state = states[row]
        logits[row, state.bias_ids] += state.bias_values  # type: ignore[index]
    return logits


def _apply_penalties(logits: np.ndarray, states: Sequence[SamplerState]) -> np.ndarray:
    """OpenAI's presence/frequency penalties over the tokens generated so far."""
    penalised = None
    for row, state in enumerate(states):
        if not state.has_penalties or not state.output_counts:
            continue
        if penalised is None:
            penalised = logits.copy()
        ids = np.fromiter(state.output_counts.keys(), dtype=np.int64)
        counts = np.fromiter(state.output_counts.values(), dtype=np.float32)
        penalised[row, ids] -= (
            counts * state.params.frequency_penalty + state.params.presence_penalty
        )
    return logits if penalised is None else penalised


def _top_k_mask(probs: np.ndarray, top_k: int) -> np.ndarray:
    """Zero every probability but the `top_k` largest (applied before top_p, as vLLM does)."""
    keep = np.argpartition(-probs, top_k - 1)[:top_k]
    masked = np.zeros_like(probs)
    masked[keep] = probs[keep]
    return masked


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero every probability outside the smallest set of top tokens whose mass reaches top_p."""
    vocab = probs.shape[0]
    k = min(_TOP_P_CANDIDATES, vocab)
    candidates = np.argpartition(-probs, k - 1)[:k] if k < vocab else np.arange(vocab)
    order = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[order])
    if cumulative[-1] < top_p * probs.sum() and k < vocab:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
    keep = int(np.searchsorted(cumulative, top_p * probs.sum(), side="left")) + 1
    masked = np.zeros_like(probs)
    chosen = order[:keep]
    masked[chosen] = probs[chosen]
    return masked


def _log_softmax(row: np.ndarray) -> np.ndarray:
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def sample(logits: np.ndarray, states: Sequence[SamplerState]) -> list[TokenChoice]:
    """Choose one token per row of `logits` [batch, vocab] (float32, raw model output)."""
    if logits.dtype != np.float32:
        logits = logits.astype(np.float32)
    adjusted = _apply_penalties(_constrain(logits, states), states)
    tokens = np.empty(len(states), dtype=np.int64)

    greedy = [i for i, s in enumerate(states) if s.params.temperature == 0]
    if len(greedy) == len(states):  # the common case: one argmax, no copy of the rows
        tokens[:] = np.argmax(adjusted, axis=1)
    elif greedy:
        tokens[greedy] = np.argmax(adjusted[greedy], axis=1)

    sampled = [i for i, s in enumerate(states) if s.params.temperature != 0]
    if sampled:
        temperatures = np.array([states[i].params.temperature for i in sampled], np.float32)
        scaled = adjusted[sampled] / temperatures[:, None]
        scaled -= scaled.max(axis=1, keepdims=True)
        probs = np.exp(scaled)
        for j, i in enumerate(sampled):
            if 0 < states[i].params.top_k < probs.shape[1]:
                probs[j] = _top_k_mask(probs[j], states[i].params.top_k)
            if states[i].params.top_p < 1.0:
                probs[j] = _top_p_mask(probs[j], states[i].params.top_p)
        cumulative = np.cumsum(probs, axis=1)
        uniforms = np.array([states[i].rng.random() for i in sampled])  # type: ignore[union-attr]
        thresholds = uniforms * cumulative[:, -1]
        picked = (cumulative <= thresholds[:, None]).sum(axis=1)
        tokens[sampled] = np.minimum(picked, logits.shape[1] - 1)

    choices = []
    for row, state in enumerate(states):
        token = int(tokens[row])
        state.record(token)
        if not state.params.logprobs:
            choices.append(TokenChoice(token))
            continue
        # Logprobs describe the model's own distribution (raw logits), as vLLM reports them.
        logprobs = _log_softmax(logits[row])
        top: tuple[tuple[int, float], ...] = ()
        n = min(state.params.top_logprobs, logprobs.shape[0])
        if n > 0:
            best = np.argpartition(-logprobs, n - 1)[:n]
            best = best[np.argsort(-logprobs[best], kind="stable")]
            top = tuple((int(t), float(logprobs[t])) for t in best)
        choices.append(TokenChoice(token, float(logprobs[token]), top))
    return choices
