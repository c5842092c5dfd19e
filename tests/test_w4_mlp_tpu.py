"""The fused `w4` MLP kernel for the TPU (issue 43; `model.kernels.w4_mlp_tpu`, the "fused" tiling policy): on CPU
it equals the MLP's two kernel products in interpret mode, the plan sets it on E2B's gate_up tilings only under
"fused", the layer takes it through `model.ops.geglu_mlp`, and it lowers for the TPU at E2B's shapes (jax.export;
Mosaic's own compile needs a TPU)."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.config import PRESETS
from model.kernels import fit, fit_tpu
from model.kernels.fit_tpu import TpuTiling
from model.kernels.tpu_layout import to_tpu
from model.kernels.w4_mlp_tpu import MLP_KERNEL_NAME, w4_mlp_tpu
from model.ops import geglu_mlp
from model.quant import QuantArray, quantize_channels

LIMIT = fit_tpu.budget(fit_tpu.vmem_capacity("v5e"))
G = 128


def _leaf(w: np.ndarray, axis: int, tiling: TpuTiling) -> QuantArray:
    """A w4 leaf of `w` grouped along `axis`, stored in the TPU layout with `tiling`."""
    q = quantize_channels(w, 4, axis, G)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), axis, G)
    return dataclasses.replace(q, values=words, scales=scales, tiling=tiling)


def _mlp(d: int, f: int, bf: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    gate_up = rng.standard_normal((d, 2 * f)).astype(np.float32) / np.sqrt(d)
    down = rng.standard_normal((d, f)).astype(np.float32) / np.sqrt(f)
    t_gu = TpuTiling(bm=128, bn=bf, bk=d, mlp=bf)
    t_dn = TpuTiling(bm=128, bn=d, bk=bf)
    return _leaf(gate_up, 0, t_gu), _leaf(down, 1, t_dn), rng


@pytest.mark.parametrize("rows,dtype,tol", [(1, jnp.float32, 1e-5), (3, jnp.float32, 1e-5), (2, jnp.bfloat16, 2e-2)])
def test_the_fused_mlp_equals_its_two_products(rows: int, dtype, tol: float) -> None:
    """Interpret mode, D 256, F 4096 (two grid steps of bf 2048): the fused call against the unfused path (the same
    leaves with `mlp` 0: two W4A16 kernel calls and XLA's GeGLU between them)."""
    gu, dn, rng = _mlp(256, 4096, 2048)
    x = jnp.asarray(rng.standard_normal((1, rows, 256)), dtype)
    fused = geglu_mlp(x, gu, dn)
    plain = geglu_mlp(x, dataclasses.replace(gu, tiling=dataclasses.replace(gu.tiling, mlp=0)), dn)
    assert fused.shape == plain.shape == x.shape and fused.dtype == x.dtype
    f64, p64 = np.asarray(fused, np.float64), np.asarray(plain, np.float64)
    assert np.max(np.abs(f64 - p64)) <= tol * np.max(np.abs(p64)), np.max(np.abs(f64 - p64))
    assert MLP_KERNEL_NAME in str(jax.make_jaxpr(lambda a: geglu_mlp(a, gu, dn))(x))


def test_more_rows_than_the_fused_kernel_takes_go_to_the_two_products() -> None:
    gu, dn, rng = _mlp(256, 2048, 2048)
    x = jnp.asarray(rng.standard_normal((1, fit_tpu.MLP_MAX_ROWS + 1, 256)), jnp.float32)
    assert MLP_KERNEL_NAME not in str(jax.make_jaxpr(lambda a: geglu_mlp(a, gu, dn))(x))
    with pytest.raises(ValueError, match="expected 1..32 rows"):
        w4_mlp_tpu(x[0], gu.values, gu.scales, dn.values, dn.scales, d=256, f=2048, group=G, bf=2048, interpret=True)


def test_the_fused_policy_plans_e2b_mlps_and_only_it() -> None:
    projs = fit.projections(PRESETS["e2b"], G)
    for policy in ("steps", "fewest"):
        assert all(f.tiling.mlp == 0 for f in fit_tpu.plan_tpu(projs, LIMIT, policy=policy) if f.fits)
    fused = fit_tpu.plan_tpu(projs, LIMIT, policy="fused")
    steps = fit_tpu.plan_tpu(projs, LIMIT, policy="steps")
    for a, b in zip(fused, steps, strict=True):
        if a.projection.field == "gate_up_DX":
            assert a.tiling == dataclasses.replace(b.tiling, mlp=2048) and " mlp2048" in a.tiling.text
        else:
            assert a.tiling == b.tiling
    assert fit_tpu.mlp_block(1536, 6144, G) == 2048 and fit_tpu.mlp_block(2816, 2112, G) == 0  # 26B-A4B: no bf
    # 32 rows fit beside three weight blocks, a 128-row block would not (why MLP_MAX_ROWS is 32)
    assert fit_tpu.need_mlp(1536, 2048, G) <= LIMIT < fit_tpu.need_mlp(1536, 2048, G, rows=128)
    assert fit_tpu.mlp_block(1536, 6144, G, limit=fit_tpu.need_mlp(1536, 2048, G) - 1) == 0
    assert fit_tpu.parse_tpu_tiling("tpu bm128 bn2048 bk1536 mlp2048").mlp == 2048
    assert fit.parse_kernel("w4a16=pallas:fused") == "pallas:fused"


@pytest.mark.parametrize("f", [6144, 12288])
def test_the_fused_mlp_lowers_for_the_tpu_at_e2b_shapes(f: int) -> None:
    d = 1536
    fn = jax.jit(lambda x, a, b, c, e: w4_mlp_tpu(x, a, b, c, e, d=d, f=f, group=G, bf=2048))
    args = (jax.ShapeDtypeStruct((1, d), jnp.bfloat16), jax.ShapeDtypeStruct((d // 8, 2 * f), jnp.int32),
            jax.ShapeDtypeStruct((d // G, 2 * f), jnp.bfloat16), jax.ShapeDtypeStruct((f // 8, d), jnp.int32),
            jax.ShapeDtypeStruct((f // G, d), jnp.bfloat16))  # fmt: skip
    text = jax.export.export(fn, platforms=["tpu"])(*args).mlir_module()
    assert "tpu_custom_call" in text and MLP_KERNEL_NAME in text


# ---- a K that the group does not divide (26B-A4B's MLP down projection, K = 2112) --------------------------------
def test_a_k_of_a_partial_group_is_padded_in_the_tpu_layout_and_multiplies_exactly() -> None:
    """K = 320 (2.5 groups): to_tpu stores 384 (zero values), to_natural gives the leaf back, and the kernel's
    product (interpret mode, the activations padded with zeros) equals dequantize-then-matmul."""
    from model.kernels.tpu_layout import to_natural
    from model.quant import dequantize, matmul

    rng = np.random.default_rng(7)
    w = rng.standard_normal((256, 320)).astype(np.float32)  # [N, K]: contracted along axis 1, like down_DF
    q = quantize_channels(w, 4, 1, G)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), 1, G)
    assert words.shape == (384 // 8, 256) and scales.shape == (3, 256)
    back = to_natural(words, scales, tuple(q.shape), 1, G)
    assert np.array_equal(np.asarray(back[0]), np.asarray(q.values)) and np.array_equal(back[1], q.scales)
    t = TpuTiling(bm=128, bn=256, bk=384)
    leaf = dataclasses.replace(q, values=words, scales=scales, tiling=t)
    x = jnp.asarray(rng.standard_normal((1, 2, 320)), jnp.float32)
    y = np.asarray(matmul(x, leaf, "BTF,DF->BTD"), np.float64)
    ref = np.asarray(x, np.float64) @ np.asarray(dequantize(q, jnp.float32), np.float64).T
    assert np.all(np.abs(y - ref) <= 1e-5 * (np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(dequantize(q, jnp.float32), np.float64)).T))
    assert "w4a16_pallas_tpu_kernel" in str(jax.make_jaxpr(lambda a: matmul(a, leaf, "BTF,DF->BTD"))(x))


def test_26b_a4b_dense_down_projection_is_planned_with_k_padded() -> None:
    """On a TPU the plan tiles 26B-A4B's MLP down projection (K 2112 -> 2176) instead of leaving it to XLA's
    product, and the accounting counts the padding's value bytes."""
    import types

    from model.accounting import TPU_LAYOUT, placed_shape
    from model.kernels.choice import decide_mode, plan_kernel
    from model.quantspec import parse_quant

    cfg, quant = PRESETS["26b-a4b"], parse_quant("w4")
    device = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    impl, why = decide_mode("tpu", None, True, "pallas")
    plan = plan_kernel(cfg, quant, impl=impl, reason=why, act_bytes=2, scale_bytes=2, device=device, forced=True)
    t = plan.tiling_of("down_DF", (2816, 2112))
    assert t is not None and t.bk == 2176, t
    assert placed_shape("down_DF", (2816, 2112), quant, TPU_LAYOUT) == (2816, 2176)
    assert placed_shape("down_DF", (2816, 2112), quant) == (2816, 2112)
    assert placed_shape("down_DF", (1536, 6144), quant, TPU_LAYOUT) == (1536, 6144)


# ---- the "resident" policy: the small products with every operand whole in VMEM ---------------------------------
def test_the_resident_policy_marks_e2b_small_products_only() -> None:
    projs = fit.projections(PRESETS["e2b"], G)
    plan = fit_tpu.plan_tpu(projs, LIMIT, policy="resident")
    steps = fit_tpu.plan_tpu(projs, LIMIT, policy="steps")
    marked = {(f.projection.k, f.projection.n) for f in plan if f.tiling.resident}
    assert marked == {(1536, 256), (256, 1536), (2048, 1536), (1536, 2048), (1536, 2560)}, marked
    for a, b in zip(plan, steps, strict=True):
        assert dataclasses.replace(a.tiling, resident=False) == b.tiling
    t = next(f.tiling for f in plan if f.tiling.resident)
    assert t.text.endswith(" resident") and fit_tpu.parse_tpu_tiling(t.text) == t
    assert fit.parse_kernel("w4a16=pallas:resident") == "pallas:resident"


@pytest.mark.parametrize("rows", [1, 3])
def test_a_resident_leaf_multiplies_as_dequantize_then_matmul(rows: int) -> None:
    """The engine's dispatch (`model.quant.matmul`) takes the resident form for a leaf whose tiling says so (one
    grid step, operands in VMEM), in interpret mode; more rows than the tiling's bm take the grid."""
    from model.quant import dequantize, matmul

    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 384)).astype(np.float32)  # [K, N], contracted along axis 0, like qkv
    q = quantize_channels(w, 4, 0, G)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), 0, G)
    leaf = dataclasses.replace(q, values=words, scales=scales, tiling=TpuTiling(bm=16, bn=128, bk=256, resident=True))
    x = jnp.asarray(rng.standard_normal((1, rows, 256)), jnp.float32)
    y = np.asarray(matmul(x, leaf, "BTD,DX->BTX"), np.float64)
    wd = np.asarray(dequantize(q, jnp.float32), np.float64)
    x64 = np.asarray(x, np.float64)
    assert np.all(np.abs(y - x64 @ wd) <= 1e-5 * (np.abs(x64) @ np.abs(wd)))
    grids = re.findall(r"grid=\([^)]*\)", str(jax.make_jaxpr(lambda a: matmul(a, leaf, "BTD,DX->BTX"))(x)))
    assert grids == ["grid=(1, 1, 1)"], grids  # the gridded form of this tiling is (1, 3, 1)
    x17 = jnp.asarray(rng.standard_normal((1, 17, 256)), jnp.float32)  # over bm 16: the gridded form
    y17 = np.asarray(matmul(x17, leaf, "BTD,DX->BTX"), np.float64)
    assert np.all(np.abs(y17 - np.asarray(x17, np.float64) @ wd) <= 1e-5 * (np.abs(np.asarray(x17)) @ np.abs(wd)))


@pytest.mark.parametrize("k,n", [(1536, 2560), (256, 1536), (2048, 1536)])
def test_the_resident_form_lowers_for_the_tpu_at_e2b_shapes(k: int, n: int) -> None:
    from model.kernels.w4a16_tpu import KERNEL_NAME, w4a16_tpu_matmul

    t = TpuTiling(bm=128, bn=n, bk=k, resident=True)
    fn = jax.jit(lambda x, w, s: w4a16_tpu_matmul(x, w, s, k=k, n=n, group=G, tiling=t, resident=True))
    args = (jax.ShapeDtypeStruct((1, k), jnp.bfloat16), jax.ShapeDtypeStruct((k // 8, n), jnp.int32),
            jax.ShapeDtypeStruct((k // G, n), jnp.bfloat16))  # fmt: skip
    text = jax.export.export(fn, platforms=["tpu"])(*args).mlir_module()
    assert "tpu_custom_call" in text and KERNEL_NAME in text
