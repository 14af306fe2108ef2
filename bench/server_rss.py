"""What the API server holds in memory after serving: the same streamed workload against
`tokenshop serve` with the prefix cache at its default budget and with none, one after the
other, so the cache's own cost is the difference.

    .venv/bin/python bench/server_rss.py [--model bench/out/compare/int4] [--rounds 3]

Each round: bursts of 1, 4, 8 and 16 streams of 64 greedy tokens on short unique prompts, three
~500-token prompts alone, then one joining 8 running streams (compare.py's workload, lighter).
Two keys, so two cache scopes. Prints VmRSS and VmHWM after each round; writes
bench/results/<date>-server-rss-<host>.md (never over an earlier run's file).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import socket
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare import head_commit  # noqa: E402
from bench.gateway import results_path  # noqa: E402
from bench.load import local_server  # noqa: E402


def memory_mb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss, hwm = (int(status.split(f"{k}:")[1].split()[0]) // 1024 for k in ("VmRSS", "VmHWM"))
    return rss, hwm


async def workload(port: int, keys: list[str], rounds: int, pid: int) -> list[tuple[int, int]]:
    sent = 0

    async def stream(client: httpx.AsyncClient, words: int, tokens: int) -> None:
        nonlocal sent
        sent += 1
        body = {
            "model": "model",
            "messages": [{"role": "user", "content": f"{sent} " + " ".join(["word"] * words)}],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {keys[sent % len(keys)]}"}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with client.stream("POST", url, json=body, headers=headers) as response:
            response.raise_for_status()
            async for _ in response.aiter_bytes():
                pass

    readings = []
    async with httpx.AsyncClient(timeout=600) as client:
        for _ in range(rounds):
            for streams in (1, 4, 8, 16):
                await asyncio.gather(*(stream(client, 20, 64) for _ in range(streams)))
            for _ in range(3):
                await stream(client, 500, 4)
            running = [stream(client, 20, 64) for _ in range(8)]
            await asyncio.gather(*running, stream(client, 500, 4))
            readings.append(memory_mb(pid))
    return readings


def serve_and_measure(model: Path, rounds: int, cache_mb: str | None) -> list[tuple[int, int]]:
    settings = {} if cache_mb is None else {"ENGINE_PREFIX_CACHE_MB": cache_mb}
    with local_server(
        2, 10**9, models=f"model={model}", settings=settings, ready_within=900
    ) as server:
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        return asyncio.run(workload(port, server.keys, rounds, server.process.pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "bench" / "out" / "compare" / "int4")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    commit = head_commit()[:7]
    lines = [
        f"# API server memory after serving, prefix cache on and off ({dt.date.today()})",
        "",
        f"Commit {commit}; `bench/server_rss.py --model {args.model.name} --rounds {args.rounds}`;"
        f" {socket.gethostname()}, {os.cpu_count()} CPUs. MB after each round (RSS / peak).",
        "",
        "| prefix cache | " + " | ".join(f"round {n + 1}" for n in range(args.rounds)) + " |",
        "|---|" + "---:|" * args.rounds,
    ]
    for label, cache_mb in (("default (256 MB)", None), ("none (0)", "0")):
        readings = serve_and_measure(args.model, args.rounds, cache_mb)
        cells = " | ".join(f"{rss} / {hwm}" for rss, hwm in readings)
        lines.append(f"| {label} | {cells} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    out = results_path("server-rss")
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
