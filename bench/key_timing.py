"""How long `billing.keys.authenticate` takes for each kind of key (issue 7, keys and payments).

    .venv/bin/python bench/key_timing.py [--keys 1000] [--tries 2000]

A table of median and p90 times for a malformed key, a key with a wrong checksum, a
well-formed key nobody holds, a key one character away from a stored one, and a stored key,
against a fresh SQLite database holding `--keys` keys.

What it is for: the times fall into two groups, and the groups are the code paths, not the
stored keys. A key whose checksum fails is refused before any database read (fast); every key
that passes the checksum costs one indexed lookup by its SHA-256, so an unknown key and a key
differing from a stored one in one character take the same time: the lookup compares hashes,
and a hash reveals nothing about how close the key was. A stored key takes a little longer (its
row is read and checked for revocation), which tells nothing to someone who does not already
hold it. tests/api/test_key_secrecy.py asserts
the paths themselves (no query, one lookup by hash, constant-time compares); timings are too
noisy for a test and belong here.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlmodel import Session, SQLModel  # noqa: E402

import billing.models  # noqa: E402, F401  (registers the tables)
from billing import accounts, keys  # noqa: E402
from billing.db import make_engine, reading  # noqa: E402
from billing.errors import InvalidKey  # noqa: E402

SECRET = b"bench-secret-key-for-tokenshop-key-timing-0123456789"


def _flip(key: str, position: int) -> str:
    """The key with one secret character changed and its checksum recomputed: well formed."""
    body = key.removeprefix(keys.KEY_PREFIX)[: keys.SECRET_LENGTH]
    changed = body[:position] + ("A" if body[position] != "A" else "B") + body[position + 1 :]
    return f"{keys.KEY_PREFIX}{changed}{keys._checksum(changed)}"


def _time(check: Callable[[], object], tries: int) -> list[float]:
    samples = []
    for _ in range(tries):
        started = time.perf_counter_ns()
        with contextlib.suppress(InvalidKey):
            check()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--tries", type=int, default=2000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tokenshop-keys-") as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'keys.db'}")
        SQLModel.metadata.create_all(engine)
        with Session(engine) as session:
            stored = []
            for _ in range(args.keys):
                account = accounts.create_account(session=session)
                assert account.id is not None
                stored.append(
                    keys.ensure_key(session=session, account_id=account.id, secret_key=SECRET)[0]
                )
            session.commit()
        known = stored[len(stored) // 2]
        cases = {
            "malformed (another vendor's)": "sk-proj-" + "A" * 46,
            "wrong checksum": known[:-1] + ("A" if known[-1] != "A" else "B"),
            "well formed, unknown": keys.derive_key(b"another shop", "salt"),
            "one character from a stored key": _flip(known, 0),
            "stored key": known,
        }
        with Session(reading(engine)) as session:
            rows = []
            for name, key in cases.items():

                def check(key: str = key) -> object:
                    return keys.authenticate(session=session, key=key)

                _time(check, 50)  # warm up
                samples = _time(check, args.tries)
                p90 = statistics.quantiles(samples, n=10)[-1]
                rows.append((name, statistics.median(samples), p90))
        engine.dispose()

    print(f"billing.keys.authenticate, {args.keys} stored keys, {args.tries} tries each (µs)")
    print("| key | median | p90 |\n|---|---:|---:|")
    for name, median, p90 in rows:
        print(f"| {name} | {median:.1f} | {p90:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
