"""Our ONNX Runtime custom ops library (`csrc/`): where it is, whether it runs here, and what it
reports (the instruction set it multiplies with, the weights it holds on 2 MB pages).

The library is compiled when the package is installed (`api/engine/ops/build.py`, run by
`setup.py`), so it may be absent, or built for a CPU without AVX2/FMA: then every graph keeps
ONNX Runtime's kernels, and `preferred_library` says why in a WARNING.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime as ort

log = logging.getLogger(__name__)

DOMAIN = "tokenshop"  # the ONNX domain of every op in the library
LIBRARY_NAME = "libtokenshop_ops.so"


def default_library() -> Path:
    """Where installing the package builds the library: beside this module."""
    return Path(__file__).with_name(LIBRARY_NAME)


@cache
def runs_here(library: Path) -> bool:
    """Whether `library` loads and this CPU has what its kernel needs (AVX2, FMA)."""
    try:
        handle = ctypes.CDLL(str(library))
        return bool(handle.tokenshop_ops_supported())
    except (OSError, AttributeError):
        return False


def unavailable_reason(library: Path | None = None) -> str | None:
    """Why our ops cannot serve on this machine, in a few words; None when they can."""
    library = library or default_library()
    if not library.is_file():
        return f"our ops library is not built ({library.name} missing: no C compiler at install?)"
    if not runs_here(library):
        return "this CPU lacks AVX2/FMA, which our ops need"
    return None


def preferred_library(library: Path | None = None) -> Path | None:
    """The library to serve graphs with on this machine, or None for ONNX Runtime's kernels
    (each model's start-up line and `/ready` say so, with `unavailable_reason`)."""
    library = library or default_library()
    return None if unavailable_reason(library) is not None else library


def isa_of(library: Path) -> str:
    """The instruction set the library's kernels multiply with here."""
    isa = ctypes.CDLL(str(library)).tokenshop_matmul_isa
    isa.restype = ctypes.c_char_p
    return str(isa().decode())


def huge_page_bytes(library: Path) -> int:
    """Bytes of weights the library's ops serve from their copies on 2 MB pages, in this
    process (`copy_weights` in csrc/matmul.c)."""
    held = ctypes.CDLL(str(library)).tokenshop_huge_page_bytes
    held.restype = ctypes.c_size_t
    return int(held())


def use_huge_pages(library: Path, on: bool) -> None:
    """Whether the library's ops made from now on, in this process, copy their weights onto
    2 MB pages (the default) or serve them from the file's pages, which processes share."""
    ctypes.CDLL(str(library)).tokenshop_use_huge_pages(ctypes.c_int(on))


def register(options: ort.SessionOptions, library: Path) -> None:
    options.register_custom_ops_library(str(library))
