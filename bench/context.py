"""Decode step time as the context grows, for 1 and 8 sequences, on the engine's fused graph.

    .venv/bin/python bench/context.py [--model DIR ...] [--contexts 32,512,2000] [--rounds 8]

Weights cost the same at every context; attention reads every cached key and value, so its share
of a step grows with the context. This times the graph the engine serves (fused attention over
one preallocated KV buffer, bound as `kv_slots.SlotBatch` binds it) with every row at the same
length, so nothing but the context changes between rows of the table. Segments of 30 steps of
each (context, batch) pair are interleaved round by round (the shared 2-core machine drifts), and
the table gives the median step. The default model is bench/compare.py's int4 export; several
`--model` dirs are interleaved the same way, to compare exports on one machine in one run (the
block sizes of `bench/quantize.py`'s variants, under bench/out/variant-*, say), and so are int4
projections run by ONNX Runtime's `MatMulNBits` and by our op (`--int4-kernel both`), or by
several builds of our op library (`--library A.so B.so`: a kernel change against the build
before it, in one process; both must take the graph the current edits make), and attention run
by ONNX Runtime's `GroupQueryAttention` and by our op (`--attention both`), and our op over a
float32 and a float16 KV cache (`--kv-cache both`, the engine's `ENGINE_KV_CACHE_DTYPE`).

`--profile DIR` (one batch and one context) has ONNX Runtime time every op of those steps and
prints where a step goes: the ops' time by type, each projection's rate (its weights' bytes
over its time: against the host's read bandwidth, how near it comes to the memory's speed), and
the step's time outside any op. The profiler adds a few microseconds to every op, so steps run
slower than without it.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.graph.fused_attention import SEQLENS, TOTAL  # noqa: E402
from api.engine.model.causal_lm import OnnxCausalLM  # noqa: E402
from api.engine.model.session_cache import default_cache_dir  # noqa: E402
from api.engine.model.spec import LOGITS_POSITIONS  # noqa: E402
from api.engine.ops.library import default_library, preferred_library  # noqa: E402
from bench.engine import OUT  # noqa: E402

STEPS = 30
ATTENTION = {  # --attention: label suffix -> whether our attention op runs it
    "ours": {"": True},
    "ort": {" (ORT attention)": False},
    "both": {" (ORT attention)": False, " (our attention)": True},
}
KV_CACHE = {  # --kv-cache: label suffix -> whether the cache is float16
    "float32": {"": False},
    "float16": {" (float16 cache)": True},
    "both": {" (float32 cache)": False, " (float16 cache)": True},
}


class Decoder:
    """`rows` sequences of `context` tokens (zeros: the values do not change the time)."""

    def __init__(self, model: OnnxCausalLM, rows: int, context: int) -> None:
        spec = model.spec
        self.model, self.context = model, context
        capacity = 1 << (context + STEPS + 8).bit_length()
        shape = [rows, spec.kv_heads, capacity, spec.head_dim]
        self.buffers = [np.zeros(shape, spec.kv_dtype) for _ in spec.past_names]
        self.binding = model.session.io_binding()
        self.binding.bind_output("logits")  # first: outputs come back in binding order
        if model.logits_positions:
            self.binding.bind_cpu_input(LOGITS_POSITIONS, np.ones(1, np.int64))
        for past, present, buffer in zip(
            spec.past_names, spec.present_names, self.buffers, strict=True
        ):
            self.binding.bind_input(past, "cpu", 0, spec.kv_dtype, shape, buffer.ctypes.data)
            self.binding.bind_output(present, "cpu", 0, spec.kv_dtype, shape, buffer.ctypes.data)
        self.lengths = np.full(rows, context, np.int64)
        self.ids = np.full((rows, 1), 100, np.int64)

    def segment(self) -> float:
        """Median seconds of one step over `STEPS` steps, from the same context each time."""
        self.lengths[:] = self.context
        times = []
        for _ in range(STEPS):
            started = time.perf_counter()
            self.binding.bind_output("logits")
            self.binding.bind_cpu_input("input_ids", self.ids)
            if self.model.spec.has_position_ids:  # a lean export's (bench/lean_export.py)
                self.binding.bind_cpu_input("position_ids", self.lengths[:, None].copy())
            self.binding.bind_cpu_input(SEQLENS, self.lengths.astype(np.int32))
            self.binding.bind_cpu_input(TOTAL, np.array(self.lengths.max() + 1, np.int32))
            self.model.session.run_with_iobinding(self.binding)
            logits = self.binding.get_outputs()[0].numpy()
            self.ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            self.lengths += 1
            times.append(time.perf_counter() - started)
        return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, nargs="+", default=[OUT / "compare" / "int4"])
    parser.add_argument("--contexts", default="32,512,2000")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--int4-kernel",
        choices=("default", "ort", "ours", "both"),
        default="default",
        help="who runs int4 projections (default: as the server would here)",
    )
    parser.add_argument(
        "--attention",
        choices=("ours", "ort", "both"),
        default="ours",
        help="who runs attention when our op library is loaded (default: ours, as served)",
    )
    parser.add_argument(
        "--kv-cache",
        choices=tuple(KV_CACHE),
        default="float32",
        help="the KV cache's type where our attention op runs (default: float32; the server's "
        "`auto` takes float16 for int8 and int4 exports)",
    )
    parser.add_argument(
        "--library",
        type=Path,
        nargs="+",
        help="builds of our op library to interleave (instead of --int4-kernel)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="a dir for ONNX Runtime's profiles; prints where a step goes (one batch, one context)",
    )
    args = parser.parse_args()
    if args.profile and ("," in args.batches or "," in args.contexts):
        print("--profile takes one batch and one context: pass --batches B --contexts C")
        return 1
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    kernels: dict[str, Path | None] | None
    if args.library:
        kernels = {f" ({path})": path for path in args.library}
    else:
        kernels = _kernels(args.int4_kernel)
    if kernels is None:
        print("the int4 kernel is not built: run `python -m api.engine.ops.build`")
        return 1
    models: dict[str, OnnxCausalLM] = {}
    for path in args.model:
        if not (path / "model.onnx").is_file():
            print(f"no export at {path}: run bench/compare.py first, or pass --model")
            return 1
        for (name, kernel), (attention, ours), (cache, half) in itertools.product(
            kernels.items(), ATTENTION[args.attention].items(), KV_CACHE[args.kv_cache].items()
        ):
            label = f"{path.name}{name}{attention + cache if kernel is not None else ''}"
            if half and (not ours or kernel is None):  # ONNX Runtime's attention: float32 only
                continue
            models[label] = OnnxCausalLM(
                path,
                cache_dir=default_cache_dir(),
                ops_library=kernel,
                attention_kernel=ours,
                kv_cache_dtype="float16" if half else "float32",
                profile=args.profile / label.replace("/", "-") if args.profile else None,
            )
            if not models[label].spec.shared_kv:
                print(f"{path}: the engine does not serve this graph with fused attention")
                return 1
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    decoders = {
        (path, b, c): Decoder(model, b, c)
        for path, model in models.items()
        for b in batches
        for c in contexts
    }
    times: dict[tuple[str, int, int], list[float]] = {key: [] for key in decoders}
    for decoder in decoders.values():
        decoder.segment()  # warm-up
    for _ in range(args.rounds):
        for key, decoder in decoders.items():
            times[key].append(decoder.segment())
    print(f"\nmedian of {args.rounds} segments of {STEPS} steps\n")
    print("| model | sequences | context | step ms | tokens/s | step vs shortest context |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in models:
        for batch in batches:
            base = statistics.median(times[(path, batch, contexts[0])])
            for context in contexts:
                step = statistics.median(times[(path, batch, context)])
                row = f"| {path} | {batch} | {context} | {step * 1000:.2f} "
                print(row + f"| {batch / step:.1f} | {step / base:.2f}x |")
    for label, model in models.items() if args.profile else ():
        print(f"\n{label}: {where_a_step_goes(Path(model.session.end_profiling()))}")
    return 0


def where_a_step_goes(profile: Path) -> str:
    """Markdown tables of an ONNX Runtime profile's runs (the warm-up's left out): op time by
    type, and each projection's by its weights' size, per step."""
    events = json.loads(profile.read_text())
    runs = [e for e in events if e.get("name") == "model_run"][STEPS:]
    first = runs[0]["ts"]
    ops = [
        e
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first
    ]
    steps = len(runs)
    by_type: collections.Counter[str] = collections.Counter()
    by_weights: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for op in ops:
        kind, weights = op["args"]["op_name"], int(op["args"].get("parameter_size", 0))
        by_type[kind] += op["dur"]
        if "MatMul" in kind and weights >= 1 << 16:  # others read a part of theirs
            by_weights[(kind, weights)].append(op["dur"])
    total = sum(r["dur"] for r in runs) / steps
    outside = total - sum(by_type.values()) / steps
    lines = [
        f"{steps} steps of {total / 1e3:.2f} ms, {outside / 1e3:.2f} ms of each outside any op",
        "",
        "| op | ms a step | share |",
        "|---|---:|---:|",
    ]
    for kind, us in by_type.most_common():
        lines.append(f"| {kind} | {us / steps / 1e3:.3f} | {us / steps / total:.1%} |")
    lines += [
        "",
        "| op | weights MB | calls a step | median us | GB/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for (kind, weights), durations in sorted(by_weights.items(), key=lambda kv: -sum(kv[1])):
        median = statistics.median(durations)
        lines.append(
            f"| {kind} | {weights / 1e6:.2f} | {len(durations) // steps} | {median:.0f}"
            f" | {weights / median / 1e3:.1f} |"
        )
    return "\n".join(lines)


def _kernels(choice: str) -> dict[str, Path | None] | None:
    """Label suffix -> int4 kernel library per variant; None when ours is asked for but absent."""
    if choice == "default":
        return {"": preferred_library()}
    built = default_library()
    if choice != "ort" and not built.is_file():
        return None
    variants: dict[str, dict[str, Path | None]] = {
        "ort": {" (ORT int4)": None},
        "ours": {" (our int4)": built},
    }
    if choice == "both":
        return variants["ort"] | variants["ours"]
    return variants[choice]


if __name__ == "__main__":
    sys.exit(main())
