"""One loop owns the embedding batch: every client's inputs, packed under a token budget.

Inputs wait in arrival order. Each step the worker takes the oldest waiting input and fills its
batch with the inputs nearest to it in length among the next few thousand, so no input waits
behind ones that came later. A batch costs its row count times its longest row (padding
included); it stops growing at the token budget, or where the next row would make more than
`max_padding` of it padding (a CPU gains little from wider batches and pays for every padded
token, attention's quadratically); an input longer than the whole budget runs alone rather than
waiting forever. The model runs on this thread, never on the event loop, and ONNX Runtime lets go
of the GIL while it runs, so chat streams go on beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from api.engine.embedding.protocol import EmbeddingStats
from api.engine.errors import EngineDead, EngineOverloaded

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[Sequence[int]]], np.ndarray]


@dataclass(frozen=True)
class BatchLimits:
    # rows x longest row of one batch (an input past it runs alone). Small batches run faster
    # a token on a CPU: a batch's activations and attention scores stay in cache. bge-small on
    # 2 cores, 128 texts of 16-512 tokens: 2,500 tok/s at 16,384, 3,300 at 1,024 (float32);
    # 4,500 and 6,300 (int8): bench/results/2026-11-28-embeddings-batching-2cpu-f2e450a.md
    batch_tokens: int = 1024
    max_batch_inputs: int = 256  # rows of one batch
    max_queued_inputs: int = 65536  # inputs waiting; more raise EngineOverloaded
    window_inputs: int = 4096  # how far past the oldest input a batch looks for its peers
    max_padding: float = 0.05  # of a batch's tokens, beyond `padding_slack` tokens
    padding_slack: int = 8


@dataclass(eq=False)
class _Call:
    """One `embed` call: its rows fill `vectors` as batches finish."""

    count: int
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    vectors: np.ndarray | None = None
    left: int = 0
    cancelled: bool = False


@dataclass(eq=False)
class _Item:
    call: _Call
    index: int
    tokens: Sequence[int]


@dataclass
class _Counters:
    batches: int = 0
    inputs: int = 0
    tokens: int = 0
    padded_tokens: int = 0


class EmbeddingBatcher:
    def __init__(self, run: Runner, limits: BatchLimits, *, name: str) -> None:
        self._run = run
        self.limits = limits
        self.name = name
        self._waiting: deque[_Item] = deque()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None
        self._counters = _Counters()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._error is None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"embed-{self.name}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._fail_waiting(EngineDead(f"the embedding engine of {self.name} stopped"))

    def submit(self, inputs: Sequence[Sequence[int]]) -> asyncio.Future[np.ndarray]:
        """Queue `inputs`; the future gets their vectors in order. Cancelling the future drops
        the inputs not yet run."""
        loop = asyncio.get_running_loop()
        call = _Call(count=len(inputs), future=loop.create_future(), loop=loop, left=len(inputs))
        call.future.add_done_callback(lambda future: _mark_cancelled(call, future))
        with self._lock:
            if not self.alive or self._stopping:
                raise EngineDead(self._error_message())
            if len(self._waiting) + len(inputs) > self.limits.max_queued_inputs:
                raise EngineOverloaded(f"{len(self._waiting)} inputs are waiting")
            self._waiting.extend(_Item(call, index, tokens) for index, tokens in enumerate(inputs))
            self._lock.notify()
        return call.future

    def stats(self) -> EmbeddingStats:
        counters = self._counters
        return EmbeddingStats(
            queued_inputs=len(self._waiting),
            batches=counters.batches,
            inputs=counters.inputs,
            tokens=counters.tokens,
            padded_tokens=counters.padded_tokens,
        )

    def next_batch(self) -> list[_Item]:
        """Take the next batch from the waiting inputs (the caller holds the lock)."""
        waiting = self._waiting
        window: list[_Item] = []
        while waiting and len(window) < self.limits.window_inputs:
            item = waiting.popleft()
            if not item.call.cancelled:
                window.append(item)
        if not window:
            return []
        anchor = window[0]
        ordered = sorted(range(len(window)), key=lambda i: len(window[i].tokens))
        at = ordered.index(0)
        most = self.limits.max_batch_inputs
        chosen = {0}
        size = longest = real = len(anchor.tokens)
        below, above = at - 1, at + 1
        # grow toward whichever neighbour is nearer in length, while the batch fits
        while len(chosen) < most:
            rows = len(chosen) + 1
            down = len(window[ordered[below]].tokens) if below >= 0 else -1
            up = len(window[ordered[above]].tokens) if above < len(ordered) else -1
            fits_down = down >= 0 and self._fits(rows, longest, real + down)
            fits_up = up >= 0 and self._fits(rows, max(longest, up), real + up)
            if fits_up and (not fits_down or up - size <= size - down):
                chosen.add(ordered[above])
                longest, real = max(longest, up), real + up
                above += 1
            elif fits_down:
                chosen.add(ordered[below])
                real += down
                below -= 1
            else:
                break
        batch = [window[i] for i in sorted(chosen, key=lambda i: len(window[i].tokens))]
        rest = [item for i, item in enumerate(window) if i not in chosen]
        waiting.extendleft(reversed(rest))
        return batch

    def _fits(self, rows: int, width: int, real: int) -> bool:
        """Whether `rows` rows `width` wide holding `real` tokens make an acceptable batch."""
        padded = rows * width
        limits = self.limits
        allowed = limits.max_padding * padded + limits.padding_slack
        return padded <= limits.batch_tokens and padded - real <= allowed

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._waiting and not self._stopping:
                        self._lock.wait()
                    if self._stopping:
                        return
                    batch = self.next_batch()
                if batch:
                    self._step(batch)
        except BaseException as exc:  # a broken model: fail everything, say so on /ready
            log.exception("embedding worker of %s died", self.name)
            self._error = exc
            self._fail_waiting(EngineDead(self._error_message()))

    def _step(self, batch: list[_Item]) -> None:
        try:
            vectors = self._run([item.tokens for item in batch])
        except Exception as exc:
            log.exception("embedding batch of %s failed", self.name)
            for call in {item.call for item in batch}:
                _deliver_error(call, EngineDead(f"the embedding model failed: {exc}"))
                call.cancelled = True
            return
        counters = self._counters
        counters.batches += 1
        counters.inputs += len(batch)
        counters.tokens += sum(len(item.tokens) for item in batch)
        counters.padded_tokens += len(batch) * max(len(item.tokens) for item in batch)
        for row, item in enumerate(batch):
            call = item.call
            if call.cancelled:
                continue
            if call.vectors is None:
                call.vectors = np.empty((call.count, vectors.shape[1]), dtype=np.float32)
            call.vectors[item.index] = vectors[row]
            call.left -= 1
            if call.left == 0:
                call.loop.call_soon_threadsafe(_resolve, call.future, call.vectors)

    def _fail_waiting(self, error: BaseException) -> None:
        with self._lock:
            items, self._waiting = list(self._waiting), deque()
        for call in {item.call for item in items}:
            _deliver_error(call, error)

    def _error_message(self) -> str:
        if self._error is not None:
            return f"the embedding engine of {self.name} stopped: {self._error}"
        return f"the embedding engine of {self.name} is not running"


def _mark_cancelled(call: _Call, future: asyncio.Future[np.ndarray]) -> None:
    if future.cancelled():
        call.cancelled = True


def _resolve(future: asyncio.Future[np.ndarray], vectors: np.ndarray) -> None:
    if not future.done():
        future.set_result(vectors)


def _reject(future: asyncio.Future[np.ndarray], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _deliver_error(call: _Call, error: BaseException) -> None:
    with contextlib.suppress(RuntimeError):  # its loop is closed: nobody is waiting
        call.loop.call_soon_threadsafe(_reject, call.future, error)
