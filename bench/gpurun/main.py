"""The prepared GPU run behind `scripts/gpu-run.sh`: the whole harness on one accelerator in one budgeted command.

Usage (from the repository root; the shell script sets PYTHONPATH and calls `python3 -m bench.gpurun`):

    scripts/gpu-run.sh OUTDIR [--budget-s 420] [--checkpoint DIR|builtin:NAME|random:NAME] [--tiny] [--pack DIR]
        [--quant SET ...] [--batch 1,8,32,128]

(`bench gpu-run OUTDIR ...` is the same command where the project is installed.) Nothing is installed: the machine's python3 runs the repository as is. `python3 -m bench.gpurun`
(bench/gpurun/__main__.py) runs the package check (`REQUIRED`, `check_packages`) with the standard library alone,
so a missing module is one line before typer is imported; then it hands the process over to `bench gpu-run`
(bench/cli/gpurun_cmds.py), which parses the options and calls `run`. This package's top level imports only the
standard library (and `bench.errors`, `bench.signals`, themselves standard library only). Every `bench` step runs
in its own process (`python3 -m bench ...`): jax initialises once per step, the GPU profile XLA_FLAGS go only to
the profile process, and a step that overruns is stopped without losing the others.

Plans (chosen after the device probe; "remaining" is always the budget left minus `end_margin`):

- GPU or TPU (`ACCELERATORS`), no --checkpoint ("pilot + E2B"): the E2B checkpoint (`builtin:e2b`, bf16, 9.3 GB; measured 2 min 37 s
  and 9.4 GB peak host memory on a 2-core CPU machine, mostly single-threaded RNG) is generated in a background
  CPU process (JAX_PLATFORMS=cpu, so it never touches the GPU) while the GPU measures, cheapest first: bandwidth, then a full
  sweep of the `default` preset (the pilot: every E2B irregularity at hidden size 256, the same four input sizes,
  compiled and timed for real), then, while E2B is still being written, the pilot's profile. When the E2B
  checkpoint is ready and at least `e2b_min_s` remain, E2B is swept and profiled into its own run folder; else the
  generator is stopped and the log says how long it had run (so the next task can size its budget).
- --checkpoint given, or --tiny, or no GPU or TPU found ("single"): checkpoint (created first, as its own step, when it is
  `builtin:NAME` and not cached; nothing to create for `random:NAME[@SEED]`, dummy weights each step makes on the
  device), bandwidth, sweep, profile --run <that sweep's folder>.

Quantization: each `--quant SET` flag (repeatable; SET is one comma-separated option set, as `bench sweep --quant`
takes it) adds a sweep + profile pair per checkpoint, in the order given, into its own run folder (its steps and
label carry the set: `quant_tag`), so one lease measures dense (`--quant none`) beside `--quant ple4,int8_lm_head`.
Without the flag each checkpoint gets one dense pair and no --quant is passed: the default run is unchanged.
Each `--kernel w4a16=pallas|xla` flag (repeatable) splits every option set with w4 weights into one pair per
value (`Options.quant_sets`; label and steps tagged -pallas / -xla), so one lease measures the fused W4A16 kernel
on and off (`--quant w4 --kernel w4a16=pallas --kernel w4a16=xla`); sets without w4 get no --kernel. The
pairs of one checkpoint share its time: each sweep but the last is capped at an equal share of what is left
(`_share_cap`), the pilot sweeps together at `pilot_share`, and each E2B pair needs `e2b_min` left to start.

Batches: `--batch LIST` (e.g. 1,8,32,128) is passed to every sweep (`bench sweep --batch`: each input size at each
batch; a batch that does not fit in the device's memory fails that sweep with one line, so pair large batches with
small --inputs, e.g. --inputs 41), and after each sweep's own profile (B = 1, joined to the sweep's run) the largest
batch is profiled into its own run folder (`profile-TAG-bB`, `bench profile --batch B`), so the report sets the
device-time categories (tensor cores included) of B = 1 and the largest B side by side. The sweep then keeps back
two profiles' reserve.

Budget: each step gets a limit from what remains. A sweep gets all of it minus a reserve for the profile that
follows (minus a grace period); when the reserve would leave it less than its minimum it gets everything, since a
partial sweep is worth more than a profile. A step that reaches its limit gets SIGTERM (the sweep then keeps its
finished cells and marks the run incomplete), then SIGKILL after the grace period; a folder a killed step left
"running" is marked incomplete here. A step with less than its minimum left is skipped, with a line saying so.
SIGTERM or SIGINT (the device tool's timeout, Ctrl-C) stops the current step the same way; no later step starts,
and the run goes on to its summary.

Exit codes: 0 every planned step ran to the end; 3 the budget stopped or skipped a step (the run folders are
valid, possibly incomplete); 1 a step failed; 2 a usage error or a missing package (nothing was run).
The last lines on stdout are always the summary (steps, bandwidth, each run's sweep table and profile).

GPU settings are never touched: no nvidia-smi -pm/-lgc/-rgc/-r/-mig, only jax's own device use.

This module holds the options, the plans and `run`; the context, timings and steps are in `bench/gpurun/steps.py`,
the exit code, summary and packing in `bench/gpurun/summary.py`; `bench/gpurun/__init__.py` names the package's
API. Nothing here prints or exits: output lines go to the caller's `emit`, user errors are raised (bench.errors).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from bench.errors import InputError, MissingModuleError

if TYPE_CHECKING:  # the annotations only: this module imports the standard library alone at its top level
    from model.engine_config import EngineConfig

# The steps and the summary (both standard library only at their top level, like this module), the stop signals.
from bench.gpurun.steps import (
    GPU_TIMING,
    GPU_WORK,
    TINY_TIMING,
    TINY_WORK,
    Context,
    ProbeFailed,
    StepResult,
    Workload,
    bandwidth,
    batch_profile,
    checkpoint_step,
    child_argv,
    child_env,
    probe,
    profile,
    skip,
    stamp,
    sweep,
)
from bench.gpurun.summary import EXIT_FAILED, EXIT_USAGE, exit_code, pack, summary_lines
from bench.signals import stop_signals_handled

REQUIRED = ("jax", "jaxlib", "numpy", "ml_dtypes", "safetensors", "tokenizers", "typer", "click", "rich")
"""Imported by the steps (model/ and bench/); matplotlib, pandas, xprof are not needed here."""

ACCELERATORS = ("gpu", "tpu")
"""jax platforms the run measures for real (the pilot + E2B plan); on any other it runs tiny mode. A TPU gets the
same plan and workload as a GPU, without the GPU profiling flags."""

PILOT, BIG = "default", "e2b"
"""The pilot + E2B plan's presets on a GPU (`PilotPlan`)."""

REPO = Path(__file__).resolve().parents[2]
"""The repository root: the steps' working folder and first PYTHONPATH entry."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """What one gpu-run does (its command line).

    `outdir`: the output folder (runs/, xla-cache/, logs/, summary.txt, gpu-run.log), created when missing;
    `budget_s`: wall-clock budget of the whole run (s, > 0); `checkpoint`: a checkpoint folder, builtin:NAME or
    random:NAME[@SEED] (None: the plan the probe chooses); `tiny`: CPU mode (the built-in tiny checkpoint, small
    inputs); `pack`: also write the results as <= 8 flat files into this folder. Overrides of the mode's workload (None: the mode's own): `inputs`
    (sweep input sizes, comma-separated tokens), `max_new_tokens` (per request), `repeats` (timed repeats per
    cell), `steps` (profiled decode steps), `decode_loop` (the sweep's --decode-loop: host, device or both),
    `batch` (the sweep's --batch sizes, comma-separated, e.g. "1,8,32,128": passed to every sweep, and the largest
    is profiled too, into its own run, `bench.gpurun.steps.batch_profile`; None: no --batch).
    `quant`: the `--quant` option sets, one per `--quant` flag (e.g. ("none", "ple4,int8_lm_head")): each is swept
    and profiled as its own run, in the order given, wherever the plan sweeps a checkpoint; () (the default): one
    run per checkpoint, no --quant passed (dense), exactly as before. `mesh`: the `--mesh` text (tp=N, ep=N)
    every sweep and profile passes (None: one device)."""

    outdir: Path
    budget_s: float = 420.0
    checkpoint: str | None = None
    tiny: bool = False
    pack: Path | None = None
    inputs: str | None = None
    max_new_tokens: int | None = None
    repeats: int | None = None
    steps: int | None = None
    decode_loop: str | None = None
    quant: tuple[str, ...] = ()
    kernel: tuple[str, ...] = ()
    batch: str | None = None
    mesh: str | None = None

    @property
    def quant_sets(self) -> tuple[tuple[str | None, str | None], ...]:
        """The (option set, --kernel) of each run per checkpoint: each set of `quant` (or None: one run, no --quant
        flag, when empty), and for a set with w4 weights one run per `kernel` value (e.g. w4a16=pallas, w4a16=xla:
        the fused kernel on and off); None: no --kernel flag (the engine decides)."""
        from model.quantspec import parse_quant  # standard library only (no jax, no numpy)

        out: list[tuple[str | None, str | None]] = []
        for q in self.quant or (None,):
            w4 = q is not None and parse_quant(q).layer_bits == 4
            out += [(q, k) for k in (self.kernel if w4 and self.kernel else (None,))]
        return tuple(out)

    @property
    def engines(self):
        """The `model.engine_config.EngineConfig` of each run per checkpoint (`quant_sets`' option set and kernel,
        and `mesh`): the steps pass its options (`EngineConfig.to_args`), so every engine option reaches them
        without being restated. Raises OptionError / QuantError as `EngineConfig.from_options`."""
        from model.engine_config import EngineConfig  # standard library only (no jax, no numpy)

        return tuple(EngineConfig.from_options(quant=q, kernel=k, mesh=self.mesh) for q, k in self.quant_sets)


@dataclass(frozen=True, kw_only=True)
class PilotPlan:
    """The built-in presets of the "pilot + E2B" plan (module docstring): `pilot` is swept and profiled while `big` is
    generated in the background, then `big` is. A GPU without --checkpoint runs PilotPlan() (default, then e2b);
    the tests pass PilotPlan(pilot="tiny", big="tiny") to `run` to exercise the plan on a CPU."""

    pilot: str = PILOT
    big: str = BIG


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How a run ended: `code` (EXIT_OK, EXIT_BUDGET, EXIT_FAILED, or EXIT_USAGE when the probe found a module
    missing), the `summary` lines as printed (also in OUTDIR/summary.txt; the last is the exit line) and `outdir`
    (resolved)."""

    code: int
    summary: tuple[str, ...]
    outdir: Path


# ---- checks ------------------------------------------------------------------------------------------------------
def missing_packages(names: Sequence[str] = REQUIRED) -> list[str]:
    """The names of `names` that this Python cannot import (found without importing them)."""
    out = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                out.append(name)
        except (ImportError, ValueError):
            out.append(name)
    return out


def missing_message(names: Sequence[str]) -> str:
    """The one line (without "error: ") for modules `names` missing from this Python: what, where, the fix."""
    return (f"gpu-run needs Python packages missing from {sys.executable}: {', '.join(names)} "
            "(carry them as wheels; see .library/device/README.md)")  # fmt: skip


def check_packages(names: Sequence[str] = REQUIRED) -> None:
    """Raises MissingModuleError (`missing_message`) when this Python cannot import one of `names`; imports none."""
    missing = missing_packages(names)
    if missing:
        raise MissingModuleError(missing_message(missing))


# ---- plans -------------------------------------------------------------------------------------------------------
def quant_tag(tag: str, quant: str | None, kernel: str | None = None) -> str:
    """The step and run-label tag of `tag` measured with option set `quant` and `--kernel kernel`: `tag` itself for
    None (no --quant), else TAG-SET with the set in run-label characters ("ple4,int8_lm_head" ->
    "pilot-int8_lm_head.ple4", canonical order; "w4:64" -> "w4-64"), then -IMPL for a kernel ("w4a16=pallas" ->
    "pilot-w4-128-pallas")."""
    if quant is None:
        return tag
    from model.quantspec import parse_quant  # standard library only (no jax, no numpy)

    out = f"{tag}-{parse_quant(quant).canonical.replace(',', '.').replace(':', '-')}"
    return out if kernel is None else f"{out}-{kernel.partition('=')[2]}"


def engine_tag(tag: str, engine: EngineConfig | None) -> str:
    """`quant_tag` of `engine` (a `model.engine_config.EngineConfig`; None: no engine option): its option set and
    kernel as written."""
    if engine is None:
        return tag
    return quant_tag(tag, engine.flag_text("quant"), engine.flag_text("kernel"))


def _share_cap(ctx: Context, runs_left: int) -> float | None:
    """The cap of one sweep of `runs_left` sweep + profile pairs still to run on one checkpoint: an equal share of
    the time left, less the profile's reserve and the grace period (at least `Timing.sweep_min`); None for the last
    pair (the sweep's own rule: all that is left but the reserve)."""
    if runs_left <= 1:
        return None
    t = ctx.timing
    return max(t.sweep_min, ctx.remaining() / runs_left - t.profile_reserve - t.grace)


def plan_single(ctx: Context, spec: str, work: Workload, gpu: bool, tag: str,
                engines: Sequence[EngineConfig | None] = (None,)) -> None:  # fmt: skip
    """The "single" plan: checkpoint `spec` (a folder or `builtin:NAME`, created first when needed), bandwidth,
    then per engine configuration of `engines` (`Options.engines`) a sweep and a profile into that sweep's run folder, each
    sweep but the last capped at its share of the time left (`_share_cap`). `tag` names the steps (sweep-TAG,
    profile-TAG, with the set: `quant_tag`) and the run label (gpurun-TAG-HHMMSS); `gpu` gives the profile the GPU
    profiling flags. Stops after a failed checkpoint."""
    if not checkpoint_step(ctx, spec):
        return
    bandwidth(ctx, work)
    for i, engine in enumerate(engines):
        qtag = engine_tag(tag, engine)
        run = sweep(ctx, f"sweep-{qtag}", f"gpurun-{qtag}-{stamp()}", spec, work, cap=_share_cap(ctx, len(engines) - i),
                    engine=engine)  # fmt: skip
        profiles(ctx, qtag, run, spec, work, gpu, engine=engine)


def plan_pilot_e2b(ctx: Context, work: Workload, gpu: bool = True, plan: PilotPlan = PilotPlan(),
                   engines: Sequence[EngineConfig | None] = (None,)) -> None:  # fmt: skip
    """The "pilot + E2B" plan (module docstring): checkpoint `plan.big` is generated in a background CPU process
    while bandwidth and the `plan.pilot` sweeps (one per engine configuration of `engines`, together capped at
    `Timing.pilot_share` of the budget) run, each pilot's profile while `big` is still being written (else after
    the E2B steps). `big` is swept and profiled per option set when it is ready with at least `Timing.e2b_min` s
    left for that configuration (its sweeps but the last capped at their share, `_share_cap`), else the generator is stopped
    and the log says how long it ran (s). `gpu` gives the profiles the GPU profiling flags. The generator's output
    goes to logs/checkpoint-BIG.log."""
    t, big, pilot_spec = ctx.timing, plan.big, f"builtin:{plan.pilot}"
    gen_t0 = time.monotonic()
    gen_log = _start_generator(ctx, big)
    bandwidth(ctx, work)
    pilot_cap = max(t.sweep_min, t.pilot_share * ctx.budget / len(engines))
    unprofiled = []
    for engine in engines:
        tag = engine_tag("pilot", engine)
        pilot = sweep(ctx, f"sweep-{tag}", f"gpurun-{engine_tag(f'pilot-{plan.pilot}', engine)}-{stamp()}",
                      pilot_spec, work, cap=pilot_cap, engine=engine)  # fmt: skip
        if ctx.background.poll() is None and not ctx.stopping:  # the GPU is idle otherwise: profile meanwhile
            profiles(ctx, tag, pilot, pilot_spec, work, gpu, engine=engine)
        else:
            unprofiled.append((tag, pilot, engine))
    if _settle_generator(ctx, big, gen_t0):
        for i, engine in enumerate(engines):
            tag = engine_tag(big, engine)
            if ctx.remaining() < t.e2b_min:
                skip(ctx, f"sweep-{tag}", f"{ctx.remaining():.0f} s left, needs {t.e2b_min:.0f} s")
                continue
            run = sweep(ctx, f"sweep-{tag}", f"gpurun-{tag}-{stamp()}", f"builtin:{big}", work,
                        cap=_share_cap(ctx, len(engines) - i), engine=engine)  # fmt: skip
            profiles(ctx, tag, run, f"builtin:{big}", work, gpu, engine=engine)
    gen_log.close()
    ctx.background = None
    for tag, pilot, engine in unprofiled:
        profiles(ctx, tag, pilot, pilot_spec, work, gpu, engine=engine)


def profiles(ctx: Context, tag: str, run: Path | None, spec: str, work: Workload, gpu: bool,
             engine: EngineConfig | None = None) -> None:  # fmt: skip
    """The profile step(s) after the sweep `run` of `spec` (steps named after `tag`): `profile-TAG` joined to the
    sweep's run (B = 1, as without --batch), then, with a `work.batch` above 1, `profile-TAG-bB` at the largest
    batch into its own run folder (`batch_profile`: gpurun-TAG-profile-bB-HHMMSS). `engine`: the sweep's engine
    configuration (its options, `EngineConfig.to_args`)."""
    profile(ctx, f"profile-{tag}", run, spec, work, gpu, engine=engine)
    b = work.largest_batch
    if b > 1:
        batch_profile(ctx, f"profile-{tag}-b{b}", f"gpurun-{tag}-profile-b{b}-{stamp()}", spec, work, gpu,
                      engine=engine)  # fmt: skip


def _start_generator(ctx: Context, big: str):
    """Start generating `builtin:BIG` (bf16) in a background CPU process (`ctx.background`); returns its open log."""
    log_path = ctx.outdir / "logs" / f"checkpoint-{big}.log"
    log = open(log_path, "w", encoding="utf-8")
    ctx.say(f"== checkpoint-{big}: generating builtin:{big} (bf16) in the background on the CPU (log: {log_path})")
    ctx.background = subprocess.Popen(child_argv("_make_builtin", big), cwd=ctx.repo,
                                      env=child_env(ctx, {"JAX_PLATFORMS": "cpu"}), stdout=log,
                                      stderr=subprocess.STDOUT)  # fmt: skip
    return log


def _settle_generator(ctx: Context, big: str, gen_t0: float) -> bool:
    """Wait for the background generator while at least `Timing.e2b_min` s remain (and no stop was asked), then
    record its step checkpoint-BIG: "ok", "failed" (its exit code) or "stopped" (not ready: terminated, and the big
    sweep recorded as skipped). `gen_t0` is its start (`time.monotonic()`). True when the checkpoint is ready."""
    t, gen, name = ctx.timing, ctx.background, f"checkpoint-{big}"
    while gen.poll() is None and ctx.remaining() >= t.e2b_min and not ctx.stopping:
        time.sleep(1)
    gen_s = time.monotonic() - gen_t0
    if gen.poll() is None:
        gen.terminate()
        try:
            gen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gen.kill()
            gen.wait()
        ctx.steps.append(StepResult(name, "stopped", gen_s, f"not ready after {gen_s:.0f} s; E2B needs >= "
                                    f"{t.e2b_min:.0f} s after it"))  # fmt: skip
        ctx.say(f"== {name}: not ready after {gen_s:.0f} s with {ctx.remaining():.0f} s left "
                f"(E2B steps need {t.e2b_min:.0f} s); stopped; E2B sweep and profile skipped")  # fmt: skip
        skip(ctx, f"sweep-{big}", "E2B checkpoint not ready in time")
        return False
    if gen.returncode != 0:
        ctx.steps.append(StepResult(name, "failed", gen_s, f"exit code {gen.returncode}", gen.returncode))
        ctx.say(f"== {name}: FAILED (exit code {gen.returncode}); see {ctx.outdir / f'logs/{name}.log'}")
        return False
    ctx.steps.append(StepResult(name, "ok", gen_s, "generated in the background"))
    ctx.say(f"== {name}: ready after {gen_s:.0f} s")
    return True


# ---- the run -----------------------------------------------------------------------------------------------------
def check_options(options: Options) -> None:
    """Refuse bad `options` before any step runs: a budget that is not positive, --inputs that are not positive
    comma-separated token counts, --max-new-tokens / --repeats / --steps below 1, --batch sizes that are not
    distinct whole numbers >= 1, a malformed --mesh, a --checkpoint that is neither
    builtin:NAME nor an existing folder. Raises InputError (one line: received, expected)."""
    if not options.budget_s > 0:
        raise InputError(f"--budget-s {options.budget_s}: expected a positive number of seconds")
    if options.inputs is not None:
        sizes = options.inputs.split(",")
        if not all(n.strip().isdigit() and int(n) > 0 for n in sizes):
            raise InputError(f"--inputs {options.inputs}: expected positive token counts, comma-separated, e.g. 41,521")
    for flag, value in (("--max-new-tokens", options.max_new_tokens), ("--repeats", options.repeats),
                        ("--steps", options.steps)):  # fmt: skip
        if value is not None and value < 1:
            raise InputError(f"{flag} {value}: expected a positive whole number")
    if options.decode_loop is not None and options.decode_loop not in ("host", "device", "both"):
        raise InputError(f"--decode-loop {options.decode_loop}: expected host, device or both")
    if options.batch is not None:
        sizes = [b.strip() for b in options.batch.split(",")]
        if not all(b.isdigit() and int(b) > 0 for b in sizes) or len(set(map(int, sizes))) != len(sizes):
            raise InputError(f"--batch {options.batch}: expected distinct batch sizes >= 1, comma-separated, e.g. "
                             "--batch 1,8,32,128")  # fmt: skip
    _check_quant_sets(options.quant)
    _check_kernels(options.kernel)
    _check_mesh(options.mesh)
    spec = options.checkpoint
    if spec is not None:
        if spec.startswith("builtin:") and not spec.split(":", 1)[1]:
            raise InputError(f"--checkpoint {spec}: expected builtin:NAME (e.g. builtin:tiny)")
        if spec.startswith("random:"):
            from model.errors import CheckpointError
            from model.random_spec import parse_random  # standard library only (no jax, no numpy)

            try:
                parse_random(spec)
            except CheckpointError as exc:
                raise InputError(f"--checkpoint {exc}") from None
        elif not spec.startswith("builtin:") and not Path(spec).expanduser().is_dir():
            raise InputError(f"--checkpoint {spec}: no such folder; pass a checkpoint folder, builtin:NAME or "
                             "random:NAME")  # fmt: skip


def _check_kernels(kernels: Sequence[str]) -> None:
    """InputError (one line) for a `--kernel` value other than w4a16=pallas / w4a16=xla, or one given twice: each
    checked as `bench sweep --quant w4 --kernel VALUE` checks it (`model.engine_config.EngineConfig.from_options`)."""
    from model.engine_config import EngineConfig  # standard library only (no jax)
    from model.errors import OptionError

    for i, text in enumerate(kernels):
        try:
            EngineConfig.from_options(quant="w4", kernel=text)
        except OptionError as exc:
            raise InputError(f"{exc} (each --kernel flag of gpu-run is one run per w4 option set)") from None
        if text in kernels[:i]:
            raise InputError(f"--kernel {text}: given twice; expected each value once (e.g. --kernel w4a16=pallas "
                             "--kernel w4a16=xla: the kernel on and off)")  # fmt: skip


def _check_mesh(text: str | None) -> None:
    """InputError (one line) for a `--mesh` text `bench sweep --mesh` would refuse
    (`model.engine_config.parse_mesh_option`); whether the devices are there each step asks before it loads."""
    from model.engine_config import parse_mesh_option  # standard library only (no jax, no numpy)
    from model.errors import OptionError

    try:
        parse_mesh_option(text)
    except OptionError as exc:
        raise InputError(str(exc)) from None


def _check_quant_sets(sets: Sequence[str]) -> None:
    """InputError (one line) for a `--quant` option set that `model.quantspec.parse_quant` refuses, or one given
    twice (in canonical form: "ple4,int8_lm_head" and "int8_lm_head,ple4" are the same set): each parsed as
    `bench sweep --quant` parses it (`model.engine_config.EngineConfig.from_options`)."""
    from model.engine_config import EngineConfig  # standard library only (no jax, no numpy)
    from model.errors import QuantError

    seen: dict[str, str] = {}
    for text in sets:
        try:
            canonical = EngineConfig.from_options(quant=text).quant_spec.canonical
        except QuantError as exc:
            raise InputError(f"{exc} (each --quant flag of gpu-run is one option set)") from None
        if canonical in seen:
            raise InputError(f"--quant {text}: the same option set as --quant {seen[canonical]}; expected each "
                             "set once, one --quant flag per set (e.g. --quant none --quant ple4,int8_lm_head)")  # fmt: skip
        seen[canonical] = text


def run(options: Options, *, emit: Callable[[str], None], plan: PilotPlan | None = None) -> Outcome:
    """Run gpu-run as `options` say and return how it ended (the exit codes: module docstring).

    `emit` gets every output line as it happens (the probe's device and policy lines first, the summary last); the
    same lines go to OUTDIR/gpu-run.log, the summary also to OUTDIR/summary.txt. `plan` runs the pilot + E2B plan
    with its presets whatever the probe finds, unless `options.checkpoint` is given (the tests' seam:
    PilotPlan(pilot="tiny", big="tiny") on a CPU); None: the plan is chosen from the probe and `options`. While it
    runs, SIGTERM and SIGINT (bench.signals) stop the current step, which keeps its finished work, and the run goes
    on to its summary. A module the probe finds missing ends the run with EXIT_USAGE and its one line (not raised).

    Raises InputError, before anything is written or runs, for a bad option (`check_options`) or an OUTDIR that
    cannot be created."""
    check_options(options)
    outdir = options.outdir.resolve()
    try:
        (outdir / "logs").mkdir(parents=True, exist_ok=True)
        (outdir / "runs").mkdir(exist_ok=True)
    except OSError as exc:
        raise InputError(f"OUTDIR {outdir}: cannot create it ({exc.strerror or exc}); pass a writable folder") from None
    with open(outdir / "gpu-run.log", "a", encoding="utf-8") as log_fh:
        ctx = Context(repo=REPO, outdir=outdir, budget=options.budget_s, t0=time.monotonic(), log_fh=log_fh,
                      emit=emit, timing=TINY_TIMING if options.tiny else GPU_TIMING)  # fmt: skip
        with stop_signals_handled(ctx.request_stop):  # the device tool's timeout, Ctrl-C: stop, keep, summarise
            code = _measure(ctx, options, plan)
            lines = _finish(ctx, options, code)
    return Outcome(code=code, summary=tuple(lines), outdir=outdir)


def _measure(ctx: Context, options: Options, plan: PilotPlan | None) -> int:
    """The probe, then the plan's steps; returns the exit code (`exit_code`, or EXIT_USAGE / EXIT_FAILED with one
    "error:" line when the probe found a module missing / failed). Never leaves the background generator running."""
    try:
        info = probe(ctx, force_cpu=options.tiny)
        accel = info["platform"] in ACCELERATORS and not options.tiny
        gpu = accel and info["platform"] == "gpu"  # the GPU profiling XLA_FLAGS go to GPU profiles only
        if not accel and not options.tiny:
            ctx.say(f"no GPU or TPU found (jax runs on {info['platform']}): tiny mode (built-in tiny checkpoint, "
                    f"small inputs)")
        ctx.timing = GPU_TIMING if accel else TINY_TIMING
        work = _workload(options, GPU_WORK if accel else TINY_WORK)
        ctx.say(f"gpu-run: budget {ctx.budget:.0f} s ({ctx.remaining():.0f} s left after the probe); mode "
                f"{info['platform'] if accel else 'tiny'}; inputs {work.inputs}, {work.max_new_tokens} new tokens, {work.repeats} "
                f"repeats, decode loop {work.decode_loop}, profile {work.steps} steps"
                f"{'; batch ' + work.batch if work.batch else ''}"
                f"{'; quant ' + ' | '.join(options.quant) if options.quant else ''}"
                f"{'; kernel ' + ' | '.join(options.kernel) if options.kernel else ''}"
                f"{'; mesh ' + options.mesh if options.mesh else ''}; out {ctx.outdir}")  # fmt: skip
        spec = _checkpoint_spec(options.checkpoint)
        if plan is None and accel:
            plan = PilotPlan()
        if spec is None and plan is not None:
            plan_pilot_e2b(ctx, work, gpu, plan, options.engines)
        else:
            spec = spec or "builtin:tiny"
            name = spec if spec.startswith("random:") else Path(spec.split(":")[-1]).name  # random:e2b -> random-e2b
            tag = "tiny" if spec == "builtin:tiny" else re.sub(r"[^A-Za-z0-9._-]", "-", name)
            plan_single(ctx, spec, work, gpu, tag, options.engines)
        return exit_code(ctx)
    except MissingModuleError as exc:
        ctx.say(f"error: {exc}")
        return EXIT_USAGE
    except ProbeFailed as exc:
        ctx.say(f"error: {exc}")
        return EXIT_FAILED
    finally:
        if ctx.background is not None and ctx.background.poll() is None:
            ctx.background.kill()
            ctx.background.wait()


def _workload(options: Options, base: Workload) -> Workload:
    """The mode's workload `base` with the overrides `options` gives."""
    def given(value, default):  # an override is used as given (check_options refused 0 and below)
        return default if value is None else value

    return Workload(given(options.inputs, base.inputs), given(options.max_new_tokens, base.max_new_tokens),
                    given(options.repeats, base.repeats), given(options.steps, base.steps), base.profile_input,
                    base.bandwidth_args, given(options.decode_loop, base.decode_loop),
                    batch=",".join(b.strip() for b in options.batch.split(",")) if options.batch else None)  # fmt: skip


def _checkpoint_spec(spec: str | None) -> str | None:
    """--checkpoint as the steps take it: an existing folder made absolute (the steps run in the repository root)."""
    if spec and not spec.startswith("builtin:") and Path(spec).exists():
        return str(Path(spec).resolve())
    return spec


def _finish(ctx: Context, options: Options, code: int) -> list[str]:
    """Write OUTDIR/summary.txt and say the summary, the packing notes (with --pack) before its last line, then the
    exit line last. Returns the summary lines. A pack that fails is one "pack: failed" line, never raised."""
    lines = summary_lines(ctx, code)
    (ctx.outdir / "summary.txt").write_text("\n".join(lines[1:]) + "\n", encoding="utf-8")
    for line in lines[:-1]:
        ctx.say(line)
    if options.pack is not None:
        try:
            for note in pack(ctx, options.pack):
                ctx.say(note)
        except OSError as exc:
            ctx.say(f"pack: failed ({exc})")
    ctx.say(lines[-1])
    return lines
