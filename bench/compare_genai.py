"""A worker of `bench/compare.py`: onnxruntime-genai's generation loop on one of its models.

    bench/out/genai-venv/bin/python bench/compare_genai.py GENAI_MODEL_DIR

Runs in its own venv (onnxruntime-genai's builder needs transformers 5, which conflicts with
our export stack), so it imports nothing from this project: the orchestrator sends the prompt
token ids. One JSON command per stdin line, one `@@`-prefixed JSON reply per line on stdout.
Generation is greedy, and `min_length` keeps a random model from stopping at an EOS early, so
every run generates exactly the tokens asked for. Concurrent streams use genai's static
batching (one generator, `batch_size` equal-length prompts): it has no continuous batching.
"""

from __future__ import annotations

import json
import sys
import time
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


def main() -> int:
    model = og.Model(sys.argv[1])
    print("@@" + json.dumps({"ready": True, "version": og.__version__}), flush=True)
    for line in sys.stdin:
        try:
            reply = handle(model, json.loads(line))
        except Exception as exc:  # reported to the orchestrator, which decides
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print("@@" + json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
