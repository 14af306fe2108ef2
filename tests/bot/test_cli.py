"""The bot's `tokenshop bot` command, run as the operator runs it (the `tokenshop` fixture)."""

from __future__ import annotations


def test_bot_without_a_token_says_how_to_get_one_and_exits_2(tokenshop):
    result = tokenshop("bot", TELEGRAM_BOT_TOKEN="")
    assert result.returncode == 2
    assert result.stderr.startswith("tokenshop bot: TELEGRAM_BOT_TOKEN is not set; ")
    assert result.stderr.count("\n") == 1
