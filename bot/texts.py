"""Every string the bot shows, one file per language under `bot/locales/`, and the helpers that
fill them in.

A language is a module `bot/locales/<code>.py` with a `NAME` and a `TEXTS` dict; adding one is
adding a file (English, the fallback, has every id). Replies use Telegram's HTML parse mode.
`t()` escapes every string value it is given, except `Html` values (text that `t()` itself
produced), so a buyer's name or a pack title can never inject markup, and composed messages are
not escaped twice.
"""

from __future__ import annotations

import html
import importlib
import pkgutil
from datetime import datetime
from types import ModuleType

import bot.locales

Lang = str  # a language code that has a file under bot/locales
DEFAULT: Lang = "en"


class Html(str):
    """A string that is already valid Telegram HTML."""


def _load() -> tuple[dict[Lang, str], dict[str, dict[Lang, str]]]:
    modules: dict[Lang, ModuleType] = {
        info.name: importlib.import_module(f"bot.locales.{info.name}")
        for info in pkgutil.iter_modules(bot.locales.__path__)
    }
    names = {code: str(module.NAME) for code, module in sorted(modules.items())}
    texts: dict[str, dict[Lang, str]] = {}
    for code, module in modules.items():
        for text_id, template in module.TEXTS.items():
            texts.setdefault(text_id, {})[code] = template
    return names, texts


LANGUAGE_NAMES, TEXTS = _load()
LANGUAGES: tuple[Lang, ...] = (DEFAULT, *sorted(set(LANGUAGE_NAMES) - {DEFAULT}))


def language_for(code: str | None) -> Lang:
    """The reply language for a Telegram `language_code` (e.g. "ru", "ru-RU", "en-GB") or a
    language chosen in the picker; English when there is no file for it."""
    primary = code.lower().split("-")[0] if code else DEFAULT
    return primary if primary in LANGUAGE_NAMES else DEFAULT


def _template(lang: Lang, text_id: str) -> str:
    versions = TEXTS[text_id]
    return versions.get(lang) or versions[DEFAULT]


def number(lang: Lang, value: int) -> str:
    """12,345 in English, 12 345 in Russian."""
    grouped = f"{value:,}"
    return grouped.replace(",", "\u00a0") if lang == "ru" else grouped


def when(value: datetime) -> str:
    return f"{value:%Y-%m-%d %H:%M} UTC"


def t(lang: Lang, text_id: str, /, **values: object) -> Html:
    template = _template(lang, text_id)
    safe = {
        name: value if isinstance(value, Html) else html.escape(str(value), quote=False)
        for name, value in values.items()
    }
    return Html(template.format(**safe))


def plain(lang: Lang, text_id: str, /, **values: object) -> str:
    """For places Telegram does not parse as HTML: buttons, invoices, pre-checkout errors."""
    return _template(lang, text_id).format(**values)


def lines(parts: list[Html]) -> Html:
    return Html("\n".join(parts))


def snippet(lang: Lang, *, key: str, base_url: str, model: str) -> Html:
    """The ready-to-paste setup: base URL, a curl call and an `openai` SDK call."""
    curl = (
        f"curl {base_url}/chat/completions \\\n"
        f'  -H "Authorization: Bearer {key}" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\''
    )
    python = (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base_url}", api_key="{key}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{model}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        ")\n"
        "print(reply.choices[0].message.content)"
    )
    return t(
        lang,
        "snippet",
        key=key,
        base_url=base_url,
        curl=Html(
            f'<pre><code class="language-bash">{html.escape(curl, quote=False)}</code></pre>'
        ),
        python=Html(
            f'<pre><code class="language-python">{html.escape(python, quote=False)}</code></pre>'
        ),
    )
