"""`bench sweep`: the main job. Prints the sweep table and leaves a named run folder in runs/."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import typer

from bench.cli import app
from bench.cli.common import (
    BucketsOpt,
    CheckpointOpt,
    CompileCacheOpt,
    DtypeOpt,
    MaxLengthOpt,
    compile_cache_dir,
    open_engine,
    setup_logging,
)
from bench.errors import InputError, RunFolderError
from bench.sweep.local import StopSignals, parse_inputs


def sweep_table(rows) -> "rich.table.Table":  # noqa: F821
    """The printed sweep table (one row per input size), from the run's cell rows and the one column list
    (`bench.runs.columns.TABLE_COLUMNS`: headers, digits and dashes are the gpu-run summary's and the report's)."""
    from rich.table import Table

    from bench.runs.columns import TABLE_COLUMNS, text_rows

    table = Table(title="sweep (medians of timed repeats)")
    for col in TABLE_COLUMNS:
        table.add_column(col.table_header, justify=col.align)
    for line in text_rows(TABLE_COLUMNS, rows):
        table.add_row(*line)
    return table


def _manifest(engine, report: dict, ckpt: Path, cache_dir: Path | None, config, runs_cfg: dict) -> dict:
    import jax

    from bench.runs.environment import (
        build_id,
        device_facts,
        git_state,
        host_facts,
        package_versions,
        python_command_line,
    )
    from model.checkpoint import content_hash

    repo = Path(__file__).resolve().parents[2]
    chash = content_hash(ckpt)
    pol = engine.policy
    engine_config = {
        "buckets": list(engine.buckets), "max_length": engine.max_length, "max_new_tokens": config.max_new_tokens,
        "repeats": config.repeats, "inputs": list(config.inputs), "batch": 1, "sampling": "greedy",
        "quantization": "none", "weight_dtype": pol.weight_dtype, "kv_cache_dtype": pol.kv_dtype,
        "compute_dtype": pol.compute_dtype, "eos": "ignored while benchmarking",
    }  # fmt: skip
    return {
        "command_line": python_command_line(),
        "build_id": build_id([repo / "model", repo / "bench"], chash, {**engine_config, **runs_cfg}),
        "git": git_state(repo),
        "versions": package_versions(),
        "device": device_facts(jax),
        "host": host_facts(),
        "dtype_policy": {"line": pol.line(), "compute_dtype": pol.compute_dtype, "weights": pol.weight_dtype,
                         "activations": pol.activation_dtype, "kv_cache": pol.kv_dtype, "pre_ampere": pol.pre_ampere,
                         "pallas_interpret": pol.pallas_interpret, "overridden": pol.overridden,
                         "emulated": pol.emulated},  # fmt: skip
        "checkpoint": {"id": ckpt.name, "path": str(ckpt), "content_hash": chash, "weight_bytes": engine.weight_bytes,
                       "tensors": report["tensors"], "ignored_tensors": len(report["ignored"]),
                       "load_s": report["load_s"]},  # fmt: skip
        "engine_config": engine_config,
        # derived from the configuration, so outside it (and outside the build id): bytes a decode step reads
        "decode_bytes": {str(n): engine.decode_bytes(n, config.max_new_tokens) for n in config.inputs},
        "compile_cache": {"dir": str(cache_dir) if cache_dir else None, "hits": None, "misses": None},
    }


def _resumed_cache(run, compile_cache: str | None) -> str:
    """With --resume, the run's compile cache folder ('off' if it had none); a different one is an InputError, so
    that the run's cache hits and misses stay one story."""
    stored = (run.manifest.get("compile_cache") or {}).get("dir") or "off"
    if compile_cache is not None and str(compile_cache_dir(compile_cache) or "off") != stored:
        raise InputError(f"--compile-cache {compile_cache} differs from the resumed run's {stored}; drop the flag")
    return stored


def _resumed_flags(run, inputs: str | None, max_new_tokens: int | None, repeats: int | None, checkpoint: str | None):
    """With --resume, flags not given take the run's values; a given flag that differs is an InputError."""
    cfg = run.manifest.get("engine_config") or {}
    stored = {"--inputs": ",".join(map(str, cfg.get("inputs") or [])) or None,
              "--max-new-tokens": cfg.get("max_new_tokens"), "--repeats": cfg.get("repeats")}  # fmt: skip
    given = {"--inputs": inputs, "--max-new-tokens": max_new_tokens, "--repeats": repeats}
    for flag, value in given.items():
        if value is None or stored[flag] is None:
            continue
        same = parse_inputs(value) == parse_inputs(stored[flag]) if flag == "--inputs" else value == stored[flag]
        if not same:
            raise InputError(f"{flag} {value} differs from the resumed run's {stored[flag]}; "
                             f"drop the flag to continue {run.path} as it started")  # fmt: skip
    ckpt = checkpoint or (run.manifest.get("checkpoint") or {}).get("path")
    return (inputs or stored["--inputs"], max_new_tokens if max_new_tokens is not None else stored["--max-new-tokens"],
            repeats if repeats is not None else stored["--repeats"], ckpt)  # fmt: skip


@app.command()
def sweep(
    inputs: str | None = typer.Option(None, "--inputs", help="Comma-separated exact input sizes (tokens). "
                                      "Default 41,521,2057,3593 (with --resume: the run's)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Tokens generated per request (EOS "
                                              "ignored). Default 64 (with --resume: the run's)."),
    repeats: int | None = typer.Option(None, "--repeats", help="Timed repeats per cell after one warm-up. Default 3 "
                                       "(with --resume: the run's)."),
    checkpoint: str | None = CheckpointOpt,
    name: str | None = typer.Option(
        None, "--name", help="Run label: the folder is runs/<date>-<label>-<device>/ (default 'sweep', suffixed -2, -3, "
        "... when taken; an explicit label that is taken is an error)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run folders are archived."),
    resume: str | None = typer.Option(None, "--resume", help="Continue an interrupted run: a folder, a run name "
                                      "in --runs-dir (as `bench runs list` prints it), or 'latest'."),
    dtype: str | None = DtypeOpt,
    max_length: int | None = MaxLengthOpt,
    compile_cache: str | None = CompileCacheOpt,
    buckets: str | None = BucketsOpt,
    target: str | None = typer.Option(
        None, "--target", help="Measure an OpenAI-compatible server instead, e.g. http://127.0.0.1:8000/v1 "
        "(prompts sized with --checkpoint's tokenizer; see bench/sweep/remote.py)."),
    model: str | None = typer.Option(None, "--model", help="With --target: the model id to request (default: the "
                                     "server's first)."),
) -> None:
    """Warm up at each compiled (bucket, max_new_tokens) shape, time the repeats, archive a run folder."""
    from bench.runs import create_run, free_label, open_run, resolve_run, writing_run
    from bench.runs.environment import device_slug
    from bench.sweep.local import SweepConfig, run_sweep
    from model.engine import CompileCounter

    if model is not None and target is None:
        raise InputError("--model names a model on a server: it needs --target http://HOST:PORT/v1")
    run = None
    if resume is not None:
        resume = resolve_run(resume, runs_dir)  # a path, a name in --runs-dir, or "latest"; RunFolderError if none
    if resume is not None and target is None:
        run = open_run(resume)  # raises RunFolderError naming the folder
        if run.status == "complete":
            raise RunFolderError(f"run {resume} is already complete; start a new one with --name")
        inputs, max_new_tokens, repeats, checkpoint = _resumed_flags(run, inputs, max_new_tokens, repeats, checkpoint)
        compile_cache = _resumed_cache(run, compile_cache)
    config = SweepConfig(inputs=parse_inputs(inputs or "41,521,2057,3593"),
                         max_new_tokens=64 if max_new_tokens is None else max_new_tokens,
                         repeats=3 if repeats is None else repeats)  # fmt: skip
    config.check()
    if target is not None:
        _sweep_target(target, model, config, checkpoint, name, runs_dir, resume, (dtype, max_length, compile_cache, buckets))
        return
    if run is None and runs_dir.exists() and not runs_dir.is_dir():
        raise RunFolderError(f"--runs-dir {runs_dir} is a file; pass a folder")
    setup_logging()
    log = logging.getLogger("bench")
    engine, report, ckpt, cache_dir = open_engine(checkpoint, dtype, max_length, compile_cache, buckets=buckets)
    from bench.sweep.local import build_prompts

    prompts = build_prompts(engine, config)  # every size checked before a folder is created or anything measured
    counts0 = CompileCounter.snapshot()
    manifest = _manifest(engine, report, ckpt, cache_dir, config, {})
    if run is not None and manifest["build_id"] != run.manifest.get("build_id"):
        raise RunFolderError(
            f"run {run.path} was measured with build id {run.manifest.get('build_id')}, this command's build is "
            f"{manifest['build_id']} (the code, checkpoint, dtype or engine configuration differ); finish it with "
            "the same code and flags, or start a new run"
        )
    resumed = run

    def start():
        if resumed is None:
            slug = manifest["device"].get("slug") or device_slug(engine.policy.device_kind)
            return create_run(runs_dir, name or free_label(runs_dir, "sweep", slug), slug, manifest)
        resumed.resume()
        return resumed

    t0 = time.perf_counter()

    def before_end(run, _status: str) -> None:
        counts = CompileCounter.snapshot()
        before = run.manifest.get("compile_cache") or {}  # a resumed run adds this process's counts to its own
        hits = (before.get("hits") or 0) + counts["cache_hits"] - counts0["cache_hits"]
        misses = (before.get("misses") or 0) + counts["cache_misses"] - counts0["cache_misses"]
        run.update_manifest(compile_cache={"dir": str(cache_dir) if cache_dir else None, "hits": hits,
                                           "misses": misses})  # fmt: skip

    def after_end(run, status: str) -> None:
        log.info(f"sweep {status} in {time.perf_counter() - t0:.1f} s; run folder {run.path}")

    # SIGTERM / Ctrl-C: stop after the current request, run kept incomplete. The signals are in force from before
    # the run is created (or resumed) to after it ended, and `writing_run` ends it however the sweep ends: the run
    # is never left "running" (the same structure as `bench sweep --target`, bench/sweep/remote.py).
    with StopSignals(log.info) as stop, writing_run(start, before_end=before_end, after_end=after_end) as run:
        done = run.finished_inputs()
        log.info(f"run folder: {run.path}")
        run.log(engine.policy.line())
        run_sweep(engine, config, run, progress=lambda line: (log.info(line), run.log(line)), skip=done,
                  should_stop=stop, prompts=prompts)  # fmt: skip
    _print_table(run, log)


def _print_table(run, log) -> None:
    """The sweep table of `run` on stdout (wide enough not to fold), then a warning line naming invalid cells
    (measured, but not quotable: the table says why) and one naming failed cells (an error: nothing measured).
    Raises typer.Exit(1) when any cell failed, so a script can tell; the run folder keeps every cell. Invalid
    cells alone keep exit code 0: against a server that does not report compile events every cell is invalid by
    rule (bench/sweep/remote.py), and the numbers are still recorded."""
    from bench.cli.common import make_console

    cells = run.cells()
    make_console().print(sweep_table(cells))
    failed = [r.input_tokens for r in cells if r.status == "failed"]
    invalid = [r.input_tokens for r in cells if not r.valid and r.status != "failed"]
    if invalid:
        log.warning(f"warning: cell(s) {invalid} are invalid (reasons in the table); their numbers are not quotable")
    if failed:
        log.warning(f"warning: cell(s) {failed} failed (errors in {run.path / 'run.log'}); nothing was measured there")
    if failed:
        raise typer.Exit(1)


def _sweep_target(target: str, model: str | None, config, checkpoint: str | None, name: str | None, runs_dir: Path,
                  resume: Path | None, engine_flags: tuple) -> None:  # fmt: skip
    """`bench sweep --target`: the same sweep through an OpenAI-compatible server (bench/sweep/remote.py)."""
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
                       stop=StopSignals(log.info))  # fmt: skip
    _print_table(run, log)
