"""A buyer hands out a key with limits: each refusal reaches the `openai` SDK as the exception a
developer catches, with a message that says which limit and until when, and `GET /v1/key`
reports the key's limits and its spend this period. One API process here; the same limits across
three replicas are in test_key_limits_replicas.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from billing import keys, ledger
from billing.db import session_scope
from tests.api.conftest import DEMO_MODEL
from tests.factories import limit_key, make_account
from tests.faults import poll

HELLO = [{"role": "user", "content": "hello"}]


def new_key(engine: Engine, secret_key: bytes, tokens: int = 1_000_000) -> tuple[str, int, int]:
    """A key of a new, well-funded account: the key, its id and the account's id."""
    with Session(engine, expire_on_commit=False) as writer:
        account = make_account(writer, tokens=tokens)
        assert account.id is not None
        row, key = keys.create_key(session=writer, account_id=account.id, secret_key=secret_key)
        writer.commit()
        assert row.id is not None
        return key, row.id, account.id


def key_info(server: Any, key: str) -> dict[str, Any]:
    answer = httpx.get(f"{server.base_url}/key", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


class Clock:
    """The clock the server's key limits count by, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def limited(start_server: Callable[..., Any]) -> Any:
    """A server whose key cache lasts a tenth of a second, so limits set by a test apply at
    once, and that lets a key run 64 requests at once (the key's own limits are under test)."""
    return start_server(key_cache_seconds=0.1, max_concurrent_per_key=64)


async def _burst(server: Any, key: str, count: int, max_tokens: int) -> list[Any]:
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0) as client:

        async def one() -> Any:
            try:
                return await client.chat.completions.create(
                    model="demo", messages=HELLO, max_tokens=max_tokens
                )
            except openai.APIStatusError as error:
                return error

        return await asyncio.gather(*(one() for _ in range(count)))


def test_forty_requests_at_once_never_spend_past_a_daily_limit_of_500(limited, engine, secret_key):
    key, key_id, account_id = new_key(engine, secret_key)
    limit_key(engine, account_id, key_id, "spend 500 daily")

    answers = asyncio.run(_burst(limited, key, 40, max_tokens=24))

    served = [a for a in answers if not isinstance(a, Exception)]
    refused = [a for a in answers if isinstance(a, Exception)]
    assert served and refused
    assert all(isinstance(e, openai.RateLimitError) for e in refused), refused
    assert {e.code for e in refused} == {"insufficient_quota"}
    assert "spend limit of 500 tokens per day" in refused[0].message
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d 00:00 UTC")
    assert tomorrow in refused[0].message
    billed = sum(answer.usage.total_tokens for answer in served)
    assert billed <= 500
    info = key_info(limited, key)
    assert info["spend"]["spent_tokens"] == billed == info["key_used_tokens"]
    assert info["limits"]["spend_limit"] == 500 and info["limits"]["period"] == "daily"
    with session_scope(engine) as session:
        assert ledger.audit(session=session) == []
        assert ledger.get_balance(session=session, account_id=account_id).available > 900_000


def test_a_daily_limit_starts_again_at_midnight_utc(limited, make_client, engine, secret_key):
    key, key_id, account_id = new_key(engine, secret_key)
    clock = Clock(datetime(2026, 11, 28, 23, 59, 30, tzinfo=UTC))
    limited.services.books.clock = clock
    client = make_client(limited, key)
    first = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=8)
    spent = first.usage.total_tokens
    limit_key(engine, account_id, key_id, f"spend {spent} daily", clock.now)  # all spent
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=8)
    assert refused.value.code == "insufficient_quota"
    assert "resets at 2026-11-29 00:00 UTC" in refused.value.message
    before = key_info(limited, key)["spend"]
    assert before["resets_at"] == int(datetime(2026, 11, 29, tzinfo=UTC).timestamp())

    clock.now = datetime(2026, 11, 29, 0, 0, 1, tzinfo=UTC)

    after = key_info(limited, key)["spend"]
    assert after["spent_tokens"] == 0 and after["remaining_tokens"] == spent
    assert after["resets_at"] == int(datetime(2026, 11, 30, tzinfo=UTC).timestamp())
    again = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=4)
    assert again.usage.total_tokens <= spent
    assert key_info(limited, key)["spend"]["spent_tokens"] == again.usage.total_tokens


def test_a_rotated_key_keeps_its_limits_and_its_spend(limited, make_client, engine, secret_key):
    key, key_id, account_id = new_key(engine, secret_key)
    limit_key(engine, account_id, key_id, "spend 400 total; rpm 50")
    client = make_client(limited, key)
    spent = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=8)

    with session_scope(engine) as session:
        rotated = keys.rotate_key(
            session=session, account_id=account_id, secret_key=secret_key, key_id=key_id
        )

    info = key_info(limited, rotated)
    assert info["id"] != key_id
    assert info["limits"]["spend_limit"] == 400 and info["limits"]["rpm"] == 50
    assert info["spend"]["spent_tokens"] == spent.usage.total_tokens
    assert info["spend"]["remaining_tokens"] == 400 - spent.usage.total_tokens


def test_an_expired_key_is_refused_as_expired(limited, make_client, engine, secret_key):
    key, key_id, account_id = new_key(engine, secret_key)
    client = make_client(limited, key)
    client.chat.completions.create(model="demo", messages=HELLO, max_tokens=2)  # cached now
    limit_key(engine, account_id, key_id, "expires 2026-01-31")

    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=2)

    assert refused.value.code == "key_expired"
    assert "expired at 2026-01-31 00:00 UTC" in refused.value.message
    answers: list[httpx.Response] = []

    def refused_by_key_route() -> bool:  # once its cached answer (a tenth of a second) is gone
        headers = {"Authorization": f"Bearer {key}"}
        answers.append(httpx.get(f"{limited.base_url}/key", headers=headers))
        return answers[-1].status_code == 401

    poll(refused_by_key_route, within=2, what="GET /v1/key refuses the expired key")
    assert "expired" in answers[-1].json()["error"]["message"]


def test_a_model_outside_the_keys_list_is_a_403_naming_model(
    limited, make_client, engine, secret_key
):
    key, key_id, account_id = new_key(engine, secret_key)
    limit_key(engine, account_id, key_id, "models big,small")
    client = make_client(limited, key)

    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=2)
    with pytest.raises(openai.PermissionDeniedError):
        client.responses.create(model="demo", input="hello", max_output_tokens=16)
    limit_key(engine, account_id, key_id, "models demo")
    allowed: list[Any] = []

    def served() -> bool:  # once the cached list (a tenth of a second) is gone
        try:
            allowed.append(
                client.chat.completions.create(model="demo", messages=HELLO, max_tokens=2)
            )
        except openai.PermissionDeniedError:
            return False
        return True

    poll(served, within=2, what="the model allowed")

    assert refused.value.body["param"] == "model"  # type: ignore[index]
    assert refused.value.code == "model_not_allowed"
    assert "may not use the model 'demo'; it may use: big, small" in refused.value.message
    assert allowed[0].usage.total_tokens > 0


def test_an_embedding_model_outside_the_keys_list_is_a_403_naming_model(
    start_server, make_client, engine, secret_key
):
    embed = DEMO_MODEL.parent / "demo-embed"
    server = start_server(key_cache_seconds=0.1, models=f"demo={DEMO_MODEL},demo-embed={embed}")
    key, key_id, account_id = new_key(engine, secret_key)
    limit_key(engine, account_id, key_id, "models demo")
    client = make_client(server, key)

    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.embeddings.create(model="demo-embed", input="hello")

    assert refused.value.body["param"] == "model"  # type: ignore[index]
    assert "may not use the model 'demo-embed'; it may use: demo" in refused.value.message
    with session_scope(engine) as session:
        assert ledger.get_balance(session=session, account_id=account_id).used == 0


def test_rpm_and_tpm_answer_429_with_retry_after(limited, make_client, engine, secret_key):
    key, key_id, account_id = new_key(engine, secret_key)
    limit_key(engine, account_id, key_id, "rpm 3")
    client = make_client(limited, key)
    for _ in range(3):
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as by_requests:
        client.chat.completions.create(model="demo", messages=HELLO, max_tokens=2)

    other, other_id, other_account = new_key(engine, secret_key)
    limit_key(engine, other_account, other_id, "tpm 60")
    tokens = make_client(limited, other)
    tokens.chat.completions.create(model="demo", messages=HELLO, max_tokens=50)
    with pytest.raises(openai.RateLimitError) as by_tokens:
        tokens.chat.completions.create(model="demo", messages=HELLO, max_tokens=50)

    for refused, kind, number in ((by_requests, "requests", 3), (by_tokens, "tokens", 60)):
        assert refused.value.code == "rate_limit_exceeded"
        assert f"{number} {kind} per minute" in refused.value.message
        retry_after = int(refused.value.response.headers["retry-after"])
        assert 1 <= retry_after <= 60


def test_on_v1_messages_each_refusal_is_anthropics_exception(limited, engine, secret_key):
    """Anthropic's Messages API answers the same refusals in its own shape (issue 46)."""
    import anthropic

    key, key_id, account_id = new_key(engine, secret_key)
    client = anthropic.Anthropic(base_url=limited.base_url.removesuffix("/v1"), api_key=key)
    client = client.with_options(max_retries=0)
    ask = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    spent = client.messages.create(**ask).usage  # type: ignore[call-overload]

    limit_key(engine, account_id, key_id, f"spend {spent.input_tokens + spent.output_tokens} total")
    with pytest.raises(anthropic.RateLimitError) as by_spend:
        client.messages.create(**ask)  # type: ignore[call-overload]
    limit_key(engine, account_id, key_id, "clear; models other")
    poll(lambda: _refused(client, ask, anthropic.PermissionDeniedError), within=2, what="403")
    limit_key(engine, account_id, key_id, "clear; expires 2026-01-01")
    poll(lambda: _refused(client, ask, anthropic.AuthenticationError), within=2, what="401")
    client.close()

    assert "spend limit" in by_spend.value.message
    assert by_spend.value.response.headers["x-should-retry"] == "false"


def _refused(client: Any, ask: dict[str, Any], error: type[Exception]) -> bool:
    """Whether the request is refused with `error`; another answer (the key's cached limits,
    for a tenth of a second) is not that refusal yet."""
    import anthropic

    try:
        client.messages.create(**ask)
    except anthropic.APIStatusError as refusal:
        return isinstance(refusal, error)
    return False
