"""The Mini App's fixtures: the real app under uvicorn with the bot's token, Telegram's Bot API
played by the bot tests' stand-in (tests/bot/double.py), initData signed as Telegram signs it,
the bot itself (to credit what the page's invoices are paid with), and headless Chromium."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from pydantic import SecretStr

from tests.api.conftest import LiveServer
from tests.bot.conftest import (  # noqa: F401  (the bot's fixtures, for the stories that pay)
    ADMIN_ID,
    alice,
    books_balance_after_every_story,
    bot_settings,
    operator,
    shop_bot,
    telegram,
)
from tests.bot.double import API_BASE_URL, BOT_TOKEN, FakeTelegram

PACKS = "starter:100000:50:Starter,pro:2000000:700:Pro"
PLANS = "basic:1000000:300:Basic"  # a monthly plan (docs/plans.md)
STAND_IN = Path(__file__).with_name("telegram-web-app.js")
TELEGRAM_SCRIPT = "https://telegram.org/js/telegram-web-app.js"
CHROMIUM = "/usr/bin/chromium"  # Debian's package; .ci/run installs it


def signed_init_data(
    user: dict[str, Any],
    *,
    auth_date: float | None = None,
    token: str = BOT_TOKEN,
    **extra: str,
) -> str:
    """initData as Telegram hands it to a page: the fields, then `hash` (HMAC-SHA256 of the
    sorted `key=value` lines under HMAC-SHA256("WebAppData", bot token))."""
    fields = {
        "query_id": "AAHdF6IQAAAAAN0XohDhrOrc",
        "user": json.dumps(user, separators=(",", ":"), ensure_ascii=False),
        "auth_date": str(int(auth_date if auth_date is not None else time.time())),
        "signature": "c2lnbmVkIGJ5IHRlbGVncmFtIGZvciB0aGlyZCBwYXJ0aWVz",
        **extra,
    }
    secret = hmac.new(b"WebAppData", token.encode(), hashlib.sha256).digest()
    check = "\n".join(f"{key}={value}" for key, value in sorted(fields.items()))
    fields["hash"] = hmac.new(secret, check.encode(), hashlib.sha256).hexdigest()
    return urlencode(fields)


def person(telegram_id: int, first_name: str = "Alice", language_code: str = "en") -> dict:
    return {"id": telegram_id, "first_name": first_name, "language_code": language_code}


@pytest.fixture
def app_server(start_server, telegram: FakeTelegram) -> LiveServer:  # noqa: F811
    """The API with the Mini App on: the bot's token and Telegram's address, one operator. No
    model is loaded: the app's pages need the books, not generation."""
    assert telegram.router is not None
    telegram.router.route(host="127.0.0.1").pass_through()  # the test's own calls to the app
    return start_server(
        engines={},
        telegram_bot_token=SecretStr(BOT_TOKEN),
        telegram_api_base_url=API_BASE_URL,
        admin_telegram_ids=frozenset({ADMIN_ID}),
        packs=PACKS,
        plans=PLANS,
    )


class AppClient:
    """Calls to /app/api as the page makes them, as one Telegram user."""

    def __init__(self, server: LiveServer, telegram_id: int, init_data: str) -> None:
        self.telegram_id = telegram_id
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{server.port}/app/api", timeout=30)
        self.init_data = init_data

    def __call__(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"tma {self.init_data}", **kwargs.pop("headers", {})}
        return self.http.request(method, path, headers=headers, **kwargs)

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = self(method, path, **kwargs)
        assert answer.is_success, answer.text
        return answer.json() if answer.content else None


@pytest.fixture
def app_client(app_server: LiveServer) -> Iterator[Callable[..., AppClient]]:
    """`app_client(telegram_id)`: a client signed in as that user, closed at the end."""
    clients: list[AppClient] = []

    def make(telegram_id: int, first_name: str = "Alice") -> AppClient:
        client = AppClient(
            app_server, telegram_id, signed_init_data(person(telegram_id, first_name))
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.http.close()


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    """Debian's headless Chromium driven by Playwright (no browser download: the system's)."""
    from playwright.async_api import async_playwright

    path = shutil.which("chromium") or CHROMIUM
    if not Path(path).exists():
        pytest.fail("Chromium is missing: `apt-get install chromium` (.ci/run installs it)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        await browser.close()


LIGHT = {
    "bg_color": "#ffffff",
    "text_color": "#000000",
    "hint_color": "#707579",
    "link_color": "#3390ec",
    "button_color": "#3390ec",
    "button_text_color": "#ffffff",
    "secondary_bg_color": "#f4f4f5",
    "section_bg_color": "#ffffff",
}
DARK = {
    "bg_color": "#17212b",
    "text_color": "#f5f5f5",
    "hint_color": "#708499",
    "link_color": "#6ab3f3",
    "button_color": "#5288c1",
    "button_text_color": "#ffffff",
    "secondary_bg_color": "#232e3c",
    "section_bg_color": "#17212b",
}


async def open_app(
    browser: Any, server: LiveServer, init_data: str, *, theme: dict[str, str] = LIGHT
) -> Any:
    """A phone-sized page of /app as Telegram opens it: our stand-in in place of Telegram's
    script, holding the signed initData and the theme."""
    context = await browser.new_context(viewport={"width": 390, "height": 844})
    await context.add_init_script(
        "window.__TELEGRAM_STAND_IN__ = "
        + json.dumps({"initData": init_data, "themeParams": theme, "colorScheme": "light"})
    )
    await context.route(
        TELEGRAM_SCRIPT,
        lambda route: route.fulfill(path=str(STAND_IN), content_type="application/javascript"),
    )
    page = await context.new_page()
    await page.goto(f"http://127.0.0.1:{server.port}/app/")
    return page


async def posted_events(page: Any, kind: str) -> list[dict[str, Any]]:
    """The events the page posted to Telegram, of one kind."""
    events = await page.evaluate("Telegram.WebView.events")
    return [event["data"] for event in events if event["type"] == kind]
