"""Our attention op (`csrc/attention.c`) computes what ONNX Runtime's GroupQueryAttention does.

Each case builds one attention graph the way `fused_attention.py` leaves it (the query scaled by
a `Mul`, q/k/v split off one merged projection when `packed`), runs it as ONNX Runtime's node and,
after `use_attention_kernel`, as ours, with past and present bound to one buffer as the engine
binds them, and compares the outputs and the whole cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from api.engine.graph.attention import OP_TYPE, use_attention_kernel
from api.engine.runtime.slot_batch import SlotBatch
from tests.engine.conftest import greedy, make_engine, run_steps, served_ops
from tests.engine.graphs import (
    QWEN,
    SHAPES,
    Shape,
    attention_graph,
    run_in_place,
    session,
    token_feeds,
)
from tests.engine.helpers import (
    assert_same_tokens,
    random_prompt,
    tokens_of,
    transformers_greedy,
)


def both(shape: Shape, library: Path, *, rotary: bool = True, packed: bool = True):
    """ONNX Runtime's session and ours, over the same graph."""
    scale = 1.0 / np.sqrt(shape.dim)
    theirs = attention_graph(shape, rotary=rotary, packed=packed, scale=scale)
    ours = attention_graph(shape, rotary=rotary, packed=packed, scale=scale)
    assert use_attention_kernel(ours) == 1
    return session(theirs, None), session(ours, library)


def compare(shape, library, past: list[int], tokens: int, *, rotary=True, packed=True) -> None:
    """Rows whose caches hold `past` tokens each take `tokens` new ones; ours must give ONNX
    Runtime's outputs and caches (random pasts, the same in both)."""
    theirs, ours = both(shape, library, rotary=rotary, packed=packed)
    rows, capacity = len(past), max(past) + tokens + 5
    rng = np.random.default_rng(11)
    start = rng.standard_normal((rows, shape.kv_heads, capacity, shape.dim)).astype(np.float32)
    caches = {name: [start.copy(), start[:, :, ::-1].copy()] for name in ("theirs", "ours")}
    lengths = np.array(past) + tokens
    feeds = token_feeds(shape, packed, rows, tokens, seed=len(past) + tokens)
    want = run_in_place(theirs, feeds, caches["theirs"], lengths)
    got = run_in_place(ours, feeds, caches["ours"], lengths)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    for row, length in enumerate(lengths):  # past each row's length the buffer is not the op's
        for got_cache, want_cache in zip(caches["ours"], caches["theirs"], strict=True):
            np.testing.assert_allclose(
                got_cache[row, :, :length], want_cache[row, :, :length], rtol=1e-5, atol=1e-6
            )


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_decode_step_of_rows_of_different_lengths_matches_onnx_runtime(library, shape) -> None:
    """Eight decoding rows, one of them the first token, one past a block of 64 keys."""
    compare(shape, library, past=[0, 1, 5, 17, 63, 64, 150, 33], tokens=1)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("past", [0, 40, 130])
def test_a_prompt_chunk_attends_causally_like_onnx_runtime(library, shape, past) -> None:
    """A prompt's first chunk (past 0) and later chunks of a prompt prefilled in parts."""
    compare(shape, library, past=[past], tokens=37)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("rotary", [True, False])
def test_separate_inputs_and_no_rotary_match_onnx_runtime(library, rotary, packed) -> None:
    compare(QWEN, library, past=[3, 70], tokens=1, rotary=rotary, packed=packed)
    compare(QWEN, library, past=[9], tokens=20, rotary=rotary, packed=packed)


@pytest.mark.parametrize("shape", [QWEN, Shape(4, 4, 32)], ids=str)
def test_left_padded_prompts_each_get_what_they_get_alone(library, shape) -> None:
    """Prompts of 5, 37 and 20 tokens in one call of 37 (left-padded; the engine prefills
    prompts that arrive together so): each row's outputs and cache are those of its prompt run
    alone by ONNX Runtime, and the padding's outputs are zeros."""
    theirs, ours = both(shape, library)
    lengths, width = np.array([5, 37, 20]), 37
    cache_shape = (len(lengths), shape.kv_heads, width + 3, shape.dim)
    cache = [np.full(cache_shape, 7.0, np.float32) for _ in range(2)]
    x = token_feeds(shape, True, len(lengths), width, seed=2)["x"]
    got = run_in_place(ours, {"x": x}, cache, lengths)
    for row, length in enumerate(lengths.tolist()):
        alone = [np.zeros((1, *cache_shape[1:]), np.float32) for _ in range(2)]
        feeds = {"x": np.ascontiguousarray(x[row : row + 1, width - length :])}
        want = run_in_place(theirs, feeds, alone, np.array([length]))
        np.testing.assert_allclose(got[row, width - length :], want[0], rtol=1e-4, atol=2e-5)
        assert not got[row, : width - length].any()
        for got_cache, want_cache in zip(cache, alone, strict=True):
            np.testing.assert_allclose(
                got_cache[row, :, :length], want_cache[0, :, :length], rtol=1e-5, atol=1e-6
            )
            assert (got_cache[row, :, length:] == 7.0).all()  # padding is not cached


def test_an_unbound_present_gets_the_past_copied_into_it(library) -> None:
    """Without I/O binding ONNX Runtime allocates the present (the graph as tests run it)."""
    theirs, ours = both(QWEN, library)
    rng = np.random.default_rng(5)
    past = rng.standard_normal((2, 2, 12, 64)).astype(np.float32)
    feeds = {
        **token_feeds(QWEN, True, 2, 1, seed=5),
        "past_key": past,
        "past_value": past * 2,
        "seqlens_k": np.array([12, 7], np.int32),
        "total": np.array(13, np.int32),
    }
    want, got = theirs.run(None, feeds), ours.run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=2e-5)
    for row, length in enumerate((13, 8)):
        for got_cache, want_cache in zip(got[1:], want[1:], strict=True):
            assert got_cache.shape[2] >= 13
            np.testing.assert_allclose(
                got_cache[row, :, :length], want_cache[row, :, :length], rtol=1e-5, atol=1e-6
            )


def test_lengths_that_do_not_fit_the_cache_are_refused(library) -> None:
    _, ours = both(QWEN, library)
    feeds = {
        **token_feeds(QWEN, True, 1, 4, seed=1),
        "past_key": np.zeros((1, 2, 8, 64), np.float32),
        "past_value": np.zeros((1, 2, 8, 64), np.float32),
        "seqlens_k": np.array([13], np.int32),  # 14 tokens in all: 10 past, but 8 fit
        "total": np.array(14, np.int32),
    }
    with pytest.raises(Exception, match="seqlens_k does not fit"):
        ours.run(None, feeds)


def test_the_edit_folds_the_scale_and_the_split_into_the_op(library) -> None:
    model = attention_graph(QWEN, rotary=True, packed=True, scale=0.125)
    assert use_attention_kernel(model) == 1
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == (OP_TYPE, "tokenshop")
    assert list(node.input[:3]) == ["x", "", ""]
    assert helper.get_attribute_value(node.attribute[-1]) == pytest.approx(0.125)
    assert {i.name for i in model.graph.initializer} == {"cos", "sin"}


def test_attention_the_op_does_not_compute_is_left_to_onnx_runtime() -> None:
    model = attention_graph(QWEN, rotary=True, packed=True, scale=0.125)
    gqa = model.graph.node[-1]
    gqa.attribute.append(helper.make_attribute("local_window_size", 16))
    assert use_attention_kernel(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Split", "Mul", "GroupQueryAttention"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_served_graph_runs_every_layer_s_attention_on_our_op(
    tiny_exports, library: Path, tmp_path: Path, arch: str
) -> None:
    export = tiny_exports[arch].path
    ops = [node.op_type for node in served_ops(export, library, tmp_path)]
    layers = json.loads((export / "config.json").read_text())["num_hidden_layers"]
    assert ops.count(OP_TYPE) == layers
    assert "GroupQueryAttention" not in ops


def test_a_served_int4_graph_reads_the_merged_projection_packed(
    int4_export: Path, library: Path, tmp_path: Path
) -> None:
    nodes = served_ops(int4_export, library, tmp_path)
    attention = [node for node in nodes if node.op_type == OP_TYPE]
    assert attention and all(list(node.input[1:3]) == ["", ""] for node in attention)
    assert "Split" not in [node.op_type for node in nodes]  # q/k/v's; gate/up's is folded too


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sequences_decoding_on_our_op_match_transformers(tiny_exports, library, arch) -> None:
    """Rows of different lengths join and leave the batch at different steps, and a prompt is
    prefilled in chunks of 7 tokens, all on our attention op."""
    export = tiny_exports[arch]
    engine = make_engine(export.path, ops_library=library, max_prefill_tokens=7)
    plan = [(0, 5, 20), (2, 17, 14), (3, 9, 18), (7, 30, 10)]  # (join step, prompt, max tokens)
    prompts = [random_prompt(export, n, seed=20 + i) for i, (_, n, _) in enumerate(plan)]
    joins: dict[int, list] = {}
    for i, (step, _, max_tokens) in enumerate(plan):
        joins.setdefault(step, []).append(greedy(f"r{i}", prompts[i], max_tokens))
    outputs, largest_batch = run_steps(engine, joins)
    assert largest_batch >= 3
    for i, (_, _, max_tokens) in enumerate(plan):
        want = transformers_greedy(export, prompts[i], max_tokens)
        assert_same_tokens(export, prompts[i], tokens_of(outputs[f"r{i}"]), want)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prompts_arriving_together_are_prefilled_in_one_call_and_match_transformers(
    tiny_exports, library, arch, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = tiny_exports[arch]
    engine = make_engine(export.path, ops_library=library)
    calls: list[tuple[int, int]] = []
    run = SlotBatch._run

    def counted(
        self: SlotBatch, first_row: int, ids: np.ndarray, positions: np.ndarray, totals: np.ndarray
    ) -> np.ndarray:
        calls.append(ids.shape)
        return run(self, first_row, ids, positions, totals)

    monkeypatch.setattr(SlotBatch, "_run", counted)
    plan = {"a": (5, 12), "b": (17, 9), "c": (9, 14)}  # prompt length, max tokens
    prompts = {name: random_prompt(export, n, seed=40 + n) for name, (n, _) in plan.items()}
    requests = [greedy(name, prompts[name], tokens) for name, (_, tokens) in plan.items()]
    outputs, _ = run_steps(engine, {0: requests})
    assert [shape for shape in calls if shape[1] > 1] == [(3, 17)]  # one call, left-padded
    for name, (_, tokens) in plan.items():
        want = transformers_greedy(export, prompts[name], tokens)
        assert_same_tokens(export, prompts[name], tokens_of(outputs[name]), want)
