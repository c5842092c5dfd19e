"""The scheduler of `bench serve`: a bounded queue of requests and `max_batch` decode slots, one thread.

Continuous batching, at step granularity: between two decode steps the scheduler
1. drops the waiting requests whose client left (event "skipped") or whose deadline passed (event "expired"),
2. moves waiting requests, first come first served, into free slots and runs their prefill
   (`SlotEngine.prefill_into`; event "admitted", then their first "token"): as many as there are free slots, or
   at most the slot engine's `max_prefills_per_step` (`BatchedSlots`: 1),
3. frees at once the slot of every running request that is finished (max_tokens generated, or EOS when it stops
   at EOS), stopped (its `cancel` flag: the client left, or a stop string matched) or past its deadline
   (`SlotEngine.release`; event "done"),
4. runs one decode step of every occupied slot (`SlotEngine.step`; one "token" event per slot).
A request therefore waits at most one decode step (plus the prefills admitted with it) for anything the scheduler
does, and a slow or departed client never holds its slot past the next step boundary: the engine never waits for
a client (tokens reach the event loop through `call_soon_threadsafe`, which never blocks).

Why a limit on prefills per step: the prefills admitted at a step boundary run before the next decode step, so
every running request's next token waits for all of them. With k requests joining at once (a burst, or a batch
that finished together) that gap is k prefills long, and it shows in the inter-token latency's tail (p99). One
prefill per boundary bounds the gap at one prefill plus one step; the joining requests take turns (their TTFT
grows by the steps between their prefills), and requests that joined together finish at different steps, which
spreads later joins out too.

Admission (`submit`, called on the event loop): at most `max_batch + max_queue` requests are in the server
(running + waiting); one more is refused at once with `QueueFull` (the server answers 429 with Retry-After), never
queued to hang. A stopping scheduler refuses with `Stopping` (503).

Which engine runs the slots is the `SlotEngine` (`bench.serve.slots`): `BatchedSlots` (max_batch > 1: the slots
are the rows of one batched KV cache, one jitted decode step for all of them per scheduler step) or
`SequentialSlots` (max_batch 1: the single-sequence engine, exactly as a request alone).

Times are `time.perf_counter_ns` (monotonic): a job's `t_queued_ns` (submitted), `t_admitted_ns` (given a slot);
queue time = admitted - queued.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from bench.serve.slots import SlotEngine, SlotResult, Token

log = logging.getLogger("bench.serve")

OUTCOMES = ("finished", "cancelled", "expired", "error")
"""How an admitted request leaves the server (the `outcome` of `Scheduler.on_outcome`): "finished" (max_tokens,
EOS or a stop string), "cancelled" (its client left, queued or running), "expired" (its deadline passed, queued or
running), "error" (the engine raised)."""


class QueueFull(Exception):
    """The server holds `max_batch + max_queue` requests already (`running`, `waiting` at refusal)."""

    def __init__(self, running: int, waiting: int, capacity: int):
        super().__init__(f"{running} requests running and {waiting} waiting: the server holds at most {capacity}")
        self.running, self.waiting, self.capacity = running, waiting, capacity


class Stopping(Exception):
    """The scheduler is stopping: no new request is taken."""


@dataclasses.dataclass(eq=False)
class Job:
    """One generation for the scheduler.

    Inputs: `prompt_ids` (token ids, BOS included), `max_new_tokens` (>= 1), `sampling` (`model.engine.Sampling`),
    `stop_at_eos`, the event `loop` to post to, `deadline_ns` (perf_counter_ns after which it is dropped or stopped;
    None: no deadline). Events arrive in `events`, in this order: ("admitted", t_ns) when it gets a slot, then
    ("token", id, t_ns) per generated id (t_ns: perf_counter_ns of its arrival on the host), then ("done",
    `SlotResult`) or ("error", exception); instead of all these, ("skipped",) when it was cancelled while waiting,
    or ("expired",) when its deadline passed while waiting. The server adds ("disconnected",) when its client
    leaves. `cancel`: set it to drop or stop the job (`stopped_by_text` first when a stop string ended it, so the
    outcome is "finished", not "cancelled"). `expired`: its deadline stopped it while it ran."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Any
    stop_at_eos: bool
    loop: asyncio.AbstractEventLoop
    deadline_ns: int | None = None
    events: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    stopped_by_text: bool = False
    expired: bool = False
    t_queued_ns: int | None = None
    t_admitted_ns: int | None = None
    generated: int = 0

    def post(self, *item: Any) -> None:
        """Hand an event to the event loop (from the scheduler thread); never blocks."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is closed (server shutting down): nobody is listening
            self.cancel.set()

    def past_deadline(self, now_ns: int) -> bool:
        return self.deadline_ns is not None and now_ns >= self.deadline_ns


class Scheduler:
    """The thread that owns the slot engine (see the module docstring).

    `slots`: the `SlotEngine` (its `max_batch` slots); `max_queue`: requests that may wait for a slot (>= 0);
    `eos_ids`: the ids that end a job that stops at EOS; `on_outcome(outcome)`: called once per admitted request
    as it leaves, with one of `OUTCOMES` (from the scheduler thread). Raises ValueError for max_queue < 0."""

    def __init__(self, slots: SlotEngine, *, max_queue: int, eos_ids: Iterable[int] = (),
                 on_outcome: Callable[[str], None] = lambda _outcome: None):  # fmt: skip
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.slots, self.max_batch, self.max_queue = slots, slots.max_batch, max_queue
        self.eos_ids, self.on_outcome = frozenset(eos_ids), on_outcome
        self.prefills_per_step: int | None = getattr(slots, "max_prefills_per_step", None)  # None: every free slot
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: dict[int, Job] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self.steps = 0  # decode steps run (scheduler steps with at least one occupied slot)
        self.thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
        self.thread.start()

    # ---- the event loop's side ----------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Requests holding a slot now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._waiting)

    @property
    def capacity(self) -> int:
        """Requests the server holds at most (running + waiting)."""
        return self.max_batch + self.max_queue

    def submit(self, job: Job) -> None:
        """Queue `job` (FIFO). Raises QueueFull when `capacity` requests are in already, Stopping when stopping."""
        with self._cond:
            if self._stopping:
                raise Stopping("the server is stopping")
            if len(self._waiting) + len(self._running) >= self.capacity:
                raise QueueFull(len(self._running), len(self._waiting), self.capacity)
            job.t_queued_ns = time.perf_counter_ns()
            self._waiting.append(job)
            self._cond.notify()

    def stop(self) -> None:
        """Stop taking requests, drop the waiting ones ("skipped"), release the running ones ("done") and end the
        thread (waits at most 10 s)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self.thread.join(timeout=10)

    # ---- the scheduler thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not self._running:
                        self._cond.wait()
                    if self._stopping:
                        break
                    admitted = self._admit()
                for slot, job in admitted:
                    self._start(slot, job)
                self._reap()
                active = sorted(self._running)
                if active:
                    self.steps += 1
                    try:
                        results = self.slots.step(active)
                    except Exception as exc:  # noqa: BLE001  (a slot engine that raises for all: every slot fails)
                        results = {slot: exc for slot in active}
                    for slot in active:
                        self._deliver(slot, results.get(slot, RuntimeError(f"slot {slot}: no answer from the step")))
                    self._reap()
        except BaseException:  # noqa: BLE001  (a bug here must not leave every client hanging)
            log.exception("the scheduler failed; the waiting and running requests are ended")
        finally:
            self._shutdown()

    def _admit(self) -> list[tuple[int, Job]]:
        """(Under the lock.) Drop cancelled and expired waiting jobs; move the first waiting jobs into free slots (at
    most `prefills_per_step` of them)."""
        now = time.perf_counter_ns()
        kept: collections.deque[Job] = collections.deque()
        for job in self._waiting:
            if job.cancel.is_set():
                self.on_outcome("cancelled")
                job.post("skipped")
            elif job.past_deadline(now):
                job.expired = True
                self.on_outcome("expired")
                job.post("expired")
            else:
                kept.append(job)
        self._waiting = kept
        free = [s for s in range(self.max_batch) if s not in self._running]
        if self.prefills_per_step is not None:
            free = free[: max(1, self.prefills_per_step)]
        admitted = []
        for slot in free:
            if not self._waiting:
                break
            job = self._waiting.popleft()
            job.t_admitted_ns = now
            self._running[slot] = job
            admitted.append((slot, job))
        return admitted

    def _start(self, slot: int, job: Job) -> None:
        """Run the prefill of `job` in `slot`; its first token, or its error (the slot freed)."""
        job.post("admitted", job.t_admitted_ns)
        try:
            token = self.slots.prefill_into(slot, job.prompt_ids, job.max_new_tokens, job.sampling,
                                            stop_at_eos=job.stop_at_eos)  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (reported to the request; the scheduler keeps serving)
            with self._cond:
                self._running.pop(slot, None)
            self.on_outcome("error")
            job.post("error", exc)
            return
        self._deliver(slot, token)

    def _deliver(self, slot: int, answer: Token | BaseException) -> None:
        """Post a slot's token (ending the job when it is its last) or end it with the error."""
        job = self._running.get(slot)
        if job is None:
            return
        if not isinstance(answer, Token):
            self._end(slot, error=answer)
            return
        job.generated += 1
        job.post("token", answer.token_id, answer.t_ns)
        if job.generated >= job.max_new_tokens or (job.stop_at_eos and answer.token_id in self.eos_ids):
            self._end(slot)

    def _reap(self) -> None:
        """End every running job that was stopped (cancel) or is past its deadline."""
        now = time.perf_counter_ns()
        for slot, job in list(self._running.items()):
            if job.cancel.is_set():
                self._end(slot)
            elif job.past_deadline(now):
                job.expired = True
                self._end(slot)

    def _end(self, slot: int, error: BaseException | None = None) -> None:
        """Free `slot` at once (`SlotEngine.release`) and tell its job: ("done", SlotResult) or ("error", exc)."""
        result = self.slots.release(slot)
        with self._cond:
            job = self._running.pop(slot)
        if error is not None:
            self.on_outcome("error")  # counted before the request hears of it: its answer finds the metrics current
            job.post("error", error)
            return
        if job.expired:
            outcome = "expired"
        elif job.cancel.is_set() and not job.stopped_by_text:
            outcome = "cancelled"
        else:
            outcome = "finished"
        self.on_outcome(outcome)
        job.post("done", result)

    def _shutdown(self) -> None:
        """End everything still in the server (the thread is leaving)."""
        with self._cond:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), collections.deque()
        for job in waiting:
            self.on_outcome("cancelled")
            job.post("skipped")
        for slot in list(self._running):
            try:
                self._end(slot)
            except Exception:  # noqa: BLE001
                log.exception("releasing a slot while stopping")
        try:
            self.slots.close()
        except Exception:  # noqa: BLE001
            log.exception("closing the slot engine")


def describe(slots: SlotEngine) -> str:
    """One line naming how the slot engine steps its slots (for /health): its `description`, else its class."""
    return getattr(slots, "description", None) or type(slots).__name__


__all__ = ["OUTCOMES", "Job", "QueueFull", "Scheduler", "SlotResult", "Stopping", "describe"]
