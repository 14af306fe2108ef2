"""Streams through Anthropic's Messages API against the same streams through Chat Completions,
on one server and model: aggregate decode tokens/s at 1 and 8 streams, and time to the first
token, interleaved round by round (the arms alternate their order) and reported as medians.
Issue 46 asks for the Messages arm at 0.98 of the chat arm or better.

Both arms are read by the same cheap reader (httptools on raw connections, as `sse_client.py`
does): events that carry only a text delta are not parsed, the rest are. Requests are greedy
(temperature 0) with the same prompt and max_tokens, so both arms decode the same tokens; a
round's rate is its tokens over the time from the first token of its first stream to the
last text delta of its last (settling, which the Messages stream does before its
`message_delta` and the chat stream after its last chunk, is left out of both). On a shared
host the rates swing by tens of percent between rounds, so the server's CPU time a streamed
token (all its threads, /proc) is reported beside them: what the front door itself costs.

    .venv/bin/python bench/messages.py [--tokens 256] [--rounds 7] [--streams 1,8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.load import local_server  # noqa: E402

PROMPT = "Write a long story about a token shop that sells tokens for stars."
SKIP = {"chat": b'"finish_reason":null', "messages": b'"type":"content_block_delta"'}


@dataclass
class Times:
    first: float = 0.0
    last: float = 0.0
    tokens: int = 0
    status: int = 0
    error: bytes = b""


class _Reader(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None], arm: str) -> None:
        self.done, self.arm = done, arm
        self.times = Times()
        self.parser = httptools.HttpResponseParser(self)
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"closed early: {exc}"))

    def on_headers_complete(self) -> None:
        self.times.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.times.status != 200:
            self.times.error += body
            return
        now = time.perf_counter()
        *events, self.pending = (self.pending + body).split(b"\n\n")
        for event in events:
            start = event.find(b"data: {")
            if start == -1:
                continue
            times = self.times
            times.first = times.first or now
            data = event[start + 6 :]
            if SKIP[self.arm] in data:
                times.last = now
                continue
            self._parse(json.loads(data), now)

    def _parse(self, data: dict[str, Any], now: float) -> None:
        if self.arm == "chat":
            if usage := data.get("usage"):
                self.times.tokens = usage["completion_tokens"]
        elif data["type"] == "message_delta":
            self.times.tokens = data["usage"]["output_tokens"]

    def on_message_complete(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def stream(host: str, port: int, key: str, arm: str, tokens: int) -> Times:
    messages = [{"role": "user", "content": PROMPT}]
    body: dict[str, Any] = {
        "model": "demo",
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    if arm == "chat":
        path, auth = "/v1/chat/completions", f"Authorization: Bearer {key}"
        body["stream_options"] = {"include_usage": True}
    else:
        path, auth = "/v1/messages", f"x-api-key: {key}\r\nanthropic-version: 2023-06-01"
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    transport, reader = await loop.create_connection(lambda: _Reader(done, arm), host, port)
    sent = time.perf_counter()
    try:
        transport.write(head.encode() + payload)
        await done
    finally:
        transport.close()
    if reader.times.status != 200:
        raise RuntimeError(f"{arm}: HTTP {reader.times.status}: {reader.times.error!r}")
    reader.times.first -= sent  # time to the first event, from here on
    return reader.times


async def burst(host: str, port: int, keys: list[str], arm: str, n: int, tokens: int) -> dict:
    started = time.perf_counter()
    results = await asyncio.gather(*(stream(host, port, keys[i], arm, tokens) for i in range(n)))
    first = min(started + r.first for r in results)
    last = max(r.last for r in results)
    total = sum(r.tokens for r in results)
    return {
        "tokens": total,
        "rate": total / (last - first),
        "ttft": statistics.median(r.first for r in results),
    }


def cpu_seconds(pid: int) -> float:
    """The server's user + system CPU time so far, all its threads (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(base_url: str, keys: list[str], pid: int, args: argparse.Namespace) -> dict:
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    for arm in ("chat", "messages"):  # warm both paths
        await burst(host, port, keys, arm, 1, 8)
    readings: dict[tuple[str, int], list[dict]] = {}
    for round_ in range(args.rounds):
        for n in args.streams:
            arms = ("chat", "messages") if round_ % 2 == 0 else ("messages", "chat")
            for arm in arms:
                cpu = cpu_seconds(pid)
                reading = await burst(host, port, keys, arm, n, args.tokens)
                reading["cpu"] = cpu_seconds(pid) - cpu
                readings.setdefault((arm, n), []).append(reading)
    return readings


def table(readings: dict, streams: list[int]) -> str:
    lines = [
        "| streams | chat tokens/s | messages tokens/s | messages / chat | chat TTFT ms "
        "| messages TTFT ms | server CPU us a token (chat, messages) "
        "| tokens a stream (chat, messages) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in streams:
        chat, messages = readings[("chat", n)], readings[("messages", n)]
        rate_c = statistics.median(r["rate"] for r in chat)
        rate_m = statistics.median(r["rate"] for r in messages)
        ratios = [m["rate"] / c["rate"] for c, m in zip(chat, messages, strict=True)]
        ttft_c = statistics.median(r["ttft"] for r in chat) * 1000
        ttft_m = statistics.median(r["ttft"] for r in messages) * 1000
        per = (chat[0]["tokens"] // n, messages[0]["tokens"] // n)
        cpu_c, cpu_m = (
            sum(r["cpu"] for r in arm) / sum(r["tokens"] for r in arm) * 1e6
            for arm in (chat, messages)
        )
        lines.append(
            f"| {n} | {rate_c:.0f} | {rate_m:.0f} | {statistics.median(ratios):.3f} "
            f"(paired rounds: {min(ratios):.3f}-{max(ratios):.3f}) | {ttft_c:.1f} | {ttft_m:.1f} "
            f"| {cpu_c:.0f}, {cpu_m:.0f} | {per[0]}, {per[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--out", type=Path, help="write the results file here")
    args = parser.parse_args(argv)
    args.streams = [int(n) for n in args.streams.split(",")]
    with local_server(max(args.streams), 10**9) as server:
        readings = asyncio.run(run(server.base_url, server.keys, server.process.pid, args))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    report = (
        f"# /v1/messages against /v1/chat/completions, streamed ({date.today()}, {commit})\n\n"
        f"`.venv/bin/python bench/messages.py --tokens {args.tokens} --rounds {args.rounds} "
        f"--streams {','.join(map(str, args.streams))}` on {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs (load average {os.getloadavg()[0]:.1f} at the "
        "end); the demo model, greedy, one server for both arms, the arms' order alternating "
        "round by round; medians.\n\n" + table(readings, args.streams) + "\n"
    )
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
