"""The committed demo model loads through the registry and answers a chat, offline."""

from __future__ import annotations

import pytest

from api.engine.protocol import ChatMessage, GenerationRequest, SamplingParams
from api.engine.registry import EngineConfig, load_engines, parse_models_spec
from tests.engine.conftest import DEMO_DIR, collect

pytestmark = pytest.mark.anyio


def test_demo_export_is_small_and_in_optimum_layout() -> None:
    names = {p.name for p in DEMO_DIR.iterdir()}
    assert {
        "model.onnx",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    } <= names
    assert sum(p.stat().st_size for p in DEMO_DIR.iterdir()) < 8_000_000


def test_models_spec_names_models_by_dir_or_by_prefix() -> None:
    entries = parse_models_spec(" models/demo , big=models/demo ")
    assert [(name, path.resolve()) for name, path in entries] == [
        ("demo", DEMO_DIR),
        ("big", DEMO_DIR),
    ]


async def test_demo_engine_answers_a_chat_through_the_registry() -> None:
    engines = load_engines("models/demo", EngineConfig(threads=1))
    engine = engines["demo"]
    assert engine.context_length == 131072
    await engine.start()
    try:
        await engine.check_health()
        prompt = engine.encode_chat([ChatMessage("system", "Be brief."), ChatMessage("user", "hi")])
        text = engine.tokenizer.decode(prompt)  # type: ignore[attr-defined]
        assert text.endswith("assistant\n")
        outputs = await collect(
            engine, GenerationRequest("r1", prompt, SamplingParams(max_tokens=8, temperature=0))
        )
    finally:
        await engine.shutdown()
    assert outputs[-1].finished and outputs[-1].finish_reason == "length"
    assert outputs[-1].completion_tokens == 8 and outputs[-1].prompt_tokens == len(prompt)
    assert [o.completion_tokens for o in outputs] == list(range(1, 9))
