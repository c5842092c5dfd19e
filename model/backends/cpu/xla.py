"""The XLA:CPU pass option of the "cpu-kernels" backend: its decode programs compiled without XLA's tree-reduction
pass (`model.backends`; `model.programs.Program` compiles them so). The pure-JAX engine ("jax") compiles every
program with XLA's default passes.
"""

from __future__ import annotations

import os
import re

from model.switches import switch_on

DISABLED_PASS = "tree_reduction_rewriter"
"""The XLA pass the decode programs skip on CPU under the "cpu-kernels" backend.

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
"""Environment variable read when a "cpu-kernels" engine is made: 0 / false / off / no compiles its decode programs
with XLA's default passes (to measure the difference; recorded: the manifest's `xla_options` is then null);
1 / true / on / yes or unset: `CPU_COMPILER_OPTIONS_TEXT`. Any other value is an EngineError."""


def check_switch() -> None:
    """Raises EngineError (one line, `model.switches.switch_on`) for a value of `ENV_SWITCH` neither on nor off."""
    switch_on(ENV_SWITCH)


def xla_options() -> str | None:
    """What a "cpu-kernels" engine made now compiles its decode programs with: `CPU_COMPILER_OPTIONS_TEXT` unless
    `ENV_SWITCH` is off (None: XLA's defaults). Raises EngineError for a bad switch value."""
    return CPU_COMPILER_OPTIONS_TEXT if switch_on(ENV_SWITCH) else None


def compiler_options(xla_flags: str | None = None) -> dict[str, str]:
    """The `jax.jit` compiler options of `CPU_COMPILER_OPTIONS_TEXT`: `DISABLED_PASS` added to the passes that
    `xla_flags` (the XLA_FLAGS text; default: the environment's now) already disables (a compiler option replaces
    the flag's value; it does not add to it)."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    passes = [DISABLED_PASS]
    for found in re.findall(r"--xla_disable_hlo_passes=(\S*)", flags):
        passes += [p for p in found.split(",") if p and p not in passes]
    return {"xla_disable_hlo_passes": ",".join(passes)}


def options_line(options: str | None) -> str:
    """The run.log line about a "cpu-kernels" engine's decode programs' XLA options."""
    if options is None:
        return f"XLA:CPU decode programs compiled with XLA's default passes ({ENV_SWITCH} off)"
    return f"XLA:CPU decode programs compiled with {options} (one fusion per long sum: model/backends/cpu/xla.py)"


__all__ = ["CPU_COMPILER_OPTIONS_TEXT", "DISABLED_PASS", "ENV_SWITCH", "check_switch", "compiler_options",
           "options_line", "xla_options"]
