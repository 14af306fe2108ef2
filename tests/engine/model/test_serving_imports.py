"""Serving must run without the export stack: no torch, transformers or optimum in memory."""

from __future__ import annotations

import subprocess
import sys

from tests.engine.conftest import DEMO_DIR, ROOT

SCRIPT = f"""
import asyncio, sys
from api.engine.registry import EngineConfig, load_engines
from api.engine.protocol import ChatMessage, GenerationRequest, SamplingParams

async def main():
    engine = load_engines({str(DEMO_DIR)!r}, EngineConfig(threads=1))["demo"]
    await engine.start()
    prompt = engine.encode_chat([ChatMessage("user", "hi")])
    request = GenerationRequest("r", prompt, SamplingParams(max_tokens=3, temperature=0))
    outputs = [o async for o in engine.generate(request)]
    await engine.shutdown()
    assert outputs[-1].completion_tokens == 3

asyncio.run(main())
heavy = sorted(m for m in ("torch", "transformers", "optimum") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


def test_serving_a_model_imports_no_torch_transformers_or_optimum() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY=\n" in result.stdout
