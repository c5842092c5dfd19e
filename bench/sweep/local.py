"""`bench sweep`: cells of exact input sizes, each warmed up at its compiled shape, then timed repeats.

Order of work (../shared/measurement.md "Per cell"):
1. every prompt is built and its exact token count checked before anything is measured;
2. the first request of the fresh engine is recorded separately as `cold` (it compiles, or restores from the
   persistent compilation cache, the programs of the first shape);
3. per cell: one warm-up request at the exact compiled shape (bucket, max_new_tokens), then `repeats` timed ones;
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
from bench.runs.records import CellRow, Sample, failed_cell, summarize_cell
from bench.signals import stop_signals_handled


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """What a sweep measures: input sizes (tokens, BOS and chat template included), new tokens per request
    (exactly this many; EOS ignored), timed repeats per cell."""

    inputs: tuple[int, ...]
    max_new_tokens: int = 64
    repeats: int = 3

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
    in flight finishes, the sweep stops before the next one, finished cells stay and the caller marks the run
    incomplete. A second signal raises KeyboardInterrupt at once (the request in flight is abandoned; its cell is
    dropped whole). Raising on the first signal is avoided because it could be swallowed if it lands inside a
    garbage-collection callback. Leaving restores the previous handlers. Outside the main thread (where Python
    cannot install handlers) nothing is installed and only `request()` sets the flag.
    """

    MESSAGE = "stopping after the current request (signal again to stop now)"

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
            raise KeyboardInterrupt
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
              prompts: dict[int, Prompt] | None = None) -> list[CellRow]:  # fmt: skip
    """Measure every cell not in `skip` into `run` with the in-process engine; returns the rows measured now.

    `prompts` (from `build_prompts`) are built here when not given. The rest is `sweep_cells`.
    """
    if prompts is None:  # callers that already built (and so checked) them pass them in
        config.check()
        prompts = build_prompts(engine, config)

    def measure(prompt: Prompt, kind: str, repeat: int) -> Measured:
        return measure_request(engine, prompt, config.max_new_tokens, kind=kind, repeat=repeat)

    return sweep_cells(config, run, prompts, measure=measure, progress=progress, skip=skip, should_stop=should_stop)


def sweep_cells(config: SweepConfig, run: RunFolder, prompts: dict[int, Prompt], *,
                measure: Callable[[Prompt, str, int], Measured], progress: Progress = lambda _: None,
                skip: Sequence[int] = (), should_stop: Callable[[], bool] = lambda: False,
                after_cell: Callable[[int, CellRow], str] | None = None) -> list[CellRow]:  # fmt: skip
    """The order of work of every sweep (in-process or through a server): the first request of the sweep is
    recorded as `cold`; then per cell one `warmup` and `config.repeats` `timed` requests (`measure(prompt, kind,
    repeat)` returns the Sample and the bucket the request ran at), summarised into a CellRow whose bucket is the
    one its timed requests ran (as reported, never recomputed); samples then row are written to `run` as the
    cell ends.

    `should_stop` is polled before every request (a signal handler sets it): when it turns true the sweep raises
    KeyboardInterrupt there, so the cell in progress is dropped whole and every finished cell stays.
    Exceptions other than KeyboardInterrupt inside a cell are recorded as a failed cell (with the bucket of any
    request of the cell that came back), and the sweep goes on. `after_cell(n, row)` may add text to the cell's
    log line. The caller marks the run complete / incomplete.
    """
    rows: list[CellRow] = []
    cold_done = False
    t0 = time.perf_counter()
    todo = [n for n in config.inputs if n not in set(skip)]
    for index, n in enumerate(todo, 1):
        samples: list[Sample] = []
        ran: list[int | None] = []  # the bucket of each request of this cell, as reported

        def known() -> int | None:  # the bucket once a request of this cell reported it
            return next((b for b in ran if b is not None), None)

        def where() -> str:
            return f"cell {index}/{len(todo)}: {n} input tokens" + (f" (bucket {known()})" if known() else "")

        def one(kind: str, repeat: int, what: str) -> None:
            if should_stop():
                raise KeyboardInterrupt
            progress(f"{where()}: {what} [{time.perf_counter() - t0:.1f} s]")
            measured = measure(prompts[n], kind, repeat)
            samples.append(measured.sample)
            ran.append(measured.bucket)

        try:
            if not cold_done:
                one("cold", 0, "cold first request (compiles, or restores from the compilation cache)")
                cold_done = True
            one("warmup", 0, f"warm-up at ({known() or 'its bucket'}, {config.max_new_tokens})")
            for r in range(config.repeats):
                one("timed", r, f"repeat {r + 1}/{config.repeats}")
            bucket = _one_bucket(ran)
            row = summarize_cell(samples, max_new_tokens=config.max_new_tokens, bucket=bucket, input_tokens=n)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one failing cell (e.g. out of memory) must not lose the others
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            progress(f"{where()}: FAILED ({message})")
            row = failed_cell(n, message, bucket=known(), max_new_tokens=config.max_new_tokens, repeats=config.repeats)
        run.append_samples(samples)
        run.append_cell(row)
        extra = after_cell(n, row) if after_cell else ""
        run.log(f"{where()}: {'valid' if row.valid else 'INVALID: ' + str(row.invalid_reason)}; "
                f"gauge {row.gauge_tok_s_median} tok/s, e2e {row.e2e_tok_s_median} tok/s{extra}")  # fmt: skip
        rows.append(row)
    return rows


def _one_bucket(ran: list[int | None]) -> int | None:
    """The bucket of a cell from its requests' reports: one value (or None where none was reported). Requests of
    one input size run at one compiled shape; two different reports are an internal error (RuntimeError)."""
    known = set(b for b in ran if b is not None)
    if len(known) > 1:
        raise RuntimeError(f"one cell's requests ran at buckets {sorted(known)}: the engine padded one size two ways")
    return known.pop() if known else None
