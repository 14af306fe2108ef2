"""The load-time edit that computes logits for the last position only changes no number."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from api.engine.model.causal_lm import OnnxCausalLM
from tests.engine.conftest import DEMO_DIR
from tests.engine.helpers import ARCHITECTURES


def unedited_logits(model: OnnxCausalLM, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model.path / "model.onnx"))
    n = ids.shape[1]
    feed = {"input_ids": ids, "attention_mask": np.ones((1, n), np.int64)}
    if model.spec.has_position_ids:
        feed["position_ids"] = np.arange(n, dtype=np.int64)[None]
    feed.update(zip(model.spec.past_names, model.empty_past(1), strict=True))
    return session.run(["logits"], feed)[0]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_prefill_logits_equal_the_last_row_of_the_full_graph(tiny_exports, arch: str) -> None:
    # The graph with only this edit (fused attention is checked in test_fused_attention).
    model = OnnxCausalLM(tiny_exports[arch].path, threads=1, fuse_attention=False)
    ids = np.random.default_rng(0).integers(3, 200, size=(1, 13))
    logits, presents = model.forward(
        ids, np.ones_like(ids), np.arange(13)[None], model.empty_past(1)
    )

    full = unedited_logits(model, ids)
    assert model.last_position_only and full.shape[1] == 13
    np.testing.assert_allclose(logits, full[:, -1], rtol=1e-5, atol=1e-5)
    assert presents[0].shape[2] == 13  # the cache still covers every prompt position


def test_the_demo_model_is_served_edited() -> None:
    assert OnnxCausalLM(DEMO_DIR, threads=1).last_position_only
