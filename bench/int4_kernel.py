"""One int4 projection, ONNX Runtime's `MatMulNBits` against our `Int4MatMul`, by batch rows.

    .venv/bin/python bench/int4_kernel.py [--rows 1,8,64] [--library PATH ...] [--isa default,avx2]
        [--shape llama-3.2-3b] [--cold-mb 512]

The projections are one layer's of `--shape` (bench/engine.py's SHAPES; the engine merges q/k/v
and gate/up into one call each): for the default Qwen2.5-0.5B 896 -> 1152, 896 -> 896,
896 -> 9728 and 4864 -> 896; block 128, accuracy level 4, random weights. Beside each one-row
time, the GB/s it read of weights and scales, to hold against the host's read bandwidth; with
`--cold-mb` each call reads its weights from memory, as a decode step does, not from a cache
that holds them. Each (shape, rows, kernel) is timed in segments that are interleaved round by
round, as the shared 2-core machine drifts by tens of percent over minutes; the table gives the
median segment. Several `--library` builds (variants of csrc/matmul.c) are timed side by side,
and with `--isa default,avx2` the AVX2 path beside the CPU's best (AVX-512 VNNI where it has it).
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
from bench.engine import DEFAULT_SHAPE, SHAPES  # noqa: E402
from tests.engine.graphs import matmul_nbits  # noqa: E402

BLOCK = 128
SEGMENT_SECONDS = 0.2


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(k, n) of each of a layer's projection calls."""
    config = SHAPES[shape]
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    qkv = (heads + 2 * config["num_key_value_heads"]) * head_dim
    intermediate = config["intermediate_size"]
    return {
        "qkv": (hidden, qkv),
        "o": (heads * head_dim, hidden),
        "gate+up": (hidden, 2 * intermediate),
        "down": (intermediate, hidden),
    }


def weight_bytes(k: int, n: int) -> int:
    """What one call reads of B: 4-bit weights and a float32 scale per block."""
    return k * n // 2 + (k // BLOCK) * n * 4


def session(
    k: int, n: int, library: Path | None, threads: int, copies: int = 1
) -> ort.InferenceSession:
    """A graph of `copies` projections of x, each with weights of its own, run one after
    another, as a model's layers are: from the second call on, a copy's weights are in cache
    only if all the copies' fit."""
    nodes, initializers, outputs = [], [], []
    for copy in range(copies):
        node, weights = matmul_nbits(k, n, BLOCK, seed=k * n + copy)
        for tensor in weights:
            tensor.name = f"{tensor.name}_{copy}"
        node.input[1:] = [f"{name}_{copy}" for name in node.input[1:]]
        node.output[0] = f"Y_{copy}"
        node.name = f"projection_{copy}"
        nodes.append(node)
        initializers += weights
        outputs.append(helper.make_tensor_value_info(f"Y_{copy}", TensorProto.FLOAT, ["rows", n]))
    graph = helper.make_graph(
        nodes,
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        outputs,
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


def segment(run: ort.InferenceSession, copies: int, feed: dict[str, np.ndarray]) -> float:
    """Mean microseconds per projection over about `SEGMENT_SECONDS`."""
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < SEGMENT_SECONDS:
        run.run(None, feed)
        calls += 1
    return elapsed / calls / copies * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16,64,512")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=DEFAULT_SHAPE)
    parser.add_argument("--library", type=Path, nargs="*", default=[default_library()])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--cold-mb",
        type=int,
        default=0,
        help="run this many MB of copies of each projection, each with weights of its own, one"
        " after another, so that each reads its weights from memory as decoding does (default"
        " 0: one copy, which the caches hold once it fits)",
    )
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
    shapes = projections(args.shape)
    isas = [i for i in args.isa.split(",") if i]
    kernels: dict[str, tuple[Path | None, str]] = {"ORT MatMulNBits": (None, "default")}
    kernels |= {
        f"ours ({p.name}{'' if isa == 'default' else ', ' + isa})": (p, isa)
        for p in args.library
        for isa in isas
    }
    rows = [int(r) for r in args.rows.split(",")]
    sessions: dict[tuple[str, str], tuple[ort.InferenceSession, int]] = {}
    for name, (library, isa) in kernels.items():
        # the op picks its path when a session makes it (csrc/int4_matmul.c)
        os.environ["TOKENSHOP_INT4_ISA"] = isa
        for shape, (k, n) in shapes.items():
            copies = max(1, -(-(args.cold_mb << 20) // weight_bytes(k, n)))
            sessions[(shape, name)] = (session(k, n, library, args.threads, copies), copies)
    os.environ.pop("TOKENSHOP_INT4_ISA")
    rng = np.random.default_rng(0)
    feeds = {
        (s, m): {"x": rng.standard_normal((m, shapes[s][0]), np.float32)}
        for s in shapes
        for m in rows
    }
    times: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(args.rounds):
        for (shape, name), (run, copies) in sessions.items():
            for m in rows:
                times.setdefault((shape, m, name), []).append(
                    segment(run, copies, feeds[(shape, m)])
                )
    print(
        f"\n{args.shape}: us per call, median of {args.rounds} interleaved segments;"
        f" {args.threads} threads; one row's GB/s of weights and scales in brackets"
        + (f"; weights from {args.cold_mb} MB of copies" if args.cold_mb else "")
        + "\n"
    )
    names = list(kernels)
    print("| projection | rows | " + " | ".join(names) + " | ORT / ours |")
    print("|---|---:|" + "---:|" * len(names) + "---:|")
    for shape, (k, n) in shapes.items():
        for m in rows:
            medians = [statistics.median(times[(shape, m, name)]) for name in names]
            cells = " | ".join(
                f"{t:.1f}" + (f" ({weight_bytes(k, n) / t / 1e3:.1f})" if m == 1 else "")
                for t in medians
            )
            print(f"| {shape} | {m} | {cells} | {medians[0] / min(medians[1:]):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
