"""How the engine's programs are compiled: `program`, `jax.jit` per backend and XLA options an engine chooses.

An engine decides once, when it is made, which backend its programs trace with (`model.backends`: the pure-JAX
"jax" by default) and which XLA options its decode programs compile with (`model.backends.BackendPlan.xla_options`:
None, XLA's defaults, unless the "cpu-kernels" backend asks for its pass option), and passes both to every call of
a program (`model.engine`'s prefill, host-loop step and device loop, `model.slots`' steps). The run's manifest
records both (`EngineConfig.backend`, `EngineConfig.xla_options`), so they enter the build id. `CompileCounter`
counts every trace and compile of them (and of any jitted function) in the process. Importing this module starts
no backend.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

import jax

from model.backends import compiler_options, using


class CompileCounter:
    """Counts jit traces, backend compiles and persistent-cache hits/misses process-wide (jax.monitoring).

    `traces` grows by one for every program jax had to (re)trace, i.e. every jit cache miss; a timed region
    whose `traces` did not change compiled nothing.
    """

    _lock = threading.Lock()
    _installed = False
    traces = 0
    backend_compiles = 0
    cache_hits = 0
    cache_misses = 0

    @classmethod
    def install(cls) -> None:
        """Register the listeners once per process."""
        with cls._lock:
            if cls._installed:
                return
            from jax import monitoring

            def on_duration(name: str, _secs: float, **_kw) -> None:
                if name == "/jax/core/compile/jaxpr_trace_duration":
                    cls.traces += 1
                elif name == "/jax/core/compile/backend_compile_duration":
                    cls.backend_compiles += 1

            def on_event(name: str, **_kw) -> None:
                if name == "/jax/compilation_cache/cache_hits":
                    cls.cache_hits += 1
                elif name == "/jax/compilation_cache/cache_misses":
                    cls.cache_misses += 1

            monitoring.register_event_duration_secs_listener(on_duration)
            monitoring.register_event_listener(on_event)
            cls._installed = True

    @classmethod
    def snapshot(cls) -> dict[str, int]:
        """Current counts: traces, backend_compiles, cache_hits, cache_misses."""
        return {"traces": cls.traces, "backend_compiles": cls.backend_compiles,
                "cache_hits": cls.cache_hits, "cache_misses": cls.cache_misses}  # fmt: skip


def _per_backend(fun: Callable) -> Callable:
    """`fun` with one more keyword-only argument, `backend`, under which it traces (`model.backends.using`): jitted
    with `backend` static, each backend gets programs of its own. Keeps `fun`'s name (profiles and compile counts
    name programs by it)."""

    def traced(*args, backend: str, **kwargs):
        with using(backend):
            return fun(*args, **kwargs)

    functools.update_wrapper(traced, fun)
    sig = inspect.signature(fun)
    extra = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY)
    traced.__signature__ = sig.replace(parameters=[*sig.parameters.values(), extra])
    return traced


class Program:
    """A function jitted twice with the same `jit_kwargs` (static_argnames, donate_argnames, ...) and `backend` as
    one more static argument (`_per_backend`): plainly, and with the compiler options of the "cpu-kernels"
    backend's XLA:CPU pass option (`model.backends.compiler_options`, with the XLA_FLAGS in force when it is made).
    `program(..., xla_options=..., backend=...)` runs the one an engine's `xla_options` names (None: the plain one)
    traced as `backend` says. Raises TypeError at creation for `compiler_options` in `jit_kwargs` (this class sets
    them), and at a call without `xla_options` or `backend`; EngineError for an unknown backend."""

    def __init__(self, fun: Callable, jit_kwargs: dict[str, Any]):
        if "compiler_options" in jit_kwargs:
            raise TypeError("Program sets compiler_options itself")
        jit_kwargs = {**jit_kwargs, "static_argnames": (*jit_kwargs.get("static_argnames", ()), "backend")}
        traced = _per_backend(fun)
        self._plain = jax.jit(traced, **jit_kwargs)
        self._cpu = jax.jit(traced, compiler_options=compiler_options(), **jit_kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args, xla_options: str | None, backend: str, **kwargs):
        """The jitted function's result for `args`, `kwargs`, compiled as `xla_options` says and traced as
        `backend` says (see the class)."""
        return (self._plain if xla_options is None else self._cpu)(*args, backend=backend, **kwargs)


def program(**jit_kwargs) -> Callable[[Callable], Program]:
    """Decorator: `Program(fun, jit_kwargs)`, `jit_kwargs` as `jax.jit` takes them."""
    return lambda fun: Program(fun, jit_kwargs)


__all__ = ["CompileCounter", "Program", "program"]
