"""The engine as the scheduler of `bench serve` sees it: a fixed number of decode slots (`SlotEngine`).

The scheduler (`bench.serve.scheduler`) owns `max_batch` slots, numbered 0 .. max_batch - 1. A request joins a
free slot between decode steps (`prefill_into`: its prefill runs and gives its first token), then advances with
every other occupied slot one token per `step`, and leaves with `release` (finished, stopped, or its client gone),
which frees the slot at once. The scheduler alone decides when a sequence ends (max_tokens reached, EOS, a stop
string, a disconnect, a deadline): a slot engine never ends one by itself.

Two implementations; `default_slots` picks one (`BatchedSlots` for max_batch > 1, `SequentialSlots` for 1):

`BatchedSlots` (continuous batching): the slots are the rows of one batched KV cache (`model.slots.SlotDecoder`,
`Engine.slot_decoder(max_batch, cache_len)`), and a `step` is ONE jitted decode step of the occupied rows, each at
its own position: of just those rows (and free ones up to a power of two) while they fit in half the slots, else of
all rows. A joining request's prefill runs alone (its own bucket) and its row is copied into its slot. Every
request's prompt + max_tokens must fit the slots' cache length (`max_context`: the server's --max-length), a free
slot in a step costs its share of it, and greedy tokens equal the request's tokens alone (`model.slots`).

`SequentialSlots` runs each slot as an independent single-sequence generation (`model.engine.Engine.generate`,
batch 1), and a `step` advances them **one after another**, one jitted B=1 decode step each. That is correct (the
same programs, shapes and sampling keys as a request alone), fair (sequences interleave token by token) and **not
faster** than serving them one at a time: N slots cost N decode steps per scheduler step. With `max_batch` 1 it is
exactly the server's former one-request-at-a-time behaviour (the programs, tokens and timings of `generate`), which
is why `--max-batch 1` keeps it.

How `SequentialSlots` steps a generation it does not own the loop of: each slot's `Engine.generate` runs on its own
thread, and its `on_token` callback hands the token to the scheduler and waits for the next command ("go": one more
decode step; "stop": return now). The scheduler waits for each slot's answer before commanding the next, so exactly
one thread touches the engine at any moment (the engine is not thread-safe) and the threads only take turns.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlotResult:
    """What the engine reports about a released sequence: `compile_traces` (jit traces while it occupied its slot:
    0 proves nothing compiled meanwhile; None when unknown) and `bucket` (its padded prefill length in tokens;
    None when unknown)."""

    compile_traces: int | None = None
    bucket: int | None = None


@dataclasses.dataclass(frozen=True)
class Token:
    """One generated token id of a slot and its arrival on the host (`t_ns`: time.perf_counter_ns)."""

    token_id: int
    t_ns: int


class SlotEngine(Protocol):
    """The engine-facing interface of the scheduler: `max_batch` slots of one sequence each.

    Slots are ints in [0, max_batch). Only one thread (the scheduler's) calls these methods. `sampling` is a
    `model.engine.Sampling`. Exceptions: `prefill_into` raises the engine's error for that request (the slot stays
    free); `step` reports a failure per slot (the exception as that slot's value), after which the scheduler
    releases the slot. Optional members the server reads where present: `description` (one line for /health),
    `max_context` (the most tokens a prompt + max_tokens may total in a slot; absent or None: the model's context),
    `warmup(n_tokens, max_new_tokens)` (compile what a request of that shape runs; absent: `engine.warmup`)."""

    max_batch: int

    def prefill_into(self, slot: int, prompt_ids: Sequence[int], max_new_tokens: int, sampling: Any, *,
                     stop_at_eos: bool) -> Token:  # fmt: skip
        """Start the sequence of `prompt_ids` (ids, BOS included) in the free `slot`, room for `max_new_tokens`
        new tokens: run its prefill and return its first generated token."""
        ...

    def step(self, slots: Sequence[int]) -> dict[int, Token | BaseException]:
        """One decode step of every slot in `slots` (occupied, none released): slot -> its next token, or the
        exception that ended it."""
        ...

    def release(self, slot: int) -> SlotResult:
        """End the sequence in `slot` (wherever it is) and free the slot at once. Never raises."""
        ...

    def close(self) -> None:
        """Release every occupied slot (the server is stopping)."""
        ...


class _Running:
    """One slot's generation on its own thread: `commands` (scheduler -> thread: "go" | "stop"), `answers`
    (thread -> scheduler: ("token", Token) | ("done", Generation) | ("error", exception))."""

    def __init__(self, engine, prompt_ids: Sequence[int], max_new_tokens: int, sampling: Any, stop_at_eos: bool,
                 slot: int):  # fmt: skip
        self.commands: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.answers: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.ended = False  # generate returned (or raised): nothing more will come
        self.generation = None
        self.thread = threading.Thread(
            target=self._run, args=(engine, list(prompt_ids), max_new_tokens, sampling, stop_at_eos),
            name=f"slot-{slot}", daemon=True,
        )  # fmt: skip
        self.thread.start()

    def _run(self, engine, prompt_ids, max_new_tokens, sampling, stop_at_eos) -> None:
        def on_token(token_id: int) -> bool:
            self.answers.put(("token", Token(int(token_id), time.perf_counter_ns())))
            return self.commands.get() == "stop"  # True stops the engine before its next decode step

        try:
            gen = engine.generate(prompt_ids, max_new_tokens, sampling, stop_at_eos=stop_at_eos, on_token=on_token)
            self.answers.put(("done", gen))
        except BaseException as exc:  # noqa: BLE001  (handed to the scheduler, which reports it to the request)
            self.answers.put(("error", exc))

    def next(self) -> Token | BaseException | None:
        """The thread's next answer: a token, the exception that ended it, or None when it ended normally."""
        kind, value = self.answers.get()
        if kind == "token":
            return value
        self.ended = True
        if kind == "done":
            self.generation = value
            return None
        return value


class SequentialSlots:
    """`SlotEngine` over the single-sequence engine: N independent B=1 generations, stepped one after another in
    each scheduler step (correct, not faster; see the module docstring). `engine`: `model.engine.Engine` (or
    anything with its `generate(prompt_ids, max_new_tokens, sampling, *, stop_at_eos, on_token)`).
    Raises ValueError for max_batch < 1."""

    max_context = None  # the model's context: each sequence has its own cache of bucket + max_tokens positions

    def __init__(self, engine, max_batch: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine, self.max_batch = engine, max_batch
        self._slots: dict[int, _Running] = {}
        self.description = (f"sequential: {max_batch} independent batch-1 sequences, stepped one after another per "
                            "scheduler step (correct, not faster than one at a time)")  # fmt: skip

    def warmup(self, n_tokens: int, max_new_tokens: int) -> None:
        """Compile the programs of one shape: `engine.warmup` (greedy, the request's bucket + max_tokens)."""
        self.engine.warmup(n_tokens, max_new_tokens)

    def prefill_into(self, slot: int, prompt_ids: Sequence[int], max_new_tokens: int, sampling: Any, *,
                     stop_at_eos: bool) -> Token:  # fmt: skip
        """See `SlotEngine.prefill_into`. Raises ValueError for a slot out of range or occupied, and whatever the
        engine raised for this request (the slot stays free)."""
        if not 0 <= slot < self.max_batch or slot in self._slots:
            raise ValueError(f"slot {slot} is not a free slot of {self.max_batch}")
        running = _Running(self.engine, prompt_ids, max_new_tokens, sampling, stop_at_eos, slot)
        first = running.next()
        if isinstance(first, Token):
            self._slots[slot] = running
            return first
        running.thread.join(timeout=10)
        if first is None:  # generate returned without a token: cannot happen with max_new_tokens >= 1
            raise RuntimeError("the engine returned no token")
        raise first

    def step(self, slots: Sequence[int]) -> dict[int, Token | BaseException]:
        """See `SlotEngine.step`: each slot's B=1 decode step in turn. A slot whose generation ended by itself
        (it never should: the scheduler releases first) answers RuntimeError."""
        out: dict[int, Token | BaseException] = {}
        for slot in slots:
            running = self._slots[slot]
            if running.ended:
                out[slot] = RuntimeError(f"slot {slot}: the sequence has ended")
                continue
            running.commands.put("go")
            answer = running.next()
            out[slot] = RuntimeError(f"slot {slot}: the sequence ended early") if answer is None else answer
        return out

    def release(self, slot: int) -> SlotResult:
        """See `SlotEngine.release`: stop the slot's generation at its next step (it waits there) and join it."""
        running = self._slots.pop(slot, None)
        if running is None:
            return SlotResult()
        if not running.ended:
            running.commands.put("stop")
            while not running.ended:
                running.next()
        running.thread.join(timeout=10)
        gen = running.generation
        return SlotResult(compile_traces=getattr(gen, "compile_traces", None), bucket=getattr(gen, "bucket", None))

    def close(self) -> None:
        """Release every occupied slot."""
        for slot in list(self._slots):
            self.release(slot)


class BatchedSlots:
    """`SlotEngine` with continuous batching: the slots are the rows of one batched KV cache (`model.slots.
    SlotDecoder` over `engine.slot_decoder(max_batch, cache_len)`), one jitted decode step of the occupied ones
    per `step` (see the module docstring). `cache_len`: positions per slot, the most a prompt + max_tokens may total
    (`max_context`; default `engine.max_length`, the server's --max-length). Stop at EOS, stop strings,
    disconnects and deadlines are the scheduler's: a released slot is freed at once and its row carried along
    unused until a request joins it. Raises ValueError for max_batch < 1, and the engine's EngineError when the
    slots do not fit in memory (`Engine.check_slots`: the arithmetic, before anything is allocated)."""

    max_prefills_per_step = 1
    """Requests the scheduler admits between two decode steps: each prefill delays every running slot's next token,
    so one per step bounds that delay at one prefill (`bench.serve.scheduler`)."""

    def __init__(self, engine, max_batch: int, cache_len: int | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.decoder = engine.slot_decoder(max_batch, cache_len)
        self.engine, self.max_batch = engine, max_batch
        self.max_context = self.decoder.cache_len
        self._started: dict[int, tuple[int, int, int]] = {}  # slot -> (traces when it joined, bucket, resets)
        counts = ", ".join(map(str, self.decoder.row_counts))
        self.description = (f"batched: {max_batch} slots decoded together, one jitted step of the occupied slots per "
                            f"scheduler step ({self.max_context} positions per slot, --max-length; a step decodes "
                            f"{counts + ' or ' if counts else ''}{max_batch} rows, the fewest that hold the occupied "
                            "ones, and a free row in it costs its share)")  # fmt: skip

    def prefill_into(self, slot: int, prompt_ids: Sequence[int], max_new_tokens: int, sampling: Any, *,
                     stop_at_eos: bool) -> Token:  # fmt: skip
        """See `SlotEngine.prefill_into` (`stop_at_eos` is the scheduler's to act on). Raises the engine's
        EngineError for a slot out of range or occupied, or a request that does not fit the slots."""
        from model.engine import GREEDY, CompileCounter

        traces0 = CompileCounter.traces
        first = self.decoder.prefill(slot, list(prompt_ids), max_new_tokens, sampling or GREEDY)
        t_ns = time.perf_counter_ns()
        self._started[slot] = (traces0, first.bucket, self.decoder.resets)
        return Token(first.token_id, t_ns)

    def step(self, slots: Sequence[int]) -> dict[int, Token | BaseException]:
        """See `SlotEngine.step`: ONE decode step of the occupied rows (`SlotDecoder.step`), whose tokens arrive
        on the host together. A slot that is not occupied, or whose sequence was lost when the batched cache was rebuilt
        after an engine error (`SlotDecoder.resets`), answers RuntimeError; a step that raised raises (the
        scheduler ends every slot with it)."""
        resets = self.decoder.resets
        out: dict[int, Token | BaseException] = {}
        live = []
        for slot in slots:
            started = self._started.get(slot)
            if started is None:
                out[slot] = RuntimeError(f"slot {slot} is not occupied")
            elif started[2] != resets:
                out[slot] = RuntimeError(f"slot {slot}: its sequence was lost when the engine failed")
            else:
                live.append(slot)
        if live:
            tokens = self.decoder.step()
            t_ns = time.perf_counter_ns()
            out.update({slot: Token(int(tokens[slot]), t_ns) for slot in live})
        return out

    def release(self, slot: int) -> SlotResult:
        """See `SlotEngine.release`: the slot is free at once (`SlotDecoder.free`)."""
        from model.engine import CompileCounter

        started = self._started.pop(slot, None)
        self.decoder.free(slot)
        if started is None:
            return SlotResult()
        return SlotResult(compile_traces=CompileCounter.traces - started[0], bucket=started[1])

    def close(self) -> None:
        """Release every occupied slot."""
        for slot in list(self._started):
            self.release(slot)

    def warmup(self, n_tokens: int, max_new_tokens: int) -> None:
        """Compile what a request of `n_tokens` prompt tokens runs in a slot (`SlotDecoder.warmup`: its greedy and
        sampled prefill at its bucket, the insert, the step of each row count, greedy and sampled). Raises EngineError
        for a shape the slots cannot hold (prompt + max_new_tokens above `max_context`)."""
        self.decoder.warmup(n_tokens, max_new_tokens)


def default_slots(engine, max_batch: int) -> SequentialSlots | BatchedSlots:
    """The slot engine `bench serve` runs: `SequentialSlots` for max_batch 1 (exactly the single-sequence engine's
    programs, tokens and timings) or for an engine without decode slots (no `slot_decoder`), else `BatchedSlots`
    at the engine's max_length. Raises as the chosen class."""
    if max_batch == 1 or not hasattr(engine, "slot_decoder"):
        return SequentialSlots(engine, max_batch)
    return BatchedSlots(engine, max_batch)
