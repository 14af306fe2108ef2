"""`export_model` turns a local transformers dir into a served model, optionally int8."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from api.engine.export.exporter import INSTALL_HINT, ExportUnavailable, export_model
from api.engine.protocol import ChatMessage
from tests.engine.conftest import collect, greedy, load_make_demo, make_engine


def saved_model(factory: pytest.TempPathFactory, name: str, **overrides) -> Path:
    """A tiny qwen2 and its tokenizer saved as a transformers dir, as a user's would be."""
    make_demo = load_make_demo()
    tokenizer = make_demo.train_tokenizer()
    model = make_demo.build_model("qwen2", tokenizer, **overrides)
    path = factory.mktemp(name)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


async def tokens_served(export: Path) -> int:
    """Completion tokens of a 5-token greedy answer from `export`, served as the server does."""
    engine = make_engine(export)
    await engine.start()
    try:
        prompt = engine.encode_chat([ChatMessage("user", "hi")])
        outputs = await collect(engine, greedy("x", prompt, 5))
    finally:
        await engine.shutdown()
    return outputs[-1].completion_tokens


@pytest.fixture(scope="module")
def transformers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_model(tmp_path_factory, "hf-qwen2")


@pytest.mark.slow
@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.anyio
async def test_export_then_serve(transformers_dir: Path, tmp_path: Path, quantize) -> None:
    stages: list[str] = []
    result = export_model(str(transformers_dir), tmp_path / "out", quantize, stages.append)

    assert result.path == tmp_path / "out"
    assert any("int8" in s for s in stages) == (quantize == "int8")
    assert stages[-1].startswith("done")
    for name in ("model.onnx", "config.json", "generation_config.json", "tokenizer.json"):
        assert (result.path / name).is_file()
    assert await tokens_served(result.path) == 5


@pytest.mark.slow
def test_int8_export_is_smaller(transformers_dir: Path, tmp_path: Path) -> None:
    plain = export_model(str(transformers_dir), tmp_path / "fp32")
    int8 = export_model(str(transformers_dir), tmp_path / "int8", quantize="int8")
    assert int8.size_bytes < plain.size_bytes


def test_missing_export_extra_says_how_to_install(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "optimum.exporters.onnx", None)  # import now fails
    with pytest.raises(ExportUnavailable) as error:
        export_model("some/model", tmp_path / "out")
    assert INSTALL_HINT in str(error.value)
    assert INSTALL_HINT == "pip install 'tokenshop[export]'"


def test_unknown_quantization_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="int8"):
        export_model("some/model", tmp_path / "out", quantize="int3")


@pytest.fixture(scope="module")
def tied_transformers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_model(tmp_path_factory, "hf-qwen2-tied", tie_word_embeddings=True)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_model_whose_graph_post_processing_fails_is_exported_without_it(
    tied_transformers_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """optimum dedups a tied head by serializing the whole graph, which protobuf refuses past
    2 GB (a tied 1.5B model's fp32 graph): the export is made again without that step."""
    import optimum.onnx
    from google.protobuf.message import EncodeError

    def too_large(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise EncodeError("Failed to serialize proto")

    monkeypatch.setattr(optimum.onnx, "remove_duplicate_weights_from_tied_info", too_large)
    stages: list[str] = []
    result = export_model(str(tied_transformers_dir), tmp_path / "out", None, stages.append)

    assert any("post-processing failed" in s for s in stages)
    assert await tokens_served(result.path) == 5
