"""Every text exists in both languages with the same placeholders, and is valid for Telegram."""

from __future__ import annotations

import re
from string import Formatter

import pytest

from bot.texts import LANGUAGES, TEXTS, Html, language_for, t

ALLOWED_TAGS = {"b", "i", "code", "pre", "tg-spoiler"}


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in Formatter().parse(template) if name}


@pytest.mark.parametrize("text_id", sorted(TEXTS))
def test_each_text_has_every_language_with_the_same_placeholders(text_id: str) -> None:
    versions = TEXTS[text_id]
    assert set(versions) == set(LANGUAGES)
    for version in versions.values():
        assert placeholders(version) == placeholders(versions["en"])
    for template in versions.values():
        assert set(re.findall(r"</?([a-z-]+)", template)) <= ALLOWED_TAGS


@pytest.mark.parametrize(
    ("code", "language"),
    [("ru", "ru"), ("ru-RU", "ru"), ("en", "en"), ("en-GB", "en"), ("de", "en"), (None, "en")],
)
def test_the_reply_language_follows_telegrams_language_code(
    code: str | None, language: str
) -> None:
    assert language_for(code) == language


def test_values_are_escaped_but_composed_html_is_not_escaped_twice() -> None:
    inner = t("en", "refund_shortfall", tokens="<5>")
    assert inner == ", &lt;5&gt; were already spent"
    outer = t("en", "refund_done", price=1, charge_id="a&b", tokens="1", shortfall=inner)
    assert "<code>a&amp;b</code>" in outer and "&lt;5&gt;" in outer
    assert isinstance(outer, Html)
