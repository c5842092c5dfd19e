"""model/programs.py: the decode programs' XLA options on CPU (the tree-reduction pass off), their switch, and that
they change how a program is compiled, not what it computes beyond the order of a sum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.programs import CPU_COMPILER_OPTIONS, ENV_SWITCH, Program, compiler_options_line, cpu_options_on, program


def _norm(x_BD: jax.Array) -> jax.Array:
    return x_BD * jax.lax.rsqrt(jnp.mean(x_BD * x_BD, axis=-1, keepdims=True) + 1e-6)


def _compiled_text(jitted, x) -> str:
    return jitted.lower(x).compile().as_text()


def test_the_cpu_variant_compiles_a_long_sum_without_the_reduce_window_rewrite() -> None:
    prog = Program(_norm, {})
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 256)), jnp.float32)
    assert "reduce-window" in _compiled_text(prog._plain, x)  # XLA's default: pairwise sums in windows of 32
    assert "reduce-window" not in _compiled_text(prog._cpu, x)
    np.testing.assert_allclose(np.asarray(prog(x)), np.asarray(jax.jit(_norm)(x)), rtol=1e-6)


def test_the_switch_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def norm(x_BD):  # its own function: jit caches are per function
        return _norm(x_BD)

    prog = program()(norm)
    x = jnp.ones((1, 64), jnp.float32)
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert not cpu_options_on()
    prog(x)
    assert prog._plain._cache_size() == 1 and prog._cpu._cache_size() == 0
    assert "default passes" in compiler_options_line()
    monkeypatch.setenv(ENV_SWITCH, "1")
    assert cpu_options_on()
    prog(x)
    assert prog._cpu._cache_size() == 1
    line = compiler_options_line()
    assert all(f"{k}={v}" in line for k, v in CPU_COMPILER_OPTIONS.items())


def test_jit_arguments_pass_through() -> None:
    @program(static_argnames=("scale",), donate_argnames=("x",))
    def scaled(x, *, scale):
        return x * scale

    x = jnp.arange(4.0)
    y = scaled(x, scale=3)
    assert x.is_deleted()  # donated
    np.testing.assert_array_equal(np.asarray(y), [0.0, 3.0, 6.0, 9.0])
    assert scaled.__name__ == "scaled"
