"""The steps of the prepared GPU run (`bench/gpurun/main.py`): its context, workloads, budget timings, and how one step runs.

Each step is one child process (`python3 -m bench ...`, or `python3 -m bench.cli.gpurun_entry _probe|_make_builtin`)
started by `run_step` with a limit in seconds taken from what the budget leaves (`Context.remaining`). A step that
reaches its limit gets SIGTERM, then SIGKILL after `Timing.grace`; a run folder it left "running" is marked
incomplete (`settle_run`). The step functions (`probe`, `bandwidth`, `checkpoint_step`, `sweep`, `profile`) each
decide from the time left whether to start at all (`skip` records one that does not) and record a `StepResult` in
`Context.steps`.

Like `bench/gpurun/main.py`, this module's top level imports only the standard library and `bench.errors` (itself
standard library only): the package check runs before anything else on a bare machine; `bench.runs`, jax and
`model` are imported inside the functions that need them. Output goes through `Context.say` (to the caller's
`emit` and gpu-run.log), never straight to stdout.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import MissingModuleError

PROBE_MARK = "GPURUN_PROBE "
"""Prefix of the probe child's one machine-read line (JSON); such lines are captured, never echoed."""
MISSING_MARK = "GPURUN_MISSING "
"""Prefix of the probe child's line naming a module the bench commands import that it could not import."""
CHILD_ENTRY = "bench.cli.gpurun_entry"
"""The module of the child processes that are not `bench` commands (`_probe`, `_make_builtin PRESET`)."""


class ProbeFailed(RuntimeError):
    """The device probe printed no probe line (it failed, or ran past `Timing.probe_limit`); its message is one
    line naming the probe's log. The run then measures nothing and ends with EXIT_FAILED."""


@dataclass(frozen=True)
class Workload:
    """What the steps measure.

    `inputs`: the sweep's input sizes, comma-separated (tokens); `max_new_tokens`: tokens generated per request;
    `repeats`: timed repeats per sweep cell; `steps`: decode steps the profile records; `profile_input`: input size
    of the profiled request (tokens); `bandwidth_args`: extra arguments of `bench bandwidth` (empty: its defaults);
    `decode_loop`: the sweep's `--decode-loop` ("both": each cell timed with the host loop and the device loop, so
    the run reports the host overhead per step, which at about 1 ms per step on a GPU decides the roofline share);
    `batch`: the sweep's `--batch` sizes, comma-separated (None: no --batch, one sequence per request); with a
    batch above 1 the largest is also profiled (`batch_profile`).
    """

    inputs: str
    max_new_tokens: int
    repeats: int
    steps: int
    profile_input: int
    bandwidth_args: tuple[str, ...]
    decode_loop: str = "both"
    batch: str | None = None

    @property
    def largest_batch(self) -> int:
        """The largest batch of `batch` (1 without --batch)."""
        return max((int(b) for b in self.batch.split(",")), default=1) if self.batch else 1


@dataclass(frozen=True)
class Timing:
    """Seconds. `*_min`: the least a step is started with; `*_reserve`: kept back for a later step."""

    probe_limit: float
    checkpoint_min: float
    bandwidth_limit: float
    bandwidth_min: float
    sweep_min: float
    profile_min: float
    profile_reserve: float
    grace: float
    end_margin: float
    pilot_share: float = 0.35  # most of the budget the pilot sweep may use
    e2b_min: float = 150.0  # what an E2B sweep + profile needs at least (two loads of 9.3 GB, compiles)


GPU_WORK = Workload("41,521,2057,3593", 64, 3, 20, 41, ())
TINY_WORK = Workload("20,41", 8, 2, 3, 41, ("--bytes", str(16 * 2**20), "--repeats", "3"))
GPU_TIMING = Timing(probe_limit=120, checkpoint_min=30, bandwidth_limit=60, bandwidth_min=15, sweep_min=40,
                    profile_min=45, profile_reserve=75, grace=30, end_margin=15)  # fmt: skip
TINY_TIMING = Timing(probe_limit=90, checkpoint_min=5, bandwidth_limit=30, bandwidth_min=2, sweep_min=3,
                     profile_min=6, profile_reserve=12, grace=5, end_margin=2, e2b_min=20)  # fmt: skip


@dataclass
class StepResult:
    """One step's outcome: `status` (below), its wall time in `seconds`, a `note` for the summary (why it was
    skipped, "exit code N", ...) and the process's exit code `rc` (None for a step that never ran)."""

    name: str
    status: str  # ok | failed | interrupted | killed | skipped | stopped
    seconds: float = 0.0
    note: str = ""
    rc: int | None = None


@dataclass
class Context:
    """The state of one gpu-run, shared by every step.

    `repo`: the repository root (the steps' working folder and PYTHONPATH); `outdir`: the output folder (runs/,
    xla-cache/, logs/, summary.txt, gpu-run.log); `budget`: wall-clock budget of the whole script (s); `t0`: its
    start (`time.monotonic()`); `log_fh`: gpu-run.log, open for appending; `emit`: where each output line goes
    (the CLI's printer; `say` also logs it); `timing`: the budget rules in force.
    Filled in as the run goes: `steps` (every StepResult, in order), `runs` (the run folders made), `device_line`
    and `policy_line` (from the probe), `bandwidth_lines`; `current` and `background` are the step process and the
    background checkpoint generator now running (what `request_stop` stops); `stopping` is set by `request_stop`.
    """

    repo: Path
    outdir: Path
    budget: float
    t0: float
    log_fh: object
    emit: Callable[[str], None]
    timing: Timing = TINY_TIMING
    steps: list[StepResult] = field(default_factory=list)
    runs: list[Path] = field(default_factory=list)
    device_line: str = ""
    policy_line: str = ""
    bandwidth_lines: list[str] = field(default_factory=list)
    current: subprocess.Popen | None = None
    background: subprocess.Popen | None = None
    stopping: bool = False

    def elapsed(self) -> float:
        """Seconds since the start of the run."""
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        """Seconds left for steps (the end margin for the summary and packing is kept back)."""
        return self.budget - self.elapsed() - self.timing.end_margin

    def say(self, line: str = "") -> None:
        """Hand `line` to `emit` and append it to gpu-run.log (flushed at once)."""
        self.emit(line)
        self.log_fh.write(line + "\n")
        self.log_fh.flush()

    def request_stop(self, _signum: int | None = None, _frame: object = None) -> None:
        """Stop the run (the SIGTERM/SIGINT handler: the device tool's timeout, Ctrl-C): SIGTERM to the step and
        the background generator now running, so each keeps its finished work; no later step starts and the run
        goes on to its summary. A second call does nothing."""
        if self.stopping:
            return
        self.stopping = True
        for proc in (self.current, self.background):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)


def child_env(ctx: Context, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a step process: this one's, with the repository first on PYTHONPATH, unbuffered output,
    COLUMNS=160 unless set (rich tables unwrapped in the logs), then `extra` on top."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(ctx.repo) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "160")  # rich tables of the steps, unwrapped in logs
    env.update(extra or {})
    return env


# ---- running steps -----------------------------------------------------------------------------------------------
CHIP_BUSY_MARKS = ("libtpu multi-process lockfile", "TPU is already in use")
"""Output of a step that could not open the TPU because another process still held it. Seen on a lent TPU v5e
(.library/device/KINDS.md, 2026-12-01: a program started while another held the chip stopped after about 2 s with
"Internal error when accessing libtpu multi-process lockfile"), and reported for one just after another ended."""
CHIP_BUSY_RETRY_S = 5.0
"""The wait before the one rerun of a step that found the chip busy (the same notes: wait five seconds, rerun)."""


def run_step(ctx: Context, name: str, argv: list[str], limit: float, *, env_extra: dict[str, str] | None = None,
             capture: list[str] | None = None, header: bool = True, retry_busy: bool = True) -> StepResult:  # fmt: skip
    """Run one step in its own process, echoing its output (and logging it), stopped at `limit` seconds:
    SIGTERM, then SIGKILL after the grace period. `capture` collects the output lines.

    `argv` is the whole command line (the header line shows it from its third word on); `env_extra` is added to
    `child_env`; `header` prints the "== name (limit ...)" line first. The output also goes to logs/<name>.log.
    Returns the StepResult (also appended to `ctx.steps`): status "ok" (exit code 0), "failed" (another exit code),
    "interrupted" (SIGTERM at the limit), "killed" (SIGKILL after the grace period) or "stopped" (the run was
    stopped by a signal meanwhile). After `Context.request_stop` no step starts: it is recorded as skipped.
    A step that failed because the TPU was still held by another process (`CHIP_BUSY_MARKS` in its output) is run
    once more after `CHIP_BUSY_RETRY_S` when `retry_busy` (only the rerun is recorded). Never raises for a failing
    step."""
    if ctx.stopping:
        return skip(ctx, name, "the run was stopped (SIGTERM or SIGINT)")
    if header:
        ctx.say(f"== {name} (limit {limit:.0f} s, {ctx.remaining():.0f} s left): {' '.join(argv[2:])}")
    t = time.monotonic()
    step_log = open(ctx.outdir / "logs" / f"{name}.log", "w", encoding="utf-8")
    proc = subprocess.Popen(argv, cwd=ctx.repo, env=child_env(ctx, env_extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)  # fmt: skip
    ctx.current = proc

    busy: list[str] = []
    reader = threading.Thread(target=_echo_output, args=(ctx, proc, step_log, capture, busy), daemon=True)
    reader.start()
    status = _wait_within(ctx, name, proc, limit)
    reader.join(timeout=10)
    step_log.close()
    ctx.current = None
    rc = proc.returncode
    if ctx.stopping and status is None:
        status = "stopped"
    if status is None:
        status = "ok" if rc == 0 else "failed"
    if status == "failed" and busy and retry_busy and not ctx.stopping:
        ctx.say(f"-- {name}: the TPU was held by another process ({busy[0].strip()[:120]}); "
                f"again in {CHIP_BUSY_RETRY_S:.0f} s")
        time.sleep(CHIP_BUSY_RETRY_S)
        if capture is not None:
            capture.clear()
        spent = time.monotonic() - t
        return run_step(ctx, name, argv, max(limit - spent, 0.1), env_extra=env_extra, capture=capture,
                        header=False, retry_busy=False)  # fmt: skip
    result = StepResult(name, status, time.monotonic() - t, "" if rc == 0 else f"exit code {rc}", rc)
    ctx.say(f"-- {name}: {status} in {result.seconds:.1f} s" + (f" ({result.note})" if result.note else ""))
    ctx.steps.append(result)
    return result


def _echo_output(ctx: Context, proc: subprocess.Popen, step_log, capture: list[str] | None, busy: list[str]) -> None:
    """`run_step`'s reader (a thread): each output line of the step `proc` into its log file `step_log`, into
    `capture` when given, and on to `ctx.say` (but the probe's marked lines); the first line that shows the TPU
    held by another process (`CHIP_BUSY_MARKS`) into `busy`."""
    for line in proc.stdout:
        line = line.rstrip("\n")
        if not busy and any(mark in line for mark in CHIP_BUSY_MARKS):
            busy.append(line)
        step_log.write(line + "\n")
        step_log.flush()
        if capture is not None:
            capture.append(line)
        if not line.startswith(PROBE_MARK):
            ctx.say(line)


def _wait_within(ctx: Context, name: str, proc: subprocess.Popen, limit: float) -> str | None:
    """Wait for step `name` (`proc`) to end within `limit` seconds. None when it ended by itself; past the limit,
    SIGTERM and "interrupted", and where it still runs `ctx.timing.grace` seconds later, SIGKILL and "killed"
    (each said in one line)."""
    try:
        proc.wait(timeout=max(limit, 0.1))
        return None
    except subprocess.TimeoutExpired:
        ctx.say(f"-- {name}: reached its limit of {limit:.0f} s; SIGTERM (finished work is kept)")
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=ctx.timing.grace)
        return "interrupted"
    except subprocess.TimeoutExpired:
        ctx.say(f"-- {name}: still running {ctx.timing.grace:.0f} s after SIGTERM; SIGKILL")
        proc.kill()
        proc.wait()
        return "killed"


def skip(ctx: Context, name: str, why: str) -> StepResult:
    """Record step `name` as skipped because of `why` (one log line); returns its StepResult."""
    ctx.say(f"== {name}: skipped ({why})")
    result = StepResult(name, "skipped", 0.0, why)
    ctx.steps.append(result)
    return result


def bench_argv(*args: str) -> list[str]:
    """The command line of `python -m bench ARGS...` with this interpreter."""
    return [sys.executable, "-m", "bench", *args]


def child_argv(*args: str) -> list[str]:
    """The command line of the child process `python -m bench.cli.gpurun_entry ARGS...` (`CHILD_ENTRY`)."""
    return [sys.executable, "-m", CHILD_ENTRY, *args]


def find_run(ctx: Context, label: str) -> Path | None:
    """The run folder a step made with `--name label`: exactly `<YYYY-MM-DD>-<label>-<device>` (a label that is a
    prefix of another one, e.g. "sweep" of "sweep-2", must not match); the newest when several dates match."""
    pattern = re.compile(rf"\d{{4}}-\d{{2}}-\d{{2}}-{re.escape(label)}-[a-z0-9]+")
    found = sorted(p for p in (ctx.outdir / "runs").glob("*") if p.is_dir() and pattern.fullmatch(p.name))
    return found[-1] if found else None


def settle_run(ctx: Context, path: Path | None, step: StepResult) -> None:
    """A run folder a stopped step left 'running' is marked incomplete (its finished cells stay valid).

    `path` None does nothing; a folder that cannot be opened or written is reported in one line, never raised."""
    if path is None:
        return
    from bench.runs import open_run

    try:
        run = open_run(path)
        if run.status == "running":
            run.log(f"gpu-run: step {step.name} {step.status}; marking the run incomplete")
            run.finish("incomplete")
            ctx.say(f"-- {path.name}: left 'running' by the {step.status} step; marked incomplete")
    except Exception as exc:  # noqa: BLE001  (reported, never fatal: the summary says what is there)
        ctx.say(f"-- {path}: could not be settled ({type(exc).__name__}: {exc})")


def stamp() -> str:
    """The local time as HHMMSS: makes each step's run label unique within a day."""
    return dt.datetime.now().strftime("%H%M%S")


# ---- steps -------------------------------------------------------------------------------------------------------
def probe(ctx: Context, force_cpu: bool) -> dict:
    """Device and dtype policy, in a child process (`child_argv("_probe")`: jax initialises there, not here).

    `force_cpu` sets JAX_PLATFORMS=cpu for it. Sets `ctx.device_line` and `ctx.policy_line` and returns the
    probe's facts (`probe_facts`). Raises MissingModuleError when the child could not import a module the bench
    commands need, ProbeFailed (naming the probe log) when it printed no probe line (it failed or ran past
    `Timing.probe_limit`)."""
    lines: list[str] = []
    extra = {"JAX_PLATFORMS": "cpu"} if force_cpu else None
    res = run_step(ctx, "probe", child_argv("_probe"), ctx.timing.probe_limit,
                   env_extra=extra, capture=lines, header=False)  # the device lines come first
    for line in lines:
        if line.startswith(MISSING_MARK):
            raise MissingModuleError(f"the bench commands need the Python module {line[len(MISSING_MARK):]!r}, "
                                     f"missing from {sys.executable} (carry it as a wheel); nothing was measured")
        if line.startswith(PROBE_MARK):
            info = json.loads(line[len(PROBE_MARK):])
            ctx.device_line, ctx.policy_line = info["device_line"], info["policy_line"]
            return info
    raise ProbeFailed(f"the device probe failed ({res.status}, {res.note}); see {ctx.outdir / 'logs/probe.log'}")


def probe_facts() -> dict:
    """What the probe child reports, read from jax in this process (imports jax and `model.policy` here):
    {"platform": "gpu"|"cpu"|..., "device_kind": str, "device_line": "device: ...", "policy_line": "device
    policy: ..."}; the two lines are the first lines of the run."""
    import jax

    from model.policy import decide_policy

    devices = jax.devices()
    dev = devices[0]
    kind = getattr(dev, "device_kind", dev.platform)
    device_line = f"device: {kind} (platform {dev.platform}, {len(devices)} device(s), jax {jax.__version__})"
    return {"platform": dev.platform, "device_kind": kind, "device_line": device_line,
            "policy_line": decide_policy().line()}  # fmt: skip


def bandwidth(ctx: Context, work: Workload) -> None:
    """The `bench bandwidth` step, limited to `Timing.bandwidth_limit` s (skipped below `bandwidth_min`); its
    result lines (the copy's and the read-only probe's) go to `ctx.bandwidth_lines` for the summary."""
    if ctx.remaining() < ctx.timing.bandwidth_min:
        skip(ctx, "bandwidth", f"{ctx.remaining():.0f} s left, needs {ctx.timing.bandwidth_min:.0f} s")
        return
    lines: list[str] = []
    run_step(ctx, "bandwidth", bench_argv("bandwidth", *work.bandwidth_args),
             min(ctx.timing.bandwidth_limit, ctx.remaining()), capture=lines)  # fmt: skip
    ctx.bandwidth_lines = [ln for ln in lines
                           if ln.startswith(("bandwidth:", "copy of", "read-only bandwidth:", "read of", "datasheet:",
                                             "roofline ceiling"))]  # fmt: skip


def checkpoint_step(ctx: Context, spec: str) -> bool:
    """Create a built-in checkpoint as its own step (so its time is not charged to the sweep). True when usable.

    `spec` is a checkpoint folder or `random:NAME[@SEED]` (dummy weights, made on the device by each step:
    nothing to do, True) or `builtin:NAME`, generated on the CPU (JAX_PLATFORMS=cpu) with all the time left;
    False when skipped (under `Timing.checkpoint_min`) or not "ok"."""
    if not spec.startswith("builtin:"):
        return True
    if ctx.remaining() < ctx.timing.checkpoint_min:
        skip(ctx, "checkpoint", f"{ctx.remaining():.0f} s left, needs {ctx.timing.checkpoint_min:.0f} s")
        return False
    preset = spec.split(":", 1)[1]
    res = run_step(ctx, f"checkpoint-{preset}", child_argv("_make_builtin", preset),
                   ctx.remaining(), env_extra={"JAX_PLATFORMS": "cpu"})  # fmt: skip
    return res.status == "ok"


def engine_argv(engine) -> list[str]:
    """The engine options of a step: `engine.to_args()` (a `model.engine_config.EngineConfig`: every option it
    was given, e.g. ["--quant", "w4:128", "--kernel", "w4a16=xla", "--mesh", "tp=2"]), [] for None (the
    command's defaults: dense, one device)."""
    return [] if engine is None else engine.to_args()


def sweep(ctx: Context, name: str, label: str, spec: str, work: Workload, *, cap: float | None = None,
          reserve: float | None = None, engine=None) -> Path | None:  # fmt: skip
    """The `bench sweep` step `name` of checkpoint `spec` into the run folder named by `label`, with the options of
    `engine` (a `model.engine_config.EngineConfig`, `engine_argv`: its --quant, --kernel, --mesh, ... as given;
    None: none, the command's defaults).

    With `work.batch`, `--batch` is passed on. Its limit is the time left minus `reserve` (s; default
    `Timing.profile_reserve`, twice that with a batch above 1: kept for the profile(s) after it) minus the grace
    period, or everything left minus the grace period when that would be under
    `Timing.sweep_min`; `cap` (s) bounds it further. Skipped under `sweep_min + grace` left. A sweep that did not
    end "ok" has its folder settled (`settle_run`). Returns the run folder (added to `ctx.runs`), or None when
    there is none (skipped, or it failed before creating one)."""
    t = ctx.timing
    left = ctx.remaining()
    if left < t.sweep_min + t.grace:
        skip(ctx, name, f"{left:.0f} s left, needs {t.sweep_min + t.grace:.0f} s")
        return None
    if reserve is None:
        reserve = t.profile_reserve * (2 if work.largest_batch > 1 else 1)
    limit = left - reserve - t.grace
    if limit < t.sweep_min:  # a partial sweep is worth more than the profile
        limit = left - t.grace
    if cap is not None:
        limit = min(limit, cap)
    res = run_step(ctx, name, bench_argv(
        "sweep", "--inputs", work.inputs, "--max-new-tokens", str(work.max_new_tokens), "--repeats",
        str(work.repeats), "--decode-loop", work.decode_loop, "--checkpoint", spec, "--name", label, "--runs-dir",
        str(ctx.outdir / "runs"), "--compile-cache", str(ctx.outdir / "xla-cache"), *engine_argv(engine),
        *(["--batch", work.batch] if work.batch else [])), limit)  # fmt: skip
    path = find_run(ctx, label)
    if res.status in ("interrupted", "killed", "stopped", "failed"):
        settle_run(ctx, path, res)
    if path is not None and path not in ctx.runs:
        ctx.runs.append(path)
    return path


def profile(ctx: Context, name: str, run: Path | None, spec: str, work: Workload, gpu: bool, *,
            engine=None) -> None:  # fmt: skip
    """The `bench profile --run RUN` step `name`: adds a profile of checkpoint `spec` to the sweep's run folder,
    with the options of `engine` (the sweep's, `engine_argv`; None: none, the run's own).

    Gets all the time left minus the grace period; skipped when `run` is None or under `Timing.profile_min +
    grace` left. `gpu` gives this process alone the GPU profiling XLA_FLAGS. A profile that did not end "ok" has
    its folder settled (`settle_run`)."""
    t = ctx.timing
    if run is None:
        skip(ctx, name, "no run folder to add it to")
        return
    left = ctx.remaining()
    if left < t.profile_min + t.grace:
        skip(ctx, name, f"{left:.0f} s left, needs {t.profile_min + t.grace:.0f} s")
        return
    env = {}
    if gpu:  # only this process gets them; bench profile also adds them itself before jax starts
        from bench.profile.capture import gpu_profile_flags, merge_xla_flags

        env["XLA_FLAGS"] = merge_xla_flags(os.environ.get("XLA_FLAGS", ""), gpu_profile_flags())
    res = run_step(ctx, name, bench_argv(
        "profile", "--steps", str(work.steps), "--input-tokens", str(work.profile_input), "--checkpoint", spec,
        "--run", str(run), "--runs-dir", str(ctx.outdir / "runs"), "--compile-cache", str(ctx.outdir / "xla-cache"),
        *engine_argv(engine),
    ), left - t.grace, env_extra=env)  # fmt: skip
    if res.status != "ok":
        settle_run(ctx, run, res)


def batch_profile(ctx: Context, name: str, label: str, spec: str, work: Workload, gpu: bool, *,
                  engine=None) -> Path | None:  # fmt: skip
    """With a `work.batch` above 1, the `bench profile --batch B` step `name` at the largest batch B, at
    `work.profile_input` tokens, into a new run folder named by `label` (a run holds one profile: the B = 1 profile
    joined the sweep's run), so that the device-time categories can be read per batch size (the report sets them
    side by side when the shapes match: `bench profile` without --run profiles max_new_tokens 64, the GPU
    workload's). Nothing without a batch above 1; skipped under `Timing.profile_min + grace` left. Gets all the
    time left minus the grace period; `gpu` gives it the GPU profiling XLA_FLAGS. Returns its run folder (added to
    `ctx.runs`), or None. `engine`: as `profile`'s."""
    b, t = work.largest_batch, ctx.timing
    if b <= 1:
        return None
    left = ctx.remaining()
    if left < t.profile_min + t.grace:
        skip(ctx, name, f"{left:.0f} s left, needs {t.profile_min + t.grace:.0f} s")
        return None
    env = {}
    if gpu:
        from bench.profile.capture import gpu_profile_flags, merge_xla_flags

        env["XLA_FLAGS"] = merge_xla_flags(os.environ.get("XLA_FLAGS", ""), gpu_profile_flags())
    res = run_step(ctx, name, bench_argv(
        "profile", "--batch", str(b), "--steps", str(work.steps), "--input-tokens", str(work.profile_input),
        "--checkpoint", spec, "--name", label, "--runs-dir", str(ctx.outdir / "runs"), "--compile-cache",
        str(ctx.outdir / "xla-cache"), *engine_argv(engine),
    ), left - t.grace, env_extra=env)  # fmt: skip
    path = find_run(ctx, label)
    if res.status != "ok":
        settle_run(ctx, path, res)
    if path is not None and path not in ctx.runs:
        ctx.runs.append(path)
    return path
