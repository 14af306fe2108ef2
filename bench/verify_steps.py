"""What a speculative step costs by its rows and width, and what the engine then chooses.

    .venv/bin/python bench/verify_steps.py [--model DIR] [--repeats 2] [--host NAME]

On bench/compare.py's int4 export of the random Qwen2.5-0.5B-shaped model (unless `--model`),
the engine as the server builds it (our ops, up to 4 drafts): bursts of 1, 4, 8 and 16 greedy
streams of 64 tokens on prompts that repeat a 16-token phrase, so every row has drafts. First
each step is forced to one width (1 = a plain decode step, up to 5 = 4 drafts a row) and timed:
median milliseconds a step by rows and width. Then the engine's own choice (`speculation.py`,
which fits a step's cost per row count) for 1 stream, 8, 16 and 1 again: each stream's tokens/s and
the drafts accepted, so a lone stream after a busy spell shows whether it still drafts. Writes
bench/results/<date>-verify-steps-<host>-<commit>.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.local_engine import LocalEngine  # noqa: E402
from api.engine.protocol import GenerationRequest, SamplingParams  # noqa: E402
from api.engine.runtime.speculation import Drafting, Speculator  # noqa: E402
from bench.compare import WORK, ensure_export, head_commit  # noqa: E402
from bench.engine import build_source, prompt  # noqa: E402
from bench.speculative import engine_with  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ROWS = (1, 4, 8, 16)
WIDTHS = (1, 2, 3, 4, 5)
TOKENS = 64


class TimedSpeculator(Speculator):
    """The engine's speculator, its steps timed by (rows, width); `width` forces one."""

    def __init__(self, max_drafts: int) -> None:
        super().__init__(max_drafts)
        self.width: int | None = None
        self.seconds: dict[tuple[int, int], list[float]] = collections.defaultdict(list)

    def _best_width(self, rows: list[Drafting], proposals: list[list[int]]) -> int:
        if self.width is None:
            return super()._best_width(rows, proposals)
        return self.width - 1

    def record(
        self,
        rows: Sequence[Drafting],
        drafts: Sequence[Sequence[int]],
        kept: Sequence[int],
        seconds: float,
    ) -> None:
        width = max((len(d) for d in drafts), default=0) + 1
        self.seconds[len(rows), width].append(seconds)
        super().record(rows, drafts, kept, seconds)


async def burst(engine: LocalEngine, streams: int) -> tuple[float, int, int]:
    """(median tokens/s of a stream, drafts proposed, accepted) of `streams` at once."""
    speculator = engine.scheduler.speculator
    assert speculator is not None
    before = speculator.proposed, speculator.accepted

    async def one(i: int) -> float:
        params = SamplingParams(max_tokens=TOKENS, temperature=0)
        ids = prompt(16, seed=3 + i) * 4
        request = GenerationRequest(f"s{time.monotonic_ns()}-{i}", ids, params)
        first, count = 0.0, 0
        async for delta in engine.generate(request):
            if not count:
                first = time.perf_counter()
            count += len(delta.token_ids)
        return (count - 1) / (time.perf_counter() - first)

    rates = await asyncio.gather(*(one(i) for i in range(streams)))
    return (
        statistics.median(rates),
        speculator.proposed - before[0],
        speculator.accepted - before[1],
    )


async def measure(path: Path, repeats: int) -> tuple[dict, list[tuple[int, float, int, int]]]:
    engine = engine_with(path, 4, None)
    await engine.start()
    speculator = TimedSpeculator(4)
    engine.scheduler.speculator = speculator
    await burst(engine, 1)  # warm-up
    costs: dict[tuple[int, int], float] = {}
    for width in WIDTHS:
        speculator.width = width
        for rows in ROWS:
            speculator.seconds.clear()
            for _ in range(repeats):
                await burst(engine, rows)
            timed = speculator.seconds.get((rows, width), [])
            if len(timed) >= 5:
                costs[rows, width] = statistics.median(timed) * 1000
            print(f"rows {rows} width {width}: {costs.get((rows, width))} ms", flush=True)
    speculator.width = None
    chosen = []
    for streams in (1, 8, 16, 1):
        rate, proposed, accepted = await burst(engine, streams)
        chosen.append((streams, rate, proposed, accepted))
        print(f"{streams} streams: {rate:.1f} tok/s a stream, {accepted}/{proposed}", flush=True)
    await engine.shutdown()
    return costs, chosen


def report(path: Path, host: str, costs: dict, chosen: list) -> str:
    lines = [
        f"# A speculative step's cost by rows and width ({datetime.date.today()})",
        "",
        f"Commit {head_commit()[:7]}; `bench/verify_steps.py`; host {host}. Model "
        f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`, our ops, greedy "
        f"streams of {TOKENS} tokens on prompts repeating a 16-token phrase.",
        "",
        "Median ms a step, each step forced to one width (1: plain decode; 5: 4 drafts a row):",
        "",
        "| rows | " + " | ".join(f"width {w}" for w in WIDTHS) + " |",
        "|---:|" + "---:|" * len(WIDTHS),
    ]
    for rows in ROWS:
        cells = [f"{costs[rows, w]:.1f}" if (rows, w) in costs else "-" for w in WIDTHS]
        lines.append(f"| {rows} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The engine's own choice, bursts in this order:",
        "",
        "| streams | tok/s a stream (median) | drafts accepted |",
        "|---:|---:|---:|",
    ]
    for streams, rate, proposed, accepted in chosen:
        lines.append(f"| {streams} | {rate:.1f} | {accepted} of {proposed} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="an export dir (default: compare's int4)")
    parser.add_argument("--repeats", type=int, default=2, help="bursts per rows and width")
    parser.add_argument("--host", default="host", help="the host's name in the results file")
    args = parser.parse_args()
    path = args.model or ensure_export(build_source(WORK / "src"), "int4", rebuild=False)
    costs, chosen = asyncio.run(measure(path, args.repeats))
    text = report(path, args.host, costs, chosen)
    stem = f"{datetime.date.today()}-verify-steps-{args.host}-{head_commit()[:7]}"
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
