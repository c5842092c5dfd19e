"""Options and set-up shared by the commands that load an engine (generate, sweep, profile, serve), and the one
console every command prints its tables with (`make_console`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import typer

from bench.errors import InputError

CHECKPOINT_HELP = (
    "Checkpoint: a local Hugging Face directory, a hub repo id (owner/name), builtin:PRESET "
    "(tiny, default, e2b, e4b, tiny-31b, tiny-moe, 31b, 26b-a4b), or random:PRESET / random:PRESET@SEED (dummy "
    "weights made on the device, no checkpoint file). "
    "Default: the built-in 'default' checkpoint, created on first use."
)
DTYPE_HELP = "Override the compute dtype (float32, bfloat16, float16); default: chosen from the live device."
CACHE_HELP = "Persistent XLA compilation cache folder, or 'off'. Default: a folder under the user's cache dir."

API_KEY_ENV = "GEMMA4_BENCH_API_KEY"
"""The environment variable `bench serve` reads its API key from, and `bench sweep --target` sends it from."""


CONSOLE_MIN_WIDTH, CONSOLE_PIPE_WIDTH = 150, 200


def make_console():
    """The rich console of every command's tables: in a terminal its width, but at least 150 columns (the sweep
    tables fold their cells where that is still too narrow); 200 columns when stdout is not a terminal (pipes,
    logs, tests; the sweep widens it to the whole table there)."""
    from rich.console import Console

    probe = Console()
    return Console(width=max(probe.width, CONSOLE_MIN_WIDTH) if probe.is_terminal else CONSOLE_PIPE_WIDTH)


def setup_logging(verbose: bool = False) -> None:
    """Log lines (the engine's policy line first) go to stderr, plain, at INFO."""
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if verbose else logging.INFO, format="%(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)  # backend-probing chatter would precede the policy line


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
    from model.builtin import cache_root

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


def parse_buckets(text: str | None) -> tuple[int, ...] | None:
    """`--buckets 64,128,1024` -> (64, 128, 1024); None -> the engine's default ladder. Raises InputError for a
    non-numeric or non-positive rung, and for rungs out of order or repeated (naming the ladder that was meant:
    a silently reordered ladder would hide a typo)."""
    if text is None:
        return None
    try:
        rungs = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise InputError(f"--buckets {text}: expected comma-separated whole numbers of tokens, e.g. 64,512,4096") from None
    if not rungs or min(rungs) < 1:
        raise InputError(f"--buckets {text}: expected positive token counts, e.g. 64,512,4096")
    ladder = sorted(set(rungs))
    if rungs != ladder:
        what = "repeats a rung" if len(set(rungs)) < len(rungs) else "is not in increasing order"
        raise InputError(f"--buckets {text}: {what}; expected increasing, distinct rungs, e.g. "
                         f"--buckets {','.join(map(str, ladder))}")  # fmt: skip
    return tuple(rungs)


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


def check_max_length(max_length: int | None) -> None:
    """InputError (one line) for a `--max-length` below 1 token; None (the default) passes."""
    if max_length is not None and max_length < 1:
        raise InputError(f"--max-length {max_length}: must be a positive number of tokens, at most the model's "
                         "positions (max_position_embeddings)")  # fmt: skip


def check_prompt_sizes(checkpoint: str | None, sizes: Sequence[int], max_new_tokens: int, max_length: int | None,
                       buckets: str | None, *, flag: str = "--inputs") -> None:  # fmt: skip
    """Every prompt size of `sizes` (tokens, the `flag` values) against the limits an engine of `--checkpoint`
    with `--max-length` / `--buckets` (`buckets`: the flag's text) will have (`model.limits.prompt_limits`, from
    config.json alone), before the weights load. Raises InputError, one line naming the flag, the value, the limit
    and the fix: --max-length below 1 or above the model's positions, a ladder the model cannot take, a size no
    bucket holds or whose prompt + `max_new_tokens` exceed the model's positions. Does nothing more when the config
    cannot be read without loading (`checkpoint_positions`: the engine checks the same after the load)."""
    from model.errors import EngineError
    from model.limits import prompt_limits

    check_max_length(max_length)  # a ladder topped by -5 would blame --inputs instead
    positions = checkpoint_positions(checkpoint)
    if positions is None:
        return
    if max_length is not None and max_length > positions:
        raise InputError(f"--max-length {max_length}: above the model's {positions} positions "
                         f"(max_position_embeddings); expected --max-length 1..{positions}")  # fmt: skip
    try:
        limits = prompt_limits(positions, max_length=max_length, buckets=parse_buckets(buckets))
    except EngineError as exc:
        raise InputError(f"--buckets {buckets}: {exc}") from None
    for n in sizes:
        try:
            limits.check_request(n, max_new_tokens)
        except EngineError as exc:
            raise InputError(f"{flag} {n}: {exc}") from None


SCALE_DTYPES = ("bfloat16", "float16", "float32")
"""The dtypes `--scale-dtype` accepts for quantization scales (16-bit by default: the published layout)."""
DEFAULT_SCALE_DTYPE = "bfloat16"


def parse_quant_flags(quant: str | None, scale_dtype: str | None = None):
    """`--quant` and `--scale-dtype` -> (model.quantspec.QuantSpec, scale dtype name). Raises QuantError (one line,
    from `model.quantspec.parse_quant`) for a bad option set and InputError for a scale dtype not in
    `SCALE_DTYPES`; None -> no quantization, bfloat16 scales."""
    from model.quantspec import parse_quant

    spec = parse_quant(quant)
    scale = DEFAULT_SCALE_DTYPE if scale_dtype is None else scale_dtype
    if scale not in SCALE_DTYPES:
        raise InputError(f"--scale-dtype {scale_dtype}: unknown dtype; expected one of {', '.join(SCALE_DTYPES)}")
    return spec, scale


def parse_kernel_flag(kernel: str | None, quant: str | None = None) -> str | None:
    """`--kernel` text -> "pallas", "xla" or None (not given). Raises InputError (one line) for another value, and
    for a kernel with a `--quant` set that has no w4 (the kernel multiplies w4 weights)."""
    from model.kernels.fit import parse_kernel
    from model.quantspec import parse_quant

    try:
        impl = parse_kernel(kernel)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if impl is not None and parse_quant(quant).layer_bits != 4:
        raise InputError(f"--kernel {kernel}: chooses how w4 weights are multiplied, and --quant "
                         f"{parse_quant(quant).canonical} has none; add w4 to --quant or drop --kernel")  # fmt: skip
    return impl


def parse_backend_flag(backend: str | None) -> str | None:
    """`--backend` text -> a backend name (`model.backends.BACKENDS`), None when not given (the default, pure JAX).
    Raises InputError (one line) for another value. Whether it can run here is checked when the engine is opened
    (`open_engine`, before the weights load)."""
    from model.backends import BACKENDS, DEFAULT_BACKEND

    if backend is None:
        return None
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend}: expected one of {', '.join(BACKENDS)} (default {DEFAULT_BACKEND}, "
                         "the pure-JAX engine)")  # fmt: skip
    return backend


def check_backend_flag(backend: str | None) -> None:
    """`parse_backend_flag`, then whether that backend can run on this machine's device (`model.backends.check_runs`:
    EngineError, one line). Starts jax's backend; loads no weights. `bench serve` calls it before its port opens."""
    from model.backends import check_runs
    from model.policy import device_facts

    name = parse_backend_flag(backend)
    if name is not None:
        check_runs(name, device_facts()[0])


def check_dtype_flags(dtype: str | None, weight_dtype: str | None = None) -> None:
    """InputError (one line) for a `--dtype` or `--weight-dtype` that names no dtype of `model.policy.DTYPES`;
    None (the flag not given) passes."""
    from model.policy import DTYPES

    for flag, name in (("--dtype", dtype), ("--weight-dtype", weight_dtype)):
        if name is not None and name not in DTYPES:
            raise InputError(f"{flag} {name}: unknown dtype; expected one of {', '.join(DTYPES)}")


def open_engine(checkpoint: str | None, dtype: str | None, max_length: int | None, compile_cache: str | None,
                weight_dtype: str | None = None, buckets: str | None = None, quant: str | None = None,
                scale_dtype: str | None = None, kernel: str | None = None, backend: str | None = None):  # fmt: skip
    """Decide and log the dtype policy (the first line), enable the compile cache, resolve and load the
    checkpoint. `weight_dtype` stores the weights in another dtype than the compute dtype (default: the same, so no
    step converts weights); `buckets` is the `--buckets` text (default: the engine's ladder up to max_length);
    `quant` / `scale_dtype` are the `--quant` / `--scale-dtype` texts (`parse_quant_flags`; default: dense);
    `kernel` the `--kernel` text (`parse_kernel_flag`; default: the fused W4A16 kernel where it runs and fits);
    `backend` the `--backend` text (`parse_backend_flag`; default: the pure-JAX engine).
    Returns (engine, load report, checkpoint path, compile cache folder or None). Raises InputError or QuantError
    for a bad flag, KernelError for a forced kernel this device cannot run, and EngineError for a backend that
    cannot run here (`model.backends.plan_backend`: "cpu-kernels" off CPU or without a C++ compiler), before
    anything loads."""
    from model.engine import enable_compile_cache, load_engine, log_policy_line
    from model.kernels.choice import with_kernel_mode
    from model.backends import check_runs
    from model.policy import decide_policy, with_backend

    check_dtype_flags(dtype, weight_dtype)
    if checkpoint is not None and checkpoint.startswith("random:"):
        parse_random_flag(checkpoint)  # an unknown preset is one line before anything is logged or loaded
    spec, scale = parse_quant_flags(quant, scale_dtype)
    check_max_length(max_length)
    ladder = parse_buckets(buckets)
    impl = parse_kernel_flag(kernel, quant)
    backend = parse_backend_flag(backend)
    policy = with_backend(with_kernel_mode(decide_policy(dtype, weight_dtype=weight_dtype), spec, impl), backend)
    log_policy_line(policy)  # the first line, before a built-in checkpoint is created or anything loads
    check_runs(policy.backend, policy.platform)  # can it run here: one line if not, before anything loads
    cache = enable_compile_cache(compile_cache_dir(compile_cache))
    path = checkpoint_path(checkpoint)
    if max_length is not None:  # in the flag's terms, before the weights load (the engine's error names a bucket)
        from model.checkpoint import resolve_checkpoint
        from model.config import load_config

        path = resolve_checkpoint(path)
        positions = load_config(path).max_position_embeddings
        if max_length > positions:
            raise InputError(f"--max-length {max_length}: above the model's {positions} positions "
                             f"(max_position_embeddings); expected --max-length 1..{positions}")  # fmt: skip
    engine, report = load_engine(path, policy=policy, max_length=max_length, buckets=ladder, log_policy=False,
                                 quant=spec, scale_dtype=scale, kernel=impl)  # fmt: skip
    return engine, report, Path(report["path"]), cache


CheckpointOpt = typer.Option(None, "--checkpoint", "-c", help=CHECKPOINT_HELP)
DtypeOpt = typer.Option(None, "--dtype", help=DTYPE_HELP)
WeightDtypeOpt = typer.Option(
    None, "--weight-dtype",
    help="Store the weights in this dtype (float32, bfloat16, float16) while computing in --dtype; default: the "
    "compute dtype. A mismatch makes every decode step convert the weights (the report's 'leak one'); bfloat16 "
    "under float32 on CPU with --backend cpu-kernels: the engine's CPU kernels read the bfloat16 weights in place "
    "(half the bytes).",
)  # fmt: skip
MaxLengthOpt = typer.Option(None, "--max-length", help="Largest prompt (tokens) the engine accepts, at most the "
                             "model's positions; default 8192 (or the model's positions, if fewer).")
CompileCacheOpt = typer.Option(None, "--compile-cache", help=CACHE_HELP)
QUANT_HELP = ("Quantization, a comma-separated set: ple8 or ple4 (the per-layer-embedding table, one scale per row "
              "and 256 values), int8_lm_head (an int8 copy of the tied table for the logits), w8 or w4[:GROUP] (the "
              "layer projections: per output channel, or GROUP-value groups along the contraction axis, default "
              "128). Default: none.")
QuantOpt = typer.Option(None, "--quant", help=QUANT_HELP)
ScaleDtypeOpt = typer.Option(None, "--scale-dtype", help="Dtype of the quantization scales with --quant: bfloat16 "
                             "(default), float16 or float32.")
KERNEL_HELP = ("How w4 weights (--quant w4) are multiplied: w4a16=pallas (the fused W4A16 Pallas kernel: on TPUs "
               "the Mosaic TPU kernel, tiles chosen to fit the VMEM budget; on NVIDIA GPUs of compute capability 8.0 "
               "and above the Triton kernel, tiles chosen to fit the device's shared memory) or w4a16=xla (XLA's "
               "dequantize-and-dot). Default: pallas where it runs and fits, else xla; the policy line says which "
               "and why.")
KernelOpt = typer.Option(None, "--kernel", help=KERNEL_HELP)
BACKEND_HELP = ("What runs beside XLA's programs: jax (the default on every platform: the pure-JAX engine) or "
                "cpu-kernels (CPU only: the engine's hand-written XLA:CPU kernels, C++ built on first use with the "
                "machine's compiler and -march=native, for bfloat16 weights under float32 and float32 decode "
                "attention, and its decode programs compiled without XLA's tree-reduction pass). Recorded in the "
                "manifest and the build id; asked for where it cannot run: one line, exit 2. See docs/engine.md.")
BackendOpt = typer.Option(None, "--backend", help=BACKEND_HELP)
BucketsOpt = typer.Option(None, "--buckets", help="Prompt-length ladder (tokens, increasing), e.g. 64,512,1024,4096: a "
                          "prompt is padded to the smallest rung that holds it. Default: powers of two to 512, then "
                          "steps of 512 to 4096, then of 1024 up to --max-length.")


def engine_manifest(command: str, engine, report: dict, checkpoint: str | None, cache_dir: Path | None, workload,
                    extra: dict | None = None):  # fmt: skip
    """The run manifest (`bench.runs.manifest.build_manifest`) of `command` on the engine `open_engine` loaded:
    `checkpoint` is the `--checkpoint` text (None: the built-in default), `report` the load report (its content
    hash was computed while loading), `cache_dir` the compile cache folder (written relative to the cache root),
    `workload` the command's `bench.runs.Workload`, `extra` more top-level keys. Same payload, same build id, from
    every command."""
    import jax

    from bench.runs.environment import device_facts
    from bench.runs.manifest import (
        CompileCacheFacts,
        build_manifest,
        checkpoint_facts,
        engine_config_of,
        policy_facts,
        portable_dir,
    )
    from model.builtin import DEFAULT_PRESET, cache_root

    spec = checkpoint or f"builtin:{DEFAULT_PRESET}"
    return build_manifest(
        command, checkpoint=checkpoint_facts(spec, report, engine.weight_bytes), engine=engine_config_of(engine),
        workload=workload, device=device_facts(jax), dtype_policy=policy_facts(engine.policy),
        compile_cache=CompileCacheFacts(dir=portable_dir(cache_dir, cache_root())), extra=extra,
    )  # fmt: skip
