"""Secrets: generated once in development, required and real in production."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError

from billing.settings import BillingSettings


def _settings(**values) -> BillingSettings:
    return BillingSettings(_env_file=None, **values)  # type: ignore[call-arg]


def test_development_generates_one_private_secret_shared_by_every_process(tmp_path):
    path = tmp_path / ".tokenshop-secret"
    with ThreadPoolExecutor(max_workers=8) as pool:
        secrets = set(
            pool.map(lambda _: _settings(secret_file=path).resolved_secret_key(), range(8))
        )
    assert len(secrets) == 1 and len(secrets.pop()) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [".tokenshop-secret"]


@pytest.mark.parametrize("secret", [None, "changeme", "secret", "short"])
def test_production_refuses_a_missing_or_placeholder_secret(secret):
    with pytest.raises(ValidationError, match="SECRET_KEY"):
        _settings(environment="production", secret_key=secret)


def test_production_accepts_a_real_secret():
    settings = _settings(environment="production", secret_key="x7" * 20)
    assert settings.resolved_secret_key() == b"x7" * 20


def test_a_bad_pack_catalog_is_refused():
    with pytest.raises(ValidationError, match="PACKS"):
        _settings(packs="starter:lots:50")
