"""A load-time graph edit: ONNX Runtime's `GroupQueryAttention` becomes our `CachedAttention`.

Our op (`ops/csrc/attention.c`) takes the same inputs and KV buffer and scores the query heads
that share a KV head as one tile, reading each cached key and value once for all of them, where
ONNX Runtime's CPU kernel runs two SGEMMs per sequence and query head. The query's scale `Mul`
and the merged q/k/v `Split` go into the op where nothing else reads them. It takes left-padded
rows, so when every attention is ours, prompts of different lengths are prefilled in one call
(`runtime/slot_batch.py`). Nodes with a local window, soft-capping, interleaved rotary, inputs
past the rotary caches, a cache that is not a float32 graph input, or a head size other than a
multiple of 8 up to 256 stay on ONNX Runtime. Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from api.engine.graph.onnx_edit import declare_domain, readers_of
from api.engine.ops.library import DOMAIN

if TYPE_CHECKING:
    import onnx

OP_TYPE = "CachedAttention"
HALF_CACHE_OP_TYPE = "CachedAttentionHalfCache"  # the same op over a float16 cache
# Model metadata the edit sets when every attention of the graph is ours: kept in ONNX Runtime's
# optimized-graph cache, and read back from the session (`model.py`).
PADDED_PREFILL = "tokenshop.padded_prefill"
_INPUTS = 9  # query, key, value, past key, past value, seqlens_k, total, cos, sin
_MAX_DIM = 256  # the op's tile buffers


def use_attention_kernel(model: onnx.ModelProto) -> int:
    """Turn every `GroupQueryAttention` node the op covers into a `CachedAttention`, in place;
    how many."""
    from onnx import helper

    graph = model.graph
    head_dims = _head_dims(graph)
    producer = {out: node for node in graph.node for out in node.output}
    readers = readers_of(graph)
    scalars = _float_scalars(graph)
    changed = 0
    for node in list(graph.node):
        attributes = _covered(node)
        dim = head_dims.get(node.input[3]) if attributes is not None else None
        if attributes is None or dim is None or dim % 8 or dim > _MAX_DIM:
            continue
        inputs = [*node.input, *[""] * (_INPUTS - len(node.input))]
        scale = attributes.get("scale") or 1.0 / math.sqrt(dim)
        scaling = _scaling(producer.get(inputs[0]), readers, scalars)
        if scaling is not None:
            mul, inputs[0], factor = scaling
            scale *= factor
            _remove(graph, mul, readers)
            readers[inputs[0]].append(node)
        split = _packing(producer.get(inputs[0]), inputs[:3], readers)
        if split is not None:
            inputs[:3] = [split.input[0], "", ""]
            _remove(graph, split, readers)
        replacement = helper.make_node(
            OP_TYPE,
            inputs,
            list(node.output),
            name=f"{node.name or 'attention'}_cached",
            domain=DOMAIN,
            num_heads=attributes["num_heads"],
            kv_num_heads=attributes["kv_num_heads"],
            scale=float(scale),
        )
        graph.node.insert(list(graph.node).index(node), replacement)
        graph.node.remove(node)
        changed += 1
    if changed:
        declare_domain(model)
    if changed and not any(node.op_type == "GroupQueryAttention" for node in graph.node):
        helper.set_model_props(model, {**_props(model), PADDED_PREFILL: "1"})
    return changed


def use_half_cache(model: onnx.ModelProto) -> bool:
    """Keep the KV cache in float16: every `CachedAttention` becomes `CachedAttentionHalfCache`,
    and the graph's past inputs and present outputs float16, in place. Only when every attention
    of the graph is ours (ONNX Runtime's takes a cache of the query's type); False, model
    untouched, otherwise. Attention still computes in float32 (each key and value is widened
    as it is read): the cache's bytes halve, and with them what a long context reads a step."""
    from onnx import TensorProto

    if not takes_left_padding(_props(model)):
        return False
    graph = model.graph
    caches: set[str] = set()
    for node in graph.node:
        if node.op_type == OP_TYPE and node.domain == DOMAIN:
            node.op_type = HALF_CACHE_OP_TYPE
            caches.update(node.input[3:5])
            caches.update(node.output[1:3])
    for value in [*graph.input, *graph.output]:
        if value.name in caches:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    return bool(caches)


def takes_left_padding(metadata: dict[str, str]) -> bool:
    """Whether a graph's every attention is ours (its custom metadata says so), so that prompts
    of different lengths may be prefilled in one call, left-padded."""
    return metadata.get(PADDED_PREFILL) == "1"


def _props(model: onnx.ModelProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in model.metadata_props}


def _head_dims(graph: onnx.GraphProto) -> dict[str, int]:
    """The head size of every float32 graph input `[batch, heads, positions, head size]` with a
    fixed one: the caches that attention's past inputs are."""
    from onnx import TensorProto

    dims = {}
    for value in graph.input:
        tensor = value.type.tensor_type
        shape = tensor.shape.dim
        if tensor.elem_type == TensorProto.FLOAT and len(shape) == 4 and shape[3].dim_value:
            dims[value.name] = shape[3].dim_value
    return dims


def _covered(node: onnx.NodeProto) -> dict[str, float] | None:
    """The attributes of a `GroupQueryAttention` the op computes the same, else None."""
    from onnx import helper

    if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
        return None
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    same = (
        len(node.input) <= _INPUTS
        and attributes.get("local_window_size", -1) == -1
        and not attributes.get("softcap", 0.0)
        and not attributes.get("rotary_interleaved", 0)
        and bool(attributes.get("do_rotary", 0)) == (len(node.input) == _INPUTS)
        and not attributes.get("smooth_softmax", 0)
    )
    return attributes if same else None


def _float_scalars(graph: onnx.GraphProto) -> dict[str, float]:
    from onnx import TensorProto, numpy_helper

    return {
        init.name: float(numpy_helper.to_array(init).reshape(()))
        for init in graph.initializer
        if init.data_type == TensorProto.FLOAT
        and math.prod(init.dims) == 1
        and init.data_location != TensorProto.EXTERNAL
    }


def _scaling(
    mul: onnx.NodeProto | None,
    readers: dict[str, list[onnx.NodeProto]],
    scalars: dict[str, float],
) -> tuple[onnx.NodeProto, str, float] | None:
    """(the Mul, query, factor) when the attention's query is `query * factor` read by it
    alone."""
    if mul is None or mul.op_type != "Mul" or len(readers[mul.output[0]]) != 1:
        return None
    for variable, constant in (mul.input, mul.input[::-1]):
        if constant in scalars:
            return mul, variable, scalars[constant]
    return None


def _packing(
    split: onnx.NodeProto | None, qkv: list[str], readers: dict[str, list[onnx.NodeProto]]
) -> onnx.NodeProto | None:
    """The `Split` whose three outputs are exactly q, k, v along the last axis, read by the
    attention alone: its input is then q, k and v packed."""
    if split is None or split.op_type != "Split" or list(split.output) != qkv:
        return None
    axis = next((a.i for a in split.attribute if a.name == "axis"), 0)
    if axis not in (-1, 2) or any(len(readers[name]) != 1 for name in qkv):
        return None
    return split


def _remove(
    graph: onnx.GraphProto, node: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]
) -> None:
    """Take `node` out, and any initializer that only it read."""
    graph.node.remove(node)
    for name in node.input:
        readers[name].remove(node)
        if not readers[name]:
            for init in [i for i in graph.initializer if i.name == name]:
                graph.initializer.remove(init)
