"""A float16 KV cache (`ENGINE_KV_CACHE_DTYPE=float16`): our attention op over half the bytes.

The op stores each new key (rotated) and value rounded to float16 and widens them again as it
reads them, so attention itself still computes in float32. What a user would check: the cache
holds exactly the float32 cache's values rounded, attention's outputs move by float16's
rounding only, and a served model keeps the float32 cache's greedy tokens (the share is printed).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from api.engine.graph.attention import HALF_CACHE_OP_TYPE, use_attention_kernel, use_half_cache
from api.engine.model.causal_lm import OnnxCausalLM
from api.main import _load_models
from api.settings import ApiSettings
from tests.conftest import TEST_SECRET_KEY
from tests.engine.conftest import DEMO_DIR, greedy, make_engine, run_steps, token_ids
from tests.engine.graphs import (
    QWEN,
    SHAPES,
    Shape,
    attention_graph,
    run_in_place,
    session,
    token_feeds,
)
from tests.engine.helpers import FIRST_PROMPT, FOLLOW_UP, scoped

# Measured on the tiny llama export (printed by the test): 1.00. The bound catches a cache
# read at the wrong offset or in the wrong type, which turns the tokens to noise.
MIN_AGREEMENT = 0.9


def float_and_half(shape: Shape, library: Path):
    """Our op over a float32 cache and over a float16 one, on the same graph."""
    scale = 1.0 / np.sqrt(shape.dim)
    graphs = [attention_graph(shape, rotary=True, packed=True, scale=scale) for _ in range(2)]
    for graph in graphs:
        assert use_attention_kernel(graph) == 1
    assert use_half_cache(graphs[1])
    assert [n.op_type for n in graphs[1].graph.node] == [HALF_CACHE_OP_TYPE]
    return session(graphs[0], library), session(graphs[1], library)


def compare(shape: Shape, library: Path, past: list[int], tokens: int) -> None:
    """Rows holding `past` tokens take `tokens` new ones, from the same float16 values in both
    caches: the half cache ends as the float one rounded, and the outputs stay within rounding."""
    floats, halves = float_and_half(shape, library)
    rows, capacity = len(past), max(past) + tokens + 5
    rng = np.random.default_rng(7)
    start = rng.standard_normal((rows, shape.kv_heads, capacity, shape.dim)).astype(np.float16)
    float_cache = [start.astype(np.float32), start[:, :, ::-1].astype(np.float32)]
    half_cache = [start.copy(), start[:, :, ::-1].copy()]
    lengths = np.array(past) + tokens
    feeds = token_feeds(shape, True, rows, tokens, seed=len(past) + tokens)
    want = run_in_place(floats, feeds, float_cache, lengths)
    got = run_in_place(halves, feeds, half_cache, lengths)
    for row, length in enumerate(lengths):
        for half, full in zip(half_cache, float_cache, strict=True):
            np.testing.assert_array_equal(
                half[row, :, :length], full[row, :, :length].astype(np.float16)
            )
    # A new key or value is off by at most 2^-11 of itself; an output, a weighted mean of values
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_decode_step_stores_each_key_and_value_rounded_to_float16(library, shape) -> None:
    compare(shape, library, past=[0, 1, 5, 17, 63, 64, 150, 33], tokens=1)


@pytest.mark.parametrize("past", [0, 40, 130])
def test_a_prompt_chunk_over_a_half_cache_attends_as_over_a_float_one(library, past) -> None:
    compare(QWEN, library, past=[past], tokens=37)


def test_the_edit_is_refused_where_onnx_runtime_still_runs_an_attention() -> None:
    """ONNX Runtime's GroupQueryAttention takes a cache of its query's type only."""
    model = attention_graph(QWEN, rotary=True, packed=True, scale=0.125)
    assert not use_half_cache(model)
    assert {v.type.tensor_type.elem_type for v in model.graph.input if "past" in v.name} == {1}


def test_a_served_model_decodes_from_a_half_cache(tiny_exports, library) -> None:
    """Rows join and leave at different steps and a prompt is prefilled in chunks of 7, as in
    the float32 cache's exactness tests; greedy tokens agree with the float32 cache's."""
    path = tiny_exports["llama"].path
    half = make_engine(path, ops_library=library, kv_cache_dtype="float16", max_prefill_tokens=7)
    full = make_engine(path, ops_library=library, max_prefill_tokens=7)
    assert half.model.spec.kv_dtype == np.float16
    plan = {0: [greedy("a", list(range(3, 8)), 20)], 2: [greedy("b", list(range(40, 57)), 14)]}
    plan[3] = [greedy("c", list(range(90, 99)), 18)]
    plan[7] = [greedy("d", list(range(200, 230)), 10)]
    got, largest = run_steps(half, plan)
    want, _ = run_steps(full, plan)
    assert largest == 4
    same = total = 0
    for rid, outputs in want.items():
        expected, tokens = token_ids(outputs), token_ids(got[rid])
        assert len(tokens) == len(expected)
        agreeing = next(
            (i for i, (x, y) in enumerate(zip(tokens, expected, strict=True)) if x != y),
            len(tokens),
        )
        same, total = same + agreeing, total + len(expected)
    print(
        f"half cache: {same}/{total} greedy tokens as the float32 cache's, up to a first difference"
    )
    assert same / total >= MIN_AGREEMENT


def test_a_next_turn_starts_from_its_half_cached_keys(tiny_exports, library) -> None:
    """The prefix cache keeps float16 keys and values, and a next turn reads them back."""
    path = tiny_exports["llama"].path
    engine = make_engine(path, ops_library=library, kv_cache_dtype="float16")
    fresh = make_engine(path, ops_library=library, kv_cache_dtype="float16", prefix_cache_bytes=0)
    outputs, _ = run_steps(engine, {0: [scoped(greedy("t1", FIRST_PROMPT, 10), "a")]})
    second = scoped(greedy("t2", [*FIRST_PROMPT, *token_ids(outputs["t1"]), *FOLLOW_UP], 8), "a")
    answer, _ = run_steps(engine, {0: [second]})
    expected, _ = run_steps(fresh, {0: [second]})
    assert answer["t2"][0].cached_tokens > len(FIRST_PROMPT)
    assert token_ids(answer["t2"]) == token_ids(expected["t2"])


def test_auto_halves_the_cache_of_a_quantized_export_and_keeps_fp32_exact(
    int4_export: Path, tied_export: Path, library: Path
) -> None:
    """The API's default: an int4 export's weights already trade exactness, an fp32 export's
    cache stays float32 so that it still decodes transformers' tokens."""
    int4 = OnnxCausalLM(int4_export, threads=1, ops_library=library, kv_cache_dtype="auto")
    fp32 = OnnxCausalLM(tied_export, threads=1, ops_library=library, kv_cache_dtype="auto")
    assert (int4.spec.kv_dtype, fp32.spec.kv_dtype) == (np.float16, np.float32)


def test_without_our_attention_op_the_cache_stays_float32(tiny_exports, caplog) -> None:
    """Asked for where ONNX Runtime runs attention (no op library): served, float32, and said."""
    with caplog.at_level(logging.WARNING, logger="api.engine.model.causal_lm"):
        model = OnnxCausalLM(tiny_exports["llama"].path, threads=1, kv_cache_dtype="float16")
    assert model.spec.kv_dtype == np.float32
    assert "float16 KV cache needs our attention op" in caplog.text


def settings_from_environment(tmp_path: Path) -> ApiSettings:
    return ApiSettings(
        _env_file=None,  # type: ignore[call-arg]
        secret_key=TEST_SECRET_KEY,
        secret_file=tmp_path / "secret",
        models=f"demo={DEMO_DIR}",
        engine_cache_dir=str(tmp_path / "onnx-cache"),
    )


@pytest.mark.anyio
async def test_the_operator_s_setting_reaches_the_served_cache(
    library, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ENGINE_KV_CACHE_DTYPE=float16` in the environment: the API serves the (fp32) demo model
    from a float16 cache; unset, "auto" keeps it float32; a type it does not know is refused by
    name when the settings load."""
    monkeypatch.setenv("ENGINE_KV_CACHE_DTYPE", "float16")
    engines = await _load_models(settings_from_environment(tmp_path))
    assert engines["demo"].model.spec.kv_dtype == np.float16  # type: ignore[attr-defined]
    monkeypatch.delenv("ENGINE_KV_CACHE_DTYPE")
    settings = settings_from_environment(tmp_path)
    assert settings.engine_kv_cache_dtype == "auto"
    engines = await _load_models(settings)
    assert engines["demo"].model.spec.kv_dtype == np.float32  # type: ignore[attr-defined]
    monkeypatch.setenv("ENGINE_KV_CACHE_DTYPE", "bfloat16")
    with pytest.raises(ValidationError, match="engine_kv_cache_dtype"):
        settings_from_environment(tmp_path)
