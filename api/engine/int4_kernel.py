"""Our 4-bit matrix multiply (`csrc/int4_matmul.c`) in place of ONNX Runtime's `MatMulNBits`.

ONNX Runtime's kernel pays nearly a full row's time for every extra row of a batch on CPUs
without VNNI: one 896 x 4864 int4 projection, block 128, 2 threads on an AVX2 AMD EPYC, took
~125 us for 1 row and ~540 us for 8 (a decode step of 8 streams). Ours unpacks each weight block
once and multiplies it with every row: ~125 us and ~420 us there (`bench/int4_kernel.py`).

It is a custom op library, built from source at install (`api/engine/int4_build.py`), so it may
be absent: then, or where the CPU has VNNI (ONNX Runtime's kernel has a VNNI path there and ours
does not), or where the node is not one the op covers, the graph keeps `MatMulNBits`.
`use_int4_kernel` edits the graph when it is loaded; the export on disk stays standard.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

log = logging.getLogger(__name__)

DOMAIN = "tokenshop"
OP_TYPE = "Int4MatMul"
LIBRARY_NAME = "libtokenshop_int4.so"
BLOCK_SIZES = (64, 128, 256)  # the kernel's unrolled block loops
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni")


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
    elif _has_vnni():
        reason = "this CPU has VNNI, which ONNX Runtime's kernel uses"
    else:
        log.info("int4 projections run on our kernel (%s)", library)
        return library
    log.info("int4 projections run on ONNX Runtime's MatMulNBits: %s", reason)
    return None


def _has_vnni() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "").split()
    return any(flag in flags for flag in _VNNI_FLAGS)


def register(options: ort.SessionOptions, library: Path) -> None:
    options.register_custom_ops_library(str(library))


def use_int4_kernel(model: onnx.ModelProto) -> int:
    """Turn every `MatMulNBits` node the op covers into an `Int4MatMul`, in place; how many.

    Covered: 4 bits, symmetric (no zero points, so zero point 8), no group index or bias input,
    a block size in `BLOCK_SIZES`. The inputs and attributes are the same, so only the node's
    name and domain change."""
    from onnx import helper

    changed = 0
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and _covered(node):
            node.op_type, node.domain = OP_TYPE, DOMAIN
            changed += 1
    if changed and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return changed


def _covered(node: onnx.NodeProto) -> bool:
    attributes = {a.name: a.i for a in node.attribute}
    return (
        len(node.input) == 3
        and attributes.get("bits", 4) == 4
        and attributes.get("block_size") in BLOCK_SIZES
    )
