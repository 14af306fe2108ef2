"""Upstream servers for the upstream tests: the fault-injecting one (`tests/fake_upstream.py`)
and llama-cpp-python's, each a process of its own, and a models file pointing at them."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import free_port
from tests.faults import poll

ROOT = Path(__file__).resolve().parents[2]


def make_gguf(out: Path, **options: Any) -> Path:
    """A tiny random-weight GGUF with the demo tokenizer (`models/make_gguf.py`, a script:
    loaded by path); `options` go to it (`pooling="mean"` for an embedding server)."""
    spec = importlib.util.spec_from_file_location(
        "tokenshop_make_gguf", ROOT / "models" / "make_gguf.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_gguf(out, **options)


def llama_cpp_server(gguf: Path, *options: str) -> UpstreamProcess:
    """llama-cpp-python's OpenAI-compatible server for `gguf` on a free loopback port, one
    thread, a 2,048-token context; `options` are its own flags (`--embedding`, `true`)."""
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"]
    argv += ["--n_threads", "1", "--n_threads_batch", "1", "--verbose", "False", *options]
    return UpstreamProcess(argv, port=port)


class UpstreamProcess:
    """A server process on a loopback port; `kill()` is SIGKILL, so connections just drop."""

    def __init__(self, argv: Sequence[str], *, port: int, env: dict[str, str] | None = None):
        self.port = port
        self.process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=os.environ | (env or {}),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, within: float = 60) -> UpstreamProcess:
        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"upstream exited: {self.process.stderr.read().decode()[-2000:]}"
                )
            try:
                return httpx.get(f"{self.base_url}/models", timeout=1).status_code in (200, 401)
            except httpx.HTTPError:
                return False

        poll(answers, within=within, what="the upstream answering", every=0.05)
        return self

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process.stderr is not None:
            self.process.stderr.close()


class FakeUpstream(UpstreamProcess):
    def __init__(self, *, delay: float = 0.01, cut_after: int = 3, mode: str = "ok", **kw: Any):
        port = free_port()
        super().__init__(
            [
                sys.executable,
                "-m",
                "tests.fake_upstream",
                "--port",
                str(port),
                "--delay",
                str(delay),
                "--cut-after",
                str(cut_after),
                "--mode",
                mode,
            ],
            port=port,
            **kw,
        )

    def mode(self, mode: str) -> None:
        httpx.post(f"http://127.0.0.1:{self.port}/_mode", json={"mode": mode}).raise_for_status()

    def state(self) -> dict[str, Any]:
        return httpx.get(f"http://127.0.0.1:{self.port}/_state").json()


def models_toml(name: str, upstreams: Sequence[str], **fields: Any) -> str:
    """One `[[model]]` table, as an operator writes it."""
    lines = ["[[model]]", f'name = "{name}"', f"upstreams = {list(upstreams)!r}".replace("'", '"')]
    for key, value in fields.items():
        lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}")
    return "\n".join(lines) + "\n"
