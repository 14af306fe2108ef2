"""The batching loop: requests end exactly as specified, join and leave between steps, and the
limits hold. Most tests step the scheduler by hand, so joins and aborts land on known steps."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from api.engine.errors import ContextLengthExceeded, EngineDead, EngineOverloaded
from api.engine.protocol import GenerationRequest, SamplingParams
from api.engine.runtime.scheduler import END
from tests.engine.conftest import (
    DEMO_DIR,
    collect,
    greedy,
    make_engine,
    manual_sequence,
    run_steps,
    token_ids,
)

PROMPT = [1, 355, 120, 987, 42, 7, 1500, 2, 1, 600]


def demo_copy(tmp_path: Path, *, config: dict | None = None, generation: dict | None = None):
    """The demo export with some config fields changed."""
    path = tmp_path / "demo"
    shutil.copytree(DEMO_DIR, path)
    for name, changes in (("config.json", config), ("generation_config.json", generation)):
        if changes:
            data = json.loads((path / name).read_text())
            data.update(changes)
            (path / name).write_text(json.dumps(data))
    return path


def test_generation_stops_at_any_eos_id_of_generation_config(tmp_path: Path) -> None:
    free, _ = run_steps(make_engine(DEMO_DIR), {0: [greedy("a", PROMPT, 12)]})
    produced = token_ids(free["a"])
    assert len(set(produced[:4])) == 4 or produced[3] not in produced[:3]
    engine = make_engine(demo_copy(tmp_path, generation={"eos_token_id": [9999, produced[3]]}))

    outputs, _ = run_steps(engine, {0: [greedy("a", PROMPT, 12)]})

    assert token_ids(outputs["a"]) == produced[:4]
    assert outputs["a"][-1].finish_reason == "stop" and outputs["a"][-1].completion_tokens == 4
    text = "".join(o.text for o in outputs["a"])
    assert text == engine.tokenizer.decode(produced[:3])


def test_context_window_ends_generation_with_length(tmp_path: Path) -> None:
    engine = make_engine(demo_copy(tmp_path, config={"max_position_embeddings": 16}))
    assert engine.context_length == 16
    outputs, _ = run_steps(
        engine, {0: [greedy("a", PROMPT, 100), greedy("b", (PROMPT * 2)[:15], 100)]}
    )
    assert outputs["a"][-1].completion_tokens == 6 and outputs["a"][-1].finish_reason == "length"
    assert outputs["b"][-1].completion_tokens == 1 and outputs["b"][-1].finish_reason == "length"


@pytest.mark.anyio
async def test_a_prompt_that_fills_the_context_window_is_refused(tmp_path: Path) -> None:
    engine = make_engine(demo_copy(tmp_path, config={"max_position_embeddings": 10}))
    with pytest.raises(ContextLengthExceeded) as error:
        engine.generate(greedy("a", PROMPT, 5))
    assert error.value.prompt_tokens == 10 and error.value.context_length == 10


def sampled(request_id: str, seed: int | None, **params) -> GenerationRequest:
    return GenerationRequest(
        request_id,
        PROMPT,
        SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=seed, **params),
    )


def test_same_seed_gives_the_same_tokens_alone_or_in_a_batch() -> None:
    alone, _ = run_steps(make_engine(DEMO_DIR), {0: [sampled("a", seed=7)]})
    batched, _ = run_steps(
        make_engine(DEMO_DIR),
        {0: [sampled("x", seed=1)], 2: [sampled("a", seed=7), greedy("g", PROMPT[:3], 30)]},
    )
    other, _ = run_steps(make_engine(DEMO_DIR), {0: [sampled("a", seed=8)]})
    assert token_ids(alone["a"]) == token_ids(batched["a"])
    assert token_ids(alone["a"]) != token_ids(other["a"])


def test_penalties_change_sampled_tokens_deterministically() -> None:
    def run():
        request = sampled("p", seed=3, presence_penalty=2.0, frequency_penalty=1.5)
        return token_ids(run_steps(make_engine(DEMO_DIR), {0: [request]})[0]["p"])

    plain = token_ids(run_steps(make_engine(DEMO_DIR), {0: [sampled("p", seed=3)]})[0]["p"])
    assert run() == run() != plain


def test_an_aborted_request_leaves_the_batch_at_the_next_step() -> None:
    engine = make_engine(DEMO_DIR)
    scheduler = engine.scheduler
    a = manual_sequence(engine, greedy("a", PROMPT, 50))
    b = manual_sequence(engine, greedy("b", PROMPT[:4], 50))
    scheduler.submit(a)
    scheduler.submit(b)
    scheduler.step()
    scheduler.step()
    assert scheduler.last_batch_size == 2 and len(a.queue) == 3

    scheduler.abort("a")
    scheduler.step()

    assert a.queue[-1] is END and len(a.queue) == 4
    assert scheduler.last_batch_size == 1 and scheduler.counts() == (1, 0)
    assert len(b.queue) == 4 and not b.finished


def test_an_aborted_request_still_waiting_never_runs() -> None:
    engine = make_engine(DEMO_DIR, max_active_sequences=1)
    a = manual_sequence(engine, greedy("a", PROMPT, 5))
    b = manual_sequence(engine, greedy("b", PROMPT, 5))
    engine.scheduler.submit(a)
    engine.scheduler.submit(b)
    engine.scheduler.step()
    engine.scheduler.abort("b")
    engine.scheduler.step()
    assert list(b.queue) == [END] and engine.scheduler.counts() == (1, 0)


def test_max_active_sequences_keeps_the_rest_queued() -> None:
    engine = make_engine(DEMO_DIR, max_active_sequences=2)
    for name in "abc":
        engine.scheduler.submit(manual_sequence(engine, greedy(name, PROMPT, 5)))
    engine.scheduler.step()
    assert engine.scheduler.counts() == (2, 1)


@pytest.mark.anyio
async def test_a_full_queue_raises_engine_overloaded() -> None:
    engine = make_engine(DEMO_DIR, max_queued=2)  # not started: requests wait in the queue
    engine.generate(greedy("a", PROMPT, 5))
    engine.generate(greedy("b", PROMPT, 5))
    with pytest.raises(EngineOverloaded):
        engine.generate(greedy("c", PROMPT, 5))
    assert engine.stats().queued_sequences == 2


@pytest.mark.anyio
async def test_closing_a_stream_early_aborts_its_request(demo_engine) -> None:
    stream = demo_engine.generate(greedy("a", PROMPT, 1000))
    first = await stream.__anext__()
    assert first.completion_tokens == 1
    await stream.aclose()
    # The abort is taken before (or in) the step that admits "b", so once "b" is done, "a"
    # (1000 tokens asked) is no longer in the batch.
    outputs = await collect(demo_engine, greedy("b", PROMPT, 3))
    assert outputs[-1].completion_tokens == 3
    assert demo_engine.stats().active_sequences == 0


@pytest.mark.anyio
async def test_shutdown_ends_pending_streams_with_engine_dead() -> None:
    engine = make_engine(DEMO_DIR)
    stream = engine.generate(greedy("a", PROMPT, 5))  # queued before start, never run
    await engine.shutdown()
    with pytest.raises(EngineDead):
        await stream.__anext__()
    with pytest.raises(EngineDead):
        await engine.check_health()
    with pytest.raises(EngineDead):
        engine.generate(greedy("b", PROMPT, 5))


@pytest.mark.anyio
async def test_logprobs_come_with_each_token(demo_engine) -> None:
    request = GenerationRequest(
        "l", PROMPT, SamplingParams(max_tokens=3, temperature=0, logprobs=True, top_logprobs=3)
    )
    outputs = await collect(demo_engine, request)
    for output in outputs:
        (entry,) = output.logprobs
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_a_running_stream_gets_a_token_after_every_chunk_of_a_long_prompt() -> None:
    engine = make_engine(DEMO_DIR, max_prefill_tokens=8)
    scheduler = engine.scheduler
    running = manual_sequence(engine, greedy("running", PROMPT[:6], 50))
    scheduler.submit(running)
    scheduler.step()
    long_prompt = (PROMPT * 4)[:37]  # 5 chunks of at most 8 tokens
    joining = manual_sequence(engine, greedy("long", long_prompt, 5))
    scheduler.submit(joining)

    timeline = []
    for _ in range(5):
        scheduler.step()
        timeline.append((len(running.queue), len(joining.queue)))

    # Four chunks leave the long prompt without a token while the stream gains one per step;
    # the fifth completes it: its first token, then the decode step that both share.
    assert timeline == [(3, 0), (4, 0), (5, 0), (6, 0), (7, 2)]
    assert scheduler.counts() == (2, 0) and scheduler.last_batch_size == 2


def test_a_request_aborted_part_way_through_its_prefill_never_joins() -> None:
    engine = make_engine(DEMO_DIR, max_prefill_tokens=4)
    scheduler = engine.scheduler
    long = manual_sequence(engine, greedy("long", PROMPT * 2, 5))
    scheduler.submit(long)
    scheduler.step()
    assert scheduler.counts() == (1, 0) and list(long.queue) == []

    scheduler.abort("long")
    scheduler.step()

    assert list(long.queue) == [END] and scheduler.counts() == (0, 0)


def arrives_during_first_prefill(engine, late) -> None:  # noqa: ANN001 - LocalEngine, Sequence
    """Make `late` reach the queue while the batch's next prefill call runs, as a request whose
    hold was placed a few ms after its neighbours' reaches a running engine."""
    batch = engine.scheduler._batch
    prefill = batch.prefill

    def prefill_then_arrive(call):  # noqa: ANN001, ANN202 - the batch's own signature
        batch.prefill = prefill
        logits = prefill(call)
        engine.scheduler.submit(late)
        return logits

    batch.prefill = prefill_then_arrive


def step_with_a_late_arrival(**limits: int):  # noqa: ANN201 - (Scheduler, Sequence, Sequence)
    """One step of a scheduler whose first request is joined by another during its prefill."""
    engine = make_engine(DEMO_DIR, **limits)
    first = manual_sequence(engine, greedy("first", PROMPT, 5))
    late = manual_sequence(engine, greedy("late", PROMPT[:7], 5))
    arrives_during_first_prefill(engine, late)
    engine.scheduler.submit(first)
    engine.scheduler.step()
    return engine.scheduler, first, late


def test_a_request_arriving_during_prefill_joins_before_the_decode_step() -> None:
    scheduler, first, late = step_with_a_late_arrival()

    # Both prompts prefilled (a first token each) and one decode step for the two of them.
    assert (len(first.queue), len(late.queue)) == (2, 2)
    assert scheduler.last_batch_size == 2 and scheduler.counts() == (2, 0)


def test_arrivals_wait_for_the_next_step_once_the_prefill_budget_is_spent() -> None:
    scheduler, first, late = step_with_a_late_arrival(max_prefill_tokens=len(PROMPT))

    assert (len(first.queue), len(late.queue)) == (2, 0)
    assert scheduler.last_batch_size == 1 and scheduler.counts() == (1, 1)
    scheduler.step()
    assert (len(first.queue), len(late.queue)) == (3, 2) and scheduler.last_batch_size == 2


def arrive_later(scheduler, sequence, arrived, after: float) -> threading.Thread:  # noqa: ANN001
    """Submit `sequence` from another thread `after` seconds from now, then say it arrived: a
    request whose hold commits after its neighbour's (`None`: it was refused, never submitted)."""

    def later() -> None:
        time.sleep(after)
        if sequence is not None:
            scheduler.submit(sequence)
        arrived()

    thread = threading.Thread(target=later)
    thread.start()
    return thread


def step_without_waiting_out(scheduler) -> None:  # noqa: ANN001 - Scheduler
    """One step, which must not sit out its 30 s arrival wait."""
    stepping = threading.Thread(target=scheduler.step)
    stepping.start()
    stepping.join(timeout=10)
    assert not stepping.is_alive(), "the step waited for a request that was not coming"


def test_an_idle_engine_waits_for_requests_on_their_way_and_prefills_them_together() -> None:
    engine = make_engine(DEMO_DIR, arrival_wait_seconds=30)
    scheduler = engine.scheduler
    first = manual_sequence(engine, greedy("first", PROMPT, 5))
    second = manual_sequence(engine, greedy("second", PROMPT[:7], 5))
    first_arrived, second_arrived = scheduler.expect(), scheduler.expect()
    scheduler.submit(first)
    first_arrived()
    late = arrive_later(scheduler, second, second_arrived, after=0.3)

    scheduler.step()
    late.join()

    # Both prompts prefilled (a first token each), then one decode step for the two of them;
    # without the wait, `first` would have been prefilled and decoded alone.
    assert (len(first.queue), len(second.queue)) == (2, 2)
    assert scheduler.last_batch_size == 2 and scheduler.counts() == (2, 0)


def test_a_request_that_will_not_come_stops_the_wait() -> None:
    engine = make_engine(DEMO_DIR, arrival_wait_seconds=30)
    scheduler = engine.scheduler
    first = manual_sequence(engine, greedy("first", PROMPT, 5))
    first_arrived, refused = scheduler.expect(), scheduler.expect()
    scheduler.submit(first)
    first_arrived()
    first_arrived()  # saying it twice counts once
    called_off = arrive_later(scheduler, None, refused, after=0.1)

    step_without_waiting_out(scheduler)
    called_off.join()

    assert len(first.queue) == 2 and scheduler.last_batch_size == 1
    assert scheduler.expected == 0


def test_the_wait_for_a_late_request_is_bounded() -> None:
    engine = make_engine(DEMO_DIR, arrival_wait_seconds=0.05)
    scheduler = engine.scheduler
    first = manual_sequence(engine, greedy("first", PROMPT, 5))
    scheduler.expect()  # on its way, but its hold takes longer than the wait
    scheduler.submit(first)

    started = time.monotonic()
    scheduler.step()

    assert len(first.queue) == 2 and scheduler.last_batch_size == 1
    assert time.monotonic() - started >= 0.05


def test_running_streams_never_wait_for_expected_requests() -> None:
    engine = make_engine(DEMO_DIR, arrival_wait_seconds=30)
    scheduler = engine.scheduler
    running = manual_sequence(engine, greedy("running", PROMPT, 50))
    scheduler.submit(running)
    scheduler.step()
    scheduler.expect()  # never arrives: a 30 s wait would stall the running stream
    joining = manual_sequence(engine, greedy("joining", PROMPT[:7], 5))
    scheduler.submit(joining)

    step_without_waiting_out(scheduler)

    assert (len(running.queue), len(joining.queue)) == (3, 2)
