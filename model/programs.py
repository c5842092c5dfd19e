"""How the engine's decode programs are compiled: `program`, `jax.jit` with XLA options an engine chooses.

An engine decides once, when it is made (`xla_options`), and passes its choice to every call of a decode program
(`model.engine`'s host-loop step and device loop, `model.slots`' step): on the CPU backend those programs are
compiled with `CPU_COMPILER_OPTIONS_TEXT`; on any other backend, and for every other program (prefill among them),
exactly as `jax.jit` compiles them. The run's manifest records the choice (`EngineConfig.xla_options`), so it
enters the build id. Importing this module starts no backend.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import Any

import jax

from model.switches import switch_on

DISABLED_PASS = "tree_reduction_rewriter"
"""The XLA pass the decode programs skip on CPU.

XLA's `TreeReductionRewriter` (xla/service/tree_reduction_rewriter.h) rewrites every reduction over more than 32
values into a reduce-window of 32 and a reduce of the partial sums, and XLA:CPU fuses neither with the ops around
them. Each RMSNorm of a decode step (8 per layer) then ran as 4 steps of the compiled program (thunks): the square,
the reduce-window, the last reduce with the rsqrt, the scaling; each softmax sum over the cache was cut the same
way. With the pass off the square and the sum are one fusion: the default preset's decode step went from 1652
thunks to 1079 (41 tokens; 1582 -> 1114 at 3593). Every thunk costs host time at each call (XLA:CPU builds a
buffer-table entry per allocation, most of them the scalars of reduce computations) as well as time to run.

Paired in one process on the 2-core Xeon it shortened a bfloat16-weight decode step by about 9% at 41 tokens
(host loop), with greedy tokens equal, and gained nothing with float32 weights; prefill keeps the pass, which
measured faster there. The measurements: docs/engine.md, "Kernels" (the tree-reduction pass).

What the sums lose: the pass's windows bound a float32 sum of n values to about (32 + n/32) x 2^-24 of exact in the
worst case; one reduce to about n x 2^-24 (n: the model width, 256-2560 on the presets, and the cache length of
a softmax, up to max_length + max_new_tokens)."""

CPU_COMPILER_OPTIONS_TEXT = f"xla_disable_hlo_passes={DISABLED_PASS}"
"""The `xla_options` text of an engine whose decode programs skip `DISABLED_PASS` (what the manifest records)."""

ENV_SWITCH = "GEMMA4_BENCH_XLA_CPU_OPTIONS"
"""Environment variable: 0 / false / off / no makes engines made afterwards compile their decode programs with XLA's
default passes (to measure the difference); 1 / true / on / yes or unset: `CPU_COMPILER_OPTIONS_TEXT` on CPU."""


def _cpu_compiler_options(xla_flags: str) -> dict[str, str]:
    """The `jax.jit` compiler options of the CPU variant: `DISABLED_PASS` added to the passes that `xla_flags` (the
    XLA_FLAGS text) already disables (a compiler option replaces the flag's value; it does not add to it)."""
    passes = [DISABLED_PASS]
    for found in re.findall(r"--xla_disable_hlo_passes=(\S*)", xla_flags):
        passes += [p for p in found.split(",") if p and p not in passes]
    return {"xla_disable_hlo_passes": ",".join(passes)}


def xla_options(backend: str | None = None) -> str | None:
    """What an engine made now on `backend` (default: `jax.default_backend()`) compiles its decode programs with:
    `CPU_COMPILER_OPTIONS_TEXT` on CPU unless `ENV_SWITCH` is off, else None (XLA's defaults). Raises EngineError
    for a switch value that is neither on nor off (`model.switches.switch_on`)."""
    if not switch_on(ENV_SWITCH) or (backend or jax.default_backend()) != "cpu":
        return None
    return CPU_COMPILER_OPTIONS_TEXT


def xla_options_line(options: str | None, backend: str) -> str | None:
    """The run.log line about an engine's `xla_options` on `backend` (None off CPU, where XLA's defaults are the
    only choice)."""
    if backend != "cpu":
        return None
    if options is None:
        return f"XLA:CPU decode programs compiled with XLA's default passes ({ENV_SWITCH} off)"
    return f"XLA:CPU decode programs compiled with {options} (one fusion per long sum: model/programs.py)"


class Program:
    """A function jitted twice with the same `jit_kwargs` (static_argnames, donate_argnames, ...): plainly, and
    with `_cpu_compiler_options` of the XLA_FLAGS in force when it is made. `program(..., xla_options=...)` runs the
    one an engine's `xla_options` names (None: the plain one). Raises TypeError at creation for
    `compiler_options` in `jit_kwargs` (this class sets them), and at a call without `xla_options`."""

    def __init__(self, fun: Callable, jit_kwargs: dict[str, Any]):
        if "compiler_options" in jit_kwargs:
            raise TypeError("Program sets compiler_options itself")
        self._plain = jax.jit(fun, **jit_kwargs)
        self._cpu = jax.jit(fun, compiler_options=_cpu_compiler_options(os.environ.get("XLA_FLAGS", "")),
                            **jit_kwargs)  # fmt: skip
        functools.update_wrapper(self, fun)

    def __call__(self, *args, xla_options: str | None, **kwargs):
        """The jitted function's result for `args`, `kwargs`, compiled as `xla_options` says (see the class)."""
        return (self._plain if xla_options is None else self._cpu)(*args, **kwargs)


def program(**jit_kwargs) -> Callable[[Callable], Program]:
    """Decorator: `Program(fun, jit_kwargs)`, `jit_kwargs` as `jax.jit` takes them."""
    return lambda fun: Program(fun, jit_kwargs)


__all__ = ["CPU_COMPILER_OPTIONS_TEXT", "DISABLED_PASS", "ENV_SWITCH", "Program", "program", "xla_options",
           "xla_options_line"]
