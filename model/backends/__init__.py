"""The engine's backends, and the one place the core asks about them.

A backend is a set of implementations that replace some of the engine's pure-JAX products on one platform. The
engine is pure JAX by default on every platform (`DEFAULT_BACKEND`, "jax"); another backend runs only when the engine
configuration asks for it (`model.policy.DevicePolicy.backend`, set from `bench ... --backend`), and one that is
asked for and cannot run here is an EngineError before any weight loads (`check_runs`, `plan_backend`).

- "jax": XLA's programs only, compiled with XLA's default passes.
- "cpu-kernels": the hand-written XLA:CPU kernels of `model.backends.cpu` (C++ built on first use with the
  machine's compiler and `-march=native`: bfloat16-weight products and decode attention, `model.backends.cpu.kernels`)
  and the decode programs compiled without XLA's tree-reduction pass (`model.backends.cpu.xla`). CPU only.

On the CPU platform both backends also take the pure-JAX product forms written for XLA:CPU
(`model.backends.cpu.forms`, `model.backends.cpu.qreduce`: jax.numpy only, so part of the pure-JAX engine): they
sit behind this boundary because they are CPU-only, not because they are optional.

How the core asks: the engine's programs trace inside `using(backend)` (the backend is one of their static
arguments, so each backend gets programs of its own), and the hooks below read `active()` at trace time:
`dense_matmul`, `quant_matmul` (from `model.quant.matmul`), `decode_attention` (from `model.layers.attend_one`).
At load the engine asks `plan_backend` what will run (kernel names for the manifest, XLA options, lines to log).
Nothing outside this package imports `model.backends.cpu` (an import contract in pyproject.toml).
Docs: docs/engine.md ("Backends").
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

from model.errors import EngineError

DEFAULT_BACKEND = "jax"
CPU_KERNELS = "cpu-kernels"
BACKENDS = {
    DEFAULT_BACKEND: "pure JAX: XLA's programs only (the default on every platform)",
    CPU_KERNELS: "the engine's hand-written XLA:CPU kernels (C++, built on first use with -march=native) and the "
                 "XLA:CPU pass option of its decode programs; CPU only",
}  # fmt: skip
"""Every backend an engine configuration may name, with one line on what it runs."""

_ACTIVE: contextvars.ContextVar[str] = contextvars.ContextVar("gemma4_bench_backend", default=DEFAULT_BACKEND)


def check_backend(name: str) -> str:
    """`name` when it names a backend (`BACKENDS`); else EngineError, one line naming it and the choices."""
    if name not in BACKENDS:
        raise EngineError(f"backend {name!r}: expected one of {', '.join(BACKENDS)} (default {DEFAULT_BACKEND})")
    return name


@contextlib.contextmanager
def using(backend: str) -> Iterator[None]:
    """Within: the hooks trace as `backend` says (`active`). Programs enter it inside their traced body, with the
    backend one of their static arguments (so jax keys their compiled programs by it). Raises EngineError for an
    unknown name (`check_backend`)."""
    token = _ACTIVE.set(check_backend(backend))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> str:
    """The backend the current trace runs (`using`); `DEFAULT_BACKEND` outside any."""
    return _ACTIVE.get()


def _cpu() -> bool:
    import jax

    return jax.default_backend() == "cpu"


# ---- the hooks: None means "the core's pure-JAX product" ------------------------------------------------------
def rewrites_products() -> bool:
    """Whether `dense_matmul` / `quant_matmul` may return a product here (the CPU platform); the core skips
    building their row form elsewhere."""
    return _cpu()


def dense_matmul(x_RK: Any, w: Any, axis: int) -> Any:
    """x [R, K] times the dense 2-D weight `w` contracted along `axis` (1: w [N, K]; 0: w [K, N]) as [R, N] in a
    form of this platform's backend (`model.backends.cpu.forms.dense_matmul`: the bfloat16 kernels under
    "cpu-kernels", the XLA:CPU forms under either), or None: the core's einsum. The result may be float32 where x
    is another dtype; the caller casts it."""
    if not _cpu():
        return None
    from model.backends.cpu import forms

    return forms.dense_matmul(x_RK, w, axis, kernels=active() == CPU_KERNELS)


def quant_matmul(x_RK: Any, w: Any, axis: int) -> Any:
    """x [R, K] times the quantized 2-D weight `w` (a `model.quant.QuantArray`: values, scales, bits, block, shape)
    contracted along `axis`, as float32 [R, N] in `model.backends.cpu.qreduce`'s multiply-and-sum form on CPU (at
    most `MATVEC_ROWS` rows, a layout `fits_reduce` takes), or None: the core's dot form (the form XLA fuses into
    the GEMM on GPUs)."""
    if not _cpu():
        return None
    from model.backends.cpu.qreduce import MATVEC_ROWS, fits_reduce, reduce_matmul

    if x_RK.shape[0] > MATVEC_ROWS or not fits_reduce(w.shape, w.bits, w.block, axis):
        return None
    return reduce_matmul(x_RK, w.values, w.scales, w.bits, w.block, axis)


def decode_attention(q_BKGH: Any, k_CKSH: Any, v_CKSH: Any, mask_BS: Any, rows_B: Any = None) -> Any:
    """Decode attention [B, K, G, H] float32 by the CPU kernel (`model.backends.cpu.kernels.decode_attention`,
    which reads only the visible positions) when the trace runs "cpu-kernels" on CPU, q/k/v are float32, G is one
    the kernel is compiled for and the kernel is on (its switch, the library loaded); else None: the core's two
    products. Shapes as `model.layers.attend_one`'s. Raises EngineError for a bad switch value."""
    if active() != CPU_KERNELS or not _cpu():
        return None
    import jax.numpy as jnp

    from model.backends.cpu import kernels

    if any(a.dtype != jnp.float32 for a in (q_BKGH, k_CKSH, v_CKSH)) or q_BKGH.shape[2] not in kernels.ATTENTION_GROUPS:
        return None
    if not kernels.attention_available():
        return None
    return kernels.decode_attention(q_BKGH, k_CKSH, v_CKSH, mask_BS, rows_B)


def batch_copy(platform: str) -> bool:
    """Whether an engine on `platform` holds its input-major projections transposed as well, for decode steps of
    more than one row (`model.params.output_major_params`; the weight-left form of `model.backends.cpu.forms`):
    on CPU, with either backend (pure JAX)."""
    return platform == "cpu"


# ---- the plan an engine is made with ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class BackendPlan:
    """What an engine of one policy runs (`plan_backend`).

    `backend`: its name (`BACKENDS`); `kernel`: the manifest's names of the kernels in use, space-separated
    ("bf16=cpu attention=cpu", "attention=cpu", ...; `model.backends.cpu.kernels.KERNEL_NAMES`), None for none;
    `output_major`: the bfloat16 kernels read [N, K] weights, so the engine holds its input-major projections
    transposed instead (`model.params.output_major_params`); `reads_visible_kv`: decode attention reads only the
    visible positions of the cache; `xla_options`: what its decode programs compile with (None: XLA's
    defaults); `lines`: (level, line) pairs to log at load ("info" or "warning")."""

    backend: str = DEFAULT_BACKEND
    kernel: str | None = None
    output_major: bool = False
    reads_visible_kv: bool = False
    xla_options: str | None = None
    lines: tuple[tuple[str, str], ...] = ()


def plan_backend(backend: str, platform: str, *, weight_dtype: str, activation_dtype: str,
                 kv_dtype: str) -> BackendPlan:  # fmt: skip
    """The plan of an engine of `backend` on `platform` with these dtypes (`model.policy.DTYPES` names).

    "jax": nothing but XLA's programs; a warning line where bfloat16 weights meet float32 activations on CPU
    (XLA:CPU widens each weight before each product: "leak one"). "cpu-kernels": the kernels built and loaded
    now (`model.backends.cpu.kernels.plan`, which may take seconds the first time on a machine).
    Raises EngineError (one line: what was asked, why it cannot run here, the fix) for an unknown backend,
    "cpu-kernels" off the CPU platform or where the kernels cannot be built or loaded (no C++ compiler, no XLA FFI
    headers), and for a bad value of one of its switches; all before any weight loads."""
    check_runs(backend, platform)
    if backend == DEFAULT_BACKEND:
        lines = []
        if platform == "cpu" and weight_dtype == "bfloat16" and activation_dtype == "float32":
            lines.append(("warning", "warning: bfloat16 weights x float32 activations on the pure-JAX engine: XLA:CPU "
                          "widens every weight before each product (about 8x slower decode, 'leak one'); "
                          f"--backend {CPU_KERNELS} reads them in place"))  # fmt: skip
        return BackendPlan(backend=backend, lines=tuple(lines))
    from model.backends.cpu import kernels, xla

    plan = kernels.plan(weight_dtype=weight_dtype, activation_dtype=activation_dtype, kv_dtype=kv_dtype)
    options = xla.xla_options()
    lines = (*plan.lines, *((("info", xla.options_line(options)),)))
    return BackendPlan(backend=backend, kernel=plan.kernel, output_major=plan.bf16, reads_visible_kv=plan.attention,
                       xla_options=options, lines=lines)  # fmt: skip


def check_runs(backend: str, platform: str) -> None:
    """Raises EngineError (one line: what was asked, why it cannot run, the fix) unless `backend` can run on
    `platform` ("cpu", "gpu", "tpu"): an unknown name, "cpu-kernels" off the CPU platform, or its kernels not
    buildable or loadable here (no C++ compiler, no XLA FFI headers: `model.backends.cpu.kernels.availability`,
    which builds them on first use, seconds the first time on a machine), or a bad value of one of its switches.
    Loads no weights: commands call it before the model loads (`bench serve` before its port opens)."""
    check_backend(backend)
    if backend == DEFAULT_BACKEND:
        return
    if platform != "cpu":
        raise EngineError(f"--backend {backend}: the engine's CPU kernels run on the CPU platform only, and this "
                          f"device is {platform}; drop --backend (the default, {DEFAULT_BACKEND}, runs "
                          "everywhere)")  # fmt: skip
    from model.backends.cpu import kernels, xla

    kernels.check_switches()
    xla.check_switch()
    ok, how = kernels.availability()
    if not ok:
        raise EngineError(f"--backend {backend}: the engine's CPU kernels cannot run here ({how}); drop --backend "
                          f"for the pure-JAX engine ({DEFAULT_BACKEND})")  # fmt: skip


def check_switches() -> None:
    """Raises EngineError (one line) for a value of a backend's on/off switch that is neither on nor off
    (`model.backends.cpu.kernels.check_switches`, `model.backends.cpu.xla.ENV_SWITCH`); builds and loads nothing."""
    from model.backends.cpu import kernels, xla

    kernels.check_switches()
    xla.check_switch()


def compiler_options() -> dict[str, str]:
    """The `jax.jit` compiler options that a plan's `xla_options` text stands for (`model.programs.Program` jits its
    second variant with them): the XLA:CPU pass option with the passes XLA_FLAGS already disables
    (`model.backends.cpu.xla.compiler_options`)."""
    from model.backends.cpu import xla

    return xla.compiler_options()


def xla_options_line(options: str | None, platform: str) -> str | None:
    """The run.log line about an engine's XLA options on `platform`: None off CPU (XLA's defaults are the only
    choice there); on CPU what the decode programs compile with (None: XLA's default passes)."""
    if platform != "cpu":
        return None
    if options is None:
        return "XLA:CPU decode programs compiled with XLA's default passes"
    from model.backends.cpu import xla

    return xla.options_line(options)


__all__ = ["BACKENDS", "CPU_KERNELS", "DEFAULT_BACKEND", "BackendPlan", "active", "batch_copy", "check_backend",
           "check_runs", "check_switches", "compiler_options", "decode_attention", "dense_matmul", "plan_backend",
           "quant_matmul", "rewrites_products", "using", "xla_options_line"]
