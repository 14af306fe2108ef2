"""A load-time graph edit: a tied model's embedding read from its LM head's int8 weights
(`HeadEmbedding`, `ops/csrc/embedding.c`), so the served graph holds one table, not two.

Our quantizers give a tied model's head a copy of the embedding of its own (`untie_head`), int8,
and leave the embedding `Gather` on the float32 table (or, in an int8 export, on ONNX Runtime's
uint8 copy of it). Served as exported, that table is mapped from the model file beside the
head's, and the rows of the tokens a server sees fault it in, read-ahead and all: 110-290 MB of
it resident after a few hundred tokens on a Qwen2.5-0.5B shape, up to 1.58 GB on
Llama-3.2-3B's (bench/results/2026-11-26-compare-zen4-e6ecaf7.md). After the edit a row is a
column of the head's weights times its scale, read from the copy the head's kernel holds.

The edit applies only where the two tables are one: sampled rows of the embedding must equal the
head's columns within the two quantizations' rounding (half a step of each). So an untied model,
or a head another tool quantized from other weights, keeps its `Gather`. The embedding's values
become the int8 head's, which the logits are computed with anyway; tests bound what that changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from api.engine.graph.onnx_edit import readers_of
from api.engine.ops.library import DOMAIN

if TYPE_CHECKING:
    import onnx

OP_TYPE = "HeadEmbedding"
SAMPLED_ROWS = 64


def share_tied_embedding(model: onnx.ModelProto, model_dir: Path) -> bool:
    """Read the embedding from the int8 head where the model ties them, in place; whether it
    did. `model_dir` holds the graph's external data, if any (the tie is checked on values)."""
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    readers = readers_of(graph)
    heads = [n for n in graph.node if n.op_type == "Int8MatMul" and n.domain == DOMAIN]
    for gather in graph.node:
        table = initializers.get(gather.input[0]) if gather.op_type == "Gather" else None
        if table is None or len(table.dims) != 2 or len(readers[table.name]) != 1:
            continue
        if any(a.name == "axis" and a.i != 0 for a in gather.attribute):
            continue
        rows, width = table.dims
        dequantize = _dequantize_behind(gather, readers, initializers)
        if table.data_type != _FLOAT and dequantize is None:
            continue
        for head in heads:
            attrs = {a.name: a.i for a in head.attribute}
            if (attrs.get("N"), attrs.get("K")) != (rows, width):
                continue
            weights = _head_weights(head, producer, initializers)
            if weights is None:
                continue
            embedding = _Table(table, dequantize, initializers, model_dir)
            if not _tied(embedding, weights, model_dir):
                continue
            _replace(graph, gather, dequantize, head, weights.preparation)
            return True
    return False


_FLOAT = 1  # onnx.TensorProto.FLOAT


@dataclass(frozen=True)
class _HeadWeights:
    """The head's int8 weights [K, N] and their scale ([] or [N]), and the nodes that make the
    op's B and scales of them (folded by ONNX Runtime at load)."""

    weight: onnx.TensorProto
    scale: onnx.TensorProto
    preparation: tuple[onnx.NodeProto, ...]


def _head_weights(
    head: onnx.NodeProto,
    producer: dict[str, onnx.NodeProto],
    initializers: dict[str, onnx.TensorProto],
) -> _HeadWeights | None:
    """`int8_matmul`'s chains: B = Transpose(Reshape(W)), scales = Expand(Reshape(scale))."""
    transpose = producer.get(head.input[1])
    expand = producer.get(head.input[2])
    if transpose is None or expand is None:
        return None
    reshape_b = producer.get(transpose.input[0])
    reshape_s = producer.get(expand.input[0])
    if reshape_b is None or reshape_s is None:
        return None
    weight = initializers.get(reshape_b.input[0])
    scale = initializers.get(reshape_s.input[0])
    if weight is None or scale is None or len(weight.dims) != 2:
        return None
    return _HeadWeights(weight, scale, (reshape_b, transpose, reshape_s, expand))


def _dequantize_behind(
    gather: onnx.NodeProto,
    readers: dict[str, list[onnx.NodeProto]],
    initializers: dict[str, onnx.TensorProto],
) -> onnx.NodeProto | None:
    """The `DequantizeLinear` (per-tensor scale and zero point) that alone reads a quantized
    table's rows, as ONNX Runtime's dynamic quantization writes it; else None."""
    found = readers.get(gather.output[0], [])
    if len(found) != 1 or found[0].op_type != "DequantizeLinear":
        return None
    node = found[0]
    params = [initializers.get(name) for name in node.input[1:]]
    if len(params) != 2 or any(p is None or int(np.prod(p.dims)) != 1 for p in params):
        return None
    return node


class _Table:
    """The embedding's rows as floats, read without loading the whole table."""

    def __init__(
        self,
        table: onnx.TensorProto,
        dequantize: onnx.NodeProto | None,
        initializers: dict[str, onnx.TensorProto],
        model_dir: Path,
    ) -> None:
        self.values = _array(table, model_dir)
        self.scale, self.zero = 0.0, 0.0  # a float table: its values as they are
        if dequantize is not None:
            self.scale = float(_array(initializers[dequantize.input[1]], model_dir).reshape(-1)[0])
            self.zero = float(_array(initializers[dequantize.input[2]], model_dir).reshape(-1)[0])

    def rows(self, ids: np.ndarray) -> np.ndarray:
        values = np.asarray(self.values[ids], dtype=np.float64)
        return (values - self.zero) * self.scale if self.scale else values

    def step(self) -> float:
        """The table's quantization step (0 for a float table)."""
        return self.scale


def _tied(embedding: _Table, head: _HeadWeights, model_dir: Path) -> bool:
    """Whether sampled rows of the embedding equal the head's columns, within half a step of
    each quantization (the head's per-tensor or per-column scale, the table's own if any)."""
    weight = _array(head.weight, model_dir)  # [K, N]
    scale = _array(head.scale, model_dir).reshape(-1).astype(np.float64)
    n = weight.shape[1]
    ids = np.unique(np.linspace(0, n - 1, SAMPLED_ROWS).astype(np.int64))
    columns = np.asarray(weight[:, ids], dtype=np.float64).T  # [ids, K]
    column_scale = scale[ids] if scale.size == n else np.full(ids.size, scale[0])
    dequantized = columns * column_scale[:, None]
    bound = 0.5 * column_scale[:, None] * 1.001 + 0.5 * embedding.step() * 1.001 + 1e-7
    return bool(np.all(np.abs(embedding.rows(ids) - dequantized) <= bound))


def _array(tensor: onnx.TensorProto, model_dir: Path) -> np.ndarray:
    """An initializer's values: external data memory-mapped, inline data as it is."""
    from onnx import TensorProto, helper, numpy_helper

    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    shape = tuple(tensor.dims)
    if tensor.data_location == TensorProto.EXTERNAL:
        info = {entry.key: entry.value for entry in tensor.external_data}
        return np.memmap(
            model_dir / info["location"],
            dtype=dtype,
            mode="r",
            offset=int(info.get("offset", 0)),
            shape=shape,
        )
    if tensor.raw_data:
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(shape)
    return numpy_helper.to_array(tensor)


def _replace(
    graph: onnx.GraphProto,
    gather: onnx.NodeProto,
    dequantize: onnx.NodeProto | None,
    head: onnx.NodeProto,
    preparation: tuple[onnx.NodeProto, ...],
) -> None:
    """`HeadEmbedding` where the `Gather` (and its `DequantizeLinear`) was, reading the head's B
    and scales; the nodes making those move up with it (they read only initializers)."""
    from onnx import helper

    output = (dequantize or gather).output[0]
    attrs = {a.name: a.i for a in head.attribute if a.name in ("K", "N", "block_size")}
    made = helper.make_node(
        OP_TYPE,
        [gather.input[1], head.input[1], head.input[2]],
        [output],
        domain=DOMAIN,
        **attrs,
    )
    moved = []
    for node in preparation:
        copy = type(node)()
        copy.CopyFrom(node)
        moved.append(copy)
        graph.node.remove(node)
    at = list(graph.node).index(gather)
    graph.node.remove(gather)
    if dequantize is not None:
        graph.node.remove(dequantize)
    for offset, node in enumerate([*moved, made]):
        graph.node.insert(at + offset, node)
