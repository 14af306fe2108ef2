"""Compiles our ONNX Runtime ops library as part of every install (`api/engine/ops/build.py`).

The library is a plain shared object that ONNX Runtime loads by path, not a Python extension
module: setuptools' `build_ext` is only the hook that puts it in the wheel (or, for an editable
install, beside its sources). A failed compile leaves an install that serves ONNX Runtime's
kernels, unless TOKENSHOP_REQUIRE_OPS=1 asks for the build to fail.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent
OPS = "api/engine/ops"


def _build_module():  # loaded by path: the package's own imports are not installed yet
    spec = importlib.util.spec_from_file_location("_tokenshop_ops_build", ROOT / OPS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildOps(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return str(Path(*fullname.split(".")).with_suffix(".so"))

    def build_extension(self, ext: Extension) -> None:
        ops = _build_module()
        target = Path(self.get_ext_fullpath(ext.name))
        try:
            ops.build(target)
        except ops.BuildError as exc:
            if ops.required():
                raise
            print(
                f"ops library not built: {exc}; serving uses ONNX Runtime's kernels",
                file=sys.stderr,
            )


setup(
    ext_modules=[
        Extension(
            "api.engine.ops.libtokenshop_ops",
            sources=[
                f"{OPS}/csrc/{name}" for name in ("ops.c", "matmul.c", "attention.c", "embedding.c")
            ],
        )
    ],
    cmdclass={"build_ext": BuildOps},
)
