"""Constrained decoding's cost: decode tokens/s with every stream under a JSON schema against
none, and the compile time of a 20-field schema (issue 29).

    .venv/bin/python bench/constrained.py [--model DIR] [--tokens 128] [--rounds 5] [--out FILE]

Both variants sample at temperature 1 with the same seeds and run exactly `--tokens` tokens per
stream: the schema (an array of at least 1,000 objects) cannot be complete sooner, so the two
differ only by the token masks (llguidance's fill, then the mask applied to the logits). Rounds
alternate the variants so drift on a shared machine hits both alike; medians are reported.
Decode rates exclude the first token (tokens 2..N over the time since token 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import llguidance

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.engine.local_engine import LocalEngine  # noqa: E402
from api.engine.protocol import Constraint, GenerationRequest, SamplingParams  # noqa: E402
from api.engine.runtime.constraints import Grammars  # noqa: E402
from api.engine.runtime.scheduler import SchedulerLimits  # noqa: E402
from bench.host import describe_cpu  # noqa: E402

ITEM = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 10},
        "approved": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 20},
    },
    "required": ["color", "score", "approved", "note"],
    "additionalProperties": False,
}
LONG_SCHEMA = {"type": "array", "items": ITEM, "minItems": 1000}


def twenty_fields() -> dict:
    """A 20-field object of the kinds clients send: enums, bounded numbers, patterns, formats,
    arrays, nested objects, optional and nullable fields."""
    kinds = [
        {"type": "string", "maxLength": 40},
        {"enum": ["new", "open", "closed", "archived"]},
        {"type": "integer", "minimum": 0, "maximum": 1000},
        {"type": "number", "minimum": -90, "maximum": 90},
        {"type": "boolean"},
        {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
        {"type": "string", "format": "date"},
        {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
        {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street"],
            "additionalProperties": False,
        },
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
    ]
    properties = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(20)}
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties)[:16],
        "additionalProperties": False,
    }


def make_engine(model: Path, threads: int | None) -> LocalEngine:
    return LocalEngine(model.name, model, limits=SchedulerLimits(), threads=threads)


async def run_streams(
    engine: LocalEngine, streams: int, tokens: int, constraint: Constraint | None, seed: int
) -> tuple[float, float, int]:
    """(mean per-stream decode tok/s, aggregate tok/s, tokens) of `streams` concurrent requests."""

    no_eos = tuple((token, -100.0) for token in sorted(engine.model.eos_token_ids))

    async def one(i: int) -> tuple[float, float, int]:
        params = SamplingParams(
            max_tokens=tokens,
            temperature=1.0,
            seed=seed + i,
            constraint=constraint,
            logit_bias=no_eos,  # both variants: random weights would stop at random
        )
        request = GenerationRequest(f"r{seed}-{i}", [1, 355, 120, 987, 42 + i], params)
        first = last = 0.0
        count = 0
        async for output in engine.generate(request):
            count = output.completion_tokens
            last = time.perf_counter()
            if count == 1:
                first = last
        return first, last, count

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - started
    rates = [(c - 1) / (last - first) for first, last, c in results if c > 1]
    total = sum(c for *_, c in results)
    return statistics.mean(rates), total / wall, total


async def decode_rates(
    engine: LocalEngine, tokens: int, rounds: int
) -> dict[tuple[int, str], list[tuple[float, float]]]:
    constraint = Constraint(
        llguidance.LLMatcher.grammar_from_json_schema(LONG_SCHEMA), "response_format"
    )
    await run_streams(engine, 2, 8, constraint, seed=999)  # warm: compile, first masks
    out: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for round_ in range(rounds):
        for streams in (1, 8):
            for name, used in (("none", None), ("json", constraint)):
                per_stream, aggregate, total = await run_streams(
                    engine, streams, tokens, used, seed=round_ * 100
                )
                assert total == streams * tokens, (name, total)
                out.setdefault((streams, name), []).append((per_stream, aggregate))
    return out


def compile_times(model: Path, vocab_size: int, eos: list[int], repeats: int) -> dict[str, float]:
    schema = twenty_fields()
    started = time.perf_counter()
    grammars = Grammars(model / "tokenizer.json", vocab_size=vocab_size, eos_token_ids=eos)
    grammars.tokenizer()
    tokenizer_s = time.perf_counter() - started
    cold = []
    for i in range(repeats):  # a distinct schema each time: never a cache hit
        variant = dict(schema, description=f"variant {i}")
        grammar = llguidance.LLMatcher.grammar_from_json_schema(variant)
        started = time.perf_counter()
        grammars.compile(Constraint(grammar, "response_format"))
        cold.append(time.perf_counter() - started)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    grammars.compile(Constraint(grammar, "response_format"))
    started = time.perf_counter()
    for _ in range(100):
        grammars.matcher(Constraint(grammar, "response_format"))
    cached = (time.perf_counter() - started) / 100
    return {
        "tokenizer_ms": tokenizer_s * 1e3,
        "compile_ms": statistics.median(cold) * 1e3,
        "cached_matcher_ms": cached * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "demo")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args()

    engine = make_engine(args.model, args.threads)

    async def measure() -> dict[tuple[int, str], list[tuple[float, float]]]:
        await engine.start()
        try:
            return await decode_rates(engine, args.tokens, args.rounds)
        finally:
            await engine.shutdown()

    rates = asyncio.run(measure())
    vocab = engine.grammars.vocab_size
    compiled = compile_times(args.model, vocab, sorted(engine.model.eos_token_ids), repeats=9)

    lines = [
        f"model `{args.model.name}` (vocabulary {vocab}), {args.tokens} tokens a stream, "
        f"{args.rounds} rounds, medians",
        "",
        "| streams | none tok/s per stream | json tok/s per stream | json / none "
        "| none aggregate | json aggregate | json / none |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for streams in (1, 8):
        none = rates[(streams, "none")]
        json_ = rates[(streams, "json")]
        n_ps, j_ps = (statistics.median(r[0] for r in v) for v in (none, json_))
        n_ag, j_ag = (statistics.median(r[1] for r in v) for v in (none, json_))
        lines.append(
            f"| {streams} | {n_ps:.1f} | {j_ps:.1f} | {j_ps / n_ps:.3f} "
            f"| {n_ag:.1f} | {j_ag:.1f} | {j_ag / n_ag:.3f} |"
        )
    lines += [
        "",
        f"20-field schema: compile {compiled['compile_ms']:.1f} ms (median of 9 distinct), "
        f"a request's copy of the cached one {compiled['cached_matcher_ms']:.3f} ms; "
        f"llguidance tokenizer built once per model in {compiled['tokenizer_ms']:.0f} ms",
        "",
        "schema of the 20 fields: " + json.dumps(twenty_fields())[:300] + " ...",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a", encoding="utf-8") as file:
            file.write(table + "\n")
    print(f"host: {describe_cpu()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
