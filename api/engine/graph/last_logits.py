"""A load-time graph edit: compute logits for the last positions only (by default one).

An Optimum decoder returns logits for every input position, but generation reads only the last
one; at prefill that is the LM head over every prompt token and a `seq x vocab` tensor. A
`Slice` keeps the last positions of the hidden state that feeds the head: how many is the graph
input `LOGITS_POSITIONS` (`model/spec.py`): 1, or more where a speculative step verifies its
drafts (`runtime/speculation.py`). Exact, because from
there to `logits` everything works position by position (the head, then element-wise ops with
constant operands); any other shape of graph is left alone (`slice_last_position` returns
False) and the engine reads `logits[:, -1]`. One exception is sliced on purpose: ONNX Runtime's
dynamic int8 head, whose activation scale spans the positions it is given, so the last
position gets a scale of its own, as on every decode step (a call that asks for several shares
one; our `Int8MatMul`, which replaces that head where it runs, scales each row on its own).
Only the graph proto is read, not the weights. Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from api.engine.model.spec import LOGITS_POSITIONS

if TYPE_CHECKING:
    import onnx

_HEADS = {"MatMul", "MatMulNBits"}
_RESCALE = {"Mul", "Cast"}  # an int8 head's int32 result back to float
# Ops that act on each position on their own when their other operands are constants.
_PER_POSITION = {"Cast", "Identity", "Mul", "Div", "Add", "Sub", "Tanh"}
_PREFIX = "tokenshop_last_position"
# Part of the optimized-graph cache key: bump on any change (v3: the count is an input).
EDIT_TAG = "last-position-logits-v3"


def slice_last_position(model: onnx.ModelProto) -> bool:
    """Edit `model` in place so `logits` covers the last `LOGITS_POSITIONS` positions (1 unless
    a call says otherwise); False if it cannot be done."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = {init.name for init in graph.initializer} | {
        out for node in graph.node if node.op_type == "Constant" for out in node.output
    }
    logits = next((o for o in graph.output if o.name == "logits"), None)
    if logits is None or len(logits.type.tensor_type.shape.dim) != 3:
        return False
    head = _head_of(producers.get("logits"), producers, constants)
    if head is None:
        return False
    hidden = head.input[0]
    if hidden in constants or _feeds_others(graph, hidden, head):
        return False
    _insert_slice(model, head, hidden)
    logits.type.tensor_type.shape.dim[1].Clear()
    logits.type.tensor_type.shape.dim[1].dim_param = LOGITS_POSITIONS
    return True


def _head_of(
    node: onnx.NodeProto | None,
    producers: dict[str, onnx.NodeProto],
    constants: set[str],
) -> onnx.NodeProto | None:
    """Walk back from `logits` over per-position ops to the LM head MatMul (for an int8 head,
    its `DynamicQuantizeLinear`): the node whose first input is the hidden state to slice."""
    while node is not None and node.op_type in _PER_POSITION:
        variable = [name for name in node.input if name not in constants]
        if len(variable) != 1:
            return _dynamic_int8_head(node, producers, constants)
        node = producers.get(variable[0])
    if node is None or node.op_type not in _HEADS or node.input[1] not in _static(node, producers):
        return None
    return node


def _dynamic_int8_head(
    end: onnx.NodeProto, producers: dict[str, onnx.NodeProto], constants: set[str]
) -> onnx.NodeProto | None:
    """The `DynamicQuantizeLinear` of an int8 head as `quantize_dynamic` writes it,
    `Mul(Cast(MatMulInteger(x_q, W, x_zp, W_zp)), Mul(x_scale, W_scale))`, if `end` ends one."""
    quantizers: dict[str, onnx.NodeProto] = {}
    matmuls: list[onnx.NodeProto] = []
    pending, seen = [end], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type == "MatMulInteger":
            matmuls.append(node)
        elif node.op_type not in _RESCALE:
            return None
        for name in node.input:
            if not name or name in constants:
                continue
            producer = producers.get(name)
            if producer is None:
                return None
            if producer.op_type == "DynamicQuantizeLinear":
                quantizers[producer.output[0]] = producer
            else:
                pending.append(producer)
    if len(quantizers) != 1 or len(matmuls) != 1 or matmuls[0].input[1] not in constants:
        return None
    return next(iter(quantizers.values()))


def _static(head: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> set[str]:
    """The head's weight input when it is an initializer or a Transpose of one (tied head)."""
    weight = head.input[1]
    producer = producers.get(weight)
    if producer is None or (producer.op_type == "Transpose" and producer.input[0] not in producers):
        return {weight}
    return set()


def _feeds_others(graph: onnx.GraphProto, name: str, consumer: onnx.NodeProto) -> bool:
    """True when something besides `consumer` reads `name` (then it must keep every position)."""
    return any(name in node.input for node in graph.node if node is not consumer) or any(
        out.name == name for out in graph.output
    )


def _insert_slice(model: onnx.ModelProto, consumer: onnx.NodeProto, hidden: str) -> None:
    """`hidden[:, -count:]` into `consumer`, `count` the graph input `LOGITS_POSITIONS` (an
    input, not an initializer a call may override: ONNX Runtime's I/O binding binds inputs
    only)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    starts, ends, axes, sliced = (f"{_PREFIX}_{part}" for part in ("starts", "ends", "axes", "out"))
    graph.input.append(helper.make_tensor_value_info(LOGITS_POSITIONS, TensorProto.INT64, [1]))
    for name, value in ((ends, np.iinfo(np.int64).max), (axes, 1)):
        graph.initializer.append(numpy_helper.from_array(np.array([value], np.int64), name))
    negate = helper.make_node("Neg", [LOGITS_POSITIONS], [starts], name=f"{_PREFIX}_neg")
    node = helper.make_node("Slice", [hidden, starts, ends, axes], [sliced], name=_PREFIX)
    index = list(graph.node).index(consumer)
    graph.node.insert(index, node)
    graph.node.insert(index, negate)
    consumer.input[0] = sliced
