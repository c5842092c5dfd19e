"""`bench sweep`: cells of exact input sizes, each warmed up at its compiled shape, then timed repeats.

Order of work (docs/method.md "Per cell"):
1. every prompt is built and its exact token count checked before anything is measured;
2. the first request of the fresh engine is recorded separately as `cold` (it compiles, or restores from the
   persistent compilation cache, the programs of the first shape);
3. per cell and decode loop of `SweepConfig.decode_loops` (host, then device), one warm-up request at its compiled
   shape (bucket, max_new_tokens, loop, block) and `repeats` timed ones (kinds `LOOP_KINDS`), in the order of
   `SweepConfig.order` (docs/method.md, "Interleaving"): "interleaved" (`bench sweep`'s default) warms every cell
   and loop up first, then runs rounds: timed repeat r of every cell and loop before repeat r + 1 of any, so that the
   host's drift touches every cell alike; the in-process sweep measures the device's rates before the first round
   and after each (`bench.sweep.rates.RoundProbes`), and each cell's shares use the probes around its repeats.
   "sequential" measures cell after cell (each loop's warm-up, then its timed repeats);
4. every sample is appended to the run folder as it is measured, and a cell's summary row as the cell ends (after
   its last timed repeat in the sequential order, after the last round in the interleaved one), so an interrupted
   sweep keeps every measured request (its cells in progress as partial rows); a cell that fails (e.g. out of
   memory) is recorded as failed and the sweep goes on.

Batches (`SweepConfig.batches`, `bench sweep --batch 1,4,16`; docs/method.md "Batches"): a cell is (input tokens,
B), in the order input size, then batch as given. A B = 1 cell is exactly the cell of a sweep without --batch (the
same prompt, `Engine.generate`, the same gauge and tokens); a B > 1 cell decodes B different prompts of the exact
size together (`bench.measure.prompts.row_prompts`, row 0 the B = 1 prompt; `Engine.generate_batch`), one `Sample`
per batch request with every row's tokens. After its timed repeats, untimed, each row's tokens are compared with
its prompt's tokens at B = 1 (`Engine.generate` of that prompt, once per distinct prompt per sweep; row 0's from
the B = 1 cell when it ran): the row's `rows_differ`. Every cell's batch is checked to fit in memory
(`Engine.check_batch`) before anything is timed (`check_batches`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Iterator, Sequence

from bench.errors import InputError
from bench.measure.prompts import Prompt, exact_prompt, min_prompt_tokens, row_prompts
from bench.measure.request import Measured, measure_batch_request, measure_request
from bench.runs import RunFolder
from bench.runs.logits import logits_path, write_logits, write_step_summary
from bench.runs.agreement import state as state_rerun_intervals
from bench.runs.agreement import with_spreads
from bench.runs.records import LOOP_KINDS, CellRow, Sample, cell_key, failed_cell, summarize_cell
from bench.signals import deliveries_counted, stop_now, stop_signals_handled
from bench.sweep.processes import agreed_stop, first_process
from bench.sweep.rates import DeviceRates, RoundProbes, batch_rows, measure_rates, roofline_rows, routing_rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """What a sweep measures: input sizes (tokens, BOS and chat template included), new tokens per request
    (exactly this many; EOS ignored), timed repeats per cell, and the durations that lengthen or bound them
    (seconds of timed requests per cell; `timed_more`: each decode loop's repeats count on their own). The decode
    loops each cell is timed with (`DECODE_LOOP_CHOICES`: host, device or both, in that order), and the device
    loop's `block` (steps per device call; None: all the tokens after the first in one). `batches`: the batch
    sizes of `--batch` (each input size is measured at each, `cells`); () (no --batch): one sequence per request,
    rows without batch fields, exactly the sweep before batches existed. `order` (`ORDERS`): "interleaved" (every
    cell's warm-ups first, then timed repeat r of every cell and loop before repeat r + 1 of any; `bench sweep`'s
    default in process, `DEFAULT_ORDER`) or "sequential" (each cell's requests together, cell after cell: this
    record's default, what every caller that names no order got before interleaving, and `--target`'s);
    docs/method.md, "Interleaving". `step_logits`: record each B = 1 cell's per-step summary after its timed
    repeats (`model.engine.Engine.step_summary`: one more program per cell; False: `--no-step-logits`)."""

    inputs: tuple[int, ...]
    max_new_tokens: int = 64
    repeats: int = 3
    min_duration_s: float = 0.0
    max_duration_s: float | None = None
    decode_loops: tuple[str, ...] = ("host",)
    block: int | None = None
    batches: tuple[int, ...] = ()
    order: str = "sequential"
    step_logits: bool = True  # record each B = 1 cell's per-step summary (bench/runs/logits.py); untimed

    @property
    def cells(self) -> list[tuple[int, int]]:
        """The (input tokens, batch) of every cell, in order: each input size, then each batch of `batches` (1
        without --batch)."""
        return [(n, b) for n in self.inputs for b in (self.batches or (1,))]

    def timed_more(self, done: int, spent_s: float) -> bool:
        """Whether a cell with `done` timed repeats taking `spent_s` seconds (the sum of their whole-request times)
        needs another: until it has `repeats` and `min_duration_s` seconds, whichever takes longer (as
        optimum-benchmark's iterations and duration); but never past `max_duration_s` (an upper bound that wins,
        once the cell has one repeat)."""
        if self.max_duration_s is not None and done >= 1 and spent_s >= self.max_duration_s:
            return False
        return done < self.repeats or spent_s < self.min_duration_s

    def check(self) -> None:
        """Raises InputError (one line) for a value out of range."""
        if not self.inputs:
            raise InputError("--inputs: expected a comma-separated list of token counts, e.g. 41,521,2057,3593")
        bad = [n for n in self.inputs if n < 1]
        if bad:
            raise InputError(f"--inputs {bad[0]}: input sizes must be positive token counts, e.g. --inputs 41,521")
        if self.max_new_tokens < 2:
            raise InputError(f"--max-new-tokens {self.max_new_tokens}: must be at least 2 (the gauge needs 2 tokens)")
        if self.repeats < 1:
            raise InputError(f"--repeats {self.repeats}: must be at least 1 timed repeat per cell")
        if not 0 <= self.min_duration_s < float("inf"):
            raise InputError(f"--min-duration {self.min_duration_s:g}: expected seconds >= 0, e.g. --min-duration 10")
        if self.max_duration_s is not None and not 0 < self.max_duration_s < float("inf"):
            raise InputError(f"--max-duration {self.max_duration_s:g}: expected seconds > 0, e.g. --max-duration 600")
        if self.max_duration_s is not None and self.max_duration_s < self.min_duration_s:
            raise InputError(f"--max-duration {self.max_duration_s:g} is below --min-duration {self.min_duration_s:g}; "
                             "the bound must allow the minimum")  # fmt: skip
        if self.decode_loops not in DECODE_LOOP_CHOICES.values():
            raise InputError(f"--decode-loop: loops {self.decode_loops} are not one of host, device, both")
        if self.block is not None and (self.block < 1 or "device" not in self.decode_loops):
            raise InputError(f"--decode-block {self.block}: expected steps >= 1 with --decode-loop device or both")
        bad_batch = [b for b in self.batches if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if bad_batch or len(set(self.batches)) != len(self.batches):
            raise InputError(f"--batch {','.join(map(str, self.batches))}: expected distinct whole numbers of rows "
                             ">= 1, e.g. --batch 1,4,16,64")  # fmt: skip
        parse_order(self.order)


ORDERS = ("interleaved", "sequential")
"""`--order` values (docs/method.md, "Interleaving")."""
DEFAULT_ORDER = "interleaved"
"""`bench sweep`'s default `--order` in process. A `--target` sweep's default is "sequential": the server's cells
in the order its earlier runs measured them (`--order interleaved` interleaves them too)."""
ORDER_NOTE = "order"
"""The run manifest's workload note that says which order a sweep's requests ran in (`record_order`); a run that
records none ran in the sequential order (sweeps before interleaving)."""


def parse_order(text: str) -> str:
    """'interleaved' | 'sequential' (any case) -> the order (`ORDERS`). Raises InputError (one line) otherwise."""
    order = text.strip().lower() if isinstance(text, str) else text
    if order not in ORDERS:
        raise InputError(f"--order {text!r}: expected interleaved (repeats round-robin across the cells) "
                         "or sequential (each cell's repeats together), e.g. --order sequential")  # fmt: skip
    return order


def recorded_order(run: RunFolder) -> str:
    """The order `run`'s requests ran in: its workload note `ORDER_NOTE`, or "sequential" for a run that records
    none (sweeps before interleaving)."""
    return run.typed_manifest.workload.notes.get(ORDER_NOTE) or "sequential"


def resumed_order(run: RunFolder, given: str | None) -> str:
    """With --resume: the order of `run` when `--order` is not given (`given` None); a given one that differs from
    the run's is an InputError (one line: both orders, the fix). A run keeps one order: its rounds and probes
    (docs/method.md, "Interleaving") mean nothing across a change."""
    ran = recorded_order(run)
    if given is not None and parse_order(given) != ran:
        raise InputError(f"--order {given} differs from the resumed run's {ran}; drop the flag to continue "
                         f"{run.path} as it started")  # fmt: skip
    return ran


def record_order(run: RunFolder, order: str) -> None:
    """Write `order` into `run`'s workload notes (`ORDER_NOTE`, in the manifest's engine_config), unless it is
    there; a run that holds samples under another order is an InputError (`resumed_order`)."""
    if run.samples():
        resumed_order(run, order)
    config = dict(run.manifest.get("engine_config") or {})
    if config.get(ORDER_NOTE) != order:
        run.update_manifest(engine_config={**config, ORDER_NOTE: order})


DECODE_LOOP_CHOICES = {"host": ("host",), "device": ("device",), "both": ("host", "device")}
"""`--decode-loop` values and the loops each times a cell with, in order."""


def parse_decode_loop(text: str) -> tuple[str, ...]:
    """'host' | 'device' | 'both' -> the loops (`DECODE_LOOP_CHOICES`). Raises InputError (one line) otherwise."""
    loops = DECODE_LOOP_CHOICES.get(text.strip().lower())
    if loops is None:
        raise InputError(f"--decode-loop {text!r}: expected host (per-step times), device (one sync per block) or "
                         "both (the host overhead per step), e.g. --decode-loop both")  # fmt: skip
    return loops


def parse_inputs(text: str) -> tuple[int, ...]:
    """'41,521,2057' -> (41, 521, 2057). Raises InputError for a non-numeric, zero or negative size."""
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise InputError(f"--inputs {text!r}: empty entry; expected comma-separated token counts, e.g. 41,521")
        try:
            n = int(part)
        except ValueError:
            raise InputError(f"--inputs {text}: {part!r} is not a whole number of tokens (e.g. --inputs 41,521)") from None
        if n < 1:
            raise InputError(f"--inputs {text}: {n} is not a positive token count (e.g. --inputs 41,521)")
        sizes.append(n)
    if not sizes:
        raise InputError(f"--inputs {text!r}: expected a comma-separated list of token counts, e.g. 41,521,2057,3593")
    return tuple(dict.fromkeys(sizes))  # unique, in the given order


def parse_batches(text: str) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16), in the given order. Raises InputError (one line: what was received, what is
    expected) for an empty entry, a value that is not a whole number, one below 1, or a batch given twice."""
    sizes: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            b = int(part)
        except ValueError:
            raise InputError(f"--batch {text}: {part!r} is not a whole number of rows; expected comma-separated "
                             "batch sizes >= 1, e.g. --batch 1,4,16,64") from None  # fmt: skip
        if b < 1:
            raise InputError(f"--batch {text}: {b} is not a batch size (at least 1 row); expected e.g. --batch 1,4,16,64")
        if b in sizes:
            raise InputError(f"--batch {text}: batch {b} is given twice; expected each batch size once, e.g. --batch 1,4,16")
        sizes.append(b)
    return tuple(sizes)


def build_batch_prompts(engine, config: SweepConfig) -> dict[tuple[int, int], tuple[Prompt, ...]]:
    """The rows' prompts of every cell with B > 1: {(n, B): B different prompts of exactly n tokens}
    (`row_prompts`; row 0 is the B = 1 cell's prompt, and the rows of a smaller batch are the first rows of a
    larger one). Raises InputError (no tokenizer; too few distinct prompts of a tiny size, naming --batch)."""
    if engine.tokenizer is None:
        raise InputError("the checkpoint has no tokenizer.json: benchmark prompts are natural text sized with it; "
                         "pass a --checkpoint that has one")  # fmt: skip
    out = {}
    for n in config.inputs:
        largest = max(config.batches or (1,))
        if largest > 1:
            rows = tuple(row_prompts(engine.tokenizer, n, largest))
            out.update({(n, b): rows[:b] for b in config.batches if b > 1})
    return out


def check_batches(engine, config: SweepConfig) -> None:
    """Every cell's batch against the device's memory (`Engine.check_batch`: the KV cache of B rows beside the
    weights), before anything is timed. Raises the engine's EngineError (one line: the arithmetic, the largest
    batch that fits, the flags that lower it) for the first cell that does not fit."""
    for n, b in config.cells:
        if b > 1:
            engine.check_batch(b, n, config.max_new_tokens)


def build_prompts(engine, config: SweepConfig, *, flag: str = "--inputs") -> dict[int, Prompt]:
    """The exact-size prompt of every cell, checked: each fits a bucket and tokenizes to exactly its size.
    Raises InputError (no tokenizer, or a size below the smallest chat prompt, naming `flag`) or the engine's
    EngineError (above the maximum length, naming the flag that raises it). `bench profile` builds its prompt
    here too (flag "--input-tokens"), so a profile at n tokens runs the sweep cell's prompt."""
    if engine.tokenizer is None:
        raise InputError("the checkpoint has no tokenizer.json: benchmark prompts are natural text sized with it; "
                         "pass a --checkpoint that has one")  # fmt: skip
    prompts = {}
    for n in config.inputs:
        engine.check_request(n, config.max_new_tokens)
        prompts[n] = sized_prompt(engine.tokenizer, n, flag=flag)
    return prompts


def sized_prompt(tokenizer, n: int, *, flag: str = "--inputs") -> Prompt:
    """`bench.measure.prompts.exact_prompt(tokenizer, n)`, checked: InputError naming `flag` (the value, the minimum, the
    fix) for a size below the smallest chat prompt, or when the prompt does not come out at exactly n tokens."""
    minimum = min_prompt_tokens(tokenizer)
    if n < minimum:
        raise InputError(f"{flag} {n}: below the smallest possible prompt, {minimum} tokens (BOS + chat template "
                         f"+ 1 content token); pass {flag} {minimum} or more")  # fmt: skip
    p = exact_prompt(tokenizer, n)
    if len(p.ids) != n:
        raise InputError(f"prompt for {n} input tokens came out at {len(p.ids)} tokens")
    return p


class StopSignals:
    """SIGTERM and Ctrl-C (SIGINT) as a request to stop a sweep cleanly; the object is the `should_stop` predicate
    that `sweep_cells` polls before every request (in-process and `--target` sweeps alike).

    While entered (`with stop:`), the first signal only sets the flag and says so through `notify`: the request
    in flight finishes, the sweep stops before the next one (the cell in progress kept as a partial cell), and the
    caller marks the run incomplete. A second signal ends the process at once, exit code 130
    (`bench.signals.stop_now`: the run marked incomplete on the way out, the request in flight dropped; its
    cell's earlier samples are in the run and `--resume` completes it). It never raises KeyboardInterrupt: a
    handler runs inside whatever Python code runs, e.g. jax's garbage-collection callback, which would swallow
    it. Every delivery is also counted on a thread (`bench.signals.deliveries_counted`), so two signals during a
    native call (a compile, a long prefill), which the Python handler would see as one and only once the call
    returns, end the process at once too. Leaving
    restores the previous handlers. Outside the main thread (where Python cannot install handlers) nothing is
    installed and only `request()` sets the flag.
    """

    MESSAGE = "stopping after the current request (signal again to stop now)"
    HARD_STOP = "stopped at once (a second stop signal); the run is marked incomplete, --resume continues it"

    def __init__(self, notify: Callable[[str], None] = lambda _: None):
        self.received: list[int] = []  # signal numbers, in arrival order
        self._delivered = 0  # stop signals delivered while entered (the counting thread's count)
        self._notify = notify

    def __call__(self) -> bool:
        return bool(self.received)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask the sweep to stop, as the first signal does."""
        self.received.append(signum)
        self._notify(self.MESSAGE)

    def _on_signal(self, signum, _frame) -> None:
        if self.received or self._delivered >= 2:  # the second signal, or two that arrived as one (native code)
            stop_now(self.HARD_STOP)
        self.request(signum)

    def _on_delivery(self, signum: int, count: int) -> None:
        """On the counting thread (`bench.signals.deliveries_counted`): the second delivery ends the process at
        once, even while the main thread is inside a native call (a long prefill) that would hold its handler back
        and fold both signals into one. While another handler is in force (a run folder's must-finish write holds
        the signals, `bench.runs.folder`), it only counts: the held signals reach `_on_signal` after the write."""
        self._delivered = count
        if count >= 2 and signal.getsignal(signum) == self._on_signal:
            stop_now(self.HARD_STOP)

    def __enter__(self) -> StopSignals:
        self._delivered = 0
        self._handled = contextlib.ExitStack()
        self._handled.enter_context(stop_signals_handled(self._on_signal))
        self._handled.enter_context(deliveries_counted(self._on_delivery))
        return self

    def __exit__(self, *_exc) -> None:
        self._handled.close()


Progress = Callable[[str], None]


def run_sweep(engine, config: SweepConfig, run: RunFolder, *, progress: Progress = lambda _: None,
              skip: Sequence[int | tuple[int, int]] = (), should_stop: Callable[[], bool] = lambda: False,
              prompts: dict[int, Prompt] | None = None, rates: DeviceRates | None = None,
              batch_prompts: dict[tuple[int, int], tuple[Prompt, ...]] | None = None) -> list[CellRow]:  # fmt: skip
    """Measure every cell not in `skip` into `run` with the in-process engine; returns the rows measured now.

    `prompts` (from `build_prompts`) and, with `config.batches`, `batch_prompts` (`build_batch_prompts`; every
    batch checked to fit first, `check_batches`) are built here when not given. `rates` (the device's measured
    rates, `bench.sweep.rates.measure_rates`) give every row its roofline fields (`bench.sweep.rates.with_rooflines`);
    None leaves them out. In the interleaved order (`SweepConfig.order`), with `rates`, the rate probes run before
    the first round and after each (`bench.sweep.rates.RoundProbes`): each cell's shares use the probes around its
    repeats, and a sweep that was not stopped ends with the host's movement against the cells' spread (a line,
    and a warning line when the host moved more; docs/method.md, "Interleaving"). Every sweep that was not stopped
    ends with its cells' rerun intervals (`bench.runs.agreement.state`: recorded in the manifest, and lines). A
    `--batch` sweep's rows get their batch figures (`bench.sweep.rates.batch_rows`: FLOPs per step, arithmetic
    intensity) and `rows_differ` (module docstring). The rest is `sweep_cells`.
    """
    if prompts is None:  # callers that already built (and so checked) them pass them in
        config.check()
        prompts = build_prompts(engine, config)
    if batch_prompts is None and any(b > 1 for b in config.batches):
        check_batches(engine, config)
        batch_prompts = build_batch_prompts(engine, config)

    def measure(work: Prompt | tuple[Prompt, ...], kind: str, repeat: int) -> Measured:
        loop = next((k for k, kinds in LOOP_KINDS.items() if kind in kinds), config.decode_loops[0])  # cold: the first
        block = config.block if loop == "device" else None
        if isinstance(work, Prompt):  # one sequence: the engine path of a sweep without --batch
            return measure_request(engine, work, config.max_new_tokens, kind=kind, repeat=repeat, decode_loop=loop,
                                   block=block)  # fmt: skip
        return measure_batch_request(engine, work, config.max_new_tokens, kind=kind, repeat=repeat,
                                     decode_loop=loop, block=block)  # fmt: skip

    probes = None
    if rates is not None and config.order == "interleaved":  # probes between rounds: each cell's own rates
        probes = RoundProbes(run, lambda: measure_rates(engine.policy.compute_dtype), rates, log=progress)
    finishers = [f for f in (routing_rows(engine) if engine.cfg.has_experts else None,
                             roofline_rows(engine, rates, config.max_new_tokens, probes=probes) if rates else None,
                             batch_rows(engine, config.max_new_tokens) if config.batches else None) if f is not None]

    def finish(row: CellRow) -> CellRow:
        for f in finishers:
            row = f(row)
        return row

    rows = sweep_cells(config, run, prompts, measure=measure, progress=progress, skip=skip, should_stop=should_stop,
                       finish_row=finish if finishers else None,
                       cell_logits=lambda prompt: engine.next_token_logits(prompt.ids, config.max_new_tokens),
                       cell_steps=(lambda prompt, ids: engine.step_summary(prompt.ids, ids)) if config.step_logits
                       else None,
                       batch_prompts=batch_prompts, probe=probes,
                       row_reference=lambda prompt: engine.generate(list(prompt.ids), config.max_new_tokens).token_ids,
                       )  # fmt: skip
    _end_lines(run, rows, probes, progress)
    return rows


def _end_lines(run: RunFolder, rows: list[CellRow], probes, progress: Progress) -> None:
    """A sweep's closing lines: with round probes, how far the host moved against the cells' spread (and a warning
    where it moved more); when it was not stopped, each cell's rerun interval with its measured sources
    (docs/method.md, "Interleaving" and "Rerun intervals")."""
    if probes is not None:
        lines, warning = probes.finish(rows)
        for line in lines + ([warning] if warning else []):
            progress(line)
    if rows:
        for line in state_rerun_intervals(run):
            progress(line)


Probe = Callable[..., None]
"""An interleaved sweep's rate probe (`bench.sweep.rates.RoundProbes`): called before the first round (0, []),
after each round r with the cells ((input tokens, batch)) that measured a timed repeat in it, and once more after
the last round with `last=True` (r the last round, no cells): the probe decides which calls it measures at."""


def sweep_cells(config: SweepConfig, run: RunFolder, prompts: dict[int, Prompt], *,
                measure: Callable[[Prompt, str, int], Measured], progress: Progress = lambda _: None,
                skip: Sequence[int | tuple[int, int]] = (), should_stop: Callable[[], bool] = lambda: False,
                after_cell: Callable[[int, CellRow], str] | None = None,
                finish_row: Callable[[CellRow], CellRow] | None = None,
                cell_logits: Callable[[Prompt], Sequence[float]] | None = None,
                cell_steps: Callable[[Prompt, list[int]], tuple] | None = None,
                batch_prompts: dict[tuple[int, int], tuple[Prompt, ...]] | None = None,
                row_reference: Callable[[Prompt], list[int]] | None = None,
                probe: Probe | None = None) -> list[CellRow]:  # fmt: skip
    """The order of work of every sweep (in-process or through a server; docs/method.md, "Interleaving"): the
    first request of the sweep is recorded as `cold` ("cold-resume" when the run already holds its cold start: a
    resumed run's fresh engine); each cell has one `warmup` per decode loop and its timed requests
    (`config.timed_more` says when to stop: `repeats`, the durations). `config.order` "sequential": cell after
    cell, each loop's warm-up then its timed repeats. "interleaved": every cell's cold / warm-up requests first,
    then rounds: round r times repeat r of every (cell, loop) that lacks it and needs one, in cell order, before
    any takes repeat r + 1 (a resumed cell joins at the repeat it lacks); `probe` runs before the first round and
    after each. `measure(prompt, kind, repeat)` returns the Sample and the bucket the request ran at. Every
    sample is appended to `run` as it is measured; a cell's summary row (`CellRow`, whose bucket is the one its
    requests reported, never recomputed) as the cell ends: after its own repeats (sequential), after the last
    round (interleaved). The order is recorded in the manifest (`record_order`; InputError when `run` holds
    samples of another order).

    Cells are `config.cells` ((input tokens, batch)) not in `skip` (input sizes: their B = 1 cells; or (n, B)
    keys). A B > 1 cell (`config.batches`) measures `batch_prompts[(n, B)]`: `measure` then gets that tuple of
    prompts instead of one prompt, and its row gets `batch` (`summarize_cell(batch=...)`); with
    `row_reference(prompt)` (the prompt's greedy ids at B = 1, untimed) its rows are compared with B = 1 after
    its timed repeats: `rows_differ` (a B = 1 cell's own tokens serve as the reference of its prompt).

    A cell of `run` that is partial ("interrupted") or has samples but no row (a kill) is completed: its timed
    repeats continue from the number it has (after this engine's warm-up), and its row summarises them all.
    `should_stop` is polled before every request: when it turns true the sweep raises KeyboardInterrupt there,
    after writing every cell in progress as a partial row ("interrupted"), so every measured request stays.
    Exceptions other than KeyboardInterrupt inside a cell are recorded as a failed cell (with the bucket of any
    request of the cell that came back), and the sweep goes on. `after_cell(n, row)` may add text to the cell's
    log line; `finish_row(row)` completes each measured (or partial) row before it is written (the in-process
    sweep's roofline fields); `cell_logits(prompt)` (float32 [V], the prompt's next-token logits) is recorded for
    every cell that did not fail, untimed, before its row (`bench.runs.logits`; one file per input size: a B = 1
    cell's, else the first cell's of that size); `cell_steps(prompt, ids)` ((ids [S, 2], values [S, 2]): the
    per-step summary of the greedy ids of the cell's first timed repeat, `model.engine.Engine.step_summary`)
    likewise, for B = 1 cells (`bench.runs.logits.write_step_summary`). The caller marks the run complete /
    incomplete.
    """
    record_order(run, config.order)
    earlier, buckets = _earlier_samples(run), {cell_key(r): r.bucket for r in run.cells()}
    cold_kind = "cold-resume" if any(s.kind == "cold" for ss in earlier.values() for s in ss) else "cold"
    t0 = time.perf_counter()
    skipped = {(k, 1) if isinstance(k, int) else tuple(k) for k in skip}
    todo = [key for key in config.cells if key not in skipped]
    cells = [_Cell(config, run, n, prompts[n] if b == 1 else batch_prompts[(n, b)], measure, earlier.get((n, b), []),
                   earlier_bucket=buckets.get((n, b)), where=f"cell {index}/{len(todo)}", should_stop=should_stop,
                   progress=lambda line: progress(f"{line} [{time.perf_counter() - t0:.1f} s]"),
                   finish_row=finish_row, batch=b if config.batches else None)
             for index, (n, b) in enumerate(todo, 1)]  # fmt: skip
    end = _cell_end(config, run, prompts, _references(earlier, prompts) if config.batches else {},
                    after_cell=after_cell, cell_logits=cell_logits, cell_steps=cell_steps,
                    row_reference=row_reference)  # fmt: skip
    if config.order == "sequential":
        return _sequential(cells, cold_kind, end)
    return _interleaved(cells, cold_kind, end, probe or (lambda *_args, **_kw: None))


def _sequential(cells: list[_Cell], cold_kind: str | None, end: Callable[[_Cell], CellRow]) -> list[CellRow]:
    """Cell after cell: each one's requests (the cold one in the first cell that gets that far), then its end."""
    rows = []
    for cell in cells:
        try:
            cell.attempt(lambda: cell.measure_all(cold_kind))  # noqa: B023 -- called at once
        except KeyboardInterrupt:
            cell.write_partial()
            raise
        finally:
            cold_kind = None if cell.cold_done else cold_kind  # the next cell does it if this one failed first
        rows.append(end(cell))
    return rows


def _interleaved(cells: list[_Cell], cold_kind: str | None, end: Callable[[_Cell], CellRow],
                 probe: Probe) -> list[CellRow]:  # fmt: skip
    """Every cell's cold / warm-up requests, the probe, then the rounds (`_rounds`), each followed by the probe;
    then every cell's end, in cell order. A stop writes every cell as it stands (partial, or failed)."""
    try:
        for cell in cells:
            try:
                cell.attempt(lambda: cell.warm_all(cold_kind))  # noqa: B023 -- called at once
            finally:
                cold_kind = None if cell.cold_done else cold_kind
        probe(0, [])
        number = 0
        for number, slots in enumerate(_rounds(cells), 1):
            for cell, loop in slots:
                cell.attempt(lambda: cell.timed_one(loop))  # noqa: B023 -- called at once
            probe(number, list(dict.fromkeys(cell.key for cell, _loop in slots)))
        probe(number, [], last=True)
    except KeyboardInterrupt:
        for cell in cells:
            cell.write_partial()
        raise
    return [end(cell) for cell in cells]


def _rounds(cells: list[_Cell]) -> Iterator[list[tuple[_Cell, str]]]:
    """The interleaved rounds, each computed when the one before it has run: the (cell, loop) slots, in cell and
    loop order, whose timed repeats are the fewest among the slots that still need one (`_Cell.more`), so that
    repeat r of every slot comes before repeat r + 1 of any (a resumed slot catches up first). Failed cells have
    none."""
    while True:
        due = [(c, loop) for c in cells if c.failure is None for loop in c.config.decode_loops if c.more(loop)]
        if not due:
            return
        level = min(c.done(loop) for c, loop in due)
        yield [(c, loop) for c, loop in due if c.done(loop) == level]


def _cell_end(config: SweepConfig, run: RunFolder, prompts: dict[int, Prompt], references: dict[tuple, list[int]], *,
              after_cell, cell_logits, row_reference, cell_steps=None) -> Callable[[_Cell], CellRow]:  # fmt: skip
    """The end of a cell (`sweep_cells`' hooks): its row (or its failure), the rows compared with B = 1, its
    next-token logits, the row written and its log line. Untimed: after the cell's requests."""

    def end(cell: _Cell) -> CellRow:
        row, (n, b) = cell.final_row(), cell.key
        if config.batches and row_reference is not None and row.error is None:
            try:
                row = cell.compare_rows(row, references, row_reference)
            except Exception as exc:  # noqa: BLE001 -- the cell is measured: a failed comparison must not lose it
                run.log(f"{cell.label()}: rows not compared with B = 1 ({type(exc).__name__}: {exc})"[:500])
        if cell_logits is not None and row.error is None and (b == 1 or not logits_path(run.path, n).exists()):
            cell.say("recording its logits (untimed; compiles once per cell)")
            try:
                write_logits(run.path, n, cell_logits(prompts[n]))
            except Exception as exc:  # noqa: BLE001 -- the cell is measured: a failed record must not lose it
                run.log(f"{cell.label()}: next-token logits not recorded ({type(exc).__name__}: {exc})"[:500])
        ids = _first_timed_ids(cell) if cell_steps is not None and row.error is None and b == 1 else None
        if ids:
            try:
                write_step_summary(run.path, n, *cell_steps(prompts[n], ids))
            except Exception as exc:  # noqa: BLE001 -- the cell is measured: a failed record must not lose it
                run.log(f"{cell.label()}: per-step logits not recorded ({type(exc).__name__}: {exc})"[:500])
        run.append_cell(row)
        extra = after_cell(n, row) if after_cell else ""
        batch = "" if row.batch is None else (f", aggregate {row.aggregate_tok_s_median} tok/s"
                                              + (f", rows differing from B = 1: {row.rows_differ}" if b > 1 else ""))
        run.log(f"{cell.label()}: {'valid' if row.valid else 'INVALID: ' + str(row.invalid_reason)}; "
                f"gauge {row.gauge_tok_s_median} tok/s, e2e {row.e2e_tok_s_median} tok/s{batch}{extra}")  # fmt: skip
        return row

    return end


def _first_timed_ids(cell: _Cell) -> list[int] | None:
    """The greedy ids of the cell's first timed repeat (host loop, else device loop), as
    `bench.report.accuracy.first_timed_ids` compares them; None without one."""
    for kind in ("timed", "timed-device"):
        firsts = sorted((s for s in cell.timed(kind) if s.token_ids), key=lambda s: s.repeat)
        if firsts:
            return list(firsts[0].token_ids)
    return None


def _earlier_samples(run: RunFolder) -> dict[tuple[int, int], list[Sample]]:
    """The samples `run` holds already (a resumed run), by cell ((input tokens, batch), `cell_key`)."""
    out: dict[tuple[int, int], list[Sample]] = {}
    for s in run.samples():
        out.setdefault(cell_key(s), []).append(s)
    return out


def _references(earlier: dict[tuple[int, int], list[Sample]], prompts: dict[int, Prompt]) -> dict[tuple, list[int]]:
    """{prompt ids: greedy ids at B = 1} known from a resumed run's B = 1 cells (their first timed host-loop
    repeat), the start of the sweep's reference cache."""
    out = {}
    for (n, b), samples in earlier.items():
        timed = [s for s in samples if s.kind == "timed"]
        if b == 1 and n in prompts and timed:
            out[prompts[n].ids] = list(min(timed, key=lambda s: s.repeat).token_ids)
    return out


class _Cell:
    """One cell's requests, in order: an optional cold one, the warm-up, the timed ones; each sample written to the
    run as it comes back. `earlier` are the cell's samples from before a resume (their timed repeats continue),
    `earlier_bucket` the bucket its earlier (partial) row recorded. `prompt` is the cell's prompt, or its rows'
    prompts (a tuple) for a batch cell; `batch` its B in a `--batch` sweep (None without --batch)."""

    def __init__(self, config: SweepConfig, run: RunFolder, n: int, prompt: Prompt | tuple[Prompt, ...], measure,
                 earlier: list[Sample], *, earlier_bucket: int | None, where: str, progress: Progress,
                 should_stop: Callable[[], bool], finish_row: Callable[[CellRow], CellRow] | None = None,
                 batch: int | None = None):  # fmt: skip
        self.config, self.run, self.n, self.prompt, self._measure = config, run, n, prompt, measure
        self.batch = batch
        self.samples = list(earlier)
        self.ran: list[int | None] = [earlier_bucket] if earlier_bucket is not None else []  # buckets as reported
        self.cold_done = False
        self.failure: CellRow | None = None  # the failed row, once a request of the cell raised
        self._estimated: dict[str, bool] = {}  # per loop: whether its time estimate was made (`_estimate`)
        self.where, self._progress = where, progress
        self._should_stop = agreed_stop(should_stop)  # several jax processes: all stop at the same request
        self._finish = finish_row or (lambda row: row)

    def known(self) -> int | None:
        """The cell's bucket once one of its requests reported it."""
        return next((b for b in self.ran if b is not None), None)

    def label(self) -> str:
        rows = f" x {self.batch} rows" if self.batch is not None else ""
        return f"{self.where}: {self.n} input tokens{rows}" + (f" (bucket {self.known()})" if self.known() else "")

    def timed(self, kind: str = "timed") -> list[Sample]:
        return [s for s in self.samples if s.kind == kind]

    def say(self, what: str) -> None:
        """One progress line about this cell: its label, then `what`."""
        self._progress(f"{self.label()}: {what}")

    def one(self, kind: str, repeat: int, what: str) -> Sample:
        if self._should_stop():
            raise KeyboardInterrupt
        self.say(what)
        measured = self._measure(self.prompt, kind, repeat)
        self.run.append_samples([measured.sample])  # as measured: a stop or a kill keeps it
        self.samples.append(measured.sample)
        self.ran.append(measured.bucket)
        return measured.sample

    @property
    def key(self) -> tuple[int, int]:
        """(input tokens, batch): the cell's key (`cell_key`)."""
        return self.n, self.batch or 1

    def attempt(self, work: Callable[[], object]) -> bool:
        """Run `work` (requests of this cell) unless the cell has failed; an exception other than KeyboardInterrupt
        fails the cell (`failure`: its row, with the bucket of any request that came back; a FAILED progress
        line). True when `work` ran to its end."""
        if self.failure is not None:
            return False
        try:
            work()
            return True
        except Exception as exc:  # one failing cell (e.g. out of memory) must not lose the others
            self._fail(exc)
            return False

    def _fail(self, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        self.say(f"FAILED ({message})")
        self.failure = failed_cell(self.n, message, bucket=self.known(), max_new_tokens=self.config.max_new_tokens,
                                   repeats=self.config.repeats, batch=self.batch)  # fmt: skip

    def final_row(self) -> CellRow:
        """The cell's row once its requests are done (`row`), or its failure: a row that cannot be summarised (e.g.
        its requests reported two buckets) fails the cell."""
        if self.failure is None:
            try:
                return self.row()
            except Exception as exc:  # noqa: BLE001 -- one cell's bad record must not lose the others
                self._fail(exc)
        return self.failure

    def measure_all(self, cold_kind: str | None) -> None:
        """The sequential order: the cold request (when `cold_kind` is given), then per loop its warm-up and its
        timed repeats."""
        self._cold(cold_kind)
        for loop in self.config.decode_loops:
            self.warm(loop)
            while self.more(loop):
                self.timed_one(loop)

    def warm_all(self, cold_kind: str | None) -> None:
        """The interleaved order's first phase for this cell: the cold request (when `cold_kind` is given), then
        every loop's warm-up at its compiled shape."""
        self._cold(cold_kind)
        for loop in self.config.decode_loops:
            self.warm(loop)

    def _cold(self, cold_kind: str | None) -> None:
        if cold_kind is not None:
            self.one(cold_kind, 0, COLD_NOTES[cold_kind])
            self.cold_done = True

    def _what(self, loop: str) -> str:
        return "" if self.config.decode_loops == ("host",) else f"{loop} loop "

    def done(self, loop: str) -> int:
        """Timed repeats of `loop` so far (those measured before a resume included)."""
        return len(self.timed(LOOP_KINDS[loop][1]))

    def more(self, loop: str) -> bool:
        """Whether `loop` needs another timed repeat (`SweepConfig.timed_more`); with durations (decided by this
        process's clock) process 0's decision in every process (`bench.sweep.processes.first_process`)."""
        kind = LOOP_KINDS[loop][1]
        more = self.config.timed_more(self.done(loop), _timed_s(self.timed(kind)))
        timed_by_clock = self.config.min_duration_s > 0 or self.config.max_duration_s is not None
        return first_process(more) if timed_by_clock else more

    def warm(self, loop: str) -> None:
        """One decode loop's warm-up at its compiled shape (and, for a resumed cell, a line saying how many timed
        repeats it continues from)."""
        warmup, kind = LOOP_KINDS[loop]
        what = self._what(loop)
        shape = f"({self.known() or 'its bucket'}, {self.config.max_new_tokens}" + (f", {loop} loop)" if what else ")")
        if self.done(loop):
            self._progress(f"{self.label()}: continuing its {self.done(loop)} {what}timed repeat(s) measured before "
                           "the resume")  # fmt: skip
        self._estimated[loop] = self._estimate(self.one(warmup, 0, f"warm-up at {shape}"), kind, self._what(loop))

    def timed_one(self, loop: str) -> None:
        """The next timed repeat of `loop` (its number continues those measured before a resume)."""
        kind, what, r = LOOP_KINDS[loop][1], self._what(loop), self.done(loop)
        sample = self.one(kind, r, f"{what}repeat {r + 1}/{self.config.repeats}")
        self._estimated[loop] = self._estimated.get(loop) or self._estimate(sample, kind, what)

    def row(self) -> CellRow:
        """The cell's row once its requests are done: partial ("max-duration", with a line saying so) when
        `--max-duration` stopped a loop before its planned repeats."""
        short = [loop for loop in self.config.decode_loops if self.done(loop) < self.config.repeats]
        for loop in short:
            self._progress(f"{self.label()}: --max-duration {self.config.max_duration_s:g} s reached after "
                           f"{self.done(loop)} of {self.config.repeats} {self._what(loop)}timed repeats; the cell is "
                           "kept as partial")  # fmt: skip
        return self._row("max-duration" if short else None)

    def _estimate(self, sample: Sample, kind: str, what: str) -> bool:
        """Say how long the cell's remaining timed repeats should take when that is long (`needs_estimate`), from
        `sample`'s time; False when `sample` compiled (its time is mostly compilation: the next request's is the
        estimate, e.g. a warm-up that the compilation cache could not serve), else True (estimated)."""
        if sample.compile_events:
            return False
        if needs_estimate(self.config, sample.e2e_ms, self.timed(kind)):
            self.say(f"{what}{estimate_line(self.config, sample.e2e_ms, self.timed(kind))}")
        return True

    def _row(self, stopped_by: str | None) -> CellRow:
        row = summarize_cell(self.samples, max_new_tokens=self.config.max_new_tokens, bucket=_one_bucket(self.ran),
                             input_tokens=self.n, stopped_by=stopped_by, repeats_planned=self.config.repeats,
                             batch=self.batch)  # fmt: skip
        return self._finish(with_spreads(row))

    def compare_rows(self, row: CellRow, references: dict[tuple, list[int]],
                     reference: Callable[[Prompt], list[int]]) -> CellRow:  # fmt: skip
        """The cell's `row` with `rows_differ`: how many rows' greedy ids, in any timed repeat, differ from their
        prompt's ids at B = 1 (`references`, a cache by prompt ids, filled by `reference(prompt)`, untimed, for a
        prompt it lacks; a B = 1 cell fills it with its own tokens). Logs which rows differ and where."""
        prompts = self.prompt if isinstance(self.prompt, tuple) else (self.prompt,)
        timed = [s for s in self.samples if s.kind in ("timed", "timed-device")]
        rows = [s.row_token_ids or [s.token_ids] for s in timed]
        if len(prompts) == 1 and timed:  # B = 1: this cell's tokens are its prompt's reference
            references.setdefault(prompts[0].ids, list(min(timed, key=lambda s: (s.kind, s.repeat)).token_ids))
        missing = [p for p in prompts if p.ids not in references]
        if missing:
            self._progress(f"{self.label()}: {len(missing)} row prompt(s) alone at B = 1 (untimed: each row's "
                           "reference tokens)")  # fmt: skip
        for p in missing:
            references[p.ids] = list(reference(p))
        differ: dict[int, int] = {}  # row -> the first generated position where it differs, over the repeats
        for b, p in enumerate(prompts):
            firsts = [_first_difference(ids[b], references[p.ids]) for ids in rows]
            if any(i is not None for i in firsts):
                differ[b] = min(i for i in firsts if i is not None)
        if differ:
            where = ", ".join(f"row {b} from token {i}" for b, i in differ.items())
            self.run.log(f"{self.label()}: {len(differ)} of {len(prompts)} rows differ from B = 1 ({where})")
        return dataclasses.replace(row, rows_differ=len(differ))

    def write_partial(self) -> None:
        """After a stop: the cell's row as partial ("interrupted"), when any of its requests came back (its
        samples are in the run already; `--resume` completes it), or its failure row where it failed."""
        if self.failure is not None:
            self.run.append_cell(self.failure)
        elif self.samples:
            self.run.append_cell(self._row("interrupted"))
            loops = self.config.decode_loops
            done = " and ".join(f"{len(self.timed(LOOP_KINDS[loop][1]))} of {self.config.repeats}"
                                + ("" if loops == ("host",) else f" {loop}-loop") for loop in loops)  # fmt: skip
            self.run.log(f"{self.label()}: stopped after {done} timed repeats; kept as a partial cell (--resume "
                         "completes it)")  # fmt: skip


COLD_NOTES = {
    "cold": "cold first request (compiles, or restores from the compilation cache)",
    "cold-resume": "cold first request of the resumed run's fresh engine (kept apart: not the run's cold start)",
}


def _timed_s(timed: list[Sample]) -> float:
    """Seconds of timed requests of a cell so far (the sum of their whole-request times): what the durations of
    `SweepConfig` count, the same before and after a resume."""
    return sum(s.e2e_ms for s in timed) / 1000.0


ESTIMATE_NOTE_S = 60.0
"""A cell whose timed requests are estimated to take longer than this gets a line saying how long, and the bound."""


def estimated_s(config: SweepConfig, request_ms: float, timed: list[Sample]) -> float:
    """Seconds the remaining timed requests of a cell should take, from one request's time (`request_ms`, the
    whole-request time of its latest request that compiled nothing): the remaining repeats, at least
    `min_duration_s`, at most `max_duration_s`."""
    spent = _timed_s(timed)
    need = max((config.repeats - len(timed)) * request_ms / 1000.0, config.min_duration_s - spent, 0.0)
    return need if config.max_duration_s is None else min(need, max(config.max_duration_s - spent, 0.0))


def needs_estimate(config: SweepConfig, request_ms: float, timed: list[Sample]) -> bool:
    """True when the remaining timed requests of a cell should take longer than `ESTIMATE_NOTE_S`."""
    return estimated_s(config, request_ms, timed) > ESTIMATE_NOTE_S


def estimate_line(config: SweepConfig, request_ms: float, timed: list[Sample]) -> str:
    """"N timed repeats at about X ms each: about H:MM:SS" and the bound that applies (or how to set one)."""
    seconds = estimated_s(config, request_ms, timed)
    clock = f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"
    bound = (f"bounded by --max-duration {config.max_duration_s:g} s" if config.max_duration_s is not None else
             "no bound: --max-duration SECONDS sets one; Ctrl-C stops and keeps every measured repeat")  # fmt: skip
    left = config.repeats - len(timed)
    each = f"at about {request_ms:,.0f} ms each (the last request's time)"
    return f"{left} timed repeat(s) {each}: about {clock} ({bound})"


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two id lists differ (the shorter one's length when one is a prefix of the other);
    None when they are equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _one_bucket(ran: list[int | None]) -> int | None:
    """The bucket of a cell from its requests' reports: one value (or None where none was reported). Requests of
    one input size run at one compiled shape; two different reports are an internal error (RuntimeError)."""
    known = set(b for b in ran if b is not None)
    if len(known) > 1:
        raise RuntimeError(f"one cell's requests ran at buckets {sorted(known)}: the engine padded one size two ways")
    return known.pop() if known else None
