"""The decode-shaped forms chosen for XLA:CPU compute the same function as the plain forms.

`model.layers.attend_one` (key-major scores, both forms of its value product) against `attend`,
`model.quant.matmul`'s weight-left form for a dense output-major weight at 2-64 rows, and its split form for one
row (`model.backends.cpu.forms`: pure JAX, taken on CPU by the default backend), against the plain einsum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import quant
from model.backends.cpu import forms
from model.layers import attend, attend_one, value_product_key_major


ATTEND_SHAPES = [(1, 1, 8, 128, 256), (3, 2, 4, 40, 16), (4, 1, 2, 9, 8), (1, 1, 8, 512, 256), (2, 1, 4, 520, 512)]
"""(B, K, G, S, H): the last two take the direct value product over a long cache, the others the transposed one."""


@pytest.mark.parametrize(("b", "k", "g", "s", "h"), ATTEND_SHAPES)
def test_attend_one_equals_attend(b, k, g, s, h):
    rng = np.random.default_rng(b * 100 + s)
    q = jnp.asarray(rng.standard_normal((b, 1, k * g, h)), jnp.float32)
    kc = jnp.asarray(rng.standard_normal((b, k, s, h)), jnp.float32)
    vc = jnp.asarray(rng.standard_normal((b, k, s, h)), jnp.float32)
    mask_BS = jnp.asarray(rng.random((b, s)) < 0.7).at[:, 0].set(True)  # every row sees at least one slot
    want = attend(q, kc, vc, mask_BS[:, None, :])
    got = jax.jit(attend_one)(q, kc, vc, mask_BS)
    assert got.shape == want.shape == (b, 1, k * g, h)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)  # summation order: scores of size ~sqrt(H)


def test_both_value_product_forms_are_tested():
    forms = [value_product_key_major(b, s, h) for b, _, _, s, h in ATTEND_SHAPES]
    assert forms == [False, False, False, True, True]
    assert value_product_key_major(1, 512, 256) and not value_product_key_major(2, 512, 256)  # B = 1 from 128K


def _barriers(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("optimization_barrier")


@pytest.mark.parametrize("rows", [1, 2, 5, 64, 65])
def test_weight_left_form_equals_einsum(rows):
    rng = np.random.default_rng(rows)
    x_BTX = jnp.asarray(rng.standard_normal((rows, 1, 48)), jnp.float32)
    w_DX = jnp.asarray(rng.standard_normal((24, 48)), jnp.float32)  # output-major: the contraction X is minor
    got = quant.matmul(x_BTX, w_DX, "BTX,DX->BTD")
    want = jnp.einsum("BTX,DX->BTD", x_BTX, w_DX)
    assert got.shape == (rows, 1, 24)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    lo, hi = forms.BATCH_ROWS_WEIGHT_LEFT
    taken = _barriers(lambda x, w: quant.matmul(x, w, "BTX,DX->BTD"), x_BTX, w_DX) > 0
    assert taken == (lo <= rows <= hi and jax.default_backend() == "cpu")


def test_weight_left_form_leaves_input_major_weights_alone():
    x_BTD = jnp.ones((4, 1, 24), jnp.float32)
    w_DX = jnp.ones((24, 48), jnp.float32)  # input-major: the contraction D is the major axis
    assert _barriers(lambda x, w: quant.matmul(x, w, "BTD,DX->BTX"), x_BTD, w_DX) == 0


def _batched_dots(fn, *args) -> list[tuple[int, ...]]:
    """Output shapes of the dot_generals in fn's jaxpr that have a batch dimension."""
    shapes = []
    for eqn in jax.make_jaxpr(fn)(*args).eqns:
        if eqn.primitive.name == "dot_general" and eqn.params["dimension_numbers"][1][0]:
            shapes.append(tuple(eqn.outvars[0].aval.shape))
    return shapes


@pytest.mark.parametrize(("spec", "w_shape"), [("BTX,DX->BTD", (24, 48)), ("BTD,DX->BTX", (24, 48))])
@pytest.mark.parametrize("slabs", [1, 2, 4])
def test_split_form_equals_einsum_and_is_taken_for_one_row_only(monkeypatch, spec, w_shape, slabs):
    monkeypatch.setattr(forms, "SPLIT_SLABS", slabs)
    rng = np.random.default_rng(slabs)
    x_dim = w_shape[1] if spec.startswith("BTX") else w_shape[0]
    w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32)
    for rows in (1, 2):
        x = jnp.asarray(rng.standard_normal((rows, 1, x_dim)), jnp.float32)
        got = jax.jit(lambda x, w: quant.matmul(x, w, spec))(x, w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(jnp.einsum(spec, x, w)), rtol=1e-5, atol=1e-5)
        batched = _batched_dots(lambda x, w: quant.matmul(x, w, spec), x, w)
        taken = rows == 1 and slabs >= 2 and jax.default_backend() == "cpu"
        # output-major [D, X] (contraction X minor) is cut into slabs of outputs; input-major into slabs of X
        slab_out = (slabs, 1, 24 // slabs) if spec.startswith("BTX") else (slabs, 1, 48)
        assert batched == ([slab_out] if taken else []), (rows, batched)


def test_split_form_needs_slabs_that_divide_the_cut_axis(monkeypatch):
    monkeypatch.setattr(forms, "SPLIT_SLABS", 5)  # 24 outputs do not split into 5 slabs
    x = jnp.ones((1, 1, 48), jnp.float32)
    w = jnp.ones((24, 48), jnp.float32)
    assert _batched_dots(lambda x, w: quant.matmul(x, w, "BTX,DX->BTD"), x, w) == []
    monkeypatch.setattr(forms, "SPLIT_SLABS", 16)  # 16 does not divide 24 either
    assert _batched_dots(lambda x, w: quant.matmul(x, w, "BTX,DX->BTD"), x, w) == []


@pytest.mark.parametrize("rows", [1, 3, 16, 80])
def test_an_output_major_copy_multiplies_as_its_original(rows):
    rng = np.random.default_rng(rows)
    x_BTD = jnp.asarray(rng.standard_normal((rows, 1, 32)), jnp.float32)
    w_DX = jnp.asarray(rng.standard_normal((32, 40)), jnp.float32)  # input-major, as qkv_DX / gate_up_DX
    om = quant.output_major(w_DX)
    assert isinstance(om, quant.OutputMajor) and om.shape == (32, 40) and om.w_NK.shape == (40, 32)
    got = jax.jit(lambda x, w: quant.matmul(x, w, "BTD,DX->BTX"))(x_BTD, om)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jnp.einsum("BTD,DX->BTX", x_BTD, w_DX)), rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    assert quant.output_major(None) is None and quant.output_major(om) is om


def test_batch_params_copy_only_the_dense_input_major_projections(tiny_checkpoint):
    from model.engine import load_engine
    from model.params import output_major_bytes

    engine, _ = load_engine(tiny_checkpoint, log_policy=False)
    copy = engine.batch_params
    assert engine.batch_params is copy  # made once
    for lp, lc in zip(engine.params.layers, copy.layers, strict=True):
        assert isinstance(lc.qkv_DX, quant.OutputMajor) and isinstance(lc.gate_up_DX, quant.OutputMajor)
        np.testing.assert_array_equal(np.asarray(lc.qkv_DX.w_NK), np.asarray(lp.qkv_DX).T)
        assert lc.o_DX is lp.o_DX and lc.down_DF is lp.down_DF  # already output-major: shared, not copied
    expected = sum(lp.qkv_DX.nbytes + lp.gate_up_DX.nbytes for lp in engine.params.layers)
    expected += engine.params.ple_proj_DX.nbytes if engine.params.ple_proj_DX is not None else 0
    assert output_major_bytes(engine.params) == engine.batch_copy_bytes == expected
    one = engine._batch_memory(1, 64, spare_rows=0)
    two = engine._batch_memory(2, 64, spare_rows=0)
    assert two.weight_bytes - one.weight_bytes == expected  # a batch counts the copy, B = 1 does not


@pytest.mark.parametrize("case", ["output-major", "input-major", "OutputMajor", "bf16 weight", "no T axis"])
def test_split_form_equals_einsum_for_the_engines_one_row_forms(monkeypatch, case):
    monkeypatch.setattr(forms, "SPLIT_SLABS", 4)
    # the default backend, pure JAX: XLA's forms (the CPU kernels: tests/test_cpu_kernels.py)
    rng = np.random.default_rng(7)
    spec, x_shape, w = {
        "output-major": ("BTF,DF->BTD", (1, 1, 96), rng.standard_normal((64, 96))),  # o / down / PLE gate / head
        "input-major": ("BTD,DX->BTX", (1, 1, 64), rng.standard_normal((64, 40))),  # q/k/v, gate/up, PLE projection
        "OutputMajor": ("BTD,DX->BTX", (1, 1, 64), rng.standard_normal((64, 40))),  # matmul recurses, letters swapped
        "bf16 weight": ("BTD,DX->BTX", (1, 1, 64), rng.standard_normal((64, 40))),  # --weight-dtype bfloat16
        "no T axis": ("BD,DX->BX", (1, 64), rng.standard_normal((64, 40))),
    }[case]
    w = jnp.asarray(w, jnp.bfloat16 if case == "bf16 weight" else jnp.float32)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    want = jnp.einsum(spec, x, w.astype(jnp.float32))
    leaf = quant.output_major(w) if case == "OutputMajor" else w
    got = jax.jit(lambda x, w: quant.matmul(x, w, spec))(x, leaf)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    taken = jax.default_backend() == "cpu"
    assert bool(_batched_dots(lambda x, w: quant.matmul(x, w, spec), x, leaf)) == taken


def test_split_form_needs_two_rows_per_slab(monkeypatch):
    monkeypatch.setattr(forms, "SPLIT_SLABS", 4)  # 4 divides K = 4, but each slab would hold one row
    x = jnp.ones((1, 1, 4), jnp.float32)
    assert _batched_dots(lambda x, w: quant.matmul(x, w, "BTD,DX->BTX"), x, jnp.ones((4, 40), jnp.float32)) == []


def test_split_form_adds_float16_partial_sums_in_float32(monkeypatch):
    monkeypatch.setattr(forms, "SPLIT_SLABS", 4)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, 1, 1024)), jnp.float16)
    w = jnp.asarray(rng.standard_normal((1024, 2048)) * 0.05, jnp.float16)
    exact = np.einsum("BTD,DX->BTX", np.asarray(x, np.float64), np.asarray(w, np.float64))
    plain = np.abs(np.asarray(jnp.einsum("BTD,DX->BTX", x, w), np.float64) - exact).mean()
    got = jax.jit(lambda x, w: quant.matmul(x, w, "BTD,DX->BTX"))(x, w)
    assert got.dtype == jnp.float16
    assert np.abs(np.asarray(got, np.float64) - exact).mean() <= 1.2 * plain  # one rounding to float16, as plain


def test_cpu_threads_counts_the_affinity_and_falls_back_to_cpu_count(monkeypatch):
    monkeypatch.setattr(forms.os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert forms._cpu_threads() == 3
    monkeypatch.delattr(forms.os, "sched_getaffinity", raising=False)  # e.g. macOS
    monkeypatch.setattr(forms.os, "cpu_count", lambda: 16)
    assert forms._cpu_threads() == 16
    monkeypatch.setattr(forms.os, "cpu_count", lambda: None)
    assert forms._cpu_threads() == 1
