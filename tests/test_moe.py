"""The expert block (26B-A4B shape, model/moe.py): what a decode step reads, the tiled products against a plain
reference, quantized experts, balanced routing for dummy weights. Parity with transformers is in
tests/test_model_parity.py (fixture tiny-moe)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import moe
from model.cache import init_cache
from model.config import PRESETS
from model.forward import decode_step, forward_full, prefill
from model.params import init_params
from model.quant import QuantArray, dequantize, parse_quant, quantize_params

CFG = PRESETS["tiny-moe"]
EXPERT_FIELDS = ("experts_gate_up_EDX", "experts_down_EDF")
_full = jax.jit(forward_full, static_argnums=1)
_prefill = jax.jit(prefill, static_argnums=1)
_decode = jax.jit(decode_step, static_argnums=1)


@pytest.fixture(scope="module")
def params():
    return jax.tree_util.tree_map(jnp.asarray, init_params(CFG, 0))


def _dense(tree):
    return jax.tree_util.tree_map(lambda x: dequantize(x, jnp.float32) if isinstance(x, QuantArray) else x, tree,
                                  is_leaf=lambda x: isinstance(x, QuantArray))  # fmt: skip


# ---- what a decode step reads -------------------------------------------------------------------------------------
_SUBJAXPR = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "remat": "jaxpr", "checkpoint": "jaxpr",
             "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr"}  # fmt: skip


def _expert_reads(jaxpr, flagged: set, times: int, reads: list, misuse: list) -> None:
    """Walk `jaxpr` following the variables in `flagged` (the expert weights' arrays) into sub-programs; every
    `dynamic_slice` of one adds (its output's elements x the trips of the loops around it, the slice's shape) to
    `reads`; any other use of a flagged array (a product, a gather, a convert of the whole array) goes to `misuse`."""
    for eqn in jaxpr.eqns:
        hits = [i for i, v in enumerate(eqn.invars) if type(v).__name__ != "Literal" and v in flagged]
        if not hits:
            continue
        name = eqn.primitive.name
        if name == "dynamic_slice" and hits == [0]:
            shape = tuple(eqn.outvars[0].aval.shape)
            reads.append((math.prod(shape) * times, shape))
        elif name in _SUBJAXPR or name == "scan":
            sub = eqn.params["jaxpr"] if name == "scan" else eqn.params[_SUBJAXPR[name]]
            sub = getattr(sub, "jaxpr", sub)
            inner = {sub.invars[i] for i in hits}
            _expert_reads(sub, inner, times * (eqn.params["length"] if name == "scan" else 1), reads, misuse)
        elif name == "cond":
            for branch in eqn.params["branches"]:
                inner = {branch.jaxpr.invars[i - 1] for i in hits}
                _expert_reads(branch.jaxpr, inner, times, reads, misuse)
        else:
            misuse.append(name)


def _decode_reads(p, cfg, batch: int = 1):
    cache = init_cache(cfg, 16, jnp.float32, batch)  # traced only: its values do not matter
    leaves, tree = jax.tree_util.tree_flatten((p, cache), is_leaf=lambda x: isinstance(x, QuantArray))
    expert_ids = {id(getattr(lp, f)) for lp in p.layers for f in EXPERT_FIELDS}
    flat_positions = []
    position = 0
    for leaf in leaves:
        n = len(jax.tree_util.tree_leaves(leaf))
        if id(leaf) in expert_ids:
            flat_positions.extend(range(position, position + n))  # a QuantArray: its values and its scales
        position += n
    closed = jax.make_jaxpr(lambda pc, tok: decode_step(pc[0], cfg, tok, pc[1]))((p, cache), jnp.full((batch,), 7, jnp.int32))
    flagged = {closed.jaxpr.invars[i] for i in flat_positions}
    reads: list = []
    misuse: list = []
    _expert_reads(closed.jaxpr, flagged, 1, reads, misuse)
    return reads, misuse


@pytest.mark.parametrize("quant", ["none", "w8", "w4:16"])
def test_a_decode_step_reads_the_chosen_experts_only(params, quant):
    p = params if quant == "none" else quantize_params(params, parse_quant(quant))
    reads, misuse = _decode_reads(p, CFG)
    assert misuse == []  # no product, gather or convert ever takes a whole expert array
    lp = p.layers[0]
    per_expert = 0
    for f in EXPERT_FIELDS:  # one expert's slice of each weight: its values (and scales), 1/E of the array
        w = getattr(lp, f)
        arrays = (w.values, w.scales) if isinstance(w, QuantArray) else (w,)
        per_expert += sum(math.prod(a.shape) // a.shape[0] for a in arrays)
    assert all(shape[0] == 1 for _, shape in reads)  # each read is one expert's slice
    # K experts per layer, every layer: the top-k and nothing more (E = 8, K = 3 here).
    assert sum(n for n, _ in reads) == CFG.num_layers * CFG.top_k_experts * per_expert


def test_unchosen_experts_never_touch_the_result(params):
    # Experts the router did not pick hold NaN: a step that multiplied, gathered or summed them would turn NaN.
    rng = np.random.default_rng(0)
    lp = params.layers[0]
    for n_tok in (1, 2, 9):  # one tile per assignment (n*K <= E), and sorted tiles (n*K > E)
        x = jnp.asarray(rng.standard_normal((n_tok, CFG.hidden_size)), jnp.float32)
        idx, w = moe.route(lp, CFG, x)
        chosen = np.zeros(CFG.num_experts, bool)
        chosen[np.asarray(idx).ravel()] = True
        poisoned = dataclasses.replace(lp, **{f: jnp.where(jnp.asarray(chosen)[:, None, None], getattr(lp, f), jnp.nan)
                                              for f in EXPERT_FIELDS})  # fmt: skip
        products = jax.jit(moe.expert_products, static_argnums=4)
        want = products(lp, x, idx, w, CFG.num_experts)
        got = products(poisoned, x, idx, w, CFG.num_experts)
        if n_tok == 9:
            assert not chosen.all() or n_tok * CFG.top_k_experts > CFG.num_experts
        assert np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=0)


# ---- the arithmetic -------------------------------------------------------------------------------------------------
def _reference(lp, x, idx, w):
    """Plain numpy: for each token and each of its experts, down(gelu(gate x) * up x) times its weight."""
    gu, dn = np.asarray(lp.experts_gate_up_EDX, np.float64), np.asarray(lp.experts_down_EDF, np.float64)
    x, idx, w = np.asarray(x, np.float64), np.asarray(idx), np.asarray(w, np.float64)
    out = np.zeros_like(x)
    half = gu.shape[-1] // 2
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            z = x[t] @ gu[idx[t, j]]
            g = z[:half]
            act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
            out[t] += w[t, j] * (dn[idx[t, j]] @ (act * z[half:]))
    return out


@pytest.mark.parametrize("n_tok", [1, 2, 3, 5, 24, 40])
def test_tiles_equal_a_plain_reference(params, n_tok):
    rng = np.random.default_rng(n_tok)
    lp = params.layers[1]
    x = jnp.asarray(rng.standard_normal((n_tok, CFG.hidden_size)), jnp.float32)
    idx = jnp.asarray(np.stack([rng.choice(CFG.num_experts, CFG.top_k_experts, replace=False) for _ in range(n_tok)]),
                      jnp.int32)  # fmt: skip
    if n_tok == 40:  # a skewed step: most tokens on two experts, so one expert spans several tiles
        idx = idx.at[:30, :2].set(jnp.asarray([2, 5], jnp.int32))
    w = jnp.asarray(rng.uniform(0.1, 1, (n_tok, CFG.top_k_experts)), jnp.float32)
    got = jax.jit(moe.expert_products, static_argnums=4)(lp, x, idx, w, CFG.num_experts)
    np.testing.assert_allclose(np.asarray(got), _reference(lp, x, idx, w), rtol=2e-5, atol=2e-6)


def test_tile_plan():
    assert moe.tile_rows(3, 8) == 1 and moe.tile_rows(8, 8) == 1  # decode: one tile per assignment
    assert moe.tile_rows(9, 8) == 2 and moe.tile_rows(72, 8) == 16 and moe.tile_rows(10**6, 8) == moe.MAX_TILE
    # The bound holds for the worst spread: every expert one row past a whole tile.
    for n, e in ((9, 8), (72, 8), (1024, 128), (40, 8)):
        m = moe.tile_rows(n, e)
        assert moe.tile_count(n, e, m) >= sum(-(-c // m) for c in [n - (e - 1)] + [1] * (e - 1))


@pytest.mark.parametrize("quant", ["w8", "w4:16"])
def test_quantized_experts_equal_their_dequantized_weights(params, quant):
    # The same products as every other quantized weight (model.quant.matmul on each expert's slice).
    q = quantize_params(params, parse_quant(quant))
    lp = q.layers[0]
    assert all(isinstance(getattr(lp, f), QuantArray) for f in EXPERT_FIELDS)
    assert not isinstance(lp.router_DE, QuantArray)  # the router stays dense
    ids = jnp.asarray(np.random.default_rng(1).integers(3, CFG.vocab_size, (1, 20)), jnp.int32)
    got, want = _full(q, CFG, ids), _full(_dense(q), CFG, ids)
    assert float(jnp.max(jnp.abs(got - want))) <= 1e-5 * float(jnp.max(jnp.abs(want)))


def test_cached_prefill_and_decode_equal_the_full_forward(params):
    # Two rows: prefill's 24 assignments per layer take sorted tiles, each decode step's 6 one tile each.
    ids = jnp.asarray(np.random.default_rng(2).integers(3, CFG.vocab_size, (2, 20)), jnp.int32)
    full = _full(params, CFG, ids)
    cache = init_cache(CFG, 32, jnp.float32, 2)
    out, cache = _prefill(params, CFG, ids[:, :12], jnp.int32(12), cache)
    errs = [float(jnp.max(jnp.abs(out - full[:, 11])))]
    for t in range(12, 20):
        out, cache = _decode(params, CFG, ids[:, t], cache)
        errs.append(float(jnp.max(jnp.abs(out - full[:, t]))))
    assert max(errs) <= 1e-5 * float(jnp.max(jnp.abs(full)))


# ---- balanced routing (dummy weights) -----------------------------------------------------------------------------
@pytest.mark.parametrize("n_tok", [1, 8, 16])
def test_balanced_routing_uses_every_expert_equally_often(params, n_tok):
    cfg = dataclasses.replace(CFG, expert_routing="balanced")
    x = jnp.asarray(np.random.default_rng(3).standard_normal((n_tok, cfg.hidden_size)), jnp.float32)
    idx, w = moe.route(params.layers[2], cfg, x, layer=2)
    idx = np.asarray(idx)
    assert idx.shape == (n_tok, cfg.top_k_experts)
    assert all(len(set(row)) == cfg.top_k_experts for row in idx)  # K distinct experts per token, as the router's
    counts = np.bincount(idx.ravel(), minlength=cfg.num_experts)
    assert counts.max() - counts.min() <= (0 if n_tok * cfg.top_k_experts % cfg.num_experts == 0 else 1)
    np.testing.assert_allclose(np.asarray(w).sum(-1) > 0, True)
    _, w_router = moe.route(params.layers[2], CFG, x, layer=2)
    assert w.shape == w_router.shape


def test_balanced_routing_for_dummy_weights_is_recorded(monkeypatch, tmp_path):
    from bench.cli.common import engine_manifest
    from bench.runs import Workload
    from model.engine import load_engine
    from model.errors import EngineError
    from model.policy import decide_policy
    from model.random_weights import ROUTING_ENV

    monkeypatch.setenv("GEMMA4_BENCH_CACHE", str(tmp_path))
    monkeypatch.setenv(ROUTING_ENV, "balanced")
    engine, report = load_engine("random:tiny-moe", policy=decide_policy("float32"), max_length=64, log_policy=False,
                                 quant=parse_quant("w8"))  # fmt: skip
    assert engine.cfg.expert_routing == "balanced" and report["dummy"]["expert_routing"] == "balanced"
    assert isinstance(engine.params.layers[0].experts_gate_up_EDX, QuantArray)  # drawn in the final layout
    assert len(engine.generate([2, 17, 33], 4).token_ids) == 4
    ck = engine_manifest("generate", engine, report, "random:tiny-moe", None, Workload()).to_dict()["checkpoint"]
    assert ck["dummy"]["expert_routing"] == "balanced" and ck["id"] == "random-tiny-moe-float32-seed0-balanced"
    monkeypatch.setenv(ROUTING_ENV, "uniform")
    with pytest.raises(EngineError, match=f"{ROUTING_ENV}='uniform': expected one of router, balanced"):
        load_engine("random:tiny-moe", policy=decide_policy("float32"), log_policy=False)


def test_dummy_expert_weights_are_drawn_by_blocks_in_their_final_layout(monkeypatch):
    import model.random_weights as rw

    monkeypatch.setattr(rw, "DRAW_BLOCK", 3 * CFG.hidden_size * 2 * CFG.moe_intermediate_size)  # 3 experts a block
    dense, _ = rw.random_params(CFG, 0, dtype=jnp.float32)
    quant, _ = rw.random_params(CFG, 0, dtype=jnp.float32, quant=parse_quant("w8"))
    for f in EXPERT_FIELDS:
        d, q = getattr(dense.layers[1], f), getattr(quant.layers[1], f)
        assert isinstance(q, QuantArray) and q.shape == d.shape == getattr(CFG_SHAPES, f)
        step = np.asarray(q.scales, np.float32)  # w8: one scale per (expert, output channel)
        assert np.all(np.abs(np.asarray(dequantize(q, jnp.float32)) - np.asarray(d)) <= step / 2 + 1e-6)
    gu = np.asarray(dense.layers[1].experts_gate_up_EDX)
    assert abs(gu.std() * CFG.hidden_size**0.5 - 1) < 0.1  # std 1/sqrt(fan_in), fan_in = D
    assert not np.array_equal(gu[0], gu[3])  # each block drawn with its own key


class CFG_SHAPES:
    experts_gate_up_EDX = (CFG.num_experts, CFG.hidden_size, 2 * CFG.moe_intermediate_size)
    experts_down_EDF = (CFG.num_experts, CFG.hidden_size, CFG.moe_intermediate_size)


@pytest.mark.parametrize("quant", ["w8", "w4:16"])
def test_tpu_storage_of_quantized_experts_is_words_with_the_same_products(params, quant):
    # On a TPU the expert values are held in uint32 words (model.quantspec.WORD_TABLES): sliced per expert and
    # multiplied plane by plane there. Here: the same values, and the planes product of a slice equals the bytes'.
    from model import quant as quant_mod

    spec = parse_quant(quant)
    tpu, cpu = quantize_params(params, spec, platform="tpu"), quantize_params(params, spec, platform="cpu")
    rng = np.random.default_rng(4)
    for f, lhs, rhs, out in (("experts_gate_up_EDX", "MD", "DX", "MX"), ("experts_down_EDF", "MF", "DF", "MD")):
        w_t, w_c = getattr(tpu.layers[0], f), getattr(cpu.layers[0], f)
        assert w_t.words and not w_c.words and w_t.values.dtype == jnp.uint32
        np.testing.assert_array_equal(np.asarray(dequantize(w_t, jnp.float32)), np.asarray(dequantize(w_c, jnp.float32)))
        s_t, s_c = moe.expert_weight(w_t, jnp.int32(5)), moe.expert_weight(w_c, jnp.int32(5))
        x = jnp.asarray(rng.standard_normal((3, s_c.shape[rhs.index(lhs[1])])), jnp.float32)
        planes = quant_mod._planes_form(x, s_t, lhs, rhs, out)
        assert planes is not None
        want = jnp.einsum(f"{lhs},{rhs}->{out}", x, dequantize(s_c, jnp.float32))
        np.testing.assert_allclose(np.asarray(planes), np.asarray(want), rtol=1e-5, atol=1e-5)
    ids = jnp.asarray([[2, 40, 41, 300, 7]], jnp.int32)
    np.testing.assert_allclose(np.asarray(_full(tpu, CFG, ids)), np.asarray(_full(cpu, CFG, ids)), rtol=0, atol=1e-6)
