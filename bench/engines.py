"""Opening the engine for a command: the checkpoint text resolved (`checkpoint_path`), the compile cache
(`compile_cache_dir`), prompt sizes checked against the model's limits before anything loads (`check_prompt_sizes`),
the engine loaded under its configuration (`open_engine`, a `model.engine_config.EngineConfig`) and the run manifest
of what was loaded (`engine_manifest`: the one builder, so every command's build id is the same for one payload).

Library code: it raises typed errors (`bench.errors.InputError`, the engine's `model.errors.ModelError`s) and logs
on the "bench" logger; `bench.cli` turns errors into one line and exit code 2. See docs/engine.md.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Sequence
from typing import Any
from pathlib import Path

from bench.errors import InputError


def checkpoint_path(spec: str | None) -> str:
    """Resolve `--checkpoint`: None -> the cached built-in default; builtin:NAME -> that preset (created on first
    use, bfloat16, seed 0); random:PRESET[@SEED] -> its dummy-weights folder of config and tokenizer
    (`model.random_weights.ensure_random`, created on first use; the weights are made on the device at load);
    anything else is passed on (a directory or a repo id). Raises InputError (one line, the presets listed) for
    an unknown preset or a bad seed."""
    from model.builtin import DEFAULT_PRESET, ensure_builtin

    log = logging.getLogger("bench")
    if spec is None:
        return str(ensure_builtin(DEFAULT_PRESET, log=log.info))
    if spec.startswith("random:"):
        from model.random_weights import ensure_random

        return str(ensure_random(parse_random_flag(spec), log=log.info))
    if spec.startswith("builtin:"):
        from model.config import PRESETS

        name = spec.split(":", 1)[1]
        if name not in PRESETS:
            raise InputError(f"--checkpoint {spec}: unknown built-in preset; expected builtin:{{{','.join(PRESETS)}}}")
        return str(ensure_builtin(name, log=log.info))
    return spec


def parse_random_flag(spec: str):
    """`--checkpoint random:PRESET[@SEED]` -> `model.random_spec.RandomSpec`; InputError (one line naming the
    flag, the text and the presets) for an unknown preset or a bad seed."""
    from model.errors import CheckpointError
    from model.random_spec import parse_random

    try:
        return parse_random(spec)
    except CheckpointError as exc:
        raise InputError(f"--checkpoint {exc}") from None


def compile_cache_dir(spec: str | None) -> Path | None:
    """`--compile-cache`: None -> <cache root>/xla; 'off' -> disabled; else that folder."""
    from model.folders import cache_root

    if spec is None:
        path = cache_root() / "xla"
    elif spec.lower() in ("off", "none", "0", "false"):
        return None
    else:
        path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"--compile-cache {path}: is a file; pass a folder (or 'off')")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--compile-cache {path}: cannot create the folder ({exc.strerror or exc}); pass another") from None
    return path


def checkpoint_config(spec: str | None):
    """The `model.config.ModelConfig` of the `--checkpoint` text, from its config alone: no weight is read and no
    built-in checkpoint is created. None (the default), builtin:NAME and random:NAME[@SEED] -> the preset's config;
    a local directory -> its config.json (ConfigError, one line, when that is malformed). None for anything else (a
    Hugging Face repo id: its config.json comes with its download, and the engine checks then; a path that does not
    exist, or an unknown preset: loading names it)."""
    from model.builtin import DEFAULT_PRESET
    from model.config import PRESETS, load_config

    if spec is None or spec.startswith(("builtin:", "random:")):
        return PRESETS.get(DEFAULT_PRESET if spec is None else spec.split(":", 1)[1].split("@", 1)[0])
    path = Path(spec).expanduser()
    return load_config(path) if (path / "config.json").is_file() else None


def checkpoint_positions(spec: str | None) -> int | None:
    """The model's positions (max_position_embeddings) of the `--checkpoint` text, from its config alone
    (`checkpoint_config`); None where that cannot be read before loading."""
    cfg = checkpoint_config(spec)
    return None if cfg is None else cfg.max_position_embeddings


def check_prompt_sizes(checkpoint: str | None, sizes: Sequence[int], max_new_tokens: int, config,
                       *, flag: str = "--inputs") -> None:  # fmt: skip
    """Every prompt size of `sizes` (tokens, the `flag` values) against the limits an engine of `--checkpoint`
    with the `model.engine_config.EngineConfig` `config` (its max length and buckets) will have
    (`model.limits.prompt_limits`, from config.json alone), before the weights load. Raises InputError, one line
    naming the flag, the value, the limit and the fix: --max-length above the model's positions, a ladder the
    model cannot take, a size no bucket holds or whose prompt + `max_new_tokens` exceed the model's positions.
    Does nothing more when the config cannot be read without loading (`checkpoint_positions`: the engine checks
    the same after the load)."""
    from model.errors import EngineError
    from model.limits import prompt_limits

    positions = checkpoint_positions(checkpoint)
    if positions is None:
        return
    if config.max_length is not None and config.max_length > positions:
        raise InputError(f"--max-length {config.max_length}: above the model's {positions} positions "
                         f"(max_position_embeddings); expected --max-length 1..{positions}")  # fmt: skip
    try:
        limits = prompt_limits(positions, max_length=config.max_length, buckets=config.buckets)
    except EngineError as exc:
        raise InputError(f"--buckets {config.flag_text('buckets')}: {exc}") from None
    for n in sizes:
        try:
            limits.check_request(n, max_new_tokens)
        except EngineError as exc:
            raise InputError(f"{flag} {n}: {exc}") from None


def check_backend_runs(config) -> None:
    """Whether the backend of `config` (a `model.engine_config.EngineConfig`) can run on this machine's device
    (`model.backends.check_runs`: EngineError, one line); nothing for the default. Starts jax's backend; loads no
    weights. `bench serve` calls it before its port opens."""
    from model.backends import check_runs
    from model.policy import device_facts

    if config.backend is not None:
        check_runs(config.backend, device_facts()[0])


def check_mesh_here(checkpoint: str | None, config) -> None:
    """The mesh of `config` (a `model.engine_config.EngineConfig`; nothing without one) against this machine and
    the model, before anything loads: MeshError (one line) when it needs more devices than jax sees here (what was
    given, how many devices there are, how to have more), and as `model.sharding.check_mesh` when it does not
    divide the model's heads, widths, vocabulary or experts (the model's config.json alone, `checkpoint_config`;
    a hub repo id is checked by the engine after its download, still before the weights load). Starts jax's
    backend."""
    mesh = config.mesh
    if mesh is None:
        return
    import jax

    from model.errors import MeshError
    from model.sharding import check_mesh

    devices = jax.devices()
    if len(devices) < mesh.size:
        platform = devices[0].platform
        fix = (f"set XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before the command (jax reads it "
               "when it starts) to make that many host devices" if platform == "cpu" else
               f"run on a machine with {mesh.size} {platform} devices, or pass a mesh of at most {len(devices)}")  # fmt: skip
        raise MeshError(f"--mesh {mesh.text}: needs {mesh.size} devices, and jax sees {len(devices)} {platform} "
                        f"device(s) here; {fix}")  # fmt: skip
    cfg = checkpoint_config(checkpoint)
    if cfg is not None:
        check_mesh(cfg, mesh)


def open_engine(checkpoint: str | None, config, compile_cache: str | None):
    """Decide and log the dtype policy (the first line), enable the compile cache, resolve and load the
    checkpoint under the engine configuration `config` (a `model.engine_config.EngineConfig`, checked when it was
    built: `EngineConfig.from_options`). Returns (engine, load report, checkpoint path, compile cache folder or
    None). Raises InputError for a bad checkpoint text or a --max-length above the model's positions, KernelError
    for a forced kernel this device cannot run, EngineError for a backend that cannot run here
    (`model.backends.plan_backend`: "cpu-kernels" off CPU or without a C++ compiler), and MeshError for a mesh
    this machine or the model cannot take (`check_mesh_here`), before anything loads."""
    from model.backends import check_runs
    from model.engine import enable_compile_cache, load_engine, log_policy_line
    from model.kernels.choice import with_kernel_mode
    from model.policy import decide_policy, with_backend

    if checkpoint is not None and checkpoint.startswith("random:"):
        parse_random_flag(checkpoint)  # an unknown preset is one line before anything is logged or loaded
    policy = decide_policy(config.compute_dtype, weight_dtype=config.weight_dtype)
    policy = with_backend(with_kernel_mode(policy, config.quant_spec, config.kernel), config.backend)
    log_policy_line(policy)  # the first line, before a built-in checkpoint is created or anything loads
    check_runs(policy.backend, policy.platform)  # can it run here: one line if not, before anything loads
    check_mesh_here(checkpoint, config)  # enough devices, a mesh the model divides: before a checkpoint is made
    cache = enable_compile_cache(compile_cache_dir(compile_cache))
    path = checkpoint_path(checkpoint)
    if config.max_length is not None:  # in the flag's terms, before the weights load (the engine's names a bucket)
        from model.checkpoint import resolve_checkpoint
        from model.config import load_config

        path = resolve_checkpoint(path)
        positions = load_config(path).max_position_embeddings
        if config.max_length > positions:
            raise InputError(f"--max-length {config.max_length}: above the model's {positions} positions "
                             f"(max_position_embeddings); expected --max-length 1..{positions}")  # fmt: skip
    engine, report = load_engine(path, policy=policy, max_length=config.max_length, buckets=config.buckets,
                                 log_policy=False, quant=config.quant_spec, scale_dtype=config.scales,
                                 kernel=config.kernel, mesh=config.mesh)  # fmt: skip
    return engine, report, Path(report["path"]), cache


def engine_manifest(command: str, engine, report: dict, checkpoint: str | None, cache_dir: Path | None, workload,
                    extra: dict | None = None):  # fmt: skip
    """The run manifest (`bench.runs.manifest.build_manifest`) of `command` on the engine `open_engine` loaded:
    `checkpoint` is the `--checkpoint` text (None: the built-in default), `report` the load report (its content
    hash was computed while loading), `cache_dir` the compile cache folder (written relative to the cache root),
    `workload` the command's `bench.runs.Workload`, `extra` more top-level keys. The engine configuration is
    recorded whole as the engine resolved it (`bench.runs.manifest.engine_options_of`, its mesh the one its
    parameters are placed on: `engine.layout.spec`, None on one device) and hashed into the build id. Same payload,
    same build id, from every command."""
    import jax

    from bench.runs.environment import device_facts
    from bench.runs.manifest import (
        CompileCacheFacts,
        build_manifest,
        checkpoint_facts,
        engine_config_of,
        engine_options_of,
        policy_facts,
        portable_dir,
    )
    from model.builtin import DEFAULT_PRESET
    from model.folders import cache_root

    spec, facts = checkpoint or f"builtin:{DEFAULT_PRESET}", engine_config_of(engine)
    return build_manifest(
        command, checkpoint=checkpoint_facts(spec, report, engine.weight_bytes), engine=facts,
        workload=workload, device=device_facts(jax), dtype_policy=policy_facts(engine.policy),
        compile_cache=CompileCacheFacts(dir=portable_dir(cache_dir, cache_root())), extra=extra,
        options=engine_options_of(facts, mesh=engine_mesh(engine)),
    )  # fmt: skip


def engine_mesh(engine):
    """The `model.placement.Mesh` a loaded engine's parameters are placed on (`engine.layout.spec`), None on one
    device (and for an engine without a layout)."""
    layout = getattr(engine, "layout", None)
    return None if layout is None else layout.spec


# ---- what each device of a mesh reads ---------------------------------------------------------------------------
_DEVICE_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per loaded engine: {(input tokens, max_new_tokens): its `model.sharding.DeviceStep`s} (each compiles a program)."""


def device_steps_of(engine, n_tokens: int, max_new_tokens: int) -> list | None:
    """`model.sharding.device_steps` of `engine` at the compiled shape of `n_tokens` prompt tokens and
    `max_new_tokens` new ones (one `DeviceStep` per device of its mesh: weight and KV bytes one row's step reads
    there, the collectives' bytes of the compiled decode program), computed once per engine and shape; None on one
    device (no mesh). Raises EngineError as `Engine.check_request`."""
    if engine_mesh(engine) is None:
        return None
    memo = _DEVICE_STEPS.setdefault(engine, {})
    if (n_tokens, max_new_tokens) not in memo:
        from model.sharding import device_steps

        memo[(n_tokens, max_new_tokens)] = device_steps(engine, n_tokens, max_new_tokens)
    return memo[(n_tokens, max_new_tokens)]


def step_read_bytes(engine, n_tokens: int, max_new_tokens: int, batch: int = 1, *,
                    experts: float | None = None) -> dict[str, int]:  # fmt: skip
    """Bytes one decode step of `batch` rows reads, the roofline's numerator (docs/method.md, "Rooflines"), as
    {"weights", "kv_cache", "total"}: on one device `Engine.decode_bytes` itself, with `experts` per layer where a
    measured run recorded them (a model with experts: docs/method.md, "Bytes that follow the routing"; None: the
    estimate, top_k); under a mesh the slowest device's (the most bytes of `device_steps_of`: its weights once
    plus `batch` rows of its KV cache shard; its experts the placement's estimate, `experts` not used), so
    the roofline is per device: that device's bytes over the measured bandwidth of one device (docs/method.md,
    "Several devices")."""
    steps = device_steps_of(engine, n_tokens, max_new_tokens)
    if steps is None:
        return engine.decode_bytes(n_tokens, max_new_tokens, batch=batch, experts=experts)
    slowest = max(steps, key=lambda s: s.weight_bytes + batch * s.kv_bytes)
    kv = batch * slowest.kv_bytes
    return {"weights": slowest.weight_bytes, "kv_cache": kv, "total": slowest.weight_bytes + kv}


MESH_KEY = "mesh"
"""The manifest's key (a run on a mesh only) of what each device of the mesh does (`mesh_record`)."""


def mesh_record(engine, sizes: Sequence[int], max_new_tokens: int) -> dict[str, Any] | None:
    """The manifest's `mesh` object of a run on `engine`'s mesh at the input sizes `sizes`, None on one device:
    `mesh` (its text, "tp=2"), `devices`, and per input size (`steps`, keyed by the size as text) one object per
    device: `device` (jax id), `weight_bytes` and `kv_bytes` one row's decode step reads there, `total`, and its
    collectives (`collective_bytes` {op: bytes}, `collectives` {op: count}, from the compiled decode program);
    `roofline_bytes` {size: the slowest device's total}, the bytes a one-row cell's roofline divides
    (`step_read_bytes`). A mesh over several jax processes (jax.distributed) adds `processes` (their count) and
    each device's `process` (the jax process that holds it): every process's devices are listed, whichever
    process writes the record (their bytes come from the shardings, `model.sharding.device_steps`)."""
    mesh = engine_mesh(engine)
    if mesh is None:
        return None
    steps = {str(n): device_steps_of(engine, n, max_new_tokens) for n in sizes}
    owner = _device_processes()
    record = {"mesh": mesh.text, "devices": mesh.size,
              "steps": {n: [{**dataclasses.asdict(s), "total": s.total,
                             **({"process": owner[s.device]} if owner else {})} for s in ss]
                        for n, ss in steps.items()},
              "roofline_bytes": {n: max(s.total for s in ss) for n, ss in steps.items()}}  # fmt: skip
    return {**record, "processes": len(set(owner.values()))} if owner else record


def _device_processes() -> dict[int, int]:
    """{jax device id: its process index} of every device when jax runs several processes (jax.distributed); {} in
    one process."""
    import jax

    if jax.process_count() == 1:
        return {}
    return {d.id: d.process_index for d in jax.devices()}


def mesh_lines(record: dict[str, Any]) -> list[str]:
    """One line per input size of a `mesh_record`: the mesh, the slowest device's bytes per step (the roofline's),
    the range over its devices, and the collectives each device's step runs (op x count, bytes)."""
    out = []
    for n, steps in record["steps"].items():
        totals = [s["total"] for s in steps]
        slowest = max(steps, key=lambda s: s["total"])
        ops = ", ".join(f"{op} x{slowest['collectives'][op]} ({b:,} B)" for op, b in slowest["collective_bytes"].items())
        out.append(f"mesh {record['mesh']} at {n} input tokens: each device reads {min(totals):,}..{max(totals):,} B "
                   f"per decode step of one row (the roofline's bytes: device {slowest['device']}'s "
                   f"{slowest['total']:,}); its collectives: {ops or 'none'}")  # fmt: skip
    return out


# ---- bench generate -------------------------------------------------------------------------------------------------
def check_generate(max_new_tokens: int, decode_loop: str, block: int | None, temperature: float, top_k: int,
                   top_p: float) -> None:  # fmt: skip
    """InputError (one line) for a `bench generate` option out of range, before anything loads."""
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    if decode_loop not in ("host", "device"):
        raise InputError(f"--decode-loop {decode_loop!r}: expected host or device (bench generate times one loop)")
    if block is not None and (block < 1 or decode_loop != "device"):
        raise InputError(f"--decode-block {block}: expected steps >= 1, with --decode-loop device")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise InputError("sampling: expected --temperature >= 0, --top-k >= 0 and 0 < --top-p <= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generated:
    """What `generate_once` did: the engine, the prompt's ids, the `model.engine.Generation`, the ids shown (up to
    the first EOS with the device loop, which generates all it was asked for) and their text."""

    engine: Any
    prompt_ids: list[int]
    generation: Any
    shown: list[int]
    text: str


def generate_once(checkpoint: str | None, config, compile_cache: str | None, prompt: str, *, raw: bool,
                  max_new_tokens: int, sampling, decode_loop: str, block: int | None) -> Generated:  # fmt: skip
    """Open the engine (`open_engine`, under the `model.engine_config.EngineConfig` `config`) and generate for one
    prompt: the chat turn around it, or with `raw` BOS + the prompt as given (special-token strings parsed);
    `sampling` a `model.engine.Sampling`; the host loop stops at EOS, the device loop (`block` steps per call)
    generates `max_new_tokens`. Raises InputError for a checkpoint without a tokenizer."""
    engine, _, path, _ = open_engine(checkpoint, config, compile_cache)
    tok = engine.tokenizer
    if tok is None:
        raise InputError(f"{path}: has no tokenizer.json; bench generate needs one to read --prompt")
    ids = [tok.bos_id] + tok.encode(prompt) if raw else tok.chat_ids(prompt)
    on_host = decode_loop == "host"
    gen = engine.generate(ids, max_new_tokens, sampling, stop_at_eos=on_host, decode_loop=decode_loop, block=block)
    shown = gen.token_ids if on_host else until_eos(gen.token_ids, set(engine.cfg.eos_token_ids))
    return Generated(engine=engine, prompt_ids=ids, generation=gen, shown=shown, text=tok.decode(shown))


def until_eos(token_ids: list[int], eos: set[int]) -> list[int]:
    """The ids up to and including the first EOS (all of them when none): what the host loop would have stopped at."""
    cut = next((i for i, t in enumerate(token_ids) if t in eos), None)
    return token_ids if cut is None else token_ids[: cut + 1]
