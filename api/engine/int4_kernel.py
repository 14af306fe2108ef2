"""Our 4-bit matrix multiply (`csrc/int4_matmul.c`) in place of ONNX Runtime's `MatMulNBits`.

ONNX Runtime's kernel pays most of a row's time again for every extra row of a batch: a Qwen2.5-
0.5B layer's merged gate/up projection (896 x 9728, block 128, 2 threads) took 84 us for 1 row
and 399 us for 8 (a decode step of 8 streams) on an AVX-512 VNNI AMD EPYC. Ours unpacks each
weight group once for a tile of rows and 8 columns and applies the scales once per block of
such a tile: 74 and 235 us there (`bench/int4_kernel.py`); AVX2 where the CPU lacks VNNI.

It is a custom op library, built from source at install (`api/engine/int4_build.py`), so it may
be absent: then, or where the CPU lacks AVX2/FMA, or where the node is not one the op covers,
the graph keeps `MatMulNBits`. `use_int4_kernel` edits the graph when it is loaded; the export
on disk stays standard.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

log = logging.getLogger(__name__)

DOMAIN = "tokenshop"
OP_TYPE = "Int4MatMul"
LIBRARY_NAME = "libtokenshop_int4.so"
BLOCK_SIZES = (64, 128, 256)  # the kernel's unrolled block loops


def default_library() -> Path:
    """Where `int4_build` puts the library: inside the environment it was built for."""
    return Path(sys.prefix) / "lib" / "tokenshop" / LIBRARY_NAME


@cache
def runs_here(library: Path) -> bool:
    """Whether `library` loads and this CPU has what its kernel needs (AVX2, FMA)."""
    try:
        handle = ctypes.CDLL(str(library))
        return bool(handle.tokenshop_int4_supported())
    except (OSError, AttributeError):
        return False


def preferred_library(library: Path | None = None) -> Path | None:
    """The library to serve int4 graphs with on this machine, or None for ONNX Runtime's."""
    library = library or default_library()
    if not library.is_file():
        reason = f"{library} is not built (python -m api.engine.int4_build)"
    elif not runs_here(library):
        reason = "this CPU lacks AVX2/FMA"
    else:
        log.info("int4 projections run on our kernel (%s, %s)", library, isa_of(library))
        return library
    log.info("int4 projections run on ONNX Runtime's MatMulNBits: %s", reason)
    return None


def isa_of(library: Path) -> str:
    """The instruction set the library's kernels multiply with here."""
    isa = ctypes.CDLL(str(library)).tokenshop_int4_isa
    isa.restype = ctypes.c_char_p
    return str(isa().decode())


def huge_page_bytes(library: Path) -> int:
    """Bytes of weights the library's ops serve from their copies on 2 MB pages, in this
    process (`copy_weights` in csrc/int4_matmul.c)."""
    held = ctypes.CDLL(str(library)).tokenshop_huge_page_bytes
    held.restype = ctypes.c_size_t
    return int(held())


def use_huge_pages(library: Path, on: bool) -> None:
    """Whether the library's ops made from now on, in this process, copy their weights onto
    2 MB pages (the default) or serve them from the file's pages, which processes share."""
    ctypes.CDLL(str(library)).tokenshop_use_huge_pages(ctypes.c_int(on))


def register(options: ort.SessionOptions, library: Path) -> None:
    options.register_custom_ops_library(str(library))


def use_int4_kernel(model: onnx.ModelProto) -> int:
    """Turn every `MatMulNBits` node the op covers into an `Int4MatMul`, in place; how many.

    Covered: 4 bits, fp32, symmetric (no zero points, so zero point 8), no group index or bias
    input, a block size in `BLOCK_SIZES`, N a multiple of 8. The attributes are the same; the
    weights and scales are regrouped (`_regroup_weights`); a bias `Add` right behind the node
    becomes its fourth input (ONNX Runtime folds one into `MatMulNBits` itself, not into a
    custom op: measured, the 24 Adds of a Qwen2.5-0.5B step took 0.9 ms of one sequence's 21),
    and a residual `Add` behind it the fifth (`fold_adds`)."""

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


def declare_domain(model: onnx.ModelProto) -> None:
    """Import our ops' domain into `model`, once, for the nodes an edit made ours."""
    from onnx import helper

    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def fold_adds(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    constants: dict[str, tuple[int, tuple[int, ...]]],
) -> None:
    """Fold the bias `Add` behind `node` into it, then the residual `Add` behind that."""
    _fold_residual(graph, _fold_bias(graph, node, constants), constants)


def constants_of(graph: onnx.GraphProto) -> dict[str, tuple[int, tuple[int, ...]]]:
    """(dtype, shape) of every initializer, and of what an `Identity` or a `Concat` of them
    makes (merged projections concatenate their weights, scales and biases)."""
    from onnx import helper

    constants = {init.name: (init.data_type, tuple(init.dims)) for init in graph.initializer}
    for node in graph.node:
        if node.op_type not in ("Identity", "Concat") or not node.input:
            continue
        if not all(name in constants for name in node.input):
            continue
        parts = [constants[name] for name in node.input]
        dtype, shape = parts[0]
        if node.op_type == "Concat":
            axis = next((helper.get_attribute_value(a) for a in node.attribute), 0) % len(shape)
            size = sum(part[1][axis] for part in parts)
            shape = (*shape[:axis], size, *shape[axis + 1 :])
        constants[node.output[0]] = (dtype, shape)
    return constants


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


def _fold_bias(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    constants: dict[str, tuple[int, tuple[int, ...]]],
) -> onnx.NodeProto:
    """Make a constant vector `Add` that alone reads `node`'s output the node's fourth input.
    Returns the node as the graph now holds it (moved, it is a copy: `_move_to`)."""
    from onnx import TensorProto

    behind = _add_behind(graph, node)
    if behind is None:
        return node
    add, bias = behind
    width = next(a.i for a in node.attribute if a.name == "N")
    if constants.get(bias) != (TensorProto.FLOAT, (width,)):  # not a broadcast [1], say
        return node
    node.input.append(bias)
    node.output[0] = add.output[0]
    return _move_to(graph, node, add)  # a merged bias is made after the node


def _fold_residual(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    constants: dict[str, tuple[int, tuple[int, ...]]],
) -> None:
    """Make the `Add` that alone reads `node`'s output and adds a computed tensor to it (the
    residual stream behind a layer's o and down projections) the node's fifth input: the op
    adds it as it writes Y. Measured on Qwen2.5-0.5B's int4 step (2 cores), those 48 Adds a
    step took 0.29 ms for one sequence and 0.42 ms for 8. The op checks, per call, that the
    residual has Y's size (a broadcast one is refused, not read past)."""
    behind = _add_behind(graph, node)
    if behind is None or behind[1] in constants or behind[1] == node.output[0]:
        return
    add, residual = behind
    node.input.extend([""] * (4 - len(node.input)))
    node.input.append(residual)
    node.output[0] = add.output[0]
    _move_to(graph, node, add)  # the residual may be made after the node


def _add_behind(graph: onnx.GraphProto, node: onnx.NodeProto) -> tuple[onnx.NodeProto, str] | None:
    """The `Add` that alone reads `node`'s output (not a graph output), and its other input."""
    output = node.output[0]
    readers = readers_of(graph)[output]
    if len(readers) != 1 or readers[0].op_type != "Add" or output in {o.name for o in graph.output}:
        return None
    add = readers[0]
    return add, add.input[1] if add.input[0] == output else add.input[0]


def readers_of(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Every tensor's readers (nodes in graph order), as the graph is now."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    return readers


def _move_to(graph: onnx.GraphProto, node: onnx.NodeProto, add: onnx.NodeProto) -> onnx.NodeProto:
    """Put `node` in the place of `add`, which goes; the node as the graph now holds it (a
    repeated protobuf field holds a copy of what is inserted into it)."""
    graph.node.remove(node)
    position = list(graph.node).index(add)
    graph.node.insert(position, node)
    graph.node.remove(add)
    return graph.node[position]
