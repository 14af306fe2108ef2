"""The operator's page as JSON: the shop's days in figures, and what needs an operator now."""

from __future__ import annotations

from datetime import timedelta

from pydantic import SecretStr
from sqlalchemy import update
from sqlmodel import Session, col

from billing import ledger, stray_charges, support
from billing.models import Account, Purchase, utcnow
from tests.api.conftest import free_port
from tests.api.miniapp.conftest import ADMIN_ID, AppClient, person, signed_init_data
from tests.api.miniapp.test_buyer import use_on_day
from tests.api.upstreams import FakeUpstream, models_toml
from tests.bot.double import API_BASE_URL, BOT_TOKEN, FakeTelegram
from tests.factories import bill_request, make_account, make_purchase
from tests.faults import poll


def test_revenue_refunds_buyers_usage_and_what_waits_for_an_operator(app_client, engine):
    today, yesterday = f"{utcnow():%Y-%m-%d}", f"{utcnow() - timedelta(days=1):%Y-%m-%d}"
    with Session(engine, expire_on_commit=False) as writer:
        alice = make_account(writer, telegram_id=100_001, name="Alice")
        boris = make_account(writer, telegram_id=100_002, name="Boris")
        make_purchase(writer, alice, charge_id="c-1", tokens=100_000, price=50)
        old = make_purchase(writer, boris, charge_id="c-2", tokens=2_000_000, price=700)
        refunded = make_purchase(writer, boris, charge_id="c-3", tokens=100_000, price=50)
        writer.execute(  # Boris's first purchase was yesterday
            update(Purchase)
            .where(col(Purchase.id) == old.id)
            .values(created_at=utcnow() - timedelta(days=1))
        )
        ledger.refund_purchase(session=writer, charge_id=refunded.telegram_payment_charge_id)
        stray_charges.record(
            session=writer,
            charge_id="stray-1",
            telegram_id=100_002,
            amount=50,
            currency="XTR",
            payload="gone",
            reason="unknown",
        )
        assert alice.id is not None and boris.id is not None
        support.record_message(session=writer, account_id=alice.id, text="Where are my tokens?")
        support.record_message(session=writer, account_id=boris.id, text="Hello")
        support.record_message(
            session=writer, account_id=boris.id, text="Answered.", operator_id=ADMIN_ID
        )
        writer.commit()
    use_on_day(engine, boris.id, 0, prompt=9000, completion=1000)
    use_on_day(engine, alice.id, 1, prompt=300, completion=200, model="big")
    bill_request(engine, alice.id, "running", cost=0, hold=700)  # a request in flight

    report = app_client(ADMIN_ID, "Olga").ok("GET", "/operator", params={"days": 7})

    assert report["revenue"] == 800 and len(report["days"]) == 7
    assert report["sales"] == [
        {"day": yesterday, "pack": "Test pack", "purchases": 1, "stars": 700},
        {"day": today, "pack": "Test pack", "purchases": 2, "stars": 100},
    ]
    assert report["refunds"] == [{"day": today, "refunds": 1, "stars": 50}]
    paying = {row["day"]: row["paying"] for row in report["buyers"]}
    assert paying == {yesterday: 1, today: 2}
    assert sum(row["new"] for row in report["buyers"]) >= 2
    usage = {s["model"]: s for s in report["usage"]["models"]}
    assert usage["demo"]["prompt"][-1] == 9000 and usage["big"]["completion"][-2] == 200
    assert [(a["name"], a["used"], a["stars"]) for a in report["top_accounts"]] == [
        ("Boris", 10_000, 750),
        ("Alice", 500, 50),
    ]
    assert [s["charge_id"] for s in report["stray_charges"]] == ["stray-1"]
    assert [(w["name"], w["text"]) for w in report["support_queue"]] == [
        ("Alice", "Where are my tokens?")
    ]
    assert report["open_holds"]["holds"] == 1 and report["open_holds"]["tokens"] == 700
    assert report["upstreams"] == []  # this server has no upstream model


def test_an_empty_shop_reports_zeros(app_client, engine):
    with Session(engine) as writer:
        writer.add(Account(telegram_id=ADMIN_ID))
        writer.commit()
    report = app_client(ADMIN_ID, "Olga").ok("GET", "/operator", params={"days": 90})
    assert len(report["days"]) == 90 and report["revenue"] == 0
    assert report["sales"] == report["refunds"] == report["top_accounts"] == []
    assert report["open_holds"] == {"holds": 0, "tokens": 0, "oldest": None}


def test_the_operator_sees_each_upstream_servers_health(
    start_server, telegram: FakeTelegram, tmp_path, engine
):
    """A model on two upstream servers, one of them refusing connections."""
    assert telegram.router is not None
    telegram.router.route(host="127.0.0.1").pass_through()
    upstream = FakeUpstream().wait_ready()
    try:
        refused = f"http://127.0.0.1:{free_port()}/v1"
        models = tmp_path / "models.toml"
        models.write_text(models_toml("big", [refused, upstream.base_url], upstream_model="fake"))
        server = start_server(
            models_file=str(models),
            telegram_bot_token=SecretStr(BOT_TOKEN),
            telegram_api_base_url=API_BASE_URL,
            admin_telegram_ids=frozenset({ADMIN_ID}),
        )
        olga = AppClient(server, ADMIN_ID, signed_init_data(person(ADMIN_ID, "Olga")))
        seen: dict[str, bool] = {}

        def health() -> dict[str, bool]:
            report = olga.ok("GET", "/operator", params={"days": 7})
            seen.update({u["url"]: u["up"] for u in report["upstreams"]})
            return seen

        try:  # the first health check runs as the server starts
            poll(lambda: health().get(refused) is False, within=10, what="the refusing one down")
        finally:
            olga.http.close()
        assert seen == {refused: False, upstream.base_url: True}
    finally:
        upstream.stop()
