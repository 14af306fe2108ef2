"""An operator exports a sentence-transformers model with `tokenshop export-model --task
embedding`, int8 or not, and the result serves what the original computes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from api.engine.embedding.engine import LocalEmbeddingEngine
from tests.engine.embedding.conftest import EmbeddingExport

TEXTS = ["a question about token packs", "Привет, мир!", "stars " * 40]


def embed(path, texts: list[str]) -> np.ndarray:
    async def run() -> np.ndarray:
        engine = LocalEmbeddingEngine("x", path, threads=1)
        await engine.start()
        try:
            return await engine.embed(engine.tokenize(texts))
        finally:
            await engine.shutdown()

    return asyncio.run(run())


@pytest.mark.slow
def test_export_model_task_embedding_int8_serves_the_original(
    tokenshop, embedding_exports, tmp_path
):
    """float32 exports go through the same code in test_exactness.py; int8 here, end to end."""
    export: EmbeddingExport = embedding_exports["bert"]
    out = tmp_path / "served"
    args = ["export-model", str(export.source), str(out), "--task", "embedding"]
    result = tokenshop(*args, "--quantize", "int8")
    assert result.returncode == 0, result.stderr
    assert "quantizing weights to int8" in result.stderr
    assert "64-dimensional vectors" in result.stderr
    ours = embed(out, TEXTS)
    theirs = export.reference.encode(TEXTS, convert_to_numpy=True)
    assert (ours * theirs).sum(1).min() >= 0.99  # both normalized


def test_export_model_task_embedding_refuses_bad_arguments_in_one_line(tokenshop, tmp_path):
    for args in (
        ("--task", "embedding", "--quantize", "int4"),
        ("--task", "poems"),
    ):
        result = tokenshop("export-model", str(tmp_path), str(tmp_path / "out"), *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("tokenshop: error: ")
        assert result.stderr.count("\n") == 1
