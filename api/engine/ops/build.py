"""Compile our ops library (`csrc/*.c`) with the machine's C compiler.

    python -m api.engine.ops.build [--require]

Installing the package runs this (`setup.py`), so `pip install .`, `pip install -e .` and an
install from the sdist all put `libtokenshop_ops.so` beside `library.py`. The sources include
ONNX Runtime's C API header, vendored under `csrc/third_party/` (no wheel ships it); the library
asks the runtime for that API version, which any newer runtime serves. One build serves every
x86-64 CPU: each kernel is compiled per instruction set and chosen at run time.

Without a compiler the install still succeeds and the engine serves ONNX Runtime's kernels (it
says so at start-up); the build says why in one line, and fails instead under `--require` or
with `TOKENSHOP_REQUIRE_OPS=1` in the environment (CI, so a broken build cannot pass unseen).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / name for name in ("ops.c", "matmul.c", "attention.c", "embedding.c")]
INCLUDE = CSRC / "third_party"
FLAGS = ["-O3", "-std=c11", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror"]
REQUIRE_ENV = "TOKENSHOP_REQUIRE_OPS"


class BuildError(Exception):
    """Why the library was not built, in one line."""


def build(library: Path) -> Path:
    """Compile the library into `library`; the path written. Written whole or not at all."""
    compiler = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError("no C compiler ($CC, cc or gcc) to build our ops")
    library.parent.mkdir(parents=True, exist_ok=True)
    partial = library.with_suffix(".partial")
    command = [compiler, *FLAGS, f"-I{INCLUDE}", *map(str, SOURCES), "-lm", "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{Path(compiler).name} failed: {result.stderr.strip()[:500]}")
    partial.replace(library)
    return library


def required() -> bool:
    """Whether a failed build must fail the install (`TOKENSHOP_REQUIRE_OPS=1`)."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    from api.engine.ops.library import default_library, runs_here

    parser = argparse.ArgumentParser(description="Build our ONNX Runtime ops library.")
    parser.add_argument("--require", action="store_true", help="fail when it cannot be built")
    args = parser.parse_args(argv)
    try:
        library = build(default_library())
    except BuildError as exc:
        print(f"ops library not built: {exc}; serving uses ONNX Runtime's kernels")
        return 1 if args.require or required() else 0
    note = "" if runs_here(library) else " (this CPU lacks AVX2/FMA: it will not be used)"
    print(f"ops library built: {library}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
