"""A worker of `bench/compare.py`: onnxruntime-genai's generation loop on one of its models.

    bench/out/genai-venv/bin/python bench/compare_genai.py GENAI_MODEL_DIR [--threads N]

Runs in its own venv (onnxruntime-genai's builder needs transformers 5, which conflicts with
our export stack), so it imports nothing from this project: the orchestrator sends the prompt
token ids. One JSON command per stdin line, one `@@`-prefixed JSON reply per line on stdout.
Generation is greedy, and `min_length` keeps a random model from stopping at an EOS early, so
every run generates exactly the tokens asked for. Concurrent streams use genai's static
batching (one generator, `batch_size` equal-length prompts): it has no continuous batching.

`--threads N` sets ONNX Runtime's `intra_op_num_threads` in the decoder's session options (an
overlay of `genai_config.json`, which the builder leaves at ONNX Runtime's default): genai's
docs recommend the physical core count on CPU, and on a Zen 4 host with 2 cores it made 61-70
int4 tok/s one stream with 2 threads where the default had reported 46-49.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og


def generate(model: og.Model, ids: list[list[int]], tokens: int) -> dict[str, float]:
    """Greedy generation of `tokens` tokens for each row of `ids` (one batch).

    Returns the time to the first token, the decode rate per stream (tokens 2..N over the time
    since token 1, as for our engine) and the aggregate rate (all tokens over the wall time)."""
    batch, length = len(ids), len(ids[0])
    params = og.GeneratorParams(model)
    params.set_search_options(
        do_sample=False, batch_size=batch, max_length=length + tokens, min_length=length + tokens
    )
    started = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(ids, dtype=np.int32))
    generator.generate_next_token()
    first = time.perf_counter()
    count = 1
    while count < tokens and not generator.is_done():
        generator.generate_next_token()
        count += 1
    end = time.perf_counter()
    del generator
    per = (count - 1) / (end - first) if count > 1 else 0.0
    return {"ttft": first - started, "per": per, "agg": batch * count / (end - started)}


def handle(model: og.Model, command: dict[str, Any]) -> dict[str, Any]:
    if command["op"] == "generate":
        return generate(model, command["ids"], command["tokens"])
    raise ValueError(f"unknown op {command['op']!r}")


def load(path: str, threads: int | None) -> tuple[og.Model, dict[str, Any]]:
    """The model, with `intra_op_num_threads` overlaid on its session options when given;
    the session options it runs with."""
    config = og.Config(path)
    settings = json.loads(Path(path, "genai_config.json").read_text())["model"]["decoder"]
    options = {k: v for k, v in settings.get("session_options", {}).items() if "thread" in k}
    if threads:
        options["intra_op_num_threads"] = threads
        overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
        config.overlay(json.dumps(overlay))
    return og.Model(config), options or {"intra_op_num_threads": "ONNX Runtime's default"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, help="intra_op_num_threads (default: ORT's)")
    args = parser.parse_args()
    model, settings = load(args.model, args.threads)
    hello = {"ready": True, "version": og.__version__, "settings": settings}
    print("@@" + json.dumps(hello), flush=True)
    for line in sys.stdin:
        try:
            reply = handle(model, json.loads(line))
        except Exception as exc:  # reported to the orchestrator, which decides
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print("@@" + json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
