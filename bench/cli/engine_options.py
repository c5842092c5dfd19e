"""The engine's options, declared once: `--dtype`, `--weight-dtype`, `--max-length`, `--buckets`, `--quant`,
`--scale-dtype`, `--kernel`, `--backend` and `--mesh`, the group every command that opens the engine takes (sweep, profile,
generate, serve) through `engine_options`. Their values arrive as one `EngineFlags`, which builds the one
`model.engine_config.EngineConfig` (`EngineFlags.config`). `bench gpu-run` and `bench fleet plan` take `--quant`
and `--kernel` as repeatable lists (one run per value) with these help texts' meaning, and check each value with
the same builder. See docs/engine.md, "The engine configuration".
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

DTYPE_HELP = "Override the compute dtype (float32, bfloat16, float16); default: chosen from the live device."
WEIGHT_DTYPE_HELP = (
    "Store the weights in this dtype (float32, bfloat16, float16) while computing in --dtype; default: the "
    "compute dtype. A mismatch makes every decode step convert the weights (the report's 'leak one'); bfloat16 "
    "under float32 on CPU with --backend cpu-kernels: the engine's CPU kernels read the bfloat16 weights in place "
    "(half the bytes)."
)  # fmt: skip
MAX_LENGTH_HELP = ("Largest prompt (tokens) the engine accepts, at most the model's positions; default 8192 (or the "
                   "model's positions, if fewer).")  # fmt: skip
BUCKETS_HELP = ("Prompt-length ladder (tokens, increasing), e.g. 64,512,1024,4096: a prompt is padded to the smallest "
                "rung that holds it. Default: powers of two to 512, then steps of 512 to 4096, then of 1024 up to "
                "--max-length.")  # fmt: skip
QUANT_HELP = ("Quantization, a comma-separated set: ple8 or ple4 (the per-layer-embedding table, one scale per row "
              "and 256 values), int8_lm_head (an int8 copy of the tied table for the logits), w8 or w4[:GROUP] (the "
              "layer projections: per output channel, or GROUP-value groups along the contraction axis, default "
              "128). Default: none.")  # fmt: skip
SCALE_DTYPE_HELP = "Dtype of the quantization scales with --quant: bfloat16 (default), float16 or float32."
KERNEL_HELP = ("How w4 weights (--quant w4) are multiplied: w4a16=pallas (the fused W4A16 Pallas kernel: on TPUs "
               "the Mosaic TPU kernel, tiles chosen to fit the VMEM budget; on NVIDIA GPUs of compute capability 8.0 "
               "and above the Triton kernel, tiles chosen to fit the device's shared memory) or w4a16=xla (XLA's "
               "dequantize-and-dot). On a TPU, w4a16=pallas:steps or w4a16=pallas:fewest (the default) picks the "
               "kernel's tiling policy (docs/devices/tpu.md). Default: pallas where it runs and fits, else xla; the "
               "policy line says which and why.")  # fmt: skip
BACKEND_HELP = ("What runs beside XLA's programs: jax (the default on every platform: the pure-JAX engine) or "
                "cpu-kernels (CPU only: the engine's hand-written XLA:CPU kernels, C++ built on first use with the "
                "machine's compiler and -march=native, for bfloat16 weights under float32 and float32 decode "
                "attention, and its decode programs compiled without XLA's tree-reduction pass). Recorded in the "
                "manifest and the build id; asked for where it cannot run: one line, exit 2. See docs/engine.md.")  # fmt: skip

MESH_HELP = ("Place the weights and KV cache over several devices with jax.sharding: tp=N (tensor parallel: the "
             "attention heads, MLP width and vocabulary split N ways) or ep=N (expert parallel, models with experts). "
             "N must divide the model's heads (and experts) and be at most the devices jax sees: on CPU, "
             "XLA_FLAGS=--xla_force_host_platform_device_count=N makes N host devices. Runs the pure-JAX engine with "
             "XLA's products. Recorded in the manifest and the build id. Default: one device. See docs/engine.md.")

OPTIONS: dict[str, tuple[str, str]] = {
    "dtype": ("--dtype", DTYPE_HELP), "weight_dtype": ("--weight-dtype", WEIGHT_DTYPE_HELP),
    "max_length": ("--max-length", MAX_LENGTH_HELP), "buckets": ("--buckets", BUCKETS_HELP),
    "quant": ("--quant", QUANT_HELP), "scale_dtype": ("--scale-dtype", SCALE_DTYPE_HELP),
    "kernel": ("--kernel", KERNEL_HELP), "backend": ("--backend", BACKEND_HELP), "mesh": ("--mesh", MESH_HELP),
}  # fmt: skip
"""The group: parameter name -> (option, help). Every option is optional; None (not given) lets the engine decide."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineFlags:
    """The group's values as typed (None: not given), before they are checked."""

    dtype: str | None = None
    weight_dtype: str | None = None
    max_length: int | None = None
    buckets: str | None = None
    quant: str | None = None
    scale_dtype: str | None = None
    kernel: str | None = None
    backend: str | None = None
    mesh: str | None = None

    def given(self) -> dict[str, Any]:
        """{option name: value} of the options given, in the group's order (e.g. {"--quant": "w8"})."""
        return {OPTIONS[f.name][0]: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def config(self):
        """The `model.engine_config.EngineConfig` of these values (`EngineConfig.from_options`: OptionError or
        QuantError, one line, for a bad value)."""
        from model.engine_config import EngineConfig

        return EngineConfig.from_options(**dataclasses.asdict(self))


def engine_options(*names: str, help_more: dict[str, str] | None = None) -> Callable:
    """Decorator of a typer command that takes the group's options `names` (default: all of `OPTIONS`) in place
    of its parameter `engine_flags`, which receives them as one `EngineFlags` (an option left out stays None).
    `help_more`: text added to an option's help for this command (e.g. what --resume or --run does to it)."""
    chosen = names or tuple(OPTIONS)

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = next(i for i, p in enumerate(params) if p.name == "engine_flags")
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=int | None if name == "max_length"
                                   else str | None, default=_option(name, (help_more or {}).get(name)))
                 for name in chosen]  # fmt: skip

        @functools.wraps(command)
        def run(*args, **kwargs):
            flags = EngineFlags(**{name: kwargs.pop(name) for name in chosen})
            return command(*args, engine_flags=flags, **kwargs)

        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind == p.POSITIONAL_OR_KEYWORD and i > at else p
                for i, p in enumerate(params) if i != at]  # fmt: skip
        run.__signature__ = signature.replace(parameters=rest[:at] + added + rest[at:])
        run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}
        return run

    return decorate


def _option(name: str, more: str | None):
    flag, text = OPTIONS[name]
    return typer.Option(None, flag, help=text if more is None else f"{text} {more}")
