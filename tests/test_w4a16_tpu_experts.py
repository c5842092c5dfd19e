"""The TPU expert kernel (`model.kernels.w4a16_tpu.w4a16_tpu_expert_matmul`) in interpret mode against
dequantize-then-matmul, the batched TPU layout of expert leaves (`model.kernels.tpu_layout.to_tpu_experts`), the
plan of the expert projections on a TPU (`model.kernels.fit_tpu.expert_projections`, `model.kernels.choice`), the
kernel's lowering for the TPU on this CPU machine (`jax.export`, platforms ["tpu"]) at 26B-A4B's expert shapes, and
the expert block (`model.moe`) with TPU-tiled expert leaves against the same block with natural leaves.

Tolerances as tests/test_w4a16_tpu_kernel.py: float32 activations 1e-5 x sum_k |x_k w_kn|; bfloat16 activations
additionally 2^-7 x |reference| (the output rounded to bfloat16)."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import moe
from model.config import PRESETS
from model.kernels import fit_tpu
from model.kernels.choice import plan_kernel, with_tilings
from model.kernels.fit_tpu import TpuTiling
from model.kernels.tpu_layout import to_natural_experts, to_tpu_experts
from model.kernels.w4a16_tpu import EXPERT_KERNEL_NAME, w4a16_tpu_expert_matmul
from model.params import init_params
from model.quant import QuantArray, dequantize, parse_quant, quantize_channels, quantize_params

TPU = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
"""A stand-in TPU device for the plan (`model.kernels.choice.device_limit` reads its kind: v5e's VMEM table)."""


def _experts(e: int, a: int, b: int, axis: int, seed: int = 0) -> QuantArray:
    """A w4:128 expert leaf [E, A, B] contracted along `axis` (1: [E, K, N], gate_up; 2: [E, N, K], down)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((e, a, b)).astype(np.float32) / np.sqrt((a, b)[axis - 1])
    return quantize_channels(w, 4, axis, 128)


def _reference(x_UMK: np.ndarray, q: QuantArray, axis: int, ids) -> tuple[np.ndarray, np.ndarray]:
    """(per tile x @ W_e in float64, sum_k |x_k W_kn|) with W_e expert e's dequantized weight as [K, N]."""
    w = np.asarray(dequantize(q, jnp.float32), np.float64)
    w_EKN = w if axis == 1 else np.swapaxes(w, 1, 2)
    x64 = np.asarray(x_UMK, np.float64)
    want = np.stack([x64[u] @ w_EKN[i] for u, i in enumerate(ids)])
    scale = np.stack([np.abs(x64[u]) @ np.abs(w_EKN[i]) for u, i in enumerate(ids)])
    return want, scale


@pytest.mark.parametrize("e,a,b,axis,ids,m,t,dtype", [
    (3, 256, 384, 1, [2, 0, 2, 1, 1], 1, TpuTiling(bm=16, bn=128, bk=256), jnp.float32),  # decode: M = 1
    (4, 384, 192, 2, [3, 3, 0], 5, TpuTiling(bm=16, bn=384, bk=256), jnp.float32),  # K = 192 padded to 256
    (2, 512, 256, 1, [1, 0], 40, TpuTiling(bm=16, bn=256, bk=512), jnp.bfloat16),  # three row blocks per tile
    (5, 2048, 256, 1, [4, 1, 3], 2, TpuTiling(bm=16, bn=128, bk=2048), jnp.float32),  # 16 groups in one step
])  # fmt: skip
def test_expert_kernel_equals_dequantize_then_matmul(e, a, b, axis, ids, m, t, dtype):
    q = _experts(e, a, b, axis, seed=e)
    k, n = (a, b) if axis == 1 else (b, a)
    words, scales = to_tpu_experts(q.values, q.scales, q.shape, axis, 128)
    kp = fit_tpu.padded_k(k, 128)
    assert words.shape == (e, kp // 8, n) and words.dtype == jnp.int32 and scales.shape == (e, kp // 128, n)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((len(ids), m, k)), dtype)
    got = w4a16_tpu_expert_matmul(x, words, scales, jnp.asarray(ids, jnp.int32), k=kp, n=n, group=128, tiling=t,
                                  interpret=True)  # fmt: skip
    assert got.shape == (len(ids), m, n) and got.dtype == dtype
    want, scale = _reference(x, q, axis, ids)
    tol = 1e-5 * scale + (2**-7 * np.abs(want) if dtype == jnp.bfloat16 else 0)
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= tol + 1e-30)


@pytest.mark.parametrize("a,b,axis", [(256, 384, 1), (384, 192, 2), (256, 7, 1)])
def test_the_batched_layout_round_trips(a, b, axis):
    q = _experts(3, a, b, axis)
    words, scales = to_tpu_experts(q.values, q.scales, q.shape, axis, 128)
    values, back = to_natural_experts(words, scales, q.shape, axis, 128)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(q.values))
    np.testing.assert_array_equal(np.asarray(back), np.asarray(q.scales))
    # And one expert's slice read back through moe.expert_weight (the path anything but the kernel takes).
    tiled = dataclasses.replace(q, values=words, scales=scales, tiling=TpuTiling(bm=16, bn=128, bk=256))
    np.testing.assert_array_equal(np.asarray(dequantize(moe.expert_weight(tiled, jnp.int32(2)), jnp.float32)),
                                  np.asarray(dequantize(q, jnp.float32))[2])  # fmt: skip
    np.testing.assert_array_equal(np.asarray(dequantize(tiled, jnp.float32)), np.asarray(dequantize(q, jnp.float32)))


def test_a_tiling_or_shapes_that_do_not_fit_are_refused():
    words = jnp.zeros((2, 32, 128), jnp.int32)
    scales = jnp.zeros((2, 2, 128), jnp.float32)
    x = jnp.zeros((1, 1, 256), jnp.float32)
    ids = jnp.zeros((1,), jnp.int32)
    with pytest.raises(ValueError, match="bk 384 does not divide K=256"):
        w4a16_tpu_expert_matmul(x, words, scales, ids, k=256, n=128, group=128, tiling=TpuTiling(bm=16, bn=128, bk=384))
    with pytest.raises(ValueError, match=r"expected \(2, 32, 128\), \(2, 2, 128\), \(1,\)"):
        w4a16_tpu_expert_matmul(x, words, scales[:, :1], ids, k=256, n=128, group=128,
                                tiling=TpuTiling(bm=16, bn=128, bk=256))  # fmt: skip


# ---- the plan and the TPU lowering at 26B-A4B's shapes --------------------------------------------------------------
def _plan(cfg):
    return plan_kernel(cfg, parse_quant("w4"), impl="pallas", reason="test", act_bytes=2, scale_bytes=2, device=TPU)


def test_the_expert_projections_are_planned_on_a_tpu():
    cfg = PRESETS["26b-a4b"]
    projs = {p.field: p for p in fit_tpu.expert_projections(cfg, 128)}
    assert (projs["experts_gate_up_EDX"].k, projs["experts_gate_up_EDX"].n) == (2816, 1408)
    assert (projs["experts_down_EDF"].k, projs["experts_down_EDF"].n) == (768, 2816)  # I = 704 padded to 768
    plan = _plan(cfg)
    gu = plan.tiling_of("experts_gate_up_EDX", (128, 2816, 1408))
    dn = plan.tiling_of("experts_down_EDF", (128, 2816, 704))
    assert isinstance(gu, TpuTiling) and isinstance(dn, TpuTiling)
    assert any("experts_down_EDF K=768 N=2816" in line for line in plan.lines())
    assert fit_tpu.expert_projections(PRESETS["e2b"], 128) == ()  # no experts, nothing planned


@pytest.mark.parametrize("field,u,m", [("experts_gate_up_EDX", 8, 1), ("experts_down_EDF", 8, 1),
                                       ("experts_gate_up_EDX", 12, 64)])  # fmt: skip
def test_the_expert_kernel_lowers_for_the_tpu(field, u, m):
    """26B-A4B's expert shapes at the tilings the plan picks (decode: 8 tiles of one row; prefill: tiles of 64 rows,
    with a smaller row block so each tile takes several), exported for the TPU: a Mosaic custom call named for the
    expert kernel."""
    cfg = PRESETS["26b-a4b"]
    p = {q.field: q for q in fit_tpu.expert_projections(cfg, 128)}[field]
    t = fit_tpu.choose_tpu(p, fit_tpu.budget(fit_tpu.vmem_capacity("v5e"))).tiling
    assert t is not None
    if m > 16:
        t = dataclasses.replace(t, bm=32)
    f = jax.jit(lambda x, w, s, i: w4a16_tpu_expert_matmul(x, w, s, i, k=p.k, n=p.n, group=128, tiling=t))
    e = cfg.num_experts
    args = (jax.ShapeDtypeStruct((u, m, p.k), jnp.bfloat16), jax.ShapeDtypeStruct((e, p.k // 8, p.n), jnp.int32),
            jax.ShapeDtypeStruct((e, p.k // 128, p.n), jnp.bfloat16), jax.ShapeDtypeStruct((u,), jnp.int32))  # fmt: skip
    text = jax.export.export(f, platforms=["tpu"])(*args).mlir_module()
    assert "tpu_custom_call" in text and EXPERT_KERNEL_NAME in text


# ---- the expert block with TPU-tiled expert leaves ------------------------------------------------------------------
CFG = dataclasses.replace(PRESETS["tiny-moe"], hidden_size=256, moe_intermediate_size=192, num_layers=1,
                          layer_types=PRESETS["tiny-moe"].layer_types[:1])  # fmt: skip
"""26B-A4B's block in small: E = 8, K = 3, D = 256 (gate_up's K: two groups of 128), I = 192 (down's K: a short
last group, padded to 256 as 26B-A4B's 704 is to 768)."""


@pytest.fixture(scope="module")
def layers():
    params = jax.tree_util.tree_map(jnp.asarray, init_params(CFG, 0))
    spec = parse_quant("w4")
    natural = quantize_params(params, spec, platform="cpu")
    tiled = with_tilings(quantize_params(params, spec, platform="tpu"), _plan(CFG))  # the TPU's words, re-laid
    return natural.layers[0], tiled.layers[0]


def test_with_tilings_stores_the_expert_leaves_in_the_batched_layout(layers):
    natural, tiled = layers
    for f in ("experts_gate_up_EDX", "experts_down_EDF"):
        w = getattr(tiled, f)
        assert isinstance(w.tiling, TpuTiling) and not w.words and w.values.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(dequantize(w, jnp.float32)),
                                      np.asarray(dequantize(getattr(natural, f), jnp.float32)))  # fmt: skip
    assert tiled.experts_down_EDF.values.shape == (8, 256 // 8, 256)  # [E, Kp / 8, N]: K = 192 padded


def test_with_tilings_releases_each_expert_leaf_when_asked():
    params = jax.tree_util.tree_map(jnp.asarray, init_params(CFG, 1))
    q = quantize_params(params, parse_quant("w4"), platform="tpu")
    old = q.layers[0].experts_gate_up_EDX
    new = with_tilings(q, _plan(CFG), release=True).layers[0].experts_gate_up_EDX
    assert old.values.is_deleted() and old.scales.is_deleted() and not new.values.is_deleted()


@pytest.mark.parametrize("n_tok", [1, 2, 5])
def test_the_block_with_tiled_experts_equals_the_block_with_natural_ones(layers, n_tok):
    """Decode (n_tok K <= E: one tile per assignment) and sorted tiles (5 tokens: 15 assignments, tiles of 2
    rows), the same routing on both; one kernel call per projection (2 pallas_calls in the block's program)."""
    natural, tiled = layers
    rng = np.random.default_rng(n_tok)
    x = jnp.asarray(rng.standard_normal((n_tok, CFG.hidden_size)), jnp.float32)
    idx = jnp.asarray(np.stack([rng.choice(CFG.num_experts, CFG.top_k_experts, replace=False)
                                for _ in range(n_tok)]), jnp.int32)  # fmt: skip
    if n_tok == 2:  # both tokens on the same experts, in another order: shared experts' tiles become adjacent
        idx = idx.at[1].set(idx[0, ::-1])
    w = jnp.asarray(rng.uniform(0.1, 1, (n_tok, CFG.top_k_experts)), jnp.float32)
    program = str(jax.make_jaxpr(moe.expert_products, static_argnums=4)(tiled, x, idx, w, CFG.num_experts))
    assert program.count("pallas_call[") == 2 and EXPERT_KERNEL_NAME in program
    got = moe.expert_products(tiled, x, idx, w, CFG.num_experts)
    want = moe.expert_products(natural, x, idx, w, CFG.num_experts)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_the_expert_block_routes_the_same_and_equals_the_natural_one(layers):
    """`moe.expert_block` (router, norms, experts) on 3 tokens (9 assignments > E: sorted tiles) and on 1."""
    natural, tiled = layers
    for n_tok in (1, 3):
        h = jnp.asarray(np.random.default_rng(7 + n_tok).standard_normal((1, n_tok, CFG.hidden_size)), jnp.float32)
        got = moe.expert_block(tiled, CFG, h, layer=0)
        want = moe.expert_block(natural, CFG, h, layer=0)
        # The output is RMS-normed (entries of order 1): float32 sums in another order differ by ~1e-5 there.
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("n_tok", [1, 5])
def test_only_the_kernel_reads_the_expert_arrays(layers, n_tok):
    """In the block's program the expert leaves' arrays (values and scales) go into the two kernel calls and into
    nothing else: no slice, gather, convert or product of them outside the kernel (whose index maps copy the chosen
    experts' blocks only)."""
    from test_moe import _expert_reads

    _, tiled = layers
    x = jnp.zeros((n_tok, CFG.hidden_size), jnp.float32)
    idx = jnp.zeros((n_tok, CFG.top_k_experts), jnp.int32)
    w = jnp.ones((n_tok, CFG.top_k_experts), jnp.float32)
    closed = jax.make_jaxpr(lambda lp: moe.expert_products(lp, x, idx, w, CFG.num_experts))(tiled)
    leaves = jax.tree_util.tree_leaves(tiled)
    flagged = {closed.jaxpr.invars[i] for i, a in enumerate(leaves)
               if any(a is b for f in ("experts_gate_up_EDX", "experts_down_EDF")
                      for b in (getattr(tiled, f).values, getattr(tiled, f).scales))}  # fmt: skip
    assert len(flagged) == 4
    reads, uses = [], []
    _expert_reads(closed.jaxpr, flagged, 1, reads, uses)
    assert reads == [] and uses == ["pallas_call"] * 2  # one call per projection (its values and scales)


def test_the_whole_forward_with_the_tpu_plan_equals_the_natural_one():
    """The model of `CFG` with every leaf the stand-in TPU plan tiles (layer projections and experts) in the TPU
    layouts, through the forward pass, against the same quantized values in the w4 layout."""
    from model.forward import forward_full

    params = jax.tree_util.tree_map(jnp.asarray, init_params(CFG, 0))
    spec = parse_quant("w4")
    natural = quantize_params(params, spec, platform="cpu")
    tiled = with_tilings(quantize_params(params, spec, platform="tpu"), _plan(CFG))
    assert isinstance(tiled.layers[0].experts_down_EDF.tiling, TpuTiling)
    ids = jnp.asarray([[2, 40, 41, 300, 7]], jnp.int32)
    full = jax.jit(forward_full, static_argnums=1)
    got, want = full(tiled, CFG, ids), full(natural, CFG, ids)
    assert float(jnp.max(jnp.abs(got - want))) <= 1e-5 * float(jnp.max(jnp.abs(want)))


def test_the_placed_tree_has_the_bytes_the_accounting_gives_a_tpu():
    """The parameters as the stand-in TPU plan places them (experts' K = 192 padded to 256) hold exactly
    `model.accounting`'s bytes in the TPU layout, more than in the natural layout (which the CPU tree holds)."""
    from model.accounting import NATURAL, TPU_LAYOUT, weight_bytes
    from model.quant import tree_bytes

    params = jax.tree_util.tree_map(jnp.asarray, init_params(CFG, 0))
    spec = parse_quant("w4")
    natural = quantize_params(params, spec, platform="cpu")
    tiled = with_tilings(quantize_params(params, spec, platform="tpu"), _plan(CFG))
    size = params.embed_VD.dtype.itemsize
    pad = CFG.num_layers * CFG.num_experts * CFG.hidden_size * (256 - 192) // 2
    assert tree_bytes(natural) == weight_bytes(CFG, size, quant=spec, layout=NATURAL)
    assert tree_bytes(tiled) == weight_bytes(CFG, size, quant=spec, layout=TPU_LAYOUT) == tree_bytes(natural) + pad


def test_bench_kernels_fit_lists_the_expert_projections_on_a_tpu(capsys):
    """`bench kernels fit --device-capability tpu --preset 26b-a4b --quant w4`: the dense projections and the two
    expert projections (one expert's product, K padded; the [E, K / 8, N] words), each with the tiling the engine's
    plan picks, its grid steps and its VMEM bytes within the budget; no expert rows on a model without experts."""
    import json

    from conftest import assert_one_line_error, bench_captured

    code, out, err = bench_captured(["kernels", "fit", "--device-capability", "tpu", "--preset", "26b-a4b", "--quant",
                                     "w4", "--json"], capsys)  # fmt: skip
    assert code == 0, err
    rows = {r["projection"]: r for r in json.loads(out)["rows"]}
    gu, dn = rows["experts_gate_up_EDX"], rows["experts_down_EDF"]
    assert (gu["k"], gu["n"], gu["words"], gu["experts"]) == (2816, 1408, [128, 352, 1408], 128)
    assert (dn["k"], dn["k_unpadded"], dn["n"], dn["words"]) == (768, 704, 2816, [128, 96, 2816])
    plan = _plan(PRESETS["26b-a4b"])
    for r, shape in ((gu, (128, 2816, 1408)), (dn, (128, 2816, 704))):
        t = plan.tiling_of(r["projection"], shape)
        assert r["fits"] and r["tiling"] == t.text and r["layers"] == 30
        assert r["grid_steps"] == fit_tpu.grid_steps(r["k"], r["n"], t) and 0 < r["need"] <= r["limit"]
    assert rows["qkv_DX"]["experts"] is None and rows["qkv_DX"]["words"] == [352, rows["qkv_DX"]["n"]]
    code, out, _ = bench_captured(["kernels", "fit", "--device-capability", "tpu", "--preset", "26b-a4b", "--quant",
                                   "w4"], capsys)  # fmt: skip
    assert code == 0 and "768 (704 padded)" in out and "[128, 96, 2816]" in out and "expert rows:" in out
    code, out, _ = bench_captured(["kernels", "fit", "--device-capability", "tpu", "--preset", "e2b", "--json"], capsys)
    assert not any(r["experts"] for r in json.loads(out)["rows"])
    code, out, err = bench_captured(["kernels", "fit", "--device-capability", "tpu", "--preset", "26b-a4b", "--quant",
                                     "w8"], capsys)  # fmt: skip
    assert_one_line_error(types.SimpleNamespace(returncode=code, stdout=out, stderr=err), "--quant w8", "no",
                          "--quant w4")  # fmt: skip
