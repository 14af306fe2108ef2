"""Our attention op (`csrc/attention.c`) computes what ONNX Runtime's GroupQueryAttention does.

Each case builds one attention graph the way `fused_attention.py` leaves it (the query scaled by
a `Mul`, q/k/v split off one merged projection when `packed`), runs it as ONNX Runtime's node and,
after `use_attention_kernel`, as ours, with past and present bound to one buffer as the engine
binds them, and compares the outputs and the whole cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine.graph.attention import OP_TYPE, use_attention_kernel
from api.engine.runtime.slot_batch import SlotBatch
from tests.engine.conftest import greedy, make_engine, run_steps, served_ops
from tests.engine.model.test_exactness import (
    assert_same_tokens,
    random_prompt,
    tokens_of,
    transformers_greedy,
)

POSITIONS = 512  # rotary cache length


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    dim: int

    @property
    def widths(self) -> list[int]:
        return [self.heads * self.dim, self.kv_heads * self.dim, self.kv_heads * self.dim]


QWEN = Shape(14, 2, 64)  # Qwen2.5-0.5B: 7 query heads per KV head, a tile of 8 lanes
SHAPES = [QWEN, Shape(4, 4, 32), Shape(16, 2, 16), Shape(3, 1, 256)]


def attention_graph(shape: Shape, *, rotary: bool, packed: bool, scale: float) -> onnx.ModelProto:
    """`x` [B, S, (H + 2 KV) * D] -> Split -> q (times `scale`), k, v -> GroupQueryAttention."""
    inits = [
        numpy_helper.from_array(np.array(shape.widths, np.int64), "sizes"),
        numpy_helper.from_array(np.array(scale, np.float32), "scale"),
    ]
    qkv = ["q", "k", "v"]
    nodes = [helper.make_node("Split", ["x", "sizes"], qkv, axis=-1)] if packed else []
    inputs = [] if packed else [f"{n}_in" for n in qkv]
    if not packed:
        nodes += [helper.make_node("Identity", [f"{n}_in"], [n]) for n in qkv]
    nodes.append(helper.make_node("Mul", ["q", "scale"], ["q_scaled"]))
    rope = ["cos", "sin"] if rotary else []
    if rotary:
        rng = np.random.default_rng(3)
        angles = rng.uniform(0, 6.3, (POSITIONS, shape.dim // 2)).astype(np.float32)
        inits += [
            numpy_helper.from_array(np.cos(angles), "cos"),
            numpy_helper.from_array(np.sin(angles), "sin"),
        ]
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            ["q_scaled", "k", "v", "past_key", "past_value", "seqlens_k", "total", *rope],
            ["out", "present_key", "present_value"],
            domain="com.microsoft",
            num_heads=shape.heads,
            kv_num_heads=shape.kv_heads,
            scale=1.0,
            do_rotary=int(rotary),
        )
    )
    cache = ["batch", shape.kv_heads, "capacity", shape.dim]
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", sum(shape.widths)])]
    if not packed:
        x = [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq", width])
            for name, width in zip(inputs, shape.widths, strict=True)
        ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            *x,
            helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
            helper.make_tensor_value_info("total", TensorProto.INT32, []),
        ],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", None]),
            helper.make_tensor_value_info("present_key", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("present_value", TensorProto.FLOAT, cache),
        ],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def session(model: onnx.ModelProto, library: Path | None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def run_in_place(
    attention: ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    cache: list[np.ndarray],
    lengths: np.ndarray,
) -> np.ndarray:
    """One call with past and present bound to the same buffers (updated in place); the
    attention output. `lengths`: each row's total after the call."""
    binding = attention.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    binding.bind_cpu_input("seqlens_k", (lengths - 1).astype(np.int32))
    binding.bind_cpu_input("total", np.array(lengths.max(), np.int32))
    binding.bind_output("out")
    for name, buffer in zip(("key", "value"), cache, strict=True):
        shape, pointer = list(buffer.shape), buffer.ctypes.data
        binding.bind_input(f"past_{name}", "cpu", 0, buffer.dtype.type, shape, pointer)
        binding.bind_output(f"present_{name}", "cpu", 0, buffer.dtype.type, shape, pointer)
    attention.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def token_feeds(shape: Shape, packed: bool, rows: int, tokens: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, tokens, sum(shape.widths))).astype(np.float32)
    if packed:
        return {"x": x}
    q, k, v = np.split(x, np.cumsum(shape.widths)[:2], axis=-1)
    return {"q_in": q.copy(), "k_in": k.copy(), "v_in": v.copy()}


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
