"""An operator lists embedding exports in MODELS beside chat ones; the pooling is read from the
export's own sentence-transformers files, and a dir whose pooling cannot be read is refused at
start-up with what to add."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from api.engine.embedding.engine import LocalEmbeddingEngine, is_embedding_export
from api.engine.embedding.pooling import Pooling
from api.engine.errors import ModelLoadError
from api.engine.registry import EngineConfig, load_export, load_models

ROOT = Path(__file__).resolve().parents[3]
DEMO, DEMO_EMBED = ROOT / "models" / "demo", ROOT / "models" / "demo-embed"


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """A copy of the demo embedding export to break."""
    return Path(shutil.copytree(DEMO_EMBED, tmp_path / "embed"))


def test_models_names_chat_and_embedding_exports_in_one_list():
    loaded = load_models(f"chat={DEMO},embed={DEMO_EMBED}", EngineConfig(threads=1, cache_dir=None))
    assert list(loaded.engines) == ["chat"] and list(loaded.embedders) == ["embed"]
    embedder = loaded.embedders["embed"]
    assert (embedder.dimensions, embedder.context_length) == (64, 512)
    assert is_embedding_export(DEMO_EMBED) and not is_embedding_export(DEMO)


def test_the_demo_reads_mean_pooling_and_normalization_from_its_files():
    engine = LocalEmbeddingEngine("embed", DEMO_EMBED, threads=1)
    assert engine.model.pooling == Pooling("mean", normalize=True)


def test_an_export_without_its_pooling_files_is_refused_naming_what_to_add(export: Path):
    (export / "modules.json").unlink()
    with pytest.raises(ModelLoadError, match="pooling cannot be read.*1_Pooling/config.json"):
        LocalEmbeddingEngine("embed", export)


def test_a_module_the_engine_does_not_run_is_refused_by_name(export: Path):
    modules = json.loads((export / "modules.json").read_text())
    modules.append(
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (export / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="sentence_transformers.models.Dense"):
        LocalEmbeddingEngine("embed", export)


def test_the_older_pooling_flags_are_read_too(export: Path):
    (export / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, "pooling_mode_cls_token": True})
    )
    cls = LocalEmbeddingEngine("embed", export, threads=1)
    mean = LocalEmbeddingEngine("embed", DEMO_EMBED, threads=1)
    assert cls.model.pooling == Pooling("cls", normalize=True)
    ids = mean.tokenize(["the first token decides"])
    assert not np.allclose(cls.model.run(ids), mean.model.run(ids))


def test_two_pooling_modes_at_once_are_refused(export: Path):
    (export / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["mean", "cls"]}))
    with pytest.raises(ModelLoadError, match="exactly one"):
        LocalEmbeddingEngine("embed", export)


def test_truncate_cuts_long_inputs_and_applies_only_to_embedding_models():
    config = EngineConfig(threads=1, cache_dir=None)
    engine = load_export("embed", DEMO_EMBED, config, truncate=True)
    assert isinstance(engine, LocalEmbeddingEngine)
    [tokens] = engine.tokenize(["word " * 2000])
    assert len(tokens) == 512 and tokens[-1] == engine.tokenize(["x"])[0][-1]  # still ends in </s>
    with pytest.raises(ModelLoadError, match="truncate applies only to embedding models"):
        load_export("chat", DEMO, config, truncate=True)
