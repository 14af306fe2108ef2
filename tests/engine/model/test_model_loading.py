"""An export dir that cannot be served fails at load time, naming the file at fault."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from api.engine.errors import ModelLoadError
from api.engine.model.causal_lm import OnnxCausalLM
from api.engine.registry import EngineConfig, load_engines
from tests.engine.conftest import DEMO_DIR, make_engine


@pytest.fixture
def export_dir(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    shutil.copytree(DEMO_DIR, path)
    return path


@pytest.mark.parametrize("name", ["model.onnx", "config.json", "tokenizer.json"])
def test_a_missing_required_file_is_named(export_dir: Path, name: str) -> None:
    (export_dir / name).unlink()
    with pytest.raises(ModelLoadError, match=name.replace(".", r"\.")):
        make_engine(export_dir)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("model.onnx", b"not a protobuf at all"),
        ("config.json", b"{not json"),
        ("generation_config.json", b"[1, 2]"),
        ("tokenizer.json", b'{"model": 3}'),
    ],
)
def test_a_corrupt_file_is_named(export_dir: Path, name: str, content: bytes) -> None:
    (export_dir / name).write_bytes(content)
    with pytest.raises(ModelLoadError, match=name.replace(".", r"\.")):
        make_engine(export_dir)


def test_a_graph_without_past_key_values_is_refused(export_dir: Path, tmp_path: Path) -> None:
    import onnx  # the export extra, installed for tests

    model = onnx.load(str(export_dir / "model.onnx"))
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["logits"])],
        "no-past",
        [onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["b", "s"])]
        + [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", "s", 8])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["b", "s", 8])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=model.opset_import, ir_version=model.ir_version
    )
    onnx.save(model, str(export_dir / "model.onnx"))
    with pytest.raises(ModelLoadError, match="text-generation-with-past"):
        make_engine(export_dir)


def test_a_path_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="nowhere"):
        load_engines(str(tmp_path / "nowhere"), EngineConfig())


def test_the_same_model_name_twice_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="twice"):
        load_engines("a=models/demo,a=models/demo", EngineConfig())


def test_graph_facts_are_read_from_the_export() -> None:
    engine = make_engine(DEMO_DIR)
    spec = engine.model.spec
    assert (spec.num_layers, spec.kv_heads, spec.head_dim) == (2, 2, 16)
    # Served with fused attention: rows' lengths replace the attention mask, and attention
    # rotates queries and keys itself, so positions are no input either.
    assert spec.shared_kv and not spec.has_attention_mask and not spec.has_position_ids
    assert engine.model.eos_token_ids == {0, 2}
    as_exported = OnnxCausalLM(DEMO_DIR, threads=1, fuse_attention=False).spec
    assert as_exported.has_attention_mask and as_exported.has_position_ids
    assert not as_exported.shared_kv
