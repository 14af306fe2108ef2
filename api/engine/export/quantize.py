"""Weight quantization of an export dir, in place: int8 (dynamic) and int4 (`MatMulNBits`).

CPU decoding reads every weight once per step, so bytes per weight set the speed. Two choices
are not the quantizers' defaults, both about the LM head:

- A tied embedding / LM head would stay fp32 (quantizers only touch a MatMul whose weight is an
  initializer, and the head reads the embedding through a `Transpose`): `untie_head` stores
  the transposed head as its own initializer first; the embedding `Gather` stays fp32, read
  one row per token.
- The head is quantized separately (`head_bits`): its errors land directly on the logits, so it
  may keep more bits than the layers. An 8-bit head of an int4 export uses ONNX Runtime's
  dynamic int8 kernel, not 8-bit `MatMulNBits`, which is slower for a batch of rows. Figures:
  bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx_data"
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf's 2 GB limit, with margin


@dataclass(frozen=True)
class Int4Config:
    """How `MatMulNBits` quantizes: layers at 4 bits, the head at `head_bits` (4, 8, or 32
    to keep it fp32). Defaults chosen by `bench/quantize.py` (see the export's docstring).

    Blocks of 128 weights per scale, not 32 or 256: chosen by decode speed on the Qwen2.5-0.5B
    shape (`bench/quantize.py`, `bench/context.py`), greedy agreement with fp32 about the same
    (`tests/engine/export/test_quantize.py`); 256 gained too little to trade for twice the
    weights per scale, whose cost in quality a random-weight model cannot show
    (bench/results/2026-11-26-kernel-notes.md)."""

    block_size: int = 128
    accuracy_level: int = 4  # int8 activations in the kernel: the fast CPU path
    head_bits: int = 8
    symmetric: bool = True
    # An 8-bit head through dynamic quantization (MatMulInteger), not MatMulNBits; see above.
    head_dynamic: bool = True


def quantize_int8(out: Path, *, source: Path | None = None, any_cpu: bool = False) -> None:
    """ONNX Runtime dynamic int8 quantization of every MatMul weight, the head included.

    The graph is read from `source` (default: `out`) and written to `out`. `any_cpu`: weights
    that ONNX Runtime's `MatMulInteger` runs without overflow on CPUs without VNNI too (below)."""
    model = untie_head(_load(source or out))
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        _save(model, Path(tmp))
        del model  # the quantizer loads the graph again from the file
        _quantize_dynamic(Path(tmp), out, any_cpu=any_cpu)


def quantize_int4(
    out: Path, config: Int4Config | None = None, *, source: Path | None = None
) -> None:
    """4-bit blockwise `MatMulNBits` for the layers; the head at `config.head_bits`.

    The graph is read from `source` (default: `out`) and written to `out`."""
    config = config or Int4Config()
    model = untie_head(_load(source or out))
    head = head_node(model)
    model = _matmul_nbits(model, bits=4, config=config, exclude=[head] if head else [])
    dynamic_head = config.head_bits == 8 and config.head_dynamic
    if head and config.head_bits < 32 and not dynamic_head:
        model = _matmul_nbits(model, bits=config.head_bits, config=config, include=[head])
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        _save(model, Path(tmp))
        del model  # the dynamic quantizer loads the graph again from the file
        if head and dynamic_head:
            _quantize_dynamic(Path(tmp), out, nodes=[head])
        else:
            _replace_graph(out, Path(tmp))


def _quantize_dynamic(
    source: Path, out: Path, *, nodes: list[str] | None = None, any_cpu: bool = False
) -> None:
    """ONNX Runtime's dynamic int8 quantization of `nodes` (default: every MatMul) of the graph
    saved in dir `source`, written to `out`. The quantizer reads and writes files, so callers
    save their graph and drop it first: an int4 graph in memory is as large as its file.

    `any_cpu` keeps weights within 7 bits, each output column with its own scale. On an x86 CPU
    without VNNI, ONNX Runtime's uint8 x int8 kernel adds pairs of products in 16 bits
    (`vpmaddubsw`), which saturate when activations and weights are both large (ONNX Runtime's
    quantization docs); 7-bit weights cannot (255 x 64 x 2 < 32,768), and a scale per column
    wins back the bit. On an AVX2 host without VNNI, ModernBERT int8 fell to cosine 0.83 of
    float32 with 8-bit weights; 7-bit ones with one scale a matrix left a Qwen3-shaped decoder
    at 0.9895 (`tests/engine/embedding/test_exactness.py`, target 0.99)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=out) as tmp:
        quantize_dynamic(
            source / MODEL_FILE,
            Path(tmp) / MODEL_FILE,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes,
            reduce_range=any_cpu,
            per_channel=any_cpu,
            use_external_data_format=_size(source) > _EXTERNAL_DATA_THRESHOLD * 4,
        )
        _replace_graph(out, Path(tmp))


def head_node(model) -> str | None:  # noqa: ANN001 - onnx.ModelProto, imported lazily
    """The name of the MatMul that produces `logits`, if the graph has one."""
    for node in model.graph.node:
        if node.op_type == "MatMul" and "logits" in node.output:
            return node.name
    return None


def untie_head(model):  # noqa: ANN001, ANN201 - onnx.ModelProto
    """Give the LM head MatMul its own initializer when it reads a transposed tied embedding."""
    from onnx import numpy_helper

    name = head_node(model)
    if name is None:
        return model
    nodes = {n.name: n for n in model.graph.node}
    head = nodes[name]
    weight = head.input[1]
    inits = {i.name: i for i in model.graph.initializer}
    if weight in inits:
        return model
    producer = next((n for n in model.graph.node if weight in n.output), None)
    if producer is None or producer.op_type != "Transpose" or producer.input[0] not in inits:
        return model
    source = numpy_helper.to_array(inits[producer.input[0]], base_dir="")
    head_weight = np.ascontiguousarray(source.T)
    head.input[1] = "lm_head.weight.untied"
    model.graph.initializer.append(numpy_helper.from_array(head_weight, head.input[1]))
    if not any(weight in n.input for n in model.graph.node):
        model.graph.node.remove(producer)
    logging.getLogger(__name__).info("untied the LM head from the embedding (%s)", weight)
    return model


def _matmul_nbits(model, *, bits: int, config: Int4Config, exclude=(), include=()):  # noqa: ANN001, ANN201
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    algo = DefaultWeightOnlyQuantConfig(
        block_size=config.block_size,
        is_symmetric=config.symmetric,
        accuracy_level=config.accuracy_level,
        bits=bits,
    )
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=config.block_size,
        is_symmetric=config.symmetric,
        accuracy_level=config.accuracy_level,
        nodes_to_exclude=list(exclude),
        nodes_to_include=list(include) or None,
        algo_config=algo,
    )
    # The quantizer logs a line per node at INFO on the root logger's handlers.
    previous = logging.getLogger("onnxruntime.quantization").level
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        logging.getLogger("onnxruntime.quantization").setLevel(previous)
    return quantizer.model.model


def _load(out: Path):  # noqa: ANN202
    import onnx

    return onnx.load(str(out / MODEL_FILE), load_external_data=True)


def _save(model, directory: Path) -> None:  # noqa: ANN001
    import onnx

    external = model.ByteSize() > _EXTERNAL_DATA_THRESHOLD if _fits_proto(model) else True
    onnx.save_model(
        model,
        str(directory / MODEL_FILE),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
    )


def _fits_proto(model) -> bool:  # noqa: ANN001
    try:
        model.ByteSize()
    except Exception:  # noqa: BLE001 - protobuf raises EncodeError or ValueError past 2 GB
        return False
    return True


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def _replace_graph(out: Path, new: Path) -> None:
    """Swap the export's model.onnx (+ data) for the files in `new`."""
    for path in out.iterdir():
        if path.is_file() and path.name.startswith(MODEL_FILE):
            path.unlink()
    for path in new.iterdir():
        if path.is_file():
            shutil.move(str(path), out / path.name)
