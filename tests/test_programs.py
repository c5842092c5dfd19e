"""model/programs.py: the decode programs' XLA options on CPU (the tree-reduction pass off), how an engine decides
them once and records them (the manifest's `EngineConfig.xla_options`, in the build id), and their switch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import engine as engine_module
from model import slots as slots_module
from model.errors import EngineError
from model.programs import (CPU_COMPILER_OPTIONS_TEXT, ENV_SWITCH, Program, _cpu_compiler_options, program,
                            xla_options, xla_options_line)  # fmt: skip


def _norm(x_BD: jax.Array) -> jax.Array:
    return x_BD * jax.lax.rsqrt(jnp.mean(x_BD * x_BD, axis=-1, keepdims=True) + 1e-6)


def _compiled_text(jitted, x) -> str:
    return jitted.lower(x).compile().as_text()


def test_the_cpu_variant_compiles_a_long_sum_without_the_reduce_window_rewrite() -> None:
    prog = Program(_norm, {})
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 256)), jnp.float32)
    assert "reduce-window" in _compiled_text(prog._plain, x)  # XLA's default: pairwise sums in windows of 32
    assert "reduce-window" not in _compiled_text(prog._cpu, x)
    np.testing.assert_allclose(np.asarray(prog(x, xla_options=CPU_COMPILER_OPTIONS_TEXT)),
                               np.asarray(jax.jit(_norm)(x)), rtol=1e-6)  # fmt: skip


def test_a_call_runs_the_variant_its_options_name() -> None:
    def norm(x_BD):  # its own function: jit caches are per function
        return _norm(x_BD)

    prog = program()(norm)
    x = jnp.ones((1, 64), jnp.float32)
    prog(x, xla_options=None)
    assert prog._plain._cache_size() == 1 and prog._cpu._cache_size() == 0
    prog(x, xla_options=CPU_COMPILER_OPTIONS_TEXT)
    assert prog._cpu._cache_size() == 1


def test_the_switch_and_the_backend_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    assert xla_options("cpu") == CPU_COMPILER_OPTIONS_TEXT and xla_options("gpu") is None
    for off in ("0", "off", "False", " no "):
        monkeypatch.setenv(ENV_SWITCH, off)
        assert xla_options("cpu") is None
    monkeypatch.setenv(ENV_SWITCH, "disable")
    with pytest.raises(EngineError, match=f"{ENV_SWITCH}='disable': expected"):
        xla_options("cpu")
    assert "default passes" in xla_options_line(None, "cpu")
    assert CPU_COMPILER_OPTIONS_TEXT in xla_options_line(CPU_COMPILER_OPTIONS_TEXT, "cpu")
    assert xla_options_line(None, "tpu") is None


def test_passes_that_xla_flags_disable_stay_disabled() -> None:
    """A compiler option replaces XLA_FLAGS' value of the same option: the CPU variant carries both lists."""
    assert _cpu_compiler_options("") == {"xla_disable_hlo_passes": "tree_reduction_rewriter"}
    flags = "--xla_cpu_foo=1 --xla_disable_hlo_passes=a,tree_reduction_rewriter,b"
    assert _cpu_compiler_options(flags) == {"xla_disable_hlo_passes": "tree_reduction_rewriter,a,b"}


def test_jit_arguments_pass_through_and_compiler_options_are_refused() -> None:
    @program(static_argnames=("scale",), donate_argnames=("x",))
    def scaled(x, *, scale):
        return x * scale

    x = jnp.arange(4.0)
    y = scaled(x, scale=3, xla_options=None)
    assert x.is_deleted()  # donated
    np.testing.assert_array_equal(np.asarray(y), [0.0, 3.0, 6.0, 9.0])
    assert scaled.__name__ == "scaled"
    with pytest.raises(TypeError, match="compiler_options"):
        program(compiler_options={})(_norm)


def test_the_decode_programs_are_programs_and_prefill_is_plain() -> None:
    for prog in (engine_module._decode_program, engine_module._decode_loop_program, slots_module._slot_step_program):
        assert isinstance(prog, Program), prog
    for prog in (engine_module._prefill_program, engine_module._prefill_logits_program):
        assert not isinstance(prog, Program), prog


def test_an_engine_decides_once_and_the_manifest_records_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.runs.manifest import engine_config_of, payload_build_id
    from model.config import PRESETS
    from model.engine import Engine
    from model.params import init_params
    from model.policy import decide_policy

    cfg = PRESETS["tiny"]
    params = jax.tree_util.tree_map(jnp.asarray, init_params(cfg, seed=0))
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    on = Engine(params, cfg, decide_policy("float32"), buckets=(16,))
    monkeypatch.setenv(ENV_SWITCH, "0")
    off = Engine(params, cfg, decide_policy("float32"), buckets=(16,))
    assert on.xla_options == CPU_COMPILER_OPTIONS_TEXT and off.xla_options is None
    monkeypatch.setenv(ENV_SWITCH, "1")  # read when an engine is made, not at each call
    assert off.generate([2, 3, 4], 6).token_ids == on.generate([2, 3, 4], 6).token_ids
    a, b = engine_config_of(on), engine_config_of(off)
    assert (a.xla_options, b.xla_options) == (CPU_COMPILER_OPTIONS_TEXT, None)
    assert payload_build_id(a, "h") != payload_build_id(b, "h")
