"""The batching loop: one thread per model owns the batch (TGI's `batching_task`, vLLM's core).

Each iteration: take aborts and newly queued requests under a lock; drop aborted sequences; spend
at most `max_prefill_tokens` prompt tokens on prefill (`prefill.py`: short prompts whole and
batched, a long one in chunks over several iterations), sampling a request's first token when its
prompt is complete and joining its cache to the batch; run ONE batched decode call that adds a
token to every active sequence; sample all rows at once; hand each request its delta; filter out
finished sequences. ONNX Runtime releases the
GIL while it runs, so the asyncio loop stays responsive; results cross to it with
`loop.call_soon_threadsafe`, once per loop per step, so the event loop never waits on this thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

from api.engine.batch import KVCache
from api.engine.errors import EngineDead, EngineOverloaded
from api.engine.model import OnnxCausalLM
from api.engine.prefill import Prefill, PrefillCall, plan_prefill
from api.engine.protocol import GenerationOutput
from api.engine.sampling import sample
from api.engine.sequence import Sequence

log = logging.getLogger(__name__)

END = None  # put on a request's queue when it was aborted: its iterator just ends

Delivery = GenerationOutput | BaseException | None


@dataclass(frozen=True)
class SchedulerLimits:
    max_active_sequences: int = 16
    max_queued: int = 64
    # Prompt tokens prefilled per iteration (a longer prompt is prefilled in chunks of this size),
    # so a long prompt delays each token of the running streams by a bounded amount.
    max_prefill_tokens: int = 256


class Scheduler:
    """Admits, steps and filters the batch of one model, in its own thread."""

    def __init__(self, model: OnnxCausalLM, limits: SchedulerLimits, *, name: str) -> None:
        self.model = model
        self.limits = limits
        self.name = name
        self._cond = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._aborted: set[str] = set()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._active: list[Sequence] = []
        self._prefilling: list[Prefill] = []
        self._cache: KVCache | None = None
        self.error: BaseException | None = None
        self.steps = 0
        self.last_batch_size = 0
        self._batched_decode = model.spec.has_position_ids and model.spec.has_attention_mask

    # ---- called from the event loop -------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        else:
            self._fail_pending()  # never started: nothing else will answer the queue

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, sequence: Sequence) -> None:
        with self._cond:
            if self._stopping or self.error is not None:
                raise EngineDead(self._dead_message())
            if len(self._waiting) >= self.limits.max_queued:
                raise EngineOverloaded(
                    f"{self.limits.max_queued} requests are already waiting for model {self.name}"
                )
            self._waiting.append(sequence)
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        """Thread-safe; the sequence leaves at the start of the next iteration."""
        with self._cond:
            self._aborted.add(request_id)
            self._cond.notify()

    def counts(self) -> tuple[int, int]:
        """(admitted: prefilling or decoding, still queued)."""
        with self._cond:
            return len(self._active) + len(self._prefilling), len(self._waiting)

    def _dead_message(self) -> str:
        if self.error is not None:
            return f"engine for {self.name} crashed: {self.error!r}"
        return f"engine for {self.name} is not running"

    # ---- the loop thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self.step()
        except BaseException as exc:  # noqa: BLE001 - any crash must reach every waiting client
            log.exception("engine %s crashed", self.name)
            self.error = exc
        finally:
            self._fail_pending()

    def _fail_pending(self) -> None:
        """End every queued and running request with `EngineDead`."""
        with self._cond:
            self._stopping = True
            pending = list(self._waiting) + [p.seq for p in self._prefilling] + self._active
            self._waiting.clear()
            self._prefilling = []
            self._active = []
        self._cache = None
        self._deliver([(s, EngineDead(self._dead_message())) for s in pending])

    def _wait_for_work(self) -> bool:
        with self._cond:
            while not (
                self._stopping or self._waiting or self._prefilling or self._active or self._aborted
            ):
                self._cond.wait()
            return not self._stopping

    def step(self) -> None:
        """One iteration: aborts, admissions, prefill within the token budget, one decode step,
        filtering.

        The loop thread calls it whenever there is work; tests call it directly to place joins
        at exact steps.
        """
        with self._cond:
            aborted, self._aborted = self._aborted, set()
            deliveries: list[tuple[Sequence, Delivery]] = []
            if aborted:
                for seq in [s for s in self._waiting if s.request_id in aborted]:
                    self._waiting.remove(seq)
                    deliveries.append((seq, END))
                for item in [p for p in self._prefilling if p.seq.request_id in aborted]:
                    self._prefilling.remove(item)
                    deliveries.append((item.seq, END))
            self._prefilling.extend(Prefill(seq) for seq in self._admit())
        for seq in self._active:
            if seq.request_id in aborted:
                seq.aborted = True
                deliveries.append((seq, END))
        self._filter()

        deliveries.extend(self._run_prefills())
        self._deliver(deliveries)
        deliveries = []

        if self._active:
            for seq, output in self._decode():
                deliveries.append((seq, output))
            self._filter()
        self._deliver(deliveries)

    def _admit(self) -> list[Sequence]:
        """Pop queued requests while there is room in the batch (caller holds the lock)."""
        room = self.limits.max_active_sequences - len(self._active) - len(self._prefilling)
        return [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]

    def _run_prefills(self) -> list[tuple[Sequence, Delivery]]:
        """This iteration's prefill calls; completed prompts get their first token and join."""
        deliveries: list[tuple[Sequence, Delivery]] = []
        joining = [self._cache] if self._cache is not None else []
        calls = plan_prefill(
            self._prefilling, self.limits.max_prefill_tokens, pad=self._batched_decode
        )
        for call in calls:
            if not call.completes:
                self._forward_chunk(call.group[0], call.tokens)
                continue
            group = [p.seq for p in call.group]
            cache, outputs = self._prefill(call)
            with self._cond:
                for item in call.group:
                    self._prefilling.remove(item)
            deliveries.extend(zip(group, outputs, strict=True))
            keep = [i for i, seq in enumerate(group) if not seq.finished]
            if keep:
                self._active.extend(group[i] for i in keep)
                joining.append(cache.filter(keep) if len(keep) < len(group) else cache)
        if joining:
            self._cache = KVCache.concat(joining)
        return deliveries

    def _forward_chunk(self, item: Prefill, tokens: int) -> np.ndarray:
        """Run the next `tokens` prompt tokens of `item` on top of the KV cache of the ones before;
        return the last position's logits."""
        end = item.done + tokens
        ids = np.array([item.seq.request.prompt_token_ids[item.done : end]], np.int64)
        mask = np.ones((1, end), np.int64)
        positions = np.arange(item.done, end, dtype=np.int64)[None]
        past = item.cache.past if item.cache is not None else self.model.empty_past(1)
        logits, presents = self.model.forward(ids, mask, positions, past)
        item.cache = KVCache.from_prefill(presents, end)
        item.done = end
        return logits

    def _prefill(self, call: PrefillCall) -> tuple[KVCache, list[GenerationOutput]]:
        """Complete the prompts of `call`, in one graph call; each gets its first token."""
        group = [p.seq for p in call.group]
        if call.group[0].done:  # the last chunk of a prompt prefilled in chunks
            logits = self._forward_chunk(call.group[0], call.tokens)
            cache = call.group[0].cache
            assert cache is not None
        else:
            logits, cache = self._prefill_whole(group)
        choices = sample(logits, [s.sampler for s in group])
        return cache, [s.append(c) for s, c in zip(group, choices, strict=True)]

    def _prefill_whole(self, group: list[Sequence]) -> tuple[np.ndarray, KVCache]:
        """Prompts of `group` from scratch, left-padded to the longest, in one graph call."""
        lengths = np.array([s.prompt_len for s in group], np.int64)
        width = int(lengths.max())
        ids = np.zeros((len(group), width), np.int64)
        mask = np.zeros((len(group), width), np.int64)
        positions = np.zeros((len(group), width), np.int64)
        for row, seq in enumerate(group):
            start = width - seq.prompt_len
            ids[row, start:] = seq.request.prompt_token_ids
            mask[row, start:] = 1
            positions[row, start:] = np.arange(seq.prompt_len)
        logits, presents = self.model.forward(
            ids, mask, positions, self.model.empty_past(len(group))
        )
        for row, length in enumerate(lengths.tolist()):
            if length < width:  # padding rows attended to nothing: keep no NaN or garbage around
                for array in presents:
                    array[row, :, : width - length, :] = 0
        return logits, KVCache(past=presents, mask=mask, lengths=lengths)

    def _decode(self) -> list[tuple[Sequence, GenerationOutput]]:
        """One decode step for every active sequence, in one graph call when the graph allows."""
        assert self._cache is not None
        if self._batched_decode or len(set(self._cache.lengths.tolist())) == 1:
            logits = self._step(self._cache, self._active)
        else:
            # The graph derives positions from the cache width (no position_ids) or cannot mask
            # padding: decode each group of equal-length rows unpadded, then rejoin.
            groups: dict[int, list[int]] = defaultdict(list)
            for row, length in enumerate(self._cache.lengths.tolist()):
                groups[length].append(row)
            caches, parts, order = [], [], []
            for rows in groups.values():
                sub = self._cache.filter(rows)
                parts.append(self._step(sub, [self._active[r] for r in rows]))
                caches.append(sub)
                order.extend(rows)
            self._cache = KVCache.concat(caches)
            self._active = [self._active[r] for r in order]
            logits = np.concatenate(parts, axis=0)
        self.steps += 1
        self.last_batch_size = len(self._active)
        choices = sample(logits, [s.sampler for s in self._active])
        return [(s, s.append(c)) for s, c in zip(self._active, choices, strict=True)]

    def _step(self, cache: KVCache, seqs: list[Sequence]) -> np.ndarray:
        mask, positions = cache.step_inputs()
        ids = np.array([[s.last_token] for s in seqs], dtype=np.int64)
        logits, presents = self.model.forward(ids, mask, positions, cache.past)
        cache.advance(presents, mask)
        return logits

    def _filter(self) -> None:
        keep = [i for i, s in enumerate(self._active) if not (s.finished or s.aborted)]
        if len(keep) == len(self._active):
            return
        self._cache = self._cache.filter(keep) if keep and self._cache is not None else None
        with self._cond:
            self._active = [self._active[i] for i in keep]

    @staticmethod
    def _deliver(deliveries: list[tuple[Sequence, Delivery]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delivery]]] = (
            defaultdict(list)
        )
        for seq, item in deliveries:
            by_loop[seq.loop].append((seq.queue, item))
        for loop, items in by_loop.items():
            # A closed loop means nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[asyncio.Queue, Delivery]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
