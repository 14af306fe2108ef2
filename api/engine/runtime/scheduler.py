"""The batching loop: one thread per model owns the batch (TGI's `batching_task`, vLLM's core).

Each iteration: take aborts under a lock; drop aborted sequences; from an idle batch, wait a
moment for requests the API said are on their way (`expect`); admit queued requests, each
starting from the longest computed prefix its scope left behind (`prefix_cache.py`); spend at
most `max_prefill_tokens` prompt tokens on prefill (`prefill.py`: short prompts whole and
batched, a long one in chunks over several iterations), admitting requests that arrive meanwhile
while the budget lasts, sampling a request's first token when its prompt is complete and joining
its cache to the batch; run ONE batched decode call that adds a
token to every active sequence (or, where drafts from prompt lookup pay, one call that verifies
them: `speculation.py`); sample all rows at once; hand each request its delta; filter out
finished sequences, keeping their keys/values for a next turn. ONNX Runtime releases the
GIL while it runs, so the asyncio loop stays responsive; results cross to it with
`loop.call_soon_threadsafe`, once per loop per step, so the event loop never waits on this thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from api.engine.errors import EngineDead, EngineOverloaded
from api.engine.model.causal_lm import OnnxCausalLM
from api.engine.protocol import GenerationOutput
from api.engine.runtime.padded_batch import PaddedBatch
from api.engine.runtime.prefill import Prefill, plan_prefill
from api.engine.runtime.prefix_cache import PrefixCache
from api.engine.runtime.sampling import sample
from api.engine.runtime.sequence import Sequence
from api.engine.runtime.slot_batch import SlotBatch
from api.engine.runtime.speculation import Drafting, PromptLookup, Speculator

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
    # Keys/values of finished sequences kept for prompts that start the same way; 0: none.
    prefix_cache_bytes: int = 256 << 20
    # How long an idle batch may wait for requests said to be on their way (`expect`) before
    # prefilling what has arrived; 0: never waits.
    arrival_wait_seconds: float = 0.05
    # Most drafted tokens one decode step verifies per sequence (prompt-lookup speculative
    # decoding, `speculation.py`); 0: none. Drafts are used only where they pay.
    speculative_tokens: int = 4


class Scheduler:
    """Admits, steps and filters the batch of one model, in its own thread."""

    def __init__(self, model: OnnxCausalLM, limits: SchedulerLimits, *, name: str) -> None:
        self.model = model
        self.limits = limits
        self.name = name
        self._cond = threading.Condition()
        self._waiting: deque[Sequence] = deque()
        self._aborted: set[str] = set()
        self._expected = 0  # requests on their way: `expect` called, not yet arrived
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._prefilling: list[Prefill] = []
        self._batch: PaddedBatch | SlotBatch = (
            SlotBatch(model, limits.max_active_sequences, max_drafts=limits.speculative_tokens)
            if model.spec.shared_kv
            else PaddedBatch(model)
        )
        drafts = self._batch.max_drafts if isinstance(self._batch, SlotBatch) else 0
        self.speculator = Speculator(drafts) if drafts else None
        cache_bytes = limits.prefix_cache_bytes
        self._prefixes = PrefixCache(cache_bytes) if cache_bytes else None
        self.error: BaseException | None = None
        self.steps = 0
        self.last_batch_size = 0

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

    def expect(self) -> Callable[[], None]:
        """Count a request that is on its way (validated, its hold being placed); the returned
        call says it was submitted or will not come, and does nothing when called again."""
        with self._cond:
            self._expected += 1
        done = False

        def arrived() -> None:
            nonlocal done
            if not done:
                done = True
                with self._cond:
                    self._expected -= 1
                    self._cond.notify()

        return arrived

    def abort(self, request_id: str) -> None:
        """Thread-safe; the sequence leaves at the start of the next iteration."""
        with self._cond:
            self._aborted.add(request_id)
            self._cond.notify()

    def counts(self) -> tuple[int, int]:
        """(admitted: prefilling or decoding, still queued). A sequence whose last token went
        out is not counted while `step` copies its keys/values before dropping it."""
        with self._cond:
            leaving = sum(1 for s in self._batch.seqs if s.finished or s.aborted)
            admitted = len(self._batch.seqs) - leaving + len(self._prefilling)
            return admitted, len(self._waiting)

    @property
    def expected(self) -> int:
        """Requests said to be on their way (`expect`) that have not arrived yet."""
        with self._cond:
            return self._expected

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
            pending = list(self._waiting) + [p.seq for p in self._prefilling] + self._batch.seqs
            self._waiting.clear()
            self._prefilling = []
            self._batch.clear()
        self._deliver([(s, EngineDead(self._dead_message())) for s in pending])

    def _wait_for_work(self) -> bool:
        with self._cond:
            while not (
                self._stopping
                or self._waiting
                or self._prefilling
                or self._batch.seqs
                or self._aborted
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
                    self._batch.discard(item)
                    deliveries.append((item.seq, END))
        for seq in self._batch.seqs:
            if seq.request_id in aborted:
                seq.aborted = True
                deliveries.append((seq, END))
        self._filter()

        self._deliver(deliveries)
        self._prefill_within_budget()
        if self._batch.seqs:
            # Tokens go out before the finished sequences' keys/values are copied into the
            # prefix cache, so streams ending together do not wait for the copies
            # (bench/results/2026-11-26-kernel-notes.md). A next turn still finds them, since it is
            # admitted by a later step of this thread.
            self._deliver(self._decode())
            self._filter()

    def _admit(self) -> list[Sequence]:
        """Pop queued requests while there is room in the batch (caller holds the lock)."""
        room = self.limits.max_active_sequences - len(self._batch.seqs) - len(self._prefilling)
        return [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]

    def _reuse_prefix(self, item: Prefill) -> None:
        """Start a new prompt from the longest computed prefix its scope has left, if any."""
        scope = item.seq.request.cache_scope
        if self._prefixes is None or scope is None:
            return
        hit = self._prefixes.lookup(scope, item.seq.request.prompt_token_ids)
        if hit is not None:
            self._batch.seed(item, hit)
            item.seq.cached_tokens = hit.tokens

    def _keep_prefixes(self) -> None:
        """Store what each leaving sequence computed, for a next turn of its conversation
        (it covers, and so replaces, the entry its prompt left)."""
        if self._prefixes is None:
            return
        for seq in self._batch.seqs:
            scope = seq.request.cache_scope
            if (seq.finished or seq.aborted) and scope is not None:
                kv = self._batch.kv_of(seq)
                self._prefixes.store(scope, seq.fed_ids(kv[0].shape[1]), kv)

    def _keep_prompts(self, items: list[Prefill]) -> None:
        """Store prompts as soon as they are complete: requests that arrive while these decode
        (an app's shared system prompt, say) need not wait for them to finish."""
        if self._prefixes is None:
            return
        for item in items:
            scope = item.seq.request.cache_scope
            if scope is not None:
                prompt = item.seq.request.prompt_token_ids
                self._prefixes.store(scope, prompt, self._batch.prefilled_kv(item))

    def _prefill_within_budget(self) -> None:
        """Spend this iteration's prompt-token budget, admitting requests that arrived while
        it was being spent, before the decode step.

        Requests that clients send together reach the engine a few ms apart (each places its
        hold first), so the first of a burst is often prefilled alone. Without the second look,
        the rest waited for a decode step of the first, and then finished a step after it: an
        extra decode step at each end of a burst (bench/results/2026-11-26-kernel-notes.md).
        The budget still bounds how long running streams wait for their next token."""
        budget = self.limits.max_prefill_tokens
        self._wait_for_expected()
        self._admit_arrivals()
        while True:
            deliveries, spent = self._run_prefills(budget)
            self._deliver(deliveries)  # first tokens go out before the next prompts run
            budget -= spent
            if budget <= 0 or not self._admit_arrivals():
                return

    def _wait_for_expected(self) -> None:
        """From an idle batch, give requests on their way up to `arrival_wait_seconds` to arrive
        before prefilling.

        Over HTTP a burst's requests reach the engine as their holds commit, a few ms apart
        (database group commits). Without this, the first was prefilled alone while the rest
        waited for that call, where the direct engine prefilled all 8 in one
        (bench/results/2026-11-26-kernel-notes.md). Running streams never wait for it, and a lone
        request has nothing to wait for."""
        if self._batch.seqs or self._prefilling:
            return
        deadline = time.monotonic() + self.limits.arrival_wait_seconds
        with self._cond:
            while (
                self._expected
                and self._waiting
                and len(self._waiting) < self.limits.max_active_sequences
                and not self._stopping
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _admit_arrivals(self) -> bool:
        """Admit queued requests while there is room, each from its longest cached prefix;
        whether any was. (One aborted meanwhile leaves at the next iteration's start.)"""
        with self._cond:
            admitted = [Prefill(seq) for seq in self._admit()]
            self._prefilling.extend(admitted)
        for item in admitted:
            self._reuse_prefix(item)
        return bool(admitted)

    def _run_prefills(self, budget: int) -> tuple[list[tuple[Sequence, Delivery]], int]:
        """Prefill calls within `budget` prompt tokens; completed prompts get their first token
        and join. Returns the deliveries and the tokens spent (padding included)."""
        deliveries: list[tuple[Sequence, Delivery]] = []
        calls = plan_prefill(self._prefilling, budget, grouping=self._batch.grouping)
        for call in calls:
            completes = call.completes  # read before the call advances the prompts
            logits = self._batch.prefill(call)
            if not completes:
                continue
            group = [p.seq for p in call.group]
            choices = sample(logits, [s.sampler for s in group])
            deliveries.extend((s, s.append(c)) for s, c in zip(group, choices, strict=True))
            self._keep_prompts(call.group)
            with self._cond:
                for item in call.group:
                    self._prefilling.remove(item)
            for item in call.group:
                if item.seq.finished:
                    self._batch.discard(item)
            self._batch.join([item for item in call.group if not item.seq.finished])
        return deliveries, sum(call.tokens * len(call.group) for call in calls)

    def _decode(self) -> list[tuple[Sequence, GenerationOutput]]:
        """One decode step for every active sequence: a token each, or, where drafts pay,
        one or more each (`_verify`)."""
        started = time.perf_counter()
        seqs = self._batch.seqs
        drafts = self._drafts(seqs)
        self.steps += 1
        self.last_batch_size = len(seqs)
        if any(drafts):
            deliveries, matched = self._verify(drafts)
        else:
            choices = sample(self._batch.decode(), [s.sampler for s in seqs])
            deliveries = [(s, s.append(c)) for s, c in zip(seqs, choices, strict=True)]
            matched = [0] * len(seqs)
        if self.speculator is not None:
            rows = [s.drafting for s in seqs]
            seconds = time.perf_counter() - started
            self.speculator.record(rows, drafts, matched, seconds)  # type: ignore[arg-type]
        return deliveries

    def _drafts(self, seqs: list[Sequence]) -> list[list[int]]:
        """Each decoding sequence's drafts for this step ([] each when not speculating)."""
        batch = self._batch
        if self.speculator is None or not isinstance(batch, SlotBatch):
            return [[] for _ in seqs]
        for seq in seqs:
            if seq.drafting is None:
                seq.drafting = Drafting(PromptLookup(seq.request.prompt_token_ids, seq.output_ids))
        if not batch.can_verify():
            return [[] for _ in seqs]
        # Every row's cache grows by the step's width, its padding included.
        context = self.model.context_length
        context_room = min(context - s.prompt_len - len(s.output_ids) for s in seqs)
        rows = [
            (s.drafting, min(s.request.params.max_tokens - len(s.output_ids) - 1, context_room))
            for s in seqs
        ]
        return self.speculator.drafts(rows)  # type: ignore[arg-type]

    def _verify(
        self, drafts: list[list[int]]
    ) -> tuple[list[tuple[Sequence, GenerationOutput]], list[int]]:
        """Verify every row's drafts in one call. Each position is sampled as a decode step
        samples it (same state, same draws), and a row takes drafts while they equal those
        samples, then the sample that differs (or follows the last draft): the text decoding
        without drafts gives. Returns the deliveries and the drafts each row matched."""
        batch = self._batch
        assert isinstance(batch, SlotBatch)  # the only batch `_drafts` drafts for
        seqs = batch.seqs
        logits = batch.verify(drafts)
        deliveries: list[tuple[Sequence, GenerationOutput]] = []
        kept, matched = [0] * len(seqs), [0] * len(seqs)
        active = list(range(len(seqs)))
        for position in range(logits.shape[1]):
            if not active:
                break
            choices = sample(logits[active, position], [seqs[r].sampler for r in active])
            going = []
            for row, choice in zip(active, choices, strict=True):
                seq, draft = seqs[row], drafts[row]
                deliveries.append((seq, seq.append(choice)))
                kept[row] += 1
                if position < len(draft) and choice.token_id == draft[position]:
                    matched[row] += 1
                    if not seq.finished:
                        going.append(row)
            active = going
        batch.settle(kept)
        return deliveries, matched

    def _filter(self) -> None:
        self._keep_prefixes()  # outside the lock: copying may take a few ms
        with self._cond:
            self._batch.drop_finished()

    @staticmethod
    def _deliver(deliveries: Iterable[tuple[Sequence, Delivery]]) -> None:
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
