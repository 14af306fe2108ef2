"""Side by side: our engine (HTTP and direct), a bare ONNX Runtime loop, onnxruntime-genai and
llama.cpp.

    .venv/bin/python bench/compare.py                       # everything (long)
    .venv/bin/python bench/compare.py --precisions int4 --streams 4 --rounds 1 --tokens 16

One command for issues 6, 31 and 33's comparison. `--shape` picks the model: Qwen2.5-0.5B (the
default), Qwen2.5-1.5B or Llama-3.2-3B, each its real config with random weights (bench/engine.py's
SHAPES), the larger ones built in bench/out/compare-<shape>/ and exported by bench/lean_export.py
(optimum's export fails on them here: see EXPORT_PATH). It builds the random-weight
transformers model of `bench/engine.py` once (bench/out/compare/src, git-ignored),
exports it with our export path in fp32, int8 and int4, builds onnxruntime-genai models (int4 and
fp32) from the same transformers dir with genai's own model builder in a venv of its own
(bench/out/genai-venv, made on first use: the builder needs transformers 5, our export stack
transformers 4), converts the same weights to GGUF with the `gguf` package and quantizes them
with llama.cpp's quantizer (q8_0, q4_0, q4_K_M; f32 for fp32) in llama.cpp's venv
(bench/out/llamacpp-venv: llama-cpp-python compiled from its sdist for this host's CPU; see
bench/compare_llamacpp.py), measures the machine's read bandwidth, and then measures every
engine x precision:

- ours through the real HTTP API as users install and start it: the checkout's commit
  (`git archive HEAD`) installed with a plain `pip install` (no extras, not editable) into
  bench/out/plain-venv (made again when HEAD changes; the install compiles the ops library),
  started with the Procfile's `web` line by a shell in a dir outside the checkout, one server
  per precision with the default settings and a graph cache of its own. Each server's `/ready`
  `serving` field (graph edits, ops, fallbacks) is printed with the results, and the run fails if
  a model is off the optimized path. Streamed chat completions (greedy) are read by
  bench/sse_client.py (httptools on raw connections: the client shares the server's cores, and
  httpx took 3x its CPU per token);
- ours directly: `LocalEngine` in a worker process (bench/compare_ours.py, the dev venv);
- a bare ONNX Runtime greedy loop on the graph as exported, in a worker of its own (the floor
  of any loop on that graph);
- onnxruntime-genai's C++ loop in its venv (bench/compare_genai.py; static batches), with the
  thread setting its docs recommend for CPU: `intra_op_num_threads` = the physical cores, set in
  the model's session options;
- llama.cpp (bench/compare_llamacpp.py): threads and batch threads = the physical cores, flash
  attention on, one context with a KV sequence per stream and every stream in one batch per
  step, as llama-server's parallel slots (llama-cpp-python's own server serves one request at a
  time); each quantization is a peer of its own.

Every peer's settings are printed with the table. Figures: one-stream decode tokens/s (tokens 2..N
over the time since token 1); aggregate tokens/s for 4, 8, 16 concurrent streams (all tokens over
the wall time, the burst's prefill included); 8 streams' decode throughput (each stream's tokens
2..N over its time since token 1, summed: the one-stream figure's measure, against which the
8-stream target is judged); time to first token for a 512-token prompt, idle and while 8 streams
decode, and (ours over HTTP) for the next turn of a conversation that began with it; every other
HTTP prompt is unique, so none starts from the server's prefix cache (the run fails if one does);
the peak RSS of the serving process once loaded; and the floor, bandwidth / weight bytes read per
token (every initializer a node reads, an embedding one row; for GGUF every tensor, the tied
embedding in full as it is the head; the bandwidth is the median of readings before the rounds and
after each). Each figure is the median over `--rounds` rounds, and the peers are interleaved within
each round, because this shared 2-core machine drifts by tens of percent over minutes: only
ratios inside one run mean much. The 8-stream burst runs `BUSY_PAIRS` times a round, each
peer's right after the others', and HTTP against direct is judged on the median of those pairs'
ratios. Prints one markdown table, writes bench/compare.png and bench/out/compare/results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.local_engine import TOKENIZER_FILE, load_chat_template  # noqa: E402
from api.engine.protocol import ChatMessage  # noqa: E402
from api.engine.text.tokenizer import TokenizerWrapper  # noqa: E402
from bench.engine import DEFAULT_SHAPE, OUT, SHAPES, build_source, prompt  # noqa: E402
from bench.host import describe_cpu  # noqa: E402
from bench.sse_client import SseClient  # noqa: E402

WORK = OUT / "compare"  # the 0.5B shape's; `--shape` S builds and measures in OUT / compare-S
SHAPE = DEFAULT_SHAPE
# How each shape is exported by default: optimum's export (`tokenshop export-model`) holds about
# 2.8x the fp32 weights at its peak (5.5 GB for 0.5B), which a 3B model's 12.8 GB cannot fit in
# 24 GiB; and on the 1.5B shape it failed after 15.5 GB peak RSS in optimum's post-processing
# (tied weights: `ModelProto.ByteSize()` raises on a graph over protobuf's 2 GB). Both go
# through `bench/lean_export.py`: the same graph and quantizers, about one layer in memory.
EXPORT_PATH = {"qwen2.5-0.5b": "optimum", "qwen2.5-1.5b": "lean", "llama-3.2-3b": "lean"}
BUILD_RSS: dict[str, float] = {}  # peak RSS (MB) of each build step run in this run
GENAI_VENV = OUT / "genai-venv"
PLAIN_VENV = OUT / "plain-venv"  # `pip install` of the checkout's HEAD, no extras
PLAIN_SRC = OUT / "plain-src"  # that HEAD's files (`git archive`), which pip installs
LLAMACPP_VENV = OUT / "llamacpp-venv"
PLOT = ROOT / "bench" / "compare.png"
PRECISIONS = ("fp32", "int8", "int4")
GENAI_PRECISIONS = ("fp32", "int4")  # its builder has int8 for CPU too: left out, runs are long
# llama.cpp's quantizations beside each of our precisions (f32: the unquantized GGUF).
LLAMACPP_QUANTS = {"fp32": ("f32",), "int8": ("q8_0",), "int4": ("q4_0", "q4_K_M")}
ENGINES = ("http", "direct", "bare", "genai", "llamacpp")
LABELS = {
    "http": "ours, HTTP API",
    "direct": "ours, engine direct",
    "bare": "bare ORT loop",
    "genai": "onnxruntime-genai",
    "llamacpp": "llama.cpp",
}
# llama-cpp-python from its sdist: CMake builds ggml for the CPU it runs on (GGML_NATIVE, the
# default, named so a cached environment cannot turn it off). pip's cache of wheels it built on
# this host may serve it; the worker prints the instruction sets the library was built with.
LLAMACPP_PACKAGES = ("llama-cpp-python", "gguf", "safetensors", "numpy")
LLAMACPP_CMAKE_ARGS = "-DGGML_NATIVE=ON"
# What the genai venv needs, installed in this order (torch first, so pip takes the CPU build
# already named, not another one pulled by transformers).
GENAI_PACKAGES = (
    ("torch==2.13.0",),
    ("onnxruntime-genai", "transformers>=5", "onnx", "onnx-ir"),  # the builder imports onnx_ir
)
BUSY_STREAMS = 8
# What a stream decoding in the background of a TTFT measurement asks for: more than it makes
# before it is cancelled, within the model's context (the API answers 400 past it).
RUNNING_TOKENS = 8192
# 8-stream bursts per round and peer, back to back with the other peers' (order rotating): one
# burst's HTTP/direct ratio moved between 0.79 and 1.05 on the Zen 3 host, so the verdict takes
# the median over every round's pairs.
BUSY_PAIRS = 3
VERSIONS: dict[str, str] = {}  # the peers' own versions, as their workers report them
LLAMACPP_SYSTEM: list[str] = []  # llama.cpp's system info: the instruction sets it was built for
SERVING: dict[str, dict[str, Any]] = {}  # /ready's serving path of each HTTP model
KEYS = 3  # a round's: the API allows 8 concurrent requests per key; 16 streams + a probe need 3
NONCE = "{:06d}"  # a request number, digit by digit: a fixed count of tokens
FILLER = (  # words for the HTTP prompts, fitted to a token count by `fit_text`
    "the quick brown fox jumps over a lazy dog while seven tired cats watch from the old red "
    "barn near river bank under grey autumn sky and children sing songs about distant hills"
)

BANDWIDTH_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
/* Read a buffer much larger than the caches with every core; print GB/s per pass. */
int main(int argc, char **argv) {
    size_t bytes = (size_t)atoll(argv[1]);
    int passes = atoi(argv[2]);
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *a = aligned_alloc(64, n * sizeof(uint64_t));
    for (size_t i = 0; i < n; i++) a[i] = i;
    uint64_t keep = 0;
    for (int p = 0; p < passes; p++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        uint64_t s = 0;
        #pragma omp parallel for reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += a[i];
        clock_gettime(CLOCK_MONOTONIC, &t1);
        keep += s;
        double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
        printf("%.3f\n", bytes / secs / 1e9);
    }
    fprintf(stderr, "%llu\n", (unsigned long long)keep);
    return 0;
}
"""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(argv: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    say("$ " + " ".join(str(a) for a in argv))
    return subprocess.run([str(a) for a in argv], check=True, text=True, **kwargs)


def run_build(what: str, argv: list[str | Path], **kwargs: Any) -> None:
    """`argv` as a build step: fails like `run`, and records the step's peak RSS (its own and
    its children's, from `wait4`) in BUILD_RSS, as the results report what a build needs."""
    say("$ " + " ".join(str(a) for a in argv))
    proc = subprocess.Popen([str(a) for a in argv], text=True, **kwargs)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    BUILD_RSS[what] = usage.ru_maxrss / 1024
    say(f"{what}: peak RSS {BUILD_RSS[what]:.0f} MB")
    # Kept with the builds: a later run that reuses them reports what they took.
    (WORK / "build-rss.json").write_text(json.dumps(BUILD_RSS, indent=1))
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, [str(a) for a in argv])


# --- building ------------------------------------------------------------------------------------


def ensure_export(source: Path, precision: str, rebuild: bool, how: str = "optimum") -> Path:
    """Our export of `source` in `precision`, in a process of its own (the export stack holds
    gigabytes that the measurements should not share a process with): `tokenshop export-model`,
    or with `how` "lean" bench/lean_export.py (the same graph and quantizers, a layer at a
    time in memory)."""
    out = WORK / precision
    done = out / ".compare-complete"
    if done.exists() and not rebuild:
        return out
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    quantize = [] if precision == "fp32" else ["--quantize", precision]
    if how == "lean":
        lean = ROOT / "bench" / "lean_export.py"
        run_build(f"export {precision} (lean)", [sys.executable, lean, source, out, *quantize])
    else:
        tokenshop = Path(sys.executable).parent / "tokenshop"
        argv: list[str | Path] = [tokenshop, "export-model", source, out, *quantize]
        run_build(f"export {precision} (optimum)", argv, stdout=sys.stderr)
    done.touch()
    say(f"{precision}: exported in {time.perf_counter() - started:.0f} s")
    return out


def ensure_genai_venv() -> Path:
    """The venv of onnxruntime-genai and its builder, made on first use (minutes)."""
    python = GENAI_VENV / "bin" / "python"
    done = GENAI_VENV / ".compare-complete"
    if done.exists():
        return python
    shutil.rmtree(GENAI_VENV, ignore_errors=True)
    run([sys.executable, "-m", "venv", GENAI_VENV])
    for packages in GENAI_PACKAGES:
        run([python, "-m", "pip", "install", "-q", *packages])
    done.touch()
    return python


def ensure_genai_model(python: Path, source: Path, precision: str, rebuild: bool) -> Path:
    """genai's model builder on the same transformers dir as our exports."""
    out = WORK / f"genai-{precision}"
    if (out / "genai_config.json").exists() and not rebuild:
        return out
    shutil.rmtree(out, ignore_errors=True)
    cache = WORK / "genai-cache"
    started = time.perf_counter()
    log = WORK / f"genai-{precision}-build.log"
    with log.open("w") as sink:
        # hf_token=false and offline: the builder reads only the local dir (it would otherwise
        # ask the hub for a token even for a local dir).
        argv: list[str | Path] = ["-m", "onnxruntime_genai.models.builder", "-i", source]
        argv += ["-o", out, "-p", precision, "-e", "cpu", "-c", cache]
        run_build(
            f"genai {precision} build",
            [python, *argv, "--extra_options", "hf_token=false"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    shutil.rmtree(cache, ignore_errors=True)
    say(f"genai {precision}: built in {time.perf_counter() - started:.0f} s")
    return out


def head_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, text=True, capture_output=True
    ).stdout.strip()


def ensure_plain_install(keep: bool = False) -> tuple[Path, str]:
    """A fresh venv with the checkout's HEAD installed as a user installs it: `pip install DIR`,
    no extras, not editable (setup.py compiles the ops library). Made again when HEAD moves,
    unless `keep` (smoke runs) and one exists. Returns the venv and the commit installed."""
    commit = head_commit()
    marker = PLAIN_VENV / ".compare-commit"
    if marker.exists() and (keep or marker.read_text() == commit):
        return PLAIN_VENV, marker.read_text()
    shutil.rmtree(PLAIN_VENV, ignore_errors=True)
    shutil.rmtree(PLAIN_SRC, ignore_errors=True)
    PLAIN_SRC.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(PLAIN_SRC)], input=archive, check=True)
    started = time.perf_counter()
    run([sys.executable, "-m", "venv", PLAIN_VENV])
    log = WORK / "plain-install.log"
    with log.open("w") as sink:
        run(
            [PLAIN_VENV / "bin" / "pip", "install", PLAIN_SRC],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    marker.write_text(commit)
    say(f"plain install of {commit[:7]}: {time.perf_counter() - started:.0f} s (log: {log})")
    return PLAIN_VENV, commit


def ensure_llamacpp_venv() -> Path:
    """llama-cpp-python compiled for this CPU, and `gguf`, in a venv of their own (minutes)."""
    python = LLAMACPP_VENV / "bin" / "python"
    done = LLAMACPP_VENV / ".compare-complete"
    if done.exists():
        return python
    shutil.rmtree(LLAMACPP_VENV, ignore_errors=True)
    run([sys.executable, "-m", "venv", LLAMACPP_VENV])
    env = {**os.environ, "CMAKE_ARGS": LLAMACPP_CMAKE_ARGS}
    run([python, "-m", "pip", "install", "-q", *LLAMACPP_PACKAGES], env=env)
    done.touch()
    return python


def ensure_gguf(python: Path, source: Path, kind: str, rebuild: bool) -> Path:
    """The same weights as GGUF: converted once to f32 with the `gguf` package, then quantized
    by llama.cpp's quantizer into `kind` (q8_0, q4_0, q4_K_M; f32 is the conversion itself)."""
    script = ROOT / "bench" / "compare_llamacpp.py"
    base = WORK / "llamacpp-f32.gguf"
    out = WORK / f"llamacpp-{kind}.gguf"
    if kind != "f32" and out.exists() and not rebuild:
        return out  # the f32 file may be gone: 12.8 GB for the 3B shape, on a full disk
    if rebuild or not base.exists():
        partial = base.with_suffix(".partial")
        run_build("GGUF f32 conversion", [python, script, "convert", source, partial])
        partial.rename(base)
    if kind == "f32":
        return base
    out = WORK / f"llamacpp-{kind}.gguf"
    if rebuild or not out.exists():
        partial = out.with_suffix(".partial")
        log = WORK / f"llamacpp-{kind}-quantize.log"
        with log.open("w") as sink:
            argv: list[str | Path] = [python, script, "quantize", base, partial, kind]
            run_build(f"GGUF {kind} quantization", argv, stdout=sink, stderr=sink)
        partial.rename(out)
    return out


# --- the machine -------------------------------------------------------------------------------


def read_bandwidth(buffer_mb: int = 1024, passes: int = 7) -> tuple[float, str]:
    """Median GB/s of streaming reads over a buffer far larger than the caches.

    A small C program reading with every core (what decoding with ORT's thread pool does) if a C
    compiler is here; numpy's single-threaded sum otherwise, which underestimates."""
    binary = WORK / "readbw"
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler and not binary.exists():
        source = WORK / "readbw.c"
        source.write_text(BANDWIDTH_C)
        with contextlib.suppress(subprocess.CalledProcessError):
            run([compiler, "-O3", "-march=native", "-fopenmp", source, "-o", binary])
    if binary.exists():
        out = subprocess.run(
            [str(binary), str(buffer_mb << 20), str(passes)],
            check=True,
            text=True,
            capture_output=True,
        ).stdout
        rates = [float(x) for x in out.split()]
        return statistics.median(rates), f"C, {os.cpu_count()} threads"
    data = np.ones(buffer_mb << 18, np.float32)
    rates = []
    for _ in range(passes):
        started = time.perf_counter()
        data.sum()
        rates.append(data.nbytes / (time.perf_counter() - started) / 1e9)
    return statistics.median(rates), "numpy, 1 thread"


def llamacpp_extra_bufts(choice: str) -> str:
    """ "on" or "off" for llama.cpp's extra weight buffers. With them (its default) every
    quantization of the 1.5B and 3B shapes segfaulted (-11) in the first `llama_decode` on the
    AMX Xeon here (llama-cpp-python 0.3.36 built native, AMX_INT8 = 1), with flash attention
    on or off, 1 or 2 threads; without them (llama-server's --no-repack) it ran. So "auto" turns
    them off where the CPU has AMX, and leaves llama.cpp's default elsewhere."""
    if choice != "auto":
        return choice
    flags = Path("/proc/cpuinfo").read_text()
    return "off" if " amx_int8" in flags else "on"


def physical_cores() -> int:
    """Cores this process may run on, counting a core's hyperthreads once: the figure genai's
    and llama.cpp's docs recommend for their thread counts."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return len(os.sched_getaffinity(0))
        cores.add((package, core))
    return len(cores) or 1


def bytes_per_token(model_file: Path) -> int:
    """Weight bytes one decode step reads: every initializer a node reads, in full, except a
    table only gathered from (an embedding), of which one row is read."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(str(model_file), load_external_data=False).graph
    sizes: dict[str, tuple[int, int]] = {}  # name -> (bytes, rows)
    for tensor in graph.initializer:
        length = next((int(e.value) for e in tensor.external_data if e.key == "length"), None)
        if length is None:
            if tensor.raw_data:
                length = len(tensor.raw_data)
            else:
                count = int(np.prod(tensor.dims)) if tensor.dims else 1
                length = count * np.dtype(tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
        sizes[tensor.name] = (length, int(tensor.dims[0]) if tensor.dims else 1)
    full: set[str] = set()
    row: set[str] = set()
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name not in sizes:
                continue
            gathered = (node.op_type == "Gather" and index == 0) or (
                node.op_type == "GatherBlockQuantized" and index != 1
            )
            (row if gathered else full).add(name)
    total = sum(sizes[name][0] for name in full)
    total += sum(sizes[name][0] // max(sizes[name][1], 1) for name in row - full)
    return total


# --- peers ---------------------------------------------------------------------------------------


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the most resident memory the process has had (since `forget_peak_rss`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def forget_peak_rss(pid: int) -> None:
    """Start VmHWM again from the current RSS (Linux 4.0+), so the peak is serving's, not
    loading's: a model whose optimized graph is not cached yet is optimized at load, which
    held twice the weights (the HTTP server, started first, read 3392 MB int4 against the
    direct worker's 555 on a fresh machine)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


class Worker:
    """A measuring process that answers one JSON command per line (`@@` + JSON)."""

    def __init__(self, argv: list[str | Path], log: Path) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=ROOT,
        )
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                reply = json.loads(line[2:])
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply
        raise RuntimeError(f"worker exited ({self.proc.wait()}); see {self.log.name}")

    def call(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def procfile_web() -> str:
    """The Procfile's `web` line, as the platform runs it."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            return line.removeprefix("web:").strip()
    raise RuntimeError("the Procfile has no web line")


class Server:
    """The Procfile's `web` line from the plain install, serving one model, default settings.

    A shell runs it in a dir outside the checkout, with the plain venv first on PATH, so the
    installed package serves (not this source tree); the graph cache is its own, so nothing the
    dev venv optimized is served."""

    def __init__(self, model: str, path: Path, port: int, env: dict[str, str], venv: Path) -> None:
        self.model = model
        self.base = f"http://127.0.0.1:{port}"
        self.sse = SseClient("127.0.0.1", port)
        self.log = (WORK / f"server-{model}.log").open("w")
        self.cwd = Path(tempfile.mkdtemp(prefix=f"tokenshop-web-{model}-"))
        env = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env.update(
            PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
            PORT=str(port),
            MODELS=f"{model}={path}",
            ENGINE_CACHE_DIR=str(WORK / "plain-graph-cache"),
        )
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {procfile_web()}"],
            cwd=self.cwd,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def serving(self) -> dict[str, Any]:
        """`/ready`'s word on the path this model is served on."""
        body = httpx.get(self.base + "/ready", timeout=10).json()
        return dict(body.get("serving", {}).get(self.model) or {})

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.model} exited; see {self.log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base + "/ready", timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"server {self.model} not ready after {timeout} s")

    async def wait_idle(self, client: httpx.AsyncClient) -> None:
        """Until the engine has no active or queued sequence (aborted streams have left)."""
        for _ in range(600):
            text = (await client.get(self.base + "/metrics")).text
            busy = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("tokenshop_active_sequences{", "tokenshop_queued_sequences{"))
            )
            if not busy:
                return
            await asyncio.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.cwd, ignore_errors=True)


def off_the_fast_path(serving: dict[str, Any]) -> str | None:
    """Why a model's `/ready` serving path is not the optimized one, or None when it is."""
    if not serving:
        return "/ready reports no serving path"
    if serving.get("fallbacks"):
        return "; ".join(serving["fallbacks"])
    if serving.get("ops") != "tokenshop":
        return f"ops {serving.get('ops')}, not ours"
    return None


@dataclass
class HttpClient:
    """Streams chat completions at one server, `KEYS` keys a round (8 concurrent per key):
    `keys[r * KEYS : (r + 1) * KEYS]` for round r, round 0 being the warm-up."""

    server: Server
    keys: list[str]
    short_text: str
    long_text: str
    _next: int = 0
    _round: int = 0

    def begin_round(self, index: int) -> None:
        """Round `index` (from 0) numbers its requests from the start again, under keys of its
        own: every round sends the same prompts in the same order, so each round's greedy
        texts, and the drafts prompt lookup finds in them, are the same, and none starts from
        another round's cached prefix (the cache is kept per account). Numbered across rounds,
        one stream read 128.9, 108.0 and 77.9 tok/s in the three rounds of one run
        (bench/results/2026-11-27-compare-int4-amx-xeon-584c54a.md)."""
        self._round, self._next = index + 1, 0

    def _key(self) -> str:
        self._next += 1
        return self.keys[self._round * KEYS + self._next % KEYS]

    def _unique(self, text: str) -> str:
        """`text` behind the request's number in its round, least significant digit first: no
        two requests of a round share more than the template's first tokens, so none starts
        from another's cached prefix (the server keeps each account's prompts and finished
        conversations) and every prompt is prefilled."""
        return f"{NONCE.format(self._next)[::-1]} {text}"

    async def stream(
        self, text: str, max_tokens: int, started: asyncio.Event | None
    ) -> tuple[float, float, float, int]:
        """One streamed request: (submitted, first token, last token, completion tokens).

        The server sends its first event once the first token exists, so that event's arrival
        is the time to first token; the event with `finish_reason` comes with the last token."""
        body = {
            "model": self.server.model,
            "messages": [{"role": "user", "content": self._unique(text)}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        key = self._key()  # numbers the request too
        submitted = time.perf_counter()
        times = await self.server.sse.stream(body, key, started)
        if times.cached_tokens:
            raise RuntimeError("a prompt started from the prefix cache: not a cold one")
        return submitted, times.first, times.last or times.first, times.completion_tokens

    async def streams(self, n: int, tokens: int) -> dict[str, float]:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(self.stream(self.short_text, tokens, None) for _ in range(n))
        )
        wall = time.perf_counter() - started
        rates = [(k - 1) / (b - a) for _, a, b, k in results if k > 1 and b > a]
        return {
            "per": float(np.mean(rates)) if rates else float("nan"),
            "agg": sum(k for *_, k in results) / wall,
            "ttft": float(np.mean([first - sub for sub, first, _, _ in results])),
        }

    async def next_turn(self) -> dict[str, float]:
        """Time to first token of a conversation's second turn: the long prompt, its reply,
        then a short message, from one account (whose finished turn the server kept)."""
        key = self._key()
        url = self.server.base + "/v1/chat/completions"
        turn = {"model": self.server.model, "max_tokens": PLAN.tokens, "temperature": 0}
        messages = [{"role": "user", "content": self._unique(self.long_text)}]
        async with httpx.AsyncClient(timeout=None) as c:
            reply = await c.post(
                url, headers={"Authorization": f"Bearer {key}"}, json={**turn, "messages": messages}
            )
            reply.raise_for_status()
        messages.append(reply.json()["choices"][0]["message"])
        messages.append({"role": "user", "content": self.short_text})
        body = {**turn, "messages": messages, "max_tokens": 1, "stream": True}
        body["stream_options"] = {"include_usage": True}
        submitted = time.perf_counter()
        times = await self.server.sse.stream(body, key)
        return {"ttft": times.first - submitted, "cached": times.cached_tokens}

    async def ttft(self, running: int) -> float:
        """Time to first token of the long prompt, idle or joining `running` decoding streams."""
        events = [asyncio.Event() for _ in range(running)]
        background = [
            asyncio.create_task(self.stream(self.short_text, RUNNING_TOKENS, event))
            for event in events
        ]
        try:
            for task, event in zip(background, events, strict=True):
                await _started(task, event)
            submitted, first, _, _ = await self.stream(self.long_text, 1, None)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        async with httpx.AsyncClient(timeout=None) as c:
            await self.server.wait_idle(c)
        return first - submitted


async def _started(stream: asyncio.Task, event: asyncio.Event) -> None:
    """Until `stream` has its first token; raises if it ends first (a dead server, say)."""
    waiter = asyncio.ensure_future(event.wait())
    await asyncio.wait({stream, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not event.is_set():
        stream.result()  # its exception, if it failed
        raise RuntimeError("a background stream ended before its first token")


@dataclass
class Peer:
    """One engine x precision: how to take each measurement, and its serving process."""

    engine: str
    precision: str
    measure: Callable[[str, int], dict[str, float] | None]
    pid: int
    floor_bytes: int
    variant: str = ""  # llama.cpp's quantization, where one precision has several
    settings: str = ""  # how it ran, printed with the table
    results: dict[str, list[float]] = field(default_factory=dict)
    begin_round: Callable[[int], None] | None = None  # told each round's index before it runs

    @property
    def label(self) -> str:
        return f"{LABELS[self.engine]} {self.variant}".strip()

    def record(self, kind: str, value: float) -> None:
        self.results.setdefault(kind, []).append(value)

    def median(self, kind: str) -> float:
        values = self.results.get(kind)
        return float(statistics.median(values)) if values else float("nan")


def fit_text(export: Path, target: int) -> tuple[str, int]:
    """A user message whose chat-templated prompt is as close to `target` tokens as words allow
    (the HTTP peers send text; the direct peers get `target` token ids)."""
    tokenizer = TokenizerWrapper.from_file(export / TOKENIZER_FILE)
    template = load_chat_template(export)
    rng = np.random.default_rng(7)
    vocabulary = FILLER.split()
    words = [vocabulary[i] for i in rng.integers(0, len(vocabulary), size=target * 2)]

    def length(k: int) -> int:
        text = NONCE.format(0) + " " + " ".join(words[:k])  # as `HttpClient._unique` sends it
        return len(tokenizer.encode(template.render([ChatMessage("user", text)])))

    low, high = 1, len(words)
    while low < high:
        mid = (low + high + 1) // 2
        if length(mid) <= target:
            low = mid
        else:
            high = mid - 1
    return " ".join(words[:low]), length(low)


@dataclass
class Plan:
    tokens: int
    prompt: int
    ttft_prompt: int
    streams: list[int]
    busy_pairs: int = BUSY_PAIRS
    busy_ttft: bool = True  # time a long prompt joining BUSY_STREAMS running ones too


@dataclass
class Builds:
    """What the peers serve: our exports by precision, genai's models by precision, llama.cpp's
    GGUF files by (precision, quantization), and the plain install that serves HTTP."""

    exports: dict[str, Path]
    genai: dict[str, Path] = field(default_factory=dict)
    gguf: dict[tuple[str, str], Path] = field(default_factory=dict)
    plain: Path | None = None
    plain_commit: str = ""


def make_peers(
    args: argparse.Namespace,
    plan: Plan,
    builds: Builds,
    closers: list[Callable[[], None]],
) -> list[Peer]:
    """Start every serving process (loading all models up front, so rounds can interleave),
    each one's `close` added to `closers` as soon as it runs: if a later one fails to start,
    the caller still stops those already running (a server left behind holds its port, and
    the next run's requests would reach it with keys it does not know)."""
    peers: list[Peer] = []
    engines = args.engines
    exports = builds.exports
    env = dict(os.environ)
    threads = args.threads
    if "http" in engines:
        assert builds.plain is not None
        db = WORK / "tokenshop.db"
        db.unlink(missing_ok=True)
        env.update(DATABASE_URL=f"sqlite:///{db}", SECRET_KEY=secrets.token_urlsafe(48))
        tokenshop = Path(sys.executable).parent / "tokenshop"
        run([tokenshop, "migrate"], cwd=ROOT, env=env, capture_output=True)
        keys = [
            run(
                [tokenshop, "keys", "issue", "--tokens", "1000000000"],
                cwd=ROOT,
                env=env,
                capture_output=True,
            ).stdout.split()[-1]
            for _ in range(KEYS * (args.rounds + 1))  # a round's own, and the warm-up's
        ]
        first_export = next(iter(exports.values()))
        short_text, short_len = fit_text(first_export, plan.prompt)
        long_text, long_len = fit_text(first_export, plan.ttft_prompt)
        say(f"HTTP prompts: {short_len} and {long_len} tokens after the chat template")
        # Every peer prefills as many tokens as these: the template alone can exceed --prompt,
        # and with the direct engine's 24-token prompts against HTTP's 28, HTTP read 0.915 of
        # direct at 8 int4 streams on an AVX2 host (1.034 with 28 each way), where prefilling
        # a burst's prompts is a fifth of it.
        plan.prompt, plan.ttft_prompt = short_len, long_len
        servers = []
        for i, (precision, path) in enumerate(exports.items()):
            server = Server(precision, path, args.port + i, env, builds.plain)
            servers.append(server)
            closers.append(server.close)
        lost = []
        for server in servers:
            server.wait_ready()
            serving = server.serving()
            SERVING[server.model] = serving
            if why := off_the_fast_path(serving):
                lost.append(f"{server.model}: {why}")
            client = HttpClient(server, keys, short_text, long_text)
            settings = (
                f"`pip install` of {builds.plain_commit[:7]} (no extras), Procfile `web` line, "
                f"default settings; /ready: edits {', '.join(serving.get('graph_edits', []))}; "
                f"ops {serving.get('ops')} ({serving.get('isa')})"
            )
            pid = server.proc.pid  # the shell `exec`s the web line: this is uvicorn
            peer = Peer("http", server.model, _http_measure(client), pid, 0, "", settings)
            peer.begin_round = client.begin_round
            peers.append(peer)
        if lost and not args.allow_fallback:
            raise RuntimeError("the plain install is off the optimized path: " + " | ".join(lost))
    for precision, path in exports.items():
        if not {"direct", "bare"} & set(engines):
            break
        direct_flags = [] if args.ours_drafts == "on" else ["--no-drafts"]
        for name, flags in (("direct", direct_flags), ("bare", ["--bare"])):
            if name not in engines:
                continue
            worker = Worker(
                [sys.executable, ROOT / "bench" / "compare_ours.py", path, *flags],
                WORK / f"worker-{name}-{precision}.log",
            )
            closers.append(worker.close)
            measure = _direct_measure(worker) if name == "direct" else _bare_measure(worker)
            settings = (
                "`LocalEngine`, default settings, dev venv (working tree)"
                + ("" if args.ours_drafts == "on" else ", prompt-lookup drafts off")
                if name == "direct"
                else "the exported graph, ONNX Runtime's default threads"
            )
            peers.append(Peer(name, precision, measure, worker.proc.pid, 0, "", settings))
    if builds.genai:
        python = GENAI_VENV / "bin" / "python"
        for precision, path in builds.genai.items():
            worker = Worker(
                [python, ROOT / "bench" / "compare_genai.py", path, "--threads", str(threads)],
                WORK / f"genai-worker-{precision}.log",
            )
            closers.append(worker.close)
            VERSIONS["onnxruntime-genai"] = str(worker.hello.get("version"))
            settings = ", ".join(f"{k}={v}" for k, v in worker.hello["settings"].items())
            peers.append(
                Peer("genai", precision, _genai_measure(worker), worker.proc.pid, 0, "", settings)
            )
    if builds.gguf:
        python = LLAMACPP_VENV / "bin" / "python"
        seq_ctx = -(-max(plan.ttft_prompt + 8, plan.prompt + plan.tokens + 8) // 256) * 256
        for (precision, kind), path in builds.gguf.items():
            argv: list[str | Path] = [python, ROOT / "bench" / "compare_llamacpp.py", "serve", path]
            seqs = max(*plan.streams, BUSY_STREAMS) + 1  # a long prompt joins 8 running
            argv += ["--threads", str(threads), "--seqs", str(seqs)]
            argv += ["--seq-ctx", str(seq_ctx), "--flash", args.llamacpp_flash]
            argv += ["--extra-bufts", llamacpp_extra_bufts(args.llamacpp_extra_bufts)]
            worker = Worker(argv, WORK / f"llamacpp-worker-{kind}.log")
            closers.append(worker.close)
            VERSIONS["llama-cpp-python"] = str(worker.hello.get("version"))
            LLAMACPP_SYSTEM.append(str(worker.hello.get("system_info")))
            settings = ", ".join(f"{k}={v}" for k, v in worker.hello["settings"].items())
            peer = Peer(
                "llamacpp", precision, _llamacpp_measure(worker), worker.proc.pid, 0, kind, settings
            )
            peer.floor_bytes = int(worker.hello["bytes_per_token"])
            peers.append(peer)
    return peers


def _http_measure(client: HttpClient) -> Callable[[str, int], dict[str, float] | None]:
    def measure(kind: str, value: int) -> dict[str, float] | None:
        if kind == "streams":
            return asyncio.run(client.streams(value, PLAN.tokens))
        if kind == "turn":
            return asyncio.run(client.next_turn())
        return {"ttft": asyncio.run(client.ttft(value))}

    return measure


def _direct_measure(worker: Worker) -> Callable[[str, int], dict[str, float] | None]:
    def measure(kind: str, value: int) -> dict[str, float] | None:
        if kind == "streams":
            return worker.call(op="streams", streams=value, tokens=PLAN.tokens, prompt=PLAN.prompt)
        return worker.call(op="ttft", running=value, prompt=PLAN.ttft_prompt)

    return measure


def _bare_measure(worker: Worker) -> Callable[[str, int], dict[str, float] | None]:
    def measure(kind: str, value: int) -> dict[str, float] | None:
        if kind == "streams":
            if value != 1:
                return None  # one sequence, no batching
            return worker.call(op="bare", tokens=PLAN.tokens, prompt=PLAN.prompt)
        if value:
            return None
        return worker.call(op="bare_ttft", prompt=PLAN.ttft_prompt)

    return measure


def _llamacpp_measure(worker: Worker) -> Callable[[str, int], dict[str, float] | None]:
    def measure(kind: str, value: int) -> dict[str, float] | None:
        if kind == "streams":
            ids = [prompt(PLAN.prompt, seed=i) for i in range(value)]
            return worker.call(op="generate", ids=ids, tokens=PLAN.tokens)
        running = [prompt(PLAN.prompt, seed=i) for i in range(value)]
        return worker.call(op="ttft_running", running=running, ids=prompt(PLAN.ttft_prompt, 99))

    return measure


def _genai_measure(worker: Worker) -> Callable[[str, int], dict[str, float] | None]:
    def measure(kind: str, value: int) -> dict[str, float] | None:
        if kind == "streams":
            ids = [prompt(PLAN.prompt, seed=i) for i in range(value)]
            return worker.call(op="generate", ids=ids, tokens=PLAN.tokens)
        if value:
            return None  # static batches: a request cannot join a running one
        return worker.call(op="generate", ids=[prompt(PLAN.ttft_prompt, seed=99)], tokens=1)

    return measure


PLAN = Plan(tokens=64, prompt=24, ttft_prompt=512, streams=[4, 8, 16])


def rotated(items: list[Peer], by: int) -> Iterator[Peer]:
    by %= len(items)
    yield from items[by:] + items[:by]


def measure_rounds(peers: list[Peer], rounds: int, budget_s: float, bandwidths: list[float]) -> int:
    """Round by round, every measurement of every peer once, peers in a rotating order; the
    read bandwidth is measured again after each round and appended to `bandwidths`.

    A round is not started when the rounds so far say it would end after `budget_s`: on a
    loaded machine fewer rounds beat no table. Returns the rounds completed."""
    kinds = [("streams", 1), *(("streams", s) for s in PLAN.streams), ("ttft", 0)]
    if PLAN.busy_ttft:
        kinds.append(("ttft", BUSY_STREAMS))
    kinds.append(("turn", 0))  # a next turn: ours over HTTP only
    tokens, PLAN.tokens = PLAN.tokens, 4
    for peer in peers:  # warm-up: first-run allocations (a long prompt's are left to the median)
        peer.measure("streams", 1)
    PLAN.tokens = tokens
    began = time.monotonic()
    for r in range(rounds):
        elapsed = time.monotonic() - began
        if r and elapsed + elapsed / r > budget_s:
            say(f"stopping after {r} rounds: another would pass the {budget_s:.0f} s budget")
            return r
        for peer in peers:
            if peer.begin_round is not None:
                peer.begin_round(r)
        for kind, value in kinds:
            repeats = PLAN.busy_pairs if (kind, value) == ("streams", BUSY_STREAMS) else 1
            for peer in (p for k in range(repeats) for p in rotated(peers, r + k)):
                if kind == "turn" and peer.engine != "http":
                    continue
                started = time.perf_counter()
                try:
                    result = peer.measure(kind, value)
                except Exception as exc:  # one failing peer must not lose the others' figures
                    say(f"{peer.engine} {peer.precision} {kind} {value}: FAILED {exc}")
                    continue
                if result is None:
                    continue
                if kind == "streams":
                    if value == 1:
                        peer.record("one", result["per"])
                    peer.record(f"agg{value}", result["agg"])
                    # Decode throughput: every stream's tokens 2..N over its time since token
                    # 1, summed (the one-stream figure is this at 1): prefill left out of both.
                    peer.record(f"dec{value}", value * result["per"])
                elif kind == "turn":
                    peer.record("ttft_turn", result["ttft"])
                    peer.record("turn_cached", result["cached"])
                else:
                    peer.record("ttft_busy" if value else "ttft", result["ttft"])
                say(
                    f"round {r + 1} {peer.engine:6} {peer.precision} {kind} {value}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in result.items())
                    + f" ({time.perf_counter() - started:.1f} s)"
                )
        bandwidths.append(read_bandwidth()[0])
        say(f"round {r + 1}: read bandwidth {bandwidths[-1]:.1f} GB/s")
    return rounds


# --- reporting -----------------------------------------------------------------------------------


def fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value != value else f"{value:.{digits}f}"


def ordered(peers: list[Peer]) -> list[Peer]:
    return sorted(
        peers, key=lambda p: (PRECISIONS.index(p.precision), ENGINES.index(p.engine), p.variant)
    )


def table(peers: list[Peer], bandwidth: float) -> str:
    streams = PLAN.streams
    head = ["engine", "precision", "MB read/token", "floor tok/s", "1 stream tok/s", "of floor"]
    head += [f"{s} streams tok/s" for s in streams]
    head.append(f"{BUSY_STREAMS} streams decoding tok/s")
    head += [
        f"TTFT {PLAN.ttft_prompt} idle s",
        f"TTFT {PLAN.ttft_prompt}, {BUSY_STREAMS} running s",
        f"TTFT {PLAN.ttft_prompt}, next turn s",
        "peak RSS MB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for peer in ordered(peers):
        floor = bandwidth * 1e9 / peer.floor_bytes
        one = peer.median("one")
        row = [peer.label, peer.precision, fmt(peer.floor_bytes / 1e6, 0), fmt(floor)]
        row += [fmt(one), fmt(one / floor, 2)]
        row += [fmt(peer.median(f"agg{s}")) for s in streams]
        row.append(fmt(peer.median(f"dec{BUSY_STREAMS}")))
        row += [fmt(peer.median("ttft"), 3), fmt(peer.median("ttft_busy"), 3)]
        row.append(fmt(peer.median("ttft_turn"), 3))
        row.append(fmt(peak_rss_mb(peer.pid), 0))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def targets(peers: list[Peer], bandwidth: float) -> list[str]:
    """Issues 6 and 33's targets, each with the figures it compares and whether it is met."""
    by = {(p.engine, p.precision): p for p in peers if not p.variant}
    llama = {p.variant: p for p in peers if p.engine == "llamacpp"}
    lines = []

    def check(name: str, value: float, bound: float, detail: str) -> None:
        if value != value:
            lines.append(f"- {name}: not measured in this run")
            return
        verdict = "met" if value >= bound else "NOT met"
        lines.append(f"- {name}: {detail} -> {verdict}")

    for engine in ("http", "direct"):
        label = LABELS[engine]
        int4, int8 = by.get((engine, "int4")), by.get((engine, "int8"))
        if int4:
            floor = bandwidth * 1e9 / int4.floor_bytes
            one = int4.median("one")
            check(f"{label} int4 1 stream >= 0.85 floor", one / floor, 0.85, f"{one / floor:.2f}")
            genai = by.get(("genai", "int4"))
            if genai:
                ratio = one / genai.median("one")
                check(f"{label} int4 1 stream >= genai int4", ratio, 1.0, f"{ratio:.2f}x")
            if "q4_0" in llama:
                ratio = one / llama["q4_0"].median("one")
                check(f"{label} int4 1 stream >= 1.2x llama.cpp q4_0", ratio, 1.2, f"{ratio:.2f}x")
            if f"dec{BUSY_STREAMS}" in int4.results:
                # Like for like: decode throughput at 8 streams over one stream's decode rate.
                # The bursts' wall-time figures (prefill of 8 prompts inside the 8-stream one,
                # of one inside the other) are printed beside it, not judged.
                ratio = int4.median(f"dec{BUSY_STREAMS}") / one
                wall = int4.median(f"agg{BUSY_STREAMS}") / int4.median("agg1")
                check(
                    f"{label} int4 8 streams >= 5x 1 stream",
                    ratio,
                    5.0,
                    f"{ratio:.2f}x decoding ({int4.median(f'dec{BUSY_STREAMS}'):.1f} against "
                    f"{one:.1f} tok/s); all tokens over the burst's wall time, prefill "
                    f"included: {wall:.2f}x",
                )
        if int8:
            floor = bandwidth * 1e9 / int8.floor_bytes
            ratio = int8.median("one") / floor
            check(f"{label} int8 1 stream >= 0.75 floor", ratio, 0.75, f"{ratio:.2f}")
            if "q8_0" in llama:
                ratio = int8.median("one") / llama["q8_0"].median("one")
                check(f"{label} int8 1 stream >= llama.cpp q8_0", ratio, 1.0, f"{ratio:.2f}x")
        for precision, kind in (("int4", "q4_0"), ("int8", "q8_0")):
            ours, theirs = by.get((engine, precision)), llama.get(kind)
            if not (ours and theirs):
                continue
            ratio = theirs.median("ttft") / ours.median("ttft")
            check(
                f"{label} {precision} TTFT {PLAN.ttft_prompt} idle <= llama.cpp {kind}",
                ratio,
                1.0,
                f"{ours.median('ttft'):.3f} against {theirs.median('ttft'):.3f} s",
            )
            rss, limit = peak_rss_mb(ours.pid), peak_rss_mb(theirs.pid) * 1.1
            check(
                f"{label} {precision} peak RSS <= llama.cpp {kind} + 10%",
                limit / rss,
                1.0,
                f"{rss:.0f} MB against llama.cpp's {limit / 1.1:.0f} (+10%: {limit:.0f})",
            )
    for precision in PRECISIONS:
        http, direct = by.get(("http", precision)), by.get(("direct", precision))
        busy = f"agg{BUSY_STREAMS}"
        if http and direct and busy in http.results and busy in direct.results:
            # Bursts of one round's repeat run back to back, so their ratio is paired: the
            # host's drift between minutes cancels, which the ratio of the medians does not.
            pairs = [h / d for h, d in zip(http.results[busy], direct.results[busy], strict=False)]
            ratio = statistics.median(pairs)
            of_medians = http.median(busy) / direct.median(busy)
            check(
                f"{precision} 8 streams, HTTP within 5% of direct",
                ratio,
                0.95,
                f"{ratio:.3f}, median of {len(pairs)} paired bursts "
                f"({' '.join(f'{x:.2f}' for x in pairs)}; ratio of the medians {of_medians:.3f})",
            )
    for peer in peers:
        if "ttft_busy" in peer.results:
            ratio = peer.median("ttft") / peer.median("ttft_busy")
            check(
                f"{peer.label} {peer.precision} TTFT with 8 running <= 2x idle",
                ratio,
                0.5,
                f"{1 / ratio:.2f}x idle",
            )
    return lines


def plot(peers: list[Peer], path: Path, bandwidth: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fp32": "tab:blue", "int8": "tab:orange", "int4": "tab:green"}
    styles = {"http": "-", "direct": "--", "bare": "", "genai": ":", "llamacpp": "-."}
    markers = {"http": "o", "direct": "s", "bare": "*", "genai": "^", "llamacpp": "D"}
    figure, axes = plt.subplots(figsize=(8, 5), dpi=110)
    for peer in ordered(peers):
        xs = [s for s in [1, *PLAN.streams] if f"agg{s}" in peer.results]
        ys = [peer.median(f"agg{s}") for s in xs]
        axes.plot(
            xs,
            ys,
            linestyle=styles[peer.engine] or "none",
            marker="v" if peer.variant == "q4_K_M" else markers[peer.engine],
            color=colors.get(peer.precision, "black"),
            label=f"{peer.label}, {peer.precision}",
        )
    ours = [p for p in peers if p.engine in ("http", "direct", "bare")]
    for precision in sorted({p.precision for p in ours}):
        floor_bytes = next(p.floor_bytes for p in ours if p.precision == precision)
        axes.axhline(
            bandwidth * 1e9 / floor_bytes, color=colors[precision], linewidth=0.6, alpha=0.5
        )
    axes.set_xscale("log", base=2)
    axes.set_xticks([1, *PLAN.streams], labels=[str(s) for s in [1, *PLAN.streams]])
    axes.set_xlabel("concurrent streams")
    axes.set_ylabel("aggregate tokens/s")
    axes.set_title(
        f"Random {SHAPE}-shaped model, {os.cpu_count()}-core CPU\n"
        "(thin lines: one-stream bandwidth floors)"
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path)


def describe_machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{describe_cpu()}, {memory:.0f} GiB"


def commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "api"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    return head + (" (api/ modified)" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=DEFAULT_SHAPE,
        help="the model's shape (real config, random weights; see bench/engine.py's SHAPES)",
    )
    parser.add_argument(
        "--export",
        choices=("auto", "optimum", "lean"),
        default="auto",
        help="how our exports are made (auto: optimum for 0.5B, lean_export.py for the others)",
    )
    parser.add_argument(
        "--build-only", action="store_true", help="build what the run needs, measure nothing"
    )
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--streams", default="4,8,16", help="concurrent streams besides 1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument(
        "--prompt", type=int, default=24, help="prompt tokens for decoding (>= the template's)"
    )
    parser.add_argument("--ttft-prompt", type=int, default=512)
    parser.add_argument(
        "--busy-pairs", type=int, default=BUSY_PAIRS, help="8-stream bursts per round and peer"
    )
    parser.add_argument(
        "--no-busy-ttft",
        action="store_true",
        help="skip the TTFT of a long prompt joining 8 running streams (long on large shapes)",
    )
    parser.add_argument("--port", type=int, default=8731)
    parser.add_argument(
        "--budget-minutes", type=float, default=600, help="start no round that would end later"
    )
    parser.add_argument("--rebuild", action="store_true", help="export and build again")
    parser.add_argument(
        "--llamacpp-flash",
        choices=("on", "off", "auto"),
        default="on",
        help="llama.cpp's flash attention (its CPU backend has it)",
    )
    parser.add_argument(
        "--ours-drafts",
        choices=("on", "off"),
        default="on",
        help="the direct engine's prompt-lookup drafts (on: its default, where they pay)",
    )
    parser.add_argument(
        "--llamacpp-extra-bufts",
        choices=("on", "off", "auto"),
        default="auto",
        help="llama.cpp's AMX and repacked weight buffers (auto: off on a CPU with AMX, where "
        "llama-cpp-python 0.3.36 segfaults in its first decode with them; on elsewhere)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=physical_cores(),
        help="genai's intra_op_num_threads and llama.cpp's threads (default: the physical cores, "
        "as their docs recommend; on a loaded host llama.cpp's 2 threads fell to 1.5 tok/s where "
        "1 made 12)",
    )
    parser.add_argument(
        "--keep-plain-install",
        action="store_true",
        help="serve HTTP from the plain install already made, even of an older commit (smoke runs)",
    )
    parser.add_argument(
        "--allow-fallback",
        action="store_true",
        help="measure a plain install that /ready says is off the optimized path (fails otherwise)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="default: bench/compare.png "
        "for the 0.5B shape, bench/out/compare-SHAPE/compare.png otherwise",
    )
    args = parser.parse_args()
    global WORK, SHAPE
    SHAPE = args.shape
    if SHAPE != DEFAULT_SHAPE:
        WORK = OUT / f"compare-{SHAPE}"
    args.plot = args.plot or (PLOT if SHAPE == DEFAULT_SHAPE else WORK / "compare.png")
    export_how = EXPORT_PATH[SHAPE] if args.export == "auto" else args.export
    # A plain `kill` still runs the `finally` that stops the servers and workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    args.engines = [e for e in args.engines.split(",") if e]
    precisions = [p for p in args.precisions.split(",") if p]
    PLAN.tokens, PLAN.prompt, PLAN.ttft_prompt = args.tokens, args.prompt, args.ttft_prompt
    PLAN.streams = [int(s) for s in args.streams.split(",") if s]
    PLAN.busy_pairs, PLAN.busy_ttft = args.busy_pairs, not args.no_busy_ttft
    WORK.mkdir(parents=True, exist_ok=True)
    if (WORK / "build-rss.json").exists():
        BUILD_RSS.update(json.loads((WORK / "build-rss.json").read_text()))

    measured = commit()  # at the start: others may commit while this runs
    # Not bench/engine.py's src: its export deletes that one.
    if not (WORK / "src" / "config.json").exists():
        run_build(
            "random weights",
            [
                sys.executable,
                "-c",
                f"from bench.engine import build_source; from pathlib import "
                f"Path; build_source(Path({str(WORK / 'src')!r}), {SHAPE!r})",
            ],
            cwd=ROOT,
        )
    source = build_source(WORK / "src", SHAPE)
    builds = Builds({p: ensure_export(source, p, args.rebuild, export_how) for p in precisions})
    notes: list[str] = []
    if "http" in args.engines:
        builds.plain, builds.plain_commit = ensure_plain_install(args.keep_plain_install)
    if "genai" in args.engines:
        try:
            python = ensure_genai_venv()
            for precision in [p for p in precisions if p in GENAI_PRECISIONS]:
                builds.genai[precision] = ensure_genai_model(
                    python, source, precision, args.rebuild
                )
        except (subprocess.CalledProcessError, OSError) as exc:
            notes.append(f"onnxruntime-genai unavailable: {exc}")
            say(notes[-1])
    if "llamacpp" in args.engines:
        try:
            python = ensure_llamacpp_venv()
            for precision in precisions:
                for kind in LLAMACPP_QUANTS[precision]:
                    builds.gguf[precision, kind] = ensure_gguf(python, source, kind, args.rebuild)
        except (subprocess.CalledProcessError, OSError) as exc:
            notes.append(f"llama.cpp unavailable: {exc}")
            say(notes[-1])
    if args.build_only:
        say("built: " + ", ".join(f"{k} {v:.0f} MB" for k, v in BUILD_RSS.items()))
        return 0
    before, how = read_bandwidth()
    say(f"read bandwidth {before:.1f} GB/s ({how})")

    closers: list[Callable[[], None]] = []
    try:
        peers = make_peers(args, PLAN, builds, closers)
        for peer in peers:
            forget_peak_rss(peer.pid)
            if peer.engine == "llamacpp":
                continue  # its worker read the GGUF's tensor sizes
            path = (
                builds.genai[peer.precision]
                if peer.engine == "genai"
                else builds.exports[peer.precision]
            )
            files = sorted(path.glob("*.onnx"))
            peer.floor_bytes = bytes_per_token(files[0])
        bandwidths = [before]
        rounds = measure_rounds(peers, args.rounds, args.budget_minutes * 60, bandwidths)
        after = bandwidths[-1]
        # Every figure is a median over the rounds, so the floor takes the median of the
        # readings around those same rounds. Not one reading (a run here read 16.0 GB/s before
        # and 22.9 after, and fp32 then decoded at 1.03-1.12 of its "floor"), and not the
        # highest: another run read 38.3-58.2 GB/s, and fp32, which only streams weights, then
        # decoded at 0.62 of the highest reading's floor, at 36 GB/s.
        bandwidth = statistics.median(bandwidths)
        rendered = table(peers, bandwidth)
        checks = targets(peers, bandwidth)
        rss = {id(p): peak_rss_mb(p.pid) for p in peers}  # before the processes end
    finally:
        for close in reversed(closers):
            close()
    import onnxruntime

    versions = f"onnxruntime {onnxruntime.__version__}" + "".join(
        f", {name} {version}" for name, version in sorted(VERSIONS.items())
    )
    print(f"commit {measured}; {describe_machine()}; {versions}")
    print(
        f"read bandwidth {bandwidth:.1f} GB/s ({how}; median of {len(bandwidths)} readings, "
        f"{min(bandwidths):.1f}-{max(bandwidths):.1f}: {before:.1f} before the rounds, "
        f"{after:.1f} after); {PLAN.tokens} tokens per stream, "
        f"{PLAN.prompt}-token prompts, greedy; median of {rounds} interleaved rounds"
    )
    shape = {k: v for k, v in SHAPES[SHAPE].items() if not k.endswith("token_id")}
    print(f"shape {SHAPE} (random weights): {json.dumps(shape)}; our exports: {export_how}")
    if BUILD_RSS:
        print(
            "build peak RSS (the builds this run used): "
            + ", ".join(f"{k} {v:.0f} MB" for k, v in BUILD_RSS.items())
        )
    for note in notes:
        print(note)
    print()
    print("How each peer ran:")
    print()
    for peer in ordered(peers):
        print(f"- {peer.label} {peer.precision}: {peer.settings}")
    for info in sorted(set(LLAMACPP_SYSTEM)):
        print(f"- llama.cpp's build: {info}")
    if SERVING:
        print()
        print("/ready `serving` of the plain install:")
        print()
        for model, serving in SERVING.items():
            print(f"- {model}: {json.dumps(serving)}")
    print()
    print(rendered)
    print()
    print("\n".join(checks))
    plot(peers, args.plot, bandwidth)
    results = {
        "commit": measured,
        "shape": SHAPE,
        "export": export_how,
        "build_peak_rss_mb": BUILD_RSS,
        "plain_install": builds.plain_commit,
        "serving": SERVING,
        "settings": {f"{p.label} {p.precision}": p.settings for p in peers},
        "peak_rss_mb": {f"{p.label} {p.precision}": rss[id(p)] for p in peers},
        "versions": VERSIONS,
        "llamacpp_system": sorted(set(LLAMACPP_SYSTEM)),
        "machine": describe_machine(),
        "bandwidth_gbs": bandwidth,
        "bandwidth_readings_gbs": bandwidths,
        "plan": PLAN.__dict__,
        "rounds": rounds,
        "peers": [
            {
                "engine": p.engine,
                "variant": p.variant,
                "precision": p.precision,
                "floor_bytes": p.floor_bytes,
                "results": p.results,
            }
            for p in peers
        ],
        "table": rendered,
        "targets": checks,
    }
    (WORK / "results.json").write_text(json.dumps(results, indent=1))
    say(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
