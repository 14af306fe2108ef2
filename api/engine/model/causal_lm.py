"""Load an Optimum ONNX export dir and run its decoder graph.

The graph is read, not assumed: Optimum exports differ by architecture (gemma has no
`position_ids`, gpt2 orders its inputs differently, GQA models have fewer KV heads than attention
heads) and by dtype (fp32 / fp16). `GraphSpec` records what this export takes and returns;
everything else in the engine works from it. A dir that cannot be served raises `ModelLoadError`
naming the file at fault, at load time, never at the first request.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from api.engine.errors import ModelLoadError
from api.engine.graph.attention import takes_left_padding
from api.engine.graph.int8_matmul import runs_faster_here as int8_kernel_runs_faster
from api.engine.graph.pipeline import EditPlan, can_edit, edited_graph, edits_of, scales_shared
from api.engine.model.serving_path import describe
from api.engine.model.session_cache import open_session
from api.engine.model.spec import LOGITS_POSITIONS, SEQLENS
from api.engine.ops.library import huge_page_bytes
from api.engine.ops.library import register as register_ops
from api.engine.protocol import KvCacheDtype

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_ORT_TYPES: dict[str, type[np.generic]] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


@dataclass(frozen=True)
class GraphSpec:
    """What one decoder graph takes and returns."""

    past_names: tuple[str, ...]  # past_key_values.{i}.key|value, in layer order
    present_names: tuple[str, ...]  # the matching outputs, same order
    has_attention_mask: bool
    has_position_ids: bool
    num_layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: type[np.generic]
    ids_dtype: type[np.generic]
    mask_dtype: type[np.generic]
    # Attention is ONNX Runtime's GroupQueryAttention over a shared past/present buffer
    # (`fused_attention.py`): the engine binds one preallocated cache (`kv_slots.py`).
    shared_kv: bool = False
    # Every attention is our op, which takes left-padded rows (`attention_kernel.py`): prompts
    # of different lengths can be prefilled in one call.
    padded_prefill: bool = False


def read_json(path: Path, *, required: bool) -> dict[str, Any]:
    """A JSON file of the export as a dict; a missing optional file is {}."""
    if not path.is_file():
        if required:
            raise ModelLoadError(f"{path}: missing; not an Optimum ONNX export dir")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def _inspect(session: ort.InferenceSession, path: Path, config: dict[str, Any]) -> GraphSpec:
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    if "input_ids" not in inputs or "logits" not in outputs:
        raise ModelLoadError(f"{path}: graph lacks `input_ids` input or `logits` output")
    layers: dict[int, dict[str, str]] = {}
    for name in inputs:
        match = _PAST.match(name)
        if match:
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = name
    if not layers:
        raise ModelLoadError(
            f"{path}: graph has no past_key_values inputs; export it with "
            "--task text-generation-with-past"
        )
    if sorted(layers) != list(range(len(layers))) or any(len(v) != 2 for v in layers.values()):
        raise ModelLoadError(f"{path}: past_key_values inputs are incomplete")
    past_names = tuple(layers[i][kind] for i in range(len(layers)) for kind in ("key", "value"))
    present_names = tuple(n.replace("past_key_values.", "present.") for n in past_names)
    missing = [n for n in present_names if n not in outputs]
    if missing:
        raise ModelLoadError(f"{path}: graph lacks outputs {missing[:2]}")

    first = inputs[past_names[0]]
    if len(first.shape) != 4:
        raise ModelLoadError(f"{path}: unsupported KV cache layout {first.shape}")
    kv_heads, head_dim = first.shape[1], first.shape[3]
    if not isinstance(kv_heads, int):
        kv_heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    if not isinstance(head_dim, int):
        head_dim = int(
            config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        )
    try:
        kv_dtype = _ORT_TYPES[first.type]
        ids_dtype = _ORT_TYPES[inputs["input_ids"].type]
        mask = inputs.get("attention_mask")
        mask_dtype = _ORT_TYPES[mask.type] if mask is not None else np.int64
    except KeyError as exc:
        raise ModelLoadError(f"{path}: unsupported tensor type {exc}") from exc
    return GraphSpec(
        past_names=past_names,
        present_names=present_names,
        has_attention_mask="attention_mask" in inputs,
        has_position_ids="position_ids" in inputs,
        num_layers=len(layers),
        kv_heads=kv_heads,
        head_dim=head_dim,
        kv_dtype=kv_dtype,
        ids_dtype=ids_dtype,
        mask_dtype=mask_dtype,
        shared_kv=SEQLENS in inputs,
        padded_prefill=takes_left_padding(session.get_modelmeta().custom_metadata_map),
    )


def context_length_of(config: dict[str, Any]) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    raise ModelLoadError("config.json: no max_position_embeddings / n_positions")


def eos_ids_of(generation_config: dict[str, Any], config: dict[str, Any]) -> frozenset[int]:
    """Every EOS id of generation_config (chat models list several), else config.json's."""
    for source in (generation_config, config):
        value = source.get("eos_token_id")
        if isinstance(value, int):
            return frozenset({value})
        if isinstance(value, list) and value:
            return frozenset(int(v) for v in value)
    return frozenset()


def _logits_output(session: ort.InferenceSession) -> ort.NodeArg:
    return next(o for o in session.get_outputs() if o.name == "logits")


def _last_position_only(session: ort.InferenceSession, counted: bool) -> bool:
    """Whether the graph's `logits` has a sequence dim of 1, or of `LOGITS_POSITIONS` where
    the graph takes that input (`counted`: 1 unless a call says otherwise)."""
    logits = _logits_output(session)
    return len(logits.shape) == 3 and (logits.shape[1] == 1 or counted)


def _counts_logits_positions(session: ort.InferenceSession) -> bool:
    """Whether a call may ask for the logits of its last few positions (`LOGITS_POSITIONS`)."""
    return any(i.name == LOGITS_POSITIONS for i in session.get_inputs())


def session_options(
    threads: int | None, ops_library: Path | None = None, profile: Path | None = None
) -> ort.SessionOptions:
    """The engine's ONNX Runtime settings (a fresh object each call: a session may be opened
    twice, `ort_cache.py`), with our int4 op's library registered when given, and ONNX
    Runtime's profiler writing to files starting with `profile` when given."""
    options = ort.SessionOptions()
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile)
    if ops_library is not None:
        register_ops(options, ops_library)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3
    # Pool threads spin between the ops of a run (a decode step is hundreds of small ops and
    # a sleeping thread is slow to wake) but stop when the run ends, leaving the cores to the
    # scheduler's Python and the event loop: faster both ways, measured in
    # bench/results/2026-11-26-kernel-notes.md.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


class OnnxCausalLM:
    """One ONNX Runtime session of a decoder-with-past graph, plus the facts read from config."""

    def __init__(
        self,
        path: Path,
        *,
        threads: int | None = None,
        cache_dir: Path | None = None,
        fuse_attention: bool = True,
        ops_library: Path | None = None,
        ops_missing: str | None = None,
        attention_kernel: bool = True,
        kv_cache_dtype: KvCacheDtype = "float32",
        profile: Path | None = None,
    ) -> None:
        """`ops_library`: our op library (`ops.library.preferred_library()`), or None to run
        int4 graphs with ONNX Runtime's `MatMulNBits`. With it, dynamically quantized int8
        projections run on its int8 op too where that is faster, an int4 export's int8 head on
        every CPU (`int8_matmul.py`), and fused attention on its attention op unless
        `attention_kernel` is False (`bench/context.py` compares the two), over a KV cache of
        `kv_cache_dtype` (`KvCacheDtype`; `spec.kv_dtype` says what was built). `ops_missing`:
        why there is no `ops_library`, for `serving_path`. `profile`: a path prefix for ONNX
        Runtime's profile of every run (`session.end_profiling()` writes it; a benchmark's
        setting, `bench/context.py --profile`)."""
        self.path = path
        model_file = path / MODEL_FILE
        self.config = read_json(path / CONFIG_FILE, required=True)
        self.generation_config = read_json(path / GENERATION_CONFIG_FILE, required=False)
        if not model_file.is_file():
            raise ModelLoadError(f"{model_file}: missing; not an Optimum ONNX export dir")
        load: Callable[[], str | bytes]
        editable = can_edit()
        int8_kernel = False
        if editable:
            int8_kernel = ops_library is not None and int8_kernel_runs_faster(ops_library)
            plan = EditPlan(
                fuse=fuse_attention,
                int4_kernel=ops_library is not None,
                int8_kernel=int8_kernel,
                attention_kernel=attention_kernel and ops_library is not None,
                kv_cache_dtype=kv_cache_dtype,
            )
            load, tag = partial(edited_graph, model_file, self.config, plan), plan.cache_tag()
        else:
            load, tag, ops_library = partial(str, model_file), "as exported", None
        try:
            self.session = open_session(
                path,
                load,
                tag=tag,
                options=partial(session_options, threads, ops_library, profile),
                cache_dir=cache_dir,
            )
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
            raise ModelLoadError(
                f"{model_file}: ONNX Runtime cannot load it (or its external data file "
                f"{MODEL_FILE}_data): {exc}"
            ) from exc
        if ops_library is not None:
            held = huge_page_bytes(ops_library) / 1e6
            log.info("%s loaded; our ops' weights on 2 MB pages, process-wide: %.0f MB", path, held)
        metadata = self.session.get_modelmeta().custom_metadata_map
        edits, weights = edits_of(metadata)
        self.serving_path = describe(
            edits,
            weights,
            can_edit=editable,
            ops_library=ops_library,
            ops_missing=ops_missing,
            fuse=fuse_attention,
            int8_kernel=int8_kernel,
        )
        # Whether a call can have the logits of its last few positions (a speculative step's)
        self.logits_positions = _counts_logits_positions(self.session)
        self.last_position_only = _last_position_only(self.session, self.logits_positions)
        # Whether each position's logits are those it would get in a call of its own: not
        # where activations share a quantization scale (then drafts are not verified)
        self.positions_independent = not scales_shared(metadata)
        self.spec = _inspect(self.session, model_file, self.config)
        if kv_cache_dtype == "float16" and self.spec.kv_dtype != np.float16:
            log.warning(
                "%s: a float16 KV cache needs our attention op on every layer; its cache stays %s",
                path,
                np.dtype(self.spec.kv_dtype).name,
            )
        self.context_length = context_length_of(self.config)
        self.eos_token_ids = eos_ids_of(self.generation_config, self.config)
        self._output_names = ["logits", *self.spec.present_names]

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.spec.kv_heads, 0, self.spec.head_dim)
        return [np.zeros(shape, self.spec.kv_dtype) for _ in self.spec.past_names]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[np.ndarray],
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run the graph; return the last position's logits [batch, vocab] (float32) and the
        new KV arrays. `attention_mask` covers past + new tokens (0 marks left padding).
        For graphs as exported; a `shared_kv` graph is run by `kv_slots.SlotBatch`."""
        feed = {"input_ids": input_ids.astype(self.spec.ids_dtype, copy=False)}
        if self.spec.has_attention_mask:
            feed["attention_mask"] = attention_mask.astype(self.spec.mask_dtype, copy=False)
        if self.spec.has_position_ids:
            feed["position_ids"] = position_ids.astype(np.int64, copy=False)
        feed.update(zip(self.spec.past_names, past, strict=True))
        if self.logits_positions:
            feed[LOGITS_POSITIONS] = np.ones(1, np.int64)
        logits, *presents = self.session.run(self._output_names, feed)
        return self.last_logits(logits), presents

    def logits_buffer(self, positions: int) -> np.ndarray | None:
        """An array `[positions, vocab]` whose first rows x width rows, seen as `[rows, width,
        vocab]`, a call's logits are bound to, or None when the graph's logits have no fixed
        size per position (every position, or an unknown vocab)."""
        logits = _logits_output(self.session)
        vocab, dtype = logits.shape[-1], _ORT_TYPES.get(logits.type)
        if not self.last_position_only or not isinstance(vocab, int) or dtype is None:
            return None
        return np.empty((positions, vocab), dtype)

    @staticmethod
    def last_logits(logits: np.ndarray) -> np.ndarray:
        """The last position's logits [batch, vocab] as float32, from the graph's `logits`."""
        last = logits[:, -1, :]
        return last if last.dtype == np.float32 else last.astype(np.float32)
