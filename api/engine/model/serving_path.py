"""Which path a loaded model is served on, and why not a faster one.

A deployment that silently lost its optimized path (no `onnx` package, no compiler when the
ops library was to be built, an old CPU) serves a fraction of the speed it was measured at, so
the engine says so: one INFO line per model naming the edits and kernels, a WARNING for every
fallback, and the same facts in `/ready` and in the `tokenshop_engine_path_info` metric.
"""

from __future__ import annotations

import logging
from pathlib import Path

from api.engine.graph.pipeline import OUR_OP_EDITS
from api.engine.ops.library import isa_of
from api.engine.protocol import ServingPath

log = logging.getLogger(__name__)


def describe(
    edits: tuple[str, ...],
    weights: str,
    *,
    can_edit: bool,
    ops_library: Path | None,
    ops_missing: str | None,
    fuse: bool,
    int8_kernel: bool,
) -> ServingPath:
    """The path a graph with `edits` is served on, given what was asked and what was had."""
    fallbacks: list[str] = []
    if not can_edit:
        fallbacks.append("graph served as exported: the onnx package is not installed")
    elif ops_library is None:
        fallbacks.append(f"ONNX Runtime's kernels: {ops_missing or 'our ops are off'}")
    if can_edit and not fuse:
        fallbacks.append("fused attention is off (ENGINE_FUSED_ATTENTION=0)")
    elif can_edit and "fused-attention" not in edits:
        fallbacks.append("fused attention not applied: this graph's attention is not one it covers")
    if ops_library is not None:
        if weights == "int4" and "int4-matmul" not in edits:
            fallbacks.append("int4 projections on ONNX Runtime's kernel: a layout ours lacks")
        if weights == "int8" and int8_kernel and "int8-matmul" not in edits:
            fallbacks.append("int8 projections on ONNX Runtime's kernel: a layout ours lacks")
        if "fused-attention" in edits and "attention" not in edits:
            fallbacks.append("attention on ONNX Runtime's kernel: a shape ours lacks")
    ours = any(edit in OUR_OP_EDITS for edit in edits)
    return ServingPath(
        graph_edits=edits,
        ops="tokenshop" if ours else "onnxruntime",
        isa=isa_of(ops_library) if ours and ops_library is not None else None,
        weights=weights,
        fallbacks=tuple(fallbacks),
    )


def log_path(name: str, path: ServingPath) -> None:
    """The start-up line of one model, and a WARNING per fallback."""
    kernels = f"tokenshop ({path.isa})" if path.ops == "tokenshop" else "ONNX Runtime's"
    log.info(
        "model %s: %s weights; graph edits: %s; kernels: %s",
        name,
        path.weights,
        ", ".join(path.graph_edits) or "none (served as exported)",
        kernels,
    )
    for reason in path.fallbacks:
        log.warning("model %s is not on the optimized path: %s", name, reason)
