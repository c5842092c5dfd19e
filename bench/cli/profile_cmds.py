"""`bench profile` (capture + analyse N decode steps), `bench profile analyze` (any saved trace), `bench bandwidth`.

Definitions: docs/method.md, "Profiles" and "Rooflines". The library does the work (bench/profile/command.py: the
checks, the engine, the capture into a run folder; `bench.profile.analysis`, `bench.profile.bandwidth`); this
module parses flags and prints.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import typer

from bench.cli.root import app
from bench.cli.common import CheckpointOpt, CompileCacheOpt, make_console, setup_logging
from bench.cli.engine_options import EngineFlags, engine_options
from bench.errors import InputError

profile_app = typer.Typer(
    help="Profile N decode steps (xprof trace, where device time goes, roofline share) into a new run, or with --run "
    "into an existing measured one (never a published one; a profile it has is replaced only with --replace). "
    "Ctrl-C / SIGTERM stop at once (exit 130): a new run ends incomplete, a joined one as it was. `analyze` re-reads "
    "a trace.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(profile_app, name="profile")

TOP_ROWS = 15


# ---- helpers -----------------------------------------------------------------------------------------------------
def _bytes_text(n: float | None) -> str:
    if n is None:
        return "—"
    return f"{n / 2**30:,.3f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def print_findings(data: dict, console) -> None:
    """The findings of a profile.json dict (`bench.profile.findings`), one line each, under the rules in force;
    "none" when it has none, "not recorded" when it was written before findings existed."""
    from bench.profile.findings import rules_text, stored_findings

    lines = stored_findings(data)
    if lines is None:
        console.print("findings: not recorded (a profile.json from before findings; `bench profile analyze RUN "
                      "--update` adds them where the trace is kept)", soft_wrap=True)  # fmt: skip
        return
    said = rules_text(data.get("findings_rules") or {})
    count = len(data.get("findings") or [])
    console.print(f"findings: {count or 'none'}" + (f" (rules: {said})" if said else ""), soft_wrap=True)
    for line in lines:
        console.print(f"finding: {line}", soft_wrap=True, style="bold")


def print_profile(data: dict, *, top: int = TOP_ROWS, console=None) -> None:
    """The published-shape table, the categories, the top per-op rows of a profile.json dict (each with its bytes
    per step, their source and its HLO text, where recorded) and the findings. The category
    table labels each column for what it is: the share and ms over all traced steps (the headline, mean-based
    figures) beside the typical step's share (each op at its median event time)."""
    console = console or make_console()
    console.print(_summary_table(data))
    console.print(_categories_table(data))
    console.print(_ops_table(data, top))
    print_findings(data, console)
    for note in data.get("notes") or []:
        console.print(f"note: {note}")


def _summary_table(data: dict):
    """The profile's summary: the published shape's rows, the roofline's ceiling, bytes per step, step times, the
    batch and the profiled shape."""
    from rich.table import Table

    from bench.profile.analysis import format_profile_table

    device = data.get("device") or {}
    title = f"profile: {data['steps']} decode steps on {device.get('device_kind') or device.get('platform', '?')}"
    summary = Table(title=title)
    summary.add_column("")
    summary.add_column("value (all traced steps)", justify="right")
    for label, value in format_profile_table(data):
        summary.add_row(label, value)
    for label, value in _roofline_rows(data) + _step_rows(data):
        summary.add_row(label, value)
    return summary


def _roofline_rows(data: dict) -> list[tuple[str, str]]:
    """The summary's rows of the roofline: its ceiling (or, recorded before it, the read-only bandwidth), bytes per
    step and the rate it used."""
    from bench.runs.ceiling import Ceiling

    rows, roof, read = [], data.get("roofline") or {}, data.get("read_bandwidth") or {}
    ceiling = Ceiling.from_json(data["ceiling"]) if isinstance(data.get("ceiling"), dict) else None
    if ceiling is not None:
        rows.append(("roofline ceiling", ceiling.line))
    elif read.get("bytes_per_s"):  # a profile recorded before the ceiling: its share is against the copy
        copy = roof.get("bandwidth_bytes_s")
        vs = f"; {read['bytes_per_s'] / copy:.2f} x the copy" if copy else ""
        rows.append(("read-only bandwidth", f"{read['bytes_per_s'] / 2**30:,.3f} GiB/s (recorded before the "
                     f"read-rate ceiling: this profile's share is against the copy{vs})"))  # fmt: skip
    if roof.get("bytes_per_step") is not None:
        rows.append(("bytes per step", f"{roof['bytes_per_step'] / 2**20:,.1f} MiB"))
        source = "decode gauge (sweep)" if roof["tok_s_source"] == "gauge" else "device-time rate"
        rows.append(("tok/s used", f"{roof['tok_s']:.1f} ({source})"))
    return rows


def _step_rows(data: dict) -> list[tuple[str, str]]:
    """The summary's rows of a step: the bytes its ops move, its device time (mean and typical), the batch and the
    profiled shape."""
    rows, totals, config = [], data["totals"], data.get("config") or {}
    if totals.get("op_bytes_per_step") is not None:
        sources = ", ".join(f"{n} ops {src}" for src, n in (totals.get("op_bytes_sources") or {}).items() if n)
        unknown = totals.get("op_bytes_unknown_pct") or 0.0
        rows.append(("bytes moved by the ops per step", f"{_bytes_text(totals['op_bytes_per_step'])} (read + "
                     f"written; {sources or 'no op with bytes'}" + (f"; {unknown:.1f}% of device time in ops "
                     "without bytes" if unknown else "") + ")"))  # fmt: skip
    rows.append(("ms per step (device)", f"{totals['ms_per_step']:.3f}"))
    if totals.get("typical_step_ms") is not None:
        rows.append(("typical step (device)", f"{totals['typical_step_ms']:.3f} ms (each op at its median)"))
    if (config.get("batch") or 1) > 1:
        rows.append(("batch", f"{config['batch']} rows per decode step (the sweep's batch cell)"))
    if config.get("kv_cache_positions") is not None:
        rows.append(("profiled shape", f"bucket {config['bucket']} + {config['max_new_tokens']} new tokens = KV "
                     f"cache of {config['kv_cache_positions']} positions"))  # fmt: skip
    return rows


def _categories_table(data: dict):
    """Device time by category: over all traced steps, and in the typical step."""
    from rich.table import Table

    cats = Table(title="device time by category: over all traced steps, and in the typical step (each op at its "
                       "median time: steadier on a busy machine)")  # fmt: skip
    typical = data.get("categories_typical_step") or {}
    for col in ("category", "share (all steps)", "ms (all steps)", "share (typical step)"):
        cats.add_column(col, justify="left" if col == "category" else "right")
    for name, cat in data["categories"].items():
        typ = (typical.get(name) or {}).get("pct")
        typ_text = "—" if name not in typical else "absent" if typ is None else f"{typ:.1f}%"
        if cat.get("pct") is None:
            cats.add_row(name, "absent", "—", typ_text)
        else:
            cats.add_row(name, f"{cat['pct']:.1f}%", f"{cat['ms']:.3f}", typ_text)
    return cats


def _ops_table(data: dict, top: int):
    """The top `top` per-op rows, with their bytes per step, its source and the HLO text where recorded."""
    from rich.table import Table

    rows = data["ops"][:top]
    with_hlo_op = any(row["hlo_op"] != row["name"] for row in rows)  # a GPU kernel ran for an op of another name
    with_bytes = any("bytes_per_step" in row for row in rows)  # absent from a profile.json older than op bytes
    ops = Table(title=f"top {min(top, len(data['ops']))} of {data.get('ops_total_rows', len(data['ops']))} ops/kernels"
                + (" (bytes per step: read + written)" if with_bytes else ""))  # fmt: skip
    numeric = ("count", "total ms", "mean ms", "share", "bytes/step")
    columns = ["name", *(["hlo op"] if with_hlo_op else []), "module", "category", "count", "total ms", "mean ms",
               "share", *(["bytes/step", "bytes from", "HLO"] if with_bytes else [])]  # fmt: skip
    widths = {"name": 40, "hlo op": 32, "HLO": 64, "bytes from": 12}
    for col in columns:
        ops.add_column(col, justify="right" if col in numeric else "left", overflow="fold", max_width=widths.get(col))
    for row in rows:
        cells = [row["name"], *([row["hlo_op"]] if with_hlo_op else []), row["hlo_module"], row["category"],
                 str(row["count"]), f"{row['total_ms']:.3f}", f"{row['mean_ms']:.4f}", f"{row['pct']:.1f}%"]  # fmt: skip
        if with_bytes:
            source = {"trace bytes_accessed": "trace", "bytes from shapes": "shapes",
                      "bytes from op text shapes": "op text"}.get(row.get("bytes_source") or "", "—")  # fmt: skip
            cells += [_bytes_text(row.get("bytes_per_step")), source, row.get("hlo") or "—"]
        ops.add_row(*cells)
    return ops


def _open_hint(trace_root: Path) -> str:
    """How to open the trace, naming the viewer this environment actually has (xprof beside this Python first)."""
    import sys

    beside = Path(sys.executable).parent / "xprof"
    xprof = str(beside) if beside.exists() else shutil.which("xprof")
    if xprof:
        return f"open it with: {xprof} --logdir {trace_root}   (then the URL it prints, Profile tab)"
    if shutil.which("tensorboard"):
        return f"open it with: tensorboard --logdir {trace_root}   (with tensorboard-plugin-profile installed)"
    return f"open it with xprof (pip install xprof): xprof --logdir {trace_root}"


# ---- bench profile ---------------------------------------------------------------------------------------------
StepsOpt = typer.Option(20, "--steps", help="Decode steps to trace (exactly this many, after 2 warm-up steps). The "
                        "profiled shape does not depend on it: the sweep's cell shape (with --run, the run's cell; "
                        "otherwise max_new_tokens 64, or what the positions leave); steps past its budget restart from "
                        "the post-warm-up state.")  # fmt: skip
InputTokensOpt = typer.Option(41, "--input-tokens", help="Prompt size in tokens, BOS and chat template included: the "
                              "sweep's natural-text prompt of exactly this size is prefilled before the traced steps "
                              "(its bucket is the decode shape profiled). From the chat template's minimum up to "
                              "--max-length.")  # fmt: skip
RunOpt = typer.Option(None, "--run", help="Add the profile to this existing run folder (a path, a name in --runs-dir, "
                      "or 'latest': the newest measured sweep run). A published run is refused, and so is a run that "
                      "has a profile already, unless --replace. The run keeps its status, whatever happens.")  # fmt: skip
ReplaceOpt = typer.Option(False, "--replace", help="With --run: overwrite the run's profile.json (earlier traces under "
                          "profile/ are kept). Without it, a run's profile is never overwritten.")  # fmt: skip
NameOpt = typer.Option(None, "--name", help="Label of the new run folder when --run is not given (default 'profile', "
                       "suffixed -2, -3, ... when taken). It ends complete, incomplete (Ctrl-C, SIGTERM) or failed (an "
                       "error).")  # fmt: skip
RunsDirOpt = typer.Option(Path("runs"), "--runs-dir", help="Where run folders are archived.")
PythonTracerOpt = typer.Option(False, "--python-tracer", help="Also trace Python calls (large traces).")
BatchOpt = typer.Option(1, "--batch", help="Rows decoded per step: B different prompts of --input-tokens each (the "
                        "sweep's batch cell), so the device-time categories can be read per batch size. With --run the "
                        "roofline uses the run's (input tokens, B) cell. Default 1.")  # fmt: skip


@profile_app.callback(invoke_without_command=True)
@engine_options("dtype", "weight_dtype", "max_length", "quant", "scale_dtype", "kernel", "backend", "mesh",
                help_more={"quant": "With --run: default the run's quantization.", "kernel": "With --run: default the "
                           "run's.", "mesh": "With --run: default the run's."})  # fmt: skip
def profile(
    ctx: typer.Context,
    steps: int = StepsOpt, input_tokens: int = InputTokensOpt, checkpoint: str | None = CheckpointOpt,
    engine_flags: EngineFlags = EngineFlags(), run_ref: str | None = RunOpt, replace: bool = ReplaceOpt,
    name: str | None = NameOpt, runs_dir: Path = RunsDirOpt, python_tracer: bool = PythonTracerOpt,
    compile_cache: str | None = CompileCacheOpt, batch: int = BatchOpt,
) -> None:
    """Trace exactly N decode steps into <run>/profile/, analyse them, measure bandwidth, write profile.json.

    Without --run, into a new run folder. With --run, into an existing measured run, which keeps its status: a
    published run is refused, and a run that has a profile already too unless --replace (nothing already measured
    is lost without asking). Ctrl-C or SIGTERM stop at once (exit code 130): a new run is marked incomplete, a
    joined one is left as it was, unlocked.
    """
    import dataclasses

    from bench.profile.command import ProfileRequest, run_profile

    if ctx.invoked_subcommand is not None:
        return
    request = ProfileRequest(steps=steps, input_tokens=input_tokens, batch=batch, checkpoint=checkpoint,
                             run_ref=run_ref, replace=replace, name=name, runs_dir=runs_dir,
                             python_tracer=python_tracer, compile_cache=compile_cache)  # fmt: skip
    setup_logging()
    data, capture, path = run_profile(request, dataclasses.asdict(engine_flags))
    console = make_console()
    print_profile(data, console=console)
    console.print(f"trace: {capture.xplane_path} ({capture.xplane_bytes / 2**20:.2f} MiB, {capture.n_steps} steps)")
    console.print(_open_hint(path.parent / "profile"), soft_wrap=True)
    console.print(f"profile.json: {path}")


# ---- bench profile analyze ---------------------------------------------------------------------------------------
@profile_app.command("analyze")
def analyze(
    trace: Path = typer.Argument(..., help="A *.xplane.pb, a folder holding one, or a run folder with profile/."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile.json content instead of tables."),
    top: int = typer.Option(TOP_ROWS, "--top", help="Per-op rows to print."),
    update: bool = typer.Option(False, "--update", help="Rewrite the run folder's profile.json with this analysis "
                                "(its config, capture and bandwidth kept; `reanalysed` says when, with which code)."),
) -> None:
    """Analyse any saved trace. In a run folder whose profile.json has a roofline, that roofline is kept.

    `--update` (a run folder with profile.json and the trace it names, else one line and exit 2): that trace,
    whatever other traces lie under profile/, is analysed again and the analysis keys of profile.json are replaced
    (the categories, totals, ops and notes, e.g. after the classification of a platform's ops improved);
    `reanalysed` records the time (UTC ISO) and the git state of this checkout; what the capture recorded (config,
    capture, bandwidth) stays."""
    import json

    from bench.profile.analysis import analyze_trace, attach_roofline

    stored = _stored_profile(trace)
    if update and stored is None:
        raise InputError(f"--update {trace}: expected a run folder holding manifest.json and profile.json; "
                         f"analyse a bare trace without --update")  # fmt: skip
    # TraceError (exit 2) for a missing path, a non-trace, a run without a profile
    analysis = analyze_trace(_named_trace(Path(trace), stored) if update else trace)
    roof = (stored or {}).get("roofline") or {}
    stored_trace = Path(trace) / (stored or {}).get("trace", "") if stored else None  # relative to the run folder
    same_trace = stored_trace is not None and stored_trace.resolve() == Path(analysis.trace_path).resolve()
    reattached = same_trace and roof.get("bytes_per_step") is not None and bool(roof.get("bandwidth_bytes_s"))
    if reattached:
        gauge = roof["tok_s"] if roof.get("tok_s_source") == "gauge" else None
        analysis = attach_roofline(analysis, bytes_per_step=roof["bytes_per_step"],
                                   bandwidth_bytes_s=roof["bandwidth_bytes_s"],
                                   bandwidth_n_bytes=roof.get("bandwidth_n_bytes"), gauge_tok_s=gauge)  # fmt: skip
    data = analysis.to_json()
    if stored is not None:  # a run folder: its trace named relative to it, as profile.json does
        data["trace"] = os.path.relpath(analysis.trace_path, trace)
    if reattached:  # measured with the capture: its read probes, ceiling and findings stay with its roofline
        for key in ("read_bandwidth", "read_probes", "ceiling", "roofline_findings"):
            if stored.get(key):
                data[key] = stored[key]
        if roof.get("bandwidth_kind"):
            data["roofline"]["bandwidth_kind"] = roof["bandwidth_kind"]
    if update:
        _rewrite_profile(Path(trace), stored, data)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console = make_console()
    print_profile(data, top=top, console=console)
    if reattached:
        console.print(f"roofline from {Path(trace) / 'profile.json'} (bytes per step and bandwidth of the capture)")
    console.print(f"trace: {analysis.trace_path} ({Path(analysis.trace_path).stat().st_size / 2**20:.2f} MiB)")


CAPTURE_NOTE_OPENINGS = ("roofline uses ", "profiled on a GPU without", "GPU profile flags were set", "--steps ",
                         "run folder differs from this profile", "finding: roofline share")  # fmt: skip
"""How the notes `bench profile` adds to the analysis's begin (`_roofline_inputs`, `_capture_notes`): `--update`
keeps them when an older profile.json has no `capture_notes`."""


def _named_trace(run_path: Path, stored: dict) -> Path:
    """The trace `stored` profile.json names (relative to the run folder `run_path`), for `--update`: that one,
    not the newest under profile/ (an earlier `--replace` leaves older traces, and a copy can reorder their times).
    InputError (one line) when profile.json names none or it is not there (traces are not archived with a run)."""
    name = stored.get("trace")
    if not isinstance(name, str) or not name:
        raise InputError(f"--update {run_path}: its profile.json names no trace (a published or hand-made "
                         f"profile); nothing to analyse again")  # fmt: skip
    path = run_path / name
    if not path.is_file():
        raise InputError(f"--update {run_path}: the trace its profile.json names, {name}, is not there; put it "
                         f"back (a run is archived without its traces) and run this again")  # fmt: skip
    return path


def _rewrite_profile(run_path: Path, stored: dict, data: dict) -> None:
    """Write `data` (a fresh analysis of the trace profile.json names, `_named_trace`) over `stored` profile.json's
    analysis keys, keeping its other keys and the capture's notes (`capture_notes`, else `CAPTURE_NOTE_OPENINGS`)
    after the analysis's, plus `reanalysed` ({"at": UTC ISO time, "git": this checkout's commit and dirtiness})."""
    from bench.runs import now_iso, open_run
    from bench.runs.environment import git_state

    kept = stored.get("capture_notes")
    if kept is None:  # written before `capture_notes` existed: the capture's notes by their openings
        kept = [n for n in stored.get("notes") or [] if n.startswith(CAPTURE_NOTE_OPENINGS)]
    merged = {**stored, **data, "notes": [*data["notes"], *kept], "capture_notes": kept,
              "reanalysed": {"at": now_iso(), "git": git_state(Path(__file__).resolve().parents[2])}}  # fmt: skip
    open_run(run_path).write_json("profile.json", merged)
    at = merged["reanalysed"]["at"]
    make_console().print(f"profile.json of {run_path} rewritten with this analysis (reanalysed {at})")


def _stored_profile(path: Path) -> dict | None:
    """profile.json of a run folder `path`, or None (not a run folder, or no profile.json)."""
    if not (Path(path) / "profile.json").is_file() or not (Path(path) / "manifest.json").is_file():
        return None
    from bench.runs import open_run

    return open_run(path).profile()


# ---- bench bandwidth -------------------------------------------------------------------------------------------
@app.command()
def bandwidth(
    n_bytes: int | None = typer.Option(None, "--bytes", help="Bytes to copy, and to read (default: 256 MiB on CPU, "
                                       "2 GiB on GPU and TPU)."),
    repeats: int = typer.Option(10, "--repeats", help="Timed copies, and timed reads (the median is reported)."),
) -> None:
    """Measure the device's memory bandwidth: a large device-to-device copy (read + written bytes / time), then the
    read-only probes over a buffer of the same size (bytes read / time: XLA's reduction, and on a TPU the Pallas
    streaming read), and print the roofline ceiling they give with the datasheet figure: max(fastest read,
    datasheet) (docs/method.md, "Rooflines")."""
    from bench.profile.bandwidth import MiB, measure_bandwidth, measure_read_probes
    from bench.runs.ceiling import datasheet_for, roofline_ceiling

    if n_bytes is not None and n_bytes < MiB:
        raise InputError(f"--bytes {n_bytes}: expected at least {MiB} (1 MiB)")
    if repeats < 1:
        raise InputError(f"--repeats {repeats}: expected a whole number >= 1")
    setup_logging()
    try:
        r = measure_bandwidth(n_bytes, repeats)
        reads = measure_read_probes(n_bytes, repeats)
    except Exception as exc:  # the device could not hold the buffers: a user-sized request, not a crash
        if "RESOURCE_EXHAUSTED" in str(exc) or "Out of memory" in str(exc):
            raise InputError(f"--bytes {n_bytes}: the device cannot hold two buffers of that size; choose fewer bytes") from None
        raise
    typer.echo(f"device: {r.device_kind} ({r.platform})")
    typer.echo(f"bandwidth: {r.gib_s:,.2f} GiB/s = {r.gb_s:,.2f} GB/s")
    typer.echo(f"copy of {r.n_bytes / MiB:,.0f} MiB: {r.bytes_moved:,} bytes moved (read + written), "
               f"median {r.median_s * 1e3:.3f} ms over {r.repeats} repeats")  # fmt: skip
    for read in reads.probes:
        typer.echo(f"read-only bandwidth: {read.gib_s:,.2f} GiB/s = {read.gb_s:,.2f} GB/s "
                   f"({read.bytes_per_s / r.bytes_per_s:.2f} x the copy); {read.n_bytes / MiB:,.0f} MiB read, median "
                   f"{read.median_s * 1e3:.3f} ms over {read.repeats} repeats: {read.method}")  # fmt: skip
    sheet = datasheet_for(r.device_kind)
    typer.echo(f"datasheet: {sheet.line if sheet else 'none known for ' + r.device_kind}")
    fastest = reads.fastest
    ceiling = roofline_ceiling(fastest.bytes_per_s, fastest.method, r.device_kind, copy_bytes_s=r.bytes_per_s)
    typer.echo(ceiling.line)
    typer.echo(f"method: {r.method}")
