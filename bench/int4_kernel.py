"""One int4 projection, ONNX Runtime's `MatMulNBits` against our `Int4MatMul`, by batch rows.

    .venv/bin/python bench/int4_kernel.py [--rows 1,8,64] [--library PATH ...] [--isa default,avx2]

The shapes are a Qwen2.5-0.5B layer's (the engine merges q/k/v and gate/up into one call each):
896 -> 1152, 896 -> 896, 896 -> 9728 and 4864 -> 896, block 128, accuracy level 4, random
weights. Each (shape, rows, kernel) is timed in segments that are interleaved round by round, as
the shared 2-core machine drifts by tens of percent over minutes; the table gives the median
segment. Several `--library` builds (variants of csrc/int4_matmul.c) are timed side by side, and
with `--isa default,avx2` the AVX2 path beside the CPU's best (AVX-512 VNNI where it has it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.graph.int4_matmul import use_int4_kernel  # noqa: E402
from api.engine.ops.library import default_library  # noqa: E402
from tests.engine.graphs import matmul_nbits  # noqa: E402

SHAPES = {"qkv": (896, 1152), "o": (896, 896), "gate+up": (896, 9728), "down": (4864, 896)}
BLOCK = 128
SEGMENT_SECONDS = 0.2


def session(k: int, n: int, library: Path | None, threads: int) -> ort.InferenceSession:
    node, initializers = matmul_nbits(k, n, BLOCK, seed=k * n)
    graph = helper.make_graph(
        [node],
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["rows", n])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    if library:
        use_int4_kernel(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if library:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def segment(run: ort.InferenceSession, feed: dict[str, np.ndarray]) -> float:
    """Mean microseconds per call over about `SEGMENT_SECONDS`."""
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < SEGMENT_SECONDS:
        run.run(None, feed)
        calls += 1
    return elapsed / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16,64,512")
    parser.add_argument("--library", type=Path, nargs="*", default=[default_library()])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--isa",
        default="default",
        help="our kernel's paths to time, comma-separated: default (the CPU's best: AMX for 5+"
        " rows where it has it), vnni, avx2",
    )
    args = parser.parse_args()
    missing = [p for p in args.library if not p.is_file()]
    if missing:
        print(f"no library at {missing[0]}: run `python -m api.engine.ops.build`")
        return 1
    isas = [i for i in args.isa.split(",") if i]
    kernels: dict[str, tuple[Path | None, str]] = {"ORT MatMulNBits": (None, "default")}
    kernels |= {
        f"ours ({p.name}{'' if isa == 'default' else ', ' + isa})": (p, isa)
        for p in args.library
        for isa in isas
    }
    rows = [int(r) for r in args.rows.split(",")]
    sessions = {}
    for name, (library, isa) in kernels.items():
        # the op picks its path when a session makes it (csrc/int4_matmul.c)
        os.environ["TOKENSHOP_INT4_ISA"] = isa
        for shape in SHAPES:
            sessions[(shape, name)] = session(*SHAPES[shape], library, args.threads)
    os.environ.pop("TOKENSHOP_INT4_ISA")
    rng = np.random.default_rng(0)
    feeds = {
        (s, m): {"x": rng.standard_normal((m, SHAPES[s][0]), np.float32)}
        for s in SHAPES
        for m in rows
    }
    times: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(args.rounds):
        for (shape, name), run in sessions.items():
            for m in rows:
                times.setdefault((shape, m, name), []).append(segment(run, feeds[(shape, m)]))
    print(f"\nus per call, median of {args.rounds} interleaved segments; {args.threads} threads\n")
    names = list(kernels)
    print("| projection | rows | " + " | ".join(names) + " | ORT / ours |")
    print("|---|---:|" + "---:|" * len(names) + "---:|")
    for shape in SHAPES:
        for m in rows:
            medians = [statistics.median(times[(shape, m, name)]) for name in names]
            cells = " | ".join(f"{t:.1f}" for t in medians)
            print(f"| {shape} | {m} | {cells} | {medians[0] / min(medians[1:]):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
