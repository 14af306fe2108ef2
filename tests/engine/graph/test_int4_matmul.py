"""Our int4 op computes the int8-activation product `MatMulNBits` computes, and the engine
serves with it.

Both kernels quantize the activations to int8 per block and multiply them with the same 4-bit
weights: the op is checked against that product computed in numpy, and against `MatMulNBits`, on
the shapes a decode step and a prefill give it (1 to 70 rows, 3-D inputs, K not a multiple of
the block), on each of its instruction sets this CPU has, and an int4 model served through it
against the same model on ONNX Runtime's kernel.

The library is built at install (`make test` builds it; `.ci/run` requires it). A machine that
cannot build it (no compiler, no header) skips these with the build's own reason, unless
TOKENSHOP_REQUIRE_OPS is set, as CI sets it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine.graph import pipeline
from api.engine.graph.int4_matmul import OP_TYPE, use_int4_kernel
from api.engine.model.session_cache import MODEL_FILE
from api.engine.ops import library as ops_library
from api.engine.ops.library import DOMAIN, huge_page_bytes, preferred_library, use_huge_pages
from tests.engine.conftest import (
    activation_batches,
    greedy,
    make_engine,
    projection_session,
    run_steps,
)
from tests.engine.graphs import int8_product, matmul_nbits, nbits_node, packed_weights
from tests.engine.helpers import prefill_and_decode


def matmul_session(
    k: int,
    n: int,
    block: int,
    rank: int,
    library: Path | None,
    bias: np.ndarray | None = None,
) -> ort.InferenceSession:
    """A `MatMulNBits` (+ bias `Add`) graph; with `library`, edited to run on our op."""
    node, initializers = matmul_nbits(k, n, block, seed=k + n + block)
    return projection_session(
        [node], initializers, (rank, k, n), library=library, edit=use_int4_kernel, bias=bias
    )


@pytest.mark.parametrize(
    ("k", "n", "block"),
    [(128, 40, 128), (200, 24, 64), (896, 136, 128), (520, 32, 256), (256, 64, 64)],
)
def test_op_computes_the_int8_product_for_every_batch_size(
    library: Path, isa: str, k: int, n: int, block: int
) -> None:
    ours = matmul_session(k, n, block, 2, library)
    theirs = matmul_session(k, n, block, 2, None)
    for a in activation_batches(k):
        got, want = ours.run(None, {"x": a})[0], int8_product(a, k, n, block)
        assert got.shape == (len(a), n)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        # ONNX Runtime's kernel rounds a rare activation the other way: 2e-3 of a row's values
        nbits = theirs.run(None, {"x": a})[0]
        np.testing.assert_allclose(got, nbits, atol=2e-3 * np.abs(want).max())


def huge_pages_allowed() -> bool:
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return setting.is_file() and "[never]" not in setting.read_text()


@pytest.mark.parametrize("on", [True, False])
def test_large_weights_are_served_from_a_copy_on_huge_pages(
    library: Path, isa: str, on: bool
) -> None:
    """A projection's weights of 2 MB or more are copied onto 2 MB pages when the session is
    made (where the kernel allows huge pages, and unless the engine turned it off), multiply as
    before, and go with the session."""
    k, n, block = 4096, 1536, 128  # 3 MB of 4-bit weights
    before = huge_page_bytes(library)
    use_huge_pages(library, on)
    try:
        session = matmul_session(k, n, block, 2, library)
    finally:
        use_huge_pages(library, True)
    held = huge_page_bytes(library) - before
    assert held == (k * n // 2 if on and huge_pages_allowed() else 0)
    a = np.random.default_rng(11).standard_normal((9, k)).astype(np.float32)
    a[0, 0] = 40.0
    got, want = session.run(None, {"x": a})[0], int8_product(a, k, n, block)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    del session
    assert huge_page_bytes(library) == before


def test_op_takes_batched_inputs_and_empty_ones(library: Path) -> None:
    ours = matmul_session(256, 48, 128, 3, library)
    theirs = matmul_session(256, 48, 128, 3, None)
    a = np.random.default_rng(3).standard_normal((2, 5, 256)).astype(np.float32)
    got, want = (s.run(None, {"x": a})[0] for s in (ours, theirs))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert ours.run(None, {"x": np.zeros((2, 0, 256), np.float32)})[0].shape == (2, 0, 48)


def test_op_is_close_to_the_float_product(library: Path, isa: str) -> None:
    """Against the dequantized weights in float: only the int8 activations' rounding is left."""
    k, n, block = 384, 64, 128
    b, scales = packed_weights(k, n, block, seed=k + n + block)
    low, high = (b & 0x0F).astype(np.float32), (b >> 4).astype(np.float32)
    q = np.stack([low, high], axis=-1).reshape(n, -1)[:, :k]
    weights = (q - 8) * np.repeat(scales.reshape(n, -1), block, axis=1)[:, :k]
    a = np.random.default_rng(5).standard_normal((6, k)).astype(np.float32)
    got = matmul_session(k, n, block, 2, library).run(None, {"x": a})[0]
    want = a @ weights.T
    assert np.abs(got - want).max() < 0.01 * np.abs(want).max()


def nbits_graph(nodes: list[onnx.NodeProto], scales: dict[str, np.ndarray]) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(value, name) for name, value in scales.items()]
    graph = helper.make_graph(nodes, "g", [], [], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_graph_edit_takes_fp32_symmetric_int4_nodes_only() -> None:
    nodes = [
        nbits_node("symmetric"),
        nbits_node("zero_points", inputs=4),
        nbits_node("block32", block_size=32),
        nbits_node("eight_bit", bits=8),
        nbits_node("fp16"),
        nbits_node("n60", N=60),  # the op's panels are 8 columns wide
    ]
    scales = {f"{n.name}.scales": np.ones(64, np.float32) for n in nodes}
    scales["fp16.scales"] = np.ones(64, np.float16)
    model = nbits_graph(nodes, scales)
    assert use_int4_kernel(model) == 1
    ops = {node.name: (node.domain, node.op_type) for node in model.graph.node}
    assert ops["symmetric"] == (DOMAIN, OP_TYPE)
    refused = ("zero_points", "block32", "eight_bit", "fp16", "n60")
    assert {ops[n][1] for n in refused} == {"MatMulNBits"}
    assert any(o.domain == DOMAIN for o in model.opset_import)


def test_graph_edit_folds_a_bias_add_into_the_op() -> None:
    """q/k/v as merged: the bias is a Concat of vectors, made after the projection."""
    nodes = [
        nbits_node("merged"),
        helper.make_node("Concat", ["q.bias", "kv.bias"], ["bias"], axis=0),
        helper.make_node("Add", ["merged", "bias"], ["biased"]),
        helper.make_node("Split", ["biased"], ["q", "kv"], axis=-1, num_outputs=2),
    ]
    vectors = {"q.bias": np.ones(32, np.float32), "kv.bias": np.ones(32, np.float32)}
    model = nbits_graph(nodes, {"merged.scales": np.ones(64, np.float32)} | vectors)
    assert use_int4_kernel(model) == 1
    ops = [(node.op_type, node.input[0], list(node.output)) for node in computing(model)]
    assert ops == [
        ("Concat", "q.bias", ["bias"]),
        (OP_TYPE, "x", ["biased"]),
        ("Split", "biased", ["q", "kv"]),
    ]
    (op,) = (node for node in model.graph.node if node.op_type == OP_TYPE)
    assert op.input[3] == "bias"


def test_graph_edit_folds_a_residual_add_into_the_op() -> None:
    """A layer's o (or down) projection added to the residual stream `h`, which is computed."""
    nodes = [nbits_node("o"), helper.make_node("Add", ["h", "o"], ["h2"])]
    model = nbits_graph(nodes, {"o.scales": np.ones(64, np.float32)})
    assert use_int4_kernel(model) == 1
    (op,) = computing(model)
    assert (op.op_type, list(op.input[3:]), list(op.output)) == (OP_TYPE, ["", "h"], ["h2"])


def test_graph_edit_folds_a_bias_and_then_a_residual_add_into_one_op() -> None:
    """Folding the bias moves the node; the residual must still fold into the node the graph
    holds (a moved protobuf message is a copy)."""
    nodes = [
        nbits_node("o"),
        helper.make_node("Add", ["o", "o.bias"], ["biased"]),
        helper.make_node("Add", ["h", "biased"], ["h2"]),
    ]
    vectors = {"o.scales": np.ones(64, np.float32), "o.bias": np.ones(64, np.float32)}
    model = nbits_graph(nodes, vectors)
    assert use_int4_kernel(model) == 1
    (op,) = computing(model)
    assert (op.op_type, list(op.input[3:]), list(op.output)) == (OP_TYPE, ["o.bias", "h"], ["h2"])


def test_op_adds_the_residual_behind_it(library: Path) -> None:
    k, n, block = 256, 40, 128
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    h = rng.standard_normal((2, 3, n)).astype(np.float32)
    ours = residual_session(k, n, block, library)
    theirs = residual_session(k, n, block, None)
    got, want = (s.run(None, {"x": a, "h": h})[0] for s in (ours, theirs))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    with pytest.raises(Exception, match="residual does not match"):  # a broadcast, not read past
        ours.run(None, {"x": a, "h": h[:1]})


def residual_session(k: int, n: int, block: int, library: Path | None) -> ort.InferenceSession:
    """x [2, 3, k] through a `MatMulNBits`, plus h [.., 3, n]; with `library`, on our op."""
    b, scales = packed_weights(k, n, block, seed=k + n + block)
    attributes = {"K": k, "N": n, "bits": 4, "block_size": block, "accuracy_level": 4}
    nodes = [
        helper.make_node(
            "MatMulNBits", ["x", "B", "scales"], ["Y"], domain="com.microsoft", **attributes
        ),
        helper.make_node("Add", ["Y", "h"], ["Z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, k]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["any", 3, n]),
        ],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, 3, n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    if library is not None:
        assert use_int4_kernel(model) == 1
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def computing(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The graph's nodes but those that regroup the op's weights (folded when loaded)."""
    return [node for node in model.graph.node if node.op_type not in ("Reshape", "Transpose")]


def test_graph_edit_regroups_the_weights_from_the_original_initializers() -> None:
    model = nbits_graph([nbits_node("projection")], {"projection.scales": np.ones(64, np.float32)})
    assert use_int4_kernel(model) == 1
    made = {output: node for node in model.graph.node for output in node.output}
    (op,) = (node for node in model.graph.node if node.op_type == OP_TYPE)
    for position, original in ((1, "projection.B"), (2, "projection.scales")):
        transpose = made[op.input[position]]
        reshape = made[transpose.input[0]]
        assert (transpose.op_type, reshape.op_type) == ("Transpose", "Reshape")
        assert reshape.input[0] == original


def test_graph_edit_leaves_an_add_that_broadcasts() -> None:
    nodes = [nbits_node("projection"), helper.make_node("Add", ["projection", "one"], ["sum"])]
    scales = {"projection.scales": np.ones(64, np.float32), "one": np.ones(1, np.float32)}
    model = nbits_graph(nodes, scales)
    assert use_int4_kernel(model) == 1
    assert [node.op_type for node in computing(model)] == [OP_TYPE, "Add"]


def test_op_adds_its_bias(library: Path) -> None:
    k, n, block = 256, 40, 128
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    ours = matmul_session(k, n, block, 2, library, bias=bias)
    theirs = matmul_session(k, n, block, 2, None)
    a = np.random.default_rng(9).standard_normal((3, k)).astype(np.float32)
    got, want = (s.run(None, {"x": a})[0] for s in (ours, theirs))
    np.testing.assert_allclose(got, want + bias, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_served_graph_runs_every_int4_projection_with_our_op(
    library: Path, int4_export: Path, tmp_path: Path
) -> None:
    make_engine(int4_export, cache_dir=tmp_path, ops_library=library)
    (cached,) = tmp_path.glob(f"*/{MODEL_FILE}")
    graph = onnx.load(str(cached), load_external_data=False).graph
    nodes = graph.node
    ops = [node.op_type for node in nodes]
    layers = json.loads((int4_export / "config.json").read_text())["num_hidden_layers"]
    assert ops.count(OP_TYPE) == 4 * layers  # merged q/k/v, o, merged gate/up, down
    assert "MatMulNBits" not in ops
    swiglu = [n for n in nodes if any(a.name == "swiglu" and a.i == 1 for a in n.attribute)]
    assert len(swiglu) == layers and not {"Sigmoid", "QuickGelu"} & set(ops)
    biased = [
        node for node in nodes if node.op_type == OP_TYPE and node.input[3:4] not in ([], [""])
    ]
    assert len(biased) == layers  # qwen2's merged q/k/v bias; o and down have none
    residual = [node for node in nodes if node.op_type == OP_TYPE and len(node.input) == 5]
    assert len(residual) == 2 * layers and "Add" not in ops  # o and down add the residual
    # the weights' regrouping ran once, at load: the cached graph holds its results
    initializers = {init.name for init in graph.initializer}
    ours = [node for node in nodes if node.op_type == OP_TYPE]
    assert all(node.input[1] in initializers and node.input[2] in initializers for node in ours)


def test_engine_logits_equal_onnx_runtime_kernel(
    library: Path, int4_export: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int4 layers alone: the export's int8 head stays on ONNX Runtime's kernel here (ours
    rounds its activations differently: `test_int8_matmul.py`)."""
    prompt = [5, 17, 33, 2, 90, 41, 7, 12, 64, 3, 29]
    monkeypatch.setattr(pipeline, "use_int8_kernel", lambda model: 0)
    ours = make_engine(int4_export, ops_library=library)
    monkeypatch.undo()
    theirs = make_engine(int4_export)
    steps = [prefill_and_decode(engine, prompt, decode_steps=6) for engine in (ours, theirs)]
    for got, want in zip(*steps, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-3 * np.ptp(want))


def test_batched_sequences_get_the_tokens_of_onnx_runtime_kernel(
    library: Path, int4_export: Path
) -> None:
    """Sequences join and leave, so steps run 1 to 5 rows through the op, and prefill more."""
    rng = np.random.default_rng(11)
    joins = {
        step: [
            greedy(f"r{step}-{i}", rng.integers(3, 400, size=4 + 7 * i).tolist(), 12)
            for i in range(2)
        ]
        for step in (0, 2, 5)
    }
    outputs = [
        run_steps(make_engine(int4_export, ops_library=kernel), joins)[0]
        for kernel in (library, None)
    ]
    tokens = [
        {rid: [t for out in outs for t in out.token_ids] for rid, outs in run.items()}
        for run in outputs
    ]
    same = sum(  # a sequence that ends early on one kernel counts its missing tokens as unequal
        a == b for rid in tokens[0] for a, b in zip(tokens[0][rid], tokens[1][rid], strict=False)
    )
    total = sum(len(ids) for ids in tokens[1].values())
    print(f"int4 tokens equal to ONNX Runtime's kernel: {same}/{total}")
    assert total == 6 * 12 and same >= 0.95 * total


def test_our_kernel_is_chosen_where_it_is_built_and_runs(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert preferred_library(tmp_path / "missing.so") is None
    assert preferred_library(library) == library
    monkeypatch.setattr(ops_library, "runs_here", lambda path: False)
    assert preferred_library(library) is None


def test_weights_that_do_not_match_the_attributes_are_refused_not_read_past(
    library: Path,
) -> None:
    b, scales = packed_weights(128, 40, 128, seed=1)
    node = helper.make_node(
        OP_TYPE, ["A", "B", "scales"], ["Y"], domain=DOMAIN, K=128, N=48, bits=4, block_size=128
    )
    graph = helper.make_graph(
        [node],
        "wrong_n",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["rows", 128])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["rows", 48])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)]
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library))
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    session = ort.InferenceSession(model, options, ["CPUExecutionProvider"])
    with pytest.raises(Exception, match="does not match K, N, block_size"):
        session.run(None, {"A": np.ones((2, 128), np.float32)})
