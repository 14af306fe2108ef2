"""Run an Optimum `feature-extraction` export on a batch of token lists.

Rows are right-padded to the batch's longest with the tokenizer's pad id and masked: an encoder
ignores masked positions, and a decoder's causal attention never reaches past a row's own end,
so every row's vector is the one it gets alone. The graph's inputs are read, not assumed: BERT
takes `token_type_ids`, XLM-RoBERTa does not, decoders take `position_ids`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from api.engine.embedding.pooling import POOLED_OUTPUT, TOKEN_OUTPUT, Pooling, read_pooling
from api.engine.errors import ModelLoadError
from api.engine.model.session_cache import MODEL_FILE, open_session

_INPUTS = {"input_ids", "attention_mask", "token_type_ids", "position_ids"}
_INT_TYPES: dict[str, type[np.generic]] = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def graph_outputs(path: Path) -> set[str]:
    """The output names of `path/model.onnx`, read without its weights."""
    file = path / MODEL_FILE
    if not file.is_file():
        raise ModelLoadError(f"{file}: missing; not an Optimum ONNX export dir")
    try:
        model = onnx.load(str(file), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise ModelLoadError(f"{file}: not a readable ONNX graph: {exc}") from exc
    return {output.name for output in model.graph.output}


class OnnxEmbedder:
    """One export's session, pooling and pad id; `run` is called by one thread at a time."""

    def __init__(
        self, path: Path, *, pad_id: int, threads: int | None, cache_dir: Path | None
    ) -> None:
        outputs = graph_outputs(path)
        self.pooling: Pooling = read_pooling(path, outputs)
        self.output = POOLED_OUTPUT if self.pooling.mode == "graph" else TOKEN_OUTPUT
        self.pad_id = pad_id

        def options() -> ort.SessionOptions:
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if threads:
                opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            return opts

        try:
            self.session = open_session(
                path,
                lambda: str(path / MODEL_FILE),
                tag="embedding-v1",
                options=options,
                cache_dir=cache_dir,
            )
        except Exception as exc:  # ONNX Runtime's load errors are plain RuntimeErrors
            raise ModelLoadError(
                f"{path / MODEL_FILE}: ONNX Runtime cannot load it: {exc}"
            ) from exc
        self.inputs: dict[str, type[np.generic]] = {}
        for item in self.session.get_inputs():
            if item.name not in _INPUTS or item.type not in _INT_TYPES:
                raise ModelLoadError(
                    f"{path / MODEL_FILE}: takes input {item.name!r} ({item.type}); an "
                    "embedding export takes input_ids, attention_mask and optionally "
                    "token_type_ids and position_ids (a graph with a KV cache is a chat export)"
                )
            self.inputs[item.name] = _INT_TYPES[item.type]
        if "input_ids" not in self.inputs:
            raise ModelLoadError(f"{path / MODEL_FILE}: has no input_ids input")
        # ONNX Runtime's arena keeps the largest batch's buffers (attention scores grow with
        # rows x length^2): bge-small held 2.2 GB after a 32 x 512 batch, 0.36 GB with the
        # arena shrunk after each run, at the same speed (bench/results/2026-11-28-embeddings-*)
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """The pooled vectors of `rows` (float32, one row each)."""
        lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
        width = int(lengths.max())
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        for index, row in enumerate(rows):
            ids[index, : len(row)] = row
        mask = np.arange(width)[None, :] < lengths[:, None]
        feeds: dict[str, np.ndarray] = {}
        for name, dtype in self.inputs.items():
            value: np.ndarray
            if name == "input_ids":
                value = ids
            elif name == "attention_mask":
                value = mask
            elif name == "token_type_ids":
                value = np.zeros_like(ids)
            else:  # position_ids: each row counts from 0; padding's are never attended to
                value = np.broadcast_to(np.arange(width), ids.shape)
            feeds[name] = np.ascontiguousarray(value, dtype=dtype)
        (states,) = self.session.run([self.output], feeds, self.run_options)
        return self.pooling.apply(np.asarray(states, dtype=np.float32), lengths)
