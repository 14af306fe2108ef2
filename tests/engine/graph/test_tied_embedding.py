"""A tied model is served with one table: its embedding rows are read from the int8 head's weights
(`HeadEmbedding`), the float32 table is gone from the served graph, and the head and the
embedding share one copy of the weights in memory.

The graphs here are a Gather on a table beside the head ONNX Runtime's dynamic quantizer writes
for that same table (transposed, int8, one scale); the exports are the real quantizers' output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine.graph.int8_matmul import use_int8_kernel
from api.engine.graph.tied_embedding import OP_TYPE, share_tied_embedding
from api.engine.model.session_cache import MODEL_FILE
from api.engine.ops.library import huge_page_bytes
from tests.engine.conftest import make_engine, quantized_copy, served_ops
from tests.engine.graph.test_int8_matmul import projection_nodes, quantize_node
from tests.engine.helpers import assert_close_picks, prefill_and_decode


def tied_model(k: int, n: int, *, untie_by: float = 0.0) -> tuple[onnx.ModelProto, np.ndarray]:
    """`rows` = Gather(table [n, k], ids) and `logits` = h @ head, the head being the table's
    int8 copy (symmetric, one scale); `untie_by` steps of noise make the table another one.
    Returns the graph and the head's dequantized weights [k, n]."""
    rng = np.random.default_rng(k + n)
    table = rng.normal(0, 0.02, size=(n, k)).astype(np.float32)
    scale = np.float32(np.abs(table).max() / 127)
    head = np.clip(np.rint(table.T / scale), -127, 127).astype(np.int8)
    table += np.float32(untie_by) * scale
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        quantize_node("h"),
        *projection_nodes("logits", x="h", zero_point=False),
    ]
    initializers = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(head, "logits.weight"),
        numpy_helper.from_array(scale, "logits.weight_scale"),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["r", k]),
        ],
        [
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["b", "s", k]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["r", n]),
        ],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return model, head.astype(np.float32) * scale


def session(model: onnx.ModelProto, library: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def edited(model: onnx.ModelProto, tmp_path: Path) -> bool:
    assert use_int8_kernel(model) == 1
    return share_tied_embedding(model, tmp_path)


@pytest.mark.parametrize(("k", "n"), [(128, 64), (896, 136), (192, 40)])
def test_rows_are_the_int8_heads_columns(library: Path, tmp_path: Path, k: int, n: int) -> None:
    model, head = tied_model(k, n)
    assert edited(model, tmp_path)
    ops = [node.op_type for node in model.graph.node]
    assert OP_TYPE in ops and "Gather" not in ops
    ids = np.array([[0, n - 1, 3], [7, 7, n // 2]], dtype=np.int64)
    h = np.zeros((1, k), np.float32)
    rows, _ = session(model, library).run(None, {"ids": ids, "h": h})
    assert rows.shape == (2, 3, k)
    np.testing.assert_array_equal(rows, head.T[ids])


def test_an_untied_table_keeps_its_gather(tmp_path: Path) -> None:
    model, _ = tied_model(128, 64, untie_by=3.0)
    assert not edited(model, tmp_path)
    assert "Gather" in [node.op_type for node in model.graph.node]


def test_a_token_id_past_the_vocabulary_is_an_error(library: Path, tmp_path: Path) -> None:
    model, _ = tied_model(128, 64)
    assert edited(model, tmp_path)
    run = session(model, library)
    with pytest.raises(Exception, match="out of range"):
        run.run(None, {"ids": np.array([[64]], np.int64), "h": np.zeros((1, 128), np.float32)})


def test_the_head_and_the_embedding_hold_one_copy_of_the_weights(
    library: Path, tmp_path: Path
) -> None:
    """Weights of 2 MB and more are copied onto 2 MB pages; the table read by both ops is
    copied once, and the copy goes with the session."""
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.exists() or "[never]" in setting.read_text():
        pytest.skip("this kernel gives no 2 MB pages: no op copies its weights")
    k, n = 1024, 2048  # 2 MB of int8 weights
    model, head = tied_model(k, n)
    assert edited(model, tmp_path)
    before = huge_page_bytes(library)
    run = session(model, library)
    assert huge_page_bytes(library) - before == k * n
    ids = np.array([[5, n - 1]], np.int64)
    h = np.ones((1, k), np.float32)
    rows, logits = run.run(None, {"ids": ids, "h": h})
    np.testing.assert_array_equal(rows[0], head.T[ids[0]])
    np.testing.assert_allclose(logits[0], head.sum(axis=0), rtol=0.02, atol=0.02)
    del run
    assert huge_page_bytes(library) == before


@pytest.mark.usefixtures("served_with_our_op")
@pytest.mark.parametrize("method", ["int4", "int8"])
def test_a_tied_export_is_served_without_its_float_table(
    library: Path, tied_export: Path, tmp_path: Path, method: str
) -> None:
    export = quantized_copy(tied_export, tmp_path / method, method)
    cache = tmp_path / "cache"
    nodes = served_ops(export, library, cache)
    assert [node.op_type for node in nodes].count(OP_TYPE) == 1
    assert "Gather" not in {node.op_type for node in nodes if "embed" in node.name}
    (cached,) = cache.glob(f"*/{MODEL_FILE}")
    tables = onnx.load(str(cached), load_external_data=False).graph.initializer
    assert not [t.name for t in tables if "embed_tokens" in t.name]


@pytest.mark.usefixtures("served_with_our_op")
def test_int4_logits_move_by_no_more_than_the_heads_rounding(
    library: Path, tied_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedding's values become the int8 head's: every step's logits stay close to those
    of the float32 table and pick the same tokens."""
    from api.engine.graph import pipeline

    export = quantized_copy(tied_export, tmp_path / "int4", "int4")
    prompt = [5, 17, 33, 2, 90, 41, 7, 12, 64, 3, 29]
    shared = make_engine(export, ops_library=library)
    monkeypatch.setattr(pipeline, "share_tied_embedding", lambda model, model_dir: False)
    own = make_engine(export, ops_library=library)
    steps = [prefill_and_decode(engine, prompt, decode_steps=6) for engine in (shared, own)]
    assert_close_picks(*steps, "int4 logits, head-read embedding against the float table")
