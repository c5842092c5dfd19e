"""model/programs.py and model/backends/cpu/xla.py: programs per backend (each traces as its backend says), the
decode programs' XLA options of the cpu-kernels backend (the tree-reduction pass off), how an engine decides them
once and records them (the manifest's `EngineConfig.xla_options` and `backend`, in the build id), and their
switch. The pure-JAX default compiles every program with XLA's defaults."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import backends
from model import engine as engine_module
from model import slots as slots_module
from model.backends.cpu.xla import CPU_COMPILER_OPTIONS_TEXT, ENV_SWITCH, compiler_options, xla_options
from model.errors import EngineError
from model.programs import Program, program


def _norm(x_BD: jax.Array) -> jax.Array:
    return x_BD * jax.lax.rsqrt(jnp.mean(x_BD * x_BD, axis=-1, keepdims=True) + 1e-6)


def _compiled_text(jitted, x) -> str:
    return jitted.lower(x, backend="jax").compile().as_text()


def test_the_cpu_variant_compiles_a_long_sum_without_the_reduce_window_rewrite() -> None:
    prog = Program(_norm, {})
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 256)), jnp.float32)
    assert "reduce-window" in _compiled_text(prog._plain, x)  # XLA's default: pairwise sums in windows of 32
    assert "reduce-window" not in _compiled_text(prog._cpu, x)
    np.testing.assert_allclose(np.asarray(prog(x, xla_options=CPU_COMPILER_OPTIONS_TEXT, backend="jax")),
                               np.asarray(jax.jit(_norm)(x)), rtol=1e-6)  # fmt: skip


def test_a_call_runs_the_variant_its_options_name() -> None:
    def norm(x_BD):  # its own function: jit caches are per function
        return _norm(x_BD)

    prog = program()(norm)
    x = jnp.ones((1, 64), jnp.float32)
    prog(x, xla_options=None, backend="jax")
    assert prog._plain._cache_size() == 1 and prog._cpu._cache_size() == 0
    prog(x, xla_options=CPU_COMPILER_OPTIONS_TEXT, backend="jax")
    assert prog._cpu._cache_size() == 1
    prog(x, xla_options=None, backend=backends.CPU_KERNELS)  # another backend: a program of its own
    assert prog._plain._cache_size() == 2


def test_a_program_traces_as_its_backend_says() -> None:
    seen = []

    def probe(x):
        seen.append(backends.active())
        return x + 1

    prog = program()(probe)
    x = jnp.ones(3, jnp.float32)
    for backend in ("jax", backends.CPU_KERNELS, "jax"):  # the third call: jax's program, already traced
        prog(x, xla_options=None, backend=backend)
    assert seen == ["jax", backends.CPU_KERNELS] and backends.active() == "jax"
    with pytest.raises(EngineError, match="backend 'xla': expected one of jax, cpu-kernels"):
        prog(x, xla_options=None, backend="xla")
    with pytest.raises(TypeError):
        prog(x, xla_options=None)  # no backend: a program error


def test_the_switch_and_the_backend_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    def planned(backend: str) -> str | None:
        return backends.plan_backend(backend, "cpu", weight_dtype="float32", activation_dtype="float32",
                                     kv_dtype="float32").xla_options  # fmt: skip

    monkeypatch.delenv(ENV_SWITCH, raising=False)
    assert xla_options() == CPU_COMPILER_OPTIONS_TEXT and planned("jax") is None
    for off in ("0", "off", "False", " no "):
        monkeypatch.setenv(ENV_SWITCH, off)
        assert xla_options() is None
    monkeypatch.setenv(ENV_SWITCH, "disable")
    with pytest.raises(EngineError, match=f"{ENV_SWITCH}='disable': expected"):
        xla_options()
    with pytest.raises(EngineError, match=f"{ENV_SWITCH}='disable': expected"):
        backends.check_switches()
    assert backends.xla_options_line(None, "cpu") == "XLA:CPU decode programs compiled with XLA's default passes"
    assert CPU_COMPILER_OPTIONS_TEXT in backends.xla_options_line(CPU_COMPILER_OPTIONS_TEXT, "cpu")
    assert backends.xla_options_line(CPU_COMPILER_OPTIONS_TEXT, "tpu") is None


def test_passes_that_xla_flags_disable_stay_disabled() -> None:
    """A compiler option replaces XLA_FLAGS' value of the same option: the CPU variant carries both lists."""
    assert compiler_options("") == {"xla_disable_hlo_passes": "tree_reduction_rewriter"}
    flags = "--xla_cpu_foo=1 --xla_disable_hlo_passes=a,tree_reduction_rewriter,b"
    assert compiler_options(flags) == {"xla_disable_hlo_passes": "tree_reduction_rewriter,a,b"}


def test_jit_arguments_pass_through_and_compiler_options_are_refused() -> None:
    @program(static_argnames=("scale",), donate_argnames=("x",))
    def scaled(x, *, scale):
        return x * scale

    x = jnp.arange(4.0)
    y = scaled(x, scale=3, xla_options=None, backend="jax")
    assert x.is_deleted()  # donated
    np.testing.assert_array_equal(np.asarray(y), [0.0, 3.0, 6.0, 9.0])
    assert scaled.__name__ == "scaled"
    with pytest.raises(TypeError, match="compiler_options"):
        program(compiler_options={})(_norm)


def test_the_engines_programs_are_programs() -> None:
    """Every program an engine runs takes its backend (prefill too: its products take the backend's forms); the
    engine passes prefill no XLA options (the pass stays on there: model/backends/cpu/xla.py)."""
    for prog in (engine_module._decode_program, engine_module._decode_loop_program, slots_module._slot_step_program,
                 slots_module._slot_rows_step_program, engine_module._prefill_program,
                 engine_module._prefill_logits_program):  # fmt: skip
        assert isinstance(prog, Program), prog


def test_an_engine_decides_once_and_the_manifest_records_it(cpu_kernels_built, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.runs.manifest import EngineConfig, engine_config_of, payload_build_id
    from model.config import PRESETS
    from model.engine import Engine
    from model.params import init_params
    from model.policy import decide_policy, with_backend

    cfg = PRESETS["tiny"]
    params = jax.tree_util.tree_map(jnp.asarray, init_params(cfg, seed=0))
    kernels = with_backend(decide_policy("float32"), backends.CPU_KERNELS)
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    plain = Engine(params, cfg, decide_policy("float32"), buckets=(16,))  # the default: pure JAX, XLA's passes
    on = Engine(params, cfg, kernels, buckets=(16,))
    monkeypatch.setenv(ENV_SWITCH, "0")
    off = Engine(params, cfg, kernels, buckets=(16,))
    assert (plain.backend, plain.xla_options, plain.cpu_kernel) == ("jax", None, None)
    assert on.xla_options == CPU_COMPILER_OPTIONS_TEXT and off.xla_options is None
    monkeypatch.setenv(ENV_SWITCH, "1")  # read when an engine is made, not at each call
    want = plain.generate([2, 3, 4], 6).token_ids
    assert off.generate([2, 3, 4], 6).token_ids == on.generate([2, 3, 4], 6).token_ids == want
    a, b, c = engine_config_of(on), engine_config_of(off), engine_config_of(plain)
    assert (a.xla_options, b.xla_options, c.xla_options) == (CPU_COMPILER_OPTIONS_TEXT, None, None)
    assert (a.backend, b.backend, c.backend) == (backends.CPU_KERNELS, backends.CPU_KERNELS, "jax")
    assert len({payload_build_id(x, "h") for x in (a, b, c)}) == 3
    assert "backend" not in EngineConfig().to_dict()  # a manifest from before the backend: its payload as written
