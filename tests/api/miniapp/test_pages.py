"""The Mini App in a real headless Chromium, as a phone opens it from the bot: what a buyer and
an operator see, and what the page asks Telegram to do (our stand-in of telegram-web-app.js
records it). Set TOKENSHOP_SCREENSHOTS=<dir> to keep light and dark screenshots (docs/)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from billing.models import Account, utcnow
from tests.api.conftest import LiveServer
from tests.api.miniapp.conftest import (
    ADMIN_ID,
    DARK,
    open_app,
    person,
    posted_events,
    signed_init_data,
)
from tests.api.miniapp.test_buyer import use_on_day
from tests.bot.double import FakeTelegram, TelegramUser
from tests.bot.stories import pre_checkout_answer
from tests.factories import make_account, make_purchase

ALICE = 100_001
SHOTS = os.environ.get("TOKENSHOP_SCREENSHOTS")


async def screenshot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def side_by_side(names: list[str], out: str) -> None:
    """The README's picture: screenshots next to each other."""
    from PIL import Image

    shots = [Image.open(Path(SHOTS or ".") / f"{name}.png") for name in names]
    picture = Image.new(
        "RGB", (sum(s.width for s in shots) + 16 * (len(shots) - 1), shots[0].height)
    )
    for n, shot in enumerate(shots):
        picture.paste(shot, (n * (shot.width + 16), 0))
    picture.save(Path(SHOTS or ".") / f"{out}.png", optimize=True)


async def text(page: Any, selector: str) -> str:
    return (await page.locator(selector).inner_text()).strip()


async def chart_points(page: Any, chart: str) -> dict[str, dict[str, int]]:
    """What the chart draws: each series' non-zero points, by day."""
    return await page.evaluate(
        """(id) => {
            const chart = tokenshop.charts[id];
            const days = chart.data[0].map((s) => new Date(s * 1000).toISOString().slice(0, 10));
            const out = {};
            chart.series.slice(1).forEach((series, n) => {
                out[series.label] = {};
                chart.data[n + 1].forEach((v, i) => { if (v) out[series.label][days[i]] = v; });
            });
            return out;
        }""",
        chart,
    )


def day(days_ago: int) -> str:
    return f"{utcnow() - timedelta(days=days_ago):%Y-%m-%d}"


@pytest.mark.anyio
async def test_a_buyer_sees_usage_manages_keys_and_buys_a_pack(
    app_server: LiveServer,
    chromium: Any,
    engine,
    telegram: FakeTelegram,
    alice: TelegramUser,
):
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer, tokens=20_000, telegram_id=ALICE, name="Alice")
    assert account.id is not None
    for days_ago, prompt, completion in ((0, 1200, 300), (3, 800, 150), (9, 400, 90)):
        use_on_day(engine, account.id, days_ago, prompt=prompt, completion=completion)

    page = await open_app(chromium, app_server, signed_init_data(person(ALICE)))
    await page.wait_for_function("tokenshop.state.balance !== null")
    assert await text(page, "[data-figure=available]") == "17,060"
    assert await text(page, "[data-figure=used]") == "2,940"
    assert not await page.locator('#tabs [data-page="operator"]').is_visible()

    # Usage: the chart's points are the three days' tokens, prompt and completion apart.
    await page.click('#tabs [data-page="usage"]')
    await page.wait_for_selector("#usage-table tbody tr")
    assert await chart_points(page, "usage-chart") == {
        "demo prompt": {day(0): 1200, day(3): 800, day(9): 400},
        "demo completion": {day(0): 300, day(3): 150, day(9): 90},
    }
    rows = await page.locator("#usage-table tbody tr").all_inner_texts()
    assert [row.split("\t")[:4] for row in rows] == [
        [day(0), "demo", "1,200", "300"],
        [day(3), "demo", "800", "150"],
        [day(9), "demo", "400", "90"],
    ]
    await page.click('[data-window="usage"] [data-days="7"]')
    await page.wait_for_function("document.querySelectorAll('#usage-table tbody tr').length === 2")
    await screenshot(page, "miniapp-usage-light")

    # Keys: a new key is shown in full once; rotating asks first, then shows the new one.
    await page.click('#tabs [data-page="keys"]')
    await page.fill("#new-key input[name=name]", "laptop")
    await page.click("#new-key button[type=submit]")
    await page.wait_for_selector("#new-secret:not([hidden])")
    first = await text(page, "#new-secret-value")
    assert first.startswith("sk-tks-")
    assert await text(page, "#key-list .title") == "laptop"
    assert await text(page, "#key-list .masked") == f"sk-tks-…{first[-4:]}"
    await page.click('#key-list [data-action="rotate"]')
    await page.wait_for_function(
        "(first) => document.querySelector('#new-secret-value').textContent !== first",
        arg=first,
    )
    rotated = await text(page, "#new-secret-value")
    assert rotated.startswith("sk-tks-") and rotated != first
    popups = await posted_events(page, "web_app_open_popup")
    assert len(popups) == 1 and "Rotate “laptop”" in popups[0]["message"]
    assert await text(page, "#key-list .masked") == f"sk-tks-…{rotated[-4:]}"
    assert await text(page, "#key-list .limits") == "No limits"
    await page.click('#key-list [data-action="limits"]')
    await page.fill('#key-list input[aria-label="Limits"]', "spend 5000 daily; rpm 60")
    await page.click("#key-list button[type=submit]")
    await page.wait_for_function(
        "document.querySelector('#key-list .limits').textContent !== 'No limits'"
    )
    shown = await text(page, "#key-list .limits")
    assert shown.startswith("Limits: 0 of 5,000 tokens today (resets ")
    assert shown.endswith("; 60 requests/min")

    # Buying: terms first; a pack's tap opens the invoice link the server made.
    await page.click('#tabs [data-page="buy"]')
    await page.click("#accept-terms")
    await page.wait_for_selector('#packs button[data-pack="starter"]:not([disabled])')
    await page.click('#packs button[data-pack="starter"]')
    await page.wait_for_function(
        "Telegram.WebView.events.some((e) => e.type === 'web_app_open_invoice')"
    )
    made = telegram.last("createInvoiceLink")
    (opened,) = await posted_events(page, "web_app_open_invoice")
    assert made.result == f"https://t.me/${opened['slug']}"  # the link the server made

    # Telegram tells the bot, the bot credits; then the page hears the invoice was paid.
    await alice.pre_checkout(made["payload"], 50)
    assert pre_checkout_answer(telegram) == (True, None)
    await alice.paid(made["payload"], 50, "charge-in-the-mini-app")
    await page.evaluate(
        "(slug) => Telegram.WebView.receiveEvent('invoice_closed', {slug, status: 'paid'})",
        opened["slug"],
    )
    await page.wait_for_function("document.querySelector('#notice').textContent.includes('+')")
    assert await text(page, "#notice") == "Credited: +100,000 tokens."
    assert await page.locator("#page-balance").is_visible()
    assert await text(page, "[data-figure=available]") == "117,060"

    # A monthly plan is offered under the packs; its tap opens a subscription's invoice link.
    await page.click('#tabs [data-page="buy"]')
    plan = page.locator('#packs button[data-plan="basic"]')
    assert "300 ⭐/month" in await plan.inner_text()
    await plan.click()
    await page.wait_for_function(
        "Telegram.WebView.events.filter((e) => e.type === 'web_app_open_invoice').length === 2"
    )
    assert int(telegram.last("createInvoiceLink")["subscription_period"]) == 2_592_000

    # Telegram switches to its dark theme: the page follows.
    await page.evaluate(
        "(theme) => Telegram.WebView.receiveEvent('theme_changed', {theme_params: theme})", DARK
    )
    background = await page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(23, 33, 43)"
    await page.click('#tabs [data-page="usage"]')
    await page.wait_for_selector("#usage-table tbody tr")
    await screenshot(page, "miniapp-usage-dark")


@pytest.mark.anyio
async def test_an_operator_sees_revenue_and_usage_and_a_buyer_is_refused(
    app_server: LiveServer, chromium: Any, engine
):
    with Session(engine, expire_on_commit=False) as writer:
        buyer = make_account(writer, telegram_id=ALICE, name="Alice")
        make_purchase(writer, buyer, tokens=100_000, price=50)
        make_purchase(writer, buyer, tokens=2_000_000, price=700)
        writer.add(Account(telegram_id=ADMIN_ID, name="Olga"))
        writer.commit()
    assert buyer.id is not None
    use_on_day(engine, buyer.id, 0, prompt=5000, completion=1000)
    use_on_day(engine, buyer.id, 1, prompt=2000, completion=500, model="big")

    olga = signed_init_data(person(ADMIN_ID, "Olga"))
    page = await open_app(chromium, app_server, olga, theme=DARK)
    await page.click('#tabs [data-page="operator"]')
    await page.wait_for_function("document.querySelector('[data-op=revenue]').textContent !== '—'")
    assert await text(page, "[data-op=revenue]") == "750 ⭐"
    assert await chart_points(page, "revenue-chart") == {"Test pack ⭐": {day(0): 750}}
    assert await chart_points(page, "tokens-chart") == {
        "big prompt": {day(1): 2000},
        "big completion": {day(1): 500},
        "demo prompt": {day(0): 5000},
        "demo completion": {day(0): 1000},
    }
    buyers = await chart_points(page, "buyers-chart")
    assert buyers["paying"] == {day(0): 1} and buyers["new"][day(0)] >= 2
    top = await page.locator("#top-table tbody tr").first.inner_text()
    assert top.split("\t") == ["Alice", "8,500", "750"]
    await screenshot(page, "miniapp-operator-dark")
    if SHOTS and (Path(SHOTS) / "miniapp-usage-light.png").exists():
        side_by_side(
            ["miniapp-usage-light", "miniapp-usage-dark", "miniapp-operator-dark"], "miniapp"
        )

    # Alice's Telegram speaks Russian: so does the page, and it writes numbers her way.
    russian = signed_init_data(person(ALICE, language_code="ru"))
    shopper = await open_app(chromium, app_server, russian)
    await shopper.wait_for_function("tokenshop.state.balance !== null")
    assert await text(shopper, '#tabs [data-page="balance"]') == "Баланс"
    assert await text(shopper, "[data-figure=available]") == "2\u00a0091\u00a0500"
    assert not await shopper.locator('#tabs [data-page="operator"]').is_visible()
    status = await shopper.evaluate(
        "fetch('api/operator', {headers: {Authorization: `Bearer ${tokenshop.state.token}`}})"
        ".then((answer) => answer.status)"
    )
    assert status == 403
