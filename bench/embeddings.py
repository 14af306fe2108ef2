"""Embedding throughput: our API over HTTP against sentence-transformers' ONNX backend and
fastembed in process, on the same random weights, the same texts and the same threads.

Each shape is a BERT with bge-small's (384 wide, 12 layers) or bge-base's (768, 12) config,
random weights, CLS pooling and normalization (as bge), built as a sentence-transformers model
with the demo embedding tokenizer (`models/make_demo_embed.py`; its 2,048 ids instead of
30,522 change the embedding table, not the work a token costs). From that one source:

- ours: `tokenshop export-model --task embedding` (float32, and `--quantize int8`), served by
  `tokenshop serve` (its own process, a fresh SQLite database), `ENGINE_THREADS` = --threads;
  C clients at once each POST one request of T texts (base64, as the `openai` SDK asks);
- sentence-transformers `backend="onnx"`: its own export (`save_pretrained`), and its int8 one
  (`export_dynamic_quantized_onnx_model`, the CPU's best of avx512_vnni / avx2), `encode`
  at its default batch size (32; it sorts by length itself), intra-op threads = --threads;
- fastembed: the same ONNX files through `TextEmbedding.add_custom_model` (a local dir as
  `specific_model_path`), `embed` at --fastembed-batch (32; its default 256 held 23 GB at
  bge-base's shape), `threads` = --threads.

Texts have 16-512 tokens (uniform, seeded). Rounds interleave the engines; tokens/s is the
median round's. Also: the p50 latency of one short input (ours over HTTP, the peers in
process, timed in turns: `short_latencies`), int8 against float32 cosine (ours), and each
figure as a fraction of this CPU's float32 matrix-multiply peak (numpy's sgemm at --threads,
measured here).

    .venv/bin/python bench/embeddings.py [--shapes bge-small,bge-base] [--clients 32]
        [--texts 16] [--rounds 3] [--threads N] [--out bench/results/DATE-embeddings-HOST.md]

Builds go to `bench/out/embeddings-<shape>/` (git-ignored) and are reused.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.host import describe_cpu  # noqa: E402
from bench.load import local_server  # noqa: E402

OUT = ROOT / "bench" / "out"
SHAPES: dict[str, dict[str, int]] = {
    "bge-small": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=12, ffn=1536),
    "bge-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, ffn=3072),
}
SHORT = "How many tokens does a star buy?"


@dataclass
class Built:
    shape: str
    source: Path  # the sentence-transformers dir (torch weights)
    ours: Path  # our float32 export
    ours_int8: Path
    st_dir: Path  # sentence-transformers' own ONNX save (onnx/model.onnx, onnx/model_qint8_*.onnx)
    st_int8_file: str
    hidden: int
    layers: int
    ffn: int


@dataclass
class Arm:
    name: str
    precision: str
    rates: list[float] = field(default_factory=list)  # tokens/s a round
    latency: list[float] = field(default_factory=list)  # seconds, one short input


def make_demo_embed() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("mde", ROOT / "models" / "make_demo_embed.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def int8_target() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_vnni" if "avx512_vnni" in flags else "avx2"


def build(shape: str) -> Built:
    from api.engine.export.embedding import export_embedding

    dims = SHAPES[shape]
    base = OUT / f"embeddings-{shape}"
    source, ours, ours_int8, st_dir = (base / n for n in ("source", "ours", "ours-int8", "st"))
    target = int8_target()
    if not (source / "modules.json").exists():
        print(f"building {shape} (random weights)", file=sys.stderr)
        mde = make_demo_embed()
        tokenizer = mde.train_tokenizer()
        model = mde.build_model(
            "bert",
            tokenizer,
            hidden_size=dims["hidden_size"],
            num_hidden_layers=dims["num_hidden_layers"],
            num_attention_heads=dims["num_attention_heads"],
            intermediate_size=dims["ffn"],
            initializer_range=0.02,
        )
        mde.save_sentence_transformer(model, tokenizer, source, pooling="cls")
    for out, quantize in ((ours, None), (ours_int8, "int8")):
        if not (out / "model.onnx").exists():
            print(f"exporting {out.name}", file=sys.stderr)
            export_embedding(str(source), out, quantize)
    # sentence-transformers names the file by its weights' type: qint8 for avx512_vnni,
    # quint8 for avx2
    if not (existing := sorted(st_dir.glob(f"onnx/model_q*int8_{target}.onnx"))):
        from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

        print("exporting sentence-transformers' ONNX and int8", file=sys.stderr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = SentenceTransformer(str(source), backend="onnx", device="cpu")
            model.save_pretrained(str(st_dir))
            export_dynamic_quantized_onnx_model(model, target, str(st_dir))
        existing = sorted(st_dir.glob(f"onnx/model_q*int8_{target}.onnx"))
    st_int8_file = str(existing[0].relative_to(st_dir))
    return Built(
        shape,
        source,
        ours,
        ours_int8,
        st_dir,
        st_int8_file,
        dims["hidden_size"],
        dims["num_hidden_layers"],
        dims["ffn"],
    )


def make_texts(count: int, tokenizer_file: Path, seed: int = 0) -> list[str]:
    """`count` texts of 16-512 tokens each (uniform), from the demo corpus."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    words = " ".join(make_demo_embed()._make_demo().corpus(lines=3000, seed=seed)).split()
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        want = rng.randint(16, 512)
        start = rng.randrange(len(words) - 600)
        low, high = 1, 600  # the most words whose tokens (with <s> </s>) fit `want`
        while low < high:
            middle = (low + high + 1) // 2
            fits = len(tokenizer.encode(" ".join(words[start : start + middle])).ids) <= want
            low, high = (middle, high) if fits else (low, middle - 1)
        texts.append(" ".join(words[start : start + low]))
    return texts


def token_count(texts: Sequence[str], tokenizer_file: Path) -> int:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return sum(len(e.ids) for e in tokenizer.encode_batch(list(texts)))


def matmul_peak(threads: int, size: int = 1024, repeats: int = 20) -> float:
    """numpy's float32 GEMM rate here, in GFLOP/s (the best of `repeats`)."""
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def flops(lengths: Sequence[int], built: Built) -> float:
    """Multiply-adds x2 of the model over `lengths`: projections and attention's two products."""
    h, layers = built.hidden, built.layers
    per_token = 2 * layers * (4 * h * h + 2 * h * built.ffn)
    return sum(per_token * n + 4 * layers * n * n * h for n in lengths)


# --- the engines ---------------------------------------------------------------------------


async def _post_all(base_url: str, keys: list[str], model: str, batches: list[list[str]]) -> int:
    """Each batch from a client of its own, with its own key (a key has 8 requests in flight
    at most, `MAX_CONCURRENT_PER_KEY`)."""
    async with httpx.AsyncClient(
        base_url=base_url, timeout=600, limits=httpx.Limits(max_connections=len(batches))
    ) as client:

        async def one(key: str, texts: list[str]) -> int:
            body = {"model": model, "input": texts, "encoding_format": "base64"}
            headers = {"Authorization": f"Bearer {key}"}
            response = await client.post("/embeddings", json=body, headers=headers)
            response.raise_for_status()
            data = response.json()
            assert len(data["data"]) == len(texts)
            return int(data["usage"]["prompt_tokens"])

        calls = (one(keys[i % len(keys)], texts) for i, texts in enumerate(batches))
        return sum(await asyncio.gather(*calls))


def ours_round(
    base_url: str, keys: list[str], model: str, batches: list[list[str]]
) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = asyncio.run(_post_all(base_url, keys, model, batches))
    return tokens, time.perf_counter() - start


def ours_vectors(base_url: str, key: str, model: str, texts: list[str]) -> np.ndarray:
    response = httpx.post(
        f"{base_url}/embeddings",
        json={"model": model, "input": texts, "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=600,
    )
    response.raise_for_status()
    rows = [base64.b64decode(item["embedding"]) for item in response.json()["data"]]
    return np.array([np.frombuffer(row, dtype="<f4") for row in rows])


def ours_short(client: httpx.Client, base_url: str, model: str) -> Callable[[], Any]:
    body = {"model": model, "input": SHORT, "encoding_format": "base64"}
    return lambda: client.post(f"{base_url}/embeddings", json=body).raise_for_status()


def st_model(built: Built, int8: bool, threads: int) -> Any:
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    kwargs: dict[str, Any] = {
        "session_options": options,
        "provider": "CPUExecutionProvider",
        "file_name": built.st_int8_file if int8 else "onnx/model.onnx",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return SentenceTransformer(
            str(built.st_dir), backend="onnx", device="cpu", model_kwargs=kwargs
        )


def fastembed_model(built: Built, int8: bool, threads: int) -> Any:
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    name = f"tokenshop-bench/{built.shape}{'-int8' if int8 else ''}"
    if name not in {m["model"] for m in TextEmbedding.list_supported_models()}:
        TextEmbedding.add_custom_model(
            model=name,
            pooling=PoolingType.CLS,
            normalization=True,
            sources=ModelSource(hf=name),
            dim=built.hidden,
            model_file=built.st_int8_file if int8 else "onnx/model.onnx",
        )
    return TextEmbedding(model_name=name, specific_model_path=str(built.st_dir), threads=threads)


def in_process(encode: Callable[[list[str]], Any], texts: list[str]) -> float:
    start = time.perf_counter()
    encode(texts)
    return time.perf_counter() - start


def short_latencies(
    calls: dict[tuple[str, str], Callable[[], Any]], repeats: int, block: int = 10
) -> dict[tuple[str, str], list[float]]:
    """Each engine's time for one short input, `repeats` times, in blocks of `block` calls that
    take turns (each block after one untimed call): every engine keeps its own weights in cache
    within a block, as in a loop of its own, while the host's drift over the minutes this takes
    falls on all of them alike rather than on whichever ran last."""
    times: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    while any(len(t) < repeats for t in times.values()):
        for key, call in calls.items():
            call()
            for _ in range(min(block, repeats - len(times[key]))):
                start = time.perf_counter()
                call()
                times[key].append(time.perf_counter() - start)
    return times


# --- one shape -----------------------------------------------------------------------------


def run_shape(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    built = build(shape)
    tokenizer_file = built.ours / "tokenizer.json"
    texts = make_texts(args.clients * args.texts, tokenizer_file)
    batches = [texts[i * args.texts : (i + 1) * args.texts] for i in range(args.clients)]
    tokens = token_count(texts, tokenizer_file)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    work = flops([len(e.ids) for e in tok.encode_batch(texts)], built)

    st32, st8 = st_model(built, False, args.threads), st_model(built, True, args.threads)
    fe32, fe8 = (
        fastembed_model(built, False, args.threads),
        fastembed_model(built, True, args.threads),
    )
    peers: dict[tuple[str, str], Callable[[list[str]], Any]] = {
        ("sentence-transformers onnx", "float32"): lambda t: st32.encode(t, batch_size=32),
        ("sentence-transformers onnx", "int8"): lambda t: st8.encode(t, batch_size=32),
        ("fastembed", "float32"): lambda t: list(fe32.embed(t, batch_size=args.fastembed_batch)),
        ("fastembed", "int8"): lambda t: list(fe8.embed(t, batch_size=args.fastembed_batch)),
    }
    arms = {key: Arm(*key) for key in [("ours (HTTP)", "float32"), ("ours (HTTP)", "int8")]}
    arms.update({key: Arm(*key) for key in peers})
    models = f"f32={built.ours},int8={built.ours_int8}"
    settings = {"ENGINE_THREADS": str(args.threads), "ENGINE_CACHE_DIR": ""}
    with local_server(args.clients, 10**12, models=models, settings=settings) as server:
        keys, key = server.keys, server.keys[0]
        url = server.base_url
        ours_round(url, keys, "f32", batches[:2])  # warm both
        ours_round(url, keys, "int8", batches[:2])
        for encode in peers.values():
            encode(texts[:8])
        order = list(arms)
        for round_ in range(args.rounds):
            print(f"{shape}: round {round_ + 1}/{args.rounds}", file=sys.stderr)
            shift = round_ % len(order)  # each arm leads in turn: the host drifts within a round
            for arm_key in order[shift:] + order[:shift]:
                if arm_key[0].startswith("ours"):
                    model = "f32" if arm_key[1] == "float32" else "int8"
                    counted, seconds = ours_round(url, keys, model, batches)
                    assert counted == tokens, (counted, tokens)
                else:
                    seconds = in_process(peers[arm_key], texts)
                arms[arm_key].rates.append(tokens / seconds)
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
            calls = {
                ("ours (HTTP)", "float32"): ours_short(client, url, "f32"),
                ("ours (HTTP)", "int8"): ours_short(client, url, "int8"),
            }
            calls.update({k: partial(encode, [SHORT]) for k, encode in peers.items()})
            for arm_key, times in short_latencies(calls, args.single).items():
                arms[arm_key].latency = times
        sample = texts[:64]
        ours32 = ours_vectors(url, key, "f32", sample)
        ours8 = ours_vectors(url, key, "int8", sample)
    reference = st32.encode(sample, batch_size=32)
    return {
        "shape": shape,
        "built": built,
        "tokens": tokens,
        "texts": len(texts),
        "flops": work,
        "arms": arms,
        "int8_cosine": float((ours8 * ours32).sum(1).min()),
        "vs_st_cosine": float((ours32 * reference).sum(1).min()),
    }


# --- the report ----------------------------------------------------------------------------


def report(results: list[dict[str, Any]], args: argparse.Namespace, peak: float) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    lines = [
        f"# Embeddings: our HTTP API against sentence-transformers (ONNX) and fastembed "
        f"({time.strftime('%Y-%m-%d')}, {commit})",
        "",
        f"Host: {describe_cpu()}. Every engine at {args.threads} intra-op threads. "
        f"numpy float32 GEMM peak here: {peak:.0f} GFLOP/s.",
        f"Workload: {args.clients} clients x {args.texts} texts of 16-512 tokens (uniform), "
        f"{args.rounds} interleaved rounds, medians. Command: `.venv/bin/python "
        f"bench/embeddings.py {' '.join(sys.argv[1:])}`.",
        "",
    ]
    for result in results:
        arms: dict[tuple[str, str], Arm] = result["arms"]
        lines += [
            f"## {result['shape']} ({result['built'].hidden} wide, {result['built'].layers} "
            f"layers), {result['texts']} texts, {result['tokens']:,} tokens",
            "",
            "| engine | precision | tokens/s (median) | rounds | of GEMM peak "
            "| one short input p50 |",
            "|---|---|---|---|---|---|",
        ]
        for arm in arms.values():
            rate = statistics.median(arm.rates)
            share = rate / result["tokens"] * result["flops"] / 1e9 / peak
            rounds = ", ".join(f"{r:,.0f}" for r in arm.rates)
            p50 = statistics.median(arm.latency) * 1000
            lines.append(
                f"| {arm.name} | {arm.precision} | {rate:,.0f} | {rounds} | {share:.0%} | "
                f"{p50:.1f} ms |"
            )
        lines += ["", *verdicts(arms), ""]
        lines += [
            f"Ours, int8 against float32 (64 texts): lowest cosine {result['int8_cosine']:.5f}; "
            f"ours float32 against sentence-transformers' ONNX float32: "
            f"{result['vs_st_cosine']:.6f}.",
            "",
        ]
    return "\n".join(lines)


def verdicts(arms: dict[tuple[str, str], Arm]) -> list[str]:
    """Ours against the best peer of each round (the median of those ratios: a drift of the
    host between rounds cancels), and of the medians."""

    def rate(key: tuple[str, str]) -> float:
        return statistics.median(arms[key].rates)

    out = []
    for precision in ("float32", "int8"):
        peers = [k for k in arms if k[1] == precision and not k[0].startswith("ours")]
        best = max(peers, key=rate)
        ours = arms[("ours (HTTP)", precision)].rates
        per_round = [ours[i] / max(arms[peer].rates[i] for peer in peers) for i in range(len(ours))]
        ratio = statistics.median(per_round)
        verdict = "met" if ratio >= 1.3 else "not met"
        out.append(
            f"- {precision}: ours over HTTP {ratio:.2f}x the round's best peer (median of "
            f"{', '.join(f'{r:.2f}' for r in per_round)}; of the medians "
            f"{rate(('ours (HTTP)', precision)) / rate(best):.2f}x {best[0]}); "
            f"target 1.3x: {verdict}."
        )
    for precision in ("float32", "int8"):  # each precision against its own peers
        peer, peer_p50 = min(
            (
                (k, statistics.median(arm.latency))
                for k, arm in arms.items()
                if k[1] == precision and not k[0].startswith("ours")
            ),
            key=lambda item: item[1],
        )
        ours_p50 = statistics.median(arms[("ours (HTTP)", precision)].latency)
        ratio = ours_p50 / peer_p50
        out.append(
            f"- one short input, {precision}: ours over HTTP {ours_p50 * 1000:.1f} ms, "
            f"{ratio:.2f}x {peer[0]}'s in-process p50; "
            f"target within 1.5x: {'met' if ratio <= 1.5 else 'not met'}."
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="bge-small,bge-base")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--texts", type=int, default=16, help="texts a client's request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--single", type=int, default=30, help="short-input calls timed, per engine"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, help="write the results file here too")
    parser.add_argument(
        "--fastembed-batch",
        type=int,
        default=32,
        help="fastembed's batch (its default, 256, pads every text of a batch to its longest "
        "and holds their attention scores at once: 128 texts of up to 512 tokens ran a 23 GB "
        "host out of memory at bge-small's and at bge-base's shape; 32 is "
        "sentence-transformers' default)",
    )
    args = parser.parse_args(argv)
    peak = matmul_peak(args.threads)
    results = []
    for shape in args.shapes.split(","):  # written after each shape: a later one may fail
        results.append(run_shape(shape, args))
        text = report(results, args, peak)
        if args.out:
            args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
