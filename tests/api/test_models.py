"""A developer lists the models with the `openai` SDK, no key needed beyond the SDK's own."""

from __future__ import annotations

import httpx
import openai
import pytest


def test_models_list_shows_the_demo_model(client: openai.OpenAI):
    models = client.models.list()
    assert [model.id for model in models.data] == ["demo"]
    assert models.data[0].object == "model" and models.data[0].owned_by == "tokenshop"
    assert models.data[0].created > 0


def test_models_retrieve_and_unknown_model(client: openai.OpenAI):
    assert client.models.retrieve("demo").id == "demo"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-9")
    assert missing.value.code == "model_not_found"


def test_models_need_no_key(server):
    response = httpx.get(f"{server.base_url}/models")
    assert response.status_code == 200
    assert response.json()["object"] == "list"
