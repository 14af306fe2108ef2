"""A SwiGLU MLP's activation runs in our int4 op: `silu(gate) * up` of its merged gate/up
projection, computed in the op's last step, equals the product followed by the graph's own
Split, Sigmoid and Muls; any other shape of graph is left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from api.engine.graph.int4_matmul import OP_TYPE, use_int4_kernel
from api.engine.graph.swiglu import fold_swiglu
from tests.engine.conftest import activation_batches, projection_session
from tests.engine.graphs import int8_product, nbits_node, packed_weights

K, N, BLOCK = 256, 96, 128  # gate and up 48 columns each: 6 panel pairs


def mlp_nodes(*, gate_read_elsewhere: bool = False) -> list[onnx.NodeProto]:
    """x -> merged gate/up MatMulNBits -> Split -> silu(gate) * up, as an export merged by
    `merged_projections.py` writes it."""
    nodes = [
        nbits_node("gate_up", K=K, N=N, block_size=BLOCK, accuracy_level=4),
        helper.make_node("Split", ["gate_up", "halves"], ["gate", "up"], axis=-1),
        helper.make_node("Sigmoid", ["gate"], ["gate_sigmoid"]),
        helper.make_node("Mul", ["gate", "gate_sigmoid"], ["silu"]),
        helper.make_node("Mul", ["silu", "up"], ["Y"]),
    ]
    if gate_read_elsewhere:
        nodes.append(helper.make_node("Identity", ["gate"], ["gate_copy"]))
    return nodes


def mlp_initializers() -> list[onnx.TensorProto]:
    b, scales = packed_weights(K, N, BLOCK, seed=K + N + BLOCK)
    return [
        numpy_helper.from_array(b, "gate_up.B"),
        numpy_helper.from_array(scales, "gate_up.scales"),
        numpy_helper.from_array(np.array([N // 2, N // 2], np.int64), "halves"),
    ]


def ours_with_swiglu(model: onnx.ModelProto) -> int:
    """The engine's two edits, in its order; 1 when both took the projection."""
    return int(use_int4_kernel(model) == 1 and fold_swiglu(model) == 1)


def test_op_computes_silu_of_gate_times_up(library: Path, isa: str) -> None:
    ours = projection_session(
        mlp_nodes(), mlp_initializers(), (2, K, N // 2), library=library, edit=ours_with_swiglu
    )
    for a in activation_batches(K):
        product = int8_product(a, K, N, BLOCK)
        gate, up = product[:, : N // 2], product[:, N // 2 :]
        want = gate / (1 + np.exp(-gate)) * up
        got = ours.run(None, {"x": a})[0]
        assert got.shape == (len(a), N // 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_onnx_runtime_runs_the_same_graph_to_the_same_values(library: Path) -> None:
    ours, theirs = (
        projection_session(
            mlp_nodes(), mlp_initializers(), (3, K, N // 2), library=lib, edit=ours_with_swiglu
        )
        for lib in (library, None)
    )
    a = np.random.default_rng(3).standard_normal((2, 5, K)).astype(np.float32)
    want = theirs.run(None, {"x": a})[0]
    np.testing.assert_allclose(ours.run(None, {"x": a})[0], want, atol=2e-3 * np.abs(want).max())


def graph_of(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "mlp", [], [], mlp_initializers())
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert use_int4_kernel(model) == 1
    return model


@pytest.mark.parametrize(
    "change",
    ["gate read elsewhere", "unequal halves", "no Sigmoid"],
)
def test_other_graphs_keep_their_ops(change: str) -> None:
    nodes = mlp_nodes(gate_read_elsewhere=change == "gate read elsewhere")
    if change == "no Sigmoid":
        nodes[2] = helper.make_node("Tanh", ["gate"], ["gate_sigmoid"])
    model = graph_of(nodes)
    if change == "unequal halves":
        (halves,) = (i for i in model.graph.initializer if i.name == "halves")
        halves.CopyFrom(numpy_helper.from_array(np.array([40, 56], np.int64), "halves"))
    before = [node.op_type for node in model.graph.node]
    assert fold_swiglu(model) == 0
    assert [node.op_type for node in model.graph.node] == before


def test_fold_removes_the_activation_ops() -> None:
    model = graph_of(mlp_nodes())
    assert fold_swiglu(model) == 1
    computing = [n.op_type for n in model.graph.node if n.op_type not in ("Reshape", "Transpose")]
    assert computing == [OP_TYPE]
    (op,) = (n for n in model.graph.node if n.op_type == OP_TYPE)
    assert op.output[0] == "Y" and any(a.name == "swiglu" and a.i == 1 for a in op.attribute)
