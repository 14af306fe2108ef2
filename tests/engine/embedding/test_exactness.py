"""Our float32 vectors are sentence-transformers' (torch) for random-weight BERT, XLM-RoBERTa,
ModernBERT (global and sliding-window layers) and a Qwen3-shaped last-token decoder: each input
alone, and 64 requests of mixed lengths at once, packed into shared batches by the batcher. int8
exports stay close to float32."""

from __future__ import annotations

import asyncio
import random
import warnings

import numpy as np
import pytest

from api.engine.embedding.batcher import BatchLimits
from api.engine.embedding.engine import LocalEmbeddingEngine
from api.engine.export.embedding import export_embedding
from tests.engine.embedding.conftest import EmbeddingExport, load_make_demo_embed

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
ARCHS = ["bert", "xlm-roberta", "modernbert", "qwen3"]
EXACT = 0.99999


def mixed_texts(count: int, seed: int) -> list[str]:
    """Texts of 1 to ~480 tokens, every length band represented."""
    lines = load_make_demo_embed()._make_demo().corpus(lines=400, seed=seed)
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        take = [1, 2, 4, 8, 16, 32, 48][index % 7]
        start = rng.randrange(len(lines) - take)
        words = " ".join(lines[start : start + take]).split()[:250]  # within 512 tokens
        texts.append(" ".join(words) if index % 9 else words[0])  # some single words
    return texts


def cosines(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    return (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)


@pytest.fixture(params=ARCHS)
def export(request: pytest.FixtureRequest, embedding_exports) -> EmbeddingExport:
    return embedding_exports[request.param]


async def _engine(export: EmbeddingExport, **options) -> LocalEmbeddingEngine:
    engine = LocalEmbeddingEngine(export.arch, export.path, threads=2, **options)
    await engine.start()
    return engine


async def test_each_input_alone_matches_sentence_transformers(export: EmbeddingExport):
    texts = mixed_texts(14, seed=1)
    engine = await _engine(export)
    try:
        ours = np.concatenate([await engine.embed(engine.tokenize([text])) for text in texts])
    finally:
        await engine.shutdown()
    theirs = export.reference.encode(texts, batch_size=1, convert_to_numpy=True)
    assert cosines(ours, theirs).min() >= EXACT
    assert max(len(ids) for ids in engine.tokenize(texts)) > 300  # long inputs were among them


async def test_64_concurrent_requests_of_mixed_lengths_match(export: EmbeddingExport):
    texts = mixed_texts(64, seed=2)
    engine = await _engine(export, limits=BatchLimits(batch_tokens=2048))
    try:
        results = await asyncio.gather(*(engine.embed(engine.tokenize([text])) for text in texts))
        stats = engine.stats()
    finally:
        await engine.shutdown()
    ours = np.concatenate(results)
    theirs = export.reference.encode(texts, batch_size=16, convert_to_numpy=True)
    assert cosines(ours, theirs).min() >= EXACT
    assert stats.batches < 64  # requests shared batches
    assert stats.padded_tokens < 1.5 * stats.tokens  # grouped by length: little padding


async def test_int8_stays_close_to_float32(export: EmbeddingExport, tmp_path):
    texts = mixed_texts(32, seed=3)
    export_embedding(str(export.source), tmp_path / "int8", "int8")
    full = await _engine(export)
    int8 = LocalEmbeddingEngine(export.arch, tmp_path / "int8", threads=2)
    await int8.start()
    try:
        ours = await full.embed(full.tokenize(texts))
        quantized = await int8.embed(int8.tokenize(texts))
    finally:
        await full.shutdown()
        await int8.shutdown()
    assert cosines(quantized, ours).min() >= 0.99  # the target; bench/results has figures


async def test_an_export_with_the_pooling_in_its_graph_needs_no_module_files(
    embedding_exports, tmp_path
):
    """optimum's `--library-name sentence_transformers` export: a `sentence_embedding` output,
    pooled and normalized in the graph, and no modules.json beside it."""
    from optimum.exporters.onnx import main_export

    export = embedding_exports["bert"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's chatter, as in every export here
        main_export(
            str(export.source),
            tmp_path / "pooled",
            task="feature-extraction",
            library_name="sentence_transformers",
            do_validation=False,
        )
    assert not (tmp_path / "pooled" / "modules.json").exists()
    texts = mixed_texts(8, seed=4)
    engine = LocalEmbeddingEngine("pooled", tmp_path / "pooled", threads=2)
    await engine.start()
    try:
        ours = await engine.embed(engine.tokenize(texts))
    finally:
        await engine.shutdown()
    assert engine.model.pooling.mode == "graph"
    theirs = export.reference.encode(texts, convert_to_numpy=True)
    assert cosines(ours, theirs).min() >= EXACT
