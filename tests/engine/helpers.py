"""Helpers the engine's tests share: prompts and the transformers reference of the exactness
tests, a prefill and decode steps driven by hand, a conversation for the prefix cache."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import numpy as np
import pytest

from api.engine.protocol import GenerationOutput, GenerationRequest
from api.engine.runtime.prefill import Prefill, PrefillCall
from api.engine.runtime.sequence import Sequence
from api.engine.runtime.speculation import Drafting, PromptLookup, Speculator
from tests.engine.conftest import TinyExport, greedy, manual_sequence, token_ids

# gemma's export has no position_ids input: it exercises the engine's unpadded-group fallback.
ARCHITECTURES = ["llama", "qwen2", "mistral", "gpt2", "phi3", "gemma"]


class ScriptedLookup(PromptLookup):
    """Proposes the reference continuation, every `WRONG`-th token replaced: each verify step
    meets accepted drafts, a rejection and the token after it."""

    WRONG = 3

    def __init__(self, reference: list[int], output: list[int]) -> None:
        super().__init__([], output)
        self.reference = reference

    def propose(self, limit: int) -> list[int]:
        at = len(self.output)
        draft = self.reference[at : at + limit]
        return [t if (at + i) % self.WRONG else (t + 1) % 2048 for i, t in enumerate(draft)]


class AlwaysVerify(Speculator):
    """Verifies every draft proposed, whatever the step costs."""

    def _best_width(self, rows: list[Drafting], proposals: list[list[int]]) -> int:
        return max(len(p) for p in proposals)


def draft_from(references: dict[str, list[int]]) -> Callable[[Sequence], None]:
    """For `run_steps`: each sequence drafts its reference tokens (request id -> tokens)."""

    def prepare(sequence: Sequence) -> None:
        reference = references[sequence.request_id]
        sequence.drafting = Drafting(ScriptedLookup(reference, sequence.output_ids))

    return prepare


def random_prompt(export: TinyExport, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, len(export.tokenizer)) for _ in range(length)]


def transformers_greedy(export: TinyExport, prompt: list[int], max_new_tokens: int) -> list[int]:
    """PyTorch greedy search, stopping at the generation config's EOS ids like the engine."""
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = export.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return out[0, len(prompt) :].tolist()


def top2_margins(export: TinyExport, tokens: list[int]) -> list[float]:
    """Gap between the two best logits at each step: near-ties would explain a mismatch."""
    import torch

    with torch.no_grad():
        logits = export.model(torch.tensor([tokens])).logits[0].numpy()
    best = np.sort(logits, axis=-1)[:, -2:]
    return (best[:, 1] - best[:, 0]).tolist()


def tokens_of(outputs: list[GenerationOutput]) -> list[int]:
    assert outputs[-1].finished
    return token_ids(outputs)


def assert_same_tokens(export: TinyExport, prompt: list[int], got: list[int], want: list[int]):
    if got != want:
        margins = top2_margins(export, prompt + want)[len(prompt) - 1 :]
        pytest.fail(f"{export.arch}: engine {got} != transformers {want}; margins {margins}")


def prefill_and_decode(engine, prompt: list[int], decode_steps: int) -> list[np.ndarray]:
    """Each call's logits, copied: a `SlotBatch` writes every call's into the same buffer."""
    batch = engine.scheduler._batch
    item = Prefill(manual_sequence(engine, greedy("r", prompt, decode_steps + 1)))
    steps = [batch.prefill(PrefillCall([item], len(prompt))).copy()]
    batch.join([item])
    for _ in range(decode_steps):
        item.seq.output_ids.append(int(steps[-1][0].argmax()))
        steps.append(batch.decode().copy())
    return steps


def assert_close_picks(
    got: list[np.ndarray], want: list[np.ndarray], what: str, bound: float = 0.02
) -> None:
    """Every step's logits within `bound` of the range of `want`'s, and the same tokens picked."""
    for mine, theirs in zip(got, want, strict=True):
        change = np.abs(mine - theirs).max() / np.ptp(theirs)
        print(f"{what}: {change:.4f} of the range")
        assert change < bound
        assert (np.argmax(mine, axis=-1) == np.argmax(theirs, axis=-1)).all()


FIRST_PROMPT = [(7 * i + 3) % 500 + 10 for i in range(40)]


FOLLOW_UP = [11, 402, 93, 7, 250, 36, 18, 300]


def scoped(request: GenerationRequest, scope: str | None) -> GenerationRequest:
    return dataclasses.replace(request, cache_scope=scope)
