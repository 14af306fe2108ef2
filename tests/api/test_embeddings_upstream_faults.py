"""An upstream embedding model against the fault-injecting upstream (`tests/fake_upstream.py`):
slices of `batch_size`, answers in any order, base64 from upstream, usage or none, refusals,
failover, a key that never shows — each billed as the client is told, or not at all."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from sqlmodel import select

from api.engine.upstream import wire
from api.engine.upstream.embedding import SPECIAL_TOKENS_BOUND
from billing import ledger
from billing.db import session_scope
from billing.models import LedgerEntry
from tests import fake_upstream
from tests.api.conftest import ROOT, free_port
from tests.api.upstreams import models_toml
from tests.factories import make_account, make_key

TEXTS = ["one two three", "four", "five six", "seven eight nine ten", "eleven"]
WORDS = 11  # the fake upstream's usage of TEXTS


@pytest.fixture
def serve(start_server, tmp_path, session, secret_key):
    """`serve(url, ..., batch_size=2)`: the API with embedding model "embed" on those upstreams,
    and an SDK client of a new account holding 10,000 tokens (`client.account_id`)."""
    clients: list[openai.OpenAI] = []

    def serve(*urls: str, **fields: Any) -> openai.OpenAI:
        path = tmp_path / "models.toml"
        path.write_text(
            models_toml("embed", urls, kind="embedding", upstream_model="fake", **fields)
        )
        server = start_server(models_file=str(path))
        account = make_account(session, tokens=10_000)
        key = make_key(session, account, secret_key=secret_key)
        client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
        client.account_id = account.id  # type: ignore[attr-defined]
        client.server = server  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield serve
    for client in clients:
        client.close()


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def expected(texts: list[str]) -> np.ndarray:
    return np.array([fake_upstream.text_vector(text) for text in texts], dtype=np.float32)


def balance(engine, client) -> Any:
    with session_scope(engine) as check:
        return ledger.get_balance(session=check, account_id=client.account_id)


def usage_entries(engine) -> list[LedgerEntry]:
    with session_scope(engine) as session:
        return list(session.exec(select(LedgerEntry).where(LedgerEntry.kind == "usage")).all())


def test_inputs_go_in_slices_and_come_back_in_order_billed_the_upstreams_usage(
    fakes, serve, engine
):
    upstream = fakes()
    client = serve(upstream.base_url, batch_size=2)
    answer = client.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    assert upstream.state()["embeddings"] == 3  # 2 + 2 + 1
    assert np.allclose(vectors(answer), expected(TEXTS))
    assert [item.index for item in answer.data] == list(range(5))
    assert answer.usage.prompt_tokens == WORDS
    [entry] = usage_entries(engine)
    assert (entry.prompt_tokens, -entry.amount) == (WORDS, WORDS)
    assert balance(engine, client).balance == 10_000 - WORDS
    body = upstream.state()["last_body"]
    assert body == {"model": "fake", "input": ["eleven"], "encoding_format": "float"}


def test_base64_dimensions_and_token_ids(fakes, serve):
    upstream = fakes()
    client = serve(upstream.base_url)
    default = client.embeddings.create(model="embed", input=TEXTS)  # base64 to the client
    assert np.array_equal(vectors(default), expected(TEXTS))
    cut = vectors(client.embeddings.create(model="embed", input=TEXTS, dimensions=3))
    full = expected(TEXTS)[:, :3]
    assert np.allclose(cut, full / np.linalg.norm(full, axis=1, keepdims=True), atol=1e-6)
    client.embeddings.create(model="embed", input=[[5, 6, 7], [8]], encoding_format="float")
    assert upstream.state()["last_body"]["input"] == [[5, 6, 7], [8]]  # ids go as ids


def test_an_answer_is_read_in_index_order_from_floats_or_base64():
    rows = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    data = [
        {"index": 2, "embedding": base64.b64encode(rows[2].astype("<f4").tobytes()).decode()},
        {"index": 0, "embedding": rows[0].tolist()},
        {"index": 1, "embedding": rows[1].tolist()},
    ]
    found, usage = wire.parse_embeddings({"data": data, "usage": {"prompt_tokens": 7}}, 3)
    assert np.array_equal(found, rows) and usage == 7
    assert wire.parse_embeddings({"data": data, "usage": {"prompt_tokens": 0}}, 3)[1] is None
    for wrong in (
        {"data": data[:2]},  # a vector short
        {"data": [data[0], data[0], data[1]]},  # an index twice
        {"data": [{"index": 0, "embedding": [[1, 2], [3, 4]]}]},  # a vector a token
        {"data": [{"index": 0, "embedding": {"x": 1}}]},
        {"error": "no"},
    ):
        with pytest.raises(ValueError):
            wire.parse_embeddings(wrong, len(wrong.get("data", [])) or 1)


def test_without_usage_the_bound_held_is_billed(fakes, serve, engine):
    upstream = fakes(mode="no_usage")
    client = serve(upstream.base_url)
    answer = client.embeddings.create(model="embed", input=TEXTS)
    bound = sum(len(text.encode()) + SPECIAL_TOKENS_BOUND for text in TEXTS)
    assert answer.usage.prompt_tokens == bound
    [entry] = usage_entries(engine)
    assert entry.prompt_tokens == bound


def test_an_upstream_400_reaches_the_client_and_releases_the_hold(fakes, serve, engine):
    upstream = fakes(mode="status_400")
    client = serve(upstream.base_url)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="embed", input=TEXTS)
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "message": "input is too long for this upstream",
        "type": "invalid_request_error",
        "param": "input",
        "code": "long",
    }
    assert upstream.state()["embeddings"] == 1  # a refusal is not failed over
    assert (balance(engine, client).balance, balance(engine, client).held) == (10_000, 0)
    assert [entry.note for entry in usage_entries(engine)] == ["released"]


def test_a_failing_upstream_fails_over_and_all_failing_is_a_503(fakes, serve, engine):
    broken, good = fakes(mode="status_500"), fakes()
    client = serve(broken.base_url, good.base_url)
    answer = client.embeddings.create(model="embed", input=TEXTS)
    assert answer.usage.prompt_tokens == WORDS
    good.mode("status_500")
    with pytest.raises(openai.InternalServerError) as down:
        client.embeddings.create(model="embed", input=TEXTS)
    assert down.value.status_code == 503 and down.value.body["code"] == "upstream_unavailable"
    assert balance(engine, client).balance == 10_000 - WORDS
    assert balance(engine, client).held == 0


def test_a_long_text_is_held_at_the_context_length_and_refused_only_with_a_tokenizer(
    fakes, serve, engine
):
    upstream = fakes()
    client = serve(upstream.base_url, context_length=16)
    answer = client.embeddings.create(model="embed", input=["word " * 50])
    assert answer.usage.prompt_tokens == 16  # the upstream's 50, capped at the 16 held
    tokenizer = str(ROOT / "models" / "demo-embed")
    tokenizer_client = serve(upstream.base_url, context_length=16, tokenizer=tokenizer)
    with pytest.raises(openai.BadRequestError) as long:
        tokenizer_client.embeddings.create(model="embed", input=["word " * 50])
    assert long.value.body["code"] == "context_length_exceeded"


def test_the_upstreams_key_never_shows(fakes, serve, monkeypatch, caplog):
    secret = "sk-embed-secret-0123456789abcdef"
    monkeypatch.setenv("EMBED_UPSTREAM_KEY", secret)
    good = fakes(env={"FAKE_UPSTREAM_KEY": secret})
    wrong = fakes(env={"FAKE_UPSTREAM_KEY": "another"})  # refuses our key: a 401
    caplog.set_level(logging.DEBUG)
    client = serve(wrong.base_url, good.base_url, api_key_env="EMBED_UPSTREAM_KEY")
    answers = [client.embeddings.create(model="embed", input=TEXTS) for _ in range(3)]
    assert good.state()["embeddings"] == 3
    base = client.server.base_url.removesuffix("/v1")  # type: ignore[attr-defined]
    ready = httpx.get(f"{base}/ready").json()
    assert set(ready["backends"]["embed"]) == {wrong.base_url, good.base_url}
    metrics = httpx.get(f"{base}/metrics").text
    series = f'tokenshop_upstream_requests_total{{backend="{good.base_url}",model="embed"}}'
    assert f"{series} 3.0" in metrics
    text = metrics + json.dumps(ready) + caplog.text
    assert secret not in text + "".join(a.model_dump_json() for a in answers)


def test_a_dead_upstream_at_start_is_a_503_and_the_model_is_listed(serve):
    client = serve(f"http://127.0.0.1:{free_port()}/v1")
    assert [model.id for model in client.models.list().data] == ["embed"]
    with pytest.raises(openai.InternalServerError):
        client.embeddings.create(model="embed", input="hello")
