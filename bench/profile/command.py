"""`bench profile` as a library: the options checked (`run_profile`: every check before anything loads), the engine
loaded under its configuration, N decode steps traced, analysed and measured into a new run folder or a joined
measured run. bench/cli/profile_cmds.py parses the flags and prints; definitions: docs/method.md, "Profiles" and
"Rooflines".

GPU flags: XLA reads XLA_FLAGS once, when jax initialises its backend, so `bench profile` decides whether it is
about to run on an NVIDIA GPU *without* initialising jax: `JAX_PLATFORMS` when set (its first entry "cuda"/"gpu"
means yes, anything else no), otherwise the presence of an NVIDIA driver (`nvidia-smi` on PATH or
`/proc/driver/nvidia/version`). Then it adds `gpu_profile_flags()` (command buffers off, for per-op attribution)
before the engine loads. What was decided, why, and the XLA_FLAGS in force are recorded in profile.json
("capture"). If the guess was wrong in either direction the analysis still works; a note says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.errors import InputError
from bench.runs.manifest import kernel_text, w4_kernel_of

WARMUP_STEPS = 2
"""Decode steps run (untraced) before the traced ones."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    """`bench profile`'s options but the engine's: `steps` (traced decode steps), `input_tokens`, `batch` (rows per
    step), `checkpoint`, `run_ref` (--run: the run to join, as typed), `replace`, `name`, `runs_dir`,
    `python_tracer`, `compile_cache`."""

    steps: int = 20
    input_tokens: int = 41
    batch: int = 1
    checkpoint: str | None = None
    run_ref: str | None = None
    replace: bool = False
    name: str | None = None
    runs_dir: Path = Path("runs")
    python_tracer: bool = False
    compile_cache: str | None = None


def run_profile(req: ProfileRequest, engine_options: Mapping[str, Any]):
    """The whole `bench profile`: check the options (InputError, RunFolderError, OptionError: one line each, before
    anything loads), then trace, analyse and write profile.json into a new run (ended complete, incomplete or
    failed) or into the joined run (which keeps its status). `engine_options`: the
    `model.engine_config.EngineConfig.from_options` keywords as typed; with --run, the quantization, kernel,
    stored weight dtype and backend not given are the run's. Returns (profile.json dict, the capture,
    profile.json's path). SIGTERM / Ctrl-C stop at once (exit 130, `signals_interrupt`)."""
    from bench.runs import check_writable, open_run, resolve_run, writing_run
    from model.engine_config import EngineConfig

    _check_request(req)
    EngineConfig.from_options(**{**engine_options, "kernel": None})  # bad values: one line before any run is opened
    joined, options = None, dict(engine_options)
    if req.run_ref is not None:
        joined = open_run(resolve_run(req.run_ref, req.runs_dir))  # RunFolderError names the folder
        refuse_to_overwrite(joined, req.replace)  # before anything, even the lock, is written into it
        options = joined_options(joined.typed_manifest.engine, options, joined.typed_manifest.engine_options.mesh)
    check_trace_memory(req.steps, req.checkpoint)  # the trace's memory, before anything loads
    # where the profile is written, checked before anything loads (one line, exit 2)
    check_writable(joined.path, flag="--run") if joined is not None else check_writable(req.runs_dir)
    opts = SimpleNamespace(**dataclasses.asdict(req), engine=EngineConfig.from_options(**options), capturing=False)

    def log_joined_end(run, status: str) -> None:  # a refused flag (before the capture) leaves the run as it was
        if status != "complete" and opts.capturing:
            run.log(f"profile {status}: profile.json not written; the run keeps its status ({run.status})")

    with signals_interrupt():
        if joined is None:
            return _profile(None, opts)
        # no other process writes the run meanwhile; it keeps its status however this ends
        with writing_run(lambda: lock_joined(joined, req.replace), joined=True, before_end=log_joined_end) as run:
            return _profile(run, opts)


def _check_request(req: ProfileRequest) -> None:
    """InputError (one line) for a value out of range or a combination of options that cannot be."""
    if req.steps < 1:
        raise InputError(f"--steps {req.steps}: expected a whole number of decode steps >= 1")
    if req.input_tokens < 1:
        raise InputError(f"--input-tokens {req.input_tokens}: expected a positive prompt size in tokens (BOS and chat "
                         "template included), e.g. --input-tokens 41")  # fmt: skip
    if req.batch < 1:
        raise InputError(f"--batch {req.batch}: expected a whole number of rows >= 1, e.g. --batch 16")
    if req.run_ref is not None and req.name is not None:
        raise InputError("--run and --name: a profile joins an existing run (--run) or starts one (--name), not both")
    if req.replace and req.run_ref is None:
        raise InputError("--replace overwrites the profile of a run named with --run; a new run has none to replace")


def joined_options(ran, options: Mapping[str, Any], mesh=None) -> dict[str, Any]:
    """The engine options of a profile joining a run whose manifest records the engine facts `ran`
    (`bench.runs.manifest.EngineConfig`) and the mesh `mesh` (a `model.placement.Mesh`, None: one device): each
    of the quantization (and its scale dtype), the w4 kernel, the weight dtype (where the run stored its weights
    in another dtype than it computed in), the backend and the mesh not given is the run's, so the profile measures the payload the run measured. Raises InputError for a
    quantization that differs from the run's (`refuse_other_quant`)."""
    out = dict(options)
    if out.get("quant") is None:  # profile the payload the run measured
        out["quant"], out["scale_dtype"] = ran.quantization or "none", out.get("scale_dtype") or ran.scale_dtype
    refuse_other_quant(ran, out["quant"], out.get("scale_dtype"))
    if out.get("kernel") is None:  # the run's w4 product, not this machine's default (its CPU kernel: its weight dtype)
        out["kernel"] = w4_kernel_of(ran.kernel)
    if out.get("weight_dtype") is None and ran.weight_dtype not in (None, ran.compute_dtype):  # e.g. bfloat16 on CPU
        out["weight_dtype"] = ran.weight_dtype
    if out.get("backend") is None:  # the engine the run measured (None in a run from before it was recorded)
        out["backend"] = ran.backend
    if out.get("mesh") is None and mesh is not None:  # the devices the run's parameters were placed over
        out["mesh"] = mesh.text
    return out


TRACE_BYTES_PER_LAYER_STEP = 78_756
"""Host memory (bytes) one traced decode step adds per decoder layer, for bounding `--steps` before anything loads
(`check_trace_memory`). Measured: `bench profile` on the default preset (35 layers, float32, XLA:CPU, this
project's 2-core host), peak resident memory (GNU time) 1,806,528 KiB at --steps 20 and 2,614,060 KiB at --steps
320: 2,691.8 KiB per step, / 35 layers. The tiny preset grew less (0.13 MiB per step over 6 layers), so the bound
is generous there; an 8,200-step profile of the default preset was killed for memory at 20.7 GB (issue 42)."""



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


def sweep_gauge(run, n_tokens: int, batch: int = 1):
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
    from bench.engines import checkpoint_positions
    from model.builtin import DEFAULT_PRESET, builtin_path
    from model.errors import EngineError
    from model.limits import prompt_limits
    from model.tokenizer import GemmaTokenizer

    spec = opts.checkpoint or f"builtin:{DEFAULT_PRESET}"
    if spec.startswith("random:"):
        from bench.engines import parse_random_flag
        from model.random_weights import random_folder

        folder = random_folder(parse_random_flag(spec))
    else:
        folder = builtin_path(spec.split(":", 1)[1]) if spec.startswith("builtin:") else Path(spec).expanduser()
    positions = checkpoint_positions(opts.checkpoint)
    if positions is None or not (folder / "tokenizer.json").is_file():
        return
    if opts.engine.max_length is not None and not 1 <= opts.engine.max_length <= positions:
        return
    try:
        limits = prompt_limits(positions, max_length=opts.engine.max_length)
    except EngineError:
        return
    try:
        tokenizer = GemmaTokenizer.from_dir(folder)
    except Exception:  # noqa: BLE001 - any unreadable tokenizer: the load after this reports it in its own terms
        return
    cell = sweep_gauge(joined, opts.input_tokens, opts.batch) if joined is not None else None
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


def refuse_to_overwrite(run, replace: bool) -> None:
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


def lock_joined(run, replace: bool):
    """Take `run`'s lock and check again, now that no other process can write it, that it may be added to."""
    run.lock()
    try:
        refuse_to_overwrite(run, replace)
    except BaseException:
        run.unlock()
        raise
    return run


def _stop_at_once(signum, _frame) -> None:
    from bench.signals import stop_now

    stop_now(f"bench profile: stopped by {signal.Signals(signum).name}; no profile written")


@contextlib.contextmanager
def signals_interrupt():
    """SIGTERM and Ctrl-C end `bench profile` at once (`bench.signals.stop_now`, exit 130): a trace cut short is
    worth nothing, so there is nothing to finish first, and raising KeyboardInterrupt from the handler is not
    safe: landing inside a garbage-collection callback (jax registers one) it is printed and discarded, and the
    profile would run on to "complete". The run ends as `bench.runs.writing_run` says for a hard stop: a run this
    command created is marked incomplete; a joined one keeps its status and is unlocked. A signal that arrives
    while a run's manifest or lock is being written is held until that write is done."""
    from bench.signals import stop_signals_handled

    with stop_signals_handled(_stop_at_once):
        yield




def check_trace_memory(steps: int, checkpoint: str | None) -> None:
    """Refuse `--steps` whose trace cannot fit the host's memory, before the model loads: `steps` x the
    checkpoint's decoder layers (its config alone, `bench.engines.checkpoint_config`) x
    `TRACE_BYTES_PER_LAYER_STEP`, against the host's available memory now
    (`bench.runs.environment.host_available_bytes`; the trace is held in host memory on every device, and the
    model's own memory comes on top of it). Raises InputError (one line: the arithmetic, the most steps that fit, the
    fix). Does nothing when the layers or the available memory cannot be read before loading (a Hugging Face repo
    id, no /proc/meminfo)."""
    from bench.engines import checkpoint_config
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




def _profile(joined, opts):
    """Load the engine, check the shape, then capture and analyse into `joined` (a locked run) or into a new run
    this creates (ended by `writing_run`). Returns (profile.json dict, the capture, profile.json's path)."""
    from bench.engines import MESH_KEY, engine_manifest, mesh_record, open_engine
    from bench.runs import create_run, free_label, writing_run
    from bench.sweep.command import sweep_workload

    flags_info = _set_gpu_flags()  # before anything initialises jax
    _check_shape_before_load(opts, joined)
    engine, report, ckpt, cache_dir = open_engine(opts.checkpoint, opts.engine, opts.compile_cache)
    cell = sweep_gauge(joined, opts.input_tokens, opts.batch) if joined is not None else None
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
    extra = {"decode_bytes": decode_bytes}
    if (per_device := mesh_record(engine, (opts.input_tokens,), max_new_tokens)) is not None:
        extra[MESH_KEY] = per_device  # a mesh: each device's bytes and collectives (one device: nothing new)
    manifest = engine_manifest("profile", engine, report, opts.checkpoint, cache_dir, workload, extra=extra)
    slug = manifest.slug or "unknown"

    def start():
        return create_run(opts.runs_dir, opts.name or free_label(opts.runs_dir, "profile", slug), slug, manifest)

    with writing_run(start) as run:  # complete, or incomplete (a signal), or failed (an error); never left running
        return _capture_into(run, setup, opts)


def _capture_into(run, setup, opts):
    """Trace, analyse, measure bandwidth (the copy, and the read-only probes whose fastest, or the device's
    datasheet figure where larger, is the roofline's ceiling: bench/runs/ceiling.py), write `run`/profile.json (the
    caller ends the run). Returns (profile.json dict, the capture, profile.json's path)."""
    from bench.profile.analysis import analyze_trace
    from model.backends import xla_options_line

    opts.capturing = True
    log, engine = logging.getLogger("bench"), setup.engine
    log.info(f"run folder: {run.path}")
    run.log(engine.policy.line())
    if (options_line := xla_options_line(engine.xla_options, engine.policy.platform)) is not None:
        run.log(options_line)
    mismatch = run_mismatches(run, setup)
    capture = _trace(run, setup, opts, log)
    analysis = analyze_trace(capture.xplane_path)
    data = _with_roofline(analysis, run, setup, opts, capture, mismatch, log)
    path = run.write_json("profile.json", data)
    for note in data["capture_notes"]:
        run.log(f"profile note: {note}")
    return data, capture, path


def _trace(run, setup, opts, log):
    """The capture (`bench.profile.capture.capture_steps`) of `opts.steps` decode steps after the prompt (or the
    batch cell's prompts) and `WARMUP_STEPS` warm-up steps, into `run`/profile/."""
    from bench.profile.capture import batch_decode_steps, capture_steps, prompt_decode_steps

    engine, max_new_tokens = setup.engine, setup.max_new_tokens
    if opts.batch == 1:
        state, step = prompt_decode_steps(engine, setup.prompt.ids, max_new_tokens)
    else:
        state, step = batch_decode_steps(engine, [p.ids for p in setup.prompt], max_new_tokens)
    rows = f" x {opts.batch} rows (the sweep's batch cell prompts)" if opts.batch > 1 else ""
    log.info(f"profiling {opts.steps} decode steps after a prompt of {opts.input_tokens} input tokens{rows} "
             f"(bucket {engine.bucket_for(opts.input_tokens)}) and {WARMUP_STEPS} warm-up steps")  # fmt: skip
    capture = capture_steps(step, state, opts.steps, run.path / "profile", warmup=WARMUP_STEPS,
                            python_tracer=opts.python_tracer,
                            restart_every=max_new_tokens - 1 - WARMUP_STEPS)  # fmt: skip
    del state
    run.log(f"captured {capture.n_steps} decode steps: {capture.xplane_path} ({capture.xplane_bytes} bytes)")
    return capture


def _with_roofline(analysis, run, setup, opts, capture, mismatch: list[str], log) -> dict:
    """profile.json's dict: the analysis with the bandwidth measured now (the copy and the read-only probes), the
    roofline attached against their ceiling, a share above 100% of it as a finding, the capture's notes (the
    roofline's rate, the capture's, how the joined run differs: `mismatch`, the finding), the config and the
    capture's facts."""
    from bench.profile.analysis import attach_roofline
    from bench.profile.bandwidth import measure_bandwidth, measure_read_probes
    from bench.runs.ceiling import CEILING_KEY, FINDINGS_KEY, finding_of, roofline_ceiling

    engine, max_new_tokens = setup.engine, setup.max_new_tokens
    log.info("measuring device bandwidth (device-to-device copy, then the read-only probes)")
    bw, reads = measure_bandwidth(), measure_read_probes()
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
    data["config"] = _profile_config(setup, opts, engine.bucket_for(opts.input_tokens), decode_bytes)
    data["capture"] = _capture_facts(capture, run.path, setup.flags_info)
    data["bandwidth"] = bw.to_json()
    data["read_bandwidth"] = read_bw.to_json()  # the fastest read probe
    data["read_probes"] = reads.to_json()
    data[CEILING_KEY] = ceiling.to_json()  # the roofline's denominator (bench/runs/ceiling.py)
    data["roofline"]["bandwidth_kind"] = f"ceiling: {ceiling.chosen} ({ceiling.definition})"
    if found is not None:
        data[FINDINGS_KEY] = [found.to_json()]
    return data


def refuse_other_quant(ran, quant: str, scale_dtype: str | None) -> None:
    """InputError (one line) when `--quant` / `--scale-dtype` would profile other weights than the joined run
    swept (`ran`: its manifest's engine config): its roofline would pair the run's gauge with other bytes per step."""
    from model.engine_config import EngineConfig
    from model.quantspec import parse_quant

    asked = EngineConfig.from_options(quant=quant, scale_dtype=scale_dtype)
    spec, scale = asked.quant_spec, asked.scales
    run_quant = parse_quant(ran.quantization or "none").canonical
    if spec.canonical != run_quant:
        raise InputError(f"--quant {quant}: the run was swept with quantization {run_quant}; drop --quant to profile "
                         "the run's weights, or profile into a new run (--name)")  # fmt: skip
    if spec.canonical != "none" and ran.scale_dtype not in (None, scale):
        raise InputError(f"--scale-dtype {scale}: the run was swept with {ran.scale_dtype} scales; drop "
                         "--scale-dtype, or profile into a new run (--name)")  # fmt: skip


def run_mismatches(run, setup) -> list[str]:
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
    cache; under a mesh the slowest device's: `bench.engines.step_read_bytes`; a model with experts: the joined
    cell's measured experts per layer, docs/method.md, "Bytes that follow the routing", else top_k), the gauge
    tok/s to use or None, the note saying which): a joined sweep cell's gauge (at B > 1 the per-sequence gauge:
    steps per second) at its own shape, else None (the profile's own rate is used)."""
    from bench.engines import step_read_bytes

    at = f"{input_tokens} input tokens" + (f" x {batch} rows" if batch > 1 else "")
    if cell is not None:
        decode_bytes = step_read_bytes(engine, input_tokens, cell.max_new_tokens or max_new_tokens, batch=batch,
                                       experts=cell.experts_per_layer_median)  # fmt: skip
        return decode_bytes, cell.gauge_tok_s_median, (
            f"roofline uses the run's sweep gauge at {at} ({cell.gauge_tok_s_median:.2f} tok/s"
            f"{' per sequence' if batch > 1 else ''}, bytes per step at its shape, max_new_tokens "
            f"{cell.max_new_tokens})")  # fmt: skip
    return step_read_bytes(engine, input_tokens, max_new_tokens, batch=batch), None, (
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
    and the bytes a step reads (under a mesh the slowest device's, and `mesh`, its text)."""
    from bench.engines import engine_mesh
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
        **({"mesh": mesh.text} if (mesh := engine_mesh(setup.engine)) is not None else {}),
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


