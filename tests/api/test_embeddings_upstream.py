"""A developer embeds through Tokenshop from an upstream embedding server nobody here wrote:
llama-cpp-python's server with `--embedding true`, serving a tiny random-weight GGUF (mean
pooling) made with the demo tokenizer. The vectors are the upstream's, the bill its usage, its
refusals reach the client in OpenAI's shape, and an upstream that is down costs nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from sqlmodel import col, select

from billing import ledger
from billing.db import session_scope
from billing.models import LedgerEntry
from tests.api.conftest import DEMO_MODEL
from tests.api.upstreams import UpstreamProcess, llama_cpp_server, make_gguf, models_toml
from tests.factories import make_account, make_key

pytestmark = pytest.mark.slow

TEXTS = [
    "The token shop sells keys for stars.",
    "Привет, мир!",
    "A much longer document about batches, engines and the price of a token pack, " * 4,
    "short",
]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return make_gguf(tmp_path_factory.mktemp("gguf") / "tiny-embed.gguf", pooling="mean")


@pytest.fixture(scope="module")
def llama(gguf: Path) -> Iterator[UpstreamProcess]:
    server = embedding_server(gguf)
    try:
        yield server.wait_ready(within=120)
    finally:
        server.stop()


def embedding_server(gguf: Path) -> UpstreamProcess:
    return llama_cpp_server(gguf, "--embedding", "true")


@pytest.fixture
def direct(llama) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=llama.base_url, api_key="none", max_retries=0) as client:
        yield client


def serve(start_server, tmp_path: Path, upstreams: list[str], **fields) -> str:
    path = tmp_path / "models.toml"
    path.write_text(models_toml("embed", upstreams, kind="embedding", **fields))
    return start_server(models_file=str(path)).base_url


@pytest.fixture
def through(llama, start_server, tmp_path, api_key) -> Iterator[openai.OpenAI]:
    base_url = serve(start_server, tmp_path, [llama.base_url], batch_size=3)
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        yield client


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def usage_entries(engine) -> list[LedgerEntry]:
    with session_scope(engine) as session:
        query = select(LedgerEntry).where(LedgerEntry.kind == "usage").order_by(col(LedgerEntry.id))
        return list(session.exec(query).all())


def test_the_vectors_are_the_upstreams_own_and_base64_agrees(direct, through):
    own = direct.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    floats = through.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    default = through.embeddings.create(model="embed", input=TEXTS)  # the SDK asks for base64
    assert vectors(own).shape == (4, 64)
    assert cosines(vectors(floats), vectors(own)).min() >= 0.99999
    assert np.array_equal(vectors(default), vectors(floats))
    assert [item.index for item in floats.data] == [0, 1, 2, 3]  # 4 inputs in slices of 3
    assert floats.model == "embed"


def test_usage_and_the_ledger_are_the_upstreams_own_count(direct, through, engine):
    own = direct.embeddings.create(model="embed", input=TEXTS)
    answer = through.embeddings.create(model="embed", input=TEXTS)
    assert own.usage.prompt_tokens > 0
    assert answer.usage.prompt_tokens == own.usage.prompt_tokens
    assert answer.usage.total_tokens == own.usage.prompt_tokens
    [entry] = usage_entries(engine)
    assert (entry.prompt_tokens, entry.completion_tokens, -entry.amount) == (
        own.usage.prompt_tokens,
        0,
        own.usage.prompt_tokens,
    )


def test_a_tokenizer_counts_the_hold_and_the_upstream_bills_it(
    llama, direct, start_server, tmp_path, api_key, engine
):
    base_url = serve(start_server, tmp_path, [llama.base_url], tokenizer=str(DEMO_MODEL))
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        answer = client.embeddings.create(model="embed", input=TEXTS, dimensions=16)
    own = direct.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    full = vectors(own)[:, :16]
    expected = full / np.linalg.norm(full, axis=1, keepdims=True)
    assert cosines(vectors(answer), expected).min() >= 0.99999  # dimensions: cut, normalized
    [entry] = usage_entries(engine)
    assert entry.prompt_tokens == answer.usage.prompt_tokens == own.usage.prompt_tokens


def test_what_the_upstream_cannot_embed_costs_nothing(through, engine):
    # llama-cpp-python's server takes no token ids, and answers every bad request with a 500
    # (its embeddings route sends no 400): a 503 here, after trying every URL, and no charge.
    # An upstream's 400 in OpenAI's shape is test_embeddings_upstream_faults.py's.
    with pytest.raises(openai.InternalServerError) as refused:
        through.embeddings.create(model="embed", input=[[5, 6, 7]])
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "upstream_unavailable"
    with pytest.raises(openai.BadRequestError) as too_wide:  # against its answer's width
        through.embeddings.create(model="embed", input="short", dimensions=65)
    assert too_wide.value.body["param"] == "dimensions"
    assert [entry.note for entry in usage_entries(engine)] == ["released", "released"]


def test_a_chat_request_to_it_is_a_400_naming_model(through):
    assert "embed" in [model.id for model in through.models.list().data]
    with pytest.raises(openai.BadRequestError) as wrong:
        through.chat.completions.create(
            model="embed", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert wrong.value.body["param"] == "model"


def test_an_upstream_gone_is_a_503_and_its_hold_is_released(
    gguf, start_server, tmp_path, session, secret_key, engine
):
    upstream = embedding_server(gguf).wait_ready(within=120)
    try:
        base_url = serve(start_server, tmp_path, [upstream.base_url])
        account = make_account(session, tokens=10_000)
        key = make_key(session, account, secret_key=secret_key)
        with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
            spent = client.embeddings.create(model="embed", input=TEXTS).usage.prompt_tokens
            upstream.kill()
            with pytest.raises(openai.InternalServerError) as down:
                client.embeddings.create(model="embed", input=TEXTS)
    finally:
        upstream.stop()
    assert down.value.status_code == 503
    assert down.value.body["code"] == "upstream_unavailable"
    with session_scope(engine) as check:
        balance = ledger.get_balance(session=check, account_id=account.id)
        assert (balance.balance, balance.held, balance.used) == (10_000 - spent, 0, spent)
    assert [entry.note for entry in usage_entries(engine)][-1] == "released"
