"""int4 sibling projections run as one MatMulNBits, and no logit moves for it."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from api.engine.export.quantize import quantize_int4, quantize_int8
from api.engine.graph import pipeline
from api.engine.graph.fused_attention import fuse_attention
from api.engine.graph.merged_projections import merge_projections
from tests.engine.conftest import make_engine
from tests.engine.helpers import prefill_and_decode, random_prompt


def fused_graph(path: Path) -> tuple[onnx.ModelProto, dict]:
    config = json.loads((path / "config.json").read_text())
    graph = onnx.load(str(path / "model.onnx"))
    assert fuse_attention(graph, config)
    return graph, config


def op_counts(graph: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in graph.graph.node)


@pytest.fixture(scope="module")
def quantized(tiny_exports, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Quantized copies of the tiny exports: "llama-int4", "qwen2-int4", "qwen2-int8"."""
    copies = {}
    for arch, method, quantize in (
        ("llama", "int4", quantize_int4),
        ("qwen2", "int4", quantize_int4),
        ("qwen2", "int8", quantize_int8),
    ):
        copy = copies[f"{arch}-{method}"] = tmp_path_factory.mktemp(f"{arch}-{method}") / "x"
        shutil.copytree(tiny_exports[arch].path, copy)
        quantize(copy)
    return copies


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_q_k_v_and_gate_up_become_one_call_each(quantized, arch: str) -> None:
    graph, config = fused_graph(quantized[f"{arch}-int4"])
    layers = config["num_hidden_layers"]
    before = op_counts(graph)
    assert merge_projections(graph) == 2 * layers
    after = op_counts(graph)
    # Five projections read two tensors per layer: q, k, v the attention norm's output and
    # gate, up the MLP norm's. Each group is now one MatMulNBits over Concats of its weights.
    assert after["MatMulNBits"] == before["MatMulNBits"] - 3 * layers
    assert after["Split"] == before["Split"] + 2 * layers


def test_qwen2_biases_stay_one_add_after_the_merged_projection(quantized) -> None:
    """q, k and v carry biases: one Add of the concatenated biases goes before the Split, so
    ONNX Runtime can still fold it into the projection."""
    graph, config = fused_graph(quantized["qwen2-int4"])
    adds = op_counts(graph)["Add"]
    merge_projections(graph)
    assert op_counts(graph)["Add"] == adds - 2 * config["num_hidden_layers"]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_fp32_and_int8_projections_are_left_alone(tiny_exports, quantized, precision) -> None:
    """Merging did not pay for them (the module docstring has the figures)."""
    path = tiny_exports["qwen2"].path if precision == "fp32" else quantized["qwen2-int8"]
    graph, _ = fused_graph(path)
    before = graph.SerializeToString()
    assert merge_projections(graph) == 0
    assert graph.SerializeToString() == before


def test_int4_merged_projections_give_the_logits_of_separate_ones(
    tiny_exports, quantized, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = quantized["qwen2-int4"]
    graph, config = fused_graph(path)
    layers = config["num_hidden_layers"]
    assert merge_projections(graph) == 2 * layers
    assert op_counts(graph)["MatMulNBits"] == 4 * layers  # qkv, o, gate_up, down

    prompt = random_prompt(tiny_exports["qwen2"], 13, seed=5)
    merged = prefill_and_decode(make_engine(path), prompt, decode_steps=4)
    monkeypatch.setattr(pipeline, "merge_projections", lambda graph: 0)
    separate = prefill_and_decode(make_engine(path), prompt, decode_steps=4)
    for got, want in zip(merged, separate, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
