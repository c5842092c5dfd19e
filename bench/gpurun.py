"""The prepared GPU run behind `scripts/gpu-run.sh`: the whole harness on one accelerator in one budgeted command.

Usage (from the repository root; the shell script sets PYTHONPATH and calls `python3 -m bench.gpurun`):

    scripts/gpu-run.sh OUTDIR [--budget-s 420] [--checkpoint DIR|builtin:NAME] [--tiny] [--pack DIR]

Nothing is installed: the machine's python3 runs the repository as is. This module's top level imports only the
standard library, so the package check (`REQUIRED`) runs before anything else and fails with one line. Every
`bench` step runs in its own process (`python3 -m bench ...`): jax initialises once per step, the GPU profile
XLA_FLAGS go only to the profile process, and a step that overruns is stopped without losing the others.

Plans (chosen after the device probe; "remaining" is always the budget left minus `end_margin`):

- GPU, no --checkpoint ("pilot + E2B"): the E2B checkpoint (`builtin:e2b`, bf16, ~9.3 GB; about 27x the
  `default` preset's 8 s creation on a 2-core CPU, so roughly 2-4 minutes) is generated in a background CPU process
  (JAX_PLATFORMS=cpu, so it never touches the GPU) while the GPU measures, cheapest first: bandwidth, then a full
  sweep of the `default` preset (the pilot: every E2B irregularity at hidden size 256, the same four input sizes,
  compiled and timed for real), then, while E2B is still being written, the pilot's profile. When the E2B
  checkpoint is ready and at least `e2b_min_s` remain, E2B is swept and profiled into its own run folder; else the
  generator is stopped and the log says how long it had run (so the next task can size its budget).
- --checkpoint given, or --tiny, or no GPU found ("single"): checkpoint (created first, as its own step, when it is
  `builtin:NAME` and not cached), bandwidth, sweep, profile --run <that sweep's folder>.

Budget: each step gets a limit from what remains. A sweep gets all of it minus a reserve for the profile that
follows (minus a grace period); when the reserve would leave it less than its minimum it gets everything, since a
partial sweep is worth more than a profile. A step that reaches its limit gets SIGTERM (the sweep then keeps its
finished cells and marks the run incomplete), then SIGKILL after the grace period; a folder a killed step left
"running" is marked incomplete here. A step with less than its minimum left is skipped, with a line saying so.

Exit codes: 0 every planned step ran to the end; 3 the budget stopped or skipped a step (the run folders are
valid, possibly incomplete); 1 a step failed; 2 a usage error or a missing package (nothing was run).
The last lines on stdout are always the summary (steps, bandwidth, each run's sweep table and profile).

GPU settings are never touched: no nvidia-smi -pm/-lgc/-rgc/-r/-mig, only jax's own device use.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED = ("jax", "jaxlib", "numpy", "ml_dtypes", "safetensors", "tokenizers", "typer", "click", "rich")
"""Imported by the steps (model/ and bench/); matplotlib, pandas, xprof are not needed here."""

PROBE_MARK = "GPURUN_PROBE "
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUDGET = 0, 1, 2, 3
PACK_FILE_LIMIT = 15 * 2**20  # the device tool brings back files of at most 16 MiB, 8 files in all
PACK_MAX_FILES = 8


@dataclass(frozen=True)
class Workload:
    inputs: str
    max_new_tokens: int
    repeats: int
    steps: int
    profile_input: int
    bandwidth_args: tuple[str, ...]


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
PILOT, BIG = "default", "e2b"
"""The pilot+E2B plan's presets. GPURUN_TEST_PLAN=pilot (tests only) runs that plan on the CPU with the tiny preset
for both, so its logic is exercised without a GPU."""


@dataclass
class StepResult:
    name: str
    status: str  # ok | failed | interrupted | killed | skipped | stopped
    seconds: float = 0.0
    note: str = ""
    rc: int | None = None


@dataclass
class Context:
    repo: Path
    outdir: Path
    budget: float
    t0: float
    log_fh: object
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
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        """Seconds left for steps (the end margin for the summary and packing is kept back)."""
        return self.budget - self.elapsed() - self.timing.end_margin

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.log_fh.write(line + "\n")
        self.log_fh.flush()


# ---- checks ------------------------------------------------------------------------------------------------------
def missing_packages(names=REQUIRED) -> list[str]:
    """The names of `names` that this Python cannot import (found without importing them)."""
    out = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except (ImportError, ValueError):
            out.append(name)
    return out


def child_env(ctx: Context, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(ctx.repo) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "160")  # rich tables of the steps, unwrapped in logs
    env.update(extra or {})
    return env


# ---- running steps -----------------------------------------------------------------------------------------------
def run_step(ctx: Context, name: str, argv: list[str], limit: float, *, env_extra: dict[str, str] | None = None,
             capture: list[str] | None = None, header: bool = True) -> StepResult:  # fmt: skip
    """Run one step in its own process, echoing its output (and logging it), stopped at `limit` seconds:
    SIGTERM, then SIGKILL after the grace period. `capture` collects the output lines."""
    if header:
        ctx.say(f"== {name} (limit {limit:.0f} s, {ctx.remaining():.0f} s left): {' '.join(argv[2:])}")
    t = time.monotonic()
    step_log = open(ctx.outdir / "logs" / f"{name}.log", "w", encoding="utf-8")
    proc = subprocess.Popen(argv, cwd=ctx.repo, env=child_env(ctx, env_extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)  # fmt: skip
    ctx.current = proc

    def pump():
        for line in proc.stdout:
            line = line.rstrip("\n")
            step_log.write(line + "\n")
            step_log.flush()
            if capture is not None:
                capture.append(line)
            if not line.startswith(PROBE_MARK):
                ctx.say(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status = None
    try:
        proc.wait(timeout=max(limit, 0.1))
    except subprocess.TimeoutExpired:
        status = "interrupted"
        ctx.say(f"-- {name}: reached its limit of {limit:.0f} s; SIGTERM (finished work is kept)")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=ctx.timing.grace)
        except subprocess.TimeoutExpired:
            status = "killed"
            ctx.say(f"-- {name}: still running {ctx.timing.grace:.0f} s after SIGTERM; SIGKILL")
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    step_log.close()
    ctx.current = None
    rc = proc.returncode
    if ctx.stopping and status is None:
        status = "stopped"
    if status is None:
        status = "ok" if rc == 0 else "failed"
    result = StepResult(name, status, time.monotonic() - t, "" if rc == 0 else f"exit code {rc}", rc)
    ctx.say(f"-- {name}: {status} in {result.seconds:.1f} s" + (f" ({result.note})" if result.note else ""))
    ctx.steps.append(result)
    return result


def skip(ctx: Context, name: str, why: str) -> StepResult:
    ctx.say(f"== {name}: skipped ({why})")
    result = StepResult(name, "skipped", 0.0, why)
    ctx.steps.append(result)
    return result


def bench_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench", *args]


def find_run(ctx: Context, label: str) -> Path | None:
    """The run folder a step made with `--name label`: exactly `<YYYY-MM-DD>-<label>-<device>` (a label that is a
    prefix of another one, e.g. "sweep" of "sweep-2", must not match); the newest when several dates match."""
    import re

    pattern = re.compile(rf"\d{{4}}-\d{{2}}-\d{{2}}-{re.escape(label)}-[a-z0-9]+")
    found = sorted(p for p in (ctx.outdir / "runs").glob("*") if p.is_dir() and pattern.fullmatch(p.name))
    return found[-1] if found else None


def settle_run(ctx: Context, path: Path | None, step: StepResult) -> None:
    """A run folder a stopped step left 'running' is marked incomplete (its finished cells stay valid)."""
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


# ---- steps -------------------------------------------------------------------------------------------------------
def probe(ctx: Context, force_cpu: bool) -> dict:
    """Device and dtype policy, in a child process (jax initialises there, not here)."""
    lines: list[str] = []
    extra = {"JAX_PLATFORMS": "cpu"} if force_cpu else None
    res = run_step(ctx, "probe", [sys.executable, "-m", "bench.gpurun", "_probe"], ctx.timing.probe_limit,
                   env_extra=extra, capture=lines, header=False)  # the device lines come first
    for line in lines:
        if line.startswith(PROBE_MARK):
            info = json.loads(line[len(PROBE_MARK):])
            ctx.device_line, ctx.policy_line = info["device_line"], info["policy_line"]
            return info
    raise SystemExit(f"error: the device probe failed ({res.status}, {res.note}); see {ctx.outdir / 'logs/probe.log'}")


def _probe_child() -> None:
    """Print the device and the dtype policy line (first lines of the run), then one machine-read line."""
    import jax

    from model.policy import decide_policy

    devices = jax.devices()
    dev = devices[0]
    kind = getattr(dev, "device_kind", dev.platform)
    device_line = f"device: {kind} (platform {dev.platform}, {len(devices)} device(s), jax {jax.__version__})"
    policy_line = decide_policy().line()
    print(device_line)
    print(policy_line)
    print(PROBE_MARK + json.dumps({"platform": dev.platform, "device_kind": kind, "device_line": device_line,
                                   "policy_line": policy_line}))  # fmt: skip


def _make_builtin_child(preset: str) -> None:
    from model.builtin import ensure_builtin

    t = time.monotonic()
    path = ensure_builtin(preset, log=lambda line: print(line, flush=True))
    print(f"checkpoint {preset} ready: {path} ({time.monotonic() - t:.1f} s)", flush=True)


def bandwidth(ctx: Context, work: Workload) -> None:
    if ctx.remaining() < ctx.timing.bandwidth_min:
        skip(ctx, "bandwidth", f"{ctx.remaining():.0f} s left, needs {ctx.timing.bandwidth_min:.0f} s")
        return
    lines: list[str] = []
    run_step(ctx, "bandwidth", bench_argv("bandwidth", *work.bandwidth_args),
             min(ctx.timing.bandwidth_limit, ctx.remaining()), capture=lines)  # fmt: skip
    ctx.bandwidth_lines = [ln for ln in lines if ln.startswith(("bandwidth:", "copy of"))]


def checkpoint_step(ctx: Context, spec: str) -> bool:
    """Create a built-in checkpoint as its own step (so its time is not charged to the sweep). True when usable."""
    if not spec.startswith("builtin:"):
        return True
    if ctx.remaining() < ctx.timing.checkpoint_min:
        skip(ctx, "checkpoint", f"{ctx.remaining():.0f} s left, needs {ctx.timing.checkpoint_min:.0f} s")
        return False
    preset = spec.split(":", 1)[1]
    res = run_step(ctx, f"checkpoint-{preset}", [sys.executable, "-m", "bench.gpurun", "_make_builtin", preset],
                   ctx.remaining(), env_extra={"JAX_PLATFORMS": "cpu"})  # fmt: skip
    return res.status == "ok"


def sweep(ctx: Context, name: str, label: str, spec: str, work: Workload, *, cap: float | None = None,
          reserve: float | None = None) -> Path | None:  # fmt: skip
    t = ctx.timing
    left = ctx.remaining()
    if left < t.sweep_min + t.grace:
        skip(ctx, name, f"{left:.0f} s left, needs {t.sweep_min + t.grace:.0f} s")
        return None
    reserve = t.profile_reserve if reserve is None else reserve
    limit = left - reserve - t.grace
    if limit < t.sweep_min:  # a partial sweep is worth more than the profile
        limit = left - t.grace
    if cap is not None:
        limit = min(limit, cap)
    res = run_step(ctx, name, bench_argv(
        "sweep", "--inputs", work.inputs, "--max-new-tokens", str(work.max_new_tokens), "--repeats",
        str(work.repeats), "--checkpoint", spec, "--name", label, "--runs-dir", str(ctx.outdir / "runs"),
        "--compile-cache", str(ctx.outdir / "xla-cache")), limit)  # fmt: skip
    path = find_run(ctx, label)
    if res.status in ("interrupted", "killed", "stopped", "failed"):
        settle_run(ctx, path, res)
    if path is not None and path not in ctx.runs:
        ctx.runs.append(path)
    return path


def profile(ctx: Context, name: str, run: Path | None, spec: str, work: Workload, gpu: bool) -> None:
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
        from bench.profile_capture import gpu_profile_flags, merge_xla_flags

        env["XLA_FLAGS"] = merge_xla_flags(os.environ.get("XLA_FLAGS", ""), gpu_profile_flags())
    res = run_step(ctx, name, bench_argv(
        "profile", "--steps", str(work.steps), "--input-tokens", str(work.profile_input), "--checkpoint", spec,
        "--run", str(run), "--runs-dir", str(ctx.outdir / "runs"), "--compile-cache", str(ctx.outdir / "xla-cache"),
    ), left - t.grace, env_extra=env)  # fmt: skip
    if res.status != "ok":
        settle_run(ctx, run, res)


# ---- plans -------------------------------------------------------------------------------------------------------
def plan_single(ctx: Context, spec: str, work: Workload, gpu: bool, tag: str) -> None:
    if not checkpoint_step(ctx, spec):
        return
    bandwidth(ctx, work)
    run = sweep(ctx, f"sweep-{tag}", f"gpurun-{tag}-{stamp()}", spec, work)
    profile(ctx, f"profile-{tag}", run, spec, work, gpu)


def plan_pilot_e2b(ctx: Context, work: Workload, gpu: bool = True, pilot_preset: str = PILOT,
                   big: str = BIG) -> None:  # fmt: skip
    t = ctx.timing
    e2b_log = open(ctx.outdir / "logs" / f"checkpoint-{big}.log", "w", encoding="utf-8")
    gen_t0 = time.monotonic()
    ctx.say(f"== checkpoint-{big}: generating builtin:{big} (bf16) in the background on the CPU "
            f"(log: {ctx.outdir / f'logs/checkpoint-{big}.log'})")  # fmt: skip
    ctx.background = subprocess.Popen([sys.executable, "-m", "bench.gpurun", "_make_builtin", big], cwd=ctx.repo,
                                      env=child_env(ctx, {"JAX_PLATFORMS": "cpu"}), stdout=e2b_log,
                                      stderr=subprocess.STDOUT)  # fmt: skip
    bandwidth(ctx, work)
    pilot_cap = max(t.sweep_min, t.pilot_share * ctx.budget)
    pilot = sweep(ctx, "sweep-pilot", f"gpurun-pilot-{pilot_preset}-{stamp()}", f"builtin:{pilot_preset}", work, cap=pilot_cap)
    pilot_profiled = False
    if ctx.background.poll() is None and not ctx.stopping:  # GPU idle otherwise: profile the pilot meanwhile
        profile(ctx, "profile-pilot", pilot, f"builtin:{pilot_preset}", work, gpu)
        pilot_profiled = True
    # wait for E2B while enough time remains for its sweep and profile
    while ctx.background.poll() is None and ctx.remaining() >= t.e2b_min and not ctx.stopping:
        time.sleep(1)
    gen = ctx.background
    gen_s = time.monotonic() - gen_t0
    if gen.poll() is None:
        gen.terminate()
        try:
            gen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gen.kill()
            gen.wait()
        ctx.steps.append(StepResult(f"checkpoint-{big}", "stopped", gen_s,
                                    f"not ready after {gen_s:.0f} s; E2B needs >= {t.e2b_min:.0f} s after it"))
        ctx.say(f"== checkpoint-{big}: not ready after {gen_s:.0f} s with {ctx.remaining():.0f} s left "
                f"(E2B steps need {t.e2b_min:.0f} s); stopped; E2B sweep and profile skipped")  # fmt: skip
        skip(ctx, f"sweep-{big}", "E2B checkpoint not ready in time")
    elif gen.returncode != 0:
        ctx.steps.append(StepResult(f"checkpoint-{big}", "failed", gen_s, f"exit code {gen.returncode}", gen.returncode))
        ctx.say(f"== checkpoint-{big}: FAILED (exit code {gen.returncode}); see {ctx.outdir / f'logs/checkpoint-{big}.log'}")
    else:
        ctx.steps.append(StepResult(f"checkpoint-{big}", "ok", gen_s, "generated in the background"))
        ctx.say(f"== checkpoint-{big}: ready after {gen_s:.0f} s")
        if ctx.remaining() >= t.e2b_min:
            run = sweep(ctx, f"sweep-{big}", f"gpurun-{big}-{stamp()}", f"builtin:{big}", work)
            profile(ctx, f"profile-{big}", run, f"builtin:{big}", work, gpu)
        else:
            skip(ctx, f"sweep-{big}", f"{ctx.remaining():.0f} s left, needs {t.e2b_min:.0f} s")
    e2b_log.close()
    ctx.background = None
    if not pilot_profiled:
        profile(ctx, "profile-pilot", pilot, f"builtin:{pilot_preset}", work, gpu)


def stamp() -> str:
    return dt.datetime.now().strftime("%H%M%S")


# ---- summary and packing -----------------------------------------------------------------------------------------
def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def summary_lines(ctx: Context, code: int) -> list[str]:
    from bench.runs import open_run, validate_run

    out = ["", "==== gpu-run summary ====", ctx.device_line or "device: (probe did not finish)",
           ctx.policy_line or "device policy: (unknown)"]  # fmt: skip
    out.append("steps: " + " | ".join(f"{s.name} {s.status} {s.seconds:.0f}s" for s in ctx.steps))
    for s in ctx.steps:
        if s.status not in ("ok",) and s.note:
            out.append(f"  {s.name}: {s.note}")
    out += ctx.bandwidth_lines or ["bandwidth: not measured"]
    for path in ctx.runs:
        problems = validate_run(path)
        try:
            run = open_run(path)
        except Exception as exc:  # noqa: BLE001
            out.append(f"run {path.name}: unreadable ({exc})")
            continue
        cache = run.manifest.get("compile_cache") or {}
        ckpt = run.manifest.get("checkpoint") or {}
        out.append(f"run {path.name}: status {run.status}; checkpoint {ckpt.get('id')}; compile cache hits "
                   f"{cache.get('hits')} misses {cache.get('misses')}; "
                   f"{'valid' if not problems else 'INVALID: ' + problems[0]}")  # fmt: skip
        cells = run.cells()
        if cells:
            out.append(f"  {'input':>6} {'bucket':>6} {'gauge tok/s (min-max)':>26} {'e2e tok/s':>10} {'TTFT ms':>9} "
                       f"{'TPOT ms':>8} {'cold/warm':>9}  valid")  # fmt: skip
            for c in cells:
                gauge = "-" if c.gauge_tok_s_median is None else (
                    f"{c.gauge_tok_s_median:.1f} ({c.gauge_tok_s_min:.1f}-{c.gauge_tok_s_max:.1f})")  # fmt: skip
                out.append(f"  {c.input_tokens:>6} {_f(c.bucket, 'd'):>6} {gauge:>26} {_f(c.e2e_tok_s_median, '.1f'):>10} "
                           f"{_f(c.ttft_ms_median, '.1f'):>9} {_f(c.tpot_ms_median):>8} "
                           f"{_f(c.cold_warm_request_ratio, '.1f'):>9}  "
                           f"{'yes' if c.valid else 'NO: ' + str(c.invalid_reason)[:60]}")  # fmt: skip
        else:
            out.append("  no finished sweep cells")
        try:
            prof = run.profile()
        except Exception as exc:  # noqa: BLE001
            prof, _ = None, out.append(f"  profile: unreadable ({exc})")
        if prof is not None:
            from bench.profile_analysis import format_profile_table

            rows = format_profile_table(prof)
            out.append(f"  profile ({prof.get('steps')} steps, {prof['totals']['ms_per_step']:.3f} ms/step device): "
                       + "; ".join(f"{k} {v}" for k, v in rows))  # fmt: skip
            cats = sorted(((n, c["pct"]) for n, c in prof["categories"].items() if c.get("pct")), key=lambda x: -x[1])
            out.append("  device time: " + ", ".join(f"{n} {p:.1f}%" for n, p in cats[:6]))
        else:
            out.append("  profile: none")
    meaning = {EXIT_OK: "every step ran to the end", EXIT_BUDGET: "the budget stopped or skipped a step",
               EXIT_FAILED: "a step failed"}.get(code, "")  # fmt: skip
    out.append(f"gpu-run: exit {code} ({meaning}); {ctx.elapsed():.0f} s of a {ctx.budget:.0f} s budget; "
               f"output in {ctx.outdir}")  # fmt: skip
    return out


def exit_code(ctx: Context) -> int:
    statuses = {s.status for s in ctx.steps}
    if "failed" in statuses:
        return EXIT_FAILED
    if statuses & {"interrupted", "killed", "skipped", "stopped"}:
        return EXIT_BUDGET
    return EXIT_OK


def pack(ctx: Context, dest: Path) -> list[str]:
    """Archive OUTDIR's results into `dest` as at most 8 flat files of at most 15 MiB (the device tool's limits):
    summary.txt and gpu-run.log first, then results.tar.gz (run folders without traces, logs), traces.tar.gz,
    xla-cache.tar.gz; an archive over 15 MiB is split into .partNN files. What does not fit is named."""
    dest.mkdir(parents=True, exist_ok=True)
    notes, files = [], 0
    for name in ("summary.txt", "gpu-run.log"):
        shutil.copy2(ctx.outdir / name, dest / name)
        files += 1
    runs = ctx.outdir / "runs"
    groups = [
        ("results.tar.gz", [(p, p.relative_to(ctx.outdir)) for p in [runs, ctx.outdir / "logs"] if p.exists()],
         _trace_filter),
        ("traces.tar.gz", [(p / "profile", p.relative_to(ctx.outdir) / "profile") for p in ctx.runs
                           if (p / "profile").exists()], None),
        ("xla-cache.tar.gz", [(ctx.outdir / "xla-cache", Path("xla-cache"))] if (ctx.outdir / "xla-cache").exists()
         else [], None),
    ]  # fmt: skip
    for name, members, filt in groups:
        if not members:
            continue
        tmp = ctx.outdir / f".{name}"
        with tarfile.open(tmp, "w:gz") as tar:
            for src, arc in members:
                tar.add(src, arcname=str(arc), filter=filt)
        size = tmp.stat().st_size
        parts = max(1, -(-size // PACK_FILE_LIMIT))
        if files + parts > PACK_MAX_FILES:
            notes.append(f"pack: {name} ({size / 2**20:.1f} MiB, {parts} part(s)) left out: the 8-file limit; "
                         f"it stays in {tmp}")  # fmt: skip
            continue
        if parts == 1:
            shutil.move(tmp, dest / name)
        else:
            with open(tmp, "rb") as fh:
                for i in range(parts):
                    (dest / f"{name}.part{i:02d}").write_bytes(fh.read(PACK_FILE_LIMIT))
            tmp.unlink()
            notes.append(f"pack: {name} split into {parts} parts; join with `cat {name}.part* > {name}`")
        files += parts
    return notes


def _trace_filter(info):
    """results.tar.gz leaves out the xprof traces (<run>/profile/...): they travel in traces.tar.gz."""
    parts = info.name.split("/")
    return None if len(parts) >= 4 and parts[0] == "runs" and parts[2] == "profile" else info


# ---- main --------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu-run.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", type=Path, help="Output folder: runs/, xla-cache/, logs/, summary.txt, gpu-run.log.")
    p.add_argument("--budget-s", type=float, default=420.0, help="Wall-clock budget of the whole script (s).")
    p.add_argument("--checkpoint", help="A checkpoint folder or builtin:NAME (default: default pilot + E2B).")
    p.add_argument("--tiny", action="store_true", help="CPU mode: the built-in tiny checkpoint, small inputs.")
    p.add_argument("--pack", type=Path, help="Also write the results as <= 8 flat files into this folder ($OUT).")
    p.add_argument("--inputs", help="Override the sweep input sizes (comma-separated).")
    p.add_argument("--max-new-tokens", type=int, help="Override the tokens generated per request.")
    p.add_argument("--repeats", type=int, help="Override the timed repeats per cell.")
    p.add_argument("--steps", type=int, help="Override the profiled decode steps.")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_probe"]:
        _probe_child()
        return 0
    if argv[:1] == ["_make_builtin"]:
        _make_builtin_child(argv[1])
        return 0
    args = parse_args(argv)
    missing = missing_packages()
    if missing:
        print(f"error: gpu-run needs Python packages missing from {sys.executable}: {', '.join(missing)} "
              f"(carry them as wheels; see .library/device/README.md)", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if args.budget_s <= 0:
        print(f"error: --budget-s {args.budget_s}: expected a positive number of seconds", file=sys.stderr)
        return EXIT_USAGE
    outdir = args.outdir.resolve()
    (outdir / "logs").mkdir(parents=True, exist_ok=True)
    (outdir / "runs").mkdir(exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    log_fh = open(outdir / "gpu-run.log", "a", encoding="utf-8")
    ctx = Context(repo=repo, outdir=outdir, budget=args.budget_s, t0=time.monotonic(), log_fh=log_fh)
    ctx.timing = GPU_TIMING if not args.tiny else TINY_TIMING

    def on_signal(signum, _frame):  # the device tool's timeout, Ctrl-C: stop the step, keep its work, summarise
        if ctx.stopping:
            return
        ctx.stopping = True
        for proc in (ctx.current, ctx.background):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = EXIT_OK
    try:
        info = probe(ctx, force_cpu=args.tiny)
        gpu = info["platform"] == "gpu" and not args.tiny
        if not gpu and not args.tiny:
            ctx.say(f"no GPU found (jax runs on {info['platform']}): tiny mode (built-in tiny checkpoint, small inputs)")
        ctx.timing = GPU_TIMING if gpu else TINY_TIMING
        base = GPU_WORK if gpu else TINY_WORK
        work = Workload(args.inputs or base.inputs, args.max_new_tokens or base.max_new_tokens,
                        args.repeats or base.repeats, args.steps or base.steps, base.profile_input,
                        base.bandwidth_args)  # fmt: skip
        ctx.say(f"gpu-run: budget {args.budget_s:.0f} s ({ctx.remaining():.0f} s left after the probe); mode "
                f"{'gpu' if gpu else 'tiny'}; inputs {work.inputs}, {work.max_new_tokens} new tokens, {work.repeats} "
                f"repeats, profile {work.steps} steps; out {outdir}")  # fmt: skip
        if args.checkpoint and not args.checkpoint.startswith("builtin:") and Path(args.checkpoint).exists():
            args.checkpoint = str(Path(args.checkpoint).resolve())  # the steps run in the repository root
        if gpu and args.checkpoint is None:
            plan_pilot_e2b(ctx, work)
        elif os.environ.get("GPURUN_TEST_PLAN") == "pilot" and args.checkpoint is None:
            plan_pilot_e2b(ctx, work, gpu, "tiny", "tiny")
        else:
            spec = args.checkpoint or "builtin:tiny"
            tag = "tiny" if spec == "builtin:tiny" else re.sub(r"[^A-Za-z0-9._-]", "-", Path(spec.split(":")[-1]).name)
            plan_single(ctx, spec, work, gpu, tag)
        code = exit_code(ctx)
    except SystemExit as exc:
        ctx.say(str(exc.code))
        code = EXIT_FAILED
    finally:
        if ctx.background is not None and ctx.background.poll() is None:
            ctx.background.kill()
            ctx.background.wait()
    lines = summary_lines(ctx, code)
    (outdir / "summary.txt").write_text("\n".join(lines[1:]) + "\n", encoding="utf-8")
    for line in lines[:-1]:
        ctx.say(line)
    if args.pack is not None:
        try:
            for note in pack(ctx, args.pack):
                ctx.say(note)
        except OSError as exc:
            ctx.say(f"pack: failed ({exc})")
    ctx.say(lines[-1])
    log_fh.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
