"""Resuming an in-process sweep: the options given against the run's, in one place (`resume_options`).

A resumed run is one payload and one workload: an option not given takes the run's value, and a given option that
differs from the run's is refused, every difference named in one line (exit 2), before anything loads. The engine
configuration is compared field by field against the one the run resolved (`bench.runs.Manifest.engine_options`:
stored whole, or read from the `engine_config` facts of a run written before it was), so `--quant
ple4,int8_lm_head` is the run's `int8_lm_head,ple4` and an explicit `--dtype float32` is a run that resolved
float32. After the engine has loaded, `check_same_build` compares the build ids (the code and the checkpoint too).
See docs/commands/sweep.md, "Resuming".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.errors import InputError, RunFolderError
from bench.sweep.local import parse_batches, parse_inputs, parse_order, recorded_order


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepFlags:
    """The in-process sweep's workload options as typed (None: not given): `inputs` ("41,521"), `max_new_tokens`,
    `repeats`, `min_duration` / `max_duration` (s), `decode_loop` ("host", "device", "both"), `decode_block`
    (steps), `batch` ("1,4,16"), `checkpoint` (the --checkpoint text), `compile_cache` (the --compile-cache
    text), `order` ("interleaved", "sequential": docs/method.md, "Interleaving") and `step_logits` (False:
    --no-step-logits; not compared on resume: a record, not the measurement)."""

    inputs: str | None = None
    max_new_tokens: int | None = None
    repeats: int | None = None
    min_duration: float | None = None
    max_duration: float | None = None
    decode_loop: str | None = None
    decode_block: int | None = None
    batch: str | None = None
    checkpoint: str | None = None
    compile_cache: str | None = None
    order: str | None = None
    step_logits: bool | None = None


def resume_options(run, flags: SweepFlags, engine) -> tuple[SweepFlags, object]:
    """(the workload options, the `model.engine_config.EngineConfig`) that continue `run` (an open RunFolder of an
    in-process sweep): each option not given takes the run's. Raises InputError naming every given option that
    differs from the run's in one line ("--quant w8 differs from the resumed run's int8_lm_head,ple4, --backend
    jax differs from the resumed run's cpu-kernels; drop the flags to continue RUN as it started"), and
    InputError when the run was measured on a local checkpoint folder (which it does not record) and no
    --checkpoint names it."""
    stored, stored_engine = stored_flags(run), run.typed_manifest.engine_options
    diffs = [f"{flag} {mine} differs from the resumed run's {theirs}" for flag, mine, theirs in
             workload_differences(flags, stored) + engine.differences(stored_engine)]  # fmt: skip
    if diffs:
        it = "the flag" if len(diffs) == 1 else "the flags"
        raise InputError(f"{', '.join(diffs)}; drop {it} to continue {run.path} as it started")
    if flags.checkpoint is None and stored.checkpoint is None:
        m = run.typed_manifest
        raise InputError(f"run {run.path} was measured on a local checkpoint folder ({m.checkpoint.id}), which it "
                         "does not record; pass --checkpoint FOLDER to resume it")  # fmt: skip
    merged = {f.name: getattr(stored, f.name) if getattr(flags, f.name) is None else getattr(flags, f.name)
              for f in dataclasses.fields(flags)}  # fmt: skip
    return SweepFlags(**merged), engine.or_else(stored_engine)


def stored_flags(run) -> SweepFlags:
    """The workload options `run` was started with, as flag values (its manifest's workload and notes; a run that
    records none of a later option: that option's meaning before it existed): the checkpoint is its source
    (builtin:NAME or a hub id; a schema-1 run's folder; None for a local folder); the compile cache its folder
    on this machine ('off' for none: `bench.runs.manifest.local_dir`)."""
    from bench.runs.manifest import local_dir
    from model.folders import cache_root

    m = run.typed_manifest
    notes = m.workload.notes or {}
    batches = notes.get("batches")
    return SweepFlags(inputs=",".join(map(str, m.workload.inputs or [])) or None,
                      max_new_tokens=m.workload.max_new_tokens, repeats=m.workload.repeats,
                      min_duration=notes.get("min_duration_s") or 0.0, max_duration=notes.get("max_duration_s"),
                      decode_loop=notes.get("decode_loop", "host"), decode_block=notes.get("decode_block"),
                      batch=",".join(map(str, batches)) if batches else None,
                      checkpoint=m.checkpoint.source or m.checkpoint.path,
                      compile_cache=local_dir(m.compile_cache.dir, cache_root()) or "off",
                      order=recorded_order(run))  # fmt: skip


def workload_differences(given: SweepFlags, stored: SweepFlags) -> list[tuple[str, str, str]]:
    """(flag, given, stored) of each workload option given that differs from the run's, as the flags are written
    (inputs compared as sizes, batches as their lists, the compile cache as its folder; a stored value that is
    unknown differs from nothing). The checkpoint is not compared here: the build id covers it."""
    out = []
    for flag, name in (("--inputs", "inputs"), ("--max-new-tokens", "max_new_tokens"), ("--repeats", "repeats")):
        value, was = getattr(given, name), getattr(stored, name)
        if value is None or was is None:
            continue
        if not (parse_inputs(value) == parse_inputs(was) if name == "inputs" else value == was):
            out.append((flag, str(value), str(was)))
    for flag, name in (("--min-duration", "min_duration"), ("--max-duration", "max_duration")):
        value, was = getattr(given, name), getattr(stored, name)
        if value is not None and value != was:
            out.append((flag, f"{value:g}", f"{was or 'none'}"))
    for flag, name in (("--decode-loop", "decode_loop"), ("--decode-block", "decode_block")):
        value, was = getattr(given, name), getattr(stored, name)
        if value is not None and value != was:
            out.append((flag, str(value), f"{was or 'none'}"))
    if given.batch is not None and parse_batches(given.batch) != (parse_batches(stored.batch) if stored.batch else ()):
        out.append(("--batch", given.batch, stored.batch or "none"))
    if given.order is not None and parse_order(given.order) != stored.order:  # a run keeps one order: its rounds
        out.append(("--order", given.order, stored.order))  # and probes mean nothing across a change
    if given.compile_cache is not None and _cache_text(given.compile_cache) != _cache_text(stored.compile_cache, False):
        out.append(("--compile-cache", given.compile_cache, stored.compile_cache))
    return out


def _cache_text(flag: str | None, given: bool = True) -> str:
    """A --compile-cache value as the folder it names, relative to the cache root where inside it ('off': none);
    a `given` one is resolved as the flag is (`bench.engines.compile_cache_dir`: a file is refused)."""
    from bench.engines import compile_cache_dir
    from bench.runs.manifest import portable_dir
    from model.folders import cache_root

    if not given:
        return "off" if flag in (None, "off") else portable_dir(flag, cache_root()) or "off"
    return portable_dir(compile_cache_dir(flag), cache_root()) or "off"


def open_resumed(resume: Path, target: str | None):
    """The run `--resume` names (a resolved folder), checked as a sweep the in-process sweep can continue; with
    `target`, None (the remote sweep opens it). Raises InputError for a run another command wrote or one that
    measured a server, RunFolderError for a complete run or a folder that is no run."""
    from bench.runs import open_run

    run = open_run(resume)  # raises RunFolderError naming the folder
    command = run.typed_manifest.command  # None: a schema-1 run, all of them sweeps
    if command is not None and not command.startswith("sweep"):
        raise InputError(f"--resume {resume}: this run was written by `bench {command}`, not by a sweep; --resume "
                         "continues sweeps only: run `bench sweep` without --resume for a new run")  # fmt: skip
    if target is not None:
        return None
    ran_against = (run.typed_manifest.workload.notes or {}).get("target")
    if ran_against:
        raise InputError(f"--resume {resume}: this run measured a server ({ran_against}), and without --target "
                         f"the sweep would measure the local engine into it; resume it with --target "
                         f"{ran_against} and the flags it was started with (--concurrency, --num-requests, ...)")  # fmt: skip
    if run.status == "complete":
        raise RunFolderError(f"run {resume} is already complete; start a new one with --name")
    return run


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
