"""What Tokenshop costs in front of an upstream: the same llama.cpp server streamed direct and
through Tokenshop's API in one run, alternating, so both see the same machine.

    .venv/bin/python bench/gateway.py [--tokens 256 --rounds 12 --single-rounds 30]

It builds a random-weight GGUF (models/make_gguf.py, the demo tokenizer), starts llama-cpp-python's
server on it (`--interrupt_requests False`, one thread) and `tokenshop serve` with a models file
naming it (tokenizer configured: that server's streams carry no usage), then measures, at 1 and
8 concurrent streams: streamed tokens/s (all streams' tokens over the batch's wall time) in
rounds of one batch an arm in rotating order, each round's ratio to direct one reading; the same
for direct against direct (A/A), which shows how far two readings of one thing differ on this
host; the API process's CPU per streamed token (/proc utime+stime); then time to the first
token over `--ttft-requests` short requests each, alternating. llama-cpp-python serves one
request at a time, so 8 streams queue there, direct and through alike. A third arm in every
round, `bench/byte_proxy.py`, forwards bytes and does nothing else: its ratio is what an extra
hop costs on this host, where client, upstream and proxy share the CPUs. Writes
bench/results/<date>-gateway-<host>.md.

`--against REF` also serves an earlier commit (a git worktree of REF, on PYTHONPATH, with a
database of its own) beside this checkout, on the same upstream, and interleaves its first-token
requests with the others': a change's effect on the added time, free of the host's drift.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import describe_cpu  # noqa: E402
from bench.load import fund_keys  # noqa: E402
from models.make_gguf import make_gguf  # noqa: E402

CONTENT = re.compile(rb'"content": ?"[^"]')  # a delta with text, in either server's spacing
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Stream:
    sent: float = 0.0
    first: float = 0.0
    last: float = 0.0
    tokens: int = 0
    status: int = 0
    body: bytes = b""


class _Reader(asyncio.Protocol):
    """httptools parses the response; each SSE event with text counts as one token."""

    def __init__(self, done: asyncio.Future[None], stream: Stream) -> None:
        self.done, self.stream = done, stream
        self.parser = httptools.HttpResponseParser(self)
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_headers_complete(self) -> None:
        self.stream.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        now = time.perf_counter()
        if self.stream.status != 200:
            self.stream.body += body
            return
        *events, self.pending = (self.pending + body).split(b"\n\n")
        for event in events:
            if CONTENT.search(event):
                self.stream.tokens += 1
                self.stream.first = self.stream.first or now
                self.stream.last = now

    def on_message_complete(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def stream_once(port: int, body: dict[str, Any], key: str | None) -> Stream:
    payload = json_bytes(body)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    stream = Stream(sent=time.perf_counter())
    transport, _ = await loop.create_connection(lambda: _Reader(done, stream), "127.0.0.1", port)
    try:
        transport.write(head + payload)
        await done
    finally:
        transport.close()
    if stream.status != 200:
        raise RuntimeError(f"HTTP {stream.status}: {stream.body[:300]!r}")
    return stream


def json_bytes(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()


@dataclass
class Arm:
    name: str
    port: int
    key: str | None
    rates: dict[int, list[float]] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0


async def batch(arm: Arm, streams: int, body: dict[str, Any]) -> None:
    started = time.perf_counter()
    results = await asyncio.gather(*(stream_once(arm.port, body, arm.key) for _ in range(streams)))
    wall = max(r.last for r in results) - started
    tokens = sum(r.tokens for r in results)
    arm.tokens += tokens
    arm.rates.setdefault(streams, []).append(tokens / wall)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, process: subprocess.Popen[bytes] | None, within: float = 180) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


async def measure(
    args: argparse.Namespace,
    direct: Arm,
    gateway: Arm,
    noise: tuple[Arm, Arm],
    api_pid: int,
    proxy: Arm,
    earlier: Arm | None = None,
) -> float:
    """Paired rounds: each round runs one batch of each arm (direct, through Tokenshop, through
    the byte proxy), in rotating order, and each arm's ratio to direct is one reading, so a
    drift of the host's speed between rounds cancels out. A/A rounds (direct against direct)
    give the noise floor of those readings; the byte proxy, what any extra hop costs here."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello there, how are the tokens today?"}],
        "max_tokens": args.tokens,
        "temperature": 0,
        "stream": True,
    }
    arms = (direct, gateway, proxy)
    for arm in arms:  # warm every path
        await batch(arm, 1, body)
        arm.rates.clear()
        arm.tokens = 0
    api_cpu = 0.0
    for streams, rounds in ((1, args.single_rounds), (8, args.rounds)):
        for round_ in range(rounds):
            turn = round_ % len(arms)
            for arm in arms[turn:] + arms[:turn]:
                before = cpu_seconds(api_pid)
                await batch(arm, streams, body)
                if arm is gateway:
                    api_cpu += cpu_seconds(api_pid) - before
    for streams, rounds in ((1, args.single_rounds), (8, args.rounds)):
        for round_ in range(rounds):
            for arm in noise if round_ % 2 == 0 else noise[::-1]:
                await batch(arm, streams, body)
    short = body | {"max_tokens": 4}  # time to first token: more requests, each short
    ttft_arms = [direct, gateway] + ([earlier] if earlier else [])
    if earlier is not None:  # its first request warms it, as the rounds above warmed HEAD's
        await stream_once(earlier.port, short, earlier.key)
    for turn in range(args.ttft_requests):
        first = turn % len(ttft_arms)
        for arm in ttft_arms[first:] + ttft_arms[:first]:
            stream = await stream_once(arm.port, short, arm.key)
            arm.ttft.append(stream.first - stream.sent)
    return api_cpu


def paired(direct: Arm, other: Arm, streams: int) -> str:
    """The median of the rounds' ratios, with their middle half (25th to 75th percentile)."""
    pairs = zip(direct.rates[streams], other.rates[streams], strict=True)
    ratios = sorted(o / d for d, o in pairs)
    if len(ratios) < 2:  # one round: no spread to give
        return f"{ratios[0]:.3f}"
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f} ({q1:.3f}-{q3:.3f})"


def report(
    args: argparse.Namespace,
    direct: Arm,
    gateway: Arm,
    noise: tuple[Arm, Arm],
    api_cpu: float,
    proxy: Arm,
    earlier: Arm | None = None,
) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    start = args.load_at_start
    rows = []
    for streams in (1, 8):
        d, g = statistics.median(direct.rates[streams]), statistics.median(gateway.rates[streams])
        rounds = len(direct.rates[streams])
        rows.append(
            f"| {streams}, Tokenshop | {rounds} | {d:.1f} | {g:.1f} | "
            f"{paired(direct, gateway, streams)} |"
        )
    for streams in (1, 8):
        d, p = statistics.median(direct.rates[streams]), statistics.median(proxy.rates[streams])
        rows.append(
            f"| {streams}, byte proxy | {len(proxy.rates[streams])} "
            f"| {d:.1f} | {p:.1f} | {paired(direct, proxy, streams)} |"
        )
    for streams in (1, 8):
        a, b = (statistics.median(arm.rates[streams]) for arm in noise)
        rows.append(
            f"| {streams}, direct again (A/A) | {len(noise[0].rates[streams])} | "
            f"{a:.1f} | {b:.1f} | {paired(*noise, streams)} |"
        )
    d50, g50 = statistics.median(direct.ttft), statistics.median(gateway.ttft)
    per_token = api_cpu / gateway.tokens * 1e6
    against = []
    if earlier is not None:
        e50 = statistics.median(earlier.ttft)
        against = [
            f"Through Tokenshop at {args.against} (its own server on the same upstream, its "
            f"requests interleaved with the others'), p50: {e50 * 1000:.1f} ms, added "
            f"{(e50 - d50) * 1000:.1f} ms.",
            "",
        ]
    return "\n".join(
        [
            f"# Gateway overhead: llama.cpp direct against through Tokenshop ({dt.date.today()})",
            "",
            f"Commit {commit}; `bench/gateway.py --tokens {args.tokens} --rounds {args.rounds} "
            f"--single-rounds {args.single_rounds} "
            f"--hidden {args.hidden} --layers {args.layers} --ttft-requests {args.ttft_requests}`; "
            f"{describe_cpu()}, load average at the start {start[0]:.1f}/"
            f"{start[1]:.1f}/{start[2]:.1f}, at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} "
            "(the host is shared).",
            "Upstream: llama-cpp-python's server, one thread, a random-weight GGUF of the demo "
            "tokenizer; Tokenshop: `tokenshop serve`, one worker, SQLite, the models file naming "
            "that server with `tokenizer = models/demo`; the control, `bench/byte_proxy.py`, a "
            "proxy that forwards bytes and nothing else (what any extra hop costs on this "
            "host). Each round runs a batch direct, one through Tokenshop and one through the "
            "byte proxy, in rotating order; an A/A round, two batches direct; tok/s are medians "
            "of the rounds.",
            "",
            "| streams, through | rounds | direct tok/s | through tok/s | ratio: median of the "
            "rounds' (middle half) |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Time to first token, 1 stream, p50: direct {d50 * 1000:.1f} ms, through "
            f"{g50 * 1000:.1f} ms, added {(g50 - d50) * 1000:.1f} ms "
            f"({len(direct.ttft)} requests each of max_tokens 4, alternating).",
            "",
            *against,
            f"API CPU per streamed token: {per_token:.0f} us ({api_cpu:.2f} s of user+system time "
            f"for {gateway.tokens} tokens, hold, checkpoints and settlement included).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument(
        "--rounds", type=int, default=12, help="paired rounds of 8 streams (and of its A/A)"
    )
    parser.add_argument(
        "--single-rounds", type=int, default=30, help="paired rounds of 1 stream (and of its A/A)"
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--ttft-requests", type=int, default=100)
    parser.add_argument(
        "--against", default=None, help="a commit whose added time to first token to interleave"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--upstream", default=None, help="an OpenAI-compatible base URL already running instead"
    )
    args = parser.parse_args()
    args.load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tokenshop-gateway-") as tmp:
        work = Path(tmp)
        llama: subprocess.Popen[bytes] | None = None
        if args.upstream:
            upstream = args.upstream.rstrip("/")
        else:
            gguf = make_gguf(
                work / "tiny.gguf", hidden=args.hidden, layers=args.layers, ffn=args.hidden * 8 // 3
            )
            port = free_port()
            upstream = f"http://127.0.0.1:{port}/v1"
            llama = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                 "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
                 "--n_threads", "1", "--n_threads_batch", "1",
                 "--interrupt_requests", "False", "--verbose", "False"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        upstream_port = int(upstream.rsplit(":", 1)[1].split("/")[0])
        models = work / "models.toml"
        models.write_text(
            f'[[model]]\nname = "tiny"\nupstreams = ["{upstream}"]\n'
            f'tokenizer = "{ROOT / "models" / "demo"}"\n'
        )
        servers: list[subprocess.Popen[bytes]] = []
        earlier: Arm | None = None
        try:
            api, api_port, key = start_api(work / "head", models, ROOT)
            servers.append(api)
            proxy_port = free_port()
            byte_proxy = ROOT / "bench" / "byte_proxy.py"
            proxy_process = subprocess.Popen(
                [sys.executable, str(byte_proxy), str(proxy_port), str(upstream_port)]
            )
            servers.append(proxy_process)
            if args.against:
                checkout = work / "against"
                subprocess.run(
                    ["git", "worktree", "add", "--detach", str(checkout), args.against],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                )
                process, port, earlier_key = start_api(work / "earlier", models, checkout)
                servers.append(process)
                earlier = Arm(f"through Tokenshop at {args.against}", port, earlier_key)
            wait_for(f"{upstream}/models", llama)
            wait_for(f"http://127.0.0.1:{proxy_port}/v1/models", proxy_process)
            wait_for(f"http://127.0.0.1:{api_port}/ready", api)
            if earlier is not None:
                wait_for(f"http://127.0.0.1:{earlier.port}/ready", servers[-1])
            direct = Arm("direct", upstream_port, None)
            gateway = Arm("through Tokenshop", api_port, key)
            noise = (Arm("direct", upstream_port, None), Arm("direct again", upstream_port, None))
            proxy = Arm("through a byte-forwarding proxy", proxy_port, None)
            api_cpu = asyncio.run(measure(args, direct, gateway, noise, api.pid, proxy, earlier))
        finally:
            for process in servers + ([llama] if llama is not None else []):
                process.terminate()
                process.wait(timeout=30)
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(work / "against")],
                    cwd=ROOT,
                    capture_output=True,
                )
    text = report(args, direct, gateway, noise, api_cpu, proxy, earlier)
    print(text)
    out = args.out or results_path("gateway")
    out.write_text(text)
    print(f"wrote {out}")


def start_api(work: Path, models: Path, checkout: Path) -> tuple[subprocess.Popen[bytes], int, str]:
    """`tokenshop serve` of `checkout` (this one, or an earlier commit's worktree put first on
    PYTHONPATH) on a SQLite database of its own in `work`, with one funded key."""
    work.mkdir()
    database_url = f"sqlite:///{work / 'bench.db'}"
    secret = secrets.token_urlsafe(48)
    env = os.environ | {
        "DATABASE_URL": database_url,
        "SECRET_KEY": secret,
        "MODELS_FILE": str(models),
    }
    if checkout != ROOT:
        env["PYTHONPATH"] = str(checkout)
    tokenshop = [sys.executable, "-c", "from tokenshop.cli import main; main()"]
    subprocess.run([*tokenshop, "migrate"], env=env, cwd=checkout, check=True, capture_output=True)
    [key] = fund_keys(database_url, secret, 1, 100_000_000)
    port = free_port()
    api = subprocess.Popen(
        [*tokenshop, "serve", "--port", str(port)],
        env=env,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return api, port, key


def results_path(kind: str) -> Path:
    """bench/results/<date>-<kind>-<host>.md, with -2, -3, ... before `.md` where a run of the
    day already wrote it: a dated result of another run is never overwritten."""
    host = re.sub(r"[^a-z0-9]+", "-", socket.gethostname().lower()).strip("-")[:24]
    path = ROOT / "bench" / "results" / f"{dt.date.today()}-{kind}-{host}.md"
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
    return candidate


if __name__ == "__main__":
    main()
