"""A load-time graph edit: int4 projections that read the same tensor become one call.

A layer's q/k/v projections, and its gate/up projections, each become one `MatMulNBits` over
concatenated weights; a `Split` hands every consumer its original tensor, so nothing downstream
changes, and a bias `Add` behind every sibling becomes one `Add` before the `Split`. The merged
weights are `Concat`s of the original initializers, folded when the session is created (the
graph cache keeps the result). Only int4 is merged: for fp32 `MatMul`s and int8 chains it was
measured and did not pay. Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

_PREFIX = "tokenshop_merged"
_MIN_OPSET = 13  # `Split` takes its sizes as an input from opset 13


def merge_projections(model: onnx.ModelProto) -> int:
    """Merge every group of sibling projections of `model` in place; the number of groups."""
    if _opset(model) < _MIN_OPSET:
        return 0
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    groups: dict[Hashable, list[onnx.NodeProto]] = defaultdict(list)
    # Indexed once, before any merge: each group only replaces its own nodes and the Adds that
    # read only them, so what the index says about another group stays true.
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        key = _sibling_key(node, weights)
        if key is not None:
            groups[key].append(node)
        for name in node.input:
            readers[name].append(node)
    biases = _constant_vectors(graph, weights)
    siblings = [nodes for nodes in groups.values() if len(nodes) > 1]
    for number, nodes in enumerate(siblings):
        _merge(graph, nodes, readers, biases, f"{_PREFIX}_{number}")
    return len(siblings)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _sibling_key(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto]) -> Hashable | None:
    """What a projection must share with another to be merged with it; None if not one."""
    quantized = node.op_type == "MatMulNBits" and len(node.input) in (3, 4)  # no g_idx, bias
    if not quantized or not all(name in weights for name in node.input[1:]):
        return None
    attributes = tuple(sorted((a.name, a.i) for a in node.attribute if a.name != "N"))
    return (node.input[0], len(node.input), attributes)


def _merge(
    graph: onnx.GraphProto,
    nodes: list[onnx.NodeProto],
    readers: dict[str, list[onnx.NodeProto]],
    constants: set[str],
    prefix: str,
) -> None:
    """One projection over the concatenated weights, split back into the nodes' outputs."""
    from onnx import helper, numpy_helper

    first = nodes[0]
    widths = [_attribute(node, "N") for node in nodes]
    names = [f"{prefix}_{part}" for part in ("weight", "scales", "zero_points")]
    concats = [
        _concat([node.input[i] for node in nodes], names[i - 1], axis=0)
        for i in range(1, len(first.input))
    ]
    merged = helper.make_node(
        "MatMulNBits",
        [first.input[0], *names[: len(first.input) - 1]],
        [prefix],
        name=prefix,
        domain=first.domain,
    )
    merged.attribute.extend(a for a in first.attribute if a.name != "N")
    merged.attribute.append(helper.make_attribute("N", sum(widths)))
    added = [*concats, merged]
    outputs = [node.output[0] for node in nodes]
    biases = _bias_adds(outputs, readers, constants)
    if biases is not None:  # biased, as Qwen2's q/k/v: one Add, before the Split
        added.append(_concat([bias for _, bias in biases], f"{prefix}_bias", axis=0))
        added.append(helper.make_node("Add", [prefix, f"{prefix}_bias"], [f"{prefix}_biased"]))
        outputs = [add.output[0] for add, _ in biases]
    sizes = numpy_helper.from_array(np.array(widths, np.int64), f"{prefix}_sizes")
    graph.initializer.append(sizes)
    added.append(helper.make_node("Split", [added[-1].output[0], sizes.name], outputs, axis=-1))
    position = list(graph.node).index(first)
    for offset, node in enumerate(added):
        graph.node.insert(position + offset, node)
    for node in [*nodes, *(add for add, _ in biases or [])]:
        graph.node.remove(node)


def _bias_adds(
    outputs: list[str], readers: dict[str, list[onnx.NodeProto]], constants: set[str]
) -> list[tuple[onnx.NodeProto, str]] | None:
    """(the Add, its bias) for each output, when each is read only by an Add of a constant
    vector: ONNX Runtime folds such an Add into the projection before it, which a Split
    between them would prevent, so the bias is concatenated too. Else None."""
    found = []
    for output in outputs:
        adds = readers.get(output, [])
        if len(adds) != 1 or adds[0].op_type != "Add":
            return None
        add = adds[0]
        bias = add.input[1] if add.input[0] == output else add.input[0]
        if bias not in constants:
            return None
        found.append((add, bias))
    return found


def _constant_vectors(graph: onnx.GraphProto, weights: dict[str, onnx.TensorProto]) -> set[str]:
    """Names of 1-D initializers, and of `Identity` nodes passing one on (how an exporter
    shares equal biases)."""
    vectors = {name for name, weight in weights.items() if len(weight.dims) == 1}
    aliases = {
        node.output[0]
        for node in graph.node
        if node.op_type == "Identity" and node.input[0] in vectors
    }
    return vectors | aliases


def _concat(names: list[str], output: str, *, axis: int) -> onnx.NodeProto:
    from onnx import helper

    return helper.make_node("Concat", names, [output], name=output, axis=axis)


def _attribute(node: onnx.NodeProto, name: str) -> int:
    return next(a.i for a in node.attribute if a.name == name)
