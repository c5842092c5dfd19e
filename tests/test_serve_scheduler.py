"""The scheduler of `bench serve` (bench/serve/scheduler.py) and `SequentialSlots` (bench/serve/slots.py), without a
model: requests join free slots between decode steps and leave them at once (finished, stopped, disconnected,
past their deadline), the queue is bounded, errors stay with their request, and the sequential slot engine gives
each sequence exactly what it would get alone.

The fake slot engine is paced by the test (`FakeSlots.allow`): every decode step waits for a permit, so what the
scheduler did between two steps can be checked at a fixed point.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bench.serve.scheduler import Job, QueueFull, Scheduler, Stopping
from bench.serve.slots import SequentialSlots, SlotResult, Token

EOS = 1002


class FakeSlots:
    """A slot engine: a sequence started with prompt [p, ...] yields p, p + 1, p + 2, ... (ids); a prompt [p, -k]
    fails at its k-th step. Each `step` waits for a permit (`allow`), then records which slots it ran."""

    def __init__(self, max_batch: int, paced: bool = True):
        self.max_batch, self.paced = max_batch, paced
        self.next: dict[int, int] = {}
        self.fail_at: dict[int, int] = {}
        self.steps: list[tuple[int, ...]] = []
        self.events: list[tuple[str, int]] = []  # ("prefill" | "release", slot), in order
        self.permits = threading.Semaphore(0)
        self.closed = False

    def allow(self, n: int = 1) -> None:
        for _ in range(n):
            self.permits.release()

    def prefill_into(self, slot, prompt_ids, max_new_tokens, sampling, *, stop_at_eos):
        assert slot not in self.next and 0 <= slot < self.max_batch
        if prompt_ids[0] < 0:
            raise ValueError("this prompt cannot be prefilled")
        self.events.append(("prefill", slot))
        self.next[slot] = prompt_ids[0] + 1
        if len(prompt_ids) > 1 and prompt_ids[1] < 0:
            self.fail_at[slot] = -prompt_ids[1]
        return Token(prompt_ids[0], time.perf_counter_ns())

    def step(self, slots):
        if self.paced:
            assert self.permits.acquire(timeout=10), "the test did not allow a step"
        self.steps.append(tuple(slots))
        out = {}
        for slot in slots:
            assert slot in self.next, f"slot {slot} stepped after its release"
            self.fail_at[slot] = self.fail_at.get(slot, 0) - 1
            if self.fail_at[slot] == 0:
                out[slot] = RuntimeError("the step failed")
                continue
            out[slot] = Token(self.next[slot], time.perf_counter_ns())
            self.next[slot] += 1
        return out

    def release(self, slot):
        self.next.pop(slot)
        self.fail_at.pop(slot, None)
        self.events.append(("release", slot))
        return SlotResult(compile_traces=0, bucket=32)

    def close(self):
        self.closed = True


async def _until_end(job: Job, timeout: float = 10) -> list[tuple]:
    """Every event of `job` up to and including its last ("done", "error", "skipped", "expired")."""
    events = []
    while True:
        item = await asyncio.wait_for(job.events.get(), timeout)
        events.append(item)
        if item[0] in ("done", "error", "skipped", "expired"):
            return events


def _tokens(events) -> list[int]:
    return [e[1] for e in events if e[0] == "token"]


async def _wait(predicate, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.005)


def _job(first: int, max_new: int, *, extra: tuple[int, ...] = (), stop_at_eos=False, deadline_ns=None) -> Job:
    return Job([first, *extra], max_new, None, stop_at_eos, asyncio.get_running_loop(), deadline_ns=deadline_ns)


def _scheduler(fake, max_queue=8, **kw):
    outcomes: list[str] = []
    sched = Scheduler(fake, max_queue=max_queue, eos_ids=(EOS,), on_outcome=outcomes.append, **kw)
    return sched, outcomes


def test_requests_join_free_slots_between_steps_and_leave_at_once():
    async def main():
        fake = FakeSlots(max_batch=2)
        sched, outcomes = _scheduler(fake)
        try:
            a, b, c = _job(100, 2), _job(200, 4), _job(300, 3)
            for job in (a, b, c):
                sched.submit(job)
            await _wait(lambda: sched.running == 2 and sched.waiting == 1)  # a, b prefilled; c waits
            fake.allow(1)  # step 1: a's 2nd (its last) token -> a leaves, c joins before step 2
            ends = await asyncio.gather(_until_end(a), _wait(lambda: sched.running == 2 and sched.waiting == 0))
            fake.allow(10)
            eb, ec = await asyncio.gather(_until_end(b), _until_end(c))
            assert _tokens(ends[0]) == [100, 101] and _tokens(eb) == [200, 201, 202, 203] and _tokens(ec) == [300, 301, 302]
            assert [e[0] for e in ends[0]] == ["admitted", "token", "token", "done"]
            # a's slot (0) was released right after its last token and given to c before the next step
            assert fake.events[:4] == [("prefill", 0), ("prefill", 1), ("release", 0), ("prefill", 0)]
            assert fake.steps[0] == (0, 1) and fake.steps[1] == (0, 1) and all(len(s) <= 2 for s in fake.steps)
            assert outcomes == ["finished"] * 3 and sched.running == sched.waiting == 0
            assert c.t_admitted_ns >= c.t_queued_ns and a.t_admitted_ns <= c.t_admitted_ns
        finally:
            fake.allow(100)
            sched.stop()
        assert fake.closed

    asyncio.run(main())


def test_a_slot_engine_that_takes_one_prefill_per_step_gets_its_joiners_one_step_apart():
    """`max_prefills_per_step` 1 (`BatchedSlots`): three requests waiting for three free slots join one per step
    boundary, so no running request waits for more than one prefill between two of its tokens."""

    async def main():
        fake = FakeSlots(max_batch=3)
        fake.max_prefills_per_step = 1
        sched, outcomes = _scheduler(fake)
        try:
            jobs = [_job(100 * k, 4) for k in (1, 2, 3)]
            for job in jobs:
                sched.submit(job)
            await _wait(lambda: sched.running == 1 and sched.waiting == 2)  # one prefilled; the step waits
            fake.allow(1)
            await _wait(lambda: sched.running == 2 and sched.waiting == 1)
            fake.allow(10)
            ends = await asyncio.gather(*(_until_end(j) for j in jobs))
            assert [_tokens(e) for e in ends] == [[100 * k + i for i in range(4)] for k in (1, 2, 3)]
            # prefill, step, prefill, step, prefill: never two prefills between two steps
            assert fake.events[:3] == [("prefill", 0), ("prefill", 1), ("prefill", 2)]
            assert fake.steps[:3] == [(0,), (0, 1), (0, 1, 2)] and outcomes == ["finished"] * 3
        finally:
            fake.allow(100)
            sched.stop()

    asyncio.run(main())


def test_a_stopped_request_frees_its_slot_before_the_next_step_and_a_cancelled_waiting_one_never_runs():
    async def main():
        fake = FakeSlots(max_batch=1)
        sched, outcomes = _scheduler(fake)
        try:
            a, b, c = _job(100, 50), _job(200, 50), _job(300, 2)
            for job in (a, b, c):
                sched.submit(job)
            await _wait(lambda: sched.running == 1)
            b.cancel.set()  # its client left while it waited
            fake.allow(2)
            await _wait(lambda: len(fake.steps) == 2)
            a.cancel.set()  # its client leaves mid-generation (or a stop string matched)
            fake.allow(10)
            ea, eb, ec = await asyncio.gather(_until_end(a), _until_end(b), _until_end(c))
            assert len(_tokens(ea)) in (3, 4) and ea[-1][0] == "done"  # stopped at the next step boundary
            assert eb == [("skipped",)] and _tokens(ec) == [300, 301]
            assert [e for e in fake.events if e[0] == "prefill"] == [("prefill", 0), ("prefill", 0)]  # a and c only
            assert sorted(outcomes) == ["cancelled", "cancelled", "finished"]
        finally:
            fake.allow(100)
            sched.stop()

    asyncio.run(main())


def test_the_queue_is_bounded_and_a_stopping_scheduler_takes_nothing():
    async def main():
        fake = FakeSlots(max_batch=1)
        sched, outcomes = _scheduler(fake, max_queue=1)
        try:
            a, b = _job(100, 3), _job(200, 3)
            sched.submit(a)
            sched.submit(b)
            assert sched.capacity == 2
            with pytest.raises(QueueFull) as refused:
                sched.submit(_job(300, 3))
            assert refused.value.capacity == 2 and refused.value.running + refused.value.waiting == 2
            fake.allow(10)
            await asyncio.gather(_until_end(a), _until_end(b))
            sched.submit(c := _job(300, 1))  # room again
            assert _tokens(await _until_end(c)) == [300]
        finally:
            fake.allow(100)
            sched.stop()
        with pytest.raises(Stopping):
            sched.submit(_job(400, 1))
        assert outcomes == ["finished"] * 3

    asyncio.run(main())


def test_a_deadline_refuses_a_waiting_request_and_stops_a_running_one():
    async def main():
        fake = FakeSlots(max_batch=1)
        sched, outcomes = _scheduler(fake)
        try:
            soon = time.perf_counter_ns() + 50_000_000  # 50 ms from now
            a, b = _job(100, 100, deadline_ns=soon), _job(200, 5, deadline_ns=soon)
            sched.submit(a)
            sched.submit(b)
            await _wait(lambda: sched.running == 1)
            await asyncio.sleep(0.1)  # both deadlines pass while a holds the only slot
            fake.allow(100)
            ea, eb = await asyncio.gather(_until_end(a), _until_end(b))
            assert ea[-1][0] == "done" and len(_tokens(ea)) < 100 and a.expired
            assert eb == [("expired",)]
            assert sorted(outcomes) == ["expired", "expired"]
        finally:
            fake.allow(100)
            sched.stop()

    asyncio.run(main())


def test_eos_ends_a_request_that_stops_at_eos_and_errors_stay_with_their_request():
    async def main():
        fake = FakeSlots(max_batch=3, paced=False)
        sched, outcomes = _scheduler(fake)
        try:
            eos = _job(EOS - 2, 10, stop_at_eos=True)  # 1000, 1001, 1002 (EOS): three tokens
            failing = _job(500, 10, extra=(-2,))  # its second step fails
            bad = _job(-5, 3)  # its prefill fails
            fine = _job(700, 4)
            for job in (eos, failing, bad, fine):
                sched.submit(job)
            results = await asyncio.gather(*(_until_end(j) for j in (eos, failing, bad, fine)))
            assert _tokens(results[0]) == [1000, 1001, 1002] and results[0][-1][0] == "done"
            assert results[1][-1][0] == "error" and _tokens(results[1]) == [500, 501]
            assert results[2][-1][0] == "error" and isinstance(results[2][-1][1], ValueError)
            assert _tokens(results[3]) == [700, 701, 702, 703]
            assert sorted(outcomes) == ["error", "error", "finished", "finished"]
            assert not fake.next  # every slot released
        finally:
            sched.stop()

    asyncio.run(main())


class FakeEngine:
    """`Engine.generate` of a fake model: the i-th new token of prompt [p, ...] is p * 1000 + i (greedy: the same
    every time); records the length of every generation and the threads alive at once."""

    def __init__(self):
        self.lengths: list[int] = []
        self.inside = self.most_inside = 0
        self.lock = threading.Lock()

    def generate(self, prompt_ids, max_new_tokens, sampling=None, *, stop_at_eos=False, on_token=None):
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        tokens = []
        try:
            while len(tokens) < max_new_tokens:
                tokens.append(prompt_ids[0] * 1000 + len(tokens))
                if on_token is not None and on_token(tokens[-1]):
                    break
        finally:
            with self.lock:
                self.inside -= 1
        self.lengths.append(len(tokens))
        return type("Gen", (), {"token_ids": tokens, "compile_traces": 0, "bucket": 32})()


def test_sequential_slots_interleave_independent_sequences_that_equal_their_runs_alone():
    engine = FakeEngine()
    slots = SequentialSlots(engine, max_batch=3)
    got = {s: [slots.prefill_into(s, [s + 1], 5, None, stop_at_eos=False).token_id] for s in range(3)}
    for _ in range(2):
        for slot, token in slots.step([0, 1, 2]).items():
            got[slot].append(token.token_id)
    assert engine.most_inside == 3  # three generations were open at once, taking turns
    result = slots.release(1)  # stopped after 3 of its 5 tokens: the engine stops there
    assert result == SlotResult(compile_traces=0, bucket=32) and engine.lengths == [3]
    for _ in range(2):
        for slot, token in slots.step([0, 2]).items():
            got[slot].append(token.token_id)
    assert [slots.release(s).bucket for s in (0, 2)] == [32, 32]
    assert got == {0: [1000, 1001, 1002, 1003, 1004], 1: [2000, 2001, 2002], 2: [3000, 3001, 3002, 3003, 3004]}
    assert engine.lengths == [3, 5, 5] and engine.inside == 0
    with pytest.raises(ValueError, match="not a free slot"):
        slots.prefill_into(3, [1], 2, None, stop_at_eos=False)
    assert slots.release(0) == SlotResult()  # releasing a free slot is harmless
    slots.close()


def test_a_scheduler_over_sequential_slots_frees_slots_and_answers_everyone():
    async def main():
        engine = FakeEngine()
        sched, outcomes = _scheduler(SequentialSlots(engine, max_batch=2))
        try:
            jobs = [_job(k, 4 + k) for k in range(1, 6)]
            for job in jobs:
                sched.submit(job)
            results = await asyncio.gather(*(_until_end(j) for j in jobs))
            for k, events in enumerate(results, 1):
                assert _tokens(events) == [k * 1000 + i for i in range(4 + k)]
            assert engine.most_inside == 2 and engine.inside == 0 and outcomes == ["finished"] * 5
        finally:
            sched.stop()

    asyncio.run(main())


def test_a_slow_reader_delays_no_other_request():
    """One client reads its tokens slowly (a pause of 0.2 s per token, as a slow network would): the scheduler
    never waits for it (tokens reach each request's queue with `call_soon_threadsafe`), so the other request's
    tokens all arrive while the slow one has read at most one, and both get every token."""

    async def main():
        fake = FakeSlots(max_batch=2, paced=False)
        sched, outcomes = _scheduler(fake)
        try:
            slow, fast = _job(100, 12), _job(200, 12)
            sched.submit(slow)
            sched.submit(fast)
            read_slow: list[tuple] = []

            async def slow_reader():
                while not read_slow or read_slow[-1][0] not in ("done", "error"):
                    read_slow.append(await asyncio.wait_for(slow.events.get(), 10))
                    await asyncio.sleep(0.2)

            reader = asyncio.ensure_future(slow_reader())
            ends_fast = await _until_end(fast)
            tokens_read_by_slow = sum(1 for e in read_slow if e[0] == "token")
            assert _tokens(ends_fast) == list(range(200, 212)) and tokens_read_by_slow <= 1
            await asyncio.wait_for(reader, 10)
            assert _tokens(read_slow) == list(range(100, 112)) and outcomes == ["finished"] * 2
        finally:
            sched.stop()

    asyncio.run(main())
