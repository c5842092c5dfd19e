"""Record an xprof trace of exactly N decode steps (docs/method.md, "Profiles").

`capture_steps` is generic over a step callable, `state = step_fn(state)`: the engine passes its jitted decode step
and its state (tokens, positions, KV cache); tests pass small jitted functions. It runs `warmup` untimed steps first
(so nothing compiles under the profiler), then traces exactly `n_steps` steps, each inside
`jax.profiler.StepTraceAnnotation("decode", step_num=i)` and each blocked on before the next starts, so every
device op of step i lies inside step i's annotation. `bench.profile.analysis` uses those annotations to count the
steps and to keep only the ops inside them.

Keeping the trace small: the Python tracer is off by default (it records every Python call and makes traces large),
and the host tracer runs at level 1 (user TraceMe annotations only). On XLA:CPU, level 1 still records every
executed XLA op (thunk) with its `hlo_op`/`hlo_module` stats, which is what the analysis needs; level 0 would drop
the step annotations and, on CPU, the ops themselves. HLO protos stay on (`enable_hlo_proto`, jax's default): they
tell the analysis operand dtypes and named scopes.

GPU: per-op attribution needs XLA command buffers (CUDA graphs) off, or many kernels run inside one graph launch
and lose their op names. `gpu_profile_flags()` returns the XLA_FLAGS for that. XLA reads XLA_FLAGS once, when the
backend initialises, so `bench profile` must put them into the environment before jax starts on a GPU
(`apply_gpu_profile_flags`); timing runs (`bench sweep`) keep XLA's default flags. The same switch is what jax
itself applies when it collects profiles for PGLE (`jax/_src/compiler.py`, `("xla_gpu_enable_command_buffer", "")`),
and jax's GPU performance tips document the flag.

Steps past the decode budget (`restart_every`): a decode program's KV cache holds (bucket + max_new_tokens)
positions, and its attention reads the whole buffer every step, masked slots included, so a step's cost is set by
the compiled shape, not by how many steps are traced. The profiled shape must therefore not grow with N: with
`--steps 200` on the default preset a cache sized for 200 steps made attention 53% of device time where a cache
sized for 20 steps gave 12.5% (20 traced steps each; the step count alone changed nothing). `capture_steps` keeps
the shape fixed by restarting: after every `restart_every` traced steps it continues from a fresh copy of the
state it had after the warm-up (copied before tracing starts and again, between two step annotations, at each
restart), so no traced step decodes past the shape's budget and every traced step runs the same program on the
same buffers. The copies run outside the step annotations; the analysis does not count them.

The engine's state: `prompt_decode_steps` prefills a real prompt (the sweep's exact-size chat prompt, from
`bench.sweep.local.build_prompts`) the way `Engine.generate` does (same padding, same compiled prefill and decode programs
at the same (bucket, max_new_tokens) shape), so a profile at n input tokens decodes after the sweep cell's prompt.

Compatibility: `jax.profiler.start_trace(log_dir, profiler_options=...)`, `stop_trace()`, `ProfileOptions` (with
`host_tracer_level`, `python_tracer_level`, `enable_hlo_proto`) and `StepTraceAnnotation` exist in jax 0.11.0 and
0.12; both write `<log_dir>/plugins/profile/<session>/<host>.xplane.pb`. Options an older jax lacks are skipped and
reported in `CaptureResult.profile_options`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import InputError

STEP_ANNOTATION = "decode"
"""The name of the `StepTraceAnnotation` around each traced step; `bench.profile.analysis` finds the steps by it."""
_COMMAND_BUFFER_FLAG = "--xla_gpu_enable_command_buffer"


@dataclass(frozen=True)
class CaptureResult:
    """What one capture produced.

    xplane_path: the trace file (`*.xplane.pb`) this capture wrote.
    xplane_bytes: its size in bytes.
    n_steps / warmup: traced steps and untimed steps run before tracing.
    restart_every: traced steps between two restarts from the post-warm-up state (None: never restarted);
    restarts: how many times the traced steps restarted from it (0 when `n_steps <= restart_every`).
    step_wall_ms: wall time of each traced step in milliseconds (monotonic clock, read after the step's result was
        ready; includes profiler overhead, so it is slower than an untraced step).
    wall_ms_per_step: the median of `step_wall_ms`.
    xla_flags: the XLA_FLAGS environment value in force (empty string when unset).
    profile_options: the profiler options applied, by name; an option this jax lacks maps to None.
    platform / device_kind: the default device, e.g. "cpu"/"cpu" or "gpu"/"NVIDIA L4".
    jax_version: `jax.__version__`.
    final_state: the state after the last traced step (not compared, not printed).
    """

    xplane_path: Path
    xplane_bytes: int
    n_steps: int
    warmup: int
    step_wall_ms: tuple[float, ...]
    wall_ms_per_step: float
    xla_flags: str
    profile_options: dict[str, Any]
    platform: str
    device_kind: str
    jax_version: str
    restart_every: int | None = None
    restarts: int = 0
    final_state: Any = field(default=None, compare=False, repr=False)


def gpu_profile_flags() -> tuple[str, ...]:
    """XLA_FLAGS to add when profiling on an NVIDIA GPU: command buffers (CUDA graphs) off, for per-op attribution.

    They must be in the environment before the jax backend initialises; see `apply_gpu_profile_flags`.
    """
    return (f"{_COMMAND_BUFFER_FLAG}=",)


def merge_xla_flags(existing: str, extra: tuple[str, ...]) -> str:
    """`existing` XLA_FLAGS with each flag of `extra` added, replacing any earlier value of the same flag."""
    names = {flag.split("=", 1)[0] for flag in extra}
    kept = [flag for flag in existing.split() if flag.split("=", 1)[0] not in names]
    return " ".join(kept + list(extra))


def apply_gpu_profile_flags(environ: dict[str, str] | None = None) -> str:
    """Put `gpu_profile_flags()` into XLA_FLAGS of `environ` (default `os.environ`) and return the new value.

    Raises RuntimeError when a jax backend is already initialised in this process: XLA would ignore the flags.
    """
    env = os.environ if environ is None else environ
    if environ is None and _backend_initialised():
        raise RuntimeError("XLA_FLAGS must be set before jax initialises its backend; set them at process start")
    env["XLA_FLAGS"] = merge_xla_flags(env.get("XLA_FLAGS", ""), gpu_profile_flags())
    return env["XLA_FLAGS"]


def _backend_initialised() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import (
        xla_bridge,  # private, but present with this name in jax 0.11 and 0.12
    )

    check = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(check()) if check is not None else True


def prompt_decode_steps(engine, prompt_ids: Sequence[int], max_new_tokens: int) -> tuple[Any, Callable[[Any], Any]]:
    """(state, step) for tracing decode alone after a real prompt: `Engine.step_fn` (a greedy prefill of
    `prompt_ids` padded to its bucket exactly as `Engine.generate` does, then one greedy decode step per call), so
    the traced steps are the sweep's compiled programs. Raises EngineError for a prompt no bucket holds or a shape
    past the model's positions."""
    return engine.step_fn(prompt_ids, max_new_tokens)


def batch_decode_steps(engine, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[Any, Callable[[Any], Any]]:
    """`prompt_decode_steps` for a batch (`bench profile --batch B`): `Engine.step_fn_batch` (the greedy batch
    prefill of the B `prompts`, padded as `Engine.generate_batch` pads them, then one greedy decode step of every
    row per call), so the traced steps are the programs of the sweep's batch cell. Raises EngineError as
    `generate_batch` (a batch that does not fit in memory included)."""
    return engine.step_fn_batch(prompts, max_new_tokens)


def _profile_options(python_tracer: bool, host_tracer_level: int) -> tuple[Any, dict[str, Any]]:
    """A `jax.profiler.ProfileOptions` (or None on a jax without it) and what was set on it."""
    import jax

    wanted = {
        "host_tracer_level": host_tracer_level,
        "python_tracer_level": 1 if python_tracer else 0,
        "enable_hlo_proto": True,
    }
    options_cls = getattr(jax.profiler, "ProfileOptions", None)
    if options_cls is None:
        return None, {name: None for name in wanted}
    options = options_cls()
    applied: dict[str, Any] = {}
    for name, value in wanted.items():
        try:
            setattr(options, name, value)
            applied[name] = value
        except (AttributeError, TypeError):
            applied[name] = None
    return options, applied


def _traces_under(trace_dir: Path) -> set[Path]:
    return set(trace_dir.rglob("*.xplane.pb")) if trace_dir.exists() else set()


def capture_steps(
    step_fn: Callable[[Any], Any],
    state: Any,
    n_steps: int,
    trace_dir: str | os.PathLike,
    *,
    warmup: int = 2,
    python_tracer: bool = False,
    host_tracer_level: int = 1,
    restart_every: int | None = None,
) -> CaptureResult:
    """Run `warmup` untimed steps, then trace exactly `n_steps` calls of `state = step_fn(state)`.

    Each traced call sits inside `StepTraceAnnotation("decode", step_num=i)` (i = 0..n_steps-1) and is blocked on
    (`jax.block_until_ready`) before the annotation closes. With `restart_every` = K, traced step i runs on the
    state reached after the warm-up and i mod K further steps: after every K traced steps the state is replaced,
    between annotations, by a fresh copy of the post-warm-up state (see the module doc; `step_fn` may donate its
    state). The trace goes under `trace_dir` (jax's layout: `plugins/profile/<session>/<host>.xplane.pb`).
    Raises InputError for `n_steps < 1`, `warmup < 0` or `restart_every < 1`.
    """
    _check_capture(n_steps, warmup, restart_every)
    import jax

    for _ in range(warmup):
        state = jax.block_until_ready(step_fn(state))
    restarting = restart_every is not None and n_steps > restart_every
    start_state = _copy_state(state) if restarting else None  # before tracing: the original may be donated

    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    before = _traces_under(trace_dir)
    options, applied = _profile_options(python_tracer, host_tracer_level)
    state, step_ms, restarts = _traced_steps(step_fn, state, n_steps, trace_dir, options, start_state=start_state,
                                             restart_every=restart_every if restarting else None)  # fmt: skip
    new = sorted(_traces_under(trace_dir) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise RuntimeError(f"jax.profiler wrote no *.xplane.pb under {trace_dir}")
    xplane = new[-1]
    device = jax.devices()[0]
    return CaptureResult(
        xplane_path=xplane,
        xplane_bytes=xplane.stat().st_size,
        n_steps=n_steps,
        warmup=warmup,
        step_wall_ms=tuple(step_ms),
        wall_ms_per_step=statistics.median(step_ms),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        profile_options=applied,
        platform=device.platform,
        device_kind=getattr(device, "device_kind", device.platform),
        jax_version=jax.__version__,
        restart_every=restart_every,
        restarts=restarts,
        final_state=state,
    )


def _check_capture(n_steps: int, warmup: int, restart_every: int | None) -> None:
    """InputError (one line) for `capture_steps` arguments it cannot run: n_steps < 1, warmup < 0,
    restart_every < 1 (each a whole number; restart_every may be None)."""
    if not isinstance(n_steps, int) or n_steps < 1:
        raise InputError(f"--steps {n_steps}: expected a whole number of decode steps >= 1")
    if not isinstance(warmup, int) or warmup < 0:
        raise InputError(f"warmup {warmup}: expected a whole number >= 0")
    if restart_every is not None and (not isinstance(restart_every, int) or restart_every < 1):
        raise InputError(f"restart_every {restart_every}: expected a whole number of steps >= 1, or None")


def _traced_steps(step_fn: Callable[[Any], Any], state: Any, n_steps: int, trace_dir: Path, options: Any, *,
                  start_state: Any, restart_every: int | None) -> tuple[Any, list[float], int]:  # fmt: skip
    """`capture_steps`' traced part: the profiler started into `trace_dir` (with `options`, None: jax's defaults),
    `n_steps` calls of `step_fn` each in its step annotation and blocked on, the state replaced by a copy of
    `start_state` between annotations every `restart_every` steps (None: never), the profiler stopped whatever
    happens. Returns (the last state, each step's wall time in ms, the restarts)."""
    import jax

    if options is None:
        jax.profiler.start_trace(str(trace_dir))
    else:
        jax.profiler.start_trace(str(trace_dir), profiler_options=options)
    step_ms: list[float] = []
    restarts = 0
    try:
        for i in range(n_steps):
            if restart_every is not None and i > 0 and i % restart_every == 0:  # between two annotations: not counted
                state, restarts = _copy_state(start_state), restarts + 1
            with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=i):
                t0 = time.perf_counter()
                state = jax.block_until_ready(step_fn(state))
                step_ms.append((time.perf_counter() - t0) * 1e3)
    finally:
        jax.profiler.stop_trace()
    return state, step_ms, restarts


def _copy_state(state: Any) -> Any:
    """A copy of every array leaf of `state` in new device buffers, ready (blocked on) when returned."""
    import jax
    import jax.numpy as jnp

    return jax.block_until_ready(jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), state))
