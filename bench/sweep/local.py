"""`bench sweep`: cells of exact input sizes, each warmed up at its compiled shape, then timed repeats.

Order of work (docs/method.md "Per cell"):
1. every prompt is built and its exact token count checked before anything is measured;
2. the first request of the fresh engine is recorded separately as `cold` (it compiles, or restores from the
   persistent compilation cache, the programs of the first shape);
3. per cell: one warm-up request at the exact compiled shape (bucket, max_new_tokens), then `repeats` timed ones;
   per decode loop of `SweepConfig.decode_loops`, in order (host, then device: each loop its own warm-up at its
   compiled shape (bucket, max_new_tokens, loop, block) and its own timed repeats, kinds `LOOP_KINDS`);
4. the cell's samples and summary row are written to the run folder as soon as the cell ends (atomically), so an
   interrupted sweep keeps every finished cell; a cell that fails (e.g. out of memory) is recorded as failed and
   the sweep goes on.

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
from collections.abc import Callable, Sequence

from bench.errors import InputError
from bench.measure.prompts import Prompt, exact_prompt, min_prompt_tokens, row_prompts
from bench.measure.request import Measured, measure_batch_request, measure_request
from bench.runs import RunFolder
from bench.runs.logits import logits_path, write_logits
from bench.runs.records import LOOP_KINDS, CellRow, Sample, cell_key, failed_cell, summarize_cell
from bench.signals import deliveries_counted, stop_now, stop_signals_handled
from bench.sweep.rates import DeviceRates, batch_rows, roofline_rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """What a sweep measures: input sizes (tokens, BOS and chat template included), new tokens per request
    (exactly this many; EOS ignored), timed repeats per cell, and the durations that lengthen or bound them
    (seconds of timed requests per cell; `timed_more`: each decode loop's repeats count on their own). The decode
    loops each cell is timed with (`DECODE_LOOP_CHOICES`: host, device or both, in that order), and the device
    loop's `block` (steps per device call; None: all the tokens after the first in one). `batches`: the batch
    sizes of `--batch` (each input size is measured at each, `cells`); () (no --batch): one sequence per request,
    rows without batch fields, exactly the sweep before batches existed."""

    inputs: tuple[int, ...]
    max_new_tokens: int = 64
    repeats: int = 3
    min_duration_s: float = 0.0
    max_duration_s: float | None = None
    decode_loops: tuple[str, ...] = ("host",)
    block: int | None = None
    batches: tuple[int, ...] = ()

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
    None leaves them out. A `--batch` sweep's rows get their batch figures (`bench.sweep.rates.batch_rows`: FLOPs
    per step, arithmetic intensity) and `rows_differ` (module docstring). The rest is `sweep_cells`.
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

    finishers = [f for f in (roofline_rows(engine, rates, config.max_new_tokens) if rates is not None else None,
                             batch_rows(engine, config.max_new_tokens) if config.batches else None) if f is not None]

    def finish(row: CellRow) -> CellRow:
        for f in finishers:
            row = f(row)
        return row

    return sweep_cells(config, run, prompts, measure=measure, progress=progress, skip=skip, should_stop=should_stop,
                       finish_row=finish if finishers else None,
                       cell_logits=lambda prompt: engine.next_token_logits(prompt.ids, config.max_new_tokens),
                       batch_prompts=batch_prompts,
                       row_reference=lambda prompt: engine.generate(list(prompt.ids), config.max_new_tokens).token_ids,
                       )  # fmt: skip


def sweep_cells(config: SweepConfig, run: RunFolder, prompts: dict[int, Prompt], *,
                measure: Callable[[Prompt, str, int], Measured], progress: Progress = lambda _: None,
                skip: Sequence[int | tuple[int, int]] = (), should_stop: Callable[[], bool] = lambda: False,
                after_cell: Callable[[int, CellRow], str] | None = None,
                finish_row: Callable[[CellRow], CellRow] | None = None,
                cell_logits: Callable[[Prompt], Sequence[float]] | None = None,
                batch_prompts: dict[tuple[int, int], tuple[Prompt, ...]] | None = None,
                row_reference: Callable[[Prompt], list[int]] | None = None) -> list[CellRow]:  # fmt: skip
    """The order of work of every sweep (in-process or through a server): the first request of the sweep is
    recorded as `cold` ("cold-resume" when the run already holds its cold start: a resumed run's fresh engine);
    then per cell one `warmup` and the timed requests (`config.timed_more` says when to stop: `repeats`, the
    durations); `measure(prompt, kind, repeat)` returns the Sample and the bucket the request ran at. Every
    sample is appended to `run` as it is measured; as the cell ends, its summary row (`CellRow`, whose bucket is
    the one its requests reported, never recomputed).

    Cells are `config.cells` ((input tokens, batch)) not in `skip` (input sizes: their B = 1 cells; or (n, B)
    keys). A B > 1 cell (`config.batches`) measures `batch_prompts[(n, B)]`: `measure` then gets that tuple of
    prompts instead of one prompt, and its row gets `batch` (`summarize_cell(batch=...)`); with
    `row_reference(prompt)` (the prompt's greedy ids at B = 1, untimed) its rows are compared with B = 1 after
    its timed repeats: `rows_differ` (a B = 1 cell's own tokens serve as the reference of its prompt).

    A cell of `run` that is partial ("interrupted") or has samples but no row (a kill) is completed: its timed
    repeats continue from the number it has (after this engine's warm-up), and its row summarises them all.
    `should_stop` is polled before every request (a signal handler sets it): when it turns true the sweep
    raises KeyboardInterrupt there, after writing the cell in progress as a partial row ("interrupted"), so
    every measured request stays. Exceptions other than KeyboardInterrupt inside a cell are recorded as a failed
    cell (with the bucket of any request of the cell that came back), and the sweep goes on. `after_cell(n,
    row)` may add text to the cell's log line; `finish_row(row)` completes each measured (or partial) row before it
    is written (the in-process sweep's roofline fields); `cell_logits(prompt)` (the in-process sweep's: float32 [V],
    the prompt's next-token logits) is recorded for every cell that did not fail, after its timed repeats and
    before its row (`bench.runs.logits`; one file per input size: a B = 1 cell's, else the first cell's of that
    size, row 0's prompt being the B = 1 prompt). The caller marks the run complete / incomplete.
    """
    rows: list[CellRow] = []
    earlier, buckets = _earlier_samples(run), {cell_key(r): r.bucket for r in run.cells()}
    cold_kind: str | None = "cold-resume" if any(s.kind == "cold" for ss in earlier.values() for s in ss) else "cold"
    t0 = time.perf_counter()
    skipped = {(k, 1) if isinstance(k, int) else tuple(k) for k in skip}
    todo = [key for key in config.cells if key not in skipped]
    references = _references(earlier, prompts) if config.batches else {}  # prompt ids -> greedy ids at B = 1
    for index, (n, b) in enumerate(todo, 1):
        work = prompts[n] if b == 1 else batch_prompts[(n, b)]
        cell = _Cell(config, run, n, work, measure, earlier.get((n, b), []), earlier_bucket=buckets.get((n, b)),
                     where=f"cell {index}/{len(todo)}", should_stop=should_stop, finish_row=finish_row,
                     progress=lambda line: progress(f"{line} [{time.perf_counter() - t0:.1f} s]"),
                     batch=b if config.batches else None)  # fmt: skip
        try:
            try:
                row = cell.measure_all(cold_kind)
            finally:
                cold_kind = None if cell.cold_done else cold_kind  # the next cell does it if this one failed first
            if config.batches and row_reference is not None:  # untimed: after the cell's requests
                try:
                    row = cell.compare_rows(row, references, row_reference)
                except Exception as exc:  # noqa: BLE001 -- the cell is measured: a failed comparison must not lose it
                    run.log(f"{cell.label()}: rows not compared with B = 1 ({type(exc).__name__}: {exc})"[:500])
        except KeyboardInterrupt:
            cell.write_partial()
            raise
        except Exception as exc:  # one failing cell (e.g. out of memory) must not lose the others
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            progress(f"{cell.label()}: FAILED ({message})")
            row = failed_cell(n, message, bucket=cell.known(), max_new_tokens=config.max_new_tokens,
                              repeats=config.repeats, batch=b if config.batches else None)  # fmt: skip
        if cell_logits is not None and row.error is None and (b == 1 or not logits_path(run.path, n).exists()):
            try:  # not timed: after the cell's requests, before its row
                write_logits(run.path, n, cell_logits(prompts[n]))
            except Exception as exc:  # noqa: BLE001 -- the cell is measured: a failed record must not lose it
                run.log(f"{cell.label()}: next-token logits not recorded ({type(exc).__name__}: {exc})"[:500])
        run.append_cell(row)
        extra = after_cell(n, row) if after_cell else ""
        batch = "" if row.batch is None else (f", aggregate {row.aggregate_tok_s_median} tok/s"
                                              + (f", rows differing from B = 1: {row.rows_differ}" if b > 1 else ""))
        run.log(f"{cell.label()}: {'valid' if row.valid else 'INVALID: ' + str(row.invalid_reason)}; "
                f"gauge {row.gauge_tok_s_median} tok/s, e2e {row.e2e_tok_s_median} tok/s{batch}{extra}")  # fmt: skip
        rows.append(row)
    return rows


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
        self.where, self._progress, self._should_stop = where, progress, should_stop
        self._finish = finish_row or (lambda row: row)

    def known(self) -> int | None:
        """The cell's bucket once one of its requests reported it."""
        return next((b for b in self.ran if b is not None), None)

    def label(self) -> str:
        rows = f" x {self.batch} rows" if self.batch is not None else ""
        return f"{self.where}: {self.n} input tokens{rows}" + (f" (bucket {self.known()})" if self.known() else "")

    def timed(self, kind: str = "timed") -> list[Sample]:
        return [s for s in self.samples if s.kind == kind]

    def one(self, kind: str, repeat: int, what: str) -> Sample:
        if self._should_stop():
            raise KeyboardInterrupt
        self._progress(f"{self.label()}: {what}")
        measured = self._measure(self.prompt, kind, repeat)
        self.run.append_samples([measured.sample])  # as measured: a stop or a kill keeps it
        self.samples.append(measured.sample)
        self.ran.append(measured.bucket)
        return measured.sample

    def measure_all(self, cold_kind: str | None) -> CellRow:
        """The cell's requests (the cold one first when `cold_kind` is given), then its row."""
        if cold_kind is not None:
            self.one(cold_kind, 0, COLD_NOTES[cold_kind])
            self.cold_done = True
        bounded = [self._loop(loop) for loop in self.config.decode_loops]
        return self._row("max-duration" if any(bounded) else None)

    def _loop(self, loop: str) -> bool:
        """One decode loop's warm-up and timed repeats (continuing those measured before a resume); True when
        `--max-duration` stopped them before the planned repeats."""
        config = self.config
        warmup, kind = LOOP_KINDS[loop]
        what = "" if config.decode_loops == ("host",) else f"{loop} loop "
        shape = f"({self.known() or 'its bucket'}, {config.max_new_tokens}" + (f", {loop} loop)" if what else ")")
        done = len(self.timed(kind))
        if done:
            self._progress(f"{self.label()}: continuing its {done} {what}timed repeat(s) measured before the resume")
        estimated = self._estimate(self.one(warmup, 0, f"warm-up at {shape}"), kind, what)
        r = done
        while config.timed_more(r, _timed_s(self.timed(kind))):
            sample = self.one(kind, r, f"{what}repeat {r + 1}/{config.repeats}")
            estimated = estimated or self._estimate(sample, kind, what)
            r += 1
        if r < config.repeats:
            self._progress(f"{self.label()}: --max-duration {config.max_duration_s:g} s reached after {r} of "
                           f"{config.repeats} {what}timed repeats; the cell is kept as partial")  # fmt: skip
        return r < config.repeats

    def _estimate(self, sample: Sample, kind: str, what: str) -> bool:
        """Say how long the cell's remaining timed repeats should take when that is long (`needs_estimate`), from
        `sample`'s time; False when `sample` compiled (its time is mostly compilation: the next request's is the
        estimate, e.g. a warm-up that the compilation cache could not serve), else True (estimated)."""
        if sample.compile_events:
            return False
        if needs_estimate(self.config, sample.e2e_ms, self.timed(kind)):
            self._progress(f"{self.label()}: {what}{estimate_line(self.config, sample.e2e_ms, self.timed(kind))}")
        return True

    def _row(self, stopped_by: str | None) -> CellRow:
        row = summarize_cell(self.samples, max_new_tokens=self.config.max_new_tokens, bucket=_one_bucket(self.ran),
                             input_tokens=self.n, stopped_by=stopped_by, repeats_planned=self.config.repeats,
                             batch=self.batch)  # fmt: skip
        return self._finish(row)

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
        samples are in the run already); `--resume` completes it."""
        if self.samples:
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
