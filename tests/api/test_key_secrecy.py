"""Keys stay secret: checking one reveals nothing about the stored keys (structure, not timing —
timings are noisy and belong to a bench script), and no key reaches a log line at any level."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import event

from api.logging import configure_logging
from billing import keys
from tests.api.conftest import LiveServer
from tokenshop import cli


@pytest.fixture
def statements(server) -> Iterator[list[str]]:
    """Every SQL statement the server runs while the test looks."""
    seen: list[str] = []

    def record(_conn, _cursor, statement: str, *_args) -> None:
        seen.append(statement)

    event.listen(server.services.db, "before_cursor_execute", record)
    yield seen
    event.remove(server.services.db, "before_cursor_execute", record)


@pytest.fixture
def compares(monkeypatch) -> list[tuple[object, object]]:
    """Calls of hmac.compare_digest made by billing.keys."""
    calls: list[tuple[object, object]] = []
    real = keys.hmac.compare_digest

    def spy(a, b):  # type: ignore[no-untyped-def]
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    return calls


def _ask(server, key: str) -> httpx.Response:
    return httpx.get(f"{server.base_url}/key", headers={"Authorization": f"Bearer {key}"})


def test_a_malformed_key_is_refused_without_any_database_read(server, statements, compares):
    wrong_checksum = "sk-tks-" + "A" * 46
    for key in (wrong_checksum, "sk-proj-" + "A" * 46, "sk-tks-short"):
        assert _ask(server, key).status_code == 401
    assert [s for s in statements if "api_key" in s] == []  # (the sweeper may run meanwhile)
    # only the checksum of the one key shaped like ours was compared, in constant time
    assert compares and all(len(a) == len(b) == keys.CHECKSUM_LENGTH for a, b in compares)


def test_a_well_formed_unknown_key_costs_one_lookup_by_hash(server, statements, compares):
    unknown = keys.derive_key(b"another shop's secret", "salt")
    for _ in range(2):  # failures are not cached: each costs the same single lookup
        assert _ask(server, unknown).status_code == 401
    lookups = [s for s in statements if "api_key" in s]
    assert len(lookups) == 2
    assert all("key_hash" in s.split("WHERE", 1)[1] for s in lookups)
    # checksums only: no stored key matched the hash, so none was there to compare
    assert all(len(a) == keys.CHECKSUM_LENGTH for a, _ in compares)


def test_a_known_key_is_found_by_hash_and_compared_in_constant_time(
    server, api_key, statements, compares
):
    assert _ask(server, api_key).status_code == 200
    lookups = [s.split("WHERE", 1)[1] for s in statements if "FROM api_key" in s]
    by_hash = [where for where in lookups if "key_hash" in where]
    assert len(by_hash) == 1  # found by its hash, once
    # afterwards read only by the id it was found as (/key shows the key's name and usage)
    assert all("api_key.id =" in where for where in lookups if where not in by_hash)
    digest = keys.hash_key(api_key)
    assert (digest, digest) in compares  # the stored hash against the presented one
    assert api_key not in " ".join(statements)


@pytest.fixture
def production_log(database_url, api_settings) -> Iterator[io.StringIO]:
    """The API's own log handler (redacting) at DEBUG, as `tokenshop serve` installs it."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    saved_levels = {
        name: logging.getLogger(name).level
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "sqlalchemy.engine")
    }
    configure_logging(logging.DEBUG)
    logging.getLogger("sqlalchemy.engine").setLevel(logging.DEBUG)  # statements and rows
    stream = io.StringIO()
    root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
    yield stream
    root.handlers[:], _ = saved
    root.setLevel(saved[1])
    for name, level in saved_levels.items():
        logging.getLogger(name).setLevel(level)


def test_no_key_reaches_the_log_at_debug_from_headers_query_strings_or_errors(
    production_log, api_settings, make_funded_key, caplog
):
    key = make_funded_key(10_000)
    with LiveServer(api_settings, log_level="debug", log_config=None) as server:
        auth = {"Authorization": f"Bearer {key}"}
        base = server.base_url
        with caplog.at_level(logging.DEBUG):
            httpx.get(f"{base}/key", headers=auth)
            httpx.get(f"{base}/key?api_key={key}")
            httpx.get(f"{base}/key?api_key={key.replace('-', '%2D')}")  # percent-encoded
            httpx.get(f"{base}/models/{key}")
            httpx.post(
                f"{base}/chat/completions",
                headers=auth,
                json={
                    "model": "demo",
                    "messages": [{"role": "user", "content": key}],
                    "max_tokens": 2,
                },
            )
            httpx.post(
                f"{base}/chat/completions", headers=auth, content=b"{bad json " + key.encode()
            )
            httpx.get(f"{base}/key", headers={"Authorization": f"Bearer {key[:-1]}x"})
    written = production_log.getvalue()
    assert "GET /v1/key" in written  # the access log was on
    secret = key.removeprefix(keys.KEY_PREFIX)
    assert secret not in written
    assert secret[:-1] not in written  # nor the wrong-checksum variant's body
    server_side = [
        r for r in caplog.records if not r.name.startswith(("httpx", "httpcore", "uvicorn.access"))
    ]
    assert not [r.getMessage() for r in server_side if secret[:40] in r.getMessage()]


def test_the_cli_logs_no_key_at_debug(engine, database_url, caplog, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SECRET_KEY", "test-secret-key-for-tokenshop-tests-only-0123456789")
    monkeypatch.setenv("PACKS", "")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("sqlalchemy.engine").setLevel(logging.DEBUG)
        try:
            for args in (
                ["keys", "issue", "--tokens", "100", "--telegram-id", "42"],
                ["keys", "show", "--telegram-id", "42"],
                ["keys", "rotate", "--telegram-id", "42"],
                ["balance", "--telegram-id", "42"],
            ):
                try:
                    cli.main(args)
                except SystemExit as done:
                    assert done.code in (0, None)
        finally:
            logging.getLogger("sqlalchemy.engine").setLevel(logging.NOTSET)
    printed = capsys.readouterr().out
    issued = [line for line in printed.splitlines() if line.startswith(keys.KEY_PREFIX)]
    assert len(issued) == 3 and caplog.records  # keys were printed, and there were log records
    for key in issued:
        assert not [r for r in caplog.records if key[7:47] in r.getMessage()]
