"""`bench sweep`: the main job. Prints the sweep table and leaves a named run folder in runs/."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import typer

from bench.cli import app
from bench.cli.common import (
    API_KEY_ENV,
    BackendOpt,
    BucketsOpt,
    CheckpointOpt,
    CompileCacheOpt,
    DtypeOpt,
    KernelOpt,
    MaxLengthOpt,
    QuantOpt,
    ScaleDtypeOpt,
    WeightDtypeOpt,
    check_prompt_sizes,
    compile_cache_dir,
    engine_manifest,
    open_engine,
    parse_backend_flag,
    parse_kernel_flag,
    parse_quant_flags,
    setup_logging,
)
from bench.errors import InputError, RunFolderError
from bench.runs import now_iso, writing_run
from bench.runs.manifest import w4_kernel_of
from bench.sweep.local import DECODE_LOOP_CHOICES, StopSignals, parse_batches, parse_decode_loop, parse_inputs
from bench.sweep.local import DEFAULT_ORDER, parse_order, resumed_order
from bench.sweep.rates import RATES_KEY


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


def sweep_workload(config, **notes):
    """The `bench.runs.Workload` of a sweep config (inputs, max_new_tokens, repeats; greedy, EOS ignored)."""
    from bench.runs.manifest import Workload

    return Workload(inputs=tuple(config.inputs), max_new_tokens=config.max_new_tokens, repeats=config.repeats,
                    sampling="greedy", eos="ignored while benchmarking", notes=notes)  # fmt: skip


def _resumed_cache(run, compile_cache: str | None) -> str:
    """With --resume, the run's compile cache folder as a flag value ('off' if it had none); a different one is an
    InputError, so that the run's cache hits and misses stay one story. The run records a folder inside the cache
    root as <cache>/..., compared and resolved on this machine's cache root."""
    from bench.runs.manifest import local_dir, portable_dir
    from model.builtin import cache_root

    root = cache_root()
    stored = run.typed_manifest.compile_cache.dir
    stored_flag = local_dir(stored, root) or "off"
    if compile_cache is not None:
        given = portable_dir(compile_cache_dir(compile_cache), root) or "off"
        if given != (portable_dir(stored_flag, root) if stored else "off"):
            raise InputError(f"--compile-cache {compile_cache} differs from the resumed run's {stored or 'off'}; "
                             "drop the flag")  # fmt: skip
    return stored_flag


def duration_notes(config) -> dict:
    """The workload notes of a sweep's durations (`SweepConfig.min_duration_s`, `max_duration_s`), only those set,
    so that a sweep without them records what it always did."""
    notes = {"min_duration_s": config.min_duration_s or None, "max_duration_s": config.max_duration_s}
    return {k: v for k, v in notes.items() if v is not None}


DEFAULT_DECODE_LOOP = "both"
"""The in-process sweep's default `--decode-loop`: each cell timed with the host loop (per-step times) and the
device loop, so every run reports the host overhead per step (README, `bench sweep`). `--target` measures the
server's own loop: host only."""


def loop_notes(config) -> dict:
    """The workload notes of the decode loops a sweep times (`SweepConfig.decode_loops`, `block`)."""
    name = next(k for k, v in DECODE_LOOP_CHOICES.items() if v == config.decode_loops)
    return {"decode_loop": name, **({"decode_block": config.block} if config.block is not None else {})}


def batch_notes(config) -> dict:
    """The workload note of a `--batch` sweep (`SweepConfig.batches`): {"batches": [B, ...]}; {} without --batch,
    so that a sweep without it records what it always did."""
    return {"batches": list(config.batches)} if config.batches else {}


def _resumed_batch(run, batch: str | None) -> str | None:
    """With --resume, --batch not given takes the run's (none: a sweep without --batch); a given one that differs
    is an InputError, as for the other workload flags."""
    stored = run.typed_manifest.workload.notes.get("batches")
    stored_text = ",".join(map(str, stored)) if stored else None
    if batch is not None and parse_batches(batch) != tuple(stored or ()):
        raise InputError(f"--batch {batch} differs from the resumed run's {stored_text or 'none'}; drop the flag to "
                         f"continue {run.path} as it started")  # fmt: skip
    return stored_text if batch is None else batch


def _resumed_loop(run, decode_loop: str | None, block: int | None) -> tuple[str, int | None]:
    """With --resume, --decode-loop / --decode-block not given take the run's (a run that records none timed the
    host loop alone, in one-step calls); a given one that differs is an InputError."""
    notes = run.typed_manifest.workload.notes
    stored = (notes.get("decode_loop", "host"), notes.get("decode_block"))
    for flag, value, was in (("--decode-loop", decode_loop, stored[0]), ("--decode-block", block, stored[1])):
        if value is not None and value != was:
            raise InputError(f"{flag} {value} differs from the resumed run's {was or 'none'}; drop the flag to "
                             f"continue {run.path} as it started")  # fmt: skip
    return stored


def _resumed_quant(run, quant: str | None, scale_dtype: str | None) -> tuple[str, str | None]:
    """With --resume, --quant / --scale-dtype not given take the run's (a run that records none is dense); a given
    one that differs is an InputError (compared in canonical form: `--quant ple4,int8_lm_head` is the run's
    `int8_lm_head,ple4`)."""
    engine = run.typed_manifest.engine
    stored = (engine.quantization or "none", engine.scale_dtype)
    if quant is not None and parse_quant_flags(quant)[0].canonical != stored[0]:
        raise InputError(f"--quant {quant} differs from the resumed run's {stored[0]}; drop the flag to continue "
                         f"{run.path} as it started")  # fmt: skip
    if scale_dtype is not None and stored[1] is not None and scale_dtype != stored[1]:
        raise InputError(f"--scale-dtype {scale_dtype} differs from the resumed run's {stored[1]}; drop the flag to "
                         f"continue {run.path} as it started")  # fmt: skip
    return stored[0], scale_dtype if stored[1] is None else stored[1]


def _resumed_weight_dtype(run, weight_dtype: str | None) -> str | None:
    """With --resume, --weight-dtype not given takes the run's where it stored its weights in another dtype than it
    computed in (else None: the policy's own); a given one that differs from the run's is an InputError."""
    engine = run.typed_manifest.engine
    stored = engine.weight_dtype
    if weight_dtype is not None and stored is not None and weight_dtype != stored:
        raise InputError(f"--weight-dtype {weight_dtype} differs from the resumed run's {stored}; drop the flag to "
                         f"continue {run.path} as it started")  # fmt: skip
    if weight_dtype is None and stored is not None and stored != engine.compute_dtype:
        return stored
    return weight_dtype


def _resumed_backend(run, backend: str | None) -> str | None:
    """With --resume, --backend not given takes the run's (`EngineConfig.backend`; a run from before it was
    recorded: None, the default); a given one that differs from the run's recorded one is an InputError."""
    ran = run.typed_manifest.engine.backend
    if backend is not None and ran is not None and backend != ran:
        raise InputError(f"--backend {backend} differs from the resumed run's {ran}; drop the flag to continue "
                         f"{run.path} as it started")  # fmt: skip
    return backend if backend is not None else ran


def _resumed_durations(run, min_duration: float | None, max_duration: float | None) -> tuple[float, float | None]:
    """With --resume, --min-duration / --max-duration not given take the run's (none: 0 and no bound); a given
    one that differs is an InputError, as for the other workload flags."""
    notes = run.typed_manifest.workload.notes
    stored = {"--min-duration": notes.get("min_duration_s") or 0.0, "--max-duration": notes.get("max_duration_s")}
    given = {"--min-duration": min_duration, "--max-duration": max_duration}
    for flag, value in given.items():
        if value is not None and value != stored[flag]:
            raise InputError(f"{flag} {value:g} differs from the resumed run's {stored[flag] or 'none'}; "
                             f"drop the flag to continue {run.path} as it started")  # fmt: skip
    return stored["--min-duration"], stored["--max-duration"]


def _resumed_flags(run, inputs: str | None, max_new_tokens: int | None, repeats: int | None, checkpoint: str | None):
    """With --resume, flags not given take the run's values; a given flag that differs is an InputError. The
    checkpoint is the run's source (builtin:NAME or a hub id; a schema-1 run's folder), else --checkpoint must
    name it (a run on a local folder records no path)."""
    m = run.typed_manifest
    stored = {"--inputs": ",".join(map(str, m.workload.inputs or [])) or None,
              "--max-new-tokens": m.workload.max_new_tokens, "--repeats": m.workload.repeats}  # fmt: skip
    given = {"--inputs": inputs, "--max-new-tokens": max_new_tokens, "--repeats": repeats}
    for flag, value in given.items():
        if value is None or stored[flag] is None:
            continue
        same = parse_inputs(value) == parse_inputs(stored[flag]) if flag == "--inputs" else value == stored[flag]
        if not same:
            raise InputError(f"{flag} {value} differs from the resumed run's {stored[flag]}; "
                             f"drop the flag to continue {run.path} as it started")  # fmt: skip
    ckpt = checkpoint or m.checkpoint.source or m.checkpoint.path
    if ckpt is None:
        raise InputError(f"run {run.path} was measured on a local checkpoint folder ({m.checkpoint.id}), which it "
                         "does not record; pass --checkpoint FOLDER to resume it")  # fmt: skip
    return (inputs or stored["--inputs"], max_new_tokens if max_new_tokens is not None else stored["--max-new-tokens"],
            repeats if repeats is not None else stored["--repeats"], ckpt)  # fmt: skip


def check_same_build(run, manifest) -> None:
    """RunFolderError unless `manifest` (this command's) has the build id `run` was measured with: a run is one
    payload. A run written by an older harness (schema 1) has a build id computed another way: it is named so."""
    from bench.runs.schema import SCHEMA_VERSION

    ran = run.typed_manifest
    if manifest.build_id == ran.build_id:
        return
    older = (f" (it was written by an older harness, schema {ran.schema_version}, whose build ids differ from every "
             "current one)" if ran.schema_version < SCHEMA_VERSION else "")  # fmt: skip
    raise RunFolderError(
        f"run {run.path} was measured with build id {ran.build_id}, this command's build is {manifest.build_id}{older} "
        "(the code, checkpoint, dtype, quantization or engine configuration differ); finish it with the same code "
        "and flags, or start a new run"
    )


@app.command()
def sweep(
    inputs: str | None = typer.Option(None, "--inputs", help="Comma-separated exact input sizes (tokens). "
                                      "Default 41,521,2057,3593 (with --resume: the run's)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Tokens generated per request (EOS "
                                              "ignored). Default 64 (with --resume: the run's)."),
    repeats: int | None = typer.Option(None, "--repeats", help="Timed repeats per cell after one warm-up. Default 3 "
                                       "(with --resume: the run's)."),
    min_duration: float | None = typer.Option(
        None, "--min-duration", help="Seconds of timed requests per cell at least: timed repeats go on until both "
        "--repeats and this are reached, whichever takes longer. Default 0 (with --resume: the run's)."),
    max_duration: float | None = typer.Option(
        None, "--max-duration", help="Seconds of timed requests per cell at most: a cell that reaches it stops there "
        "(at least 1 repeat) and is kept as partial. Default: no bound (with --resume: the run's)."),
    checkpoint: str | None = CheckpointOpt,
    name: str | None = typer.Option(
        None, "--name", help="Run label: the folder is runs/<date>-<label>-<device>/ (default 'sweep', suffixed -2, -3, "
        "... when taken; an explicit label that is taken is an error)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run folders are archived."),
    resume: str | None = typer.Option(None, "--resume", help="Continue an interrupted run: a folder, a run name "
                                      "in --runs-dir (as `bench runs list` prints it), or 'latest'."),
    dtype: str | None = DtypeOpt,
    weight_dtype: str | None = WeightDtypeOpt,
    max_length: int | None = MaxLengthOpt,
    compile_cache: str | None = CompileCacheOpt,
    buckets: str | None = BucketsOpt,
    quant: str | None = QuantOpt,
    scale_dtype: str | None = ScaleDtypeOpt,
    kernel: str | None = KernelOpt,
    backend: str | None = BackendOpt,
    target: str | None = typer.Option(
        None, "--target", help="Measure an OpenAI-compatible server instead, e.g. http://127.0.0.1:8000/v1 "
        "(prompts sized with --checkpoint's tokenizer; see bench/sweep/remote.py)."),
    model: str | None = typer.Option(None, "--model", help="With --target: the model id to request (default: the "
                                     "server's first)."),
    decode_loop: str | None = typer.Option(
        None, "--decode-loop", help="host (one jitted step per token, synced to the host: per-step times), device "
        "(the tokens after the first in device loops, one host sync per block) or both (each cell timed with each, "
        f"and the host overhead per step reported). Default {DEFAULT_DECODE_LOOP} (with --resume: the run's; with "
        "--target: host, the server's loop)."),
    decode_block: int | None = typer.Option(
        None, "--decode-block", help="Steps per device-loop call (a last shorter block runs the rest). Default: all "
        "the tokens after the first in one call (with --resume: the run's)."),
    api_key: str | None = typer.Option(None, "--api-key", envvar=API_KEY_ENV, show_envvar=False,
                                       help=f"With --target: sent as `Authorization: Bearer KEY` (default: ${API_KEY_ENV}, "
                                       "the variable `bench serve` reads); never recorded in the run folder. Unused "
                                       "without --target."),
    concurrency: str | None = typer.Option(
        None, "--concurrency", help="With --target: measure under load instead, one level per value, e.g. 1,4,16: "
        "--num-requests requests per level, at most that many in flight (see bench/sweep/load.py)."),
    request_rate: float | None = typer.Option(
        None, "--request-rate", help="With --concurrency: Poisson arrivals at this many requests per second (each "
        "still waits for a place). Default: each request sent as soon as a place is free."),
    num_requests: int | None = typer.Option(
        None, "--num-requests", help="With --concurrency: timed requests per level. Default: 4 x the largest "
        "level, at least 16."),
    seed: int | None = typer.Option(None, "--seed", help="With --request-rate: the seed of the Poisson arrivals "
                                    "(recorded). Default 0."),
    batch: str | None = typer.Option(
        None, "--batch", help="Batch sizes, comma-separated (e.g. 1,4,16,64): each input size is measured at each, "
        "B different prompts of the exact size decoded together; per cell the per-sequence gauge, the aggregate "
        "throughput, step times, bytes per step and arithmetic intensity, and the knee under the table. B = 1 is the "
        "cell without --batch. Default: one sequence per request (with --resume: the run's). Not with --target."),
    order: str | None = typer.Option(
        None, "--order", help="interleaved (every cell warmed up first, then repeat r of every cell before repeat "
        "r + 1 of any, the rate probes between rounds) or sequential (cell after cell). Default interleaved (with "
        "--resume: the run's; with --target: sequential; docs/method.md, Interleaving)."),
) -> None:
    """Warm up at each compiled (bucket, max_new_tokens) shape, time the repeats, archive a run folder."""
    from bench.runs import check_writable, open_run, resolve_run
    from bench.sweep.local import SweepConfig

    if model is not None and target is None:
        raise InputError("--model names a model on a server: it needs --target http://HOST:PORT/v1")
    if batch is not None and target is not None:
        raise InputError(f"--batch {batch}: batches are decoded by the in-process engine; a server batches its own "
                         "requests, which a client cannot set: drop --batch (or --target)")  # fmt: skip
    batches = parse_batches(batch) if batch is not None else None  # bad values: one line before anything loads
    load_flags = {"--request-rate": request_rate, "--num-requests": num_requests, "--seed": seed}
    if concurrency is None and any(v is not None for v in load_flags.values()):
        flag = next(f for f, v in load_flags.items() if v is not None)
        raise InputError(f"{flag} sets a sweep under load: it needs --target URL --concurrency LEVELS (e.g. 1,4,16)")
    if concurrency is not None and target is None:
        raise InputError(f"--concurrency {concurrency} measures a server under load: it needs --target "
                         "http://HOST:PORT/v1 (start one with `bench serve`)")  # fmt: skip
    if concurrency is not None:
        for flag, value in (("--repeats", repeats), ("--min-duration", min_duration), ("--max-duration", max_duration)):
            if value is not None:
                raise InputError(f"{flag} {value:g} belongs to the one-at-a-time sweep; under load each level "
                                 "sends --num-requests requests: drop it (or drop --concurrency)")  # fmt: skip
    if name is not None and not name.strip():
        raise InputError(f"--name {name!r}: an empty run label; pass one such as --name my-test, or drop --name for "
                         "the default 'sweep'")  # fmt: skip
    if name is not None:  # a label that cannot name a folder is refused before anything loads
        from bench.runs import run_name

        run_name(name, "device")
    run = None
    if resume is not None:  # a path, a name in --runs-dir, or "latest"; RunFolderError if none
        resume = resolve_run(resume, runs_dir, flag="--resume")
        command = open_run(resume).typed_manifest.command  # None: a schema-1 run, all of them sweeps
        if command is not None and not command.startswith("sweep"):
            raise InputError(f"--resume {resume}: this run was written by `bench {command}`, not by a sweep; --resume "
                             "continues sweeps only: run `bench sweep` without --resume for a new run")  # fmt: skip
    # where the run is written, checked before anything loads (one line, exit 2)
    check_writable(resume or runs_dir, flag="--resume" if resume is not None else "--runs-dir")
    order = resumed_order(open_run(resume), order) if resume is not None else order  # a run keeps its order
    if resume is not None and target is not None and (inputs is None or max_new_tokens is None):
        ran = open_run(resume).typed_manifest.workload  # a server's run resumes at its own sizes by default
        inputs = inputs if inputs is not None else ",".join(str(n) for n in ran.inputs or ()) or None
        max_new_tokens = max_new_tokens if max_new_tokens is not None else ran.max_new_tokens
    if resume is not None and target is None:
        run = open_run(resume)  # raises RunFolderError naming the folder
        ran_against = (run.typed_manifest.workload.notes or {}).get("target")
        if ran_against:
            raise InputError(f"--resume {resume}: this run measured a server ({ran_against}), and without --target "
                             f"the sweep would measure the local engine into it; resume it with --target "
                             f"{ran_against} and the flags it was started with (--concurrency, --num-requests, ...)")  # fmt: skip
        if run.status == "complete":
            raise RunFolderError(f"run {resume} is already complete; start a new one with --name")
        inputs, max_new_tokens, repeats, checkpoint = _resumed_flags(run, inputs, max_new_tokens, repeats, checkpoint)
        min_duration, max_duration = _resumed_durations(run, min_duration, max_duration)
        compile_cache = _resumed_cache(run, compile_cache)
        decode_loop, decode_block = _resumed_loop(run, decode_loop, decode_block)
        quant, scale_dtype = _resumed_quant(run, quant, scale_dtype)
        weight_dtype = _resumed_weight_dtype(run, weight_dtype)
        if kernel is None:  # the run's w4 product, if it had one (its CPU kernel follows its weight dtype)
            kernel = w4_kernel_of(run.typed_manifest.engine.kernel)
        batch = _resumed_batch(run, batch)
        batches = parse_batches(batch) if batch is not None else None
        backend = _resumed_backend(run, backend)
    if target is not None and backend is not None:
        raise InputError(f"--backend {backend}: with --target the server runs the engine it was started with; drop "
                         "the flag (start the server with `bench serve --backend ...`)")  # fmt: skip
    if target is not None and kernel is not None:
        raise InputError(f"--kernel {kernel}: with --target the server multiplies its weights as it was started; "
                         "drop the flag (start the server with `bench serve --kernel ...`)")  # fmt: skip
    if target is not None and weight_dtype is not None:
        raise InputError(f"--weight-dtype {weight_dtype}: with --target the server stores its weights as it was "
                         "started; drop the flag (start the server with `bench serve --weight-dtype ...`)")  # fmt: skip
    if target is not None and (quant is not None or scale_dtype is not None):
        raise InputError(f"--quant {quant or ''}{' --scale-dtype ' + scale_dtype if scale_dtype else ''}: with "
                         "--target the server's weights are measured as it placed them, which a client cannot "
                         "quantize; drop the flag (start the server with `bench serve --quant ...`)")  # fmt: skip
    parse_quant_flags(quant, scale_dtype)  # bad values: one line, before anything loads or is measured
    parse_kernel_flag(kernel, quant)
    parse_backend_flag(backend)
    loops = parse_decode_loop(decode_loop) if decode_loop is not None else None  # bad values: one line first
    if target is not None and (loops not in (None, ("host",)) or decode_block is not None):
        raise InputError(f"--decode-loop {decode_loop or 'host'}{' --decode-block' if decode_block else ''}: with "
                         "--target the server runs its own decode loop, which a client cannot choose; drop the flag "
                         "(the remote sweep times the host-synced stream)")  # fmt: skip
    config = SweepConfig(inputs=parse_inputs("41,521,2057,3593" if inputs is None else inputs),
                         max_new_tokens=64 if max_new_tokens is None else max_new_tokens,
                         repeats=3 if repeats is None else repeats, min_duration_s=min_duration or 0.0,
                         max_duration_s=max_duration, block=decode_block, batches=batches or (),
                         decode_loops=loops or DECODE_LOOP_CHOICES["host" if target else DEFAULT_DECODE_LOOP],
                         order=parse_order(order) if order else "sequential" if target else DEFAULT_ORDER)  # fmt: skip
    config.check()
    engine_flags = (dtype, max_length, compile_cache, buckets, quant, scale_dtype, kernel, weight_dtype, backend)
    if target is not None and concurrency is not None:
        from bench.sweep.load import LoadConfig, default_num_requests, parse_concurrency

        levels = parse_concurrency(concurrency)
        load = LoadConfig(inputs=config.inputs, max_new_tokens=config.max_new_tokens, concurrency=levels,
                          num_requests=default_num_requests(levels) if num_requests is None else num_requests,
                          request_rate=request_rate, seed=0 if seed is None else seed)  # fmt: skip
        load.check()
        _sweep_target(target, model, load, checkpoint, name, runs_dir, resume, engine_flags, api_key, load=True)
    elif target is not None:
        _sweep_target(target, model, config, checkpoint, name, runs_dir, resume, engine_flags, api_key)
    else:
        _sweep_local(config, run, checkpoint, name, runs_dir, engine_flags)


def _sweep_local(config, resumed, checkpoint: str | None, name: str | None, runs_dir: Path, engine_flags: tuple) -> None:
    """`bench sweep` in process: check every size against the model's limits (`check_prompt_sizes`: config.json
    alone), load the engine, check every prompt, build the manifest (and, resuming, check it is
    the run's build), then measure into a new or the resumed run folder and print the table."""
    from bench.sweep.local import build_batch_prompts, build_prompts, check_batches, run_sweep
    from model.engine import CompileCounter
    from model.backends import xla_options_line

    setup_logging()
    log = logging.getLogger("bench")
    dtype, max_length, compile_cache, buckets, quant, scale_dtype, kernel, weight_dtype, backend = engine_flags
    # every size against the limits config.json sets, before a built-in checkpoint is created or a weight loads
    check_prompt_sizes(checkpoint, config.inputs, config.max_new_tokens, max_length, buckets)
    policy_at = now_iso()  # run.log stamps the policy and kernel lines with when they were decided, not written
    engine, report, _ckpt, cache_dir = open_engine(checkpoint, dtype, max_length, compile_cache, buckets=buckets,
                                                   quant=quant, scale_dtype=scale_dtype, kernel=kernel,
                                                   weight_dtype=weight_dtype, backend=backend)  # fmt: skip
    prompts = build_prompts(engine, config)  # every size checked before a folder is created or anything measured
    check_batches(engine, config)  # every batch must fit in memory: one line, exit 2, before anything is timed
    batch_prompts = build_batch_prompts(engine, config) if any(b > 1 for b in config.batches) else None
    counts0 = CompileCounter.snapshot()
    decode_bytes = {str(n): engine.decode_bytes(n, config.max_new_tokens) for n in config.inputs}
    # derived from the configuration, so outside it (and outside the build id): bytes a decode step reads
    rates, rates_new = _sweep_rates(engine, resumed, log)
    rates_at = now_iso()
    workload = sweep_workload(config, **duration_notes(config), **loop_notes(config), **batch_notes(config))
    manifest = engine_manifest("sweep", engine, report, checkpoint, cache_dir, workload,
                               extra={"decode_bytes": decode_bytes, RATES_KEY: dict(rates.measured)})  # fmt: skip
    if resumed is not None:
        check_same_build(resumed, manifest)
    t0 = time.perf_counter()

    def after_end(run, status: str) -> None:
        log.info(f"sweep {status} in {time.perf_counter() - t0:.1f} s; run folder {run.path}")

    # SIGTERM / Ctrl-C: stop after the current request, run kept incomplete. The signals are in force from before
    # the run is created (or resumed) to after it ended, and `writing_run` ends it however the sweep ends: the run
    # is never left "running" (the same structure as `bench sweep --target`, bench/sweep/remote.py).
    with (
        StopSignals(log.info) as stop,
        writing_run(_run_starter(resumed, runs_dir, name, manifest), after_end=after_end,
                    before_end=_compile_cache_counter(counts0, manifest.compile_cache.dir)) as run,
    ):  # fmt: skip
        log.info(f"run folder: {run.path}")
        run.log(engine.policy.line(), at=policy_at)
        run.log(f"engine kernels: {manifest.engine.kernel or 'none (XLA products throughout)'}", at=policy_at)
        if (options_line := xla_options_line(engine.xla_options, engine.policy.platform)) is not None:
            run.log(options_line, at=policy_at)
        run.log(rates.line, at=rates_at)
        if resumed is not None and rates_new:  # a run begun before sweeps measured rates: record this process's
            run.update_manifest(**{RATES_KEY: dict(rates.measured)})
        run_sweep(engine, config, run, progress=lambda line: (log.info(line), run.log(line)),
                  skip=run.finished_cells() if config.batches else run.finished_inputs(), should_stop=stop,
                  prompts=prompts, rates=rates, batch_prompts=batch_prompts)  # fmt: skip
        _record_findings(run, rates)
        if not stop() and config.order == "sequential":  # interleaved: the probes after each round (run_sweep)
            _end_bandwidth(run, rates, log)
    _print_table(run, log)


def _record_findings(run, rates) -> None:
    """The run's roofline findings (a share above 100% of its ceiling, `bench.runs.columns.roofline_findings`),
    recorded under the manifest's `RATES_KEY` as `bench.runs.ceiling.FINDINGS_KEY` (a list, [] when none) with the
    probe's numbers; the sweep table's lines print them (`_print_table`)."""
    from bench.runs.ceiling import FINDINGS_KEY
    from bench.runs.columns import roofline_findings

    found = [f.to_json() for f in roofline_findings(run.cells(), rates.ceiling)]
    recorded = run.manifest.get(RATES_KEY) or dict(rates.measured)
    run.update_manifest(**{RATES_KEY: {**recorded, FINDINGS_KEY: found}})


def _end_bandwidth(run, rates, log) -> None:
    """The copy bandwidth measured again after the last cell (`bench.profile.bandwidth.measure_bandwidth`, as at the
    start): recorded under the manifest's `RATES_KEY` as `bench.runs.manifest.COPY_END_KEY`, its line logged and in
    run.log, with a warning where it moved more than `DRIFT_WARN_PCT` from the start's (`drift_lines`)."""
    from bench.profile.bandwidth import measure_bandwidth
    from bench.runs.manifest import COPY_END_KEY
    from bench.sweep.rates import drift_lines

    end = measure_bandwidth()
    recorded = run.manifest.get(RATES_KEY) or dict(rates.measured)
    run.update_manifest(**{RATES_KEY: {**recorded, COPY_END_KEY: end.to_json()}})
    line, warning = drift_lines(rates.bandwidth_bytes_s, end.bytes_per_s)
    log.info(line)
    run.log(line)
    if warning is not None:
        log.warning(warning)
        run.log(warning)


def _sweep_rates(engine, resumed, log):
    """(the rates the sweep's rows are divided by, whether they were measured now): a resumed run's recorded
    rates (one run, one denominator), else the copy bandwidth and matrix-product rate measured now on the live
    device (`bench.sweep.rates.measure_rates`), once, before the first cell. Logs their line."""
    from bench.sweep.rates import measure_rates, rates_of

    stored = rates_of(resumed.typed_manifest.extra) if resumed is not None else None
    if stored is not None:
        log.info(f"{stored.line} (the resumed run's)")
        return stored, False
    log.info("measuring the device's copy bandwidth, read-only probes and matrix-product rate (docs/method.md, "
             "Rooflines)")
    rates = measure_rates(engine.policy.compute_dtype)
    log.info(rates.line)
    return rates, True


def _run_starter(resumed, runs_dir: Path, name: str | None, manifest):
    """`writing_run`'s start: resume `resumed`, or create a new run (label `name`, default 'sweep' made free)."""
    from bench.runs import create_run, free_label

    def start():
        if resumed is None:
            slug = manifest.slug or "unknown"
            return create_run(runs_dir, name or free_label(runs_dir, "sweep", slug), slug, manifest)
        resumed.resume()
        return resumed

    return start


def _compile_cache_counter(counts0: dict, cache_dir: str | None):
    """`writing_run`'s before_end: the run's compile cache hits and misses, this process's counts since `counts0`
    added to what the run had (a resumed run keeps counting), written into its manifest."""
    from model.engine import CompileCounter

    def before_end(run, _status: str) -> None:
        counts = CompileCounter.snapshot()
        before = run.typed_manifest.compile_cache
        hits = (before.hits or 0) + counts["cache_hits"] - counts0["cache_hits"]
        misses = (before.misses or 0) + counts["cache_misses"] - counts0["cache_misses"]
        run.update_manifest(compile_cache={"dir": cache_dir, "hits": hits, "misses": misses})

    return before_end


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


def _sweep_target(target: str, model: str | None, config, checkpoint: str | None, name: str | None, runs_dir: Path,
                  resume: Path | None, engine_flags: tuple, api_key: str | None, load: bool = False) -> None:  # fmt: skip
    """`bench sweep --target`: the same sweep through an OpenAI-compatible server (bench/sweep/remote.py); with
    `load` (`config` a LoadConfig), its load levels (bench/sweep/load.py) and their table."""
    from bench.cli.common import checkpoint_path
    from bench.sweep.remote import sweep_target

    if any(f is not None for f in engine_flags):
        raise InputError("--dtype, --max-length, --compile-cache and --buckets configure the in-process engine; "
                         "with --target the server decides them (pass them to `bench serve`)")  # fmt: skip
    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP request otherwise
    log = logging.getLogger("bench")
    run = sweep_target(target, model, config, checkpoint=checkpoint_path(checkpoint) if checkpoint else None,
                       runs_dir=runs_dir, name=name, resume=resume, progress=log.info,
                       stop=StopSignals(log.info), api_key=api_key, load=load)  # fmt: skip
    if load:
        _print_load_table(run, log)
    else:
        _print_table(run, log)


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
