"""`tokenshop export-model`: turn a transformers model into a dir this engine serves.

Wraps optimum-onnx's `text-generation-with-past` export (the layout `model.py` reads), makes sure
the tokenizer, chat template and generation config travel with the graph, optionally applies ONNX
Runtime's dynamic int8 quantization (about 4x less memory traffic per decoded token, which is what
bounds CPU decode speed), and ends by loading the result with the engine and generating a few
tokens, so a broken export is found by the operator, not by the first customer.

The export stack (torch, transformers, optimum-onnx) is the optional `export` extra; it is imported
only inside `export_model`, never by serving.
"""

from __future__ import annotations

import asyncio
import importlib
import shutil
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.engine.export.quantize import quantize_int4, quantize_int8
from api.engine.protocol import ChatMessage, GenerationRequest, SamplingParams

INSTALL_HINT = "pip install 'tokenshop[export]'"
QUANTIZATIONS = ("int8", "int4")
# Files the engine reads besides the graph; optimum usually writes them, a local source may have
# ones it skipped (e.g. a chat_template.jinja).
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)

Progress = Callable[[str], None]


class ExportUnavailable(RuntimeError):
    """The export extra (torch, transformers, optimum-onnx) is not installed."""


class ExportFailed(RuntimeError):
    """The export ran but its result cannot be served."""


@dataclass(frozen=True)
class ExportResult:
    path: Path
    size_bytes: int
    sample_text: str  # what the exported model generated in the final check


def _require_export_stack() -> None:
    for module in ("torch", "transformers", "optimum.exporters.onnx", "onnx"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ExportUnavailable(
                f"exporting models needs the export extra ({module} is missing): {INSTALL_HINT}"
            ) from exc


def export_model(
    source: str, out: Path, quantize: str | None = None, progress: Progress | None = None
) -> ExportResult:
    """Export `source` (a hub id or a local transformers dir) to `out`, ready for `MODELS`.

    `quantize` is None, "int8" or "int4" (see `api.engine.export.quantize` for what each does to the
    LM head). `progress` receives one line per stage.
    """
    say = progress or (lambda _message: None)
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {QUANTIZATIONS}, not {quantize!r}")
    _require_export_stack()
    from optimum.exporters.onnx import main_export

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    say(f"exporting {source} with optimum-onnx (text-generation-with-past)")
    with warnings.catch_warnings():
        # The TorchScript exporter warns about tracing and its own deprecation on every model;
        # the result is checked by generating with the engine below instead.
        warnings.simplefilter("ignore")
        _optimum_export(main_export, source, out, say)
    _copy_side_files(source, out, say)

    if quantize == "int8":
        say("quantizing weights to int8 (ONNX Runtime dynamic quantization)")
        quantize_int8(out)
    elif quantize == "int4":
        say("quantizing weights to int4 (MatMulNBits; the LM head at 8 bits)")
        quantize_int4(out)

    say("checking the export with the engine")
    sample = _generate_sample(out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    say(f"done: {out} ({size / 1e6:.1f} MB); sample output {sample!r}")
    return ExportResult(path=out, size_bytes=size, sample_text=sample)


def _optimum_export(main_export: Callable[..., Any], source: str, out: Path, say: Progress) -> None:
    """optimum's export, and again without its post-processing where that failed.

    The post-processing dedups a tied embedding and head by serializing the whole graph as one
    protobuf, which cannot pass 2 GB: the fp32 graph of a tied model from about 1.5B parameters
    (Qwen2.5-1.5B's) fails there after the export itself succeeded. Without it the head keeps a
    copy of the embedding of its own, as our quantizers untie it anyway
    (bench/results/2026-11-26-compare-qwen2.5-1.5b-amx-xeon-2a29000.md)."""
    task = "text-generation-with-past"
    try:
        main_export(source, out, task=task, do_validation=False)
    except RuntimeError as exc:
        if "post-processing" not in str(exc):
            raise
        say("optimum's post-processing failed (a graph over 2 GB?): exporting without it")
        shutil.rmtree(out)
        out.mkdir(parents=True)
        main_export(source, out, task=task, do_validation=False, no_post_process=True)


def _copy_side_files(source: str, out: Path, say: Progress) -> None:
    local = Path(source)
    if local.is_dir():
        for name in SIDE_FILES:
            if (local / name).is_file() and not (out / name).exists():
                shutil.copy2(local / name, out / name)
    if not (out / "tokenizer.json").exists():
        # A slow (sentencepiece-only) tokenizer: transformers converts it to tokenizer.json.
        from transformers import AutoTokenizer

        say("converting the tokenizer to tokenizer.json")
        AutoTokenizer.from_pretrained(source).save_pretrained(out)
    if not (out / "tokenizer.json").exists():
        raise ExportFailed(f"{source}: has no fast tokenizer; the engine needs tokenizer.json")


def _generate_sample(out: Path, max_tokens: int = 8) -> str:
    """Load `out` like the server does and generate greedily (in a thread with its own loop,
    so this works from sync code and from inside a running event loop alike)."""
    from api.engine.local_engine import LocalEngine

    result: dict[str, object] = {}

    async def run() -> None:
        engine = LocalEngine(out.name, out)
        await engine.start()
        try:
            prompt = engine.encode_chat([ChatMessage("user", "Hello!")])
            request = GenerationRequest(
                "export-check", prompt, SamplingParams(max_tokens=max_tokens, temperature=0)
            )
            pieces = [o async for o in engine.generate(request)]
            result["text"] = "".join(o.text for o in pieces)
            result["tokens"] = pieces[-1].completion_tokens
        finally:
            await engine.shutdown()

    def target() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="export-check")
    thread.start()
    thread.join()
    error = result.get("error")
    if isinstance(error, BaseException):
        raise ExportFailed(f"{out}: the engine cannot generate from it: {error}") from error
    return str(result["text"])
