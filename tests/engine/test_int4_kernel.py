"""Our int4 op computes what ONNX Runtime's `MatMulNBits` computes, and the engine serves with it.

Both kernels quantize the activations to int8 per block and multiply them with the same 4-bit
weights, so they differ by float summation order only: the op is checked against `MatMulNBits`
on the shapes a decode step and a prefill give it (1 to 13 rows, 3-D inputs, K not a multiple of
the block), and an int4 model served through it against the same model on ONNX Runtime's kernel.

The library is built at install (`make test` builds it; `.ci/run` requires it). A machine that
cannot build it (no compiler, no header) skips these with the build's own reason, unless
TOKENSHOP_REQUIRE_INT4_KERNEL is set, as CI sets it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine import int4_kernel
from api.engine.int4_kernel import (
    DOMAIN,
    OP_TYPE,
    default_library,
    preferred_library,
    runs_here,
    use_int4_kernel,
)
from api.engine.ort_cache import MODEL_FILE
from tests.engine.conftest import greedy, make_engine, quantized_copy, run_steps
from tests.engine.test_fused_attention import prefill_and_decode


@pytest.fixture(scope="module")
def library() -> Path:
    path = default_library()
    if not runs_here(path):
        reason = f"{path} is not built for this machine (python -m api.engine.int4_build)"
        if os.environ.get("TOKENSHOP_REQUIRE_INT4_KERNEL"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def packed_weights(k: int, n: int, block: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' B (uint8 [n, blocks, block / 2], two weights a byte) and scales."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    q = rng.integers(0, 16, size=(n, blocks, block), dtype=np.uint8)
    q[:, -1, k - (blocks - 1) * block :] = 8  # the quantizer's padding: weight 0
    packed = q[:, :, 0::2] | (q[:, :, 1::2] << 4)
    scales = rng.uniform(0.001, 0.02, size=(n * blocks)).astype(np.float32)
    return packed, scales


def matmul_session(
    op: str,
    domain: str,
    k: int,
    n: int,
    block: int,
    rank: int,
    library: Path,
    bias: np.ndarray | None = None,
) -> ort.InferenceSession:
    b, scales = packed_weights(k, n, block, seed=k + n + block)
    inputs = ["A", "B", "scales"] + (["bias"] if bias is not None else [])
    node = helper.make_node(op, inputs, ["Y"], domain=domain, K=k, N=n, bits=4, block_size=block)
    node.attribute.append(helper.make_attribute("accuracy_level", 4))
    leading = ["d0", "d1"][: rank - 1]
    graph = helper.make_graph(
        [node],
        "matmul",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [*leading, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*leading, n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
        + ([numpy_helper.from_array(bias, "bias")] if bias is not None else []),
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(str(library))
    model = helper.make_model(graph, opset_imports=opsets)
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


@pytest.mark.parametrize(
    ("k", "n", "block"), [(128, 40, 128), (200, 24, 64), (896, 136, 128), (520, 33, 256)]
)
def test_op_equals_matmul_nbits_for_every_batch_size(
    library: Path, k: int, n: int, block: int
) -> None:
    ours = matmul_session(OP_TYPE, DOMAIN, k, n, block, 2, library)
    theirs = matmul_session("MatMulNBits", "com.microsoft", k, n, block, 2, library)
    rng = np.random.default_rng(7)
    for rows in (1, 2, 3, 4, 5, 8, 13):
        a = rng.standard_normal((rows, k)).astype(np.float32)
        a[0, 0] = 40.0  # an outlier: its block's scale is its own, not the row's
        got, want = (s.run(None, {"A": a})[0] for s in (ours, theirs))
        assert got.shape == (rows, n)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_op_takes_batched_inputs_and_empty_ones(library: Path) -> None:
    ours = matmul_session(OP_TYPE, DOMAIN, 256, 48, 128, 3, library)
    theirs = matmul_session("MatMulNBits", "com.microsoft", 256, 48, 128, 3, library)
    a = np.random.default_rng(3).standard_normal((2, 5, 256)).astype(np.float32)
    got, want = (s.run(None, {"A": a})[0] for s in (ours, theirs))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert ours.run(None, {"A": np.zeros((2, 0, 256), np.float32)})[0].shape == (2, 0, 48)


def test_op_is_close_to_the_float_product(library: Path) -> None:
    """Against the dequantized weights in float: only the int8 activations' rounding is left."""
    k, n, block = 384, 64, 128
    b, scales = packed_weights(k, n, block, seed=k + n + block)
    low, high = (b & 0x0F).astype(np.float32), (b >> 4).astype(np.float32)
    q = np.stack([low, high], axis=-1).reshape(n, -1)[:, :k]
    weights = (q - 8) * np.repeat(scales.reshape(n, -1), block, axis=1)[:, :k]
    a = np.random.default_rng(5).standard_normal((6, k)).astype(np.float32)
    got = matmul_session(OP_TYPE, DOMAIN, k, n, block, 2, library).run(None, {"A": a})[0]
    want = a @ weights.T
    assert np.abs(got - want).max() < 0.01 * np.abs(want).max()


def nbits_graph(nodes: list[onnx.NodeProto], scales: dict[str, np.ndarray]) -> onnx.ModelProto:
    initializers = [numpy_helper.from_array(value, name) for name, value in scales.items()]
    graph = helper.make_graph(nodes, "g", [], [], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def nbits_node(name: str, inputs: int = 3, **attributes: int) -> onnx.NodeProto:
    names = ["x", f"{name}.B", f"{name}.scales", f"{name}.zero_points"][:inputs]
    defaults = {"K": 128, "N": 64, "bits": 4, "block_size": 128} | attributes
    return helper.make_node(
        "MatMulNBits", names, [name], name=name, domain="com.microsoft", **defaults
    )


def test_graph_edit_takes_fp32_symmetric_int4_nodes_only() -> None:
    nodes = [
        nbits_node("symmetric"),
        nbits_node("zero_points", inputs=4),
        nbits_node("block32", block_size=32),
        nbits_node("eight_bit", bits=8),
        nbits_node("fp16"),
    ]
    scales = {f"{n.name}.scales": np.ones(64, np.float32) for n in nodes}
    scales["fp16.scales"] = np.ones(64, np.float16)
    model = nbits_graph(nodes, scales)
    assert use_int4_kernel(model) == 1
    ops = {node.name: (node.domain, node.op_type) for node in model.graph.node}
    assert ops["symmetric"] == (DOMAIN, OP_TYPE)
    assert {ops[n][1] for n in ("zero_points", "block32", "eight_bit", "fp16")} == {"MatMulNBits"}
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
    ops = [(node.op_type, list(node.input), list(node.output)) for node in model.graph.node]
    assert ops == [
        ("Concat", ["q.bias", "kv.bias"], ["bias"]),
        (OP_TYPE, ["x", "merged.B", "merged.scales", "bias"], ["biased"]),
        ("Split", ["biased"], ["q", "kv"]),
    ]


def test_graph_edit_leaves_an_add_that_broadcasts() -> None:
    nodes = [nbits_node("projection"), helper.make_node("Add", ["projection", "one"], ["sum"])]
    scales = {"projection.scales": np.ones(64, np.float32), "one": np.ones(1, np.float32)}
    model = nbits_graph(nodes, scales)
    assert use_int4_kernel(model) == 1
    assert [node.op_type for node in model.graph.node] == [OP_TYPE, "Add"]


def test_op_adds_its_bias(library: Path) -> None:
    k, n, block = 256, 40, 128
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    ours = matmul_session(OP_TYPE, DOMAIN, k, n, block, 2, library, bias=bias)
    theirs = matmul_session("MatMulNBits", "com.microsoft", k, n, block, 2, library)
    a = np.random.default_rng(9).standard_normal((3, k)).astype(np.float32)
    got, want = (s.run(None, {"A": a})[0] for s in (ours, theirs))
    np.testing.assert_allclose(got, want + bias, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.fixture(scope="module")
def int4_export(tied_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantized_copy(tied_export, tmp_path_factory.mktemp("int4") / "model", "int4")


def test_served_graph_runs_every_int4_projection_with_our_op(
    library: Path, int4_export: Path, tmp_path: Path
) -> None:
    make_engine(int4_export, cache_dir=tmp_path, int4_kernel=library)
    (cached,) = tmp_path.glob(f"*/{MODEL_FILE}")
    nodes = onnx.load(str(cached), load_external_data=False).graph.node
    ops = [node.op_type for node in nodes]
    layers = json.loads((int4_export / "config.json").read_text())["num_hidden_layers"]
    assert ops.count(OP_TYPE) == 4 * layers  # merged q/k/v, o, merged gate/up, down
    assert "MatMulNBits" not in ops
    biased = [node for node in nodes if node.op_type == OP_TYPE and len(node.input) == 4]
    assert len(biased) == layers  # qwen2's q/k/v biases, folded into the op


def test_engine_logits_equal_onnx_runtime_kernel(library: Path, int4_export: Path) -> None:
    prompt = [5, 17, 33, 2, 90, 41, 7, 12, 64, 3, 29]
    ours = make_engine(int4_export, int4_kernel=library)
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
        run_steps(make_engine(int4_export, int4_kernel=kernel), joins)[0]
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


def test_our_kernel_is_chosen_only_where_it_is_built_and_the_cpu_lacks_vnni(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert preferred_library(tmp_path / "missing.so") is None
    monkeypatch.setattr(int4_kernel, "_has_vnni", lambda: True)
    assert preferred_library(library) is None
    monkeypatch.setattr(int4_kernel, "_has_vnni", lambda: False)
    assert preferred_library(library) == library


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
