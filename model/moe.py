"""The expert block of Gemma 4 26B-A4B: the router and the experts' products, decode-first.

Key: N tokens (B*T rows of the activations), D model width, E experts, K experts per token (top-k), I expert width,
X = 2I (gate and up side by side), M rows per tile, U tiles.

What is computed (transformers 5.23 models/gemma4/modeling_gemma4.py, `Gemma4TextRouter`, `Gemma4TextExperts`,
`Gemma4TextDecoderLayer.forward`; google-deepmind/gemma gemma/gm/nn/gemma4/_moe.py holds the same block):
- router, on the residual stream before the feed-forward (not the MLP's normed input): x = RMSNorm without weight
  (float32, cast back) * router.scale * D^-1/2; logits = x @ router.proj^T; probabilities = softmax(logits) in
  float32; the top K by probability; their probabilities divided by their sum; each times router.per_expert_scale
  of its expert.
- experts, on pre_feedforward_layernorm_2(residual): for each chosen expert, down(gelu_tanh(gate(x)) * up(x)) with
  that expert's gate_up_proj [2I, D] (gate the first I rows) and down_proj [D, I], times its routing weight, summed
  over the K experts of the token.
- `model.layers.layer_tail` adds post_feedforward_layernorm_1(dense MLP) and post_feedforward_layernorm_2(experts)
  and normalises the sum with post_feedforward_layernorm.

How the experts' weights are read (`expert_products`): the (token, expert) assignments are grouped into tiles of M
rows that share one expert, and a loop over the tiles (`jax.lax.map`) slices ONE expert's weights per tile
(`expert_weight`: a dynamic index on the expert axis, of a dense array or of a quantized array's values and
scales) and multiplies its rows by it with `model.quant.matmul`, the product every other weight goes through (w8,
w4: `model.quantspec.EXPERT_PROJECTIONS`). So no program ever multiplies, gathers or converts the whole expert
array: a step reads the weights of its tiles' experts only.
- Decode (N*K <= E, e.g. one token: K assignments): M = 1, one tile per assignment, no sorting: the K experts the
  router chose are the only expert weights read (tests/test_moe.py counts them in the step's program).
- Prefill and larger batches (N*K > E): sort and segment. The assignments are sorted by expert, each expert's run
  padded to a whole number of tiles of M rows (M the power of two >= N*K / E, at most `MAX_TILE`), and the
  tiles past the last used one are skipped (`jax.lax.cond`), so each expert that received tokens is read once per
  M of its rows and experts nobody chose are not read. Padding rows are zeros and are dropped.
- Expert parallel (ep = G devices, `model.sharding`): the expert leaves are held grouped by device and
  `grouped_expert_products` walks each device's chosen experts, one slice per trip, the same rule: no whole
  expert array is ever read.
- `w4` experts on a TPU (their leaves in the batched TPU layout, `model.kernels.tpu_layout.to_tpu_experts`, a
  `TpuTiling` set at load by `model.kernels.choice.with_tilings`): no loop; one call of the TPU expert kernel
  per projection (`model.kernels.w4a16_tpu.w4a16_tpu_expert_matmul`, `_kernel_ffn`), each tile's expert id read
  by the kernel's index maps so only the chosen experts' blocks are copied. Decode: the N*K assignments are the
  tiles (M = 1, x rows gathered per assignment), sorted by expert so that assignments sharing an expert are
  adjacent tiles (Pallas's pipeline does not copy a block again when its index is unchanged from the previous
  grid step: with one grid step per tile, as at 26B-A4B's tilings, a step of N tokens copies each distinct expert
  once); sorted tiles: the same U tiles as the loop, the ones past the last used computed on zero rows with the
  last used tile's expert (their results dropped; no extra copy at one grid step per tile, else one expert's
  blocks per unused tile). Both leaves must be tiled (else the loop, which reads a tiled leaf's slices back in the
  w4 layout, `expert_weight`). The expert-parallel walk keeps the loop (a mesh never plans the kernel:
  `model.sharding.prepare_mesh`).
Why not `jax.lax.ragged_dot`: it takes a dense weight array (no quantized experts without converting all of
them), and XLA:CPU ran it slower than computing every expert on every token: scripts/probes/moe_forms.py --small
(2-core CPU under load, jax 0.12, float32, E = 32, D = 512, I = 128, K = 4), ms per call of one layer's experts,
tiles / ragged_dot / every expert: 1 token 1.66 / 33.0 / 12.7, 8 tokens 1.46 / 38.7 / 19.3, 128 tokens 10.1 /
418.5 / 162.6 (docs/engine.md "Mixture of experts: what a step reads"). The same script at 26B-A4B's shapes on a
TPU says which form to prefer there.

What a measured run read (`recording_routes`, `distinct_experts`): the engine's decode programs record each layer's
expert ids as `route` chose them and return, beside the next token, the number of distinct experts per layer
across the step's tokens (the union over a batch's rows), from which the sweep counts a step's bytes
(docs/method.md, "Bytes that follow the routing").
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from model.config import ModelConfig
from model.kernels.fit_tpu import TpuTiling
from model.ops import dense, gelu, rms_norm
from model.quant import QuantArray, grouped_axis, matmul

MAX_TILE = 64
"""Most rows a tile of the sorted assignments holds (prefill): a tile reads one expert's weights whole, so larger
tiles read each expert fewer times at the cost of more padding rows."""

ROUTINGS = ("router", "balanced")
"""How tokens are assigned to experts: "router" (the model's router: the top K of its probabilities) or
"balanced" (dummy weights only, `model.random_weights`: assignment j of a step's N*K, in token-major order, goes to
expert (j + layer * K) mod E, so across a step's tokens every expert is chosen equally often (to within one when
E does not divide N*K), each token's K experts distinct when K <= E; the weights are the router's probabilities of
those experts, renormalised and scaled as in "router", so the router still runs and its cost is measured)."""


def _rms(x: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def route(lp, cfg: ModelConfig, h_ND: jax.Array, *, layer: int = 0) -> tuple[jax.Array, jax.Array]:
    """The router of one layer on the residual stream h [N, D] (activation dtype): (expert ids int32 [N, K],
    weights float32 [N, K]), as the module docstring says; with `cfg.expert_routing == "balanced"` the ids are
    `balanced_experts` for `layer` and the weights the router's renormalised probabilities of those experts."""
    with jax.named_scope("router"):
        x_ND = _rms(h_ND, cfg.rms_norm_eps) * lp.router_scale_D.astype(h_ND.dtype)
        x_ND = x_ND * jnp.asarray(cfg.hidden_size**-0.5, h_ND.dtype)
        p_NE = jax.nn.softmax(dense(x_ND, lp.router_DE, "ND,DE->NE").astype(jnp.float32), axis=-1)
        if cfg.expert_routing == "balanced":
            idx_NK = balanced_experts(h_ND.shape[0], cfg.top_k_experts, cfg.num_experts, layer)
            w_NK = jnp.take_along_axis(p_NE, idx_NK, axis=-1)
        else:
            w_NK, idx_NK = jax.lax.top_k(p_NE, cfg.top_k_experts)
        w_NK = w_NK / jnp.sum(w_NK, axis=-1, keepdims=True)
        w_NK = w_NK * jnp.take(lp.expert_scale_E.astype(jnp.float32), idx_NK)
        return idx_NK.astype(jnp.int32), w_NK


def balanced_experts(n: int, k: int, e: int, layer: int) -> jax.Array:
    """Expert ids int32 [n, k] of the balanced routing (`ROUTINGS`): assignment j = token * k + slot goes to expert
    (j + layer * k) mod e."""
    j = jnp.arange(n * k, dtype=jnp.int32).reshape(n, k)
    return (j + layer * k) % e


def expert_weight(w, e: jax.Array):
    """Expert `e`'s slice (int32 scalar, traced) of an expert weight [E, ...]: a dense array's [...], or a
    `QuantArray` of the slice's values and scales (its layout without the expert axis). Only that slice is read. A
    leaf in the batched TPU layout (`_tpu_tiled`): the slice converted back to the w4 layout (the expert kernel's
    path never calls this; any other reader still gets the same values)."""
    if _tpu_tiled(w):  # the batched TPU layout: this expert's slice back in the w4 layout
        from model.quant import _natural

        values, scales = (jax.lax.dynamic_index_in_dim(a, e, 0) for a in (w.values, w.scales))
        one = dataclasses.replace(w, values=values, scales=scales, shape=(1, *w.shape[1:]))
        w = _natural(one)
        e = jnp.int32(0)
    if isinstance(w, QuantArray):
        values = jax.lax.dynamic_index_in_dim(w.values, e, 0, keepdims=False)
        scales = jax.lax.dynamic_index_in_dim(w.scales, e, 0, keepdims=False)
        return dataclasses.replace(w, values=values, scales=scales, shape=w.shape[1:], block=w.block[1:], tiling=None)
    return jax.lax.dynamic_index_in_dim(w, e, 0, keepdims=False)


def _ffn(x_MD: jax.Array, gate_up_DX, down_DF) -> jax.Array:
    """One expert on M rows: down(gelu_tanh(gate(x)) * up(x)) -> [M, D] in x's dtype."""
    gu_MX = dense(x_MD, gate_up_DX, "MD,DX->MX")
    f = gu_MX.shape[-1] // 2
    return dense(gelu(gu_MX[:, :f]) * gu_MX[:, f:], down_DF, "MF,DF->MD")


def _tpu_tiled(w) -> bool:
    """Whether an expert leaf is held in the batched TPU layout (`model.kernels.tpu_layout.to_tpu_experts`, its
    tiling a `TpuTiling`, set at load by `model.kernels.choice.with_tilings` on a TPU)."""
    return isinstance(w, QuantArray) and w.ndim == 3 and isinstance(w.tiling, TpuTiling)


def _kernel_product(x_UMK: jax.Array, w: QuantArray, e_U: jax.Array) -> jax.Array:
    """Tile u of x [U, M, K] times expert e_U[u] of a leaf in the batched TPU layout: [U, M, N] in x's dtype, one
    call of the TPU expert kernel (`model.kernels.w4a16_tpu.w4a16_tpu_expert_matmul`; Pallas imported here, on
    this path only; interpret mode on CPU, for tests)."""
    from model.kernels.fit_tpu import padded_k
    from model.kernels.w4a16_tpu import w4a16_tpu_expert_matmul

    axis = grouped_axis(w)  # the contraction axis of [E, A, B] (model.quantspec.EXPERT_PROJECTIONS)
    group = w.block[axis]
    return w4a16_tpu_expert_matmul(x_UMK, w.values, w.scales, e_U, k=padded_k(w.shape[axis], group),
                                   n=w.shape[3 - axis], group=group, tiling=w.tiling,
                                   interpret=jax.default_backend() == "cpu")  # fmt: skip


def _kernel_ffn(x_UMD: jax.Array, e_U: jax.Array, gate_up, down) -> jax.Array:
    """`_ffn` for U tiles at once, tile u with expert e_U[u] (int32 [U]): two kernel calls (gate_up over every tile,
    gelu_tanh(gate) * up, down over every tile) -> [U, M, D] in x's dtype."""
    gu_UMX = _kernel_product(x_UMD, gate_up, e_U)
    f = gu_UMX.shape[-1] // 2
    return _kernel_product(gelu(gu_UMX[..., :f]) * gu_UMX[..., f:], down, e_U)


def tile_rows(n: int, e: int) -> int:
    """Rows M per tile for n = N*K assignments over e experts: 1 when n <= e (decode: one tile per assignment),
    else the power of two >= n / e, at most `MAX_TILE`."""
    if n <= e:
        return 1
    m = 1
    while m < min(-(-n // e), MAX_TILE):
        m *= 2
    return m


def tile_count(n: int, e: int, m: int) -> int:
    """Tiles U that always hold n assignments over e experts padded to whole tiles of m rows: each expert that
    gets c > 0 of them uses ceil(c / m) tiles, so at most (n + min(n, e) (m - 1)) / m in all."""
    return (n + min(n, e) * (m - 1)) // m


def expert_products(lp, x_ND: jax.Array, idx_NK: jax.Array, w_NK: jax.Array, num_experts: int) -> jax.Array:
    """The experts' output [N, D] (x's dtype): sum over k of w_NK[:, k] * expert_{idx_NK[:, k]}(x), reading only
    the chosen experts' weights (module docstring). x [N, D] is the experts' normed input; idx int32 [N, K],
    w float32 [N, K] from `route`. Expert leaves grouped for an expert-parallel mesh ([G, E/G, ...],
    `model.sharding.group_experts`) take `grouped_expert_products`."""
    if _expert_groups(lp.experts_gate_up_EDX):
        return grouped_expert_products(lp, x_ND, idx_NK, w_NK, num_experts)
    n_tok, k = idx_NK.shape
    n, d = n_tok * k, x_ND.shape[-1]
    m = tile_rows(n, num_experts)
    e_n = idx_NK.reshape(n)
    gu, dn = lp.experts_gate_up_EDX, lp.experts_down_EDF
    with jax.named_scope("experts"):
        if _tpu_tiled(gu) and _tpu_tiled(dn):  # the TPU expert kernel: one call per projection (module docstring)
            if m == 1:  # tiles in expert order: tiles that share an expert are adjacent, its blocks copied once
                order = jnp.argsort(e_n, stable=True)
                y_sD = _kernel_ffn(x_ND[order // k][:, None, :], e_n[order], gu, dn)[:, 0]
                y_nD = jnp.zeros_like(y_sD).at[order].set(y_sD, unique_indices=True)
            else:
                y_nD = _sorted_tiles(x_ND, e_n, k, m, num_experts, gu, dn)
        elif m == 1:  # one tile per (token, expert): the chosen experts only, in assignment order
            tok_n = jnp.arange(n, dtype=jnp.int32) // k

            def one(j):
                e = e_n[j]
                x_1D = jax.lax.dynamic_slice_in_dim(x_ND, tok_n[j], 1, axis=0)
                return _ffn(x_1D, expert_weight(gu, e), expert_weight(dn, e))[0]

            y_nD = jax.lax.map(one, jnp.arange(n, dtype=jnp.int32))
        else:
            y_nD = _sorted_tiles(x_ND, e_n, k, m, num_experts, gu, dn)
        y_NKD = y_nD.reshape(n_tok, k, d).astype(jnp.float32)
        return jnp.einsum("NKD,NK->ND", y_NKD, w_NK).astype(x_ND.dtype)


def _sorted_tiles(x_ND, e_n, k: int, m: int, num_experts: int, gu, dn) -> jax.Array:
    """Sort and segment: each assignment's expert output [n, D], in assignment order, from tiles of m rows that
    share one expert (`tile_count` of them; the unused ones skipped)."""
    n, d = e_n.shape[0], x_ND.shape[-1]
    u = tile_count(n, num_experts, m)
    order = jnp.argsort(e_n, stable=True)
    e_s = e_n[order]
    counts_E = jnp.bincount(e_n, length=num_experts)
    padded_E = -(-counts_E // m) * m
    ends_E = jnp.cumsum(padded_E)
    first_E = ends_E - padded_E  # first padded row of each expert's run
    rank_s = jnp.arange(n) - (jnp.cumsum(counts_E) - counts_E)[e_s]  # place of a sorted assignment in its run
    row_s = first_E[e_s] + rank_s
    x_RD = jnp.zeros((u * m, d), x_ND.dtype).at[row_s].set(x_ND[order // k], unique_indices=True)
    tile_e = jnp.clip(jnp.searchsorted(ends_E, jnp.arange(u) * m, side="right"), 0, num_experts - 1).astype(jnp.int32)
    used = ends_E[-1] // m
    if _tpu_tiled(gu) and _tpu_tiled(dn):  # every tile in one kernel call; unused tiles on zeros, last expert's id
        tile_e = jnp.where(jnp.arange(u) < used, tile_e, tile_e[jnp.maximum(used - 1, 0)])
        y_RD = _kernel_ffn(x_RD.reshape(u, m, d), tile_e, gu, dn).reshape(u * m, d)
        return jnp.zeros((n, d), y_RD.dtype).at[order].set(y_RD[row_s], unique_indices=True)

    def tile(t):
        def run(_):
            x_MD = jax.lax.dynamic_slice_in_dim(x_RD, t * m, m, axis=0)
            return _ffn(x_MD, expert_weight(gu, tile_e[t]), expert_weight(dn, tile_e[t]))

        return jax.lax.cond(t < used, run, lambda _: jnp.zeros((m, d), x_ND.dtype), None)

    y_RD = jax.lax.map(tile, jnp.arange(u, dtype=jnp.int32)).reshape(u * m, d)
    y_s = y_RD[row_s]
    return jnp.zeros((n, d), y_RD.dtype).at[order].set(y_s, unique_indices=True)


# ---- expert parallel: the experts grouped by device -------------------------------------------------------------
def _expert_groups(w) -> int:
    """G for an expert leaf grouped for an expert-parallel mesh ([G, E/G, D, X]: one more axis than [E, D, X]),
    0 for one in its own form."""
    return w.shape[0] if len(w.shape) == 4 else 0


def group_expert_leaf(w, groups: int):
    """An expert leaf [E, ...] (dense or `QuantArray`) as [G, E/G, ...] with expert l G + g at [g, l]: experts
    dealt out in turn, so group g holds experts g, g + G, g + 2G, ... (a step's top-k under balanced routing, K
    consecutive experts, lands ceil(K / G) on each group). E must be a multiple of G (`model.placement.check_mesh`)."""

    def deal(a):
        return jnp.swapaxes(a.reshape(a.shape[0] // groups, groups, *a.shape[1:]), 0, 1)

    if isinstance(w, QuantArray):
        assert w.tiling is None and w.block[0] == 1, (w.tiling, w.block)
        return dataclasses.replace(w, values=deal(w.values), scales=deal(w.scales),
                                   shape=(groups, w.shape[0] // groups, *w.shape[1:]), block=(1, *w.block))  # fmt: skip
    return deal(w)


def _group_weight(w, local_G: jax.Array):
    """Each group's expert `local_G[g]` (int32 [G], an index into that group's E/G experts) of a grouped leaf
    [G, E/G, ...]: [G, ...], a `QuantArray` batched over G (its values and scales [G, ...], its static layout one
    expert's, as `expert_weight` gives: `jax.vmap` maps a function of one expert over it). A gather batched over
    G, the axis the mesh splits, so each device reads one slice of its own experts."""
    take = jax.vmap(lambda a, i: jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False))
    if isinstance(w, QuantArray):
        return dataclasses.replace(w, values=take(w.values, local_G), scales=take(w.scales, local_G),
                                   shape=w.shape[2:], block=w.block[2:])  # fmt: skip
    return take(w, local_G)


def grouped_expert_products(lp, x_ND: jax.Array, idx_NK: jax.Array, w_NK: jax.Array, num_experts: int) -> jax.Array:
    """`expert_products` with the expert leaves grouped by device ([G, E/G, ...], `group_expert_leaf`: expert e on
    group e mod G as its expert e // G), for an expert-parallel mesh (`model.sharding`, GSPMD).

    Every device computes the router's choice (replicated), lists the assignments its group owns (in assignment
    order) and walks them: trip t reads, on every group at once (one gather batched over G), the t-th owned
    expert's slice of each weight, multiplies that one token row by it (`_ffn`, one device's products, mapped
    over G: a 2-D quantized product keeps its form, the planes of `words` on a TPU included), and keeps the
    product where t is below the
    group's count. The trips run to the largest group's count (a replicated scalar, so XLA keeps the skip as a
    conditional): at decode each device reads max over groups of its owned assignments' experts, ceil(K / G) when
    the K choices fall evenly, K when they all fall on one group (`model.placement`'s prediction states which). A
    group with fewer owned assignments re-reads its last owned expert in the remaining trips (one with none, one
    of its own experts), products that are masked out (`jnp.where`, so even a NaN there never reaches the sum).
    The combine sums the groups' partial outputs in float32 over the G axis the mesh splits, which XLA's SPMD
    partitioner lowers to one all-reduce of [N, D] float32 per layer, the only collective of the block (the
    weights never move; an all-to-all of tokens would gain nothing, every device holding every token). Prefill
    takes the same walk, one token row per trip (no tiles of rows yet: correct, slower than one device's tiles).
    x [N, D], idx int32 [N, K], w float32 [N, K] as `expert_products`; returns [N, D] in x's dtype."""
    gu, dn = lp.experts_gate_up_EDX, lp.experts_down_EDF
    g = _expert_groups(gu)
    n_tok, k = idx_NK.shape
    n, d = n_tok * k, x_ND.shape[-1]
    e_n = idx_NK.reshape(n)
    own_Gn = (e_n[None, :] % g) == jnp.arange(g, dtype=jnp.int32)[:, None]
    order_Gn = jnp.argsort(~own_Gn, axis=1, stable=True).astype(jnp.int32)  # owned assignments first, in order
    count_G = jnp.sum(own_Gn, axis=1, dtype=jnp.int32)
    trips = jnp.max(jnp.bincount(e_n % g, length=g))  # = max(count_G), from the ids alone: replicated, no collective
    with jax.named_scope("experts"):

        def one(t):
            pick = jnp.minimum(t, jnp.maximum(count_G - 1, 0))  # [G]: this trip's owned assignment (or the last)
            a_G = jnp.take_along_axis(order_Gn, pick[:, None], axis=1)[:, 0]
            x_G1D = x_ND[a_G // k][:, None, :]
            local_G = e_n[a_G] // g
            gu_G, dn_G = _group_weight(gu, local_G), _group_weight(dn, local_G)
            return jax.vmap(_ffn)(x_G1D, gu_G, dn_G)[:, 0]  # each group its expert: one device's products

        def trip(t):
            return jax.lax.cond(t < trips, one, lambda _: jnp.zeros((g, d), x_ND.dtype), t)

        y_nGD = jax.lax.map(trip, jnp.arange(n, dtype=jnp.int32))  # trip t: each group's t-th owned assignment
        y_GnD = jnp.swapaxes(y_nGD, 0, 1)
        slot_Gn = jnp.argsort(order_Gn, axis=1).astype(jnp.int32)  # the trip of each assignment in its group
        y_GnD = jnp.take_along_axis(y_GnD, slot_Gn[..., None], axis=1)
        y_GnD = jnp.where(own_Gn[..., None], y_GnD, 0).astype(jnp.float32)
        y_GND = jnp.einsum("GNKD,NK->GND", y_GnD.reshape(g, n_tok, k, d), w_NK)  # each group's share, [N, D]
        return jnp.sum(y_GND, axis=0).astype(x_ND.dtype)  # over the groups: the all-reduce


def expert_block(lp, cfg: ModelConfig, h_BTD: jax.Array, *, layer: int) -> jax.Array:
    """The expert branch of a decoder layer on the residual stream h [B, T, D] (after attention, before the
    feed-forward): route (`route`, on h itself), then the experts on pre_feedforward_layernorm_2(h), then
    post_feedforward_layernorm_2. Returns [B, T, D] in h's dtype."""
    b, t, d = h_BTD.shape
    h_ND = h_BTD.reshape(b * t, d)
    with jax.named_scope("moe"):
        idx_NK, w_NK = route(lp, cfg, h_ND, layer=layer)
        _record_route(idx_NK)
        x_ND = rms_norm(h_ND, lp.pre_ffw2_norm_D, cfg.rms_norm_eps)
        y_ND = expert_products(lp, x_ND, idx_NK, w_NK, cfg.num_experts)
        return rms_norm(y_ND, lp.post_ffw2_norm_D, cfg.rms_norm_eps).reshape(b, t, d)


# ---- what the measured run read: the experts each layer's router chose (docs/method.md, "Bytes that follow the
# routing") --------------------------------------------------------------------------------------------------------
_ROUTES = threading.local()


@contextlib.contextmanager
def recording_routes() -> Iterator[list[jax.Array]]:
    """Within this context, each `expert_block` traced on this thread appends its expert ids (int32 [N, K], the
    router's choice: `route`) to the yielded list, one per layer in order; outside it nothing is recorded and a
    program's outputs are what they were. For a decode program that returns `distinct_experts` of them: enter it
    inside the traced function, around the step only (the ids are values of that trace)."""
    before = getattr(_ROUTES, "ids", None)
    _ROUTES.ids = ids = []
    try:
        yield ids
    finally:
        _ROUTES.ids = before


def _record_route(idx_NK: jax.Array) -> None:
    ids = getattr(_ROUTES, "ids", None)
    if ids is not None:
        ids.append(idx_NK)


def distinct_experts(ids: list[jax.Array], num_experts: int) -> jax.Array:
    """Per layer, how many distinct experts its router chose across all the step's tokens (the union over the
    rows of a batch): int32 [L] from L expert-id arrays int32 [N, K] (`recording_routes`), each count in
    1..min(E, N*K). One small fusion ([L, N*K, E] comparisons): what a decode step returns beside its tokens."""
    idx_LA = jnp.stack([i.reshape(-1) for i in ids])
    hit_LE = jnp.any(idx_LA[:, :, None] == jnp.arange(num_experts, dtype=jnp.int32), axis=1)
    return jnp.sum(hit_LE, axis=-1, dtype=jnp.int32)
