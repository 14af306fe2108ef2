"""Choose the int4 settings by measurement: decode speed of quantized variants of one model.

    .venv/bin/python bench/quantize.py [--tokens 32] [--rounds 3]

Quantizes the random Qwen2.5-0.5B-shaped export of `bench/engine.py` (built on first use) into
variants under bench/out/ (kept between runs), then times a bare ONNX Runtime greedy loop on each,
interleaved round by round (the shared 2-core machine drifts by tens of percent over minutes), and
prints the median, min and max tokens/s per variant (`bench/context.py --model DIR ...` times
the variants' dirs as the engine runs them, at 1 and 8 sequences). Divergence from fp32 is
measured on tiny models by `tests/engine/export/test_quantize.py` (a random 0.5B model has near-flat
logits: its greedy agreement would measure noise).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.export.quantize import Int4Config, quantize_int4, quantize_int8  # noqa: E402
from api.engine.model.causal_lm import OnnxCausalLM  # noqa: E402
from bench.engine import OUT, bare_loop, build_and_export  # noqa: E402

VARIANTS: dict[str, Int4Config | str | None] = {
    "fp32": None,
    "int8-dynamic": "int8",
    "int4-b32-a4-head8": Int4Config(block_size=32, accuracy_level=4, head_bits=8),
    "int4-b64-a4-head8": Int4Config(block_size=64, accuracy_level=4, head_bits=8),
    "int4-b128-a4-head8": Int4Config(block_size=128, accuracy_level=4, head_bits=8),
    "int4-b256-a4-head8": Int4Config(block_size=256, accuracy_level=4, head_bits=8),
    "int4-b128-a4-head8nbits": Int4Config(block_size=128, head_bits=8, head_dynamic=False),
    "int4-b32-a4-head4": Int4Config(block_size=32, accuracy_level=4, head_bits=4),
    "int4-b128-a4-head4": Int4Config(block_size=128, accuracy_level=4, head_bits=4),
    "int4-b32-a0-head8": Int4Config(block_size=32, accuracy_level=0, head_bits=8),
}


def make_variant(source: Path, name: str, config: Int4Config | str | None) -> Path:
    """A dir beside `source` whose graph is quantized as `config` says (reused if present)."""
    if config is None:
        return source
    out = OUT / f"variant-{name}"
    if (out / "model.onnx").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in source.iterdir():
        if not path.name.startswith("model.onnx"):
            shutil.copy2(path, out / path.name)
    started = time.perf_counter()
    if config == "int8":
        quantize_int8(out, source=source)
    else:
        quantize_int4(out, config, source=source)  # type: ignore[arg-type]
    size = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith("model.onnx"))
    print(f"{name}: quantized in {time.perf_counter() - started:.0f} s, {size / 1e6:.0f} MB")
    return out


def bare_decode(model: OnnxCausalLM, prompt: list[int], tokens: int) -> float:
    """Greedy decode tokens/s of bench/engine.py's bare loop over `tokens` steps (prefill
    excluded)."""
    return bare_loop(model, prompt, tokens + 1)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="variant names to run")
    args = parser.parse_args()
    source = build_and_export()
    names = args.only or list(VARIANTS)
    models = {}
    for name in names:
        path = make_variant(source, name, VARIANTS[name])
        models[name] = OnnxCausalLM(path, fuse_attention=False)  # a plain session.run loop
        bare_decode(models[name], list(range(3, 19)), 2)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            rates[name].append(bare_decode(models[name], list(range(3, 19)), args.tokens))
    print(f"\nbare ORT greedy loop, {args.tokens} tokens, {args.rounds} interleaved rounds")
    print(f"ORT {ort.__version__}\n")
    print("| variant | median tok/s | min | max |")
    print("|---|---:|---:|---:|")
    for name in names:
        r = rates[name]
        print(f"| {name} | {np.median(r):.1f} | {min(r):.1f} | {max(r):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
