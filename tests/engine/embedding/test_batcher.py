"""The embedding batcher packs every client's inputs under a token budget, oldest first, with
peers of similar length; a runner that records its batches stands in for the model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from api.engine.embedding.batcher import BatchLimits, EmbeddingBatcher
from api.engine.errors import EngineDead, EngineOverloaded

pytestmark = pytest.mark.anyio


class Recorder:
    """A model whose vector of a row is [its length, its first token]; it can be held."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        self.gate.wait()
        self.batches.append([len(row) for row in rows])
        return np.array([[len(row), row[0]] for row in rows], dtype=np.float32)


def rows(*lengths: int, first: int = 1) -> list[list[int]]:
    return [[first + index] * length for index, length in enumerate(lengths)]


def waiting(batcher: EmbeddingBatcher, *calls: list[list[int]]) -> None:
    """Queue `calls` without a worker running, as if they arrived while a batch ran."""
    loop = asyncio.get_running_loop()
    for inputs in calls:
        batcher._waiting.extend(
            _item(batcher, loop, inputs, index, tokens) for index, tokens in enumerate(inputs)
        )


def _item(batcher, loop, inputs, index, tokens):  # noqa: ANN001, ANN202
    from api.engine.embedding.batcher import _Call, _Item

    call = _Call(count=len(inputs), future=loop.create_future(), loop=loop, left=len(inputs))
    return _Item(call, index, tokens)


async def test_next_batch_respects_token_budget():
    batcher = EmbeddingBatcher(Recorder(), BatchLimits(batch_tokens=100), name="t")
    waiting(batcher, rows(*[10] * 25))
    sizes = []
    while batch := batcher.next_batch():
        sizes.append(len(batch))
        assert len(batch) * max(len(item.tokens) for item in batch) <= 100
    assert sizes == [10, 10, 5]


async def test_next_batch_groups_inputs_by_length_around_the_oldest():
    batcher = EmbeddingBatcher(Recorder(), BatchLimits(batch_tokens=64), name="t")
    waiting(batcher, rows(16, 2, 30, 3, 15, 2, 16, 14))
    first = [len(item.tokens) for item in batcher.next_batch()]
    assert first == [14, 15, 16, 16]  # the oldest (16) with its nearest peers: no short rows
    second = [len(item.tokens) for item in batcher.next_batch()]
    assert second == [2, 2, 3]  # the oldest left (2) with the short ones; 30 runs later
    assert [len(item.tokens) for item in batcher.next_batch()] == [30]


async def test_an_input_longer_than_the_budget_runs_alone_instead_of_waiting_forever():
    batcher = EmbeddingBatcher(Recorder(), BatchLimits(batch_tokens=50), name="t")
    waiting(batcher, rows(500, 4, 4))
    assert [len(item.tokens) for item in batcher.next_batch()] == [500]
    assert [len(item.tokens) for item in batcher.next_batch()] == [4, 4]


async def test_requests_of_many_clients_share_batches_and_get_their_own_rows():
    recorder = Recorder()
    batcher = EmbeddingBatcher(recorder, BatchLimits(batch_tokens=4096), name="t")
    recorder.gate.clear()  # the first batch is held, so the rest queue behind it
    batcher.start()
    try:
        first = batcher.submit(rows(3))
        while not recorder.batches and batcher._waiting:
            await asyncio.sleep(0)  # the worker took the first request
        calls = [
            batcher.submit(rows(5, 1 + client % 7, first=100 * client)) for client in range(30)
        ]
        recorder.gate.set()
        results = await asyncio.gather(first, *calls)
    finally:
        batcher.stop()
    for client, vectors in enumerate(results[1:]):
        assert vectors.tolist() == [[5, 100 * client], [1 + client % 7, 100 * client + 1]]
    # the held one, then 60 inputs of 30 clients in a few batches of like lengths
    assert 2 < len(recorder.batches) <= 5
    for batch in recorder.batches:  # little of any batch is padding
        assert len(batch) * max(batch) - sum(batch) <= 0.15 * len(batch) * max(batch) + 16
    stats = batcher.stats()
    assert stats.inputs == 61 and stats.queued_inputs == 0


async def test_a_cancelled_request_leaves_its_unrun_inputs_behind():
    recorder = Recorder()
    batcher = EmbeddingBatcher(recorder, BatchLimits(batch_tokens=8), name="t")
    recorder.gate.clear()
    batcher.start()
    try:
        held = batcher.submit(rows(8))
        while batcher._waiting:
            await asyncio.sleep(0)
        gone = batcher.submit(rows(*[8] * 20))
        kept = batcher.submit(rows(2))
        gone.cancel()
        await asyncio.sleep(0)  # its done-callbacks run: the worker sees it gone
        recorder.gate.set()
        await held
        assert (await kept).tolist() == [[2, 1]]
    finally:
        batcher.stop()
    assert recorder.batches == [[8], [2]]


async def test_a_full_queue_is_refused_and_a_stopped_batcher_says_so():
    batcher = EmbeddingBatcher(Recorder(), BatchLimits(max_queued_inputs=4), name="t")
    with pytest.raises(EngineDead):
        batcher.submit(rows(1))  # not started
    recorder = Recorder()
    batcher = EmbeddingBatcher(recorder, BatchLimits(max_queued_inputs=4), name="t")
    recorder.gate.clear()
    batcher.start()
    try:
        batcher.submit(rows(1))
        while batcher._waiting:
            await asyncio.sleep(0)
        pending = batcher.submit(rows(1, 1, 1, 1))
        with pytest.raises(EngineOverloaded):
            batcher.submit(rows(1))
    finally:
        recorder.gate.set()
        batcher.stop()
    with pytest.raises(EngineDead):
        batcher.submit(rows(1))
    # queued before the stop: run, or failed by it; never left waiting
    [outcome] = await asyncio.gather(pending, return_exceptions=True)
    assert isinstance(outcome, EngineDead) or outcome.shape == (4, 2)


async def test_a_model_that_fails_fails_its_requests_not_the_worker():
    calls = 0

    def flaky(rows: Sequence[Sequence[int]]) -> np.ndarray:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("bad batch")
        return np.ones((len(rows), 2), dtype=np.float32)

    batcher = EmbeddingBatcher(flaky, BatchLimits(), name="t")
    batcher.start()
    try:
        with pytest.raises(EngineDead, match="bad batch"):
            await batcher.submit(rows(3))
        assert (await batcher.submit(rows(3))).shape == (1, 2)
    finally:
        batcher.stop()


async def test_next_batch_leaves_out_rows_that_would_be_mostly_padding():
    batcher = EmbeddingBatcher(Recorder(), BatchLimits(batch_tokens=100_000), name="t")
    waiting(batcher, rows(100, 20, 95, 400, 24))
    assert [len(item.tokens) for item in batcher.next_batch()] == [95, 100]
    assert [len(item.tokens) for item in batcher.next_batch()] == [20, 24]
    assert [len(item.tokens) for item in batcher.next_batch()] == [400]
