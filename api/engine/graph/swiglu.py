"""A load-time graph edit: a SwiGLU MLP's activation runs in our int4 op's last step.

A llama-family MLP computes `silu(gate(x)) * up(x)`. Once gate and up are one merged int4
projection (`merged_projections.py`) on our op (`int4_matmul.py`), the graph still splits its
output, and runs `Sigmoid`, `Mul` and `Mul` over it (ONNX Runtime fuses the first two into
`QuickGelu`): per layer three more ops, their calls and a pass over the MLP's widest tensor.
Here the op itself takes `swiglu=1`: its weight panels are interleaved, gate then up for the
same 8 columns, so that one tile holds both and writes `silu(gate) * up` (`csrc/int4_tile.h`).

Only that exact shape is taken: the merged projection read by one `Split` into two equal halves
along the last axis, the first half read by a `Sigmoid` and by the `Mul` of itself with it, that
product by one `Mul` with the second half, and nothing else reading any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from api.engine.graph.int4_matmul import OP_TYPE
from api.engine.graph.onnx_edit import readers_of
from api.engine.ops.library import DOMAIN

if TYPE_CHECKING:
    import onnx

_Readers = dict[str, list["onnx.NodeProto"]]


def fold_swiglu(model: onnx.ModelProto) -> int:
    """Fold every SwiGLU activation behind a merged gate/up `Int4MatMul` into it, in place; how
    many."""
    graph = model.graph
    readers = readers_of(graph)
    sizes = _split_sizes(graph)
    folded = 0
    for node in list(graph.node):
        chain = _swiglu_chain(node, readers, sizes)
        if chain is not None:
            _fold(graph, node, chain)
            folded += 1
    return folded


def _split_sizes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """The values of the graph's small int64 initializers (a `Split`'s sizes among them)."""
    from onnx import TensorProto, numpy_helper

    return {
        init.name: numpy_helper.to_array(init).tolist()
        for init in graph.initializer
        if init.data_type == TensorProto.INT64
        and len(init.dims) == 1
        and init.data_location != TensorProto.EXTERNAL
    }


def _swiglu_chain(
    node: onnx.NodeProto, readers: _Readers, sizes: dict[str, list[int]]
) -> list[onnx.NodeProto] | None:
    """[Split, Sigmoid, silu Mul, output Mul] behind `node` when they are a SwiGLU, else None."""
    if node.op_type != OP_TYPE or node.domain != DOMAIN or len(node.input) != 3:
        return None
    n = next((a.i for a in node.attribute if a.name == "N"), 0)
    split = _only(readers[node.output[0]], "Split")
    if n % 16 or split is None or len(split.output) != 2 or len(split.input) != 2:
        return None
    axis = next((a.i for a in split.attribute if a.name == "axis"), 0)
    if axis != -1 or sizes.get(split.input[1]) != [n // 2, n // 2]:
        return None
    gate, up = split.output
    sigmoid = next((r for r in readers[gate] if r.op_type == "Sigmoid"), None)
    if sigmoid is None or len(readers[gate]) != 2:
        return None
    silu = _only(readers[sigmoid.output[0]], "Mul")
    if silu is None or silu not in readers[gate]:
        return None
    out = _only(readers[silu.output[0]], "Mul")
    if out is None or _only(readers[up], "Mul") is not out:
        return None
    return [split, sigmoid, silu, out]


def _only(nodes: list[onnx.NodeProto], op_type: str) -> onnx.NodeProto | None:
    return nodes[0] if len(nodes) == 1 and nodes[0].op_type == op_type else None


def _fold(graph: onnx.GraphProto, node: onnx.NodeProto, chain: list[onnx.NodeProto]) -> None:
    """Interleave the gate and up panels of B and the scales (a `Reshape` and a `Transpose`
    each, folded when the session is created), set `swiglu`, and let the op write what the
    chain's last `Mul` wrote."""
    from onnx import helper, numpy_helper

    at = list(graph.node).index(node)
    halves = f"{node.name or node.output[0]}.swiglu_halves"
    if not any(init.name == halves for init in graph.initializer):
        n = next(a.i for a in node.attribute if a.name == "N")
        shape = np.array([2, n // 16, -1], np.int64)
        graph.initializer.append(numpy_helper.from_array(shape, halves))
    for position in (1, 2):  # [gate panels | up panels] -> [(gate, up) panel pairs]
        source = node.input[position]
        split, paired = f"{source}.swiglu_split", f"{source}.swiglu_paired"
        graph.node.insert(at, helper.make_node("Reshape", [source, halves], [split]))
        graph.node.insert(at + 1, helper.make_node("Transpose", [split], [paired], perm=[1, 0, 2]))
        node.input[position] = paired
        at += 2
    node.attribute.append(helper.make_attribute("swiglu", 1))
    node.output[0] = chain[-1].output[0]
    for done in chain:
        graph.node.remove(done)
