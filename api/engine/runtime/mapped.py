"""Arrays on anonymous mappings of their own: their pages are allocated when first written and
leave the process with the array. The KV buffer (`slot_batch.py`) grows into such arrays without
writing rows nobody holds; the prefix cache (`prefix_cache.py`) keeps its large entries in them,
so an evicted entry's pages are given back.
"""

from __future__ import annotations

import math
import mmap

import numpy as np


def unwritten(shape: tuple[int, ...], dtype: np.typing.DTypeLike) -> np.ndarray:
    """A zeroed array on an anonymous mapping of its own (OSError where the kernel refuses
    one). `np.zeros` gives no such promise: a size malloc serves from its heap is zeroed by
    writing every page, and stays with the process when freed.

    On the kernel's small pages, not 2 MB ones: a KV buffer row's keys for one head run
    `capacity x head_dim` long, so a 2 MB page spans whole rows of a small model's buffer (8 of
    them on the Qwen2.5-0.5B shape at capacity 1,024) and the first token written made all of
    it resident. Serving that shape, the server held 275 MB more with huge pages after the same
    streams (1,187 MB against 907-912) and decoded no faster, 66-67 tok/s either way at 1,900
    tokens of context (bench/results/2026-11-27-kv-pages-amx-xeon.md)."""
    count = math.prod(shape)
    size = count * np.dtype(dtype).itemsize
    area = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(area, dtype, count=count).reshape(shape)
