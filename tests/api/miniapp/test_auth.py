"""Who may call /app/api: only a page holding initData that Telegram signed for this bot, fresh,
or the session it was exchanged for; operators' pages only for ADMIN_TELEGRAM_IDS."""

from __future__ import annotations

import logging
import re
import time
from urllib.parse import parse_qsl, urlencode

import httpx
import pytest

from api.logging import redact
from tests.api.conftest import LiveServer
from tests.api.miniapp.conftest import ADMIN_ID, person, signed_init_data

ALICE = 100_001


def _tampered() -> str:
    """Alice's genuine initData with the user swapped for the operator, hash kept."""
    fields = dict(parse_qsl(signed_init_data(person(ALICE))))
    fields["user"] = fields["user"].replace(str(ALICE), str(ADMIN_ID))
    return urlencode(fields)


BAD_CREDENTIALS = {
    "tampered": lambda: {"Authorization": f"tma {_tampered()}"},
    "stale": lambda: {
        "Authorization": f"tma {signed_init_data(person(ALICE), auth_date=time.time() - 7200)}"
    },
    "another bot's": lambda: {
        "Authorization": f"tma {signed_init_data(person(ALICE), token='1:another-bot')}"
    },
    "missing": lambda: {},
    "forged session": lambda: {"Authorization": "Bearer tks-app.eyJ0IjoxfQ.c2lnbmF0dXJl"},
}


def _routes(server: LiveServer) -> list[tuple[str, str]]:
    """Every (method, path) under /app/api, as the app's own OpenAPI document lists them."""
    paths = server.app.openapi()["paths"]
    return [
        (method.upper(), path.replace("{key_id}", "1"))
        for path, methods in paths.items()
        if path.startswith("/app/api/")
        for method in methods
    ]


@pytest.mark.parametrize("credentials", list(BAD_CREDENTIALS))
def test_every_route_refuses_bad_init_data_with_401(app_server: LiveServer, credentials: str):
    routes = _routes(app_server)
    assert len(routes) >= 14  # the session, the buyer's pages and actions, the operator's
    with httpx.Client(base_url=f"http://127.0.0.1:{app_server.port}") as http:
        for method, path in routes:
            headers = BAD_CREDENTIALS[credentials]()
            body: dict | None = None
            if path == "/app/api/session":  # initData comes in the body here
                init_data = headers.pop("Authorization", "tma ").removeprefix("tma ")
                body = {"init_data": init_data}
            elif method in ("POST", "PATCH", "PUT"):
                body = {"name": "x", "pack_id": "starter", "text": "hello"}
            answer = http.request(method, path, headers=headers, json=body)
            assert answer.status_code == 401, (method, path, answer.text)
            assert answer.json()["error"]["code"] == "invalid_init_data"


def test_the_apps_requests_are_counted_under_their_own_routes(app_server: LiveServer):
    root = f"http://127.0.0.1:{app_server.port}"
    assert httpx.get(f"{root}/app/").status_code == 200
    assert httpx.get(f"{root}/app/api/keys").status_code == 401
    metrics = httpx.get(f"{root}/metrics").text
    assert 'tokenshop_requests_total{route="/app",status="200"} 1.0' in metrics
    assert 'tokenshop_requests_total{route="/app/api",status="401"} 1.0' in metrics


def test_signed_init_data_opens_a_session_that_later_calls_use(app_server: LiveServer):
    base = f"http://127.0.0.1:{app_server.port}/app/api"
    with httpx.Client(base_url=base) as http:
        signed_in = http.post("/session", json={"init_data": signed_init_data(person(ALICE))})
        assert signed_in.status_code == 200
        session = signed_in.json()
        assert session["me"] == {
            "telegram_id": ALICE,
            "name": "Alice",
            "language": "en",
            "operator": False,
            "terms_accepted": False,
        }
        bearer = {"Authorization": f"Bearer {session['token']}"}
        assert http.get("/balance", headers=bearer).json()["available"] == 0
        # one character of the signature changed: refused
        token = session["token"]
        forged = token[:-1] + ("A" if token[-1] != "A" else "B")
        answer = http.get("/balance", headers={"Authorization": f"Bearer {forged}"})
        assert answer.status_code == 401


def test_a_buyer_gets_403_from_the_operator_page_and_an_operator_gets_it(app_client):
    alice = app_client(ALICE)
    answer = alice("GET", "/operator")
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "not_an_operator"
    assert app_client(ADMIN_ID, "Olga")("GET", "/operator").status_code == 200


def test_without_a_bot_token_the_app_refuses_everyone(start_server):
    server = start_server(engines={})
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}/app/api") as http:
        answer = http.get("/balance", headers={"Authorization": f"tma {signed_init_data({})}"})
    assert answer.status_code == 401


def test_init_data_and_sessions_stay_out_of_the_logs(app_server: LiveServer, caplog):
    caplog.set_level(logging.DEBUG)
    init_data = signed_init_data(person(ALICE))
    with httpx.Client(base_url=f"http://127.0.0.1:{app_server.port}/app/api") as http:
        token = http.post("/session", json={"init_data": init_data}).json()["token"]
        http.get("/keys", headers={"Authorization": f"Bearer {token}"})
        http.get("/keys", headers={"Authorization": f"tma {_tampered()}"})
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert re.search(r"hash=[0-9a-f]{64}", logged) is None
    assert token not in logged and "auth_date" not in logged


def test_log_lines_that_carry_init_data_or_a_session_are_redacted():
    init_data = signed_init_data(person(ALICE))
    line = f"GET /app/api/keys Authorization: tma {init_data}; then Bearer tks-app.eyJ0Ijo.x_Y-z"
    cleaned = redact(line)
    assert "hash=" not in cleaned and "auth_date" not in cleaned and "eyJ0Ijo" not in cleaned
    assert "tks-app.eyJ0" not in redact("the session tks-app.eyJ0Ijo.x_Y-z expired")
