"""Our 8-bit matrix multiply (`Int8MatMul`, `ops/csrc/matmul.c`) in place of ONNX Runtime's
dynamic int8 quantization: every projection of an int8 export, and the LM head of an int4 one.

Each `DynamicQuantizeLinear` -> `MatMulInteger` -> `Cast` -> `Mul` chain becomes the op, which
shares each loaded group of weights across a tile of rows, as the int4 kernel does. Activations
are quantized per block of 128 (or 64), symmetric, where ONNX Runtime uses one asymmetric scale
for the whole tensor: the two differ by that rounding (tests bound ours against the float
product and ONNX Runtime's). Weights are rearranged by nodes ONNX Runtime's constant folding
runs once at load; the export on disk stays standard. Figures:
bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from api.engine.graph.onnx_edit import constants_of, declare_domain, fold_adds
from api.engine.ops.library import DOMAIN, isa_of

if TYPE_CHECKING:
    import onnx

OP_TYPE = "Int8MatMul"
BLOCK_SIZES = (128, 64)  # activation blocks, the first that divides K


@dataclass(frozen=True)
class _Projection:
    """One dynamically quantized projection, as the quantizer writes it."""

    x: str  # the float activations
    weight: str  # int8 [K, N] initializer
    weight_scale: str  # float initializer: [], [1] or [N]
    per_column: bool  # the weight scale is [N]
    output: str  # what the last Mul writes
    nodes: tuple[onnx.NodeProto, ...]  # MatMulInteger, Cast, the scales' Mul, the output Mul
    quantize: onnx.NodeProto  # the DynamicQuantizeLinear (removed when nothing else reads it)
    k: int
    n: int


def runs_faster_here(library: Path) -> bool:
    """Whether the engine should serve int8 projections with our op on this CPU: where it
    multiplies with AVX-512 VNNI or AMX tiles, as measured. Its AVX2 path (correct, and
    tested) costs an abs and a sign more per 32 weights than `vpmaddubsw` alone and measured
    slower than ONNX Runtime's kernel, so there ONNX Runtime's kernel stays
    (bench/results/2026-11-26-kernel-notes.md).

    Not for an int4 export's int8 LM head, which goes on our op with the int4 layers, on every
    CPU (`EditPlan.int4_kernel`): ONNX Runtime's one activation scale per call makes a row's
    logits depend on the rows and positions beside it, which turns drafts off, and only our
    head gives the `tied-embedding` edit its rows, without which the float32 embedding table's
    pages fill the process."""
    return isa_of(library) in ("avx512-vnni", "amx")


def use_int8_kernel(model: onnx.ModelProto) -> int:
    """Turn every dynamically quantized projection the op covers into an `Int8MatMul`, in place;
    how many. Covered: int8 weights [K, N] with zero point 0 (the quantizer's symmetric mode), a
    per-tensor or per-column scale, K a multiple of 64, N a multiple of 8."""

    graph = model.graph
    constants = constants_of(graph)  # the biases: the edit adds none, nor changes them
    changed = 0
    for projection in _projections(graph):
        node = _replace(graph, projection, changed)
        fold_adds(graph, node, constants)
        changed += 1
    if changed:
        declare_domain(model)
    return changed


def _projections(graph: onnx.GraphProto) -> list[_Projection]:
    from onnx import TensorProto, numpy_helper

    initializers = {init.name: init for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def only_reader(name: str, op_type: str) -> onnx.NodeProto | None:
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type else None

    def is_zero(name: str) -> bool:
        init = initializers.get(name)
        if init is None or init.data_location == TensorProto.EXTERNAL:
            return False
        return not np.any(numpy_helper.to_array(init))

    found = []
    for matmul in graph.node:
        if matmul.op_type != "MatMulInteger" or len(matmul.input) < 3:
            continue
        quantize = producer.get(matmul.input[0])
        weight = initializers.get(matmul.input[1])
        if (
            quantize is None
            or quantize.op_type != "DynamicQuantizeLinear"
            or list(quantize.output[::2]) != [matmul.input[0], matmul.input[2]]
            or weight is None
            or weight.data_type != TensorProto.INT8
            or len(weight.dims) != 2
            or (len(matmul.input) > 3 and not is_zero(matmul.input[3]))
        ):
            continue
        k, n = weight.dims
        cast = only_reader(matmul.output[0], "Cast")
        if cast is None or not _casts_to_float(cast) or k % 64 or n % 8:
            continue
        rescale = only_reader(cast.output[0], "Mul")
        if rescale is None:
            continue
        scales = producer.get(_other(rescale, cast.output[0]))
        if scales is None or scales.op_type != "Mul" or quantize.output[1] not in scales.input:
            continue
        weight_scale = initializers.get(_other(scales, quantize.output[1]))
        if weight_scale is None or weight_scale.data_type != TensorProto.FLOAT:
            continue
        scale_size = int(np.prod(weight_scale.dims))
        if scale_size not in (1, n) or len(readers[scales.output[0]]) != 1:
            continue
        found.append(
            _Projection(
                x=quantize.input[0],
                weight=weight.name,
                weight_scale=weight_scale.name,
                per_column=scale_size > 1,
                output=rescale.output[0],
                nodes=(matmul, cast, scales, rescale),
                quantize=quantize,
                k=k,
                n=n,
            )
        )
    return found


def _casts_to_float(cast: onnx.NodeProto) -> bool:
    from onnx import TensorProto

    return any(a.name == "to" and a.i == TensorProto.FLOAT for a in cast.attribute)


def _other(node: onnx.NodeProto, name: str) -> str:
    """The input of a two-input node that is not `name`."""
    return node.input[1] if node.input[0] == name else node.input[0]


def _replace(graph: onnx.GraphProto, p: _Projection, index: int) -> onnx.NodeProto:
    """`Int8MatMul` in the place of the projection's nodes, its weights regrouped into the op's
    panels: B [K, N] as [K/8 groups][4 pairs][even, odd][N/8 panels][8 columns] moved to
    [panel][group][even, odd][column][pair]; one scale per column and block."""
    from onnx import helper, numpy_helper

    block = next(b for b in BLOCK_SIZES if p.k % b == 0)
    blocks, prefix = p.k // block, f"{OP_TYPE}.{index}"
    constants = {
        f"{prefix}.weight_shape": [p.k // 8, 4, 2, p.n // 8, 8],
        f"{prefix}.scale_shape": [p.n // 8, 1, 8] if p.per_column else [1],
        f"{prefix}.scales_shape": [p.n // 8, blocks, 8],
    }
    for name, value in constants.items():
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
    made = [
        helper.make_node(
            "Reshape", [p.weight, f"{prefix}.weight_shape"], [f"{prefix}.weight_groups"]
        ),
        helper.make_node(
            "Transpose", [f"{prefix}.weight_groups"], [f"{prefix}.b"], perm=[3, 0, 2, 4, 1]
        ),
        helper.make_node(
            "Reshape", [p.weight_scale, f"{prefix}.scale_shape"], [f"{prefix}.scale_columns"]
        ),
        helper.make_node(
            "Expand", [f"{prefix}.scale_columns", f"{prefix}.scales_shape"], [f"{prefix}.scales"]
        ),
        helper.make_node(
            OP_TYPE,
            [p.x, f"{prefix}.b", f"{prefix}.scales"],
            [p.output],
            domain=DOMAIN,
            K=p.k,
            N=p.n,
            block_size=block,
        ),
    ]
    at = list(graph.node).index(p.nodes[-1])
    for offset, node in enumerate(made):
        graph.node.insert(at + offset, node)
    op = graph.node[at + len(made) - 1]  # the graph's copy, which later edits must change
    for node in p.nodes:
        graph.node.remove(node)
    if not any(name in node.input for node in graph.node for name in p.quantize.output):
        graph.node.remove(p.quantize)
    return op
