"""Constrained decoding in the batch: a constrained request writes only what its grammar allows,
while the unconstrained requests beside it get exactly the tokens they would get alone."""

from __future__ import annotations

import json

import llguidance
import numpy as np
import pytest

from api.engine.errors import InvalidGrammar
from api.engine.local_engine import LocalEngine
from api.engine.protocol import Constraint, GenerationRequest, SamplingParams
from api.engine.runtime.sampling import SamplerState, sample
from tests.engine.conftest import (
    DEMO_DIR,
    collect,
    greedy,
    make_engine,
    manual_sequence,
    token_ids,
)

PROMPT = [1, 355, 120, 987, 42, 7, 1500, 2, 1, 600]
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 10},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "score", "ok"],
    "additionalProperties": False,
}


def schema_constraint(schema: dict = SCHEMA) -> Constraint:
    return Constraint(llguidance.LLMatcher.grammar_from_json_schema(schema), "response_format")


def constrained(request_id: str, seed: int, constraint: Constraint) -> GenerationRequest:
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=seed, constraint=constraint)
    return GenerationRequest(request_id, PROMPT, params)


def run(engine: LocalEngine, requests: list[GenerationRequest]) -> dict[str, list[int]]:
    sequences = [manual_sequence(engine, r) for r in requests]
    for seq in sequences:
        engine.scheduler.submit(seq)
    while not all(s.finished for s in sequences):
        engine.scheduler.step()
    return {s.request_id: s.output_ids for s in sequences}


def test_a_constrained_request_writes_valid_json_and_its_neighbours_are_untouched() -> None:
    plain = [greedy("g", PROMPT, 40), greedy("h", PROMPT[:4], 40)]
    alone = run(make_engine(DEMO_DIR), plain)
    engine = make_engine(DEMO_DIR)
    together = run(engine, [constrained("c", 5, schema_constraint()), *plain])
    assert together["g"] == alone["g"] and together["h"] == alone["h"]
    answer = json.loads(engine.tokenizer.decode(together["c"]))
    assert answer["color"] in {"red", "green", "blue"} and 1 <= answer["score"] <= 10


def test_the_same_seed_gives_the_same_constrained_answer() -> None:
    first = run(make_engine(DEMO_DIR), [constrained("c", 9, schema_constraint())])
    second = run(make_engine(DEMO_DIR), [constrained("c", 9, schema_constraint())])
    assert first == second


def test_masked_tokens_are_never_sampled_and_other_rows_keep_their_logits() -> None:
    engine = make_engine(DEMO_DIR)
    constraint = schema_constraint()
    logits = np.random.default_rng(0).standard_normal((2, 2048)).astype(np.float32)
    free = SamplerState.create(SamplingParams(max_tokens=5, temperature=0.0))
    bound = SamplerState.create(
        SamplingParams(max_tokens=5, temperature=0.0), engine.grammars.matcher(constraint)
    )
    free_choice, bound_choice = sample(logits, [free, bound])
    assert free_choice.token_id == int(np.argmax(logits[0]))
    assert engine.tokenizer.decode([bound_choice.token_id]).startswith("{")


def test_logit_bias_of_100_forces_a_token_and_minus_100_bans_it() -> None:
    logits = np.zeros((1, 2048), dtype=np.float32)
    logits[0, 10] = 5.0
    forced = SamplerState.create(SamplingParams(max_tokens=5, logit_bias=((77, 100.0),)))
    banned = SamplerState.create(
        SamplingParams(max_tokens=5, temperature=0.0, logit_bias=((10, -100.0),))
    )
    assert [c.token_id for c in sample(logits, [forced])] == [77]
    assert sample(logits, [banned])[0].token_id != 10


def test_a_grammar_is_compiled_once_per_model() -> None:
    engine = make_engine(DEMO_DIR)
    first = engine.grammars.compile(schema_constraint())
    assert engine.grammars.compile(schema_constraint()) is first
    assert engine.grammars.matcher(schema_constraint()) is not first  # a copy per request


def test_a_grammar_llguidance_cannot_take_names_its_parameter() -> None:
    engine = make_engine(DEMO_DIR)
    bad = Constraint(llguidance.LLMatcher.grammar_from_lark("start: nope"), "tool_choice")
    with pytest.raises(InvalidGrammar) as error:
        engine.grammars.compile(bad)
    assert error.value.param == "tool_choice"


@pytest.mark.anyio
async def test_generate_ends_when_the_grammar_is_complete(demo_engine: LocalEngine) -> None:
    outputs = await collect(demo_engine, constrained("c", 2, schema_constraint()))
    assert outputs[-1].finish_reason == "stop"
    assert json.loads("".join(o.text for o in outputs))["ok"] in (True, False)
    assert len(token_ids(outputs)) == outputs[-1].completion_tokens
