"""Helpers the load-time graph edits share: reading a graph's constants and readers, folding
the bias and residual `Add`s behind a node into it, and declaring our ops' domain."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from api.engine.ops.library import DOMAIN

if TYPE_CHECKING:
    import onnx


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
    adds it as it writes Y, saving an op per projection (bench/results/2026-11-26-kernel-notes.md).
    The op checks, per call, that the residual has Y's size (a broadcast one is refused, not read
    past)."""
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
