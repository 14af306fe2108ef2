"""ONNX Runtime's optimized graph is kept on disk and reused until the model changes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.engine.conftest import DEMO_DIR, greedy, make_engine, run_steps

PROMPT = [1, 355, 120, 987, 42, 7, 1500, 2, 1, 600]


def generated(engine) -> list[int]:
    outputs, _ = run_steps(engine, {0: [greedy("a", PROMPT, 8)]})
    return [t for o in outputs["a"] for t in o.token_ids]


def test_the_second_load_reads_the_cached_graph_and_generates_the_same(tmp_path: Path) -> None:
    model_dir, cache = tmp_path / "demo", tmp_path / "cache"
    shutil.copytree(DEMO_DIR, model_dir)
    expected = generated(make_engine(model_dir))

    first = make_engine(model_dir, cache_dir=cache)
    (entry,) = cache.iterdir()
    second = make_engine(model_dir, cache_dir=cache)

    # The first load, too, ends up serving the entry it wrote: the session built from the
    # edited graph's bytes (and ONNX Runtime's copy of them) is let go.
    assert first.model.session._model_path == str(entry / "model.onnx")
    assert second.model.session._model_path == str(entry / "model.onnx")
    assert second.model.last_position_only
    assert generated(first) == generated(second) == expected


def test_a_changed_model_gets_a_new_entry(tmp_path: Path) -> None:
    model_dir, cache = tmp_path / "demo", tmp_path / "cache"
    shutil.copytree(DEMO_DIR, model_dir)
    make_engine(model_dir, cache_dir=cache)
    graph = model_dir / "model.onnx"
    stat = graph.stat()
    os.utime(graph, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))

    make_engine(model_dir, cache_dir=cache)

    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2
