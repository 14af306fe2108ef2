"""A buyer's pages as JSON: the figures the page draws, and what its buttons do to the books."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from pydantic import SecretStr
from sqlalchemy import update
from sqlmodel import Session, col

from billing import keys, ledger
from billing.accounts import find_telegram_account
from billing.errors import RevokedKey
from billing.models import LedgerEntry, utcnow
from bot.app import build_application
from tests.api.miniapp.conftest import AppClient, person, signed_init_data
from tests.bot.double import API_BASE_URL, BOT_TOKEN, FakeTelegram, TelegramUser
from tests.bot.stories import pre_checkout_answer
from tests.factories import bill_request

ALICE = 100_001  # the bot fixtures' Alice


def open_account(client, engine, tokens: int = 0) -> int:
    client.ok("GET", "/me")  # the first call opens the account
    with Session(engine) as writer:
        account = find_telegram_account(session=writer, telegram_id=client.telegram_id)
        assert account is not None and account.id is not None
        if tokens:
            ledger.grant(session=writer, account_id=account.id, tokens=tokens)
        writer.commit()
        return account.id


def use_on_day(
    engine, account_id: int, days_ago: int, *, prompt: int, completion: int, model: str = "demo"
) -> None:
    """A billed request `days_ago` days back (its ledger entry moved to that day)."""
    request_id = f"req-{account_id}-{days_ago}-{model}"
    bill_request(
        engine,
        account_id,
        request_id,
        cost=prompt + completion,
        model=model,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )
    with Session(engine) as writer:
        writer.execute(
            update(LedgerEntry)
            .where(col(LedgerEntry.request_id) == request_id)
            .values(created_at=utcnow() - timedelta(days=days_ago))
        )
        writer.commit()


def test_balance_and_usage_per_day_by_model_over_a_window(app_client, engine):
    alice = app_client(ALICE)
    account_id = open_account(alice, engine, tokens=50_000)
    use_on_day(engine, account_id, 0, prompt=100, completion=20)
    use_on_day(engine, account_id, 2, prompt=300, completion=40)
    use_on_day(engine, account_id, 2, prompt=7, completion=3, model="big")
    use_on_day(engine, account_id, 20, prompt=1000, completion=500)

    assert alice.ok("GET", "/balance") == {
        "available": 50_000 - 120 - 340 - 10 - 1500,
        "held": 0,
        "purchased": 0,
        "granted": 50_000,
        "used": 1970,
        "refunded": 0,
    }
    week = alice.ok("GET", "/usage", params={"days": 7})
    assert len(week["days"]) == 7 and week["days"][-1] == f"{utcnow():%Y-%m-%d}"
    demo = next(series for series in week["models"] if series["model"] == "demo")
    assert demo["prompt"][-1] == 100 and demo["completion"][-1] == 20
    assert demo["prompt"][-3] == 300 and demo["completion"][-3] == 40
    assert sum(demo["prompt"]) == 400  # the request 20 days ago is outside the week
    big = next(series for series in week["models"] if series["model"] == "big")
    assert (big["prompt"][-3], big["completion"][-3], big["requests"][-3]) == (7, 3, 1)

    month = alice.ok("GET", "/usage", params={"days": 30})
    assert sum(s["prompt"][0] + sum(s["prompt"][1:]) for s in month["models"]) == 1407
    assert alice("GET", "/usage", params={"days": 12}).status_code == 400

    exported = alice("GET", "/usage.csv")
    assert exported.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert sorted(int(row["prompt_tokens"]) for row in rows) == [7, 100, 300, 1000]


def test_the_csv_is_sent_into_the_buyers_chat(app_client, engine, telegram: FakeTelegram):
    alice = app_client(ALICE)
    account_id = open_account(alice, engine, tokens=1_000)
    use_on_day(engine, account_id, 1, prompt=30, completion=12)
    assert alice("POST", "/usage.csv/send").status_code == 204
    sent = telegram.last("sendDocument")
    assert int(sent["chat_id"]) == ALICE and sent["caption"] == "Every billed request, as CSV."
    assert sent["document"]["filename"] == "tokenshop-usage.csv"
    assert sent["document"]["content"].decode() == alice("GET", "/usage.csv").text


def test_keys_are_created_renamed_rotated_and_revoked(app_client, engine, session, secret_key):
    alice = app_client(ALICE)
    open_account(alice, engine)
    created = alice("POST", "/keys", json={"name": "laptop"})
    assert created.status_code == 201
    issued = created.json()
    full = issued["secret"]
    assert full.startswith("sk-tks-") and issued["key"]["masked"] == f"sk-tks-…{full[-4:]}"
    listed = alice.ok("GET", "/keys")
    assert [k["name"] for k in listed] == ["laptop"]
    assert full not in str(listed)  # the list shows keys masked only

    key_id = issued["key"]["id"]
    renamed = alice.ok("PATCH", f"/keys/{key_id}", json={"name": "  work   laptop "})
    assert renamed["name"] == "work laptop"

    rotated = alice.ok("POST", f"/keys/{key_id}/rotate")
    assert rotated["key"]["name"] == "work laptop" and rotated["secret"] != full
    with pytest.raises(RevokedKey):
        keys.authenticate(session=session, key=full)
    session.rollback()
    assert keys.authenticate(session=session, key=rotated["secret"]).key_id == rotated["key"]["id"]
    session.rollback()

    assert alice("DELETE", f"/keys/{rotated['key']['id']}").status_code == 204
    assert alice.ok("GET", "/keys") == []
    gone = alice("DELETE", f"/keys/{rotated['key']['id']}")
    assert gone.status_code == 400 and "live key" in gone.json()["error"]["message"]


def test_a_keys_limits_are_set_in_the_bots_words_and_shown_with_its_spend(app_client, engine):
    alice = app_client(ALICE)
    account_id = open_account(alice, engine, tokens=10_000)
    key = alice.ok("POST", "/keys", json={"name": "ci"})["key"]
    assert key["limits"]["spend"] is None and key["limits"]["rpm"] is None

    changed = alice.ok(
        "PUT", f"/keys/{key['id']}/limits", json={"text": "spend 5000 daily; rpm 60; models demo"}
    )
    limits = changed["limits"]
    assert (limits["spend"], limits["period"], limits["rpm"], limits["models"]) == (
        5000,
        "daily",
        60,
        ["demo"],
    )
    assert limits["remaining"] == 5000 and limits["resets_at"].startswith(
        f"{utcnow() + timedelta(days=1):%Y-%m-%d}"
    )
    assert alice.ok("GET", "/keys")[0]["limits"] == limits

    wrong = alice("PUT", f"/keys/{key['id']}/limits", json={"text": "spend lots"})
    assert wrong.status_code == 400 and "spend 500 daily" in wrong.json()["error"]["message"]
    cleared = alice.ok("PUT", f"/keys/{key['id']}/limits", json={"text": "clear"})
    assert cleared["limits"]["spend"] is None and cleared["limits"]["models"] == []
    assert account_id


def test_another_buyers_key_cannot_be_touched(app_client, engine):
    alice, boris = app_client(ALICE), app_client(100_002, "Boris")
    open_account(alice, engine)
    open_account(boris, engine)
    key_id = alice.ok("POST", "/keys", json={"name": "mine"})["key"]["id"]
    assert boris("POST", f"/keys/{key_id}/rotate").status_code == 400
    assert boris("PATCH", f"/keys/{key_id}", json={"name": "stolen"}).status_code == 400
    assert boris("DELETE", f"/keys/{key_id}").status_code == 400
    assert boris("PUT", f"/keys/{key_id}/limits", json={"text": "rpm 1"}).status_code == 400
    assert [k["name"] for k in alice.ok("GET", "/keys")] == ["mine"]


@pytest.mark.anyio
async def test_a_pack_bought_in_the_page_is_credited_by_the_bot(
    app_client, engine, telegram: FakeTelegram, alice: TelegramUser
):
    buyer = app_client(ALICE)
    refused = buyer("POST", "/invoice", json={"pack_id": "starter"})
    assert refused.status_code == 400 and "terms" in refused.json()["error"]["message"]
    assert buyer("POST", "/terms").status_code == 204
    shop = buyer.ok("GET", "/shop")
    assert shop["terms_accepted"] and [p["id"] for p in shop["packs"]] == ["starter", "pro"]
    assert buyer("POST", "/invoice", json={"pack_id": "nope"}).status_code == 400

    link = buyer.ok("POST", "/invoice", json={"pack_id": "starter"})["invoice_link"]
    made = telegram.last("createInvoiceLink")
    assert link == made.result and link.startswith("https://t.me/$")
    assert (made["currency"], made["prices"][0]["amount"]) == ("XTR", 50)
    assert made["title"] == "Starter: 100,000 tokens"
    assert buyer.ok("GET", "/balance")["available"] == 0  # nothing until the bot hears of it

    await alice.pre_checkout(made["payload"], 50)
    assert pre_checkout_answer(telegram) == (True, None)
    await alice.paid(made["payload"], 50, "charge-from-the-page")
    assert buyer.ok("GET", "/balance")["purchased"] == 100_000
    await alice.paid(made["payload"], 50, "charge-from-the-page")  # delivered twice
    assert buyer.ok("GET", "/balance")["available"] == 100_000


@pytest.mark.anyio
async def test_a_monthly_plan_bought_in_the_page_is_a_subscription_the_bot_credits(
    app_client, engine, telegram: FakeTelegram, alice: TelegramUser
):
    buyer = app_client(ALICE)
    assert buyer("POST", "/terms").status_code == 204
    shop = buyer.ok("GET", "/shop")
    assert shop["plans"] == [
        {"id": "basic", "title": "Basic", "tokens": 1_000_000, "price": 300, "period_days": 30}
    ]
    assert buyer("POST", "/invoice", json={"plan_id": "gold"}).status_code == 400
    both = buyer("POST", "/invoice", json={"plan_id": "basic", "pack_id": "starter"})
    assert both.status_code in (400, 422)

    buyer.ok("POST", "/invoice", json={"plan_id": "basic"})
    made = telegram.last("createInvoiceLink")
    assert int(made["subscription_period"]) == 2_592_000
    assert (made["currency"], made["prices"][0]["amount"]) == ("XTR", 300)
    assert made["title"] == "Basic: 1,000,000/month"

    await alice.pre_checkout(made["payload"], 300)
    assert pre_checkout_answer(telegram) == (True, None)
    renews = int((utcnow() + timedelta(days=30)).timestamp())
    await alice.paid(made["payload"], 300, "sub-page-1", renews_at=renews, first=True)
    await alice.paid(made["payload"], 300, "sub-page-2", renews_at=renews + 2_592_000)
    assert buyer.ok("GET", "/balance")["purchased"] == 2_000_000


@pytest.mark.anyio
async def test_support_written_in_the_page_reaches_operators_and_their_reply_the_buyer(
    app_client, engine, telegram: FakeTelegram, operator: TelegramUser
):
    buyer = app_client(ALICE)
    sent = buyer.ok("POST", "/support", json={"text": "My tokens <b>vanished</b>"})
    assert sent == {"delivered": 1}
    card = telegram.last("sendMessage")
    assert int(card["chat_id"]) == operator.id
    assert "My tokens &lt;b&gt;vanished&lt;/b&gt;" in card["text"]

    await operator.send("They are back now.", reply_to=card)  # a reply in the bot's chat
    assert "They are back now." in telegram.last_text_to(ALICE)
    thread = buyer.ok("GET", "/support")["messages"]
    assert [(m["from_operator"], m["text"]) for m in thread] == [
        (False, "My tokens <b>vanished</b>"),
        (True, "They are back now."),
    ]


@pytest.mark.anyio
async def test_a_first_contact_in_the_page_gets_the_starter_tokens_once(
    start_server, telegram: FakeTelegram, bot_settings, engine
):
    """STARTER_TOKENS reach a buyer who opens the page before writing to the bot, and the bot
    gives none again."""
    assert telegram.router is not None
    telegram.router.route(host="127.0.0.1").pass_through()
    server = start_server(
        engines={},
        telegram_bot_token=SecretStr(BOT_TOKEN),
        telegram_api_base_url=API_BASE_URL,
        starter_tokens=5_000,
    )
    bot = build_application(bot_settings.model_copy(update={"starter_tokens": 5_000}))
    await bot.initialize()
    assert bot.post_init is not None and bot.post_shutdown is not None
    await bot.post_init(bot)
    page = AppClient(server, ALICE, signed_init_data(person(ALICE)))
    try:
        assert page.ok("GET", "/balance")["granted"] == 5_000
        assert len(page.ok("GET", "/keys")) == 1  # the key to try them with
        await TelegramUser(bot, id=ALICE, first_name="Alice").send("/start")
        assert page.ok("GET", "/balance")["granted"] == 5_000
        assert "5,000" not in telegram.last_text_to(ALICE)  # no gift announced either
        newcomer = AppClient(server, 100_003, signed_init_data(person(100_003, "Vera")))
        await TelegramUser(bot, id=100_003, first_name="Vera").send("/start")  # bot first
        assert newcomer.ok("GET", "/balance")["granted"] == 5_000
        newcomer.http.close()
    finally:
        page.http.close()
        await bot.post_shutdown(bot)
        await bot.shutdown()
