"""How the engine's decode programs are compiled: `program`, `jax.jit` with XLA options chosen for the backend.

On the CPU backend the decode programs (`model.engine`'s host-loop step and device loop, `model.slots`' step) are
compiled with `CPU_COMPILER_OPTIONS`; on any other backend, and for every other program (prefill among them),
exactly as `jax.jit` compiles them. The choice is made at each call from `jax.default_backend()`, so importing this
module starts no backend.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import jax

CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "tree_reduction_rewriter"}
"""XLA options of the decode programs on CPU: XLA's tree-reduction pass is off.

That pass (XLA's `TreeReductionRewriter`, xla/service/tree_reduction_rewriter.h: pairwise summation) rewrites every
reduction over more than 32 values into a reduce-window of 32 and a second reduce, and XLA:CPU fuses neither with
the ops around it. Each RMSNorm of a decode step (8 per layer) then ran as 4 steps of the compiled program (thunks):
the square, the reduce-window, the last reduce with the rsqrt, the scaling. With the pass off the square and the
sum are one fusion: the default preset's decode step went from 1652 thunks to 1079. Every thunk costs host time at
each call (XLA:CPU builds a buffer-table entry per allocation, most of them the scalars of reduce computations) as
well as time to run.

Measured on the default preset, paired in one process (2-core Xeon, jax 0.12, 64 new tokens, options on / off,
median of the paired ratios of 6-8 alternating requests): bfloat16 weights (the CPU kernels) at 41 input tokens,
host loop 0.908 and device loop 0.889; at 521 tokens host 0.926 and 1.057 in two runs, device 1.006 and 0.965;
float32 weights at 41 tokens host 1.016, device 0.997. Greedy tokens were equal in every run, the largest logit
difference 8.9e-8. Prefill keeps the pass: with it off there, TTFT measured 1.049 at 41 tokens and 1.019-1.095 at
521. The sums lose pairwise summation's error bound (a float32 sum of n values within about n x 2^-24 of exact in
the worst case instead of about log2(n) x 2^-24; n = 256 to 8192 here).

`GEMMA4_BENCH_XLA_CPU_OPTIONS=0` (or false, off, no) compiles them without it (read at each call, to measure the
difference)."""

ENV_SWITCH = "GEMMA4_BENCH_XLA_CPU_OPTIONS"


def cpu_options_on() -> bool:
    """Whether CPU programs get `CPU_COMPILER_OPTIONS` (`ENV_SWITCH`, read on every call)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def compiler_options_line() -> str | None:
    """The line a run logs about the XLA options of its decode programs on CPU (None off CPU)."""
    if jax.default_backend() != "cpu":
        return None
    if not cpu_options_on():
        return f"XLA:CPU decode programs compiled with XLA's default passes ({ENV_SWITCH}={os.environ[ENV_SWITCH]})"
    options = ", ".join(f"{k}={v}" for k, v in CPU_COMPILER_OPTIONS.items())
    return f"XLA:CPU decode programs compiled with {options} (one fusion per RMSNorm sum: model/programs.py)"


class Program:
    """A function jitted twice: with `CPU_COMPILER_OPTIONS` for the CPU backend, plainly for any other. Calling it
    calls the one for `jax.default_backend()` (the same arguments, the same static and donated ones)."""

    def __init__(self, fun: Callable, jit_kwargs: dict):
        self._plain = jax.jit(fun, **jit_kwargs)
        self._cpu = jax.jit(fun, compiler_options=CPU_COMPILER_OPTIONS, **jit_kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        cpu = jax.default_backend() == "cpu" and cpu_options_on()
        return (self._cpu if cpu else self._plain)(*args, **kwargs)


def program(**jit_kwargs) -> Callable[[Callable], Program]:
    """Decorator: `Program(fun, jit_kwargs)`, `jit_kwargs` as `jax.jit` takes them (static_argnames,
    donate_argnames, ...)."""
    return lambda fun: Program(fun, jit_kwargs)


__all__ = ["CPU_COMPILER_OPTIONS", "ENV_SWITCH", "Program", "compiler_options_line", "cpu_options_on", "program"]
