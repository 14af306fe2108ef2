"""An operator's deploy: `pip install .` of the checkout into a fresh venv (no extras), then the
Procfile's `web` line. The install serves what the README measures: the edited graph on our
ops; where the ops library is missing, it serves ONNX Runtime's kernels and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from api.engine.ops.library import LIBRARY_NAME
from tests.api.conftest import free_port
from tests.conftest import TEST_SECRET_KEY
from tests.faults import poll

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow  # a venv and an install from the package index's cache: a minute


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the checkout installed as a user installs it: `pip install .`."""
    venv = tmp_path_factory.mktemp("deploy") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


def installed_library(venv: Path) -> Path:
    (library,) = venv.glob(f"lib/python*/site-packages/api/engine/ops/{LIBRARY_NAME}")
    return library


def web_command() -> str:
    """The Procfile's `web` line, as the platform runs it."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            return line.removeprefix("web:").strip()
    raise AssertionError("the Procfile has no web line")


@contextmanager
def procfile_web(venv: Path, model: Path, database_url: str, workdir: Path) -> Iterator[str]:
    """The `web` line run by a shell in a dir without the checkout, so that the installed
    package (not the source tree) is what serves; its base URL while it runs."""
    port = free_port()
    env = {
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
        "PORT": str(port),
        "DATABASE_URL": database_url,
        "SECRET_KEY": TEST_SECRET_KEY,
        "MODELS": f"int4={model}",
        "ENGINE_CACHE_DIR": str(workdir / "graph-cache"),
    }
    log_path = workdir / f"web-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {web_command()}"],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        poll(lambda: _ready(base) or process.poll() is not None, within=120, what="web started")
        assert process.poll() is None, log_path.read_text()
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def serving(base: str) -> dict[str, Any]:
    body = httpx.get(f"{base}/ready", timeout=5).json()
    return dict(body["serving"]["int4"])


def test_a_plain_install_serves_int4_on_the_fused_graph_and_our_ops(
    plain_install: Path, int4_export: Path, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    assert installed_library(plain_install).is_file()
    with procfile_web(plain_install, int4_export, database_url, tmp_path) as base:
        path = serving(base)
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
    assert path["weights"] == "int4"
    assert {"last-logits", "fused-attention", "int4-matmul", "attention"} <= set(
        path["graph_edits"]
    )
    assert path["ops"] == "tokenshop"
    assert path["fallbacks"] == []
    assert 'tokenshop_engine_fallbacks{model="int4"} 0.0' in metrics
    assert 'ops="tokenshop"' in metrics


def test_without_the_ops_library_it_serves_onnx_runtime_kernels_and_warns(
    plain_install: Path, int4_export: Path, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    """As on a machine that had no C compiler when it installed."""
    library = installed_library(plain_install)
    library.rename(library.with_suffix(".away"))
    try:
        with procfile_web(plain_install, int4_export, database_url, tmp_path) as base:
            path = serving(base)
            metrics = httpx.get(f"{base}/metrics", timeout=5).text
    finally:
        library.with_suffix(".away").rename(library)
    assert path["ops"] == "onnxruntime"
    assert "fused-attention" in path["graph_edits"]
    assert not {"int4-matmul", "attention"} & set(path["graph_edits"])
    assert path["fallbacks"] == [
        f"ONNX Runtime's kernels: our ops library is not built ({LIBRARY_NAME} missing: "
        "no C compiler at install?)"
    ]
    assert 'tokenshop_engine_fallbacks{model="int4"} 1.0' in metrics
    (log,) = tmp_path.glob("web-*.log")
    warnings = [line for line in log.read_text().splitlines() if " WARNING " in line]
    assert any("model int4 is not on the optimized path" in line for line in warnings)
