"""Our 4-bit matrix multiply (`Int4MatMul`, `ops/csrc/matmul.c`) in place of `MatMulNBits`.

ONNX Runtime's kernel pays most of a row's time again for every extra row of a batch; ours
unpacks each weight group once for a tile of rows and 8 columns and applies the scales once per
block of such a tile (AVX2, AVX-512 VNNI or AMX, the best the CPU has). Where the library is
absent, the CPU lacks AVX2/FMA, or a node is not one the op covers, the graph keeps
`MatMulNBits`. `use_int4_kernel` edits the graph when it is loaded; the export on disk stays
standard. Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from api.engine.graph.onnx_edit import constants_of, declare_domain, fold_adds
from api.engine.ops.library import DOMAIN

if TYPE_CHECKING:
    import onnx

OP_TYPE = "Int4MatMul"
BLOCK_SIZES = (64, 128, 256)  # the kernel's unrolled block loops


def use_int4_kernel(model: onnx.ModelProto) -> int:
    """Turn every `MatMulNBits` node the op covers into an `Int4MatMul`, in place; how many.

    Covered: 4 bits, fp32, symmetric (no zero points, so zero point 8), no group index or bias
    input, a block size in `BLOCK_SIZES`, N a multiple of 8. The attributes are the same; the
    weights and scales are regrouped (`_regroup_weights`); a bias `Add` right behind the node
    becomes its fourth input (ONNX Runtime folds one into `MatMulNBits` itself, not into a
    custom op: bench/results/2026-11-26-kernel-notes.md), and a residual `Add` behind it the
    fifth (`fold_adds`)."""

    graph = model.graph
    constants = constants_of(graph)
    changed = 0
    for node in list(graph.node):
        if node.op_type == "MatMulNBits" and _covered(node, constants):
            node.op_type, node.domain = OP_TYPE, DOMAIN
            _regroup_weights(graph, node, changed)
            fold_adds(graph, node, constants)
            changed += 1
    if changed:
        declare_domain(model)
    return changed


def _covered(node: onnx.NodeProto, constants: dict[str, tuple[int, tuple[int, ...]]]) -> bool:
    from onnx import TensorProto

    attributes = {a.name: a.i for a in node.attribute}
    scales = constants.get(node.input[2]) if len(node.input) == 3 else None
    return (
        scales is not None
        and scales[0] == TensorProto.FLOAT
        and attributes.get("bits", 4) == 4
        and attributes.get("block_size") in BLOCK_SIZES
        and attributes.get("N", 1) % 8 == 0
    )


def _regroup_weights(graph: onnx.GraphProto, node: onnx.NodeProto, index: int) -> None:
    """Rearrange B and the scales into the op's panels of 8 columns (`csrc/int4_matmul.c`)
    with a `Reshape` and a `Transpose` each, which ONNX Runtime's constant folding runs once
    when the session is created (the graph cache keeps the result), not per step."""
    from onnx import helper, numpy_helper

    attributes = {a.name: a.i for a in node.attribute}
    n, block = attributes["N"], attributes["block_size"]
    blocks = -(-attributes["K"] // block)
    prefix = f"{OP_TYPE}.{index}"
    layouts = {  # input -> (its shape as 8-column panels, the transpose into the op's order)
        1: ([n // 8, 8, blocks * block // 8, 4], [0, 2, 1, 3]),
        2: ([n // 8, 8, blocks], [0, 2, 1]),
    }
    at = list(graph.node).index(node)
    for position, (shape, perm) in layouts.items():
        source, shape_name = node.input[position], f"{prefix}.{position}.shape"
        panels, regrouped = f"{prefix}.{position}.panels", f"{prefix}.{position}.regrouped"
        graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), shape_name))
        graph.node.insert(at, helper.make_node("Reshape", [source, shape_name], [panels]))
        graph.node.insert(at + 1, helper.make_node("Transpose", [panels], [regrouped], perm=perm))
        node.input[position] = regrouped
        at += 2
