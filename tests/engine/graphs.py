"""ONNX graphs built by hand for the op tests and bench/int4_kernel.py: one attention layer as
`fused_attention.py` leaves it, and int4 projections as ONNX Runtime's quantizer writes them.
Nothing here needs pytest or torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

POSITIONS = 512  # rotary cache length


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    dim: int

    @property
    def widths(self) -> list[int]:
        return [self.heads * self.dim, self.kv_heads * self.dim, self.kv_heads * self.dim]


QWEN = Shape(14, 2, 64)  # Qwen2.5-0.5B: 7 query heads per KV head, a tile of 8 lanes


SHAPES = [QWEN, Shape(4, 4, 32), Shape(16, 2, 16), Shape(3, 1, 256)]


def attention_graph(shape: Shape, *, rotary: bool, packed: bool, scale: float) -> onnx.ModelProto:
    """`x` [B, S, (H + 2 KV) * D] -> Split -> q (times `scale`), k, v -> GroupQueryAttention."""
    inits = [
        numpy_helper.from_array(np.array(shape.widths, np.int64), "sizes"),
        numpy_helper.from_array(np.array(scale, np.float32), "scale"),
    ]
    qkv = ["q", "k", "v"]
    nodes = [helper.make_node("Split", ["x", "sizes"], qkv, axis=-1)] if packed else []
    inputs = [] if packed else [f"{n}_in" for n in qkv]
    if not packed:
        nodes += [helper.make_node("Identity", [f"{n}_in"], [n]) for n in qkv]
    nodes.append(helper.make_node("Mul", ["q", "scale"], ["q_scaled"]))
    rope = ["cos", "sin"] if rotary else []
    if rotary:
        rng = np.random.default_rng(3)
        angles = rng.uniform(0, 6.3, (POSITIONS, shape.dim // 2)).astype(np.float32)
        inits += [
            numpy_helper.from_array(np.cos(angles), "cos"),
            numpy_helper.from_array(np.sin(angles), "sin"),
        ]
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            ["q_scaled", "k", "v", "past_key", "past_value", "seqlens_k", "total", *rope],
            ["out", "present_key", "present_value"],
            domain="com.microsoft",
            num_heads=shape.heads,
            kv_num_heads=shape.kv_heads,
            scale=1.0,
            do_rotary=int(rotary),
        )
    )
    cache = ["batch", shape.kv_heads, "capacity", shape.dim]
    x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", sum(shape.widths)])]
    if not packed:
        x = [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq", width])
            for name, width in zip(inputs, shape.widths, strict=True)
        ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            *x,
            helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
            helper.make_tensor_value_info("total", TensorProto.INT32, []),
        ],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", None]),
            helper.make_tensor_value_info("present_key", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("present_value", TensorProto.FLOAT, cache),
        ],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def session(model: onnx.ModelProto, library: Path | None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def run_in_place(
    attention: ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    cache: list[np.ndarray],
    lengths: np.ndarray,
) -> np.ndarray:
    """One call with past and present bound to the same buffers (updated in place); the
    attention output. `lengths`: each row's total after the call."""
    binding = attention.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    binding.bind_cpu_input("seqlens_k", (lengths - 1).astype(np.int32))
    binding.bind_cpu_input("total", np.array(lengths.max(), np.int32))
    binding.bind_output("out")
    for name, buffer in zip(("key", "value"), cache, strict=True):
        shape, pointer = list(buffer.shape), buffer.ctypes.data
        binding.bind_input(f"past_{name}", "cpu", 0, buffer.dtype.type, shape, pointer)
        binding.bind_output(f"present_{name}", "cpu", 0, buffer.dtype.type, shape, pointer)
    attention.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def token_feeds(shape: Shape, packed: bool, rows: int, tokens: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, tokens, sum(shape.widths))).astype(np.float32)
    if packed:
        return {"x": x}
    q, k, v = np.split(x, np.cumsum(shape.widths)[:2], axis=-1)
    return {"q_in": q.copy(), "k_in": k.copy(), "v_in": v.copy()}


def packed_weights(k: int, n: int, block: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' B (uint8 [n, blocks, block / 2], two weights a byte) and scales."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    q = rng.integers(0, 16, size=(n, blocks, block), dtype=np.uint8)
    q[:, -1, k - (blocks - 1) * block :] = 8  # the quantizer's padding: weight 0
    packed = q[:, :, 0::2] | (q[:, :, 1::2] << 4)
    scales = rng.uniform(0.001, 0.02, size=(n * blocks)).astype(np.float32)
    return packed, scales


def int8_product(a: np.ndarray, k: int, n: int, block: int) -> np.ndarray:
    """What both kernels compute, in numpy: each row's blocks quantized to int8 by their largest
    magnitude (x * (1 / (max / 127)), rounded half to even), times the 4-bit weights."""
    b, scales = packed_weights(k, n, block, seed=k + n + block)
    blocks = -(-k // block)
    weights = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, blocks, block).astype(np.int64) - 8
    padded = np.zeros((a.shape[0], blocks, block), np.float32)
    padded.reshape(a.shape[0], -1)[:, :k] = a
    top = np.abs(padded).max(axis=2, keepdims=True)
    step = top / np.float32(127)
    inverse = np.divide(np.float32(1), step, out=np.zeros_like(step), where=step > 0)
    q = np.rint(padded * inverse).astype(np.int64)
    dots = np.einsum("rbi,nbi->rnb", q, weights)
    return np.einsum("rnb,rb,nb->rn", dots, step[:, :, 0], scales.reshape(n, blocks))


def nbits_node(name: str, inputs: int = 3, **attributes: int) -> onnx.NodeProto:
    names = ["x", f"{name}.B", f"{name}.scales", f"{name}.zero_points"][:inputs]
    defaults = {"K": 128, "N": 64, "bits": 4, "block_size": 128} | attributes
    return helper.make_node(
        "MatMulNBits", names, [name], name=name, domain="com.microsoft", **defaults
    )


def matmul_nbits(
    k: int, n: int, block: int, *, seed: int, accuracy_level: int = 4
) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """A `MatMulNBits` node from `x` [.., k] to `Y` [.., n] and its initializers: random
    symmetric 4-bit weights (`packed_weights`) and their scales."""
    b, scales = packed_weights(k, n, block, seed=seed)
    node = helper.make_node(
        "MatMulNBits",
        ["x", "B", "scales"],
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
        accuracy_level=accuracy_level,
    )
    return node, [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
