"""Prompt-lookup speculative decoding: a client gets the same text with drafts as without them,
greedy or seeded, constrained, penalised or ending mid-draft, and drafts are made only while
they pay."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest

from api.engine.protocol import Constraint, GenerationRequest, SamplingParams
from api.engine.runtime.speculation import (
    RETRY_STEPS,
    Drafting,
    PromptLookup,
    Speculator,
    StepCosts,
)
from tests.engine.conftest import DEMO_DIR, greedy, make_engine, manual_sequence, token_ids
from tests.engine.helpers import AlwaysVerify, ScriptedLookup

# A prompt that repeats itself, as a document being edited does: its continuation is predicted
# by looking it up.
REPEATING = [5, 81, 402, 17, 93, 250, 36, 7, 640, 12] * 6
MIXED = [1, 355, 120, 987, 42, 7, 1500, 2, 1, 600]


# ---- the drafts --------------------------------------------------------------------------------


def test_lookup_proposes_what_followed_the_latest_occurrence_of_the_longest_ngram() -> None:
    # ... 1 2 3 [4 5 6] ... 9 2 3 [7 8] ... 2 3  -> "2 3" last occurred before 7 8 (n=2);
    # "1 2 3" (n=3) is not the tail, so the 2-gram's latest match wins.
    lookup = PromptLookup([1, 2, 3, 4, 5, 6, 9, 2, 3, 7, 8, 0], [2, 3])
    assert lookup.propose(4) == [7, 8, 0, 2]
    assert lookup.propose(1) == [7]


def test_lookup_never_matches_the_tail_itself_and_follows_the_output() -> None:
    output: list[int] = []
    lookup = PromptLookup([10, 11, 12], output)
    assert lookup.propose(3) == []  # 12 occurs only as the tail
    output.append(10)
    assert lookup.propose(3) == [11, 12, 10]
    output.extend([11, 99])
    assert lookup.propose(3) == []


def test_a_match_that_runs_into_the_end_drafts_its_loop_onwards() -> None:
    assert PromptLookup([1, 7, 7, 7], []).propose(4) == [7, 7, 7, 7]
    assert PromptLookup([5, 1, 2, 3, 1, 2], []).propose(5) == [3, 1, 2, 3, 1]


def test_a_step_costs_fit_follows_the_steps_timed() -> None:
    costs = StepCosts()
    for _ in range(200):
        costs.record(1, 0.010)
        costs.record(5, 0.030)
    assert costs.seconds(1) == pytest.approx(0.010, rel=0.05)
    assert costs.seconds(5) == pytest.approx(0.030, rel=0.05)
    assert costs.seconds(9) == pytest.approx(0.050, rel=0.1)


def test_drafts_stop_for_a_sequence_that_rejects_them_and_are_tried_again_later() -> None:
    speculator = Speculator(max_drafts=4)
    drafting = Drafting(PromptLookup([3, 4, 5, 3, 4], [5]))
    assert speculator.drafts([(drafting, 10)]) == [[3, 4, 5, 3]]
    for _ in range(6):  # every draft rejected, a widened step costing 1.5 plain ones
        speculator.record([drafting], [[3, 4, 5, 3]], [0], 0.015)
        speculator.record([drafting], [[]], [0], 0.010)
    assert speculator.drafts([(drafting, 10)]) == [[]]
    for _ in range(RETRY_STEPS):
        speculator.record([drafting], [[]], [0], 0.010)
    assert speculator.drafts([(drafting, 10)]) != [[]]


def test_a_full_batch_whose_extra_positions_cost_a_token_each_does_not_draft() -> None:
    speculator = Speculator(max_drafts=4)
    rows = [Drafting(PromptLookup([3, 4, 5, 3, 4], [5]), acceptance=0.5) for _ in range(8)]
    for width in (1, 2, 3):  # compute-bound: time grows with every token computed
        for _ in range(50):
            speculator.record(rows, [[7] * (width - 1)] * 8, [0] * 8, 0.001 * 8 * width)
    assert speculator.drafts([(r, 10) for r in rows]) == [[]] * 8


def test_a_lone_stream_drafts_again_after_a_busy_spell_found_drafts_dear() -> None:
    speculator = Speculator(max_drafts=4)
    busy = [Drafting(PromptLookup([3, 4, 5, 3, 4], [5]), acceptance=0.5) for _ in range(8)]
    for width in (1, 2, 3):  # eight rows: each position costs a token's compute
        for _ in range(50):
            speculator.record(busy, [[7] * (width - 1)] * 8, [0] * 8, 0.001 * 8 * width)
    lone = Drafting(PromptLookup([3, 4, 5, 3, 4], [5]))
    assert speculator.drafts([(lone, 10)]) == [[3, 4, 5, 3]]
    for _ in range(20):  # one row reads the weights: its drafts cost little
        speculator.record([lone], [[3, 4, 5, 3]], [4], 0.012)
        speculator.record([lone], [[]], [0], 0.010)
    assert speculator.drafts([(lone, 10)]) == [[3, 4, 5, 3]]
    assert speculator.drafts([(r, 10) for r in busy]) == [[]] * 8


# ---- the same text with and without drafts -----------------------------------------------------
#
# A random tiny model seldom repeats its context, so prompt lookup would seldom draft here
# (bench/speculative.py measures it on a model that does). These tests draft the text a request
# is known to produce, from a run without drafts, with every third draft token wrong, and
# always verify them: every step meets accepted drafts, a rejection and the token after it.


def generate(
    requests: list[GenerationRequest],
    *,
    scripted: dict | None = None,
    path: Path = DEMO_DIR,
    **engine,
):
    """Each request's outputs, all joining at step 0, and the engine; with `scripted`
    (request id -> its reference tokens), drafts of those tokens are verified every step."""
    eng = make_engine(path, speculative_tokens=4 if scripted else 0, **engine)
    sequences = [manual_sequence(eng, r) for r in requests]
    if scripted:
        eng.scheduler.speculator = AlwaysVerify(4)
        for seq in sequences:
            seq.drafting = Drafting(ScriptedLookup(scripted[seq.request_id], seq.output_ids))
    for seq in sequences:
        eng.scheduler.submit(seq)
    while not all(s.finished for s in sequences):
        eng.scheduler.step()
    return {s.request_id: list(s.queue) for s in sequences}, eng  # type: ignore[call-overload]


def assert_same_with_and_without_drafts(requests: list[GenerationRequest], **engine) -> dict:
    """The outputs of `requests` with scripted drafts, checked against a run without."""
    plain, _ = generate(requests, **engine)
    reference = {r: token_ids(o) for r, o in plain.items()}
    drafted, eng = generate(requests, scripted=reference, **engine)
    assert {r: token_ids(o) for r, o in drafted.items()} == reference
    for rid, outputs in drafted.items():
        assert [o.text for o in outputs] == [o.text for o in plain[rid]]
        assert outputs[-1].finish_reason == plain[rid][-1].finish_reason
    speculator = eng.scheduler.speculator
    assert speculator.accepted > 0
    assert eng.scheduler.steps < sum(len(o) for o in plain.values())  # tokens came several a step
    return drafted


def test_greedy_text_is_identical_token_for_token(library: Path) -> None:
    drafted = assert_same_with_and_without_drafts([greedy("r", REPEATING, 60)], ops_library=library)
    assert len(token_ids(drafted["r"])) == 60


def test_greedy_text_is_identical_on_onnx_runtimes_attention_too() -> None:
    """ONNX Runtime's attention verifies one row's drafts (not several: those decode plainly)."""
    assert_same_with_and_without_drafts([greedy("r", REPEATING, 40)])
    two = [greedy("a", REPEATING, 40), greedy("b", MIXED, 40)]
    plain, _ = generate(two)
    reference = {r: token_ids(o) for r, o in plain.items()}
    drafted, engine = generate(two, scripted=reference)
    assert {r: token_ids(o) for r, o in drafted.items()} == reference
    assert engine.scheduler.speculator.proposed == 0


def test_seeded_sampling_gives_the_same_tokens_with_drafts(library: Path) -> None:
    params = SamplingParams(max_tokens=48, temperature=0.7, top_p=0.95, seed=11)
    assert_same_with_and_without_drafts(
        [GenerationRequest("s", REPEATING, params)], ops_library=library
    )


def test_penalties_logprobs_and_bias_apply_at_every_verified_position(library: Path) -> None:
    params = SamplingParams(
        max_tokens=40,
        temperature=0.0,
        frequency_penalty=0.3,
        logprobs=True,
        top_logprobs=2,
        logit_bias=((7, -3.0),),
    )
    request = GenerationRequest("p", REPEATING, params)
    drafted = assert_same_with_and_without_drafts([request], ops_library=library)
    plain, _ = generate([request], ops_library=library)

    def logprobs(outputs):  # noqa: ANN001, ANN202
        return [(e.token, e.logprob) for o in outputs for e in o.logprobs]

    got, want = logprobs(drafted["p"]), logprobs(plain["p"])
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[1] for g in got] == pytest.approx([w[1] for w in want], abs=1e-4)


def test_a_batch_of_different_requests_each_gets_its_own_text(library: Path) -> None:
    assert_same_with_and_without_drafts(
        [
            greedy("a", REPEATING, 50),
            greedy("b", MIXED, 30),
            greedy("c", REPEATING[3:40], 45),
            GenerationRequest("d", REPEATING[:25], SamplingParams(max_tokens=33, seed=2)),
        ],
        ops_library=library,
    )


@pytest.mark.parametrize("max_tokens", [3, 4, 7])
def test_max_tokens_ends_a_request_inside_a_draft(library: Path, max_tokens: int) -> None:
    drafted = assert_same_with_and_without_drafts(
        [greedy("m", REPEATING, max_tokens)], ops_library=library
    )
    assert len(token_ids(drafted["m"])) == max_tokens
    assert drafted["m"][-1].finish_reason == "length"


def test_a_stop_string_inside_a_draft_ends_the_text_where_it_would_without(library: Path) -> None:
    plain, _ = generate([greedy("s", REPEATING, 30)], ops_library=library)
    text = "".join(o.text for o in plain["s"])
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    drafted = assert_same_with_and_without_drafts(
        [greedy("s", REPEATING, 30, stop=(stop,))], ops_library=library
    )
    assert drafted["s"][-1].finish_reason == "stop"
    assert stop not in "".join(o.text for o in drafted["s"])


def test_a_json_schema_constraint_holds_at_every_verified_position(library: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}}, "required": ["a"]}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    constraint = Constraint(grammar, "response_format")
    params = SamplingParams(max_tokens=60, temperature=0.0, constraint=constraint)
    drafted = assert_same_with_and_without_drafts(
        [GenerationRequest("j", REPEATING, params)], ops_library=library
    )
    assert json.loads("".join(o.text for o in drafted["j"]))["a"] in {"x", "yy"}


def test_a_next_turn_reuses_what_a_speculative_turn_cached(library: Path) -> None:
    """Keys and values of rejected drafts stay past a row's length: the prefix cache keeps only
    what the sequence took, so the next turn starts from the right keys and values."""
    first = GenerationRequest("t1", REPEATING, greedy("", [], 30).params, cache_scope="acct")
    plain, _ = generate([first], ops_library=library)
    reference = {"t1": token_ids(plain["t1"])}
    drafted, engine = generate([first], scripted=reference, ops_library=library)
    assert token_ids(drafted["t1"]) == reference["t1"]
    follow = GenerationRequest(
        "t2", [*REPEATING, *reference["t1"], 9, 8, 7], first.params, cache_scope="acct"
    )
    sequence = manual_sequence(engine, follow)
    engine.scheduler.speculator = None
    engine.scheduler.submit(sequence)
    while not sequence.finished:
        engine.scheduler.step()
    assert sequence.cached_tokens >= len(REPEATING) + 29  # what the first turn fed
    fresh, _ = generate(
        [GenerationRequest("t2", follow.prompt_token_ids, follow.params)], ops_library=library
    )
    assert sequence.output_ids == token_ids(fresh["t2"])


def test_speculative_tokens_0_turns_drafting_off() -> None:
    assert make_engine(DEMO_DIR, speculative_tokens=0).scheduler.speculator is None
    assert make_engine(DEMO_DIR).scheduler.speculator is not None  # on by default


@pytest.mark.usefixtures("isa")
def test_an_int4_model_on_our_kernels_gives_the_same_text(int4_export: Path, library: Path) -> None:
    """Our int4 and int8 kernels quantize each row's activations on their own, so a verified
    position gets the logits a decode step would. The head is on our int8 op on every CPU, AVX2
    too: ONNX Runtime's shared scales would turn drafts off (below)."""
    requests = [greedy("a", REPEATING, 40), greedy("b", MIXED, 24)]
    assert_same_with_and_without_drafts(requests, path=int4_export, ops_library=library)


def test_no_drafts_where_quantization_scales_span_a_call(int4_export: Path) -> None:
    """ONNX Runtime's dynamic int8 head scales a whole call's activations at once: a verified
    position's logits could differ from a decode step's, so such a graph never drafts."""
    assert make_engine(int4_export).scheduler.speculator is None
