"""Fused attention over one shared KV buffer changes no token, and applies where it should.

The exactness tests already compare the fused engine with transformers for llama, qwen2 and phi3;
these check the edit's own promises: which graphs it takes, that its logits equal the graph as
exported, and that the buffer's bookkeeping (rows moving as sequences join and leave, capacity
doubling past its first size) keeps every sequence's tokens those of the unfused engine.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from api.engine.graph.fused_attention import fuse_attention
from api.engine.model.causal_lm import OnnxCausalLM
from api.engine.runtime.padded_batch import PaddedBatch
from api.engine.runtime.slot_batch import INITIAL_CAPACITY, SlotBatch
from tests.engine.conftest import TinyExport, greedy, load_make_demo, make_engine, run_steps
from tests.engine.helpers import (
    assert_same_tokens,
    prefill_and_decode,
    random_prompt,
    tokens_of,
    transformers_greedy,
)


@pytest.mark.parametrize(
    ("arch", "fused"),
    [("llama", True), ("qwen2", True), ("phi3", True), ("gpt2", False), ("gemma", False)],
)
def test_attention_is_fused_where_the_graph_allows(tiny_exports, arch: str, fused: bool) -> None:
    # gemma's export has no position_ids; gpt2's attention is not the llama-family pattern.
    model = OnnxCausalLM(tiny_exports[arch].path, threads=1)
    assert model.spec.shared_kv is fused


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_attention_applies_plain_rope_itself(tiny_exports, arch: str) -> None:
    """With unscaled RoPE the graph's own rotary ops go, and with them the positions input;
    a RoPE whose cos/sin are scaled (YaRN's) keeps the graph's rotary ops and position_ids."""
    path = tiny_exports[arch].path
    config = json.loads((path / "config.json").read_text())
    plain = onnx.load(str(path / "model.onnx"))
    assert fuse_attention(plain, config)
    assert "position_ids" not in {i.name for i in plain.graph.input}
    assert not any(node.op_type == "Neg" for node in plain.graph.node)

    scaled = onnx.load(str(path / "model.onnx"))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert fuse_attention(scaled, config | {"rope_scaling": yarn})
    assert "position_ids" in {i.name for i in scaled.graph.input}
    assert any(node.op_type == "Neg" for node in scaled.graph.node)


# Scalings whose frequencies are fixed. Llama 3.1-3.3's: with an original context of 64 and
# head_dim 16, the tiny model's 8 frequencies fall in all three of its bands (kept, blended,
# slowed by `factor`). Linear: every frequency slowed by `factor`.
FIXED_ROPE_SCALINGS = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "linear": {"rope_type": "linear", "factor": 4.0},
}


@pytest.fixture(scope="session", params=sorted(FIXED_ROPE_SCALINGS))
def scaled_rope_export(request, tmp_path_factory: pytest.TempPathFactory) -> TinyExport:
    out = tmp_path_factory.mktemp(f"export-{request.param}-rope")
    model, tokenizer = load_make_demo().make_export(
        "llama", out, initializer_range=1.0, rope_scaling=FIXED_ROPE_SCALINGS[request.param]
    )
    return TinyExport(f"llama, {request.param} RoPE", out, model, tokenizer)


def test_fixed_scaled_rope_is_applied_by_attention_and_changes_no_token(
    scaled_rope_export,
) -> None:
    """Llama 3's and linear scaling's frequencies are fixed, so attention applies them from its
    caches like the original RoPE's (the graph's rotary ops go): every step's logits equal the
    graph's as exported, and greedy text is transformers' own, past Llama 3's original context
    of 64."""
    export = scaled_rope_export
    graph = onnx.load(str(export.path / "model.onnx"))
    config = json.loads((export.path / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] in FIXED_ROPE_SCALINGS
    assert fuse_attention(graph, config)
    assert "position_ids" not in {i.name for i in graph.graph.input}
    assert not any(node.op_type == "Neg" for node in graph.graph.node)

    prompt = random_prompt(export, 70, seed=3)
    fused = make_engine(export.path)
    plain = make_engine(export.path, fused_attention=False)
    logits = [prefill_and_decode(engine, prompt, decode_steps=4) for engine in (fused, plain)]
    for got, want in zip(*logits, strict=True):
        # these logits span about +-20 (init std 1.0): 2e-4 is float32 rounding over 70
        # positions, where a wrong frequency moves every logit (see the unscaled test's 1e-4)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)

    engine = make_engine(export.path)
    outputs, _ = run_steps(engine, {0: [greedy("solo", prompt, 24)]})
    want = transformers_greedy(export, prompt, 24)
    assert_same_tokens(export, prompt, tokens_of(outputs["solo"]), want)


@pytest.mark.parametrize(
    ("arch", "change"),
    [("qwen2", {"use_sliding_window": True}), ("gpt2", {})],
)
def test_a_refused_graph_is_left_as_exported(tiny_exports, arch: str, change: dict) -> None:
    """Refused up front (a sliding window), or part-way through the rewrite (gpt2's attention
    is not the llama pattern): either way not one byte of the graph changes."""
    path = tiny_exports[arch].path
    config = json.loads((path / "config.json").read_text()) | change
    graph = onnx.load(str(path / "model.onnx"))
    before = graph.SerializeToString()
    assert not fuse_attention(graph, config)
    assert graph.SerializeToString() == before


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
def test_fused_logits_equal_the_graph_as_exported(tiny_exports, arch: str) -> None:
    """Prefill then decode one sequence both ways: every step's logits agree."""
    export = tiny_exports[arch]
    prompt = random_prompt(export, 11, seed=3)
    fused = make_engine(export.path)
    plain = make_engine(export.path, fused_attention=False)
    assert isinstance(fused.scheduler._batch, SlotBatch)
    assert fused.scheduler._batch._logits is not None  # bound to its buffer, not allocated
    assert isinstance(plain.scheduler._batch, PaddedBatch)
    logits = [prefill_and_decode(engine, prompt, decode_steps=4) for engine in (fused, plain)]
    for got, want in zip(*logits, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sequences_joining_and_leaving_keep_their_tokens(tiny_exports, arch: str) -> None:
    """Prompts of different lengths join at different steps and finish at different steps, so
    rows are swapped down on joining and refilled on leaving; one prompt outgrows the buffer's
    first capacity while others run. Tokens equal the unfused engine's, request by request."""
    export = tiny_exports[arch]
    long = INITIAL_CAPACITY + 20
    joins = {
        0: [
            greedy("a", random_prompt(export, 7, 1), 12),
            greedy("b", random_prompt(export, 30, 2), 3),
        ],
        2: [greedy("c", random_prompt(export, long, 3), 25)],
        4: [
            greedy("d", random_prompt(export, 5, 4), 9),
            greedy("e", random_prompt(export, 16, 5), 30),
        ],
        9: [greedy("f", random_prompt(export, 12, 6), 6)],
    }
    results = []
    for fused in (True, False):
        engine = make_engine(export.path, fused_attention=fused, max_prefill_tokens=64)
        outputs, largest = run_steps(engine, joins)
        assert largest >= 4
        results.append({rid: tokens_of(out) for rid, out in outputs.items()})
        if fused:
            assert engine.scheduler._batch.capacity >= long + 25
    assert results[0] == results[1]
