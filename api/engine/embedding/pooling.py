"""How an export turns token states into one vector, read from its own files, never guessed.

Optimum's `feature-extraction` export gives `last_hidden_state`; the pooling and normalization
are sentence-transformers' modules, listed in `modules.json` with the pooling's settings in
`1_Pooling/config.json`. An export made with `--library-name sentence_transformers` has them in
the graph already, as a `sentence_embedding` output. A dir with neither is refused at load with
what to add: a silently guessed pooling gives vectors that look right and retrieve badly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from api.engine.errors import ModelLoadError

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "sentence_bert_config.json"
POOLED_OUTPUT = "sentence_embedding"  # sentence-transformers' pooled (and normalized) output
TOKEN_OUTPUT = "last_hidden_state"

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len", "lasttoken", "graph"]
# 1_Pooling/config.json's flag for each mode this engine runs
_FLAGS: dict[str, PoolingMode] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
# sentence-transformers 5.x's `pooling_mode` names, and the modules by their class name (the
# package path changed in 5.x: `sentence_transformers.models.Pooling` was moved, not renamed)
_MODES: dict[str, PoolingMode] = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "lasttoken": "lasttoken",
}
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"
HOW_TO_FIX = (
    "export it with `tokenshop export-model --task embedding` from a sentence-transformers "
    "model dir, or add that model's modules.json and 1_Pooling/config.json to the export"
)


@dataclass(frozen=True)
class Pooling:
    """`mode` "graph": the graph's `sentence_embedding` is the vector (pooled, and normalized
    where the model normalizes, inside the graph)."""

    mode: PoolingMode
    normalize: bool

    def apply(self, states: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """[batch, seq, hidden] states of right-padded rows of `lengths` -> [batch, hidden]."""
        if self.mode == "graph":
            pooled = states
        elif self.mode == "cls":
            pooled = states[:, 0]
        elif self.mode == "lasttoken":
            pooled = states[np.arange(len(lengths)), lengths - 1]
        else:
            mask = (np.arange(states.shape[1])[None, :] < lengths[:, None])[..., None]
            if self.mode == "max":
                pooled = np.where(mask, states, np.float32(-1e9)).max(axis=1)
            else:
                summed = (states * mask).sum(axis=1, dtype=np.float32)
                count = lengths[:, None].astype(np.float32)
                pooled = summed / (np.sqrt(count) if self.mode == "mean_sqrt_len" else count)
        pooled = np.ascontiguousarray(pooled, dtype=np.float32)
        return normalized(pooled) if self.normalize else pooled


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (torch's `F.normalize`: a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


def read_pooling(path: Path, outputs: set[str]) -> Pooling:
    """The pooling of the export at `path`, whose graph has `outputs`."""
    modules = _modules(path)
    if POOLED_OUTPUT in outputs:
        # pooled in the graph; a Normalize module, where listed, was exported with it
        return Pooling("graph", normalize=False)
    if TOKEN_OUTPUT not in outputs:
        raise ModelLoadError(
            f"{path / 'model.onnx'}: has neither a {POOLED_OUTPUT} nor a {TOKEN_OUTPUT} output "
            f"(outputs: {', '.join(sorted(outputs))}); not a feature-extraction export"
        )
    if modules is None:
        raise ModelLoadError(
            f"{path}: the pooling cannot be read: there is no {MODULES_FILE} and the graph has "
            f"no {POOLED_OUTPUT} output; {HOW_TO_FIX}"
        )
    kinds = [module_kind(module) for module in modules]
    pooling = [module for module, kind in zip(modules, kinds, strict=True) if kind == _POOLING]
    if not pooling:
        raise ModelLoadError(f"{path / MODULES_FILE}: lists no Pooling module; {HOW_TO_FIX}")
    unknown = [
        str(module.get("type"))
        for module, kind in zip(modules, kinds, strict=True)
        if kind not in (_TRANSFORMER, _POOLING, _NORMALIZE)
    ]
    if unknown:
        raise ModelLoadError(
            f"{path / MODULES_FILE}: lists {unknown[0]}, which this engine does not run "
            "(it runs Transformer, Pooling and Normalize); export with "
            "`--library-name sentence_transformers` to have it in the graph"
        )
    config_path = path / str(pooling[0].get("path") or "1_Pooling") / "config.json"
    return Pooling(_mode(config_path), normalize=_NORMALIZE in kinds)


def module_kind(module: dict[str, Any]) -> str:
    """`Transformer`, `Pooling`, `Normalize`, ...: the class name of a modules.json entry."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _modules(path: Path) -> list[dict[str, Any]] | None:
    file = path / MODULES_FILE
    if not file.is_file():
        return None
    modules = _json(file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelLoadError(f"{file}: not a list of modules")
    return modules


def _mode(config_path: Path) -> PoolingMode:
    if not config_path.is_file():
        raise ModelLoadError(f"{config_path}: missing (the Pooling module's settings)")
    config = _json(config_path)
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path}: not a JSON object")
    if (
        config.get("pooling_mode_weightedmean_tokens")
        or config.get("pooling_mode") == "weightedmean"
    ):
        raise ModelLoadError(f"{config_path}: weighted-mean pooling is not supported")
    if config.get("include_prompt") is False:
        raise ModelLoadError(f"{config_path}: pooling without the prompt is not supported")
    named = config.get("pooling_mode")  # sentence-transformers 5.x: a name (or several)
    if named is not None:
        names = [named] if isinstance(named, str) else named
        if not isinstance(names, list) or not all(name in _MODES for name in names):
            raise ModelLoadError(
                f"{config_path}: pooling_mode {named!r} is not one this engine runs "
                f"({', '.join(_MODES)})"
            )
        modes = [_MODES[name] for name in names]
    else:
        modes = [mode for flag, mode in _FLAGS.items() if config.get(flag)]
    if len(modes) != 1:
        raise ModelLoadError(
            f"{config_path}: sets {len(modes)} pooling modes; exactly one of "
            f"{', '.join(_FLAGS)} must be true"
        )
    return modes[0]


def max_seq_length(path: Path) -> int | None:
    """sentence-transformers' own input limit (`sentence_bert_config.json`), if it says."""
    file = path / ST_CONFIG_FILE
    if not file.is_file():
        return None
    value = _json(file)
    length = value.get("max_seq_length") if isinstance(value, dict) else None
    return length if isinstance(length, int) and length > 0 else None


def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{file}: unreadable JSON: {exc}") from exc
