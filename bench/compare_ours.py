"""A worker of `bench/compare.py`: our engine, measured directly, in a process of its own.

    .venv/bin/python bench/compare_ours.py EXPORT_DIR

Loads one export with `LocalEngine` (default limits, like the server) and answers one JSON
command per stdin line with one `@@`-prefixed JSON line on stdout. Each engine lives in its own
process so its peak RSS is its own, and so the comparison can interleave peers round by round
without loading them again. The bare ONNX Runtime loop runs on this engine's session (the floor
of what any generation loop on this graph can do); the measurements themselves are
`bench/engine.py`'s, reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.engine import LocalEngine  # noqa: E402
from api.engine.protocol import GenerationRequest, SamplingParams  # noqa: E402
from bench.engine import bare_loop, engine_streams, prompt  # noqa: E402


async def ttft_while_running(
    engine: LocalEngine, running: int, prompt_len: int, short_len: int
) -> float:
    """Time to first token of a `prompt_len` prompt joining `running` streams mid-decode.

    The running streams are started first and each must have produced a token (they are
    decoding, not prefilling) before the probe is submitted; they are aborted afterwards and the
    engine is left idle."""
    decoding = [asyncio.Event() for _ in range(running)]
    stop = asyncio.Event()

    async def background(i: int) -> None:
        request = GenerationRequest(
            f"bg{i}-{time.monotonic_ns()}",
            prompt(short_len, seed=100 + i),
            SamplingParams(max_tokens=100_000, temperature=0),
        )
        stream = engine.generate(request)
        try:
            async for _output in stream:
                decoding[i].set()  # its first token exists: it is decoding now
                if stop.is_set():
                    break
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(background(i)) for i in range(running)]
    for event in decoding:
        await event.wait()
    request = GenerationRequest(
        f"probe-{time.monotonic_ns()}",
        prompt(prompt_len, seed=99),
        SamplingParams(max_tokens=1, temperature=0),
    )
    started = time.perf_counter()
    async for _output in engine.generate(request):
        break
    ttft = time.perf_counter() - started
    stop.set()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    while engine.stats().active_sequences or engine.stats().queued_sequences:
        await asyncio.sleep(0.05)
    return ttft


async def handle(engine: LocalEngine, command: dict[str, Any]) -> dict[str, Any]:
    """One measurement; see bench/compare.py for what each figure means."""
    op = command["op"]
    if op == "streams":
        per, agg, ttft = await engine_streams(
            engine, command["streams"], command["tokens"], command["prompt"]
        )
        return {"per": per, "agg": agg, "ttft": ttft}
    if op == "ttft":
        if command.get("running"):
            ttft = await ttft_while_running(
                engine, command["running"], command["prompt"], command["short"]
            )
            return {"ttft": ttft}
        return {"ttft": (await engine_streams(engine, 1, 1, command["prompt"]))[2]}
    if op == "bare":
        _, rate = bare_loop(engine, prompt(command["prompt"], 0), command["tokens"])
        return {"per": rate, "agg": rate}
    if op == "bare_ttft":
        return {"ttft": bare_loop(engine, prompt(command["prompt"], 99), 1)[0]}
    raise ValueError(f"unknown op {op!r}")


async def serve(path: Path) -> None:
    engine = LocalEngine("bench", path)  # default limits and threads, as the server's
    await engine.start()
    print("@@" + json.dumps({"ready": True}), flush=True)
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):
            try:
                reply = await handle(engine, json.loads(line))
            except Exception as exc:  # reported to the orchestrator, which decides
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            print("@@" + json.dumps(reply), flush=True)
    finally:
        await engine.shutdown()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
