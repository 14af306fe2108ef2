"""A key's limits across three API processes on one database, set by the operator's CLI while
they serve: the spend limit holds under 40 requests at once spread over the three, a rotated key
keeps its spend on every replica, RPM and TPM count the key's requests on all of them together,
and a model list or an expiry set through the CLI is enforced by every replica within
KEY_CACHE_SECONDS. Each answer is read through the `openai` SDK's exception classes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from billing import keys, ledger
from billing.db import reading
from tests.api.replicas import Replica, audit_cli, replicas, tokenshop
from tests.factories import make_account
from tests.faults import poll

HELLO = [{"role": "user", "content": "hello"}]
CACHE_SECONDS = 1.0

pytestmark = pytest.mark.slow  # three model-serving processes: ~40 s on 2 cores


def new_key(engine: Engine, secret_key: bytes) -> tuple[str, int, int]:
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer, tokens=5_000_000)
        assert account.id is not None
        row, key = keys.create_key(session=writer, account_id=account.id, secret_key=secret_key)
        writer.commit()
        assert row.id is not None
        return key, row.id, account.id


def cli(database_url: str, workdir: Path, *args: str) -> str:
    result = tokenshop(database_url, workdir, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def ask(server: Replica, key: str, max_tokens: int = 8, model: str = "demo") -> Any:
    """One chat request; its completion, or the SDK's exception."""
    with openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0) as client:
        try:
            return client.chat.completions.create(
                model=model, messages=HELLO, max_tokens=max_tokens
            )
        except openai.APIStatusError as error:
            return error


async def _burst(servers: list[Replica], key: str, count: int) -> list[Any]:
    clients = [openai.AsyncOpenAI(base_url=s.v1, api_key=key, max_retries=0) for s in servers]

    async def one(index: int) -> Any:
        try:
            return await clients[index % len(clients)].chat.completions.create(
                model="demo", messages=HELLO, max_tokens=24
            )
        except openai.APIStatusError as error:
            return error

    try:
        return await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        for client in clients:
            await client.close()


def spend_of(server: Replica, key: str) -> dict[str, Any]:
    answer = httpx.get(f"{server.v1}/key", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["spend"]


def test_a_keys_limits_hold_across_three_replicas(
    engine: Engine, database_url: str, secret_key: bytes, tmp_path: Path
) -> None:
    key, key_id, account_id = new_key(engine, secret_key)
    cli(database_url, tmp_path, "keys", "limit", "--key-id", str(key_id), "--spend", "500")
    cli(database_url, tmp_path, "keys", "limit", "--key-id", str(key_id), "--period", "daily")
    settings = {"KEY_CACHE_SECONDS": str(CACHE_SECONDS), "MAX_CONCURRENT_PER_KEY": "64"}
    with replicas(database_url, tmp_path, **settings) as servers:
        # 40 at once, spread over the three: never past 500, however they interleave
        answers = asyncio.run(_burst(servers, key, 40))
        served = [a for a in answers if not isinstance(a, Exception)]
        refused = [a for a in answers if isinstance(a, Exception)]
        billed = sum(answer.usage.total_tokens for answer in served)
        assert served and refused and billed <= 500
        assert all(isinstance(e, openai.RateLimitError) for e in refused), refused
        assert {e.code for e in refused} == {"insufficient_quota"}
        assert all(e.response.headers["x-should-retry"] == "false" for e in refused)

        # rotated through the CLI: the new key has the old one's spend, on every replica
        rotated = cli(database_url, tmp_path, "keys", "rotate", "--account", str(account_id))
        new = rotated.strip().splitlines()[-1]
        assert [spend_of(s, new)["spent_tokens"] for s in servers] == [billed] * 3
        listing = cli(database_url, tmp_path, "keys", "list", "--account", str(account_id))
        assert f"spend {billed}/500 daily" in listing

        # RPM: six requests a minute for the key, counted on the three together
        fast, fast_id, _ = new_key(engine, secret_key)
        cli(database_url, tmp_path, "keys", "limit", "--key-id", str(fast_id), "--rpm", "6")
        paced = [ask(servers[i % 3], fast, max_tokens=2) for i in range(12)]
        limited = [a for a in paced if isinstance(a, Exception)]
        assert len(paced) - len(limited) == 6
        assert all(isinstance(e, openai.RateLimitError) for e in limited)
        assert {e.code for e in limited} == {"rate_limit_exceeded"}
        assert all(1 <= int(e.response.headers["retry-after"]) <= 60 for e in limited)

        # TPM: 120 tokens a minute for the key, on the three together
        wordy, wordy_id, _ = new_key(engine, secret_key)
        cli(database_url, tmp_path, "keys", "limit", "--key-id", str(wordy_id), "--tpm", "120")
        spoken: list[Any] = []
        for index in range(12):
            spoken.append(ask(servers[index % 3], wordy, max_tokens=30))
            if isinstance(spoken[-1], Exception):
                break
        by_tokens = spoken[-1]
        assert isinstance(by_tokens, openai.RateLimitError), spoken
        assert "120 tokens per minute" in by_tokens.message
        assert sum(a.usage.total_tokens for a in spoken[:-2]) < 120  # before the last served

        # a model list and an expiry set while every replica has the key cached
        watched, watched_id, _ = new_key(engine, secret_key)
        assert all(not isinstance(ask(s, watched, max_tokens=1), Exception) for s in servers)
        cli(database_url, tmp_path, "keys", "limit", "--key-id", str(watched_id), "--models", "x")
        set_at = time.monotonic()
        for server in servers:
            poll(
                lambda server=server: isinstance(
                    ask(server, watched, max_tokens=1), openai.PermissionDeniedError
                ),
                within=CACHE_SECONDS + 1 - (time.monotonic() - set_at),
                what=f"{server.name} refuses the model",
            )
        refused_model = ask(servers[0], watched, max_tokens=1)
        assert refused_model.body["param"] == "model"
        cli(database_url, tmp_path, "keys", "limit", "--key-id", str(watched_id), "--models", "")
        cli(
            database_url,
            tmp_path,
            "keys",
            "limit",
            "--key-id",
            str(watched_id),
            "--expires",
            "2026-01-01",
        )
        set_at = time.monotonic()
        for server in servers:
            poll(
                lambda server=server: isinstance(
                    ask(server, watched, max_tokens=1), openai.AuthenticationError
                ),
                within=CACHE_SECONDS + 1 - (time.monotonic() - set_at),
                what=f"{server.name} refuses the expired key",
            )
        expired = ask(servers[2], watched, max_tokens=1)
        assert "expired" in expired.message

    with Session(reading(engine)) as session:
        assert ledger.get_balance(session=session, account_id=account_id).held == 0
    result = audit_cli(database_url, tmp_path)
    assert result.returncode == 0 and "audit: ok" in result.stdout, result.stdout + result.stderr
