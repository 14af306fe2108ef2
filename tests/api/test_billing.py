"""What the buyer is charged through the API: never more than the balance, exactly what the
answers say, and only what was generated when a client leaves early."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from sqlmodel import select

from billing import ledger
from billing.db import session_scope
from billing.models import Hold, LedgerEntry
from tests.factories import make_account, make_key

HELLO = [{"role": "user", "content": "hello"}]


def _books(engine, account_id: int) -> ledger.Balance:
    with session_scope(engine) as session:
        return ledger.get_balance(session=session, account_id=account_id)


def test_usage_reported_equals_what_the_ledger_records(client, server, engine, session):
    completion = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=10)
    with session_scope(engine) as books:
        [entry] = books.exec(
            select(LedgerEntry).where(LedgerEntry.request_id == completion.id)
        ).all()
    assert -entry.amount == completion.usage.total_tokens
    assert entry.prompt_tokens == completion.usage.prompt_tokens
    assert entry.completion_tokens == completion.usage.completion_tokens


def test_the_key_endpoint_shows_what_is_left(server, client, api_key, engine):
    completion = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=5)
    info = httpx.get(
        f"{server.base_url}/key", headers={"Authorization": f"Bearer {api_key}"}
    ).json()
    assert info["key"] == "sk-tks-…" + api_key[-4:]
    assert info["used_tokens"] == completion.usage.total_tokens
    assert info["available_tokens"] == 1_000_000 - completion.usage.total_tokens
    assert info["held_tokens"] == 0
    assert api_key not in json.dumps(info)


def test_50_concurrent_requests_never_spend_more_than_the_balance(
    make_client, server, session, secret_key, engine
):
    balance = 600
    account = make_account(session, tokens=balance)
    key = make_key(session, account, secret_key=secret_key)
    client = make_client(server, key)

    def ask(_: int) -> int:
        try:
            done = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=40)
            return done.usage.total_tokens
        except (openai.RateLimitError, openai.InternalServerError):
            return 0

    with ThreadPoolExecutor(max_workers=50) as pool:
        spent = list(pool.map(ask, range(50)))
    books = _books(engine, account.id)
    assert sum(spent) <= balance
    assert books.used == sum(spent)
    assert books.balance == balance - sum(spent) >= 0
    assert books.held == 0
    with session_scope(engine) as check:
        assert ledger.audit(session=check) == []


def test_a_client_that_drops_a_stream_pays_only_for_what_was_generated(server, api_key, engine):
    with httpx.stream(
        "POST",
        f"{server.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={
            "model": "demo",
            "messages": HELLO,
            "max_tokens": 1000,
            "stream": True,
            "temperature": 0.7,
            "stop": [],
        },
    ) as response:
        lines = response.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        chat_id = first["id"]
        for _ in range(5):
            next(lines)
    # the connection is closed: the server notices, stops generating and settles
    deadline = time.monotonic() + 10
    while True:
        with session_scope(engine) as books:
            hold = books.get(Hold, chat_id)
            if hold is not None and hold.state != "held":
                break
        assert time.monotonic() < deadline, "the hold was not settled after the client left"
        time.sleep(0.05)
    assert hold.used < 1000  # billed for a few tokens, not for max_tokens
    scheduler = server.services.engines["demo"]
    deadline = time.monotonic() + 5
    while scheduler.stats().active_sequences:
        assert time.monotonic() < deadline, "the sequence stayed in the batch"
        time.sleep(0.05)


def test_an_idempotent_retry_replays_the_answer_and_is_billed_once(client, server, api_key, engine):
    first = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=6, extra_headers={"Idempotency-Key": "abc-1"}
    )
    again = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=6, extra_headers={"Idempotency-Key": "abc-1"}
    )
    assert (
        again.id == first.id
        and again.choices[0].message.content == first.choices[0].message.content
    )
    info = httpx.get(f"{server.base_url}/key", headers={"Authorization": f"Bearer {api_key}"})
    assert info.json()["used_tokens"] == first.usage.total_tokens

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="demo", messages=HELLO, max_tokens=7, extra_headers={"Idempotency-Key": "abc-1"}
        )
