"""ONNX Runtime sessions whose optimized graph is kept on disk, so a restart skips optimizing.

The first load writes ONNX Runtime's optimized graph (weights included, as external data) under
`cache_dir/<key>/` and serves from it too; later loads read it. The key covers everything the
optimized graph depends on: the name, size and mtime of every file of the export, a tag for the
engine's graph edits, the ONNX Runtime version and the CPU. A changed model gets a new entry;
stale entries are left for the operator; a cache that cannot be written only costs the speed-up.
Figures: bench/results/2026-11-26-kernel-notes.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx_data"
_PROVIDERS = ["CPUExecutionProvider"]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tokenshop" / "onnx"


def cache_key(model_dir: Path, tag: str) -> str:
    digest = hashlib.sha256()
    for part in (tag, ort.__version__, platform.machine(), _cpu_id()):
        digest.update(part.encode() + b"\0")
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:32]


def _cpu_id() -> str:
    """The CPU model and feature flags (Linux); empty where /proc/cpuinfo is absent."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(sorted({line for line in lines if line.startswith(wanted)}))


def open_session(
    model_dir: Path,
    load_graph: Callable[[], str | bytes],
    *,
    tag: str,
    options: Callable[[], ort.SessionOptions],
    cache_dir: Path | None,
) -> ort.InferenceSession:
    """A session for the graph `load_graph` returns (a path, or edited bytes whose external
    weights live in `model_dir`), from the cache when `tag` and the dir's files match an entry."""
    entry = cache_dir / cache_key(model_dir, tag) if cache_dir is not None else None
    if entry is not None and (entry / MODEL_FILE).is_file():
        return _from_cache(entry, options())
    graph = load_graph()
    first = options()
    first.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(model_dir)
    )
    if entry is not None and (staging := _staging_dir(entry)) is not None:
        session = _create_and_cache(graph, first, staging, entry)
        del graph  # an edited graph's bytes: as large as its weights
        # A session made from graph bytes keeps ONNX Runtime's copy of the whole model besides
        # its weights; reopened from the entry just written it holds the weights alone
        # (bench/results/2026-11-26-kernel-notes.md).
        fresh = _reopened(entry, options())
        session = fresh if fresh is not None else session
    else:
        session = ort.InferenceSession(graph, first, providers=_PROVIDERS)
        del graph
    _release_freed_memory()  # glibc keeps what the load freed unless asked
    return session


def _create_and_cache(
    graph: str | bytes, options: ort.SessionOptions, staging: Path, entry: Path
) -> ort.InferenceSession:
    """A session that also writes its optimized graph into `staging`, published as `entry`."""
    options.optimized_model_filepath = str(staging / MODEL_FILE)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", DATA_FILE
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
    )
    try:
        session = ort.InferenceSession(graph, options, providers=_PROVIDERS)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _publish(staging, entry)
    return session


def _from_cache(entry: Path, options: ort.SessionOptions) -> ort.InferenceSession:
    return ort.InferenceSession(str(entry / MODEL_FILE), options, providers=_PROVIDERS)


def _reopened(entry: Path, options: ort.SessionOptions) -> ort.InferenceSession | None:
    try:
        return _from_cache(entry, options)
    except Exception as exc:  # noqa: BLE001 - the first session still serves
        log.warning("ONNX graph cache %s does not load back (%s): keeping the first", entry, exc)
        return None


def _release_freed_memory() -> None:
    """Hand glibc's free heap pages back to the OS (a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _staging_dir(entry: Path) -> Path | None:
    """A fresh dir beside `entry` for ONNX Runtime to write into; None if it cannot be made."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=entry.parent, prefix=".writing-"))
    except OSError as exc:
        log.warning("ONNX graph cache %s is not writable (%s): loading without it", entry, exc)
        return None


def _publish(staging: Path, entry: Path) -> None:
    """Move the written graph into place at once; another process may have won the race."""
    try:
        staging.rename(entry)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
