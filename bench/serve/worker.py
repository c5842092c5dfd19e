"""The engine's one worker thread for `bench serve`: jobs in FIFO order, one at a time, cancellable.

The engine is not thread-safe, so one thread owns it. A job's events reach the event loop through
`call_soon_threadsafe` (the loop never blocks on the engine). Cancellation is a flag the worker reads twice: a job
cancelled while queued is dropped before it starts (event "skipped"), and a running one stops at its next token
(the engine's `on_token` callback returns True), i.e. within one decode step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from typing import Any


@dataclasses.dataclass(eq=False)
class Job:
    """One generation for the worker. Events arrive in `events`: ("token", id, t_ns) per generated id (t_ns:
    perf_counter_ns when it reached the host), then ("done", model.engine.Generation), ("error", exception) or
    ("skipped",) when the job was cancelled before it started; the server adds ("disconnected",) when the client
    leaves. `cancel`: set it to drop or stop the job."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Any
    stop_at_eos: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)

    def post(self, *item: Any) -> None:
        """Hand an event to the event loop (from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is closed (server shutting down): nobody is listening
            self.cancel.set()


class Worker:
    """The single thread that owns the engine: takes jobs from `jobs` in FIFO order, one at a time."""

    def __init__(self, engine):
        self.engine = engine
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.cancel.is_set():  # its client left while it waited: it never starts
                job.post("skipped")
                continue

            def on_token(token_id: int, job: Job = job) -> bool:
                job.post("token", token_id, time.perf_counter_ns())
                return job.cancel.is_set()  # True stops the engine before its next decode step

            try:
                gen = self.engine.generate(job.prompt_ids, job.max_new_tokens, job.sampling,
                                           stop_at_eos=job.stop_at_eos, on_token=on_token)  # fmt: skip
                job.post("done", gen)
            except Exception as exc:  # noqa: BLE001  (reported to the request; the worker keeps serving)
                job.post("error", exc)

    def stop(self) -> None:
        """Finish the current job, then end the thread (waits at most 10 s)."""
        self.jobs.put(None)
        self.thread.join(timeout=10)
