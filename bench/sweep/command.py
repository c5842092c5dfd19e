"""`bench sweep` as a library: its options checked and resolved into one `SweepPlan` (`plan_sweep`: every check
before anything loads, a resumed run's options taken through bench/sweep/resume.py), then measured in process
(`run_local`) or through an OpenAI-compatible server (`run_target`). bench/cli/sweep_cmds.py parses the flags and
prints the tables; nothing here prints. See docs/commands/sweep.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.errors import InputError
from bench.sweep.local import (
    DECODE_LOOP_CHOICES,
    DEFAULT_ORDER,
    StopSignals,
    SweepConfig,
    parse_batches,
    parse_decode_loop,
    parse_inputs,
    parse_order,
    resumed_order,
)
from bench.sweep.rates import RATES_KEY
from bench.sweep.resume import SweepFlags, check_same_build, open_resumed, resume_options

DEFAULT_INPUTS, DEFAULT_MAX_NEW_TOKENS, DEFAULT_REPEATS = "41,521,2057,3593", 64, 3
"""The sweep's workload when its flags are not given (`--inputs`, `--max-new-tokens`, `--repeats`)."""
DEFAULT_DECODE_LOOP = "both"
"""The in-process sweep's default `--decode-loop`: each cell timed with the host loop (per-step times) and the
device loop, so every run reports the host overhead per step (docs/commands/sweep.md). `--target` measures the
server's own loop: host only."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetFlags:
    """The options of a sweep through a server, as typed (None: not given): `target` (the base URL), `model`,
    `api_key`, and the load options `concurrency` ("1,4,16"), `request_rate` (req/s), `num_requests`, `seed`."""

    target: str | None = None
    model: str | None = None
    api_key: str | None = None
    concurrency: str | None = None
    request_rate: float | None = None
    num_requests: int | None = None
    seed: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """A sweep resolved and checked: `config` (a `bench.sweep.local.SweepConfig`, or a `bench.sweep.load.LoadConfig`
    with `load`), `engine` (the `model.engine_config.EngineConfig`; None through a server), `flags` (the workload
    options, a resumed run's taken), `remote` (the server's options; its `target` None in process), the run folder:
    `name`, `runs_dir`, `resume` (the resolved folder) and `resumed` (the open run, in process)."""

    config: Any
    engine: Any
    flags: SweepFlags
    remote: TargetFlags
    name: str | None
    runs_dir: Path
    resume: Path | None = None
    resumed: Any = None
    load: bool = False


def plan_sweep(flags: SweepFlags, engine_options: Mapping[str, Any], remote: TargetFlags, *, name: str | None,
               runs_dir: Path, resume: str | None) -> SweepPlan:  # fmt: skip
    """The `SweepPlan` of the sweep's options: `engine_options` are `model.engine_config.EngineConfig.from_options`'
    keywords as typed (None: not given). Raises InputError (one line) for a bad value or combination, a resumed
    run's option given otherwise (`resume_options`), or a run folder that cannot be written; RunFolderError for a
    run that cannot be resumed; OptionError / QuantError for a bad engine option; all before anything loads."""
    from bench.runs import check_writable, resolve_run

    _check_remote(flags, remote)
    _check_name(name)
    if flags.order is not None:
        parse_order(flags.order)  # bad values: one line before anything loads
    folder = resolve_run(resume, runs_dir, flag="--resume") if resume is not None else None
    resumed = open_resumed(folder, remote.target) if folder is not None else None
    # where the run is written, checked before anything loads (one line, exit 2)
    check_writable(folder or runs_dir, flag="--resume" if folder is not None else "--runs-dir")
    if remote.target is not None:
        _check_target_engine(engine_options, flags.compile_cache)
        return _target_plan(flags, remote, name=name, runs_dir=runs_dir, resume=folder)
    from model.engine_config import EngineConfig

    engine = EngineConfig.from_options(**engine_options)  # bad values: one line, before anything loads
    if resumed is not None:
        flags, engine = resume_options(resumed, flags, engine)
    return SweepPlan(config=_sweep_config(flags, DEFAULT_DECODE_LOOP, DEFAULT_ORDER), engine=engine, flags=flags, remote=remote,
                     name=name, runs_dir=runs_dir, resume=folder, resumed=resumed)  # fmt: skip


def _check_remote(flags: SweepFlags, remote: TargetFlags) -> None:
    """InputError for an option of a sweep through a server given without --target (or the reverse)."""
    if remote.model is not None and remote.target is None:
        raise InputError("--model names a model on a server: it needs --target http://HOST:PORT/v1")
    if flags.batch is not None and remote.target is not None:
        raise InputError(f"--batch {flags.batch}: batches are decoded by the in-process engine; a server batches its "
                         "own requests, which a client cannot set: drop --batch (or --target)")  # fmt: skip
    if flags.batch is not None:
        parse_batches(flags.batch)  # bad values: one line before anything loads
    load_flags = {"--request-rate": remote.request_rate, "--num-requests": remote.num_requests, "--seed": remote.seed}
    if remote.concurrency is None and any(v is not None for v in load_flags.values()):
        flag = next(f for f, v in load_flags.items() if v is not None)
        raise InputError(f"{flag} sets a sweep under load: it needs --target URL --concurrency LEVELS (e.g. 1,4,16)")
    if remote.concurrency is not None and remote.target is None:
        raise InputError(f"--concurrency {remote.concurrency} measures a server under load: it needs --target "
                         "http://HOST:PORT/v1 (start one with `bench serve`)")  # fmt: skip
    if remote.concurrency is not None:
        for flag, value in (("--repeats", flags.repeats), ("--min-duration", flags.min_duration),
                            ("--max-duration", flags.max_duration)):  # fmt: skip
            if value is not None:
                raise InputError(f"{flag} {value:g} belongs to the one-at-a-time sweep; under load each level "
                                 "sends --num-requests requests: drop it (or drop --concurrency)")  # fmt: skip


def _check_name(name: str | None) -> None:
    """InputError for a `--name` that is empty or cannot name a run folder."""
    if name is not None and not name.strip():
        raise InputError(f"--name {name!r}: an empty run label; pass one such as --name my-test, or drop --name for "
                         "the default 'sweep'")  # fmt: skip
    if name is not None:  # a label that cannot name a folder is refused before anything loads
        from bench.runs import run_name

        run_name(name, "device")


_TARGET_REFUSED = (
    ("backend", "--backend", "runs the engine it was started with"),
    ("kernel", "--kernel", "multiplies its weights as it was started"),
    ("mesh", "--mesh", "runs on the devices it was started on"),
    ("weight_dtype", "--weight-dtype", "stores its weights as it was started"),
)
"""Engine options a `--target` sweep refuses: (option key, flag, what the server keeps from its own start)."""


def _check_target_engine(options: Mapping[str, Any], compile_cache: str | None) -> None:
    """InputError for an engine option (or --compile-cache) given with --target: the server runs the engine it was
    started with."""
    for key, flag, what in _TARGET_REFUSED:
        if options.get(key) is not None:
            raise InputError(f"{flag} {options[key]}: with --target the server {what}; drop the flag (start the "
                             f"server with `bench serve {flag} ...`)")  # fmt: skip
    quant, scale = options.get("quant"), options.get("scale_dtype")
    if quant is not None or scale is not None:
        raise InputError(f"--quant {quant or ''}{' --scale-dtype ' + scale if scale else ''}: with "
                         "--target the server's weights are measured as it placed them, which a client cannot "
                         "quantize; drop the flag (start the server with `bench serve --quant ...`)")  # fmt: skip
    if compile_cache is not None or any(options.get(k) is not None for k in ("dtype", "max_length", "buckets")):
        raise InputError("--dtype, --max-length, --compile-cache and --buckets configure the in-process engine; "
                         "with --target the server decides them (pass them to `bench serve`)")  # fmt: skip


def _target_plan(flags: SweepFlags, remote: TargetFlags, *, name: str | None, runs_dir: Path,
                 resume: Path | None) -> SweepPlan:  # fmt: skip
    """The plan of a sweep through a server: a resumed one at the run's own sizes by default; under load
    (--concurrency) a LoadConfig. InputError for a decode loop given."""
    from bench.runs import open_run

    if resume is not None:  # a run keeps its order; another is refused (one line), as `resume_options` does
        flags = dataclasses.replace(flags, order=resumed_order(open_run(resume), flags.order))
    if resume is not None and (flags.inputs is None or flags.max_new_tokens is None):
        ran = open_run(resume).typed_manifest.workload  # a server's run resumes at its own sizes by default
        flags = dataclasses.replace(
            flags, inputs=flags.inputs if flags.inputs is not None else ",".join(map(str, ran.inputs or ())) or None,
            max_new_tokens=flags.max_new_tokens if flags.max_new_tokens is not None else ran.max_new_tokens)  # fmt: skip
    config = _sweep_config(flags, "host", "sequential")
    if remote.concurrency is None:
        return SweepPlan(config=config, engine=None, flags=flags, remote=remote, name=name, runs_dir=runs_dir,
                         resume=resume)  # fmt: skip
    from bench.sweep.load import LoadConfig, default_num_requests, parse_concurrency

    levels = parse_concurrency(remote.concurrency)
    load = LoadConfig(inputs=config.inputs, max_new_tokens=config.max_new_tokens, concurrency=levels,
                      num_requests=default_num_requests(levels) if remote.num_requests is None else remote.num_requests,
                      request_rate=remote.request_rate, seed=0 if remote.seed is None else remote.seed)  # fmt: skip
    load.check()
    return SweepPlan(config=load, engine=None, flags=flags, remote=remote, name=name, runs_dir=runs_dir, resume=resume,
                     load=True)  # fmt: skip


def _sweep_config(flags: SweepFlags, default_loop: str, default_order: str) -> SweepConfig:
    """The checked SweepConfig of the workload options (the defaults where not given; `default_loop`: the decode
    loop without --decode-loop, `default_order` the order without --order: sequential through a server). InputError for a value out of range, or a decode loop chosen through a server."""
    loops = parse_decode_loop(flags.decode_loop) if flags.decode_loop is not None else None  # bad values: one line
    if default_loop == "host" and (loops not in (None, ("host",)) or flags.decode_block is not None):
        raise InputError(f"--decode-loop {flags.decode_loop or 'host'}{' --decode-block' if flags.decode_block else ''}: "
                         "with --target the server runs its own decode loop, which a client cannot choose; drop the "
                         "flag (the remote sweep times the host-synced stream)")  # fmt: skip
    config = SweepConfig(
        inputs=parse_inputs(DEFAULT_INPUTS if flags.inputs is None else flags.inputs),
        max_new_tokens=DEFAULT_MAX_NEW_TOKENS if flags.max_new_tokens is None else flags.max_new_tokens,
        repeats=DEFAULT_REPEATS if flags.repeats is None else flags.repeats, min_duration_s=flags.min_duration or 0.0,
        max_duration_s=flags.max_duration, block=flags.decode_block,
        batches=parse_batches(flags.batch) if flags.batch is not None else (),
        decode_loops=loops or DECODE_LOOP_CHOICES[default_loop],
        order=parse_order(flags.order) if flags.order is not None else default_order,
        step_logits=flags.step_logits is not False)  # fmt: skip
    config.check()
    return config


# ---- the workload a sweep records -------------------------------------------------------------------------------
def sweep_workload(config, **notes):
    """The `bench.runs.Workload` of a sweep config (inputs, max_new_tokens, repeats; greedy, EOS ignored)."""
    from bench.runs.manifest import Workload

    return Workload(inputs=tuple(config.inputs), max_new_tokens=config.max_new_tokens, repeats=config.repeats,
                    sampling="greedy", eos="ignored while benchmarking", notes=notes)  # fmt: skip


def duration_notes(config) -> dict:
    """The workload notes of a sweep's durations (`SweepConfig.min_duration_s`, `max_duration_s`), only those set,
    so that a sweep without them records what it always did."""
    notes = {"min_duration_s": config.min_duration_s or None, "max_duration_s": config.max_duration_s}
    return {k: v for k, v in notes.items() if v is not None}


def loop_notes(config) -> dict:
    """The workload notes of the decode loops a sweep times (`SweepConfig.decode_loops`, `block`)."""
    name = next(k for k, v in DECODE_LOOP_CHOICES.items() if v == config.decode_loops)
    return {"decode_loop": name, **({"decode_block": config.block} if config.block is not None else {})}


def batch_notes(config) -> dict:
    """The workload note of a `--batch` sweep (`SweepConfig.batches`): {"batches": [B, ...]}; {} without --batch,
    so that a sweep without it records what it always did."""
    return {"batches": list(config.batches)} if config.batches else {}


# ---- measuring ----------------------------------------------------------------------------------------------------
def run_target(plan: SweepPlan):
    """`bench sweep --target`: the same sweep through an OpenAI-compatible server (bench/sweep/remote.py); under
    load, its levels (bench/sweep/load.py). Returns the run folder."""
    from bench.engines import checkpoint_path
    from bench.sweep.remote import sweep_target

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP request otherwise
    log = logging.getLogger("bench")
    ckpt = plan.flags.checkpoint
    return sweep_target(plan.remote.target, plan.remote.model, plan.config,
                        checkpoint=checkpoint_path(ckpt) if ckpt else None, runs_dir=plan.runs_dir, name=plan.name,
                        resume=plan.resume, progress=log.info, stop=StopSignals(log.info), api_key=plan.remote.api_key,
                        load=plan.load)  # fmt: skip


def run_local(plan: SweepPlan):
    """`bench sweep` in process: check every size against the model's limits (`check_prompt_sizes`: config.json
    alone), load the engine, check every prompt and batch, build the manifest (and, resuming, check it is the
    run's build), then measure into a new or the resumed run folder. Returns the run folder (ended: complete,
    incomplete after a stop signal, or failed)."""
    from bench.engines import (
        MESH_KEY,
        check_mesh_here,
        check_prompt_sizes,
        engine_manifest,
        mesh_lines,
        mesh_record,
        open_engine,
    )
    from bench.runs import now_iso
    from bench.sweep.local import build_batch_prompts, build_prompts, check_batches
    from model.engine import CompileCounter

    log, config, resumed = logging.getLogger("bench"), plan.config, plan.resumed
    check_mesh_here(plan.flags.checkpoint, plan.engine)  # devices and model against --mesh: one line, before all
    # every size against the limits config.json sets, before a built-in checkpoint is created or a weight loads
    check_prompt_sizes(plan.flags.checkpoint, config.inputs, config.max_new_tokens, plan.engine)
    _check_fits(plan)  # weights + the largest cell's KV cache against the device: one line, before anything loads
    policy_at = now_iso()  # run.log stamps the policy and kernel lines with when they were decided, not written
    engine, report, _ckpt, cache_dir = open_engine(plan.flags.checkpoint, plan.engine, plan.flags.compile_cache)
    prompts = build_prompts(engine, config)  # every size checked before a folder is created or anything measured
    check_batches(engine, config)  # every batch must fit in memory: one line, exit 2, before anything is timed
    batch_prompts = build_batch_prompts(engine, config) if any(b > 1 for b in config.batches) else None
    counts0 = CompileCounter.snapshot()
    decode_bytes = {str(n): engine.decode_bytes(n, config.max_new_tokens) for n in config.inputs}
    # derived from the configuration, so outside it (and outside the build id): bytes a decode step reads
    rates, rates_new = _sweep_rates(engine, resumed, log)
    rates_at = now_iso()
    workload = sweep_workload(config, **duration_notes(config), **loop_notes(config), **batch_notes(config))
    extra = {"decode_bytes": decode_bytes, RATES_KEY: dict(rates.measured)}
    if (per_device := mesh_record(engine, config.inputs, config.max_new_tokens)) is not None:
        extra[MESH_KEY] = per_device  # a mesh: each device's bytes and collectives (one device: nothing new)
        for line in mesh_lines(per_device):
            log.info(line)
    manifest = engine_manifest("sweep", engine, report, plan.flags.checkpoint, cache_dir, workload, extra=extra)
    if resumed is not None:
        check_same_build(resumed, manifest)
    measured = _Measured(engine=engine, manifest=manifest, prompts=prompts, batch_prompts=batch_prompts, rates=rates,
                         rates_new=rates_new, counts0=counts0, policy_at=policy_at, rates_at=rates_at)  # fmt: skip
    return _measure(plan, measured, log)


def _check_fits(plan: SweepPlan) -> None:
    """`bench.sweep.fit.check_sweep_fits` of the plan's cells under its engine configuration (EngineError, one line
    with the arithmetic and the fixes, when the largest cell does not fit the device)."""
    from bench.engines import checkpoint_config
    from bench.sweep.fit import check_sweep_fits

    e = plan.engine
    check_sweep_fits(checkpoint_config(plan.flags.checkpoint), plan.config.cells, plan.config.max_new_tokens,
                     dtype=e.compute_dtype, weight_dtype=e.weight_dtype, quant=e.flag_text("quant"),
                     scale_dtype=e.scale_dtype, max_length=e.max_length, buckets=e.buckets, mesh=e.mesh,
                     kernel=e.kernel)  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Measured:
    """What `run_local` prepared before the run folder exists: the engine and its manifest, the prompts, the
    rates, the compile counts before measuring and when the policy and rates lines were decided."""

    engine: Any
    manifest: Any
    prompts: Any
    batch_prompts: Any
    rates: Any
    rates_new: bool
    counts0: dict
    policy_at: str
    rates_at: str


def _measure(plan: SweepPlan, m: _Measured, log):
    """Measure every cell into a new or the resumed run folder; returns it, ended."""
    from bench.runs import writing_run
    from bench.sweep.local import run_sweep
    from model.backends import xla_options_line

    t0, engine, config, resumed = time.perf_counter(), m.engine, plan.config, plan.resumed

    def after_end(run, status: str) -> None:
        log.info(f"sweep {status} in {time.perf_counter() - t0:.1f} s; run folder {run.path}")

    # SIGTERM / Ctrl-C: stop after the current request, run kept incomplete. The signals are in force from before
    # the run is created (or resumed) to after it ended, and `writing_run` ends it however the sweep ends: the run
    # is never left "running" (the same structure as `bench sweep --target`, bench/sweep/remote.py).
    with (
        StopSignals(log.info) as stop,
        writing_run(_run_starter(resumed, plan.runs_dir, plan.name, m.manifest), after_end=after_end,
                    before_end=_compile_cache_counter(m.counts0, m.manifest.compile_cache.dir)) as run,
    ):  # fmt: skip
        log.info(f"run folder: {run.path}")
        run.log(engine.policy.line(), at=m.policy_at)
        run.log(f"engine kernels: {m.manifest.engine.kernel or 'none (XLA products throughout)'}", at=m.policy_at)
        if (options_line := xla_options_line(engine.xla_options, engine.policy.platform)) is not None:
            run.log(options_line, at=m.policy_at)
        run.log(m.rates.line, at=m.rates_at)
        if resumed is not None and m.rates_new:  # a run begun before sweeps measured rates: record this process's
            run.update_manifest(**{RATES_KEY: dict(m.rates.measured)})
        run_sweep(engine, config, run, progress=lambda line: (log.info(line), run.log(line)),
                  skip=run.finished_cells() if config.batches else run.finished_inputs(), should_stop=stop,
                  prompts=m.prompts, rates=m.rates, batch_prompts=m.batch_prompts)  # fmt: skip
        _record_findings(run, m.rates)
        _record_device_memory(run, engine, log)
        if not stop() and config.order == "sequential":  # interleaved: the probes after each round (run_sweep)
            _end_bandwidth(run, m.rates, log)
    return run


def _record_findings(run, rates) -> None:
    """The run's roofline findings (a share above 100% of its ceiling, `bench.runs.columns.roofline_findings`),
    recorded under the manifest's `RATES_KEY` as `bench.runs.ceiling.FINDINGS_KEY` (a list, [] when none) with the
    probe's numbers; the sweep table's lines print them."""
    from bench.runs.ceiling import FINDINGS_KEY
    from bench.runs.columns import roofline_findings

    found = [f.to_json() for f in roofline_findings(run.cells(), rates.ceiling)]
    recorded = run.manifest.get(RATES_KEY) or dict(rates.measured)
    run.update_manifest(**{RATES_KEY: {**recorded, FINDINGS_KEY: found}})


def _record_device_memory(run, engine, log) -> None:
    """The device's allocator figures at the sweep's end (`bench.runs.environment.device_memory`: limit, peak and
    in use, bytes) beside the engine's weight bytes as placed, recorded as the manifest's `device_memory`, with a
    line: what the peak held beyond the weights (KV caches, programs, transients) is what the fit check's stated
    reserve (`model.accounting.MEMORY_RESERVE`) must cover. Nothing where the device reports none (a CPU). Over
    several devices, the weights are the fullest device's share (`_fullest_device_weights`), as the figures are."""
    import jax

    from bench.runs.environment import device_memory

    mem = device_memory(jax)
    if mem is None:
        return
    weights = int(engine.weight_bytes) if len(jax.local_devices()) == 1 else _fullest_device_weights(engine.params)
    run.update_manifest(device_memory={**mem, "weight_bytes": weights})
    peak, limit = mem.get("peak_bytes_in_use"), mem.get("bytes_limit")
    if peak is not None:
        line = (f"device memory: peak {peak / 1e9:.3f} GB in use ({(peak - weights) / 1e9:.3f} GB beyond the weights' "
                f"{weights / 1e9:.3f} GB)" + (f" of the allocator's {limit / 1e9:.3f} GB limit" if limit else ""))
        log.info(line)
        run.log(line)


def _fullest_device_weights(params) -> int:
    """The bytes of `params` held by the device that holds the most: each leaf's addressable shards summed per
    device (their buffers' `nbytes`: packed values as stored)."""
    import jax

    per: dict[object, int] = {}
    for leaf in jax.tree_util.tree_leaves(params):
        for shard in getattr(leaf, "addressable_shards", ()):
            per[shard.device] = per.get(shard.device, 0) + int(shard.data.nbytes)
    return max(per.values(), default=0)


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
