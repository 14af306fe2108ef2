"""Benchmark the engine on a random-weight model with Qwen2.5-0.5B's shape (issue 3).

    .venv/bin/python bench/engine.py [--tokens 48] [--threads N]
    .venv/bin/python bench/engine.py --mode rates|latency [--model DIR] [--rounds 3]

Builds the model from a config (no hub), exports it once with optimum-onnx into bench/out/
(git-ignored; ~70 s, ~5.5 GB peak), then on that one ONNX file measures, in one run:

- a bare ONNX Runtime greedy loop on the graph as exported (prefill, then argmax + feed
  `present` back): the floor of any loop on that graph;
- the engine with 1, 4, 8, 16 concurrent greedy streams: per-stream and aggregate tokens/s;
- Optimum's `ORTModelForCausalLM.generate` (greedy);
- time to first token for a 512-token prompt, engine vs bare vs Optimum.

Decode rates exclude the prefill (tokens 2..N over the time since token 1); aggregate rates are
all tokens over the wall time from submitting the first request to the end of the last. Figures
drift run to run on a shared 2-core machine; ratios within one run are what the targets compare.

The other modes repeat their variants round by round (so drift hits each alike) and print medians:
`rates` times the bare loop against the engine with 1 and 8 streams; `latency` times the first
token of a 512-token prompt on an idle engine and with 8 streams running, and the worst gap
between two tokens of a running stream while a 2,000-token prompt joins, prefilled in chunks of
`max_prefill_tokens` or in one call. `--model` picks another export (e.g. a quantized variant
made by bench/quantize.py); BENCH_ENGINE_ROOT=<checkout> measures another checkout's engine (a
git worktree of an older commit) with this same harness.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.environ.get("BENCH_ENGINE_ROOT", str(ROOT)))

from api.engine.local_engine import LocalEngine  # noqa: E402
from api.engine.model.causal_lm import OnnxCausalLM  # noqa: E402
from api.engine.model.spec import LOGITS_POSITIONS  # noqa: E402
from api.engine.ops.library import preferred_library  # noqa: E402
from api.engine.protocol import GenerationRequest, SamplingParams  # noqa: E402
from api.engine.runtime.scheduler import SchedulerLimits  # noqa: E402

OUT = ROOT / "bench" / "out"
EXPORT_DIR = OUT / "qwen2.5-0.5b-shape"
QWEN_SHAPE = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    bos_token_id=0,
    eos_token_id=2,
)
# The shapes `bench/compare.py --shape` measures: each model's real config (as its config.json
# on the hub has it; written here, no hub), random weights. Token ids are the demo tokenizer's
# (models/demo: 2,048 ids, within every vocabulary here; its <|endoftext|> 0 and <|im_end|> 2
# stand for the real BOS/EOS, and prompts are token ids anyway): the embedding and head keep
# the real vocabulary's size, which is what decode reads.
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": {"model_type": "qwen2", **QWEN_SHAPE},
    "qwen2.5-1.5b": {  # Qwen2.5-1.5B-Instruct's config.json
        "model_type": "qwen2",
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 0,
        "eos_token_id": 2,
    },
    "llama-3.2-3b": {  # Llama-3.2-3B-Instruct's config.json
        "model_type": "llama",
        "hidden_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 2,
    },
}
DEFAULT_SHAPE = "qwen2.5-0.5b"
INIT_STD = 0.02  # transformers' initializer_range for both families: N(0, 0.02) weights


def shape_config(shape: str, **overrides):  # noqa: ANN201 - a transformers PretrainedConfig
    """The transformers config of `shape` (Qwen2Config or LlamaConfig)."""
    from transformers import LlamaConfig, Qwen2Config

    spec = {k: v for k, v in SHAPES[shape].items() if k != "model_type"} | overrides
    kind = {"qwen2": Qwen2Config, "llama": LlamaConfig}[SHAPES[shape]["model_type"]]
    return kind(**spec)


def _copy_tokenizer(src: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(ROOT / "models" / "demo" / name, src / name)
    shutil.copy2(ROOT / "models" / "demo" / "chat_template.jinja", src / "chat_template.jinja")


def build_source(src: Path = OUT / "src", shape: str = DEFAULT_SHAPE) -> Path:
    """The random-weight transformers dir of `shape` (seeded, tokenizer from models/demo), built
    once.

    Kept apart from the export so other tools (bench/compare.py hands it to onnxruntime-genai's
    model builder and llama.cpp's GGUF conversion) start from the very same weights. The 0.5B
    shape is made as it always was (transformers' own init, seed 0); the larger ones are written
    tensor by tensor (`write_random_weights`), so a 3B model's 12.8 GB of fp32 is never in
    memory at once."""
    if (src / "config.json").exists() and (src / "tokenizer.json").exists():
        return src
    shutil.rmtree(src, ignore_errors=True)
    if shape != DEFAULT_SHAPE:
        print(f"writing a random {shape}-shaped model ...", flush=True)
        src.mkdir(parents=True)
        config = shape_config(shape)
        write_random_weights(config, src)
        _copy_tokenizer(src)
        return src
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    print("building a random Qwen2.5-0.5B-shaped model ...", flush=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN_SHAPE))
    model.generation_config.eos_token_id = [2]
    model.save_pretrained(src)
    del model
    gc.collect()
    _copy_tokenizer(src)
    return src


def parameter_shapes(config) -> dict[str, tuple[int, ...]]:  # noqa: ANN001
    """transformers' parameter names and shapes for a Qwen2 or Llama config (tied head: none)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    bias = config.model_type == "qwen2"  # Qwen2 has q/k/v biases; Llama 3.2 none
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes[p + f"self_attn.{name}.weight"] = (rows, hidden)
            if bias:
                shapes[p + f"self_attn.{name}.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, q)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def write_random_weights(config, src: Path, seed: int = 0, shard_bytes: int = 2 << 30) -> None:  # noqa: ANN001
    """`config` as a transformers dir with random weights, written shard by shard: N(0, 0.02)
    matrices and embedding, zero biases, unit norms (transformers' init), one numpy generator
    seeded `seed`. Peak memory is one shard (`shard_bytes`), not the model."""
    import json

    from safetensors.numpy import save_file

    # As a model's save_pretrained writes it: onnxruntime-genai's builder picks its code by it.
    config.architectures = [
        {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[config.model_type]
    ]
    config.save_pretrained(src)
    rng = np.random.default_rng(seed)
    shapes = parameter_shapes(config)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * 4
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map = {}
    for index, names in enumerate(shards, 1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            shape = shapes[name]
            if name.endswith("norm.weight"):
                tensors[name] = np.ones(shape, np.float32)
            elif name.endswith(".bias"):
                tensors[name] = np.zeros(shape, np.float32)
            else:
                tensors[name] = rng.standard_normal(shape, dtype=np.float32)
                tensors[name] *= INIT_STD
            weight_map[name] = file
        save_file(tensors, str(src / file), metadata={"format": "pt"})
        del tensors
    total = sum(int(np.prod(s)) * 4 for s in shapes.values())
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (src / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=1))
    generation = {"bos_token_id": 0, "eos_token_id": [2], "do_sample": False}
    (src / "generation_config.json").write_text(json.dumps(generation, indent=1))


def build_and_export() -> Path:
    if (EXPORT_DIR / "model.onnx").exists():
        return EXPORT_DIR
    from optimum.exporters.onnx import main_export

    src = build_source()
    print("exporting with optimum-onnx ...", flush=True)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main_export(str(src), EXPORT_DIR, task="text-generation-with-past", do_validation=False)
    print(f"exported in {time.perf_counter() - started:.0f} s", flush=True)
    shutil.rmtree(src)
    return EXPORT_DIR


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 2000, size=length).tolist()


def plain_model(path: Path, threads: int | None, cache_dir: Path | None = None) -> OnnxCausalLM:
    """The export's graph as exported (only the last-position-logits edit): the bare loop's."""
    return OnnxCausalLM(path, threads=threads, cache_dir=cache_dir, fuse_attention=False)


def bare_loop(model: OnnxCausalLM, ids: list[int], tokens: int) -> tuple[float, float]:
    """The floor of any loop on the exported graph: greedy, feeding `present` back, no batching
    machinery. Returns (ttft, decode tok/s)."""
    session, spec = model.session, model.spec
    names = ["logits", *spec.present_names]
    started = time.perf_counter()
    n = len(ids)
    feed = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, n), np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
    }
    feed.update(zip(spec.past_names, model.empty_past(1), strict=True))
    logits_positions = {LOGITS_POSITIONS: np.ones(1, np.int64)} if model.logits_positions else {}
    feed.update(logits_positions)
    logits, *past = session.run(names, feed)
    token = int(np.argmax(logits[0, -1]))
    first = time.perf_counter()
    for step in range(tokens - 1):
        length = n + step
        feed = {
            "input_ids": np.array([[token]], np.int64),
            "attention_mask": np.ones((1, length + 1), np.int64),
            "position_ids": np.array([[length]], np.int64),
        }
        feed.update(zip(spec.past_names, past, strict=True))
        feed.update(logits_positions)
        logits, *past = session.run(names, feed)
        token = int(np.argmax(logits[0, -1]))
    end = time.perf_counter()
    return first - started, (tokens - 1) / (end - first)


async def engine_streams(engine: LocalEngine, streams: int, tokens: int, prompt_len: int):
    """Run `streams` concurrent greedy requests: (per-stream decode tok/s, aggregate, ttft)."""

    async def one(i: int) -> tuple[float, float, float, int]:
        submitted = time.perf_counter()
        request = GenerationRequest(
            f"s{i}", prompt(prompt_len, seed=i), SamplingParams(max_tokens=tokens, temperature=0)
        )
        first = last = 0.0
        count = 0
        async for output in engine.generate(request):
            count = output.completion_tokens
            last = time.perf_counter()
            if count == 1:
                first = last
        return submitted, first, last, count

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - started
    per_stream = [(c - 1) / (last - first) for _, first, last, c in results if c > 1] or [0.0]
    total = sum(c for *_, c in results)
    ttft = float(np.mean([first - sub for sub, first, _, _ in results]))
    return float(np.mean(per_stream)), total / wall, ttft


def optimum_generate(
    path: Path, ids: list[int], long_ids: list[int], tokens: int, threads: int | None
) -> tuple[float, float]:
    """Optimum's generate on the same file: (decode tok/s, time to first token for `long_ids`)."""
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ORTModelForCausalLM.from_pretrained(path, session_options=options)

    def run(prompt_ids: list[int], n: int) -> float:
        input_ids = torch.tensor([prompt_ids])
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
            )
        return time.perf_counter() - started

    run(ids, 2)  # warm-up
    first = run(ids, 1)
    rate = (tokens - 1) / (run(ids, tokens) - first)
    ttft = min(run(long_ids, 1) for _ in range(2))
    return rate, ttft


async def _consume(stream, times: list[float]) -> None:
    async for _ in stream:
        times.append(time.perf_counter())


async def _running_streams(engine: LocalEngine, count: int) -> tuple[list, list[list[float]]]:
    """`count` long greedy streams, returned once each has its second token."""
    streams: list = []
    times: list[list[float]] = []
    for i in range(count):
        request = GenerationRequest(
            f"run{i}-{time.monotonic_ns()}",
            prompt(16, seed=i),
            SamplingParams(max_tokens=100_000, temperature=0),
        )
        streams.append(engine.generate(request))
        times.append([])
    tasks = [asyncio.create_task(_consume(s, t)) for s, t in zip(streams, times, strict=True)]
    while min(len(t) for t in times) < 2:
        await asyncio.sleep(0.005)
    return tasks, times


async def _first_token(engine: LocalEngine, ids: list[int]) -> float:
    """Seconds from submitting `ids` until its first token arrives."""
    started = time.perf_counter()
    request = GenerationRequest(f"p{time.monotonic_ns()}", ids, SamplingParams(max_tokens=1))
    async for _ in engine.generate(request):
        break
    return time.perf_counter() - started


async def ttft_with_running(engine: LocalEngine, running: int, prompt_len: int) -> float:
    """Time to first token of a `prompt_len` prompt while `running` streams decode."""
    tasks, _ = await _running_streams(engine, running) if running else ([], [])
    ttft = await _first_token(engine, prompt(prompt_len, seed=99))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return ttft


async def gap_while_joining(
    engine: LocalEngine, prompt_len: int, chunk: int
) -> tuple[float, float]:
    """(worst gap between two tokens of a running stream while a `prompt_len` prompt joins,
    prefilled `chunk` tokens per iteration; that prompt's time to first token)."""
    scheduler = engine.scheduler
    scheduler.limits = dataclasses.replace(scheduler.limits, max_prefill_tokens=chunk)
    tasks, (times,) = await _running_streams(engine, 1)
    joined = time.perf_counter()
    ttft = await _first_token(engine, prompt(prompt_len, seed=98))
    seen = len(times)
    while len(times) < seen + 2:  # the gap that spans the join's end is counted too
        await asyncio.sleep(0.005)
    tasks[0].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    before = [t for t in times if t < joined][-1:]
    window = before + [t for t in times if t >= joined]
    return float(np.max(np.diff(window))), ttft


def _median_table(title: str, rows: dict[str, list[float]], unit: str) -> None:
    print(f"\n| {title} | median {unit} | min | max | runs |\n|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        print(
            f"| {name} | {np.median(values):.3f} | {min(values):.3f} | {max(values):.3f} "
            f"| {len(values)} |"
        )


async def rates_mode(
    engine: LocalEngine, plain: OnnxCausalLM, rounds: int, tokens: int, prompt_len: int
) -> None:
    """Bare loop vs engine with 1 and 8 streams, interleaved round by round."""
    rows: dict[str, list[float]] = {"bare loop": [], "engine 1 stream": [], "engine 8 streams": []}
    await engine_streams(engine, 1, 4, prompt_len)  # warm-up
    for _ in range(rounds):
        rows["bare loop"].append(bare_loop(plain, prompt(prompt_len, 0), tokens)[1])
        # Like the bare loop's, the one-stream figure counts tokens 2..N (prefill excluded).
        rows["engine 1 stream"].append((await engine_streams(engine, 1, tokens, prompt_len))[0])
        rows["engine 8 streams"].append((await engine_streams(engine, 8, tokens, prompt_len))[1])
        print({k: round(v[-1], 2) for k, v in rows.items()}, flush=True)
    _median_table("decode (8 streams: aggregate)", rows, "tok/s")


async def latency_mode(engine: LocalEngine, rounds: int, long_prompt: int, chunk: int) -> None:
    """TTFT of a 512-token prompt idle and beside 8 streams; gaps while a long prompt joins."""
    ttft: dict[str, list[float]] = {"idle": [], "8 streams running": []}
    gaps: dict[str, list[float]] = {f"chunks of {chunk}": [], "one call": []}
    joined_ttft: dict[str, list[float]] = {name: [] for name in gaps}
    await ttft_with_running(engine, 0, 16)  # warm-up
    for _ in range(rounds):
        ttft["idle"].append(await ttft_with_running(engine, 0, 512))
        ttft["8 streams running"].append(await ttft_with_running(engine, 8, 512))
        for name, size in zip(gaps, (chunk, long_prompt), strict=True):
            if long_prompt:
                gap, first = await gap_while_joining(engine, long_prompt, size)
                gaps[name].append(gap)
                joined_ttft[name].append(first)
        print({k: round(v[-1], 3) for k, v in {**ttft, **gaps}.items() if v}, flush=True)
    _median_table("time to first token, 512-token prompt", ttft, "s")
    if not long_prompt:
        return
    _median_table(f"worst inter-token gap while a {long_prompt}-token prompt joins", gaps, "s")
    _median_table(f"time to first token of that {long_prompt}-token prompt", joined_ttft, "s")


def served_engine(path: Path, threads: int | None) -> LocalEngine:
    """The engine as the server builds it here: our int4 op where this CPU runs it (an int4
    export on ONNX Runtime's `MatMulNBits` prefilled a 512-token prompt in 1.42 s, ours 0.38)."""
    return LocalEngine(
        "bench",
        path,
        limits=SchedulerLimits(max_active_sequences=16),
        threads=threads,
        ops_library=preferred_library(),
    )


def run_mode(args: argparse.Namespace, path: Path) -> None:
    engine = served_engine(path, args.threads)
    chunk = engine.scheduler.limits.max_prefill_tokens
    print(f"model {path}, engine from {os.environ.get('BENCH_ENGINE_ROOT', ROOT)}", flush=True)

    async def go() -> None:
        await engine.start()
        try:
            if args.mode == "rates":
                plain = plain_model(path, args.threads)
                await rates_mode(engine, plain, args.rounds, args.tokens, args.prompt)
            else:
                await latency_mode(engine, args.rounds, args.long_prompt, chunk)
        finally:
            await engine.shutdown()

    asyncio.run(go())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per stream")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per stream")
    parser.add_argument("--threads", type=int, default=None, help="ORT intra-op threads")
    parser.add_argument("--mode", choices=("all", "rates", "latency"), default="all")
    parser.add_argument("--model", type=Path, default=None, help="export dir (default: fp32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the rates/latency modes")
    parser.add_argument(
        "--long-prompt", type=int, default=2000, help="latency: prompt that joins (0: skip)"
    )
    args = parser.parse_args()
    path = args.model or build_and_export()
    if args.mode != "all":
        run_mode(args, path)
        return 0

    engine = served_engine(path, args.threads)
    long_prompt = prompt(512, seed=99)
    plain = plain_model(path, args.threads)

    async def run_engine() -> dict:
        await engine.start()
        try:
            await engine_streams(engine, 1, 4, args.prompt)  # warm-up
            bare_loop(plain, prompt(args.prompt, 0), 4)
            out: dict = {"bare": [], "one": []}
            # Other work on a shared machine shifts speed over minutes: interleave the bare loop
            # and the one-stream engine runs and compare medians.
            for _ in range(3):
                out["bare"].append(bare_loop(plain, prompt(args.prompt, 0), args.tokens)[1])
                out["one"].append(await engine_streams(engine, 1, args.tokens, args.prompt))
            print(f"bare {out['bare']}\nengine x1 {out['one']}", flush=True)
            for streams in (4, 8, 16):
                out[streams] = await engine_streams(engine, streams, args.tokens, args.prompt)
                print(f"engine x{streams}: {out[streams]}", flush=True)
            out["ttft"] = min([(await engine_streams(engine, 1, 1, 512))[2] for _ in range(2)])
            return out
        finally:
            await engine.shutdown()

    results = asyncio.run(run_engine())
    bare_rate = float(np.median(results["bare"]))
    results[1] = tuple(np.median(np.array(results["one"]), axis=0))
    bare_ttft = min(bare_loop(plain, long_prompt, 1)[0] for _ in range(2))
    engine.model.session = plain.session = None  # type: ignore[assignment]  # memory for Optimum
    gc.collect()
    opt_rate, opt_ttft_512 = optimum_generate(
        path, prompt(args.prompt, 0), long_prompt, args.tokens, args.threads
    )

    one_stream_agg = results[1][1]
    print()
    print(f"model: random Qwen2.5-0.5B shape, fp32, {path}")
    print(f"{args.tokens} tokens per stream, {args.prompt}-token prompts, greedy")
    print("bare loop and 1-stream engine: median of 3 interleaved runs")
    print()
    print("| run | per-stream tok/s | aggregate tok/s | vs 1 stream |")
    print("|---|---:|---:|---:|")
    print(f"| bare ONNX Runtime loop | {bare_rate:.2f} | {bare_rate:.2f} | |")
    print(f"| Optimum generate | {opt_rate:.2f} | {opt_rate:.2f} | |")
    for streams in (1, 4, 8, 16):
        per, agg, _ = results[streams]
        print(
            f"| engine, {streams} stream{'s' if streams > 1 else ''} | {per:.2f} | {agg:.2f} "
            f"| {agg / one_stream_agg:.2f}x |"
        )
    print()
    print("| time to first token, 512-token prompt | s |")
    print("|---|---:|")
    print(f"| bare ONNX Runtime | {bare_ttft:.3f} |")
    print(f"| Optimum generate (1 token) | {opt_ttft_512:.3f} |")
    print(f"| engine | {results['ttft']:.3f} |")
    print()
    print(f"engine 1 stream / bare loop: {results[1][0] / bare_rate:.3f}")
    print(f"engine 1 stream / Optimum:   {results[1][0] / opt_rate:.3f}")
    print(f"engine 8 streams aggregate / 1 stream: {results[8][1] / one_stream_agg:.2f}x")
    print(f"engine TTFT / Optimum TTFT (512): {results['ttft'] / opt_ttft_512:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
