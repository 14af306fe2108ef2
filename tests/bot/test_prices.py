"""The prices a buyer reads under /help and /terms are the ones the API bills with: the models
file's `price_prompt` / `price_completion` and MODEL_PRICES, read through the same settings."""

from __future__ import annotations

import pytest

from bot.settings import BotSettings
from tests.bot.double import FakeTelegram, TelegramUser

pytestmark = pytest.mark.anyio

MODELS_FILE = """
[[model]]
name = "llama-70b"
upstreams = ["http://gpu-a:8000/v1"]
price_prompt = 1.0
price_completion = 3.0

[[model]]
name = "cheap"
upstreams = ["http://gpu-b:8000/v1"]
price_prompt = 0.25
price_completion = 0.25
"""


@pytest.fixture
def bot_settings(bot_settings: BotSettings, tmp_path) -> BotSettings:
    path = tmp_path / "models.toml"
    path.write_text(MODELS_FILE)
    return bot_settings.model_copy(update={"models_file": str(path), "model_prices": "demo=2"})


async def test_help_and_terms_show_each_models_prices(
    alice: TelegramUser, boris: TelegramUser, telegram: FakeTelegram, bot_settings: BotSettings
) -> None:
    await alice.send("/help")
    help_text = telegram.last_text_to(alice.id)
    assert "<code>llama-70b</code>: 1 / 3" in help_text
    assert "<code>cheap</code>: 0.25" in help_text
    assert "<code>demo</code>: 2" in help_text

    await alice.send("/terms")
    assert "<code>llama-70b</code>: 1 / 3" in telegram.last_text_to(alice.id)

    await boris.send("/help")
    assert "Цены" in telegram.last_text_to(boris.id)
    # the API's settings read the same table
    assert bot_settings.prices()["llama-70b"].cost(10, 10) == 40
