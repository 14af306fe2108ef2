"""A load-time graph edit: each layer's attention becomes ONNX Runtime's `GroupQueryAttention`.

The exported attention copies the whole past into `present` and repeats the KV heads on every
step; `GroupQueryAttention`, with past and present bound to one preallocated buffer
(`runtime/slot_batch.py`), appends in place, each row's length in `seqlens_k`. A layer's ops
are found by walking the graph, not by names; the scale moves onto the query (`_layer` says
why). RoPE whose frequencies are fixed (the original, linear and Llama 3's scaling) is applied
by attention from cos/sin caches built here (the graph's rotary ops and `position_ids` go);
other scalings and partial RoPE keep the graph's own rotary ops, so every variant stays exact.
Refused (`False`: served as exported) unless every layer matches, the graph has
`position_ids`, there is no sliding window or soft-capping, and nothing but attention reads
`attention_mask`. Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

from api.engine.model.spec import SEQLENS, TOTAL

_PREFIX = "tokenshop_gqa"
_FLAT = f"{_PREFIX}_flat"  # Reshape target [0, 0, -1]: [batch, seq, heads, dim] -> [batch, seq, -]
COS_CACHE, SIN_CACHE = f"{_PREFIX}_cos_cache", f"{_PREFIX}_sin_cache"
_REPEAT_KV = {"Unsqueeze", "Expand", "Reshape", "Identity", "Cast"}
_SCORE_OPS = {"Add", "Mul", "Div", "Cast", "Where", "IsNaN", "Softmax"}


def _sliding_window(config: dict[str, Any]) -> bool:
    """Whether attention is limited to a window shorter than the context (mistral v0.1 style)."""
    if "use_sliding_window" in config:
        return bool(config["use_sliding_window"])
    window = config.get("sliding_window")
    context = config.get("max_position_embeddings") or 0
    return isinstance(window, int) and window < context


class _Refused(Exception):
    """This graph is not the shape the edit knows; it is served unedited."""


def fuse_attention(model: onnx.ModelProto, config: dict[str, Any]) -> bool:
    """Edit `model` in place to use `GroupQueryAttention`; False (model untouched) if it cannot."""
    if _sliding_window(config) or config.get("attn_logit_softcapping"):
        return False
    if "position_ids" not in {i.name for i in model.graph.input}:
        return False
    graph = model.graph
    # What `_rewrite` may have changed before it refuses. Not a copy of the model: an int4 or
    # int8 export keeps its weights inside the graph, and a copy would add their size to the
    # peak memory of every start.
    nodes, inputs = _copies(graph.node), _copies(graph.input)
    initializers = len(graph.initializer)
    try:
        _rewrite(model, config)
    except _Refused:
        del graph.node[:]
        graph.node.extend(nodes)
        del graph.input[:]
        graph.input.extend(inputs)
        del graph.initializer[initializers:]
        return False
    return True


def _copies(messages: Any) -> list[Any]:
    copies = []
    for message in messages:
        copy = type(message)()
        copy.CopyFrom(message)
        copies.append(copy)
    return copies


class _Graph:
    """Producer / consumer indexes of a graph, and the scalar constants it holds."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        from onnx import numpy_helper

        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        # Scalars only: weights may be external data that was not loaded.
        self.constants: dict[str, np.ndarray] = {
            init.name: numpy_helper.to_array(init)
            for init in graph.initializer
            if math.prod(init.dims) == 1 and init.data_location != init.EXTERNAL
        }
        for node in graph.node:
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value" and attr.t.data_location != attr.t.EXTERNAL:
                        self.constants[node.output[0]] = numpy_helper.to_array(attr.t)

    def scalar(self, name: str) -> float | None:
        value = self.constants.get(name)
        if value is None or value.size != 1:
            return None
        return float(value.reshape(()))

    def only_consumer(self, name: str, op: str) -> onnx.NodeProto:
        users = self.consumers.get(name, [])
        if len(users) != 1 or users[0].op_type != op:
            raise _Refused(f"{name} should feed exactly one {op}")
        return users[0]


def _rewrite(model: onnx.ModelProto, config: dict[str, Any]) -> None:
    from onnx import TensorProto, helper

    graph = model.graph
    index = _Graph(graph)
    outputs = {o.name for o in graph.output}
    heads = int(config.get("num_attention_heads") or config["n_head"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    inv_freq = _static_rope(config)
    rope = _rope_caches(config, inv_freq) if inv_freq is not None else None
    if rope is not None:
        graph.initializer.extend(rope)
        index.constants.update({COS_CACHE: np.empty(0), SIN_CACHE: np.empty(0)})
    layer = 0
    replaced: list[tuple[onnx.NodeProto, list[onnx.NodeProto]]] = []
    while f"present.{layer}.key" in outputs:
        replaced.append(_layer(index, layer, heads, kv_heads, rotary=rope is not None))
        layer += 1
    if not replaced:
        raise _Refused("no present.* outputs")

    for anchor, new_nodes in replaced:
        position = list(graph.node).index(anchor)
        for offset, node in enumerate(new_nodes):
            graph.node.insert(position + offset, node)
    graph.input.append(helper.make_tensor_value_info(SEQLENS, TensorProto.INT32, ["batch_size"]))
    graph.input.append(helper.make_tensor_value_info(TOTAL, TensorProto.INT32, []))
    _drop_dead_nodes(graph)
    if rope is not None and not any(COS_CACHE in node.input for node in graph.node):
        for init in [i for i in graph.initializer if i.name in (COS_CACHE, SIN_CACHE)]:
            graph.initializer.remove(init)
    used = {name for node in graph.node for name in node.input} | outputs
    if "attention_mask" in used:
        raise _Refused("attention_mask still read outside attention")
    kept = [i for i in graph.input if i.name in used]
    del graph.input[:]
    graph.input.extend(kept)
    for output in graph.output:
        if output.name.startswith("present."):
            output.type.tensor_type.shape.dim[2].Clear()
            output.type.tensor_type.shape.dim[2].dim_param = "kv_capacity"
    if not any(op.domain == "com.microsoft" for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _layer(
    index: _Graph, layer: int, heads: int, kv_heads: int, *, rotary: bool
) -> tuple[onnx.NodeProto, list[onnx.NodeProto]]:
    """The GQA node (and any input reshapes) replacing layer `layer`'s attention, and the node
    they go before. With `rotary`, and when the layer's RoPE has the usual shape, attention
    also applies the rotary embedding itself and reads the projections' outputs directly."""
    from onnx import helper

    past_key, past_value = (f"past_key_values.{layer}.{kind}" for kind in ("key", "value"))
    present_key, present_value = (f"present.{layer}.{kind}" for kind in ("key", "value"))
    new_key = _appended(index, present_key, past_key)
    new_value = _appended(index, present_value, past_value)

    attend_values = _reached_matmul(index, present_value)
    transpose = index.only_consumer(attend_values.output[0], "Transpose")
    if _perm(transpose) != [0, 2, 1, 3]:
        raise _Refused("attention output is not transposed to [batch, seq, heads, dim]")
    merge = index.only_consumer(transpose.output[0], "Reshape")
    scores, scale = _scores(index, attend_values.input[0], present_key)
    query, query_scale = _strip_scale(index, scores.input[0])
    scale *= query_scale

    unrotated = [_unrotated(index, query), _unrotated(index, new_key)] if rotary else []
    do_rotary = bool(unrotated) and all(
        name is not None and _flat(index, name) for name in unrotated
    )
    sources = [*(unrotated if do_rotary else [query, new_key]), new_value]
    p = f"{_PREFIX}_{layer}"
    nodes, flat = [], []
    for name, tensor in zip(("q", "k", "v"), sources, strict=True):
        assert tensor is not None
        direct = _flat(index, tensor)
        if direct:  # [batch, seq, heads * dim] before the graph split it into heads
            flat.append(direct)
            continue
        nodes.append(helper.make_node("Transpose", [tensor], [f"{p}_{name}_t"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [f"{p}_{name}_t", _FLAT], [f"{p}_{name}"]))
        flat.append(f"{p}_{name}")
    if nodes and _FLAT not in index.constants:
        index.graph.initializer.append(_int64(_FLAT, [0, 0, -1]))
        index.constants[_FLAT] = np.array([0, 0, -1])
    rope_inputs = [COS_CACHE, SIN_CACHE] if do_rotary else []
    # The scale goes on the query, and attention runs with scale 1: GQA multiplies each head's
    # query by the cached keys through MLAS's SGEMM, which reads the keys in place for one
    # query row only when alpha is 1 and otherwise copies them into a packed panel first, per
    # head and per step. Measured on Qwen2.5-0.5B's shape in int4 (2 cores): 8 streams decode
    # 5% faster at 32 tokens of context, 8% at 2,000. RoPE is linear, so scaling before it
    # is the same product.
    index.graph.initializer.append(_float32(f"{p}_scale", scale))
    nodes.append(helper.make_node("Mul", [flat[0], f"{p}_scale"], [f"{p}_q_scaled"]))
    flat[0] = f"{p}_q_scaled"
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [*flat, past_key, past_value, SEQLENS, TOTAL, *rope_inputs],
            [merge.output[0], present_key, present_value],
            name=f"{p}_attention",
            domain="com.microsoft",
            num_heads=heads,
            kv_num_heads=kv_heads,
            scale=1.0,
            do_rotary=int(do_rotary),
            rotary_interleaved=0,
        )
    )
    for node in (index.producer[present_key], index.producer[present_value], merge):
        index.graph.node.remove(node)
    consumers = index.consumers[merge.output[0]]
    if not consumers:
        raise _Refused("attention output unused")
    return consumers[0], nodes


def _flat(index: _Graph, heads_first: str) -> str | None:
    """The `[batch, seq, heads * dim]` tensor that `Reshape` + `Transpose(0, 2, 1, 3)` turned
    into `heads_first` (how every projection is split into heads), if that is how it was made."""
    transpose = index.producer.get(heads_first)
    if transpose is None or transpose.op_type != "Transpose" or _perm(transpose) != [0, 2, 1, 3]:
        return None
    reshape = index.producer.get(transpose.input[0])
    if reshape is None or reshape.op_type != "Reshape":
        return None
    return reshape.input[0]


def _unrotated(index: _Graph, rotated: str) -> str | None:
    """`x` when `rotated` is HF's `x * cos + rotate_half(x) * sin`, with `rotate_half` spelled
    `Concat(Neg(Slice(x)), Slice(x))`; None for any other shape."""
    add = index.producer.get(rotated)
    if add is None or add.op_type != "Add":
        return None
    products = [index.producer.get(name) for name in add.input]
    if len(products) != 2 or any(p is None or p.op_type != "Mul" for p in products):
        return None
    for plain, turned in (products, products[::-1]):
        halves = [index.producer.get(name) for name in turned.input]  # type: ignore[union-attr]
        concat = next((n for n in halves if n is not None and n.op_type == "Concat"), None)
        if concat is None or len(concat.input) != 2:
            continue
        negated = index.producer.get(concat.input[0])
        if negated is None or negated.op_type != "Neg":
            continue
        slices = [index.producer.get(negated.input[0]), index.producer.get(concat.input[1])]
        if any(n is None or n.op_type != "Slice" for n in slices):
            continue
        source = {n.input[0] for n in slices}  # type: ignore[union-attr]
        if len(source) == 1 and source <= set(plain.input):  # type: ignore[union-attr]
            return source.pop()
    return None


# The scalings whose frequencies are fixed, and the fields each needs.
_SCALING_FIELDS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}


def _static_rope(config: dict[str, Any]) -> np.ndarray | None:
    """RoPE's inverse frequencies where they are one fixed vector for every position and every
    dim is rotated, on heads ONNX Runtime's rotary kernel takes (a multiple of 16): the
    original, linear scaling and Llama 3's. The caches below are then what the graph computes
    from the positions. None for the rest (dynamic NTK, YaRN's and LongRoPE's scaled cos/sin,
    partial rotation), whose graphs keep their own rotary ops."""
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    partial = config.get("partial_rotary_factor", 1.0)
    heads = config.get("num_attention_heads")
    if not heads or "max_position_embeddings" not in config or partial not in (None, 1, 1.0):
        return None
    dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    needs = _SCALING_FIELDS.get(kind)  # None: a scaling whose frequencies vary
    if dim % 16 or needs is None or not needs <= scaling.keys():
        return None
    base = np.float32(config.get("rope_theta", 10000.0))
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = np.float32(1.0) / np.power(base, exponent, dtype=np.float32)
    if kind == "linear":
        return inv_freq / np.float32(scaling["factor"])
    if kind == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    return inv_freq


def _llama3_frequencies(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's: long wavelengths slowed by `factor`, short ones kept, those between
    blended. In float32, operation for operation as transformers computes them in PyTorch
    (`x / tensor` there is `reciprocal(tensor) * x`), so the caches hold the same values."""
    f32 = np.float32
    factor, low, high = (
        f32(scaling["factor"]),
        scaling["low_freq_factor"],
        scaling["high_freq_factor"],
    )
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = f32(old_context / low), f32(old_context / high)
    wavelen = np.reciprocal(inv_freq) * f32(2 * math.pi)
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (np.reciprocal(wavelen) * f32(old_context) - f32(low)) / f32(high - low)
    smoothed = (f32(1) - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _rope_caches(config: dict[str, Any], inv_freq: np.ndarray) -> list[onnx.TensorProto]:
    """cos / sin of position x inverse frequency, [context, head_dim / 2], in float32 as
    transformers' rotary embedding computes them."""
    from onnx import numpy_helper

    positions = np.arange(int(config["max_position_embeddings"]), dtype=np.float32)
    freqs = np.outer(positions, inv_freq).astype(np.float32)
    return [
        numpy_helper.from_array(np.cos(freqs).astype(np.float32), COS_CACHE),
        numpy_helper.from_array(np.sin(freqs).astype(np.float32), SIN_CACHE),
    ]


def _appended(index: _Graph, present: str, past: str) -> str:
    """The new keys (or values) that `Concat(past, new)` appends to make `present`."""
    node = index.producer.get(present)
    if node is None or node.op_type != "Concat" or list(node.input[:1]) != [past]:
        raise _Refused(f"{present} is not Concat({past}, new)")
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    if axis not in (2, -2) or len(node.input) != 2:
        raise _Refused(f"{present}: unexpected concat")
    return node.input[1]


def _reached_matmul(index: _Graph, start: str) -> onnx.NodeProto:
    """The one MatMul that `start` reaches through the ops that repeat KV heads."""
    found, frontier, seen = [], [start], set()
    while frontier:
        name = frontier.pop()
        for node in index.consumers.get(name, []):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "MatMul":
                found.append(node)
            elif node.op_type in _REPEAT_KV and node.input[0] == name:
                frontier.extend(node.output)
    if len(found) != 1:
        raise _Refused(f"{start} reaches {len(found)} MatMuls")
    return found[0]


def _scores(index: _Graph, probs: str, present_key: str) -> tuple[onnx.NodeProto, float]:
    """Walk back from the attention probabilities to the `Q x K^T` MatMul: only the mask, a
    constant scale and the softmax may lie between. Returns the MatMul and the scale found."""
    scale, name, softmax = 1.0, probs, False
    while True:
        node = index.producer.get(name)
        if node is None or node.op_type not in _SCORE_OPS | {"MatMul"}:
            raise _Refused(f"unexpected op before attention probabilities: {node}")
        if node.op_type == "MatMul":
            break
        softmax |= node.op_type == "Softmax"
        name, factor = _score_input(index, node)
        scale *= factor
    if not softmax:
        raise _Refused("no softmax")
    key_path, key_scale = _strip_scale(index, node.input[1])
    if present_key not in _ancestors(index, key_path, depth=8):
        raise _Refused("scores do not read the present keys")
    return node, scale * key_scale


def _score_input(index: _Graph, node: onnx.NodeProto) -> tuple[str, float]:
    """The input of a node between the scores and the probabilities that carries the scores."""
    if node.op_type in {"Softmax", "Cast"}:
        return node.input[0], 1.0
    if node.op_type == "Where":  # Where(IsNaN(p), 0, p): fully masked rows become zeros
        return node.input[2], 1.0
    first, second = node.input[0], node.input[1]
    if node.op_type in {"Mul", "Div"}:
        constant = index.scalar(second)
        if constant is None and node.op_type == "Mul":
            first, second = second, first
            constant = index.scalar(second)
        if constant is None or constant == 0:
            raise _Refused("a non-constant factor on the scores")
        return first, constant if node.op_type == "Mul" else 1.0 / constant
    # Add: scores + mask; the scores side comes from a MatMul or a scale, the mask from a Where.
    for candidate in (first, second):
        producer = index.producer.get(candidate)
        if producer is not None and producer.op_type in {"MatMul", "Mul", "Div"}:
            return candidate, 1.0
    raise _Refused("cannot tell the scores from the mask")


def _strip_scale(index: _Graph, name: str) -> tuple[str, float]:
    """Follow `name` back over multiplications by a constant; return the tensor and factor."""
    factor = 1.0
    while True:
        node = index.producer.get(name)
        if node is None or node.op_type not in {"Mul", "Div"}:
            return name, factor
        variable, constant = node.input[0], index.scalar(node.input[1])
        if constant is None and node.op_type == "Mul":
            variable, constant = node.input[1], index.scalar(node.input[0])
        if constant is None or constant == 0:
            return name, factor
        factor *= constant if node.op_type == "Mul" else 1.0 / constant
        name = variable


def _ancestors(index: _Graph, name: str, *, depth: int) -> set[str]:
    names, frontier = {name}, [name]
    for _ in range(depth):
        nxt: list[str] = []
        for tensor in frontier:
            node = index.producer.get(tensor)
            if node is not None:
                nxt.extend(i for i in node.input if i and i not in names)
        names.update(nxt)
        frontier = nxt
    return names


def _perm(node: onnx.NodeProto) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), [])


def _int64(name: str, values: list[int]) -> onnx.TensorProto:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(values, np.int64), name)


def _float32(name: str, value: float) -> onnx.TensorProto:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, np.float32), name)


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove nodes none of whose outputs reach a graph output; keep a topological order."""
    needed = {o.name for o in graph.output}
    live = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            live.append(node)
            needed.update(node.input)
    live.reverse()
    ordered = _topological(
        live, {i.name for i in graph.input} | {i.name for i in graph.initializer}
    )
    del graph.node[:]
    graph.node.extend(ordered)


def _topological(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    ready = set(available) | {""}
    pending, ordered = list(nodes), []
    while pending:
        rest = []
        for node in pending:
            if all(name in ready for name in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise _Refused("graph has a cycle or a missing input after the edit")
        pending = rest
    return ordered
