"""`bench profile` (capture + analyse N decode steps), `bench profile analyze` (any saved trace), `bench bandwidth`.

Definitions: docs/method.md, "Profiles" and "Rooflines". The library does the work (`bench.profile.capture`,
`bench.profile.analysis`, `bench.profile.bandwidth`); this module parses flags, writes the run folder and prints.

GPU flags: XLA reads XLA_FLAGS once, when jax initialises its backend, so `bench profile` decides whether it is
about to run on an NVIDIA GPU *without* initialising jax: `JAX_PLATFORMS` when set (its first entry "cuda"/"gpu"
means yes, anything else no), otherwise the presence of an NVIDIA driver (`nvidia-smi` on PATH or
`/proc/driver/nvidia/version`). Then it adds `gpu_profile_flags()` (command buffers off, for per-op attribution)
before the engine loads. What was decided, why, and the XLA_FLAGS in force are recorded in profile.json
("capture"). If the guess was wrong in either direction the analysis still works; a note says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from bench.cli import app
from bench.cli.common import (
    KERNEL_HELP,
    BackendOpt,
    CheckpointOpt,
    CompileCacheOpt,
    DtypeOpt,
    MaxLengthOpt,
    QuantOpt,
    ScaleDtypeOpt,
    WeightDtypeOpt,
    make_console,
    open_engine,
    parse_backend_flag,
    parse_kernel_flag,
    parse_quant_flags,
    setup_logging,
)
from bench.errors import InputError
from bench.runs.manifest import kernel_text, w4_kernel_of

TRACE_BYTES_PER_LAYER_STEP = 78_756
"""Host memory (bytes) one traced decode step adds per decoder layer, for bounding `--steps` before anything loads
(`check_trace_memory`). Measured: `bench profile` on the default preset (35 layers, float32, XLA:CPU, this
project's 2-core host), peak resident memory (GNU time) 1,806,528 KiB at --steps 20 and 2,614,060 KiB at --steps
320: 2,691.8 KiB per step, / 35 layers. The tiny preset grew less (0.13 MiB per step over 6 layers), so the bound
is generous there; an 8,200-step profile of the default preset was killed for memory at 20.7 GB (issue 42)."""

profile_app = typer.Typer(
    help="Profile N decode steps (xprof trace, where device time goes, roofline share) into a new run, or with --run "
    "into an existing measured one (never a published one; a profile it has is replaced only with --replace). "
    "Ctrl-C / SIGTERM stop at once (exit 130): a new run ends incomplete, a joined one as it was. `analyze` re-reads "
    "a trace.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(profile_app, name="profile")

WARMUP_STEPS = 2
TOP_ROWS = 15
QUANT_HELP_PROFILE = QuantOpt.help + " With --run: default the run's quantization."


# ---- helpers -----------------------------------------------------------------------------------------------------
def nvidia_gpu_expected(environ: dict[str, str] | None = None) -> tuple[bool, str]:
    """Whether jax is about to run on an NVIDIA GPU, decided without initialising jax, and why (see module doc)."""
    env = os.environ if environ is None else environ
    platforms = env.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        first = platforms.split(",")[0].strip()
        return first in ("cuda", "gpu"), f"JAX_PLATFORMS={platforms}"
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia/version").exists():
        return True, "an NVIDIA driver is present (nvidia-smi or /proc/driver/nvidia)"
    return False, "no NVIDIA driver found (no nvidia-smi, no /proc/driver/nvidia) and JAX_PLATFORMS unset"


def _set_gpu_flags() -> dict[str, Any]:
    """Put the GPU profile flags into XLA_FLAGS when an NVIDIA GPU is expected and jax is not initialised yet."""
    from bench.profile.capture import apply_gpu_profile_flags, gpu_profile_flags

    expected, reason = nvidia_gpu_expected()
    info: dict[str, Any] = {"nvidia_gpu_expected": expected, "reason": reason, "gpu_flags": list(gpu_profile_flags()),
                            "gpu_flags_applied": False}  # fmt: skip
    if expected:
        try:
            apply_gpu_profile_flags()
            info["gpu_flags_applied"] = True
        except RuntimeError as exc:  # jax already initialised in this process (e.g. called from Python, not a shell)
            info["reason"] += f"; not applied: {exc}"
    return info


def _sweep_gauge(run, n_tokens: int, batch: int = 1):
    """The run's valid sweep cell for `n_tokens` at `batch` rows (a cell of a sweep without --batch is B = 1) with
    a gauge, or None."""
    for cell in run.cells():
        if (cell.input_tokens, cell.batch or 1) == (n_tokens, batch) and cell.valid and cell.gauge_tok_s_median is not None:
            return cell
    return None


def _profile_shape(engine, input_tokens: int, cell) -> int:
    """max_new_tokens of the profiled shape, which `--steps` never changes: the KV cache holds bucket +
    max_new_tokens positions and XLA's decode attention reads all of them (the CPU kernel: the visible ones, and
    each chunk of them), so a shape that grew with N would make a longer profile describe a different, slower
    program (bench.profile.capture, "Steps past the decode budget").
    Joining a run with a sweep cell at this size: the cell's own max_new_tokens (its compiled shape); otherwise
    the sweep's default cell shape (`SweepConfig.max_new_tokens`), shortened to the positions left after the
    prompt. At least the prefill's token, WARMUP_STEPS warm-up and one traced step; traced steps past the shape's
    budget restart (`capture_steps(restart_every=...)`). Checked against the engine's limits in this command's
    terms: InputError naming --input-tokens or --max-length, the limit, and the values that fit (the engine's own
    error would name the sweep's flags)."""
    from bench.measure.prompts import min_prompt_tokens
    from bench.sweep.local import SweepConfig

    least = 1 + WARMUP_STEPS + 1
    cell_new = (cell.max_new_tokens or 0) if cell is not None else 0
    n, positions, longest = input_tokens, engine.cfg.max_position_embeddings, engine.buckets[-1]
    wanted = max(cell_new or SweepConfig.__dataclass_fields__["max_new_tokens"].default, least)
    lowest = min_prompt_tokens(engine.tokenizer) if engine.tokenizer is not None else 1
    highest = min(longest, positions - least)  # the largest prompt that leaves room for one traced step
    fits = []  # what would work instead, in this command's flags
    if lowest <= highest:
        fits.append(f"--input-tokens {lowest}..{highest}")
    elif longest < lowest:
        fits.append(f"--max-length {lowest}..{positions} (the smallest prompt is {lowest} tokens)")
    if engine.tokenizer is not None and n < lowest:
        raise InputError(f"--input-tokens {n}: below the smallest possible prompt, {lowest} tokens (BOS + chat "
                         f"template + 1 content token); pass --input-tokens {lowest} or more"
                         + (f" (expected {fits[0]})" if fits else ""))  # fmt: skip
    if n > longest:
        if n + least <= positions:  # raising the limit would do
            fits = [f for f in fits if not f.startswith("--max-length")]
            fits.append(f"--max-length {n}..{positions} (the model's positions) for this prompt")
        raise InputError(f"--input-tokens {n}: above the maximum prompt length {longest} (--max-length); expected "
                         + " or ".join(fits or ["a smaller --input-tokens"]))  # fmt: skip
    if n + wanted <= positions:
        return wanted
    used = f"{n + wanted} positions, above the model's {positions} (max_position_embeddings)"
    if cell_new and cell_new >= least:
        raise InputError(f"--input-tokens {n}: the run's sweep cell at {n} tokens decodes {cell_new} tokens, the "
                         f"shape the profile follows: {used} of this checkpoint; pass the run's own --checkpoint, or "
                         "drop --run to profile into a new run")  # fmt: skip
    if n + least <= positions:
        return positions - n  # the sweep's shape does not fit here; the largest that does, whatever --steps
    raise InputError(f"--input-tokens {n}: with the prefill's token, {WARMUP_STEPS} warm-up steps and one traced "
                     f"step that is {n + least} positions, above the model's {positions} (max_position_embeddings); "
                     "expected " + " or ".join(fits or ["a smaller --input-tokens"]))  # fmt: skip


def _check_shape_before_load(opts, joined) -> None:
    """`_profile_shape`'s checks of --input-tokens, from config.json and tokenizer.json alone, before the weights
    load: the same InputError line the check after the load gives (a 100,000-token prompt on E2B is refused in a
    second, not after minutes of loading). Skipped, and left to the check after the load, where the checkpoint's
    files are not on disk yet (a hub repo id, a built-in checkpoint not created yet) or --max-length is out of
    range (`open_engine` names it)."""
    from bench.cli.common import checkpoint_positions
    from model.builtin import DEFAULT_PRESET, builtin_path
    from model.errors import EngineError
    from model.limits import prompt_limits
    from model.tokenizer import GemmaTokenizer

    spec = opts.checkpoint or f"builtin:{DEFAULT_PRESET}"
    if spec.startswith("random:"):
        from bench.cli.common import parse_random_flag
        from model.random_weights import random_folder

        folder = random_folder(parse_random_flag(spec))
    else:
        folder = builtin_path(spec.split(":", 1)[1]) if spec.startswith("builtin:") else Path(spec).expanduser()
    positions = checkpoint_positions(opts.checkpoint)
    if positions is None or not (folder / "tokenizer.json").is_file():
        return
    if opts.max_length is not None and not 1 <= opts.max_length <= positions:
        return
    try:
        limits = prompt_limits(positions, max_length=opts.max_length)
    except EngineError:
        return
    try:
        tokenizer = GemmaTokenizer.from_dir(folder)
    except Exception:  # noqa: BLE001 - any unreadable tokenizer: the load after this reports it in its own terms
        return
    cell = _sweep_gauge(joined, opts.input_tokens, opts.batch) if joined is not None else None
    shape = SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=positions), buckets=limits.buckets,
                            tokenizer=tokenizer)  # fmt: skip
    _profile_shape(shape, opts.input_tokens, cell)


def _profile_prompt(engine, input_tokens: int, max_new_tokens: int, batch: int = 1):
    """The sweep's prompt of exactly `input_tokens` tokens (natural text in the chat template), built as the sweep
    builds its cells (InputError without a tokenizer); `_profile_shape` has checked the size first. With `batch`
    B > 1: the rows' prompts of the sweep's (input_tokens, B) cell, a tuple (`build_batch_prompts`), after the
    batch was checked to fit in memory (EngineError: one line, the largest batch that fits)."""
    from bench.sweep.local import SweepConfig, build_batch_prompts, build_prompts, check_batches

    config = SweepConfig(inputs=(input_tokens,), max_new_tokens=max_new_tokens, repeats=1,
                         batches=(batch,) if batch > 1 else ())  # fmt: skip
    prompt = build_prompts(engine, config, flag="--input-tokens")[input_tokens]
    if batch == 1:
        return prompt
    check_batches(engine, config)
    return build_batch_prompts(engine, config)[(input_tokens, batch)]


def _refuse_to_overwrite(run, replace: bool) -> None:
    """A run `bench profile --run` may not add to: a published one (its profile is a published figure; RunFolderError,
    nothing written), a sweep against a server or a load run (`--target`: another process's engine, not the one
    profiled here), a peer's run (another engine), or one that has a profile already, unless `replace` (nothing
    already measured is lost without saying so)."""
    from bench.errors import RunFolderError
    from bench.runs import PROFILE

    if run.provenance != "measured":
        raise RunFolderError(f"--run {run.path}: a {run.provenance} run (figures copied from its source); a profile "
                             "measured here cannot join it: drop --run to profile into a new run")  # fmt: skip
    manifest = run.typed_manifest
    if manifest.peer is not None:
        raise RunFolderError(f"--run {run.path}: a run of another engine ({manifest.peer.label}); a profile of ours "
                             "cannot join it: drop --run to profile into a new run")  # fmt: skip
    if manifest.extra.get("target") is not None or manifest.command == "sweep --target" or run.load_rows():
        raise RunFolderError(f"--run {run.path}: a sweep against a server (--target); a profile of the local engine "
                             "cannot join it: drop --run to profile into a new run")  # fmt: skip
    if (run.path / PROFILE).exists() and not replace:
        raise RunFolderError(f"--run {run.path}: already has a profile ({PROFILE}); pass --replace to overwrite "
                             "it (earlier traces under profile/ stay), or drop --run to profile into a new "
                             "run")  # fmt: skip


def _lock_joined(run, replace: bool):
    """Take `run`'s lock and check again, now that no other process can write it, that it may be added to."""
    run.lock()
    try:
        _refuse_to_overwrite(run, replace)
    except BaseException:
        run.unlock()
        raise
    return run


def _stop_at_once(signum, _frame) -> None:
    from bench.signals import stop_now

    stop_now(f"bench profile: stopped by {signal.Signals(signum).name}; no profile written")


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and Ctrl-C end `bench profile` at once (`bench.signals.stop_now`, exit 130): a trace cut short is
    worth nothing, so there is nothing to finish first, and raising KeyboardInterrupt from the handler is not
    safe: landing inside a garbage-collection callback (jax registers one) it is printed and discarded, and the
    profile would run on to "complete". The run ends as `bench.runs.writing_run` says for a hard stop: a run this
    command created is marked incomplete; a joined one keeps its status and is unlocked. A signal that arrives
    while a run's manifest or lock is being written is held until that write is done."""
    from bench.signals import stop_signals_handled

    with stop_signals_handled(_stop_at_once):
        yield


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
    from rich.table import Table

    from bench.profile.analysis import format_profile_table
    from bench.runs.ceiling import Ceiling

    console = console or make_console()
    device = data.get("device") or {}
    title = f"profile: {data['steps']} decode steps on {device.get('device_kind') or device.get('platform', '?')}"
    summary = Table(title=title)
    summary.add_column("")
    summary.add_column("value (all traced steps)", justify="right")
    for label, value in format_profile_table(data):
        summary.add_row(label, value)
    roof = data.get("roofline") or {}
    read = data.get("read_bandwidth") or {}
    ceiling = Ceiling.from_json(data["ceiling"]) if isinstance(data.get("ceiling"), dict) else None
    if ceiling is not None:
        summary.add_row("roofline ceiling", ceiling.line)
    elif read.get("bytes_per_s"):  # a profile recorded before the ceiling: its share is against the copy
        copy = roof.get("bandwidth_bytes_s")
        vs = f"; {read['bytes_per_s'] / copy:.2f} x the copy" if copy else ""
        summary.add_row("read-only bandwidth", f"{read['bytes_per_s'] / 2**30:,.3f} GiB/s (recorded before the "
                        f"read-rate ceiling: this profile's share is against the copy{vs})")  # fmt: skip
    if roof.get("bytes_per_step") is not None:
        summary.add_row("bytes per step", f"{roof['bytes_per_step'] / 2**20:,.1f} MiB")
        summary.add_row("tok/s used", f"{roof['tok_s']:.1f} ({'decode gauge (sweep)' if roof['tok_s_source'] == 'gauge' else 'device-time rate'})")
    totals = data["totals"]
    if totals.get("op_bytes_per_step") is not None:
        sources = ", ".join(f"{n} ops {src}" for src, n in (totals.get("op_bytes_sources") or {}).items() if n)
        unknown = totals.get("op_bytes_unknown_pct") or 0.0
        summary.add_row("bytes moved by the ops per step", f"{_bytes_text(totals['op_bytes_per_step'])} (read + "
                        f"written; {sources or 'no op with bytes'}" + (f"; {unknown:.1f}% of device time in ops "
                        "without bytes" if unknown else "") + ")")  # fmt: skip
    summary.add_row("ms per step (device)", f"{totals['ms_per_step']:.3f}")
    if totals.get("typical_step_ms") is not None:
        summary.add_row("typical step (device)", f"{totals['typical_step_ms']:.3f} ms (each op at its median)")
    config = data.get("config") or {}
    if (config.get("batch") or 1) > 1:
        summary.add_row("batch", f"{config['batch']} rows per decode step (the sweep's batch cell)")
    if config.get("kv_cache_positions") is not None:
        summary.add_row("profiled shape", f"bucket {config['bucket']} + {config['max_new_tokens']} new tokens = KV "
                        f"cache of {config['kv_cache_positions']} positions")  # fmt: skip
    console.print(summary)

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
    console.print(cats)

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
    console.print(ops)
    print_findings(data, console)
    for note in data.get("notes") or []:
        console.print(f"note: {note}")


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


def check_trace_memory(steps: int, checkpoint: str | None) -> None:
    """Refuse `--steps` whose trace cannot fit the host's memory, before the model loads: `steps` x the
    checkpoint's decoder layers (its config alone, `bench.cli.common.checkpoint_config`) x
    `TRACE_BYTES_PER_LAYER_STEP`, against the host's available memory now
    (`bench.runs.environment.host_available_bytes`; the trace is held in host memory on every device, and the
    model's own memory comes on top of it). Raises InputError (one line: the arithmetic, the most steps that fit, the
    fix). Does nothing when the layers or the available memory cannot be read before loading (a Hugging Face repo
    id, no /proc/meminfo)."""
    from bench.cli.common import checkpoint_config
    from bench.runs.environment import host_available_bytes

    cfg, available = checkpoint_config(checkpoint), host_available_bytes()
    if cfg is None or available is None:
        return
    per_step = cfg.num_layers * TRACE_BYTES_PER_LAYER_STEP
    if steps * per_step <= available:
        return
    most = available // per_step
    fix = f"pass --steps {most} or fewer (the default is 20)" if most >= 1 else "free host memory first"
    raise InputError(f"--steps {steps}: tracing {steps:,} decode steps needs about {steps * per_step / 2**30:.1f} "
                     f"GiB of host memory ({cfg.num_layers} layers x {TRACE_BYTES_PER_LAYER_STEP / 1024:.1f} KiB per "
                     f"layer and step, docs/commands/profile.md), more than the {available / 2**30:.1f} GiB "
                     f"available now; {fix}")  # fmt: skip


# ---- bench profile ---------------------------------------------------------------------------------------------
@profile_app.callback(invoke_without_command=True)
def profile(
    ctx: typer.Context,
    steps: int = typer.Option(20, "--steps", help="Decode steps to trace (exactly this many, after 2 warm-up steps). "
                              "The profiled shape does not depend on it: the sweep's cell shape (with --run, the "
                              "run's cell; otherwise max_new_tokens 64, or what the positions leave); steps past "
                              "its budget restart from the post-warm-up state."),
    input_tokens: int = typer.Option(41, "--input-tokens", help="Prompt size in tokens, BOS and chat template "
                                     "included: the sweep's natural-text prompt of exactly this size is prefilled "
                                     "before the traced steps (its bucket is the decode shape profiled). From the "
                                     "chat template's minimum up to --max-length."),
    checkpoint: str | None = CheckpointOpt,
    dtype: str | None = DtypeOpt,
    weight_dtype: str | None = WeightDtypeOpt,
    run_ref: str | None = typer.Option(None, "--run", help="Add the profile to this existing run folder (a path, a "
                                       "name in --runs-dir, or 'latest': the newest measured sweep run). A published "
                                       "run is refused, and so is a run that has a profile already, unless "
                                       "--replace. The run keeps its status, whatever happens."),
    replace: bool = typer.Option(False, "--replace", help="With --run: overwrite the run's profile.json (earlier "
                                 "traces under profile/ are kept). Without it, a run's profile is never overwritten."),
    name: str | None = typer.Option(
        None, "--name", help="Label of the new run folder when --run is not given (default 'profile', suffixed -2, "
        "-3, ... when taken). It ends complete, incomplete (Ctrl-C, SIGTERM) or failed (an error)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run folders are archived."),
    python_tracer: bool = typer.Option(False, "--python-tracer", help="Also trace Python calls (large traces)."),
    max_length: int | None = MaxLengthOpt,
    compile_cache: str | None = CompileCacheOpt,
    quant: str | None = typer.Option(None, "--quant", help=QUANT_HELP_PROFILE),
    scale_dtype: str | None = ScaleDtypeOpt,
    kernel: str | None = typer.Option(None, "--kernel", help=KERNEL_HELP + " With --run: default the run's."),
    backend: str | None = BackendOpt,
    batch: int = typer.Option(1, "--batch", help="Rows decoded per step: B different prompts of --input-tokens each "
                              "(the sweep's batch cell), so the device-time categories can be read per batch size. "
                              "With --run the roofline uses the run's (input tokens, B) cell. Default 1."),
) -> None:
    """Trace exactly N decode steps into <run>/profile/, analyse them, measure bandwidth, write profile.json.

    Without --run, into a new run folder. With --run, into an existing measured run, which keeps its status: a
    published run is refused, and a run that has a profile already too unless --replace (nothing already measured
    is lost without asking). Ctrl-C or SIGTERM stop at once (exit code 130): a new run is marked incomplete, a
    joined one is left as it was, unlocked.
    """
    if ctx.invoked_subcommand is not None:
        return
    if steps < 1:
        raise InputError(f"--steps {steps}: expected a whole number of decode steps >= 1")
    if input_tokens < 1:
        raise InputError(f"--input-tokens {input_tokens}: expected a positive prompt size in tokens (BOS and chat "
                         "template included), e.g. --input-tokens 41")  # fmt: skip
    if batch < 1:
        raise InputError(f"--batch {batch}: expected a whole number of rows >= 1, e.g. --batch 16")
    from bench.runs import check_writable, open_run, resolve_run, writing_run

    parse_quant_flags(quant, scale_dtype)  # one line for a bad value, before any run is opened
    if run_ref is not None and name is not None:
        raise InputError("--run and --name: a profile joins an existing run (--run) or starts one (--name), not both")
    if replace and run_ref is None:
        raise InputError("--replace overwrites the profile of a run named with --run; a new run has none to replace")
    joined = None
    if run_ref is not None:
        joined = open_run(resolve_run(run_ref, runs_dir))  # RunFolderError names the folder
        _refuse_to_overwrite(joined, replace)  # before anything, even the lock, is written into it
        ran = joined.typed_manifest.engine
        if quant is None:  # profile the payload the run measured
            quant, scale_dtype = ran.quantization or "none", scale_dtype or ran.scale_dtype
        _refuse_other_quant(ran, quant, scale_dtype)
        if kernel is None:  # the run's w4 product, not this machine's default (its CPU kernel: its weight dtype)
            kernel = w4_kernel_of(ran.kernel)
        if weight_dtype is None and ran.weight_dtype not in (None, ran.compute_dtype):  # e.g. bfloat16 on CPU
            weight_dtype = ran.weight_dtype
        if backend is None:  # the engine the run measured (None in a run from before it was recorded: the default)
            backend = ran.backend
    check_trace_memory(steps, checkpoint)  # the trace's memory, before anything loads
    # where the profile is written, checked before anything loads (one line, exit 2)
    if joined is not None:
        check_writable(joined.path, flag="--run")
    else:
        check_writable(runs_dir)
    parse_kernel_flag(kernel, quant)  # one line for a bad value, before anything loads
    parse_backend_flag(backend)

    opts = SimpleNamespace(steps=steps, input_tokens=input_tokens, checkpoint=checkpoint, dtype=dtype,
                           weight_dtype=weight_dtype, name=name, runs_dir=runs_dir, python_tracer=python_tracer,
                           max_length=max_length, compile_cache=compile_cache, quant=quant, scale_dtype=scale_dtype,
                           kernel=kernel, backend=backend, batch=batch, capturing=False)  # fmt: skip

    def log_joined_end(run, status: str) -> None:  # a refused flag (before the capture) leaves the run as it was
        if status != "complete" and opts.capturing:
            run.log(f"profile {status}: profile.json not written; the run keeps its status ({run.status})")

    with _signals_interrupt():
        if joined is None:
            data, capture, path = _profile(None, opts)
        else:  # no other process writes the run meanwhile; it keeps its status however this ends
            with writing_run(lambda: _lock_joined(joined, replace), joined=True, before_end=log_joined_end) as run:
                data, capture, path = _profile(run, opts)

    console = make_console()
    print_profile(data, console=console)
    console.print(f"trace: {capture.xplane_path} ({capture.xplane_bytes / 2**20:.2f} MiB, {capture.n_steps} steps)")
    console.print(_open_hint(path.parent / "profile"), soft_wrap=True)
    console.print(f"profile.json: {path}")


def _profile(joined, opts):
    """Load the engine, check the shape, then capture and analyse into `joined` (a locked run) or into a new run
    this creates (ended by `writing_run`). Returns (profile.json dict, the capture, profile.json's path)."""
    from bench.cli.common import engine_manifest
    from bench.cli.sweep_cmds import sweep_workload
    from bench.runs import create_run, free_label, writing_run

    flags_info = _set_gpu_flags()  # before anything initialises jax
    setup_logging()
    _check_shape_before_load(opts, joined)
    engine, report, ckpt, cache_dir = open_engine(opts.checkpoint, opts.dtype, opts.max_length, opts.compile_cache,
                                                  opts.weight_dtype, quant=opts.quant,
                                                  scale_dtype=opts.scale_dtype, kernel=opts.kernel,
                                                  backend=opts.backend)  # fmt: skip
    cell = _sweep_gauge(joined, opts.input_tokens, opts.batch) if joined is not None else None
    # One shape whatever --steps: joining a sweep cell, its compiled shape (the same KV buffer), so the categories,
    # ms per step and the cell's gauge describe one program; every traced position stays inside the model's.
    max_new_tokens = _profile_shape(engine, opts.input_tokens, cell)
    prompt = _profile_prompt(engine, opts.input_tokens, max_new_tokens, opts.batch)
    setup = SimpleNamespace(engine=engine, ckpt=ckpt, cell=cell, max_new_tokens=max_new_tokens, prompt=prompt,
                            flags_info=flags_info, content_hash=report.get("content_hash"))  # fmt: skip
    if joined is not None:
        return _capture_into(joined, setup, opts)

    config = SimpleNamespace(inputs=(opts.input_tokens,), max_new_tokens=max_new_tokens, repeats=None)
    decode_bytes = {str(opts.input_tokens): engine.decode_bytes(opts.input_tokens, max_new_tokens, batch=opts.batch)}
    batch_note = {"profile_batch": opts.batch} if opts.batch > 1 else {}
    workload = sweep_workload(config, profile_steps=opts.steps, profile_warmup=WARMUP_STEPS, **batch_note)
    manifest = engine_manifest("profile", engine, report, opts.checkpoint, cache_dir, workload,
                               extra={"decode_bytes": decode_bytes})  # fmt: skip
    slug = manifest.slug or "unknown"

    def start():
        return create_run(opts.runs_dir, opts.name or free_label(opts.runs_dir, "profile", slug), slug, manifest)

    with writing_run(start) as run:  # complete, or incomplete (a signal), or failed (an error); never left running
        return _capture_into(run, setup, opts)


def _capture_into(run, setup, opts):
    """Trace, analyse, measure bandwidth (the copy, and the read-only probes whose fastest, or the device's
    datasheet figure where larger, is the roofline's ceiling: bench/runs/ceiling.py), write `run`/profile.json (the
    caller ends the run)."""
    from bench.profile.analysis import analyze_trace, attach_roofline
    from bench.profile.bandwidth import measure_bandwidth, measure_read_probes
    from bench.profile.capture import batch_decode_steps, capture_steps, prompt_decode_steps
    from bench.runs.ceiling import CEILING_KEY, FINDINGS_KEY, finding_of, roofline_ceiling
    from model.backends import xla_options_line

    opts.capturing = True
    log = logging.getLogger("bench")
    engine, max_new_tokens = setup.engine, setup.max_new_tokens
    bucket = engine.bucket_for(opts.input_tokens)
    log.info(f"run folder: {run.path}")
    run.log(engine.policy.line())
    if (options_line := xla_options_line(engine.xla_options, engine.policy.platform)) is not None:
        run.log(options_line)
    mismatch = _run_mismatches(run, setup)

    if opts.batch == 1:
        state, step = prompt_decode_steps(engine, setup.prompt.ids, max_new_tokens)
    else:
        state, step = batch_decode_steps(engine, [p.ids for p in setup.prompt], max_new_tokens)
    rows = f" x {opts.batch} rows (the sweep's batch cell prompts)" if opts.batch > 1 else ""
    log.info(f"profiling {opts.steps} decode steps after a prompt of {opts.input_tokens} input tokens{rows} "
             f"(bucket {bucket}) and {WARMUP_STEPS} warm-up steps")  # fmt: skip
    capture = capture_steps(step, state, opts.steps, run.path / "profile", warmup=WARMUP_STEPS,
                            python_tracer=opts.python_tracer,
                            restart_every=max_new_tokens - 1 - WARMUP_STEPS)  # fmt: skip
    del state
    run.log(f"captured {capture.n_steps} decode steps: {capture.xplane_path} ({capture.xplane_bytes} bytes)")
    analysis = analyze_trace(capture.xplane_path)

    log.info("measuring device bandwidth (device-to-device copy, then the read-only probes)")
    bw = measure_bandwidth()
    reads = measure_read_probes()
    read_bw = reads.fastest
    ceiling = roofline_ceiling(read_bw.bytes_per_s, read_bw.method, read_bw.device_kind, copy_bytes_s=bw.bytes_per_s)
    decode_bytes, gauge, gauge_note = _roofline_inputs(engine, setup.cell, opts.input_tokens, max_new_tokens,
                                                       opts.batch)  # fmt: skip
    analysis = attach_roofline(analysis, bytes_per_step=decode_bytes["total"], bandwidth_bytes_s=ceiling.bytes_per_s,
                               bandwidth_n_bytes=read_bw.n_bytes, gauge_tok_s=gauge)  # fmt: skip
    notes = [gauge_note, *_capture_notes(capture, setup.flags_info, opts.steps, max_new_tokens)]
    notes += [f"run folder differs from this profile: {m}" for m in mismatch]
    roof = analysis.roofline
    cell = str(opts.input_tokens) if opts.batch == 1 else f"{opts.input_tokens}x{opts.batch}"
    found = finding_of(cell, f"profile, {roof.tok_s_source} rate", roof.share_pct, roof.bytes_per_step, roof.tok_s,
                       ceiling)  # fmt: skip
    notes += [found.line] if found is not None else []  # a share above 100% of the ceiling: said, and recorded
    data = analysis.to_json()
    data["trace"] = os.path.relpath(analysis.trace_path, run.path)  # relative: the run folder can move
    data["notes"] = list(data["notes"]) + notes
    data["capture_notes"] = notes  # the notes of the capture, not the analysis: `--update` keeps these
    data["config"] = _profile_config(setup, opts, bucket, decode_bytes)
    data["capture"] = _capture_facts(capture, run.path, setup.flags_info)
    data["bandwidth"] = bw.to_json()
    data["read_bandwidth"] = read_bw.to_json()  # the fastest read probe
    data["read_probes"] = reads.to_json()
    data[CEILING_KEY] = ceiling.to_json()  # the roofline's denominator (bench/runs/ceiling.py)
    data["roofline"]["bandwidth_kind"] = f"ceiling: {ceiling.chosen} ({ceiling.definition})"
    if found is not None:
        data[FINDINGS_KEY] = [found.to_json()]
    path = run.write_json("profile.json", data)
    for note in notes:
        run.log(f"profile note: {note}")
    return data, capture, path


def _refuse_other_quant(ran, quant: str, scale_dtype: str | None) -> None:
    """InputError (one line) when `--quant` / `--scale-dtype` would profile other weights than the joined run
    swept (`ran`: its manifest's engine config): its roofline would pair the run's gauge with other bytes per step."""
    spec, scale = parse_quant_flags(quant, scale_dtype)
    run_quant = parse_quant_flags(ran.quantization or "none")[0].canonical
    if spec.canonical != run_quant:
        raise InputError(f"--quant {quant}: the run was swept with quantization {run_quant}; drop --quant to profile "
                         "the run's weights, or profile into a new run (--name)")  # fmt: skip
    if spec.canonical != "none" and ran.scale_dtype not in (None, scale):
        raise InputError(f"--scale-dtype {scale}: the run was swept with {ran.scale_dtype} scales; drop "
                         "--scale-dtype, or profile into a new run (--name)")  # fmt: skip


def _run_mismatches(run, setup) -> list[str]:
    """How the joined run's checkpoint (content hash), dtype policy, kernels, XLA options and backend differ from
    this profile's, as lines."""
    from bench.runs.manifest import checkpoint_id

    pol, ran, mismatch = setup.engine.policy, run.typed_manifest, []
    if None not in (ran.checkpoint.content_hash, setup.content_hash) and ran.checkpoint.content_hash != setup.content_hash:
        mismatch.append(f"checkpoint {ran.checkpoint.id} {ran.checkpoint.content_hash[:12]} (run) vs "
                        f"{checkpoint_id(setup.ckpt)} {setup.content_hash[:12]} (profile)")  # fmt: skip
    run_pol = ran.dtype_policy or {}
    for key, mine in (("compute_dtype", pol.compute_dtype), ("weights", pol.weight_dtype)):
        if run_pol.get(key) not in (None, mine):
            mismatch.append(f"{key} {run_pol[key]} (run) vs {mine} (profile)")
    quant = setup.engine.quant.canonical
    if (ran.engine.quantization or "none") != quant:
        mismatch.append(f"quantization {ran.engine.quantization or 'none'} (run) vs {quant} (profile)")
    plan = getattr(setup.engine, "kernel", None)
    cpu = getattr(setup.engine, "cpu_kernel", None)
    mine = (kernel_text(plan.option if plan is not None else None, cpu), plan.tiles if plan is not None else None)
    # a run from before kernels were recorded says None: a difference only where this profile uses the CPU kernel
    if (ran.engine.kernel, ran.engine.kernel_tiles) != mine and (ran.engine.kernel is not None or cpu is not None):
        mismatch.append(f"kernel {ran.engine.kernel} {ran.engine.kernel_tiles or ''} (run) vs {mine[0]} "
                        f"{mine[1] or ''} (profile)")  # fmt: skip
    options = getattr(setup.engine, "xla_options", None)
    if ran.engine.xla_options != options:  # None: XLA's defaults (or a run from before they were recorded)
        mismatch.append(f"XLA options {ran.engine.xla_options or 'default'} (run) vs {options or 'default'} (profile)")
    backend = getattr(setup.engine, "backend", None)
    if ran.engine.backend not in (None, backend):  # None: a run from before the backend was recorded
        mismatch.append(f"backend {ran.engine.backend} (run) vs {backend} (profile)")
    return mismatch


def _roofline_inputs(engine, cell, input_tokens: int, max_new_tokens: int,
                     batch: int = 1) -> tuple[dict, float | None, str]:  # fmt: skip
    """(bytes one decode step of `batch` rows reads (the engine's accounting: the weights once, every row's KV
    cache), the gauge tok/s to use or None, the note saying which): a joined sweep cell's gauge (at B > 1 the
    per-sequence gauge: steps per second) at its own shape, else None (the profile's own rate is used)."""
    at = f"{input_tokens} input tokens" + (f" x {batch} rows" if batch > 1 else "")
    if cell is not None:
        decode_bytes = engine.decode_bytes(input_tokens, cell.max_new_tokens or max_new_tokens, batch=batch)
        return decode_bytes, cell.gauge_tok_s_median, (
            f"roofline uses the run's sweep gauge at {at} ({cell.gauge_tok_s_median:.2f} tok/s"
            f"{' per sequence' if batch > 1 else ''}, bytes per step at its shape, max_new_tokens "
            f"{cell.max_new_tokens})")  # fmt: skip
    return engine.decode_bytes(input_tokens, max_new_tokens, batch=batch), None, (
        f"roofline uses the profile's own rate (1000 / device ms per step, which leaves out host time between "
        f"ops), not a gauge: this run has no sweep cell at {at}")  # fmt: skip


def _capture_notes(capture, flags_info: dict, steps: int, max_new_tokens: int) -> list[str]:
    """Notes on how the trace was taken: GPU profile flags missing or unused, steps that restarted."""
    notes = []
    if capture.platform == "gpu" and not flags_info["gpu_flags_applied"]:
        notes.append("profiled on a GPU without the profile XLA flags (command buffers on): per-kernel attribution "
                     "may be missing; run `bench profile` from a fresh shell")  # fmt: skip
    if capture.platform != "gpu" and flags_info["gpu_flags_applied"]:
        notes.append(f"GPU profile flags were set ({flags_info['reason']}) but jax ran on {capture.platform}")
    if capture.restarts:
        notes.append(f"--steps {steps} is past the profiled shape's budget of {capture.restart_every} traced decode "
                     f"steps (max_new_tokens {max_new_tokens}): the steps restarted {capture.restarts} "
                     f"time{'s' if capture.restarts != 1 else ''} from the "
                     "post-warm-up state, so every step ran the same program on the same KV buffers")  # fmt: skip
    return notes


def _profile_config(setup, opts, bucket: int, decode_bytes: dict) -> dict:
    """profile.json's `config`: the prompt, the batch (rows decoded per step: 1, or `--batch B`), the profiled
    shape (bucket, max_new_tokens, KV positions), the steps,
    the checkpoint id, the dtype policy, the quantization (canonical `--quant` text), the weight bytes as placed
    and the bytes a step reads."""
    from bench.runs.manifest import checkpoint_id

    pol, max_new_tokens = setup.engine.policy, setup.max_new_tokens
    prompt = setup.prompt if opts.batch == 1 else setup.prompt[0]
    built_by = ("bench.sweep.local.build_prompts (the sweep's prompt)" if opts.batch == 1 else
                "bench.sweep.local.build_batch_prompts (the sweep's batch cell: row 0 shown)")  # fmt: skip
    return {
        "input_tokens": opts.input_tokens, "batch": opts.batch,
        "prompt": {"tokens": len(prompt.ids), "text_chars": len(prompt.text), "built_by": built_by},
        "bucket": bucket, "max_new_tokens": max_new_tokens, "kv_cache_positions": bucket + max_new_tokens,
        "steps": opts.steps, "warmup": WARMUP_STEPS, "checkpoint": checkpoint_id(setup.ckpt), "policy": pol.line(),
        "compute_dtype": pol.compute_dtype,
        "weight_dtype": pol.weight_dtype, "kv_cache_dtype": pol.kv_dtype, "decode_bytes": decode_bytes,
        "quant": setup.engine.quant.canonical, "weight_bytes": setup.engine.weight_bytes,
    }  # fmt: skip


def _capture_facts(capture, run_path: Path, flags_info: dict) -> dict:
    """profile.json's `capture`: the trace file (relative to the run), steps, restarts, wall times, flags."""
    return {
        "xplane": os.path.relpath(capture.xplane_path, run_path), "xplane_bytes": capture.xplane_bytes,
        "steps": capture.n_steps, "warmup": capture.warmup, "restart_every": capture.restart_every,
        "restarts": capture.restarts, "step_wall_ms": list(capture.step_wall_ms),
        "wall_ms_per_step": capture.wall_ms_per_step, "xla_flags": capture.xla_flags,
        "profile_options": capture.profile_options, "platform": capture.platform,
        "device_kind": capture.device_kind, "jax_version": capture.jax_version, **flags_info,
    }  # fmt: skip


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
