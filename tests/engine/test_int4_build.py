"""Building the int4 kernel: an operator without a compiler or header is told why, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.engine import int4_build
from api.engine.int4_build import _suite_sources, build, main


def test_without_a_compiler_the_build_says_why_and_serving_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(int4_build.shutil, "which", lambda name: None)
    assert main([]) == 0
    assert main(["--require"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines
        == [
            "int4 kernel not built: no C compiler ($CC, cc or gcc) to build the int4 kernel; "
            "serving uses ONNX Runtime's kernel"
        ]
        * 2
    )


def test_a_header_given_by_the_operator_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ORT_INCLUDE_DIR wins over every other place; a wrong one fails the compile, named."""
    (tmp_path / "onnxruntime_c_api.h").write_text("#error not the real header\n")
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(tmp_path))
    with pytest.raises(int4_build.BuildError, match="not the real header"):
        build(tmp_path / "lib.so")
    assert not (tmp_path / "lib.so").exists()


def test_debian_sources_are_asked_for_the_suite_with_the_package() -> None:
    machine = (
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    assert _suite_sources(machine) == (
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: trixie\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
