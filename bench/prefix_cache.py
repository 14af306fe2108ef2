"""The prefix cache's lookup and store as it fills: a row per entry count, one scope.

    .venv/bin/python bench/prefix_cache.py [--entries 100,1000,10000]

Conversations of one account share a 20-token head (a chat template's, or an app's system
prompt) and go on with 80 tokens of their own, as in `bench/compare.py`; each is looked up,
then stored, with keys/values of Qwen2.5-0.5B's size (24.6 KB a token) and of the demo model's
size (512 bytes), in the API's default budget of 256 MB (which holds about a hundred of the
first, thousands of the second). Prints the entries kept and the median time of the last 500
lookups and stores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api.engine.runtime.prefix_cache import PrefixCache  # noqa: E402

HEAD = list(range(20))
SIZES = {"Qwen2.5-0.5B (24.6 KB a token)": 24_576, "demo model (512 B a token)": 512}


def fill(entries: int, bytes_per_token: int) -> tuple[float, float, int]:
    rng = np.random.default_rng(0)
    cache = PrefixCache(max_bytes=256 << 20)  # the API's default budget
    lookups, stores = [], []
    for _ in range(entries):
        prompt = HEAD + rng.integers(1000, 100_000, 80).tolist()
        kv = [np.ones((bytes_per_token // 8, len(prompt)), np.float32)] * 2
        started = time.perf_counter()
        cache.lookup("account", prompt)
        lookups.append(time.perf_counter() - started)
        started = time.perf_counter()
        cache.store("account", prompt, kv)
        stores.append(time.perf_counter() - started)
    return statistics.median(lookups[-500:]), statistics.median(stores[-500:]), len(cache)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default="100,1000,10000")
    args = parser.parse_args()
    print("| keys/values | conversations | entries kept | lookup ms | store ms |")
    print("|---|---:|---:|---:|---:|")
    for label, size in SIZES.items():
        for entries in (int(n) for n in args.entries.split(",")):
            lookup, store, kept = fill(entries, size)
            print(f"| {label} | {entries} | {kept} | {lookup * 1e3:.3f} | {store * 1e3:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
