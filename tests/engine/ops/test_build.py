"""Building our ops library: an operator without a compiler is told why, in one line, and the
install goes on; a broken build is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.engine.ops import build as ops_build
from api.engine.ops.build import build, main


def test_without_a_compiler_the_build_says_why_and_serving_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(ops_build.shutil, "which", lambda name: None)
    monkeypatch.delenv(ops_build.REQUIRE_ENV, raising=False)
    assert main([]) == 0
    assert main(["--require"]) == 1
    monkeypatch.setenv(ops_build.REQUIRE_ENV, "1")
    assert main([]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines
        == [
            "ops library not built: no C compiler ($CC, cc or gcc) to build our ops; "
            "serving uses ONNX Runtime's kernels"
        ]
        * 3
    )


def test_a_failed_compile_is_named_and_leaves_no_library(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("#error not C we can build\n")
    monkeypatch.setattr(ops_build, "SOURCES", [broken])
    with pytest.raises(ops_build.BuildError, match="not C we can build"):
        build(tmp_path / "lib.so")
    assert not (tmp_path / "lib.so").exists()
