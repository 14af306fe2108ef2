"""Prompt-lookup speculative decoding: one stream's speed against its drafts' acceptance.

    .venv/bin/python bench/speculative.py [--model DIR] [--tokens 128] [--rounds 3]

On the int4 export of bench/compare.py's random Qwen2.5-0.5B-shaped model (built as that
script builds it, unless `--model` names another export), one greedy or seeded stream at a time
on the engine as the server builds it here (our ops), with drafts (`ENGINE_SPECULATIVE_TOKENS`,
4 and 8) and without (0), variants interleaved round by round, medians. Workloads:

- `greedy, quoting`: the greedy continuation of a prompt that says one 16-token phrase four
  times: the model goes on repeating it, as a continuation that quotes or edits its prompt
  does (the issue's high-acceptance workload);
- `greedy, own text`: the prompt is the model's own greedy text; a random-weight model's
  greedy text is runs and loops of tokens, which its continuation keeps to;
- `greedy, random`: the greedy continuation of random tokens: loops of its own, found late;
- `sampled T`: seeded sampling at temperature T from random tokens, which repeats nothing:
  no draft is accepted, and the engine's estimate should turn drafting off.

Each row gives decode tokens/s (tokens 2..N over the time since token 1) with and without drafts,
their ratio, the share of drafts accepted and the tokens each step gave, and whether the text is
the same token for token (it must be: greedy, and seeded sampling draws one uniform a token).
The floor is bandwidth / weight bytes a step reads (bench/compare.py's readings), the bound of
one stream decoding a token per step. Writes bench/results/<date>-speculative-<host>-<commit>.md
and a plot of speed against acceptance beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.local_engine import LocalEngine  # noqa: E402
from api.engine.ops.library import preferred_library  # noqa: E402
from api.engine.protocol import GenerationRequest, SamplingParams  # noqa: E402
from api.engine.runtime.scheduler import SchedulerLimits  # noqa: E402
from bench.compare import (  # noqa: E402
    WORK,
    bytes_per_token,
    ensure_export,
    head_commit,
    read_bandwidth,
)
from bench.engine import build_source, prompt  # noqa: E402
from bench.host import describe_cpu  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# name -> (prompt, temperature); "own text" is filled in from a plain greedy run
WORKLOADS: dict[str, tuple[list[int], float]] = {
    "greedy, quoting": (prompt(16, seed=3) * 4, 0.0),
    "greedy, own text": ([], 0.0),
    "greedy, random": (prompt(64, seed=7), 0.0),
    "sampled 0.3": (prompt(64, seed=7), 0.3),
    "sampled 0.7": (prompt(64, seed=7), 0.7),
    "sampled 1.0": (prompt(64, seed=7), 1.0),
}


def engine_with(path: Path, drafts: int, threads: int | None) -> LocalEngine:
    return LocalEngine(
        f"spec{drafts}",
        path,
        limits=SchedulerLimits(max_active_sequences=16, speculative_tokens=drafts),
        threads=threads,
        ops_library=preferred_library(),
        kv_cache_dtype="auto",
    )


async def one_stream(
    engine: LocalEngine, ids: list[int], tokens: int, temperature: float
) -> tuple[float, list[int], int, int, int]:
    """(decode tok/s, tokens, drafts proposed, accepted, steps) of one request."""
    speculator = engine.scheduler.speculator
    before = (speculator.proposed, speculator.accepted) if speculator else (0, 0)
    steps_before = engine.scheduler.steps
    params = SamplingParams(max_tokens=tokens, temperature=temperature, seed=1234)
    request = GenerationRequest(f"r{time.monotonic_ns()}", ids, params)
    out: list[int] = []
    first = 0.0
    async for delta in engine.generate(request):
        if not out:
            first = time.perf_counter()
        out.extend(delta.token_ids)
    rate = (len(out) - 1) / (time.perf_counter() - first)
    after = (speculator.proposed, speculator.accepted) if speculator else (0, 0)
    steps = engine.scheduler.steps - steps_before
    return rate, out, after[0] - before[0], after[1] - before[1], steps


async def measure(args: argparse.Namespace, path: Path) -> dict[str, dict[int, dict]]:
    engines = {d: engine_with(path, d, args.threads) for d in args.drafts}
    for engine in engines.values():
        await engine.start()
    _, own, *_ = await one_stream(engines[0], WORKLOADS["greedy, random"][0], 64, 0.0)
    WORKLOADS["greedy, own text"] = (own, 0.0)
    results: dict[str, dict[int, dict]] = {
        w: {
            d: {"rates": [], "proposed": 0, "accepted": 0, "steps": 0, "tokens": None}
            for d in engines
        }
        for w in WORKLOADS
    }
    for engine in engines.values():  # warm-up: the graph's first calls, each width
        await one_stream(engine, WORKLOADS["greedy, quoting"][0], 48, 0.0)
    for round_ in range(args.rounds):
        for workload, (ids, temperature) in WORKLOADS.items():
            for drafts, engine in engines.items():
                rate, out, proposed, accepted, steps = await one_stream(
                    engine, ids, args.tokens, temperature
                )
                entry = results[workload][drafts]
                entry["rates"].append(rate)
                entry["proposed"] += proposed
                entry["accepted"] += accepted
                entry["steps"] += steps
                entry["generated"] = entry.get("generated", 0) + len(out)
                if entry["tokens"] is None:
                    entry["tokens"] = out
                entry["same"] = entry.get("same", True) and out == entry["tokens"]
                print(
                    f"round {round_ + 1} {workload} drafts={drafts}: {rate:.1f} tok/s, "
                    f"accepted {accepted}/{proposed}",
                    flush=True,
                )
    for engine in engines.values():
        await engine.shutdown()
    return results


def plot(results: dict[str, dict[int, dict]], floor: float, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for drafts in sorted({d for w in results.values() for d in w if d}):
        points = []
        for workload in results.values():
            base = statistics.median(workload[0]["rates"])
            entry = workload[drafts]
            share = entry["accepted"] / entry["proposed"] if entry["proposed"] else 0.0
            points.append((share, statistics.median(entry["rates"]) / base))
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=f"{drafts} drafts")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("share of drafts accepted")
    ax.set_ylabel("decode speed / without drafts")
    ax.set_title(f"Prompt lookup, one stream (floor without drafts: {floor:.0f} tok/s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(file, dpi=120)


def report(
    args: argparse.Namespace,
    path: Path,
    results: dict,
    bandwidth: tuple[float, str],
    step_bytes: int,
    picture: Path,
) -> str:
    floor = bandwidth[0] * 1e9 / step_bytes
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"# Prompt-lookup speculative decoding, one stream ({datetime.date.today()})",
        "",
        f"Commit {head_commit()[:7]}; `bench/speculative.py --tokens {args.tokens} --rounds "
        f"{args.rounds}`; {describe_cpu()}, "
        f"load average at the end {load}.",
        f"Model: `{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` "
        f"({'int4, random weights, Qwen2.5-0.5B' if args.model is None else 'as given'}), our "
        "ops; the engine as the server builds it, one stream at a time, variants interleaved "
        "per round, medians.",
        f"Bandwidth {bandwidth[0]:.1f} GB/s ({bandwidth[1]}); a step reads "
        f"{step_bytes / 1e6:.0f} MB of weights: floor {floor:.1f} tok/s for one token a step.",
        "",
        "| workload | drafts | tok/s | / without | / floor | accepted | tokens a step | same |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for workload, by_drafts in results.items():
        base = statistics.median(by_drafts[0]["rates"])
        for drafts, entry in by_drafts.items():
            rate = statistics.median(entry["rates"])
            share = f"{entry['accepted'] / entry['proposed']:.0%}" if entry["proposed"] else "-"
            per_step = (entry["generated"] - args.rounds) / max(entry["steps"], 1)
            same = "yes" if entry["tokens"] == by_drafts[0]["tokens"] and entry["same"] else "NO"
            lines.append(
                f"| {workload} | {drafts} | {rate:.1f} | {rate / base:.2f} | {rate / floor:.2f} "
                f"| {share} | {per_step:.2f} | {same} |"
            )
    lines += ["", f"![speed against acceptance]({picture.name})", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="an export dir (default: compare's int4)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drafts", default="0,4,8", help="ENGINE_SPECULATIVE_TOKENS variants")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--host", default="host", help="the host's name in the results file")
    args = parser.parse_args()
    args.drafts = sorted({0, *(int(d) for d in args.drafts.split(","))})
    path = args.model or ensure_export(build_source(WORK / "src"), "int4", rebuild=False)
    WORK.mkdir(parents=True, exist_ok=True)  # where read_bandwidth keeps its reader
    bandwidth = read_bandwidth()
    step_bytes = bytes_per_token(path / "model.onnx")
    results = asyncio.run(measure(args, path))
    bandwidth_after = read_bandwidth()
    bandwidth = (statistics.median([bandwidth[0], bandwidth_after[0]]), bandwidth[1])
    stem = f"{datetime.date.today()}-speculative-{args.host}-{head_commit()[:7]}"
    picture = RESULTS / f"{stem}.png"
    plot(results, bandwidth[0] * 1e9 / step_bytes, picture)
    text = report(args, path, results, bandwidth, step_bytes, picture)
    (RESULTS / f"{stem}.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
