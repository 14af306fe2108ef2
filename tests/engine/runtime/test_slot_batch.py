"""The shared KV buffer takes memory for the rows sequences hold, not for every row it has.

The buffer is `[rows, kv_heads, capacity, head_dim]` per layer and doubles its capacity when a
sequence outgrows it. Its pages are allocated when first written; a row no sequence holds must
stay unwritten, or a server with 16 rows pays for 16 long contexts when one prompt is long.
Residency is read from the kernel (`mincore`), page by page.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from api.engine.runtime.slot_batch import INITIAL_CAPACITY
from tests.engine.conftest import greedy, make_engine, run_steps
from tests.engine.helpers import random_prompt

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_pages(buffer: np.ndarray, row: int) -> tuple[int, int]:
    """(resident, all) of the whole pages inside row `row` of `buffer`."""
    page = mmap.PAGESIZE
    row_bytes = buffer[row].nbytes
    start = buffer.ctypes.data + row * row_bytes
    first = -(-start // page) * page
    last = (start + row_bytes) // page * page
    pages = max(0, (last - first) // page)
    if not pages:
        return 0, 0
    vector = (ctypes.c_ubyte * pages)()
    assert _libc.mincore(first, last - first, vector) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vector), pages


def test_a_long_prompt_grows_the_buffer_without_touching_rows_nobody_holds(tiny_exports) -> None:
    export = tiny_exports["llama"]
    engine = make_engine(export.path, max_prefill_tokens=64)
    # Three short sequences, finished, leave their rows free with their lengths behind.
    short = {0: [greedy(f"s{i}", random_prompt(export, 20, i), 4) for i in range(3)]}
    run_steps(engine, short)
    batch = engine.scheduler._batch
    before = batch.capacity
    long = {0: [greedy("long", random_prompt(export, INITIAL_CAPACITY + 40, 9), 2)]}
    run_steps(engine, long)
    assert batch.capacity > before  # the long prompt made it grow
    held = [r for r, length in enumerate(batch._lengths) if length > INITIAL_CAPACITY]
    assert len(held) == 1
    for buffer in batch._buffers:
        got, pages = resident_pages(buffer, held[0])
        assert got > 0  # the row written is there (up to its length: not all its pages)
        for row in range(len(batch._lengths)):
            if row != held[0]:
                got, pages = resident_pages(buffer, row)
                assert got == 0, f"row {row}: {got} of {pages} pages resident"


def test_a_short_conversation_holds_pages_for_its_tokens_not_its_rows_capacity(
    tiny_exports,
) -> None:
    """64 rows at twice the initial capacity make each layer's buffer a few MB, room for 2 MB
    pages; a short sequence beside a long one must hold only the small pages its tokens are on,
    not the pages of the rows around it."""
    export = tiny_exports["llama"]
    engine = make_engine(export.path, max_prefill_tokens=64, max_active_sequences=64)
    long = greedy("long", random_prompt(export, INITIAL_CAPACITY + 40, 9), 2)
    run_steps(engine, {0: [greedy("short", random_prompt(export, 20, 1), 24)], 1: [long]})
    batch = engine.scheduler._batch
    assert batch._buffers[0].nbytes >= 4 << 20  # the long prompt made it grow
    [row] = [r for r, length in enumerate(batch._lengths) if 20 < length < 60]
    heads, _, head_dim = batch._buffers[0].shape[1:]
    per_head = -(-int(batch._lengths[row]) * head_dim * batch._buffers[0].itemsize // mmap.PAGESIZE)
    for buffer in batch._buffers:
        got, pages = resident_pages(buffer, row)
        assert 0 < got <= heads * (per_head + 1) < pages, f"{got} of {pages} pages resident"
