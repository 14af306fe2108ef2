"""Our int8 op computes the product of int8 activations (per block) and the quantizer's int8
weights, replaces every dynamically quantized projection it covers, and the engine serves with it.

ONNX Runtime's dynamic quantization writes a projection as DynamicQuantizeLinear -> MatMulInteger
-> Cast -> Mul by the scales; the graphs here are written the same way, with weights made by
hand, and the int8 and int4 exports of a tiny model are made by the real quantizer. The op is
checked against the same product in numpy, on each instruction set this CPU has, and against the
float product.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine.graph.int8_matmul import OP_TYPE, runs_faster_here, use_int8_kernel
from api.engine.model import causal_lm as engine_model
from api.engine.ops.library import DOMAIN
from tests.engine.conftest import (
    activation_batches,
    make_engine,
    projection_session,
    quantized_copy,
    served_ops,
)
from tests.engine.helpers import assert_close_picks, prefill_and_decode


def int8_weights(k: int, n: int, per_column: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights [K, N] (-128 included: it must not overflow the AVX2 path) and
    their scale, one or one per column."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(-128, 128, size=(k, n), dtype=np.int8)
    weights[0, :] = -128
    scale = rng.uniform(0.001, 0.02, size=(n,) if per_column else ()).astype(np.float32)
    return weights, scale


def projection_nodes(name: str, x: str = "x", zero_point: bool = True) -> list[onnx.NodeProto]:
    """One projection as ONNX Runtime's dynamic quantizer writes it (`x` quantized by its own
    DynamicQuantizeLinear, named `{x}.quantize`, which projections of the same `x` share)."""
    weight_zero = [f"{name}.zero_point"] if zero_point else []
    return [
        helper.make_node(
            "MatMulInteger",
            [f"{x}.q", f"{name}.weight", f"{x}.zero", *weight_zero],
            [f"{name}.int32"],
            name=name,
        ),
        helper.make_node("Cast", [f"{name}.int32"], [f"{name}.float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", [f"{x}.scale", f"{name}.weight_scale"], [f"{name}.scales"]),
        helper.make_node("Mul", [f"{name}.float", f"{name}.scales"], [name]),
    ]


def quantize_node(x: str = "x") -> onnx.NodeProto:
    outputs = [f"{x}.q", f"{x}.scale", f"{x}.zero"]
    return helper.make_node("DynamicQuantizeLinear", [x], outputs, name=f"{x}.quantize")


def projection_initializers(
    name: str, weights: np.ndarray, scale: np.ndarray, zero_point: int = 0
) -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(weights, f"{name}.weight"),
        numpy_helper.from_array(scale, f"{name}.weight_scale"),
        numpy_helper.from_array(np.array(zero_point, np.int8), f"{name}.zero_point"),
    ]


def projection_model_session(
    k: int,
    n: int,
    library: Path | None,
    *,
    per_column: bool = False,
    bias: np.ndarray | None = None,
    rank: int = 2,
) -> ort.InferenceSession:
    """A dynamically quantized projection (+ bias `Add`); with `library`, on our op."""
    weights, scale = int8_weights(k, n, per_column, seed=k + n)
    nodes = [quantize_node(), *projection_nodes("Y")]
    initializers = projection_initializers("Y", weights, scale)
    return projection_session(
        nodes, initializers, (rank, k, n), library=library, edit=use_int8_kernel, bias=bias
    )


def int8_product(a: np.ndarray, k: int, n: int, per_column: bool) -> np.ndarray:
    """What our op computes, in numpy: each row's blocks of 128 (64 where K has no block of 128)
    quantized to int8 by their largest magnitude, times the int8 weights and both scales."""
    weights, scale = int8_weights(k, n, per_column, seed=k + n)
    block = 128 if k % 128 == 0 else 64
    blocks = a.reshape(a.shape[0], k // block, block)
    step = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)
    inverse = np.divide(np.float32(1), step, out=np.zeros_like(step), where=step > 0)
    q = np.rint(blocks * inverse).astype(np.int64)
    per_block = np.einsum("rbi,bin->rbn", q, weights.reshape(k // block, block, n).astype(np.int64))
    return np.einsum("rbn,rb->rn", per_block, step[:, :, 0]) * scale


@pytest.mark.parametrize(
    ("k", "n", "per_column"),
    [(128, 40, False), (896, 136, True), (192, 24, False), (256, 64, False)],
)
def test_op_computes_the_int8_product_for_every_batch_size(
    library: Path, isa: str, k: int, n: int, per_column: bool
) -> None:
    ours = projection_model_session(k, n, library, per_column=per_column)
    for a in activation_batches(k):
        got, want = ours.run(None, {"x": a})[0], int8_product(a, k, n, per_column)
        assert got.shape == (len(a), n)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_op_is_close_to_the_float_product(library: Path, isa: str) -> None:
    """Against the dequantized weights in float: only the activations' rounding is left."""
    k, n = 512, 64
    weights, scale = int8_weights(k, n, False, seed=k + n)
    a = np.random.default_rng(5).standard_normal((8, k)).astype(np.float32)
    got = projection_model_session(k, n, library).run(None, {"x": a})[0]
    want = a @ (weights.astype(np.float32) * scale)
    assert np.abs(got - want).max() < 0.01 * np.abs(want).max()


def test_op_takes_batched_inputs_adds_its_bias_and_empty_ones(library: Path) -> None:
    k, n = 256, 48
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    plain, biased = (projection_model_session(k, n, library, bias=b, rank=3) for b in (None, bias))
    a = np.random.default_rng(3).standard_normal((2, 5, k)).astype(np.float32)
    want = int8_product(a.reshape(10, k), k, n, False).reshape(2, 5, n)
    np.testing.assert_allclose(plain.run(None, {"x": a})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(biased.run(None, {"x": a})[0], want + bias, rtol=1e-5, atol=1e-5)
    assert plain.run(None, {"x": np.zeros((2, 0, k), np.float32)})[0].shape == (2, 0, n)


def edited(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> dict[str, str]:
    """Each projection's op once the edit ran, by the name of what it writes; how many it made."""
    graph = helper.make_graph(nodes, "g", [], [], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    use_int8_kernel(model)
    ops = {out: node.op_type for node in model.graph.node for out in node.output}
    ops["opset"] = ",".join(o.domain for o in model.opset_import)
    return ops


def test_graph_edit_takes_symmetric_int8_projections_only() -> None:
    weights, scale = int8_weights(128, 64, False, seed=0)
    per_column = int8_weights(128, 64, True, seed=0)[1]
    nodes = [quantize_node()]
    initializers = []
    for name, zero, w, s in (
        ("tensor_scale", 0, weights, scale),
        ("column_scales", 0, weights, per_column),
        ("zero_point_3", 3, weights, scale),
        ("k96", 0, weights[:96], scale),  # a block of 64 or 128 must divide K
        ("n60", 0, weights[:, :60], scale),  # the op's panels are 8 columns wide
    ):
        nodes += projection_nodes(name)
        initializers += projection_initializers(name, w, s, zero)
    ops = edited(nodes, initializers)
    assert (ops["tensor_scale"], ops["column_scales"]) == (OP_TYPE, OP_TYPE)
    assert {ops[name] for name in ("zero_point_3", "k96", "n60")} == {"Mul"}
    assert ops["x.q"] == "DynamicQuantizeLinear"  # still read by the refused ones
    assert DOMAIN in ops["opset"].split(",")


def test_graph_edit_removes_the_activations_quantizer_once_nothing_reads_it() -> None:
    weights, scale = int8_weights(128, 64, False, seed=0)
    nodes = [quantize_node(), *projection_nodes("q"), *projection_nodes("k", zero_point=False)]
    initializers = projection_initializers("q", weights, scale)
    initializers += projection_initializers("k", weights, scale)[:2]
    ops = edited(nodes, initializers)
    assert (ops["q"], ops["k"]) == (OP_TYPE, OP_TYPE)
    assert "x.q" not in ops and "q.int32" not in ops and "k.scales" not in ops


def test_our_op_serves_only_where_it_multiplies_with_vnni(
    library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENSHOP_INT4_ISA", "avx2")
    assert not runs_faster_here(library)


@pytest.fixture(scope="module")
def int8_export(tied_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantized_copy(tied_export, tmp_path_factory.mktemp("int8") / "model", "int8")


@pytest.mark.usefixtures("served_with_our_op")
def test_served_int8_export_runs_every_projection_and_the_head_with_our_op(
    library: Path, int8_export: Path, tmp_path: Path
) -> None:
    nodes = served_ops(int8_export, library, tmp_path)
    ops = [node.op_type for node in nodes]
    layers = json.loads((int8_export / "config.json").read_text())["num_hidden_layers"]
    assert ops.count(OP_TYPE) == 7 * layers + 1  # q, k, v, o, gate, up, down; the head
    assert not {"MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear"} & set(ops)
    biased = [node for node in nodes if node.op_type == OP_TYPE and len(node.input) == 4]
    assert len(biased) == 3 * layers  # qwen2's q, k and v biases, folded into the op


@pytest.mark.usefixtures("served_with_our_op")
def test_served_int4_export_runs_its_int8_head_with_our_op(
    library: Path, tied_export: Path, tmp_path: Path
) -> None:
    int4 = quantized_copy(tied_export, tmp_path / "int4", "int4")
    ops = [node.op_type for node in served_ops(int4, library, tmp_path / "cache")]
    assert ops.count(OP_TYPE) == 1
    assert "MatMulInteger" not in ops and "DynamicQuantizeMatMul" not in ops


def test_where_our_op_is_not_chosen_an_int4_export_still_runs_its_head_with_it(
    library: Path, int4_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On AVX2, where ONNX Runtime's int8 kernel is faster for every projection, the head of an
    int4 export still goes on our op: its activation scales are per row, so each position's
    logits are its own and drafts can be verified, and the embedding is read from its rows."""
    monkeypatch.setattr(engine_model, "int8_kernel_runs_faster", lambda library: False)
    ops = [node.op_type for node in served_ops(int4_export, library, tmp_path)]
    assert ops.count(OP_TYPE) == 1 and "DynamicQuantizeLinear" not in ops
    engine = make_engine(int4_export, cache_dir=tmp_path, ops_library=library)
    assert engine.model.positions_independent
    assert {"int8-matmul", "tied-embedding"} <= set(engine.serving_path().graph_edits)


def test_where_our_op_is_not_chosen_the_int8_export_keeps_onnx_runtime_kernel(
    library: Path, int8_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_model, "int8_kernel_runs_faster", lambda library: False)
    ops = [node.op_type for node in served_ops(int8_export, library, tmp_path)]
    assert OP_TYPE not in ops and "DynamicQuantizeMatMul" in ops


@pytest.mark.usefixtures("served_with_our_op")
def test_engine_logits_stay_within_activation_rounding_of_onnx_runtime(
    library: Path, int8_export: Path
) -> None:
    """The two differ only in how activations are rounded to int8 (blocks of 128 against one
    scale per tensor), so every step's logits stay close and pick the same token."""
    prompt = [5, 17, 33, 2, 90, 41, 7, 12, 64, 3, 29]
    ours = make_engine(int8_export, ops_library=library)
    theirs = make_engine(int8_export)
    steps = [prefill_and_decode(engine, prompt, decode_steps=6) for engine in (ours, theirs)]
    assert_close_picks(*steps, "int8 logits, ours against ONNX Runtime's")
