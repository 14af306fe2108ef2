"""`MODELS_FILE`: the served models in TOML, local exports and upstream servers alike.

    [[model]]
    name = "demo"
    path = "models/demo"

    [[model]]
    name = "embed"
    path = "models/demo-embed"  # an embedding export: served at /v1/embeddings
    truncate = true  # inputs past the model's length are cut, not refused (embedding only)

    [[model]]
    name = "llama-70b"
    upstreams = ["http://gpu-a:8000/v1", "http://gpu-b:8000/v1"]
    upstream_model = "meta-llama/Llama-3.3-70B-Instruct"
    api_key_env = "VLLM_API_KEY"
    tokenizer = "/srv/tok/llama"
    context_length = 131072
    messages_api = false            # true: Anthropic's /v1/messages go to its own, as sent
    price_prompt = 1.0
    price_completion = 3.0

    [[model]]
    name = "bge-m3"
    kind = "embedding"              # served at /v1/embeddings (default "chat")
    upstreams = ["http://tei-a:8080/v1"]
    dimensions = 1024               # optional: else learned from its first answer
    batch_size = 32                 # optional: inputs per upstream request (TEI's default)

Everything is checked at start-up, and an error names the model and the field. Prices are
read by `billing.prices` (the bot shows the same table); docs/upstreams.md has the walk-through.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from api.engine.errors import ModelLoadError
from api.engine.registry import PROJECT_ROOT
from api.engine.upstream import UpstreamConfig
from api.engine.upstream.config import DEFAULT_EMBEDDING_BATCH
from billing.prices import PriceError, entry_price, read_models_toml

FIELDS = {
    "name",
    "path",
    "upstreams",
    "upstream_model",
    "api_key_env",
    "tokenizer",
    "context_length",
    "messages_api",
    "price_prompt",
    "price_completion",
    "truncate",
    "kind",
    "dimensions",
    "batch_size",
}
UPSTREAM_ONLY = (
    "upstreams",
    "upstream_model",
    "api_key_env",
    "tokenizer",
    "context_length",
    "messages_api",
    "kind",
    "dimensions",
    "batch_size",
)
EMBEDDING_ONLY = ("dimensions", "batch_size")
KINDS = ("chat", "embedding")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelsFileError(ModelLoadError):
    """Raised at start-up when the models file is unreadable or a field is wrong; the message
    names the model and the field (and never an API key)."""


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path
    truncate: bool = False  # an embedding model cuts inputs past its length (registry)


ModelEntry = LocalModel | UpstreamConfig


def read_models_file(path: str | Path) -> list[ModelEntry]:
    """Every model of the file, checked."""
    try:
        tables = read_models_toml(Path(path))
    except PriceError as exc:
        raise ModelsFileError(str(exc)) from None
    if not tables:
        raise ModelsFileError(f"MODELS_FILE {str(path)!r} has no [[model]] tables")
    entries: list[ModelEntry] = []
    for index, table in enumerate(tables):
        entry = _entry(index, table)
        if any(entry.name == other.name for other in entries):
            raise ModelsFileError(f"model {entry.name!r}: name is used twice")
        entries.append(entry)
    return entries


def _entry(index: int, table: dict[str, Any]) -> ModelEntry:
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ModelsFileError(f"model #{index + 1}: name must be a non-empty string")
    unknown = sorted(set(table) - FIELDS)
    if unknown:
        raise ModelsFileError(
            f"model {name!r}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(FIELDS))})"
        )
    try:
        entry_price(table, name)
    except PriceError as exc:
        raise ModelsFileError(str(exc)) from None
    has_path, has_upstreams = "path" in table, "upstreams" in table
    if has_path == has_upstreams:
        raise ModelsFileError(f"model {name!r}: give either path or upstreams (exactly one)")
    if has_path:
        extra = [field for field in UPSTREAM_ONLY if field in table]
        if extra:
            raise ModelsFileError(f"model {name!r}: {extra[0]} applies only with upstreams")
        truncate = table.get("truncate", False)
        if not isinstance(truncate, bool):
            raise ModelsFileError(f"model {name!r}: truncate must be true or false")
        return LocalModel(name, _local_path(name, table["path"]), truncate)
    if "truncate" in table:
        raise ModelsFileError(f"model {name!r}: truncate applies only with path")
    return _upstream(name, table)


def _local_path(name: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise ModelsFileError(f"model {name!r}: path must be a directory path string")
    path = Path(os.path.expanduser(value))
    if not path.is_absolute() and not path.exists() and (PROJECT_ROOT / path).exists():
        path = PROJECT_ROOT / path
    if not path.is_dir():
        raise ModelsFileError(f"model {name!r}: path {value!r} is not a directory")
    return path


def _upstream(name: str, table: dict[str, Any]) -> UpstreamConfig:
    urls = table["upstreams"]
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        raise ModelsFileError(f"model {name!r}: upstreams must be a list of base URLs")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ModelsFileError(
                f"model {name!r}: upstreams item {url!r} is not an http(s) URL "
                "such as 'http://gpu-a:8000/v1'"
            )
        if parts.username or parts.password:
            raise ModelsFileError(
                f"model {name!r}: upstreams item has credentials in it; "
                "name the env var holding the key in api_key_env instead"
            )
    if len(set(urls)) != len(urls):
        raise ModelsFileError(f"model {name!r}: upstreams lists a URL twice")
    upstream_model = table.get("upstream_model", name)
    if not isinstance(upstream_model, str) or not upstream_model:
        raise ModelsFileError(f"model {name!r}: upstream_model must be a non-empty string")
    kind = table.get("kind", "chat")
    if kind not in KINDS:
        raise ModelsFileError(f'model {name!r}: kind must be "chat" or "embedding"')
    if kind == "chat" and (extra := [field for field in EMBEDDING_ONLY if field in table]):
        raise ModelsFileError(f'model {name!r}: {extra[0]} applies only with kind = "embedding"')
    if kind == "embedding" and table.get("messages_api", False):
        raise ModelsFileError(f"model {name!r}: messages_api applies only to chat models")
    dimensions = table.get("dimensions")
    return UpstreamConfig(
        name=name,
        upstreams=tuple(urls),
        upstream_model=upstream_model,
        api_key=_api_key(name, table.get("api_key_env")),
        tokenizer=_tokenizer(name, table.get("tokenizer")),
        context_length=_context_length(name, table.get("context_length")),
        messages_api=_messages_api(name, table.get("messages_api", False)),
        kind=kind,
        dimensions=None if dimensions is None else _positive(name, "dimensions", dimensions),
        batch_size=_positive(name, "batch_size", table.get("batch_size", DEFAULT_EMBEDDING_BATCH)),
    )


def _messages_api(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ModelsFileError(f"model {name!r}: messages_api must be true or false")
    return value


def _api_key(name: str, variable: Any) -> str | None:
    if variable is None:
        return None
    if not isinstance(variable, str) or not _ENV_NAME.match(variable):
        raise ModelsFileError(
            f"model {name!r}: api_key_env must name an environment variable "
            "(e.g. 'VLLM_API_KEY'), not hold the key"
        )
    value = os.environ.get(variable, "")
    if not value:
        raise ModelsFileError(f"model {name!r}: api_key_env names {variable}, which is not set")
    return value


def _tokenizer(name: str, value: Any) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ModelsFileError(f"model {name!r}: tokenizer must be a path string")
    path = Path(os.path.expanduser(value))
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ModelsFileError(
            f"model {name!r}: tokenizer {value!r} is neither a tokenizer.json nor a dir with one"
        )
    return path


def _context_length(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ModelsFileError(f"model {name!r}: context_length must be a whole number above 1")
    return value


def _positive(name: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelsFileError(f"model {name!r}: {field} must be a whole number above 0")
    return value
