"""The TPU W4A16 kernel (model/kernels/w4a16_tpu.py) in interpret mode against dequantize-then-matmul, its TPU
layout (model/kernels/tpu_layout.py), its dispatch through `model.quant.matmul`, its lowering for the TPU on this
CPU machine (`jax.export`, platforms ["tpu"]), its fit check (model/kernels/fit_tpu.py) and `bench kernels fit`
on a TPU.

Tolerances (max |kernel - reference| per output, reference = float64 product of the activations and the
dequantized weight): float32 activations 1e-5 x sum_k |x_k w_kn| (float32 rounding of a K-term sum in group
order, with room: the integer products are exact and each scale is applied once per group's float32 partial
sum); bfloat16 activations additionally 2^-7 x |reference| (the output is rounded to bfloat16, half an ulp is
2^-9, plus the float32 sums' own rounding)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_one_line_error, run_cli_here
from model.kernels import fit, fit_tpu
from model.kernels.fit_tpu import TpuTiling
from model.kernels.tpu_layout import to_natural, to_tpu
from model.kernels.w4a16_tpu import KERNEL_NAME, w4a16_tpu_matmul
from model.quant import dequantize, matmul, packed_bytes, quantize_channels
from test_w4a16_kernel import one_layer_tree


def _weight(k: int, n: int, axis: int, seed: int = 0):
    """A w4:128 leaf of logical [K, N] (axis 0) or [N, K] (axis 1)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n) if axis == 0 else (n, k)).astype(np.float32) / np.sqrt(k)
    return quantize_channels(w, 4, axis, 128)


def _tpu_leaf(q, axis: int, t: TpuTiling):
    """`q` stored in the TPU layout with tiling `t` (what `model.kernels.choice.with_tilings` does at load)."""
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), axis, 128)
    return dataclasses.replace(q, values=words, scales=scales, tiling=t)


def _reference(x: np.ndarray, q, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(x @ W in float64, sum_k |x_k W_kn|) with W the dequantized weight as [K, N]."""
    w = np.asarray(dequantize(q, jnp.float32), np.float64)
    w_KN = w if axis == 0 else w.T
    x64 = np.asarray(x, np.float64)
    return x64 @ w_KN, np.abs(x64) @ np.abs(w_KN)


# ---- the TPU layout --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,n,axis", [(256, 2048, 0), (512, 1536, 1), (384, 320, 0), (128, 256, 1), (256, 7, 1)])
def test_the_tpu_layout_round_trips_with_the_same_bytes_and_values(k: int, n: int, axis: int) -> None:
    q = _weight(k, n, axis)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), axis, 128)
    assert words.dtype == jnp.int32 and words.shape == (k // 8, n) and scales.shape == (k // 128, n)
    values, back = to_natural(words, scales, tuple(q.shape), axis, 128)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(q.values))
    np.testing.assert_array_equal(np.asarray(back), np.asarray(q.scales))
    leaf = _tpu_leaf(q, axis, TpuTiling(bm=16, bn=n, bk=k))
    if q.shape[-1] % 2 == 0:  # the uint8 layout pads an odd packed axis with a nibble; words never do
        assert packed_bytes(leaf) == packed_bytes(q)  # counted exactly: the same bytes in 32-bit words
    np.testing.assert_array_equal(np.asarray(dequantize(leaf, jnp.float32)), np.asarray(dequantize(q, jnp.float32)))


def test_word_order_pairs_values_along_k_within_a_group() -> None:
    """Word row gi g / 8 + i holds, in bits 4p..4p+3 with p = j + 4h, value gi g + 2 (g / 8) j + 2 i + h of its
    column plus 8 (offset binary): the bfloat16 pairs of nibbles j and j + 4 are values 2i and 2i + 1 of the group's
    j-th quarter, so the 4 pair planes stacked are the group's values in natural order."""
    from model.kernels.tpu_layout import pack_words, unpack_words

    g = 32
    r = g // 8
    q = np.random.default_rng(0).integers(-8, 8, (2 * g, 3)).astype(np.int8)  # K = 2 groups, N = 3
    w = np.asarray(pack_words(jnp.asarray(q), g)).view(np.uint32)
    assert w.shape == (2 * g // 8, 3)
    for gi in range(2):
        for i in range(r):
            for j in range(4):
                for h in range(2):
                    np.testing.assert_array_equal((w[gi * r + i] >> (4 * (j + 4 * h))) & 15,
                                                  q[gi * g + 2 * r * j + 2 * i + h].astype(np.int64) + 8)
    np.testing.assert_array_equal(np.asarray(unpack_words(jnp.asarray(w.view(np.int32)), g)), q)


# ---- the kernel in interpret mode -------------------------------------------------------------------------------
def _check(k: int, n: int, axis: int, rows: int, t: TpuTiling, dtype=jnp.float32, seed: int = 0) -> None:
    q = _weight(k, n, axis, seed)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), axis, 128)
    x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, k)), dtype)
    y = w4a16_tpu_matmul(x, words, scales, k=k, n=n, group=128, tiling=t, interpret=True)
    ref, mag = _reference(np.asarray(x.astype(jnp.float32)), q, axis)
    assert y.shape == (rows, n) and y.dtype == dtype
    err = np.abs(np.asarray(y.astype(jnp.float32), np.float64) - ref)
    bound = 1e-5 * mag + (2**-7 * np.abs(ref) if dtype == jnp.bfloat16 else 0)
    assert np.all(err <= bound), float(np.max(err - bound))


@pytest.mark.parametrize("rows", [1, 3, 8, 33, 128])
def test_kernel_equals_dequantize_then_matmul_at_any_row_count(rows: int) -> None:
    """Two output blocks of 512, four groups in one step; 33 rows take a row block of 48, 128 one of 128 (rows
    padded)."""
    _check(512, 1024, 0, rows, TpuTiling(bm=128, bn=512, bk=512))


def test_kernel_accumulates_over_k_steps() -> None:
    """Two K steps of 16 groups (the scale rows' multiple): the output block stays resident and sums both."""
    _check(4096, 256, 1, 3, TpuTiling(bm=16, bn=128, bk=2048))


@pytest.mark.parametrize(
    "k,n,axis,t",
    [
        (512, 1536, 1, TpuTiling(bm=16, bn=384, bk=512)),  # an [N, K] leaf (o_proj, down_proj), 4 output blocks
        (384, 320, 0, TpuTiling(bm=32, bn=320, bk=384)),  # N not a multiple of 128: one block along N
        (1536, 256, 1, TpuTiling(bm=16, bn=256, bk=1536)),  # the PLE gate's shape: 12 groups in one step
    ],
)
def test_kernel_at_odd_shapes(k: int, n: int, axis: int, t: TpuTiling) -> None:
    _check(k, n, axis, 3, t)


def test_bfloat16_activations() -> None:
    _check(256, 1024, 0, 5, TpuTiling(bm=16, bn=1024, bk=256), dtype=jnp.bfloat16, seed=4)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_vector_unit_variant_equals_dequantize_then_matmul(rows: int) -> None:
    """vpu_rows >= rows: the variant with no matrix unit (x transposed, float32 products summed on the VPU)."""
    _check(512, 256, 0, rows, TpuTiling(bm=128, bn=128, bk=512, vpu_rows=8))
    _check(256, 384, 1, rows, TpuTiling(bm=16, bn=384, bk=256, vpu_rows=rows), dtype=jnp.bfloat16)


@pytest.mark.parametrize("rows", [1, 3, 8, 16])
def test_the_hybrid_form_equals_dequantize_then_matmul(rows: int) -> None:
    """vpu_cols: at up to 8 rows the last vpu_cols outputs of each block on the vector unit, the rest on the matrix
    unit (at 16 rows the matrix unit alone: the same tiling must still be right)."""
    _check(512, 1024, 0, rows, TpuTiling(bm=128, bn=512, bk=512, vpu_cols=256))
    _check(256, 768, 1, rows, TpuTiling(bm=16, bn=384, bk=256, vpu_cols=128), dtype=jnp.bfloat16)


def test_hybrid_columns_are_checked_and_parsed() -> None:
    assert fit_tpu.parse_tpu_tiling("tpu bm16 bn1024 bk256 vc384") == TpuTiling(bm=16, bn=1024, bk=256, vpu_cols=384)
    assert TpuTiling(bm=16, bn=1024, bk=256, vpu_cols=384).text == "tpu bm16 bn1024 bk256 vc384"
    assert "vpu_cols 100" in fit_tpu.tiling_problem_tpu(256, 1024, 128, TpuTiling(bm=16, bn=1024, bk=256, vpu_cols=100))
    assert "below bn" in fit_tpu.tiling_problem_tpu(256, 1024, 128, TpuTiling(bm=16, bn=512, bk=256, vpu_cols=512))
    with_cols = fit_tpu.need_tpu(TpuTiling(bm=16, bn=1024, bk=256, vpu_cols=384), group=128).total
    assert with_cols > fit_tpu.need_tpu(TpuTiling(bm=16, bn=1024, bk=256), group=128).total


def test_a_tiling_that_does_not_tile_the_shape_is_refused() -> None:
    q = _weight(256, 1024, 0)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), 0, 128)
    with pytest.raises(ValueError, match="does not tile K=256 N=1024 group 128: bk 384 does not divide K=256"):
        w4a16_tpu_matmul(jnp.zeros((1, 256)), words, scales, k=256, n=1024, group=128,
                         tiling=TpuTiling(bm=16, bn=1024, bk=384), interpret=True)  # fmt: skip


# ---- the dispatch -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,axis", [("BTD,DX->BTX", 0), ("BTX,DX->BTD", 1)])
def test_matmul_dispatches_a_tpu_leaf_to_the_kernel(spec: str, axis: int) -> None:
    """A leaf in the TPU layout goes through the TPU kernel (a pallas_call named for it), at any row count, with
    XLA's product's result on the same values."""
    q = _weight(256, 1024, axis)
    leaf = _tpu_leaf(q, axis, TpuTiling(bm=128, bn=512, bk=256))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 3, 256 if axis == 0 else 1024)), jnp.float32)
    if axis == 1:
        x = x[..., :256]
    program = str(jax.make_jaxpr(lambda a, w: matmul(a, w, spec))(x, leaf))
    assert "pallas_call" in program and KERNEL_NAME in program
    np.testing.assert_allclose(np.asarray(matmul(x, leaf, spec)), np.asarray(matmul(x, q, spec)), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_with_tilings_stores_tpu_leaves_in_the_tpu_layout() -> None:
    from model.kernels.choice import KernelPlan, with_tilings

    q = _weight(512, 256, 1)  # [N, K] = [256, 512]
    p = fit.Projection(field="o_DX", k=512, n=256, axis=1, group=128)
    f = fit_tpu.choose_tpu(p, fit_tpu.budget())
    plan = KernelPlan(impl="pallas", reason="test", limit=f.limit, limit_source="test", fits=(f,), tpu=True)
    tree = with_tilings(one_layer_tree(q), plan)
    leaf = tree.layers[0].o_DX
    assert leaf.tiling == f.tiling and leaf.values.dtype == jnp.int32 and leaf.values.shape == (64, 256)
    assert packed_bytes(leaf) == packed_bytes(q)
    bad = KernelPlan(impl="pallas", reason="test", limit=f.limit, limit_source="test", tpu=True,
                     fits=(dataclasses.replace(f, tiling=TpuTiling(bm=16, bn=256, bk=192)),))  # fmt: skip
    with pytest.raises(ValueError, match="o_DX .*bk 192 is not a multiple of the group 128"):
        with_tilings(one_layer_tree(q), bad)


# ---- the experimental resident form (operands whole in VMEM; the TPU probe's --resident) ---------------------------
@pytest.mark.parametrize("k,n,rows", [(1536, 256, 1), (2048, 384, 5), (256, 1536, 16)])
def test_the_resident_form_equals_dequantize_then_matmul(k: int, n: int, rows: int) -> None:
    q = _weight(k, n, 0, seed=k + n)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), 0, 128)
    x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, k)), jnp.float32)
    t = TpuTiling(bm=128, bn=n, bk=k)
    y = np.asarray(w4a16_tpu_matmul(x, words, scales, k=k, n=n, group=128, tiling=t, interpret=True, resident=True),
                   np.float64)  # fmt: skip
    ref, mag = _reference(np.asarray(x), q, 0)
    assert np.all(np.abs(y - ref) <= 1e-5 * mag)
    f = jax.jit(lambda a, w, s: w4a16_tpu_matmul(a, w, s, k=k, n=n, group=128, tiling=t, resident=True))
    args = (jax.ShapeDtypeStruct((1, k), jnp.bfloat16), jax.ShapeDtypeStruct((k // 8, n), jnp.int32),
            jax.ShapeDtypeStruct((k // 128, n), jnp.bfloat16))  # fmt: skip
    assert KERNEL_NAME in jax.export.export(f, platforms=["tpu"])(*args).mlir_module()


def test_the_resident_form_refuses_what_it_cannot_hold() -> None:
    t = TpuTiling(bm=16, bn=1536, bk=1536)
    big = (jnp.zeros((1, 6144), jnp.bfloat16), jnp.zeros((768, 1536), jnp.int32), jnp.zeros((48, 1536), jnp.bfloat16))
    with pytest.raises(ValueError, match="resident form: 1 rows, K=6144 N=1536 group 128: expected rows <= 16, "
                                         "K / group <= 24"):  # fmt: skip
        w4a16_tpu_matmul(*big, k=6144, n=1536, group=128, tiling=TpuTiling(bm=16, bn=1536, bk=2048), resident=True)
    rows = (jnp.zeros((17, 1536), jnp.bfloat16), jnp.zeros((192, 1536), jnp.int32), jnp.zeros((12, 1536), jnp.bfloat16))
    with pytest.raises(ValueError, match="resident form: 17 rows"):
        w4a16_tpu_matmul(*rows, k=1536, n=1536, group=128, tiling=t, resident=True)


# ---- the TPU lowering, on CPU -------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,k,n,rows", [("gate_up_DX", 1536, 12288, 1), ("down_DF", 12288, 1536, 8),
                                            ("qkv_DX", 1536, 2560, 128), ("ple_gate_PD", 1536, 256, 3)])  # fmt: skip
def test_the_kernel_lowers_for_the_tpu(field: str, k: int, n: int, rows: int) -> None:
    """E2B's shapes at the tiling the fit check picks, exported for the TPU (Pallas's Mosaic lowering runs here;
    Mosaic's own compile needs a TPU): a Mosaic custom call named for the kernel."""
    p = fit.Projection(field=field, k=k, n=n, axis=0, group=128)
    t = fit_tpu.choose_tpu(p, fit_tpu.budget(fit_tpu.vmem_capacity("v5e"))).tiling
    assert t is not None
    f = jax.jit(lambda x, w, s: w4a16_tpu_matmul(x, w, s, k=k, n=n, group=128, tiling=t))
    args = (jax.ShapeDtypeStruct((rows, k), jnp.bfloat16), jax.ShapeDtypeStruct((k // 8, n), jnp.int32),
            jax.ShapeDtypeStruct((k // 128, n), jnp.bfloat16))  # fmt: skip
    text = jax.export.export(f, platforms=["tpu"])(*args).mlir_module()
    assert "tpu_custom_call" in text and KERNEL_NAME in text


# ---- the fit check and `bench kernels fit` --------------------------------------------------------------------------
def test_the_vector_unit_variant_lowers_for_the_tpu() -> None:
    t = TpuTiling(bm=128, bn=2048, bk=1536, vpu_rows=8)
    f = jax.jit(lambda x, w, s: w4a16_tpu_matmul(x, w, s, k=1536, n=12288, group=128, tiling=t))
    args = (jax.ShapeDtypeStruct((4, 1536), jnp.bfloat16), jax.ShapeDtypeStruct((192, 12288), jnp.int32),
            jax.ShapeDtypeStruct((12, 12288), jnp.bfloat16))  # fmt: skip
    assert "tpu_custom_call" in jax.export.export(f, platforms=["tpu"])(*args).mlir_module()
    assert fit_tpu.need_tpu(t, group=128).total == max(fit_tpu.need_tpu_vpu(t, group=128).total,
                                                       fit_tpu.need_tpu(TpuTiling(bm=128, bn=2048, bk=1536),
                                                                        group=128).total)  # fmt: skip
    assert fit_tpu.parse_tpu_tiling("tpu bm16 bn1024 bk256 vpu2") == TpuTiling(bm=16, bn=1024, bk=256, vpu_rows=2)


def test_every_e2b_projection_gets_a_tiling_within_the_budget() -> None:
    from model.config import PRESETS

    limit = fit_tpu.budget(fit_tpu.vmem_capacity("v5e"))
    assert limit == 12 * 2**20  # 3/4 of the 16 MiB scoped limit (v5e's 128 MiB does not cap it)
    for f in fit_tpu.plan_tpu(fit.projections(PRESETS["e2b"], 128), limit):
        assert f.fits and f.need.total <= limit and f.tiling.bm == fit_tpu.MAX_ROWS, f
        assert fit_tpu.fits_tpu(f.projection.k, f.projection.n, 128, f.tiling)


def test_need_formula_terms() -> None:
    """The module docstring's formula at one tiling, term by term (bfloat16 activations and scales)."""
    n = fit_tpu.need_tpu(TpuTiling(bm=16, bn=1024, bk=256), group=128)
    assert [b for _, b in n.terms] == [2 * 16 * 256 * 2, 2 * 32 * 1024 * 4, 2 * 16 * 1024 * 2, 2 * 16 * 1024 * 4,
                                       8 * 1024 * 4, 2 * 16 * 1024 * 4, 128 * 1024 * 2 + 2 * 16 * 1024 * 4]  # fmt: skip


def test_over_the_budget_is_one_line_naming_the_fix() -> None:
    p = fit.Projection(field="gate_up_DX", k=1536, n=12288, axis=0, group=128)
    f = fit_tpu.choose_tpu(p, fit_tpu.budget(), tiling=TpuTiling(bm=128, bn=12288, bk=1536))
    assert not f.fits and f.problem == "over the limit"
    line = fit_tpu.refusal_tpu(f, "TPU v5e")
    assert "\n" not in line and "over the budget" in line and "would fit" in line
    assert fit_tpu.choose_tpu(p, 1000).tiling is None  # nothing fits in 1000 B


def test_a_small_vmem_caps_the_budget() -> None:
    assert fit_tpu.budget(8 * 2**20) == 6 * 2**20 and fit_tpu.generation_of("TPU v5 lite") == "v5e"
    assert fit_tpu.generation_of("a GPU") is None


def test_bench_kernels_fit_on_a_tpu_prints_each_projection() -> None:
    proc = run_cli_here(["kernels", "fit", "--device-capability", "tpu", "--preset", "e2b", "--json"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "TPU v5e" in out["device"] and out["limit"] == 12 * 2**20 and len(out["rows"]) == 12
    assert all(r["fits"] and r["tiling"].startswith("tpu bm128") and 0 < r["need"] <= out["limit"]
               for r in out["rows"])  # fmt: skip


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--device-capability", "tpu-v9z"], ["--device-capability tpu-v9z", "tpu-v5e"]),
        (["--device-capability", "tpu", "--tiling", "bm16 bn128 bk256 stages3"], ["--tiling", "tpu bm16"]),
        (["--device-capability", "tpu", "--tiling", "tpu bm16 bn128 bk7"], ["tiles none", "bk 7"]),
    ],
)
def test_bench_kernels_fit_bad_tpu_input_is_one_line_exit_2(args, needles) -> None:
    proc = run_cli_here(["kernels", "fit", *args], timeout=120)
    assert_one_line_error(proc, *needles)


# ---- the engine's plan on a TPU (a stand-in device: no TPU here) -----------------------------------------------------
def test_the_engine_plans_the_tpu_kernel_on_a_tpu() -> None:
    """On a TPU device (device kind "TPU v5 lite"; jax's pltpu.get_tpu_info() needs a live TPU, so the table
    answers here): every E2B w4 projection gets a TPU tiling within 3/4 of the 16 MiB scoped limit; the log lines
    say the Mosaic lowering and the budget's source."""
    import types

    from model.config import PRESETS
    from model.kernels.choice import decide_mode, device_limit, plan_kernel
    from model.quantspec import parse_quant

    device = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    limit, source = device_limit(device)
    assert limit == 12 * 2**20 and "128 MiB" in source
    impl, why = decide_mode("tpu", None, True, None)
    plan = plan_kernel(PRESETS["e2b"], parse_quant("w4"), impl=impl, reason=why, act_bytes=2, scale_bytes=2,
                       device=device)  # fmt: skip
    assert plan.impl == "pallas" and plan.tpu and all(f.fits and isinstance(f.tiling, TpuTiling) for f in plan.fits)
    assert "Mosaic TPU lowering" in plan.lines()[0] and all(v.startswith("tpu bm") for v in plan.tiles.values())
    unknown = types.SimpleNamespace(platform="tpu", device_kind="TPU v99")
    assert device_limit(unknown)[0] == fit_tpu.budget()  # unknown VMEM: the scoped limit alone


def test_the_tpu_probe_runs_on_cpu(tmp_path) -> None:
    """scripts/probes/w4a16_tpu.py in interpret mode at one small shape: every case checked (error against
    dequantize-then-matmul at bfloat16 rounding) and written to its JSON; a bad argument is exit 2."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "scripts" / "probes" / "w4a16_tpu.py"
    spec = importlib.util.spec_from_file_location("w4a16_tpu_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.main(["--interpret", "--shapes", "256:256:1", "--rows", "2", "--iters", "1", "--reps", "2",
                       "--alternatives", "0", "--out", str(tmp_path)]) == 0  # fmt: skip
    res = json.loads((tmp_path / "w4a16_tpu.json").read_text())
    assert [c["variant"] for c in res["cases"]] == ["planned", "vpu", "xla", "xla_words"]
    assert all("error" not in c and c["rel_err"] < 2**-7 and c["weight_bytes"] == 256 * 128 + 2 * 256 * 2
               for c in res["cases"])  # fmt: skip
    assert probe.main(["--rows", "one"]) == 2


@pytest.mark.slow  # minutes on 2 cores: the decode and prefill programs compiled with the interpreted kernel
def test_the_engine_with_the_tpu_kernel_matches_xla(tiny_checkpoint) -> None:
    """A tiny w4:128 engine whose projections with K a multiple of 128 are stored in the TPU layout and run the TPU
    kernel (interpret mode; the others keep XLA's product, as the plan says) decodes the same tokens as the same
    engine on XLA's product, with close logits. In a fresh interpreter, as the GPU kernel's engine test (a crash
    stays in this test)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_w4a16_tpu_kernel as t; "
            "t.engine_with_tpu_kernel_matches_xla(sys.argv[2]); print('engine check ok')")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(tiny_checkpoint)],
                          capture_output=True, text=True, timeout=900, env=dict(os.environ, JAX_PLATFORMS="cpu"))  # fmt: skip
    assert proc.returncode == 0 and "engine check ok" in proc.stdout, (proc.returncode, proc.stderr[-3000:])


def engine_with_tpu_kernel_matches_xla(tiny_checkpoint) -> None:
    """The check of `test_the_engine_with_the_tpu_kernel_matches_xla`, in the process that calls it."""
    from pathlib import Path

    from model.engine import Engine, load_engine
    from model.kernels.choice import KernelPlan, with_tilings
    from model.quant import QuantArray, tree_bytes
    from model.quantspec import parse_quant

    engine, _ = load_engine(Path(tiny_checkpoint), quant=parse_quant("w4"), log_policy=False)
    fits = fit_tpu.plan_tpu(fit.projections(engine.cfg, 128), fit_tpu.budget(), act_bytes=4)
    plan = KernelPlan(impl="pallas", reason="test", limit=fit_tpu.budget(), limit_source="test", fits=fits, tpu=True)
    assert sum(f.fits for f in fits) >= 3  # the tiny shapes with K = 128 or 256 (K = 64 keeps XLA's product)
    params = with_tilings(engine.params, plan)
    leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda v: isinstance(v, QuantArray))
    assert any(isinstance(v, QuantArray) and isinstance(v.tiling, TpuTiling) for v in leaves)
    assert tree_bytes(params) == tree_bytes(engine.params)  # the TPU layout: the same bytes
    tiled = Engine(params, engine.cfg, engine.policy, quant=engine.quant, kernel=plan, max_length=64)
    prompt = [engine.cfg.bos_token_id, 5, 9, 11]
    assert tiled.generate(prompt, 4).token_ids == engine.generate(prompt, 4).token_ids
    np.testing.assert_allclose(tiled.next_token_logits(prompt, 4), engine.next_token_logits(prompt, 4), atol=1e-4)
