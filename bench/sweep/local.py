"""`bench sweep`: cells of exact input sizes, each warmed up at its compiled shape, then timed repeats.

Order of work (../shared/measurement.md "Per cell"):
1. every prompt is built and its exact token count checked before anything is measured;
2. the first request of the fresh engine is recorded separately as `cold` (it compiles, or restores from the
   persistent compilation cache, the programs of the first shape);
3. per cell: one warm-up request at the exact compiled shape (bucket, max_new_tokens), then `repeats` timed ones;
   per decode loop of `SweepConfig.decode_loops`, in order (host, then device: each loop its own warm-up at its
   compiled shape (bucket, max_new_tokens, loop, block) and its own timed repeats, kinds `LOOP_KINDS`);
4. the cell's samples and summary row are written to the run folder as soon as the cell ends (atomically), so an
   interrupted sweep keeps every finished cell; a cell that fails (e.g. out of memory) is recorded as failed and
   the sweep goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Callable, Sequence

from bench.errors import InputError
from bench.measure.prompts import Prompt, exact_prompt, min_prompt_tokens
from bench.measure.request import Measured, measure_request
from bench.runs import RunFolder
from bench.runs.logits import write_logits
from bench.runs.records import LOOP_KINDS, CellRow, Sample, failed_cell, summarize_cell
from bench.signals import stop_now, stop_signals_handled
from bench.sweep.rates import DeviceRates, roofline_rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """What a sweep measures: input sizes (tokens, BOS and chat template included), new tokens per request
    (exactly this many; EOS ignored), timed repeats per cell, and the durations that lengthen or bound them
    (seconds of timed requests per cell; `timed_more`: each decode loop's repeats count on their own). The decode
    loops each cell is timed with (`DECODE_LOOP_CHOICES`: host, device or both, in that order), and the device
    loop's `block` (steps per device call; None: all the tokens after the first in one)."""

    inputs: tuple[int, ...]
    max_new_tokens: int = 64
    repeats: int = 3
    min_duration_s: float = 0.0
    max_duration_s: float | None = None
    decode_loops: tuple[str, ...] = ("host",)
    block: int | None = None

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
    it. A signal that arrives during a compile (native code) is handled when the compile returns. Leaving
    restores the previous handlers. Outside the main thread (where Python cannot install handlers) nothing is
    installed and only `request()` sets the flag.
    """

    MESSAGE = "stopping after the current request (signal again to stop now)"
    HARD_STOP = "stopped at once (a second stop signal); the run is marked incomplete, --resume continues it"

    def __init__(self, notify: Callable[[str], None] = lambda _: None):
        self.received: list[int] = []  # signal numbers, in arrival order
        self._notify = notify

    def __call__(self) -> bool:
        return bool(self.received)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask the sweep to stop, as the first signal does."""
        self.received.append(signum)
        self._notify(self.MESSAGE)

    def _on_signal(self, signum, _frame) -> None:
        if self.received:
            stop_now(self.HARD_STOP)
        self.request(signum)

    def __enter__(self) -> StopSignals:
        self._handled = contextlib.ExitStack()
        self._handled.enter_context(stop_signals_handled(self._on_signal))
        return self

    def __exit__(self, *_exc) -> None:
        self._handled.close()


Progress = Callable[[str], None]


def run_sweep(engine, config: SweepConfig, run: RunFolder, *, progress: Progress = lambda _: None,
              skip: Sequence[int] = (), should_stop: Callable[[], bool] = lambda: False,
              prompts: dict[int, Prompt] | None = None, rates: DeviceRates | None = None) -> list[CellRow]:  # fmt: skip
    """Measure every cell not in `skip` into `run` with the in-process engine; returns the rows measured now.

    `prompts` (from `build_prompts`) are built here when not given. `rates` (the device's measured rates,
    `bench.sweep.rates.measure_rates`) give every row its roofline fields (`bench.sweep.rates.with_rooflines`);
    None leaves them out. The rest is `sweep_cells`.
    """
    if prompts is None:  # callers that already built (and so checked) them pass them in
        config.check()
        prompts = build_prompts(engine, config)

    def measure(prompt: Prompt, kind: str, repeat: int) -> Measured:
        loop = next((k for k, kinds in LOOP_KINDS.items() if kind in kinds), config.decode_loops[0])  # cold: the first
        return measure_request(engine, prompt, config.max_new_tokens, kind=kind, repeat=repeat, decode_loop=loop,
                               block=config.block if loop == "device" else None)  # fmt: skip

    finish = roofline_rows(engine, rates, config.max_new_tokens) if rates is not None else None
    return sweep_cells(config, run, prompts, measure=measure, progress=progress, skip=skip, should_stop=should_stop,
                       finish_row=finish,
                       cell_logits=lambda prompt: engine.next_token_logits(prompt.ids, config.max_new_tokens))  # fmt: skip


def sweep_cells(config: SweepConfig, run: RunFolder, prompts: dict[int, Prompt], *,
                measure: Callable[[Prompt, str, int], Measured], progress: Progress = lambda _: None,
                skip: Sequence[int] = (), should_stop: Callable[[], bool] = lambda: False,
                after_cell: Callable[[int, CellRow], str] | None = None,
                finish_row: Callable[[CellRow], CellRow] | None = None,
                cell_logits: Callable[[Prompt], Sequence[float]] | None = None) -> list[CellRow]:  # fmt: skip
    """The order of work of every sweep (in-process or through a server): the first request of the sweep is
    recorded as `cold` ("cold-resume" when the run already holds its cold start: a resumed run's fresh engine);
    then per cell one `warmup` and the timed requests (`config.timed_more` says when to stop: `repeats`, the
    durations); `measure(prompt, kind, repeat)` returns the Sample and the bucket the request ran at. Every
    sample is appended to `run` as it is measured; as the cell ends, its summary row (`CellRow`, whose bucket is
    the one its requests reported, never recomputed).

    A cell of `run` that is partial ("interrupted") or has samples but no row (a kill) is completed: its timed
    repeats continue from the number it has (after this engine's warm-up), and its row summarises them all.
    `should_stop` is polled before every request (a signal handler sets it): when it turns true the sweep
    raises KeyboardInterrupt there, after writing the cell in progress as a partial row ("interrupted"), so
    every measured request stays. Exceptions other than KeyboardInterrupt inside a cell are recorded as a failed
    cell (with the bucket of any request of the cell that came back), and the sweep goes on. `after_cell(n,
    row)` may add text to the cell's log line; `finish_row(row)` completes each measured (or partial) row before it
    is written (the in-process sweep's roofline fields); `cell_logits(prompt)` (the in-process sweep's: float32 [V],
    the prompt's next-token logits) is recorded for every cell that did not fail, after its timed repeats and
    before its row (`bench.runs.logits`). The caller marks the run complete / incomplete.
    """
    rows: list[CellRow] = []
    earlier, buckets = _earlier_samples(run), {r.input_tokens: r.bucket for r in run.cells()}
    cold_kind: str | None = "cold-resume" if any(s.kind == "cold" for ss in earlier.values() for s in ss) else "cold"
    t0 = time.perf_counter()
    todo = [n for n in config.inputs if n not in set(skip)]
    for index, n in enumerate(todo, 1):
        cell = _Cell(config, run, n, prompts[n], measure, earlier.get(n, []), earlier_bucket=buckets.get(n),
                     where=f"cell {index}/{len(todo)}", should_stop=should_stop, finish_row=finish_row,
                     progress=lambda line: progress(f"{line} [{time.perf_counter() - t0:.1f} s]"))  # fmt: skip
        try:
            try:
                row = cell.measure_all(cold_kind)
            finally:
                cold_kind = None if cell.cold_done else cold_kind  # the next cell does it if this one failed first
        except KeyboardInterrupt:
            cell.write_partial()
            raise
        except Exception as exc:  # one failing cell (e.g. out of memory) must not lose the others
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            progress(f"{cell.label()}: FAILED ({message})")
            row = failed_cell(n, message, bucket=cell.known(), max_new_tokens=config.max_new_tokens,
                              repeats=config.repeats)  # fmt: skip
        if cell_logits is not None and row.error is None:  # not timed: after the cell's requests, before its row
            try:
                write_logits(run.path, n, cell_logits(prompts[n]))
            except Exception as exc:  # noqa: BLE001 -- the cell is measured: a failed record must not lose it
                run.log(f"{cell.label()}: next-token logits not recorded ({type(exc).__name__}: {exc})"[:500])
        run.append_cell(row)
        extra = after_cell(n, row) if after_cell else ""
        run.log(f"{cell.label()}: {'valid' if row.valid else 'INVALID: ' + str(row.invalid_reason)}; "
                f"gauge {row.gauge_tok_s_median} tok/s, e2e {row.e2e_tok_s_median} tok/s{extra}")  # fmt: skip
        rows.append(row)
    return rows


def _earlier_samples(run: RunFolder) -> dict[int, list[Sample]]:
    """The samples `run` holds already (a resumed run), by input size."""
    out: dict[int, list[Sample]] = {}
    for s in run.samples():
        out.setdefault(s.input_tokens, []).append(s)
    return out


class _Cell:
    """One cell's requests, in order: an optional cold one, the warm-up, the timed ones; each sample written to the
    run as it comes back. `earlier` are the cell's samples from before a resume (their timed repeats continue),
    `earlier_bucket` the bucket its earlier (partial) row recorded."""

    def __init__(self, config: SweepConfig, run: RunFolder, n: int, prompt: Prompt, measure, earlier: list[Sample],
                 *, earlier_bucket: int | None, where: str, progress: Progress,
                 should_stop: Callable[[], bool], finish_row: Callable[[CellRow], CellRow] | None = None):  # fmt: skip
        self.config, self.run, self.n, self.prompt, self._measure = config, run, n, prompt, measure
        self.samples = list(earlier)
        self.ran: list[int | None] = [earlier_bucket] if earlier_bucket is not None else []  # buckets as reported
        self.cold_done = False
        self.where, self._progress, self._should_stop = where, progress, should_stop
        self._finish = finish_row or (lambda row: row)

    def known(self) -> int | None:
        """The cell's bucket once one of its requests reported it."""
        return next((b for b in self.ran if b is not None), None)

    def label(self) -> str:
        return f"{self.where}: {self.n} input tokens" + (f" (bucket {self.known()})" if self.known() else "")

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
        warm = self.one(warmup, 0, f"warm-up at {shape}")
        if needs_estimate(config, warm.e2e_ms, self.timed(kind)):
            self._progress(f"{self.label()}: {what}{estimate_line(config, warm.e2e_ms, self.timed(kind))}")
        r = done
        while config.timed_more(r, _timed_s(self.timed(kind))):
            self.one(kind, r, f"{what}repeat {r + 1}/{config.repeats}")
            r += 1
        if r < config.repeats:
            self._progress(f"{self.label()}: --max-duration {config.max_duration_s:g} s reached after {r} of "
                           f"{config.repeats} {what}timed repeats; the cell is kept as partial")  # fmt: skip
        return r < config.repeats

    def _row(self, stopped_by: str | None) -> CellRow:
        row = summarize_cell(self.samples, max_new_tokens=self.config.max_new_tokens, bucket=_one_bucket(self.ran),
                             input_tokens=self.n, stopped_by=stopped_by, repeats_planned=self.config.repeats)  # fmt: skip
        return self._finish(row)

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
    warm-up's whole-request time): the remaining repeats, at least `min_duration_s`, at most `max_duration_s`."""
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
    return f"{left} timed repeat(s) at about {request_ms:,.0f} ms each (the warm-up's time): about {clock} ({bound})"


def _one_bucket(ran: list[int | None]) -> int | None:
    """The bucket of a cell from its requests' reports: one value (or None where none was reported). Requests of
    one input size run at one compiled shape; two different reports are an internal error (RuntimeError)."""
    known = set(b for b in ran if b is not None)
    if len(known) > 1:
        raise RuntimeError(f"one cell's requests ran at buckets {sorted(known)}: the engine padded one size two ways")
    return known.pop() if known else None
