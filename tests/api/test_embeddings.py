"""A developer embeds documents through `POST /v1/embeddings` with the `openai` SDK and
LangChain, served by the demo embedding model beside the demo chat model, and pays for it from
the same balance."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import select
from tokenizers import Tokenizer

from billing import ledger
from billing.db import session_scope
from billing.models import LedgerEntry
from tests.api.conftest import DEMO_MODEL, ROOT
from tests.factories import make_account, make_key

DEMO_EMBED = ROOT / "models" / "demo-embed"
TEXTS = [
    "The token shop sells keys for stars.",
    "Привет, мир!",
    "A much longer document about batches, engines and the price of a token pack, " * 6,
    "short",
]


@pytest.fixture
def server(start_server):
    return start_server(models=f"demo={DEMO_MODEL},embed={DEMO_EMBED}")


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def token_ids(text: str) -> list[int]:
    return Tokenizer.from_file(str(DEMO_EMBED / "tokenizer.json")).encode(text).ids


def raw_post(server, key: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/embeddings",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def test_the_sdk_default_base64_and_float_give_the_same_vectors(client, server, api_key):
    default = client.embeddings.create(model="embed", input=TEXTS)  # the SDK asks for base64
    floats = client.embeddings.create(model="embed", input=TEXTS, encoding_format="float")
    assert np.array_equal(vectors(default), vectors(floats))
    assert [item.index for item in default.data] == [0, 1, 2, 3]
    found = vectors(floats)
    assert found.shape == (4, 64)
    assert np.allclose(np.linalg.norm(found, axis=1), 1.0, atol=1e-5)  # the model normalizes
    assert (found @ found.T)[np.triu_indices(4, 1)].max() < 0.99  # texts are told apart
    assert default.usage.prompt_tokens == sum(len(token_ids(text)) for text in TEXTS)
    assert default.usage.total_tokens == default.usage.prompt_tokens
    assert default.model == "embed" and default.object == "list"
    # what the SDK decoded is the wire's little-endian float32, as OpenAI sends it
    wire = raw_post(
        server, api_key, {"model": "embed", "input": "short", "encoding_format": "base64"}
    )
    decoded = np.frombuffer(base64.b64decode(wire.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, found[3])


def test_dimensions_keep_the_first_ones_normalized_again(client):
    full = vectors(client.embeddings.create(model="embed", input=TEXTS, encoding_format="float"))
    cut = vectors(client.embeddings.create(model="embed", input=TEXTS, dimensions=16))
    assert cut.shape == (4, 16)
    expected = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    assert np.allclose(cut, expected, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.embeddings.create(model="embed", input="hello", dimensions=65)
    assert too_many.value.param == "dimensions"


def test_token_ids_embed_as_their_text_does(client):
    text = TEXTS[0]
    by_text = vectors(client.embeddings.create(model="embed", input=text))
    by_ids = client.embeddings.create(model="embed", input=token_ids(text))
    many = client.embeddings.create(model="embed", input=[token_ids(t) for t in TEXTS])
    assert np.allclose(vectors(by_ids), by_text, atol=1e-6)
    assert np.allclose(vectors(many)[0], by_text[0], atol=1e-6)
    assert by_ids.usage.prompt_tokens == len(token_ids(text))


def test_2048_inputs_are_batched_not_refused_and_each_is_its_own(client):
    texts = [f"{TEXTS[i % 4][: 5 + i % 300]} {i}" for i in range(2048)]
    many = client.embeddings.create(model="embed", input=texts)
    assert len(many.data) == 2048
    assert [item.index for item in many.data] == list(range(2048))
    alone = vectors(client.embeddings.create(model="embed", input=[texts[7], texts[1500]]))
    assert np.allclose(vectors(many)[[7, 1500]], alone, atol=1e-5)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"input": [f"text {i}" for i in range(2049)]}, "invalid_value"),
        ({"input": ""}, "invalid_value"),
        ({"input": ["fine", ""]}, "invalid_value"),
        ({"input": []}, "invalid_value"),
        ({"input": [[1, 2], []]}, "invalid_value"),
        ({"input": "word " * 600}, "context_length_exceeded"),
        ({"input": [[7] * 501] * 600}, "max_tokens_per_request"),
        ({"input": [5, 999_999]}, "invalid_value"),
        ({"input": [5, -1]}, "invalid_value"),
        ({"input": ["text", 5]}, "invalid_value"),
        ({"input": {"text": "x"}}, "invalid_value"),
    ],
    ids=[
        "2049-inputs",
        "empty-string",
        "an-empty-item",
        "no-inputs",
        "an-empty-token-array",
        "longer-than-the-model",
        "over-300000-tokens",
        "token-past-the-vocabulary",
        "negative-token",
        "mixed-types",
        "an-object",
    ],
)
def test_bad_input_is_a_400_naming_input(server, api_key, engine, body, code):
    response = raw_post(server, api_key, {"model": "embed", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input" and error["type"] == "invalid_request_error"
    assert error["code"] == code and error["message"]
    with session_scope(engine) as session:  # refused before any hold: nothing is billed
        assert session.exec(select(LedgerEntry).where(LedgerEntry.kind == "usage")).all() == []


def test_the_sdk_sees_each_error_in_openai_shape(client):
    with pytest.raises(openai.BadRequestError) as wrong_format:
        client.embeddings.create(model="embed", input="x", encoding_format="int8")  # type: ignore[arg-type]
    assert wrong_format.value.param == "encoding_format"
    with pytest.raises(openai.BadRequestError) as chat_model:
        client.embeddings.create(model="demo", input="x")
    assert chat_model.value.param == "model" and "chat model" in chat_model.value.message
    with pytest.raises(openai.BadRequestError) as embedding_model:
        client.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}])
    assert embedding_model.value.param == "model"
    assert "embedding model" in embedding_model.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="nope", input="x")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=client.base_url, api_key="sk-tks-wrong", max_retries=0
        ).embeddings.create(model="embed", input="x")


def test_models_lists_the_embedding_model_beside_the_chat_one(client, server):
    assert [model.id for model in client.models.list().data] == ["demo", "embed"]
    assert client.models.retrieve("embed").id == "embed"
    ready = httpx.get(server.base_url.removesuffix("/v1") + "/ready").json()
    assert ready["checks"] == {"database": "ok", "model:demo": "ok", "model:embed": "ok"}


def test_a_server_of_embedding_models_alone_is_ready(start_server):
    server = start_server(models=f"embed={DEMO_EMBED}")
    ready = httpx.get(server.base_url.removesuffix("/v1") + "/ready")
    assert ready.status_code == 200 and ready.json()["checks"]["model:embed"] == "ok"


def test_langchain_embeds_documents_and_queries(server, api_key, client):
    from langchain_openai import OpenAIEmbeddings

    embedder = OpenAIEmbeddings(
        model="embed",
        base_url=server.base_url,
        api_key=api_key,
        check_embedding_ctx_length=False,  # no tiktoken: the server tokenizes
        max_retries=0,
    )
    documents = np.array(embedder.embed_documents(TEXTS), dtype=np.float32)
    query = np.array(embedder.embed_query(TEXTS[1]), dtype=np.float32)
    expected = vectors(client.embeddings.create(model="embed", input=TEXTS))
    assert np.array_equal(documents, expected)
    assert np.array_equal(query, expected[1])


def test_billing_equals_usage_at_the_model_price(
    start_server, make_client, session, secret_key, engine
):
    server = start_server(models=f"embed={DEMO_EMBED}", model_prices="embed=0.5")
    account = make_account(session, tokens=10_000)
    client = make_client(server, make_key(session, account, secret_key=secret_key))
    response = client.embeddings.create(model="embed", input=TEXTS)
    with session_scope(engine) as books:
        entries = books.exec(select(LedgerEntry).where(LedgerEntry.kind == "usage")).all()
    [entry] = entries
    assert entry.prompt_tokens == response.usage.prompt_tokens
    assert entry.completion_tokens == 0
    assert -entry.amount == -(-response.usage.prompt_tokens // 2)  # ceil(tokens x 0.5)
    with session_scope(engine) as check:
        balance = ledger.get_balance(session=check, account_id=account.id)
        assert balance.held == 0 and balance.balance == 10_000 + entry.amount


def test_metrics_show_what_each_embedding_model_ran(start_server, make_client, make_funded_key):
    """An operator's dashboard reads the embedding batches per model: the tokens embedded
    equal the usage billed, and the padding the batches ran is counted apart."""
    server = start_server(models=f"embed={DEMO_EMBED}")
    client = make_client(server, make_funded_key(100_000))
    usage = sum(
        client.embeddings.create(model="embed", input=TEXTS[: 1 + n]).usage.prompt_tokens
        for n in range(4)
    )
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("tokenshop_embedding_") and sample.labels == {"model": "embed"}
    }
    assert samples["tokenshop_embedding_tokens_total"] == usage
    assert samples["tokenshop_embedding_inputs_total"] == 1 + 2 + 3 + 4
    assert samples["tokenshop_embedding_padded_tokens_total"] >= usage
    assert 4 <= samples["tokenshop_embedding_batches_total"] <= 10
    assert samples["tokenshop_embedding_queued_inputs"] == 0


def test_concurrent_requests_never_spend_more_than_the_balance(
    server, make_client, session, secret_key, engine
):
    balance = 700
    account = make_account(session, tokens=balance)
    client = make_client(server, make_key(session, account, secret_key=secret_key))

    def ask(index: int) -> int:
        try:
            done = client.embeddings.create(model="embed", input=TEXTS[index % 3])
            return done.usage.prompt_tokens
        except openai.RateLimitError:
            return 0

    with ThreadPoolExecutor(max_workers=40) as pool:
        spent = list(pool.map(ask, range(40)))
    assert 0 < sum(spent) <= balance
    assert 0 in spent  # the balance ran out along the way
    with session_scope(engine) as check:
        books = ledger.get_balance(session=check, account_id=account.id)
        assert books.used == sum(spent) and books.held == 0
        assert books.balance == balance - sum(spent)
        assert ledger.audit(session=check) == []


@pytest.mark.slow
def test_an_embedding_burst_leaves_chat_streams_running(server, make_client, make_funded_key):
    """Embeddings run on a worker of their own, never on the event loop or in the chat
    scheduler's steps: a chat stream started with a long burst of embeddings in flight ends
    while the burst is still running."""
    client = make_client(server, make_funded_key(100_000_000), timeout=300)
    texts = [f"{TEXTS[0] * 2} {i}" for i in range(2048)]  # ~25 tokens each, 4 requests
    with ThreadPoolExecutor(max_workers=4) as pool:
        burst = [
            pool.submit(client.embeddings.create, model="embed", input=texts) for _ in range(4)
        ]
        stream = client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=32,
            stream=True,
        )
        chunks = list(stream)
        still_running = sum(not request.done() for request in burst)
        done = [request.result() for request in burst]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert still_running > 0
    assert all(len(answer.data) == 2048 for answer in done)
