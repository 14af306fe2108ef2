"""Tiny random-weight embedding models, built as sentence-transformers models (the torch
reference) and exported by `tokenshop export-model --task embedding`'s own code, once per
session and architecture (`models/make_demo_embed.py`)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def load_make_demo_embed() -> ModuleType:
    name = "tokenshop_make_demo_embed"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "models" / "make_demo_embed.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@dataclass
class EmbeddingExport:
    arch: str
    source: Path  # the sentence-transformers model dir
    path: Path  # its float32 export
    reference: Any  # the SentenceTransformer on torch


class _Exports(dict):
    def __init__(self, factory: pytest.TempPathFactory) -> None:
        super().__init__()
        self._factory = factory

    def __missing__(self, arch: str) -> EmbeddingExport:
        directory = self._factory.mktemp(f"embedding-{arch}")
        reference = load_make_demo_embed().make_embedding_export(
            arch, directory / "export", source=directory / "source"
        )
        self[arch] = EmbeddingExport(arch, directory / "source", directory / "export", reference)
        return self[arch]


@pytest.fixture(scope="session")
def embedding_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, EmbeddingExport]:
    """Exported lazily, one per architecture: `embedding_exports["bert"]`."""
    return _Exports(tmp_path_factory)
