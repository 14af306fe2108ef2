"""A worker of `bench/compare.py`: our engine, measured directly, in a process of its own.

    .venv/bin/python bench/compare_ours.py EXPORT_DIR [--bare] [--no-drafts]

Loads one export with `LocalEngine` (default limits and graph cache, like the server) and answers
one JSON command per stdin line with one `@@`-prefixed JSON line on stdout. Each engine lives in its
own process so its peak RSS is its own, and so the comparison can interleave peers round by round
without loading them again. With `--bare` the worker holds no engine but the export's graph as
exported, and runs the bare ONNX Runtime loop on it (the floor of what any generation loop on
that graph can do); the measurements themselves are `bench/engine.py`'s, reused.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.local_engine import LocalEngine  # noqa: E402
from api.engine.model.causal_lm import OnnxCausalLM  # noqa: E402
from api.engine.model.session_cache import default_cache_dir  # noqa: E402
from api.engine.ops.library import preferred_library  # noqa: E402
from api.engine.runtime.scheduler import SchedulerLimits  # noqa: E402
from bench.engine import (  # noqa: E402
    bare_loop,
    engine_streams,
    plain_model,
    prompt,
    ttft_with_running,
)


async def idle(engine: LocalEngine) -> None:
    """Until aborted streams have left the batch, so the next measurement starts alone."""
    while any(engine.scheduler.counts()):
        await asyncio.sleep(0.05)


async def handle(engine: LocalEngine, command: dict[str, Any]) -> dict[str, Any]:
    """One measurement; see bench/compare.py for what each figure means."""
    op = command["op"]
    if op == "streams":
        drafts = _drafts(engine)
        per, agg, ttft = await engine_streams(
            engine, command["streams"], command["tokens"], command["prompt"]
        )
        proposed, accepted = (b - a for a, b in zip(drafts, _drafts(engine), strict=True))
        # Prompt-lookup drafts (on by default where they pay): what a speed owes to them.
        return {"per": per, "agg": agg, "ttft": ttft, "drafted": proposed, "accepted": accepted}
    if op == "ttft":
        ttft = await ttft_with_running(engine, command["running"], command["prompt"])
        await idle(engine)
        return {"ttft": ttft}
    raise ValueError(f"unknown op {op!r}")


def _drafts(engine: LocalEngine) -> tuple[int, int]:
    """Draft tokens the engine has proposed and had accepted so far (0, 0 without drafting)."""
    speculator = getattr(engine.scheduler, "speculator", None)
    if speculator is None:
        return 0, 0
    return int(speculator.proposed), int(speculator.accepted)


def handle_bare(model: OnnxCausalLM, command: dict[str, Any]) -> dict[str, Any]:
    op = command["op"]
    if op == "bare":
        _, rate = bare_loop(model, prompt(command["prompt"], 0), command["tokens"])
        return {"per": rate, "agg": rate}
    if op == "bare_ttft":
        return {"ttft": bare_loop(model, prompt(command["prompt"], 99), 1)[0]}
    raise ValueError(f"unknown op {op!r}")


async def serve(path: Path, *, bare: bool, drafts: bool = True) -> None:
    # Default limits, the default graph cache and int4 kernel, as the server's; `drafts` False
    # turns prompt-lookup drafting off (ENGINE_SPECULATIVE_TOKENS=0 on the server).
    cache = default_cache_dir()
    kernel = preferred_library()
    limits = None if drafts else SchedulerLimits(speculative_tokens=0)
    engine = (
        None
        if bare
        else LocalEngine("bench", path, cache_dir=cache, ops_library=kernel, limits=limits)
    )
    model = plain_model(path, None, cache) if bare else None
    if engine is not None:
        await engine.start()
    print("@@" + json.dumps({"ready": True}), flush=True)
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):
            command = json.loads(line)
            try:
                if model is not None:
                    reply = handle_bare(model, command)
                else:
                    assert engine is not None
                    reply = await handle(engine, command)
            except Exception as exc:  # reported to the orchestrator, which decides
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            print("@@" + json.dumps(reply), flush=True)
    finally:
        if engine is not None:
            await engine.shutdown()


if __name__ == "__main__":
    flags = sys.argv[2:]
    asyncio.run(serve(Path(sys.argv[1]), bare="--bare" in flags, drafts="--no-drafts" not in flags))
