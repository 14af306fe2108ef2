"""`tokenshop export-model --task embedding`: a sentence-transformers model as an export the
embedding engine serves.

optimum-onnx's `feature-extraction` export gives the transformer's `last_hidden_state`; the
pooling and normalization stay sentence-transformers' own files (`modules.json`,
`1_Pooling/config.json`, `sentence_bert_config.json`), copied beside the graph, where the engine
reads them (`api/engine/embedding/pooling.py`). `--quantize int8` applies ONNX Runtime's dynamic
int8 quantization to every MatMul, with 7-bit weights scaled per column so that CPUs without
VNNI run it without overflow (`api/engine/export/quantize.py`). The export ends by loading the
result with the engine and embedding a sentence, so a dir that cannot be served is found here.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import warnings
from pathlib import Path

from api.engine.embedding.pooling import module_kind
from api.engine.export.exporter import (
    ExportFailed,
    ExportResult,
    Progress,
    _require_export_stack,
)
from api.engine.export.quantize import quantize_int8

# sentence-transformers' files the engine reads (the module dirs are found in modules.json)
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def export_embedding(
    source: str, out: Path, quantize: str | None = None, progress: Progress | None = None
) -> ExportResult:
    """Export the sentence-transformers model dir `source` to `out`; `quantize`: None or
    "int8". A dir without `modules.json` is exported too, when its graph will carry a pooled
    output; otherwise the engine's load check says what is missing."""
    say = progress or (lambda _message: None)
    if quantize not in (None, "int8"):
        raise ValueError(f"an embedding export is quantized to int8 or not at all, not {quantize}")
    _require_export_stack()
    from optimum.exporters.onnx import main_export

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    root = Path(source)
    if not root.is_dir():
        raise ExportFailed(f"{source}: not a directory (a sentence-transformers model dir)")
    transformer = root / _transformer_path(root)
    say(f"exporting {transformer} with optimum-onnx (feature-extraction)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's chatter; the load check below decides
        main_export(
            str(transformer),
            out,
            task="feature-extraction",
            library_name="transformers",
            do_validation=False,
        )
    _copy_sentence_files(root, transformer, out)
    if quantize == "int8":
        say("quantizing weights to int8 (ONNX Runtime dynamic quantization)")
        quantize_int8(out, any_cpu=True)  # an export is served on any CPU, VNNI or not
    say("checking the export with the embedding engine")
    dimensions = check_embedding_export(out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    say(f"done: {out} ({size / 1e6:.1f} MB); {dimensions}-dimensional vectors")
    return ExportResult(path=out, size_bytes=size, sample_text=f"{dimensions} dimensions")


def _transformer_path(root: Path) -> str:
    """Where the transformer's own files are: the root, or (older models) a module dir."""
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return ""
    for module in json.loads(modules_file.read_text(encoding="utf-8")):
        if module_kind(module) == "Transformer":
            return str(module.get("path") or "")
    return ""


def _copy_sentence_files(root: Path, transformer: Path, out: Path) -> None:
    for name in ST_FILES:
        if (root / name).is_file():
            shutil.copy2(root / name, out / name)
    for name in TOKENIZER_FILES:
        if (transformer / name).is_file() and not (out / name).exists():
            shutil.copy2(transformer / name, out / name)
    if (root / "modules.json").is_file():
        for module in json.loads((root / "modules.json").read_text(encoding="utf-8")):
            path = str(module.get("path") or "")
            if path and module_kind(module) != "Transformer" and (root / path).is_dir():
                shutil.copytree(root / path, out / path, dirs_exist_ok=True)
    if not (out / "tokenizer.json").exists():
        raise ExportFailed(f"{root}: has no fast tokenizer; the engine needs tokenizer.json")


def check_embedding_export(out: Path) -> int:
    """Load `out` as the server does and embed a sentence; the vectors' width."""
    from api.engine.embedding.engine import LocalEmbeddingEngine

    async def run() -> int:
        engine = LocalEmbeddingEngine(out.name, out, threads=1)
        await engine.start()
        try:
            vectors = await engine.embed(engine.tokenize(["A sentence to check the export."]))
        finally:
            await engine.shutdown()
        return int(vectors.shape[1])

    result: dict[str, object] = {}

    def target() -> None:  # a thread of its own: callers may be inside a running loop
        try:
            result["dimensions"] = asyncio.run(run())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="export-check")
    thread.start()
    thread.join()
    error = result.get("error")
    if isinstance(error, BaseException):
        raise ExportFailed(f"{out}: the embedding engine cannot serve it: {error}") from error
    return int(result["dimensions"])  # type: ignore[call-overload]
