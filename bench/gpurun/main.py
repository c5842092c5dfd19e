"""The prepared GPU run behind `scripts/gpu-run.sh`: the whole harness on one accelerator in one budgeted command.

Usage (from the repository root; the shell script sets PYTHONPATH and calls `python3 -m bench.gpurun`):

    scripts/gpu-run.sh OUTDIR [--budget-s 420] [--checkpoint DIR|builtin:NAME] [--tiny] [--pack DIR]

Nothing is installed: the machine's python3 runs the repository as is. This module's top level imports only the
standard library, so the package check (`REQUIRED`) runs before anything else and fails with one line. Every
`bench` step runs in its own process (`python3 -m bench ...`): jax initialises once per step, the GPU profile
XLA_FLAGS go only to the profile process, and a step that overruns is stopped without losing the others.

Plans (chosen after the device probe; "remaining" is always the budget left minus `end_margin`):

- GPU, no --checkpoint ("pilot + E2B"): the E2B checkpoint (`builtin:e2b`, bf16, 9.3 GB; measured 2 min 37 s
  and 9.4 GB peak host memory on a 2-core CPU machine, mostly single-threaded RNG) is generated in a background
  CPU process (JAX_PLATFORMS=cpu, so it never touches the GPU) while the GPU measures, cheapest first: bandwidth, then a full
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

This module holds the plans and `main`; the context, timings and steps are in `bench/gpurun/steps.py`, the exit
code, summary and packing in `bench/gpurun/summary.py`; `bench/gpurun/__init__.py` names the package's API.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

# The steps and the summary (both standard library only at their top level, like this module).
from bench.gpurun.steps import (
    GPU_TIMING,
    GPU_WORK,
    TINY_TIMING,
    TINY_WORK,
    Context,
    MissingModule,
    StepResult,
    Workload,
    bandwidth,
    checkpoint_step,
    child_env,
    make_builtin_child,
    probe,
    probe_child,
    profile,
    skip,
    stamp,
    sweep,
)
from bench.gpurun.summary import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    exit_code,
    pack,
    summary_lines,
)

REQUIRED = ("jax", "jaxlib", "numpy", "ml_dtypes", "safetensors", "tokenizers", "typer", "click", "rich")
"""Imported by the steps (model/ and bench/); matplotlib, pandas, xprof are not needed here."""

PILOT, BIG = "default", "e2b"
"""The pilot+E2B plan's presets. GPURUN_TEST_PLAN=pilot (tests only) runs that plan on the CPU with the tiny preset
for both, so its logic is exercised without a GPU."""


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


# ---- plans -------------------------------------------------------------------------------------------------------
def plan_single(ctx: Context, spec: str, work: Workload, gpu: bool, tag: str) -> None:
    """The "single" plan: checkpoint `spec` (a folder or `builtin:NAME`, created first when needed), bandwidth,
    sweep, then profile into that sweep's run folder. `tag` names the steps (sweep-TAG, profile-TAG) and the run
    label (gpurun-TAG-HHMMSS); `gpu` gives the profile the GPU profiling flags. Stops after a failed checkpoint."""
    if not checkpoint_step(ctx, spec):
        return
    bandwidth(ctx, work)
    run = sweep(ctx, f"sweep-{tag}", f"gpurun-{tag}-{stamp()}", spec, work)
    profile(ctx, f"profile-{tag}", run, spec, work, gpu)


def plan_pilot_e2b(ctx: Context, work: Workload, gpu: bool = True, pilot_preset: str = PILOT,
                   big: str = BIG) -> None:  # fmt: skip
    """The "pilot + E2B" plan (module docstring): checkpoint `big` is generated in a background CPU process while
    bandwidth and the `pilot_preset` sweep (capped at `Timing.pilot_share` of the budget) run, then the pilot's
    profile while `big` is still being written (else after the E2B steps). `big` is swept and profiled when it is
    ready with at least `Timing.e2b_min` s left, else the generator is stopped and the log says how long it ran (s).
    `gpu` gives the profiles the GPU profiling flags. The generator's output goes to logs/checkpoint-BIG.log."""
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


# ---- main --------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of scripts/gpu-run.sh (argparse exits with code 2 on a bad one)."""
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
    """Run gpu-run with `argv` (default: sys.argv[1:]) and return its exit code (module docstring: EXIT_OK,
    EXIT_BUDGET, EXIT_FAILED, or EXIT_USAGE with one line on stderr and nothing run). `_probe` and
    `_make_builtin PRESET` as first words run a step's child work instead (exit code 0). SIGTERM and SIGINT stop
    the current step, keep its work and go on to the summary, which is always the last output."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_probe"]:
        probe_child()
        return 0
    if argv[:1] == ["_make_builtin"]:
        make_builtin_child(argv[1])
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
    except MissingModule as exc:
        ctx.say(str(exc.code))
        code = EXIT_USAGE
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
