"""Several keys on one account: each request is billed to the account and counted for the key
that made it, and `GET /v1/key` reports the calling key's own figures beside the account's."""

from __future__ import annotations

import httpx
from sqlmodel import Session

from billing import keys
from tests.factories import make_account

HELLO = [{"role": "user", "content": "hello"}]


def test_each_key_reports_its_own_usage_beside_the_accounts(
    server, make_client, engine, secret_key
):
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer, tokens=1_000_000)
        assert account.id is not None
        _, laptop = keys.create_key(
            session=writer, account_id=account.id, secret_key=secret_key, name="laptop"
        )
        _, script = keys.create_key(
            session=writer, account_id=account.id, secret_key=secret_key, name="script"
        )
        writer.commit()

    first = make_client(server, laptop).chat.completions.create(
        model="demo", messages=HELLO, max_tokens=4
    )
    second = make_client(server, laptop).chat.completions.create(
        model="demo", messages=HELLO, max_tokens=3
    )
    third = make_client(server, script).chat.completions.create(
        model="demo", messages=HELLO, max_tokens=2
    )

    def info(key: str) -> dict:
        answer = httpx.get(f"{server.base_url}/key", headers={"Authorization": f"Bearer {key}"})
        return answer.json()

    spent = [c.usage.total_tokens for c in (first, second, third)]
    laptop_info, script_info = info(laptop), info(script)
    assert laptop_info["used_tokens"] == script_info["used_tokens"] == sum(spent)
    assert (laptop_info["key_name"], laptop_info["key_requests"]) == ("laptop", 2)
    assert laptop_info["key_used_tokens"] == spent[0] + spent[1]
    assert (script_info["key_name"], script_info["key_requests"]) == ("script", 1)
    assert script_info["key_used_tokens"] == spent[2]


def test_a_responses_api_request_counts_for_its_key(server, make_client, engine, secret_key):
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer, tokens=1_000_000)
        assert account.id is not None
        _, key = keys.create_key(
            session=writer, account_id=account.id, secret_key=secret_key, name="agent"
        )
        writer.commit()

    response = make_client(server, key).responses.create(
        model="demo", input="hello", max_output_tokens=16
    )

    info = httpx.get(f"{server.base_url}/key", headers={"Authorization": f"Bearer {key}"}).json()
    assert (info["key_name"], info["key_requests"]) == ("agent", 1)
    assert info["key_used_tokens"] == response.usage.total_tokens == info["used_tokens"]
