"""MODELS_FILE is checked at start-up: a mistake is one error naming the model and the field,
and an upstream's key is read from the env var it names, never written in the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.engine.upstream import UpstreamConfig
from api.models_file import LocalModel, ModelsFileError, read_models_file
from billing.prices import Price, PriceError, price_table

ROOT = Path(__file__).resolve().parents[2]

EXAMPLE = """
[[model]]
name = "demo"
path = "models/demo"

[[model]]
name = "llama-70b"
upstreams = ["http://gpu-a:8000/v1", "http://gpu-b:8000/v1"]
upstream_model = "meta-llama/Llama-3.3-70B-Instruct"
api_key_env = "VLLM_API_KEY"
tokenizer = "models/demo"
context_length = 131072
price_prompt = 1.0
price_completion = 3.0
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_the_documented_example_reads_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-vllm-secret")
    monkeypatch.chdir(ROOT)
    demo, llama = read_models_file(write(tmp_path, EXAMPLE))
    assert isinstance(demo, LocalModel) and demo.path.resolve() == ROOT / "models" / "demo"
    assert isinstance(llama, UpstreamConfig)
    assert llama.upstreams == ("http://gpu-a:8000/v1", "http://gpu-b:8000/v1")
    assert llama.upstream_model == "meta-llama/Llama-3.3-70B-Instruct"
    assert llama.api_key == "sk-vllm-secret"
    assert "sk-vllm-secret" not in repr(llama)
    assert llama.context_length == 131072
    prices = price_table(models_file=str(tmp_path / "models.toml"), model_prices="demo=0.5")
    assert prices == {"demo": Price(0.5, 0.5), "llama-70b": Price(1.0, 3.0)}


@pytest.mark.parametrize(
    ("doc", "models"),
    [
        ("README.md", [["demo", "llama-70b"]]),
        ("docs/upstreams.md", [["demo", "llama-70b"], ["tiny"]]),
        ("docs/embeddings.md", [["embed"], ["bge-m3", "qwen3-embed", "nomic"]]),
    ],
)
def test_the_models_files_in_the_docs_work_as_printed(tmp_path, monkeypatch, doc, models):
    monkeypatch.setenv("VLLM_API_KEY", "sk-vllm-secret")
    monkeypatch.chdir(ROOT)
    text = (ROOT / doc).read_text()
    blocks = [part.split("```")[0] for part in text.split("```toml\n")[1:]]
    names = [[m.name for m in read_models_file(write(tmp_path, block))] for block in blocks]
    assert names == models


def test_an_upstream_embedding_model_reads_with_its_own_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("TEI_API_KEY", "sk-tei-secret")
    monkeypatch.chdir(ROOT)
    chat, embed = read_models_file(
        write(
            tmp_path,
            '[[model]]\nname = "chat"\nupstreams = ["http://a/v1"]\n'
            '[[model]]\nname = "embed"\nkind = "embedding"\nupstreams = ["http://tei:8080/v1"]\n'
            'api_key_env = "TEI_API_KEY"\ntokenizer = "models/demo-embed"\n'
            "context_length = 512\ndimensions = 64\nbatch_size = 16\n",
        )
    )
    assert isinstance(chat, UpstreamConfig) and chat.kind == "chat" and chat.batch_size == 32
    assert isinstance(embed, UpstreamConfig) and embed.kind == "embedding"
    assert (embed.context_length, embed.dimensions, embed.batch_size) == (512, 64, 16)
    assert embed.tokenizer == Path("models/demo-embed")
    assert "sk-tei-secret" not in repr(embed)


def test_upstream_model_defaults_to_the_name(tmp_path):
    [entry] = read_models_file(
        write(tmp_path, '[[model]]\nname = "m"\nupstreams = ["http://a/v1"]')
    )
    assert isinstance(entry, UpstreamConfig) and entry.upstream_model == "m"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('name = "m"\nupstreams = ["http://a/v1"]\nprice = 2', "model 'm': unknown field 'price'"),
        ('name = "m"\npath = "models/demo"\nupstreams = ["http://a/v1"]', "model 'm': give either"),
        ('name = "m"', "model 'm': give either path or upstreams"),
        ('name = "m"\nupstreams = []', "model 'm': upstreams must be a list"),
        ('name = "m"\nupstreams = ["gpu-a:8000"]', "model 'm': upstreams item 'gpu-a:8000'"),
        (
            'name = "m"\nupstreams = ["http://u:p@a/v1"]',
            "model 'm': upstreams item has credentials",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\napi_key_env = "NOT_SET_HERE_27"',
            "model 'm': api_key_env names NOT_SET_HERE_27, which is not set",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\napi_key_env = "sk-abc 123"',
            "model 'm': api_key_env must name an environment variable",
        ),
        ('name = "m"\nupstreams = ["http://a/v1"]\ntokenizer = "/nowhere"', "model 'm': tokenizer"),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\ncontext_length = "big"',
            "model 'm': context_length must be a whole number",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\nprice_completion = 0',
            "model 'm': price_completion must be a positive number",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\nprice_prompt = "1"',
            "model 'm': price_prompt must be a number",
        ),
        (
            'name = "m"\npath = "models/nowhere"',
            "model 'm': path 'models/nowhere' is not a directory",
        ),
        (
            'name = "m"\npath = "models/demo"\nupstream_model = "x"',
            "model 'm': upstream_model applies only with upstreams",
        ),
        (
            'name = "m"\npath = "models/demo-embed"\ntruncate = "yes"',
            "model 'm': truncate must be true or false",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\ntruncate = true',
            "model 'm': truncate applies only with path",
        ),
        ('upstreams = ["http://a/v1"]', "model #1: name must be a non-empty string"),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\nkind = "rerank"',
            'model \'m\': kind must be "chat" or "embedding"',
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\ndimensions = 64',
            "model 'm': dimensions applies only with kind = \"embedding\"",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\nkind = "embedding"\ndimensions = 0',
            "model 'm': dimensions must be a whole number above 0",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\nkind = "embedding"\nbatch_size = 2.5',
            "model 'm': batch_size must be a whole number above 0",
        ),
        (
            'name = "m"\nupstreams = ["http://a/v1"]\nkind = "embedding"\nmessages_api = true',
            "model 'm': messages_api applies only to chat models",
        ),
        (
            'name = "m"\npath = "models/demo-embed"\nkind = "embedding"',
            "model 'm': kind applies only with upstreams",
        ),
    ],
)
def test_a_mistake_names_the_model_and_the_field(tmp_path, table, message):
    with pytest.raises(ModelsFileError) as error:
        read_models_file(write(tmp_path, f"[[model]]\n{table}\n"))
    assert message in str(error.value)


def test_a_name_used_twice_and_a_file_that_is_not_toml_are_refused(tmp_path):
    twice = '[[model]]\nname = "m"\nupstreams = ["http://a/v1"]\n' * 2
    with pytest.raises(ModelsFileError, match="model 'm': name is used twice"):
        read_models_file(write(tmp_path, twice))
    with pytest.raises(ModelsFileError, match="is not valid TOML"):
        read_models_file(write(tmp_path, "[[model]\nname ="))
    with pytest.raises(PriceError, match="MODEL_PRICES item 'big=free'"):
        price_table(models_file=None, model_prices="big=free")
