"""The engine's CPU kernels for bfloat16 weights (model/backends/cpu/kernels.py, cpu_bf16.cc; the opt-in
"cpu-kernels" backend): their products against XLA's float32 product of the same (widened) weights, the build's
refusals, `model.quant.matmul` taking them only under that backend, `--backend` on the command line, and an engine
that uses them (the pure-JAX engine's greedy tokens)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import backends, quant
from model.backends.cpu import kernels as cpu
from model.errors import EngineError

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU kernels")


def _weights(rng, n, k):
    return jnp.asarray(rng.standard_normal((n, k)), jnp.float32).astype(jnp.bfloat16)


def _operands(rng, rows, k, n, axis):
    """(x [rows, K] float32, w [N, K] bfloat16, the weight as `matvec` takes it along `axis`), random normal."""
    x_RK = jnp.asarray(rng.standard_normal((rows, k)), jnp.float32)
    w_NK = _weights(rng, n, k)
    return x_RK, w_NK, (w_NK if axis == 1 else jnp.array(w_NK.T, copy=True))


@pytest.mark.parametrize("rows, k, n", [(1, 256, 4096), (1, 2048, 256), (3, 100, 37), (9, 300, 70), (16, 1024, 300),
                                          (32, 256, 512), (1, 64, 70000), (64, 520, 131), (12, 10240, 9)])
@pytest.mark.parametrize("axis", [1, 0])
def test_matvec_equals_the_float32_product_of_the_widened_weight(cpu_kernels_built, rows, k, n, axis):
    rng = np.random.default_rng(rows * 7 + k + n)
    x_RK = jnp.asarray(rng.standard_normal((rows, k)), jnp.float32)
    w_NK = _weights(rng, n, k)
    w = w_NK if axis == 1 else jnp.array(w_NK.T, copy=True)
    got = jax.jit(lambda x, w: cpu.matvec(x, w, axis))(x_RK, w)
    want = np.asarray(x_RK, np.float64) @ np.asarray(w_NK.astype(jnp.float32), np.float64).T
    assert got.shape == (rows, n) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5 * np.sqrt(k))


@pytest.mark.parametrize("rows, k, n", [(16, 256, 32), (17, 256, 300), (41, 2048, 256), (64, 256, 2048),
                                          (128, 4096, 64), (130, 96, 8192), (33, 1024, 31), (300, 64, 70)])
@pytest.mark.parametrize("axis", [1, 0])
def test_many_rows_of_a_contraction_in_32s_equal_the_float32_product(cpu_kernels_built, rows, k, n, axis):
    """Shapes the AMX tiles take where the CPU has them (at least `amx_min_rows` rows, K a multiple of 32; columns
    past the last multiple of 32, and fewer than 32, by the other loops): ragged rows, a leftover of columns, long
    and short contractions, more rows than one block of 256. Elsewhere the same shapes check the AVX-512 loops."""
    x_RK, w_NK, w = _operands(np.random.default_rng(rows * 13 + k + n), rows, k, n, axis)
    got = np.asarray(jax.jit(lambda x, w: cpu.matvec(x, w, axis))(x_RK, w))
    want = np.asarray(x_RK, np.float64) @ np.asarray(w_NK.astype(jnp.float32), np.float64).T
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.sqrt(k))


@pytest.mark.parametrize("rows", [15, 16])  # the loops, and the AMX tiles where the CPU has them
@pytest.mark.parametrize("axis", [1, 0])
def test_infinities_nans_and_an_empty_contraction_come_out_as_float32_products_do(cpu_kernels_built, rows, axis):
    """An infinite activation gives infinities (NaN where it meets a zero weight), a NaN gives NaN, on either path;
    a contraction of length 0 gives zeros (it divided by zero on the tiles once)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    x[3, :], x[3, 5], x[4, 7] = 0.0, np.inf, np.nan
    w_NK = rng.standard_normal((40, 64)).astype(np.float32)
    w_NK[:, 5], w_NK[0, 5] = 1.0, 0.0
    w = jnp.asarray(w_NK if axis == 1 else w_NK.T.copy()).astype(jnp.bfloat16)
    got = np.asarray(jax.jit(lambda x, w: cpu.matvec(x, w, axis))(jnp.asarray(x), w))
    assert np.isnan(got[3, 0]) and np.all(got[3, 1:] == np.inf)  # inf x 0 is NaN, inf x 1 is inf
    assert np.all(np.isnan(got[4])) and np.all(np.isfinite(np.delete(got, [3, 4], axis=0)))
    empty = jnp.zeros((rows, 0), jnp.float32)
    w_empty = jnp.zeros((40, 0) if axis == 1 else (0, 40), jnp.bfloat16)
    assert np.array_equal(np.asarray(cpu.matvec(empty, w_empty, axis)), np.zeros((rows, 40), np.float32))


@pytest.mark.parametrize("axis", [1, 0])
def test_amx_rows_are_the_sums_of_other_amx_calls_to_the_bit(cpu_kernels_built, axis):
    """On AMX tiles each output is summed in an order that depends on neither the other rows nor their number: a
    call of 64 rows equals calls of 16, 17 and 31 rows to the bit (the same rows; 16 is `amx_min_rows`)."""
    if cpu.amx_min_rows() == 0:
        pytest.skip("no AMX tiles here")
    x_RK, _, w = _operands(np.random.default_rng(12), 64, 512, 200, axis)
    run = jax.jit(lambda x, w: cpu.matvec(x, w, axis))
    whole = np.asarray(run(x_RK, w))
    parts = np.concatenate([np.asarray(run(x_RK[a:b], w)) for a, b in ((0, 16), (16, 33), (33, 64))])
    assert np.array_equal(whole, parts)


@pytest.mark.parametrize("axis", [1, 0])
def test_matvec_rows_are_the_sums_of_fewer_rows_to_the_bit(cpu_kernels_built, axis):
    """Many rows run other loops than few (output-major: tiles of weight rows by activation rows where the CPU has
    AVX-512; input-major: eight weight rows per pass), each output still summed in the same order: a call of 64
    rows equals, bit for bit, calls of 4 rows (one weight row at a time) and, input-major, of 1 row. (K = 520 is
    not a multiple of 32, so no call here runs on AMX tiles.)"""
    x_RK, _, w = _operands(np.random.default_rng(11), 64, 520, 131, axis)
    run = jax.jit(lambda x, w: cpu.matvec(x, w, axis))
    whole = np.asarray(run(x_RK, w))
    fours = np.concatenate([np.asarray(run(x_RK[r : r + 4], w)) for r in range(0, 64, 4)])
    assert np.array_equal(whole, fours)
    if axis == 0:
        ones = np.concatenate([np.asarray(run(x_RK[r : r + 1], w)) for r in range(64)])
        assert np.array_equal(whole, ones)


def test_rows_up_to_max_rows_take_the_kernel_and_more_are_widened(cpu_kernels_built):
    """33-64 rows take `matvec` only where the kernel has tiles (AVX-512), any number where it has AMX tiles;
    `max_rows` says which, and 1 more row than it is widened for XLA's dot."""
    if cpu.amx_min_rows() > 0:
        assert cpu.amx_min_rows() == 16 and cpu.max_rows() == cpu.MAX_ROWS_WITH_AMX
    else:
        assert cpu.max_rows() == (cpu.MAX_ROWS if cpu.tile_rows() > 0 else cpu.MAX_ROWS_WITHOUT_TILES)
    w = _weights(np.random.default_rng(3), 640, 256)  # [N, K]: output-major

    def targets(rows: int) -> str:
        x = jnp.ones((1, rows, 256), jnp.float32)
        with backends.using(backends.CPU_KERNELS):
            return _ffi_targets(lambda x, w: quant.matmul(x, w, "BTD,XD->BTX"), x, w)

    most = min(cpu.max_rows(), 128)  # a prefill chunk
    assert "gemma4_bf16_matvec_nk" in targets(most) and "gemma4_bf16_to_f32" not in targets(most)
    if cpu.amx_min_rows() == 0:
        assert "gemma4_bf16_to_f32" in targets(cpu.max_rows() + 1)


def test_the_amx_switch_turns_the_tiles_off_and_the_rows_fall_back(cpu_kernels_built):
    """`GEMMA4_BENCH_CPU_AMX=off` (read once per process): no AMX tiles, so `max_rows` is the AVX-512 loops' and
    the manifest's kernel name is the plain one. Before the kernels load, a fresh process reports no tiles."""
    code = ("from model.backends.cpu import kernels as cpu; "
            "before = (cpu.tile_rows(), cpu.amx_min_rows()); ok, _ = cpu.availability(); "
            "print(*before, ok, cpu.tile_rows(), cpu.amx_min_rows(), cpu.max_rows(), "
            "cpu.bf16_kernel_name())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, cpu.AMX_SWITCH: "off", "JAX_PLATFORMS": "cpu"}).stdout.split()  # fmt: skip
    rows = cpu.MAX_ROWS if cpu.tile_rows() > 0 else cpu.MAX_ROWS_WITHOUT_TILES
    assert out == ["0", "0", "True", str(cpu.tile_rows()), "0", str(rows), "bf16=cpu"]


def test_to_float32_is_exact(cpu_kernels_built):
    w = _weights(np.random.default_rng(0), 513, 77)
    got = jax.jit(cpu.to_float32)(w)
    assert got.dtype == jnp.float32 and np.array_equal(np.asarray(got), np.asarray(w.astype(jnp.float32)))


def test_the_kernels_map_under_vmap(cpu_kernels_built):
    rng = np.random.default_rng(5)
    x_BRK = jnp.asarray(rng.standard_normal((3, 2, 256)), jnp.float32)
    w_NK = _weights(rng, 96, 256)
    got = jax.jit(jax.vmap(lambda x: cpu.matvec(x, w_NK, 1)))(x_BRK)  # a batch of activations, one weight
    want = np.stack([np.asarray(cpu.matvec(x, w_NK, 1)) for x in x_BRK])
    assert got.shape == (3, 2, 96) and np.array_equal(np.asarray(got), want)
    w_BNK = jnp.stack([w_NK, _weights(rng, 96, 256)])  # a batch of weights too
    got = jax.vmap(lambda x, w: cpu.matvec(x, w, 1))(x_BRK[:2], w_BNK)
    assert np.array_equal(np.asarray(got[1]), np.asarray(cpu.matvec(x_BRK[1], w_BNK[1], 1)))
    widened = jax.vmap(cpu.to_float32)(w_BNK)
    assert np.array_equal(np.asarray(widened), np.asarray(w_BNK.astype(jnp.float32)))


def _ffi_targets(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


@pytest.mark.parametrize("spec, x_shape, w_shape, taken", [
    ("BTD,DX->BTX", (1, 1, 256), (256, 640), "gemma4_bf16_matvec_kn"),  # input-major, one decode row
    ("BTF,DF->BTD", (2, 1, 512), (256, 512), "gemma4_bf16_matvec_nk"),  # output-major, a batch of 2 rows
    ("BTD,DX->BTX", (1, 65, 256), (256, 640), "gemma4_bf16_to_f32"),  # past MAX_ROWS: widened once, XLA's dot
])  # fmt: skip
def test_matmul_takes_the_kernels_for_bfloat16_weights_under_their_backend_only(cpu_kernels_built, spec, x_shape,
                                                                               w_shape, taken):  # fmt: skip
    if taken == "gemma4_bf16_to_f32" and cpu.amx_min_rows() > 0:
        taken = "gemma4_bf16_matvec_kn"  # with AMX tiles no weight is widened
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32).astype(jnp.bfloat16)
    want = jnp.einsum(spec, x, w.astype(jnp.float32))
    with backends.using(backends.CPU_KERNELS):
        got = jax.jit(lambda x, w: quant.matmul(x, w, spec))(x, w)
        assert taken in _ffi_targets(lambda x, w: quant.matmul(x, w, spec), x, w)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-4)
    # the default backend, pure JAX: XLA's product, no custom call
    assert "gemma4_bf16" not in _ffi_targets(lambda x, w: quant.matmul(x, w, spec), x, w)


def test_float32_weights_never_take_the_kernels(cpu_kernels_built):
    x = jnp.ones((1, 1, 256), jnp.float32)
    w = jnp.ones((256, 640), jnp.float32)
    with backends.using(backends.CPU_KERNELS):
        assert "gemma4_bf16" not in _ffi_targets(lambda x, w: quant.matmul(x, w, "BTD,DX->BTX"), x, w)


def test_without_a_compiler_the_build_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "no-such-compiler-gemma4")
    lib, why = cpu._build(tmp_path)
    assert lib is None and "no C++ compiler" in why and "no-such-compiler-gemma4" in why


def test_a_failing_compile_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "false")  # a "compiler" that exits 1
    lib, why = cpu._build(tmp_path)
    assert lib is None and "failed on cpu_bf16.cc" in why
    assert not list(tmp_path.rglob("*.so"))


def test_the_plan_applies_the_kernels_to_bfloat16_weights_under_float32_on_cpu_only(cpu_kernels_built):
    assert not cpu.plan(weight_dtype="float32", activation_dtype="float32", kv_dtype="float32").bf16
    on = cpu.plan(weight_dtype="bfloat16", activation_dtype="float32", kv_dtype="float32")
    assert on.bf16 and on.kernel == f"{cpu.bf16_kernel_name()} {cpu.ATTENTION_KERNEL}"
    assert any("CPU kernels" in line for _, line in on.lines)
    with pytest.raises(EngineError, match="^--backend cpu-kernels: the engine's CPU kernels run on the CPU platform"):
        backends.plan_backend(backends.CPU_KERNELS, "gpu", weight_dtype="bfloat16", activation_dtype="float32",
                              kv_dtype="float32")  # fmt: skip
    # the pure-JAX engine with bfloat16 weights under float32: XLA widens them; the warning names the option
    plain = backends.plan_backend("jax", "cpu", weight_dtype="bfloat16", activation_dtype="float32", kv_dtype="float32")
    assert plain.kernel is None and plain.xla_options is None and not plain.output_major
    assert [level for level, _ in plain.lines] == ["warning"] and "8x slower" in plain.lines[0][1]
    assert "--backend cpu-kernels" in plain.lines[0][1]
    kernels = backends.plan_backend(backends.CPU_KERNELS, "cpu", weight_dtype="bfloat16", activation_dtype="float32",
                                    kv_dtype="float32")  # fmt: skip
    assert kernels.output_major and kernels.reads_visible_kv and kernels.kernel == on.kernel


def test_an_engine_with_bfloat16_weights_decodes_the_float32_engines_tokens(cpu_kernels_built, tmp_path):
    """The built-in checkpoint is stored in bfloat16, so float32 weights hold the same values: the kernels' engine
    (`--backend cpu-kernels`) must produce the pure-JAX float32 engine's greedy tokens, and so must the pure-JAX
    engine with bfloat16 weights (XLA widens them)."""
    from model.builtin import ensure_builtin
    from model.engine import load_engine
    from model.policy import decide_policy, with_backend

    path = ensure_builtin("tiny")
    prompt = [2, 17, 99, 5, 300, 41, 7, 8, 250, 3]
    f32, _ = load_engine(path, policy=decide_policy())
    bf16, _ = load_engine(path, policy=with_backend(decide_policy(weight_dtype="bfloat16"), backends.CPU_KERNELS))
    assert bf16.cpu_kernel == f"{cpu.bf16_kernel_name()} {cpu.ATTENTION_KERNEL}" and f32.cpu_kernel is None
    assert (f32.backend, bf16.backend) == ("jax", backends.CPU_KERNELS)
    assert isinstance(bf16.params.layers[0].qkv_DX, quant.OutputMajor)  # the kernels read [N, K]
    assert bf16.batch_copy_bytes == 0  # already transposed: a batch needs no second copy
    want = f32.generate(prompt, 12).token_ids
    assert bf16.generate(prompt, 12).token_ids == want
    assert bf16.generate(prompt, 12, decode_loop="device").token_ids == want
    assert bf16.generate_batch([prompt, prompt[:7]], 6).token_ids[0] == want[:6]
    xla, _ = load_engine(path, policy=decide_policy(weight_dtype="bfloat16"))
    assert xla.cpu_kernel is None and xla.generate(prompt, 12).token_ids == want


def test_a_resumed_sweep_takes_the_runs_weight_dtype_and_refuses_another():
    from pathlib import Path
    from types import SimpleNamespace

    from bench.errors import InputError
    from bench.runs import CheckpointFacts, EngineConfig, Manifest
    from bench.sweep.resume import SweepFlags, resume_options
    from model.engine_config import EngineConfig as Options

    def run(**engine):
        m = Manifest(engine=EngineConfig(**engine), checkpoint=CheckpointFacts(id="c", source="builtin:tiny"))
        return SimpleNamespace(path=Path("runs/x"), typed_manifest=m)

    def _resumed_weight_dtype(ran, weight_dtype):  # the weight dtype a resumed sweep runs with
        return resume_options(ran, SweepFlags(), Options.from_options(weight_dtype=weight_dtype))[1].weight_dtype

    bf16 = run(weight_dtype="bfloat16", compute_dtype="float32", kernel="bf16=cpu")
    assert _resumed_weight_dtype(bf16, None) == "bfloat16"
    assert _resumed_weight_dtype(bf16, "bfloat16") == "bfloat16"
    with pytest.raises(InputError, match="--weight-dtype float32 differs from the resumed run's bfloat16"):
        _resumed_weight_dtype(bf16, "float32")
    # the run's own, as it resolved it: an explicit weight dtype equal to the compute dtype is the policy's default
    assert _resumed_weight_dtype(run(weight_dtype="float32", compute_dtype="float32"), None) == "float32"
    assert _resumed_weight_dtype(run(), None) is None  # a run from before the flag


def test_the_manifest_names_the_w4_product_and_the_cpu_kernel_side_by_side():
    from types import SimpleNamespace

    from bench.runs import EngineConfig
    from bench.runs.manifest import cpu_kernel_of, engine_config_of, kernel_text, w4_kernel_of

    assert kernel_text("w4a16=xla", "bf16=cpu") == "w4a16=xla bf16=cpu" and kernel_text(None, None) is None
    assert (w4_kernel_of("w4a16=xla bf16=cpu"), cpu_kernel_of("w4a16=xla bf16=cpu")) == ("w4a16=xla", "bf16=cpu")
    assert (w4_kernel_of("bf16=cpu"), cpu_kernel_of("w4a16=pallas"), w4_kernel_of(None)) == (None, None, None)
    both = "w4a16=xla bf16=cpu attention=cpu"  # the CPU kernels' names, all of them
    assert (w4_kernel_of(both), cpu_kernel_of(both)) == ("w4a16=xla", "bf16=cpu attention=cpu")
    # the dense payload of a quantized bfloat16 run keeps its CPU kernel: quantization stays the only difference
    assert EngineConfig(quantization="w4", kernel="w4a16=xla bf16=cpu").dense().kernel == "bf16=cpu"
    assert EngineConfig(quantization="w4", kernel="w4a16=xla").dense().kernel is None
    policy = SimpleNamespace(weight_dtype="bfloat16", activation_dtype="float32", kv_dtype="float32",
                             compute_dtype="float32")  # fmt: skip
    engine = SimpleNamespace(buckets=(64,), max_length=64, policy=policy, quant=None, cpu_kernel="bf16=cpu",
                             kernel=SimpleNamespace(option="w4a16=xla", tiles=None))  # fmt: skip
    assert engine_config_of(engine).kernel == "w4a16=xla bf16=cpu"


def test_a_profile_joined_to_a_run_made_without_the_cpu_kernel_says_it_differs():
    from types import SimpleNamespace

    from bench.profile.command import run_mismatches as _run_mismatches
    from bench.runs import EngineConfig

    policy = SimpleNamespace(compute_dtype="float32", weight_dtype="bfloat16")
    quant = SimpleNamespace(canonical="none")

    def run(kernel):
        manifest = SimpleNamespace(checkpoint=SimpleNamespace(content_hash=None, id="x"), dtype_policy={},
                                   engine=EngineConfig(quantization="none", kernel=kernel))  # fmt: skip
        return SimpleNamespace(typed_manifest=manifest)

    def setup(cpu_kernel):
        return SimpleNamespace(engine=SimpleNamespace(policy=policy, quant=quant, kernel=None, cpu_kernel=cpu_kernel),
                               content_hash=None, ckpt="x")  # fmt: skip

    assert any("bf16=cpu" in line for line in _run_mismatches(run(None), setup("bf16=cpu")))  # XLA's widening run
    assert _run_mismatches(run("bf16=cpu"), setup("bf16=cpu")) == []
    assert _run_mismatches(run(None), setup(None)) == []  # float32, or a run from before kernels were recorded


def test_a_damaged_cached_library_is_rebuilt_not_loaded(cpu_kernels_built, tmp_path):
    lib, how = cpu._build(tmp_path)
    assert lib is not None and how.startswith("built")
    assert cpu._build(tmp_path) == (lib, f"cached build {lib.name}")
    good = lib.read_bytes()
    lib.write_bytes(good[:5000])  # a truncated file (a full disk, a killed copy): loading it crashed the process
    again, how = cpu._build(tmp_path)
    assert again == lib and how.startswith("built") and lib.read_bytes() == good


def test_cxx_may_carry_arguments(monkeypatch):
    monkeypatch.setenv("CXX", "env c++")  # a launcher before the compiler, as `ccache g++`
    assert cpu._compiler()[1:] == ["c++"]


def test_the_attention_switch_takes_the_usual_words_and_refuses_other_values(cpu_kernels_built, monkeypatch):
    def plan():
        return cpu.plan(weight_dtype="float32", activation_dtype="float32", kv_dtype="float32")

    for word in ("1", "TRUE", " on ", "yes"):
        monkeypatch.setenv(cpu.ATTENTION_SWITCH, word)
        assert plan().attention and cpu.check_switches() is None
    for word in ("0", "false", "OFF", "no", " off\t", "\nNo "):
        monkeypatch.setenv(cpu.ATTENTION_SWITCH, word)
        assert not plan().attention
    for bad in ("of", "", "2", "disable"):
        monkeypatch.setenv(cpu.ATTENTION_SWITCH, bad)
        want = (f"{cpu.ATTENTION_SWITCH}={bad!r}: expected 1/true/on/yes or 0/false/off/no; unset it for the "
                "default (on)")
        for refused in (cpu.check_switches, plan, backends.check_switches,
                        lambda: backends.check_runs(backends.CPU_KERNELS, "cpu")):  # fmt: skip
            with pytest.raises(EngineError) as raised:
                refused()
            assert str(raised.value) == want


def test_a_bad_amx_switch_is_refused_before_the_library_loads(monkeypatch):
    """The library reads `AMX_SWITCH` itself, once, and would take a typo for "on": `_loaded` refuses it before
    building or loading anything (and caches nothing, so a fixed value loads on the next call)."""

    def build(out_dir):
        raise AssertionError("built despite a bad switch")

    monkeypatch.setattr(cpu, "_build", build)
    for bad in ("of", "0ff", "none"):
        monkeypatch.setenv(cpu.AMX_SWITCH, bad)
        for refused in (cpu._load, cpu.check_switches):
            with pytest.raises(EngineError, match=f"^{cpu.AMX_SWITCH}={bad!r}: expected 1/true/on/yes or 0/false"):
                refused()
    for word in ("0", " Off ", "1", "YES"):  # on and off pass the check and reach the build
        monkeypatch.setenv(cpu.AMX_SWITCH, word)
        cpu.check_switches()
        with pytest.raises(AssertionError, match="built despite"):
            cpu._load()


def test_a_bad_switch_is_one_line_and_exit_2_from_the_cli(tmp_path):
    """`bench sweep` with bfloat16 weights (the engine's load, as in `bench profile`, `bench generate` and `bench
    serve`): refused before the weights load; no kernel built, no run folder made."""
    from conftest import assert_one_line_error, run_cli

    env = {"GEMMA4_BENCH_CACHE": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu", cpu.AMX_SWITCH: "of"}
    args = ["sweep", "-c", "builtin:tiny", "--inputs", "20", "--weight-dtype", "bfloat16", "--backend", "cpu-kernels",
            "--runs-dir", str(tmp_path / "runs")]  # fmt: skip
    proc = run_cli(args, env=env)
    assert_one_line_error(proc, f"{cpu.AMX_SWITCH}='of'", "expected 1/true/on/yes or 0/false/off/no")
    assert not (tmp_path / "cache" / "kernels").exists() and not (tmp_path / "runs").exists()


def test_the_library_loads_once_however_many_threads_ask_at_once(monkeypatch):
    """`_loaded` runs `_load` once per process and hands every caller the same record; `_library` sees nothing
    before it and that record after (it loads nothing itself)."""
    import threading
    import time

    calls = []

    def load():
        calls.append(threading.get_ident())
        time.sleep(0.05)  # long enough for the other threads to arrive while it runs
        return cpu.KernelLibrary(loaded=False, how="stand-in")

    monkeypatch.setattr(cpu, "_LIBRARY", None)
    monkeypatch.setattr(cpu, "_load", load)
    assert cpu._library() is cpu._NOT_LOADED and not calls
    got = []
    threads = [threading.Thread(target=lambda: got.append(cpu._loaded())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 8 and all(g is got[0] for g in got) and got[0].how == "stand-in"
    assert cpu._library() is got[0]


def test_backend_cpu_kernels_that_cannot_run_here_is_one_line_and_exit_2(tmp_path, capsys):
    """Asked for without a C++ compiler: one line naming the option, why and the fix, before anything loads (no
    checkpoint made). A fresh interpreter with a fresh cache, since a library loaded by an earlier test would
    stay loaded in this one. An unknown backend: one line, no run folder (in process)."""
    from conftest import assert_one_line_error, bench_captured, run_cli

    env = {"GEMMA4_BENCH_CACHE": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu", "CXX": "no-such-compiler-gemma4"}
    args = ["generate", "-p", "hi", "-c", "builtin:tiny", "-n", "2", "--backend", "cpu-kernels"]
    proc = run_cli(args, env=env)
    assert_one_line_error(proc, "--backend cpu-kernels: the engine's CPU kernels cannot run here",
                          "no C++ compiler", "drop --backend")  # fmt: skip
    assert not (tmp_path / "cache" / "checkpoints").exists()
    code, _, err = bench_captured(["sweep", "-c", "builtin:tiny", "--inputs", "20", "--backend", "xla",
                                   "--runs-dir", str(tmp_path / "runs")], capsys)  # fmt: skip
    want = "error: --backend xla: expected one of jax, cpu-kernels (default jax, the pure-JAX engine)"
    assert code == 2 and err.strip() == want
    assert not (tmp_path / "runs").exists()
