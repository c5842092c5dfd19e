"""`bench sweep`: the main job. Prints the sweep table and leaves a named run folder in runs/."""

from __future__ import annotations

from pathlib import Path

import typer

from bench.cli.root import app
from bench.cli.common import API_KEY_ENV, CheckpointOpt, CompileCacheOpt, setup_logging
from bench.cli.engine_options import EngineFlags, engine_options
from bench.sweep.command import DEFAULT_DECODE_LOOP


def sweep_table(rows, columns=None, width: int | None = None) -> "rich.table.Table":  # noqa: F821
    """The printed sweep table (one row per input size), from the run's cell rows and the one column list
    (`bench.runs.columns.table_columns`: headers, digits and dashes are the gpu-run summary's and the report's; the
    device-loop columns where a row has them), or `columns` (a subset of it: `fit_columns`). Cells fold: in a
    terminal narrower than the table each column wraps its text onto more lines rather than cutting it. With
    `width` (characters, at least `table_width`), each column gets its width from `column_widths`: no word breaks."""
    from rich.table import Table

    from bench.runs.columns import table_columns, text_rows

    columns = table_columns(rows) if columns is None else columns
    table = Table(title="sweep (medians of timed repeats)")
    widths = column_widths(columns, rows, width) if width is not None else [None] * len(columns)
    for col, w in zip(columns, widths, strict=True):  # a narrow terminal wraps, never cuts
        table.add_column(col.table_header, justify=col.align, overflow="fold", width=w)
    for line in text_rows(columns, rows):
        table.add_row(*line)
    return table


def _leave_out_first():
    """The sweep table's columns in the order a narrow terminal leaves them out (`fit_columns`): the ratios and
    counts first, then the rooflines, the batch figures after the aggregate and the step, the bucket and the
    request time. Never left out: input tokens, batch, the gauges (either loop's), TTFT, TPOT, aggregate tok/s, step
    ms, device-loop ms/step and valid: the figures the sweep is read for."""
    from bench.runs import columns as c

    return (c.COLD_WARM_TTFT, c.COLD_WARM_REQUEST, c.DEVICE_REPEATS, c.ROWS_DIFFER, c.HOST_OVERHEAD,
            c.PREFILL_MATMUL_SHARE, c.DEVICE_ROOFLINE_SHARE, c.INTENSITY, c.BYTES_PER_STEP, c.STEP_P99,
            c.ROOFLINE_SHARE, c.BUCKET, c.E2E)  # fmt: skip


def table_width(columns, rows) -> int:
    """Characters the sweep table of `columns` over `rows` needs so that no word breaks, of a header or a cell
    (a header may wrap at its spaces onto a second line, never inside a word): each column as wide as its longest
    word, plus rich's box (a border and one space either side of every column: 3 per column, and 1)."""
    return sum(word_widths(columns, rows)) + 3 * len(columns) + 1


def column_widths(columns, rows, width: int) -> list[int]:
    """Each column's width in a table of `width` characters (at least `table_width`; rich's own layout shrinks
    columns in proportion and breaks words): its longest word, then, column by column from the left, what the
    space left gives towards its widest text (its header on one line, its cells unwrapped)."""
    from bench.runs.columns import text_rows

    texts = text_rows(columns, rows)
    widths = word_widths(columns, rows)
    room = width - table_width(columns, rows)
    for i, col in enumerate(columns):
        want = max([len(col.table_header)] + [len(line[i]) for line in texts])
        give = max(0, min(room, want - widths[i]))
        widths[i], room = widths[i] + give, room - give
    return widths


def word_widths(columns, rows) -> list[int]:
    """Each column's longest word (characters), of its header or of its text in any of `rows`."""
    from bench.runs.columns import text_rows

    texts = text_rows(columns, rows)
    return [max(len(w) for w in (col.table_header.split() + [w for line in texts for w in line[i].split()]))
            for i, col in enumerate(columns)]  # fmt: skip


def fit_columns(columns, rows, width: int) -> tuple[tuple, tuple]:
    """(shown, left out): `columns` less those of `_leave_out_first`, in its order, until the table fits `width`
    characters (`table_width`), or none of them is left; the order of the shown columns is kept. Every column
    left out is in the run's cells.csv (`bench.runs.folder`: every CellRow field)."""
    shown, left = list(columns), []
    for col in _leave_out_first():
        if table_width(shown, rows) <= width:
            break
        if col in shown:
            shown.remove(col)
            left.append(col)
    return tuple(shown), tuple(left)


def knee_lines(cells) -> list[str]:
    """The lines printed under a `--batch` sweep's table: what the knee is (`bench.measure.batches`), then one line
    per input size (`Knee.line`); [] for a sweep without --batch."""
    from bench.measure.batches import KNEE_FRACTION, knees

    found = knees(cells)
    if not found:
        return []
    head = (f"knee: the smallest batch whose median decode step exceeds B = 1's by more than {100 * KNEE_FRACTION:.0f}% "
            "(docs/method.md, Batches); beyond it decode is no longer bound by reading the weights")  # fmt: skip
    return [head, *(f"  {k.line}" for k in found)]


InputsOpt = typer.Option(None, "--inputs", help="Comma-separated exact input sizes (tokens). Default 41,521,2057,3593 "
                         "(with --resume: the run's).")  # fmt: skip
MaxNewTokensOpt = typer.Option(None, "--max-new-tokens", help="Tokens generated per request (EOS ignored). Default 64 "
                               "(with --resume: the run's).")  # fmt: skip
RepeatsOpt = typer.Option(None, "--repeats", help="Timed repeats per cell after one warm-up. Default 3 (with --resume: "
                          "the run's).")  # fmt: skip
MinDurationOpt = typer.Option(
    None, "--min-duration", help="Seconds of timed requests per cell at least: timed repeats go on until both "
    "--repeats and this are reached, whichever takes longer. Default 0 (with --resume: the run's).")
MaxDurationOpt = typer.Option(
    None, "--max-duration", help="Seconds of timed requests per cell at most: a cell that reaches it stops there "
    "(at least 1 repeat) and is kept as partial. Default: no bound (with --resume: the run's).")
NameOpt = typer.Option(
    None, "--name", help="Run label: the folder is runs/<date>-<label>-<device>/ (default 'sweep', suffixed -2, -3, "
    "... when taken; an explicit label that is taken is an error).")
RunsDirOpt = typer.Option(Path("runs"), "--runs-dir", help="Where run folders are archived.")
ResumeOpt = typer.Option(None, "--resume", help="Continue an interrupted run: a folder, a run name in --runs-dir (as "
                         "`bench runs list` prints it), or 'latest'. The options not given take the run's; one given "
                         "otherwise is refused, every difference named in one line.")  # fmt: skip
TargetOpt = typer.Option(
    None, "--target", help="Measure an OpenAI-compatible server instead, e.g. http://127.0.0.1:8000/v1 "
    "(prompts sized with --checkpoint's tokenizer; see bench/sweep/remote.py).")
ModelOpt = typer.Option(None, "--model", help="With --target: the model id to request (default: the server's first).")
DecodeLoopOpt = typer.Option(
    None, "--decode-loop", help="host (one jitted step per token, synced to the host: per-step times), device "
    "(the tokens after the first in device loops, one host sync per block) or both (each cell timed with each, "
    f"and the host overhead per step reported). Default {DEFAULT_DECODE_LOOP} (with --resume: the run's; with "
    "--target: host, the server's loop).")
DecodeBlockOpt = typer.Option(
    None, "--decode-block", help="Steps per device-loop call (a last shorter block runs the rest). Default: all "
    "the tokens after the first in one call (with --resume: the run's).")
ApiKeyOpt = typer.Option(None, "--api-key", envvar=API_KEY_ENV, show_envvar=False,
                         help=f"With --target: sent as `Authorization: Bearer KEY` (default: ${API_KEY_ENV}, the "
                         "variable `bench serve` reads); never recorded in the run folder. Unused without "
                         "--target.")  # fmt: skip
ConcurrencyOpt = typer.Option(
    None, "--concurrency", help="With --target: measure under load instead, one level per value, e.g. 1,4,16: "
    "--num-requests requests per level, at most that many in flight (see bench/sweep/load.py).")
RequestRateOpt = typer.Option(
    None, "--request-rate", help="With --concurrency: Poisson arrivals at this many requests per second (each "
    "still waits for a place). Default: each request sent as soon as a place is free.")
NumRequestsOpt = typer.Option(
    None, "--num-requests", help="With --concurrency: timed requests per level. Default: 4 x the largest level, at "
    "least 16.")
SeedOpt = typer.Option(None, "--seed", help="With --request-rate: the seed of the Poisson arrivals (recorded). "
                       "Default 0.")  # fmt: skip
BatchOpt = typer.Option(
    None, "--batch", help="Batch sizes, comma-separated (e.g. 1,4,16,64): each input size is measured at each, "
    "B different prompts of the exact size decoded together; per cell the per-sequence gauge, the aggregate "
    "throughput, step times, bytes per step and arithmetic intensity, and the knee under the table. B = 1 is the "
    "cell without --batch. Default: one sequence per request (with --resume: the run's). Not with --target.")
OrderOpt = typer.Option(
    None, "--order", help="interleaved (every cell warmed up first, then repeat r of every cell before repeat "
    "r + 1 of any, the rate probes between rounds) or sequential (cell after cell). Default interleaved (with "
    "--resume: the run's; with --target: sequential; docs/method.md, Interleaving).")
StepLogitsOpt = typer.Option(
    None, "--step-logits/--no-step-logits", help="Record each cell's per-decode-step summary (the chosen token, the "
    "runner-up and their logits, teacher-forced; logits/N.steps.npy), untimed after its repeats, so the report "
    "tells ties from errors at any step (docs/method.md, Quantized weights). Default on; off saves its compile "
    "(one program per cell) where only speed is asked.")
RESUMED = "with --resume: the run's; given otherwise, refused"


@app.command()
@engine_options(help_more={name: f"({RESUMED})." for name in ("dtype", "weight_dtype", "max_length", "buckets",
                                                              "quant", "scale_dtype", "kernel", "backend", "mesh")})
def sweep(
    inputs: str | None = InputsOpt, max_new_tokens: int | None = MaxNewTokensOpt, repeats: int | None = RepeatsOpt,
    min_duration: float | None = MinDurationOpt, max_duration: float | None = MaxDurationOpt,
    checkpoint: str | None = CheckpointOpt, name: str | None = NameOpt, runs_dir: Path = RunsDirOpt,
    resume: str | None = ResumeOpt, engine_flags: EngineFlags = EngineFlags(),
    compile_cache: str | None = CompileCacheOpt,
    target: str | None = TargetOpt, model: str | None = ModelOpt, decode_loop: str | None = DecodeLoopOpt,
    decode_block: int | None = DecodeBlockOpt, api_key: str | None = ApiKeyOpt,
    concurrency: str | None = ConcurrencyOpt, request_rate: float | None = RequestRateOpt,
    num_requests: int | None = NumRequestsOpt, seed: int | None = SeedOpt, batch: str | None = BatchOpt,
    order: str | None = OrderOpt, step_logits: bool | None = StepLogitsOpt,
) -> None:
    """Warm up at each compiled (bucket, max_new_tokens) shape, time the repeats, archive a run folder."""
    import dataclasses
    import logging

    from bench.sweep.command import SweepFlags, TargetFlags, plan_sweep, run_local, run_target

    flags = SweepFlags(inputs=inputs, max_new_tokens=max_new_tokens, repeats=repeats, min_duration=min_duration,
                       max_duration=max_duration, decode_loop=decode_loop, decode_block=decode_block, batch=batch,
                       checkpoint=checkpoint, compile_cache=compile_cache, order=order,
                       step_logits=step_logits)  # fmt: skip
    remote = TargetFlags(target=target, model=model, api_key=api_key, concurrency=concurrency,
                         request_rate=request_rate, num_requests=num_requests, seed=seed)  # fmt: skip
    plan = plan_sweep(flags, dataclasses.asdict(engine_flags), remote, name=name, runs_dir=runs_dir, resume=resume)
    setup_logging()
    log = logging.getLogger("bench")
    run = run_target(plan) if target is not None else run_local(plan)
    (_print_load_table if plan.load else _print_table)(run, log)


def _table_console():
    """The console of the sweep table: in a terminal, the terminal's own width (`make_console` would widen it to
    150 columns, which a narrower terminal wraps into fragments), else `make_console`'s."""
    from rich.console import Console

    from bench.cli.common import make_console

    probe = Console()
    return Console(width=probe.width) if probe.is_terminal else make_console()


def _print_table(run, log) -> None:
    """The sweep table of `run` on stdout (in a terminal: the columns that fit it, `fit_columns`, and a line naming
    the others; into a pipe: every column, wide enough not to fold), its knee lines and footnotes
    (`bench.runs.columns.table_notes`: a roofline % above 100 as a finding with the run's ceiling, ...), then a
    warning line naming invalid cells
    (measured, but not quotable: the table says why) and one naming failed cells (an error: nothing measured).
    Raises typer.Exit(1) when any cell failed, so a script can tell; the run folder keeps every cell. Invalid
    cells alone keep exit code 0: against a server that does not report compile events every cell is invalid by
    rule (bench/sweep/remote.py), and the numbers are still recorded. Into a pipe or log the console is as wide as
    the table (a sweep of both loops with its rooflines is wider than 200 columns), so nothing is truncated."""
    from rich.console import Console
    from rich.measure import Measurement

    from bench.runs import CELLS_CSV
    from bench.runs.ceiling import ceiling_of
    from bench.runs.columns import table_columns, table_notes

    cells, console = run.cells(), _table_console()
    columns, left_out = table_columns(cells), ()
    if console.is_terminal:  # a terminal: the columns that fit it, the rest named below the table
        columns, left_out = fit_columns(columns, cells, console.width)
    fits = console.is_terminal and table_width(columns, cells) <= console.width
    table = sweep_table(cells, columns, width=console.width if fits else None)
    need = Measurement.get(console, console.options.update_width(10_000), table).maximum
    wider = not console.is_terminal and need > console.width  # a pipe or log: every column, nothing truncated
    (Console(width=need, file=console.file) if wider else console).print(table)
    if left_out:
        console.print(f"{len(left_out)} columns left out to fit {console.width} characters: "
                      f"{', '.join(c.header for c in left_out)}; every column is in {run.path / CELLS_CSV} (piped, "
                      "e.g. into `less -S`, the table has them all)", markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    ceiling = ceiling_of(run.typed_manifest.extra)
    for line in knee_lines(cells) + table_notes(table_columns(cells), cells, ceiling=ceiling):
        console.print(line, markup=False, soft_wrap=True)

    def name(r):  # a cell: its input size, with its batch in a --batch sweep
        return r.input_tokens if r.batch is None else f"{r.input_tokens}x{r.batch}"

    failed = [name(r) for r in cells if r.status == "failed"]
    invalid = [name(r) for r in cells if not r.valid and r.status != "failed"]
    for r in (r for r in cells if r.partial):
        log.warning(f"note: cell {name(r)} is partial: {r.repeats} of {r.repeats_planned} timed repeats "
                    f"({'--max-duration reached' if r.stopped_by == 'max-duration' else 'interrupted'})")  # fmt: skip
    if invalid:
        log.warning(f"warning: cell(s) {invalid} are invalid (reasons in the table); their numbers are not quotable")
    if failed:
        log.warning(f"warning: cell(s) {failed} failed (errors in {run.path / 'run.log'}); nothing was measured there")
    if failed:
        raise typer.Exit(1)


def load_table(rows) -> "rich.table.Table":  # noqa: F821
    """The printed table of a sweep under load: one row per level (input size, concurrency, rate): requests,
    output tok/s, req/s, TTFT / ITL / TPOT / e2e median and p99 (ms), queue median (ms), valid."""
    from rich.table import Table

    from bench.runs.columns import DASH, fmt_num

    table = Table(title="sweep under load (per level; latencies median / p99, ms)")
    for header in ("input tokens", "concurrency", "rate req/s", "requests", "output tok/s", "req/s", "TTFT",
                   "ITL", "TPOT", "e2e", "queue", "valid"):  # fmt: skip
        table.add_column(header, justify="left" if header == "valid" else "right", overflow="fold")

    def pair(row, name: str) -> str:
        return f"{fmt_num(getattr(row, f'{name}_ms_median'), 1)} / {fmt_num(getattr(row, f'{name}_ms_p99'), 1)}"

    for r in rows:
        table.add_row(str(r.input_tokens), str(r.concurrency), DASH if r.request_rate is None else f"{r.request_rate:g}",
                      f"{r.completed}/{r.num_requests}", fmt_num(r.output_tok_s, 1), fmt_num(r.request_s, 2),
                      pair(r, "ttft"), pair(r, "itl"), pair(r, "tpot"), pair(r, "e2e"), fmt_num(r.queue_ms_median, 1),
                      "yes" if r.valid else f"no: {r.invalid_reason}")  # fmt: skip
    return table


def _print_load_table(run, log) -> None:
    """The load table of `run` on stdout, a warning naming invalid levels; typer.Exit(1) when a level failed."""
    from bench.cli.common import make_console

    rows = run.load_rows()
    make_console().print(load_table(rows))
    invalid = [(r.input_tokens, r.concurrency) for r in rows if not r.valid and r.status != "failed"]
    failed = [(r.input_tokens, r.concurrency) for r in rows if r.status == "failed"]
    if invalid:
        log.warning(f"warning: level(s) (input tokens, concurrency) {invalid} are invalid (reasons in the table)")
    if failed:
        log.warning(f"warning: level(s) {failed} failed (errors in {run.path / 'run.log'}); nothing was measured there")
        raise typer.Exit(1)
