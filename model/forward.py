"""The Gemma 4 forward pass in three forms: full sequence (no cache), prefill into a cache, one decode step.

Key: B batch, T positions, D model width, V vocab, L layers, P per-layer-input width, K kv heads, H head dim,
S cache slots, R ring slots. K/V arrays are head-major, [B,K,T,H] / [B,K,S,H], as the cache stores them.
All three compute the same function (tests prove it): `forward_full` is the reference form and the public
full-sequence logits; `prefill` + `decode_step` are what the engine jits. Formulas: architecture notes §2.

Lengths: `prefill` takes one `length` for every row (int32 scalar: the single-sequence engine) or one per row
(int32 [B]: a batch of right-padded prompts of different lengths), and the cache it returns carries that length;
`decode_step` then decodes each row at its own position. A scalar length traces exactly the program it did
before per-row lengths existed. Per row, each row's positions are absolute (row b's token p at position p, RoPE
and masks alike), only row b's real positions are written into row b's slots, and each row's logits come from
its own last real position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.cache import KVCache, ring_positions
from model.config import ModelConfig
from model.flops import PREFILL_CHUNK, prefill_chunk, prefill_tail
from model.layers import (
    attend,
    attend_one,
    attn_output,
    dense,
    layer_tail,
    project_qkv,
    rope_tables,
    rms_norm,
)
from model.params import Params
from model.quant import take_rows
from model.prefill import attend_full_chunk, attend_ring_chunk, write_slots


def embed(params: Params, cfg: ModelConfig, ids_BT: jax.Array, dtype) -> jax.Array:
    """Input embeddings [B,T,D] in `dtype`: E[ids] * sqrt(D), the scale cast to the table's dtype first (as HF)."""
    with jax.named_scope("embed"):
        e_BTD = take_rows(params.embed_VD, ids_BT)
        e_BTD = e_BTD * jnp.asarray(cfg.embed_scale, params.embed_VD.dtype)
        return e_BTD.astype(dtype)


def per_layer_inputs(params: Params, cfg: ModelConfig, ids_BT: jax.Array, h_BTD: jax.Array) -> jax.Array | None:
    """Per-layer inputs [B,T,L,P] (PLE): (RMSNorm(h0 W * D^-1/2) + E_pl[ids] * sqrt(P)) * 2^-1/2; None if P = 0.

    Only one row of the PLE table is gathered per token; ids outside [0, ple_vocab) read as zeros (as JAX's
    reference does).
    """
    if not cfg.ple_dim:
        return None
    with jax.named_scope("per_layer_embed"):
        b, t = ids_BT.shape
        l, p = cfg.num_layers, cfg.ple_dim
        valid_BT = (ids_BT >= 0) & (ids_BT < cfg.ple_vocab)
        tok_BTX = take_rows(params.ple_embed_VX, jnp.where(valid_BT, ids_BT, 0), h_BTD.dtype)  # only these rows unpacked
        tok_BTX = tok_BTX * jnp.asarray(p**0.5, tok_BTX.dtype)
        tok_BTLP = jnp.where(valid_BT[..., None], tok_BTX, 0).astype(h_BTD.dtype).reshape(b, t, l, p)
        proj_BTX = dense(h_BTD, params.ple_proj_DX, "BTD,DX->BTX") * jnp.asarray(
            cfg.hidden_size**-0.5, h_BTD.dtype
        )
        if t > 1:  # fused with the norm below, XLA:CPU ran this product at ~27 GFLOP/s (22 ms per prefill chunk)
            proj_BTX = jax.lax.optimization_barrier(proj_BTX)
        proj_BTLP = rms_norm(proj_BTX.reshape(b, t, l, p), params.ple_norm_P, cfg.rms_norm_eps)
        return (proj_BTLP + tok_BTLP) * jnp.asarray(2**-0.5, h_BTD.dtype)


def logits(params: Params, cfg: ModelConfig, h_BTD: jax.Array) -> jax.Array:
    """Final norm, tied output projection and softcap: float32 logits [B,T,V] = cap * tanh((h E^T) / cap).

    E is `params.lm_head_VD` when the load made a separate (int8) copy of the tied table, else `embed_VD`."""
    with jax.named_scope("logits"):
        h_BTD = rms_norm(h_BTD, params.final_norm_D, cfg.rms_norm_eps)
        head_VD = params.embed_VD if params.lm_head_VD is None else params.lm_head_VD
        z_BTV = dense(h_BTD, head_VD, "BTD,VD->BTV").astype(jnp.float32)
        if cfg.final_logit_softcap:
            z_BTV = cfg.final_logit_softcap * jnp.tanh(z_BTV / cfg.final_logit_softcap)
        return z_BTV


def _ple(ple_BTLP: jax.Array | None, layer: int) -> jax.Array | None:
    return None if ple_BTLP is None else ple_BTLP[:, :, layer, :]


def _visible(cfg: ModelConfig, layer: int, qpos: jax.Array, kpos: jax.Array) -> jax.Array:
    """Causal (and, on sliding layers, window) visibility of key positions from query positions (broadcasting)."""
    vis = kpos <= qpos
    if cfg.is_sliding(layer):
        vis = vis & (kpos > qpos - cfg.sliding_window)
    return vis


def forward_full(
    params: Params, cfg: ModelConfig, ids_BT: jax.Array, *, dtype=jnp.float32, return_hidden: bool = False,
    positions: tuple[int, int] | None = None,
):
    """Logits of every position [B,T,V] (float32) by one causal pass over the whole sequence, no cache.

    The reference form: every layer at every position, plain masked attention. With return_hidden, also the
    residual stream [L+1,B,T,D]: the embeddings, then the output of each layer. `positions` (start, count),
    static: the logits of those positions only [B,count,V] (the output projection runs on them alone).
    """
    b, t = ids_BT.shape
    pos_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    h_BTD = embed(params, cfg, ids_BT, dtype)
    ple_BTLP = per_layer_inputs(params, cfg, ids_BT, h_BTD)
    rope = rope_tables(cfg, pos_BT, h_BTD.dtype)
    kv: dict[int, tuple[jax.Array, jax.Array]] = {}
    hidden = [h_BTD]
    for i, lp in enumerate(params.layers):
        with jax.named_scope(f"layer_{i}"):
            a_BTD = rms_norm(h_BTD, lp.attn_norm_D, cfg.rms_norm_eps)
            q_BTNH, k_BKTH, v_BKTH = project_qkv(lp, cfg, i, a_BTD, rope)
            if not cfg.is_kv_shared(i):
                kv[i] = (k_BKTH, v_BKTH)
            k_BKTH, v_BKTH = kv[cfg.kv_source(i)]
            mask_BTT = jnp.broadcast_to(_visible(cfg, i, pos_BT[0][:, None], pos_BT[0][None, :]), (b, t, t))
            o_BTNH = attend(q_BTNH, k_BKTH, v_BKTH, mask_BTT)
            h_BTD = layer_tail(lp, cfg, h_BTD, attn_output(lp, o_BTNH), _ple(ple_BTLP, i), i)
            hidden.append(h_BTD)
    if positions is not None:
        h_BTD = jax.lax.slice_in_dim(h_BTD, positions[0], positions[0] + positions[1], axis=1)
    out = logits(params, cfg, h_BTD)
    return (out, jnp.stack(hidden)) if return_hidden else out


def _cache_visible(cfg: ModelConfig, layer: int, p: jax.Array, s: int) -> jax.Array:
    """Which of the `s` slots of `layer`'s KV source a query at position p sees once positions 0..p are
    written (bool): full layers slots 0..p; sliding layers the held ring positions inside p's window. [S] for a
    scalar p, [B,S] for one position per row p [B]."""
    q = p if jnp.ndim(p) == 0 else p[:, None]
    if cfg.is_sliding(layer):
        kpos_S = ring_positions(p + 1, s)
        return (kpos_S >= 0) & _visible(cfg, layer, q, kpos_S)
    return jnp.arange(s) <= q


def _row_mask(vis: jax.Array, b: int) -> jax.Array:
    """One query per row against the slots: [S] (every row alike) or [B,S] (per row) -> mask [B,S]."""
    if vis.ndim == 1:
        return jnp.broadcast_to(vis[None, :], (b, vis.shape[0]))
    return vis


def _positions_B1(p: jax.Array, b: int) -> jax.Array:
    """One position per row [B,1] (int32) from a scalar position (every row alike) or one per row [B]."""
    if jnp.ndim(p) == 0:
        return jnp.full((b, 1), p, jnp.int32)
    return p[:, None].astype(jnp.int32)


def _prefill_chunk(params: Params, cfg: ModelConfig, ids_BC: jax.Array, start: jax.Array, length: jax.Array,
                   ks: tuple, vs: tuple, dtype, *, only: bool):  # fmt: skip
    """One chunk (positions start .. start+C-1) through the cache layers: attend over the cache as it was
    before the chunk, then write the chunk's real positions (< length) into their slots. `only`: this is the
    prompt's only chunk (start 0), so the cache before it is empty and is not read.

    `length`: int32 scalar, or [B] per row. Per row, a row writes only its own real positions, and the attention
    masks use the longest row's length: a real query of row b (position i < length_b) sees only keys j <= i, all
    real positions of row b either way, while a padded query (never written, never read by a real one) sees at
    least its own key, so no score row is empty and nothing turns NaN.
    Returns (h [B,C,D] after the last cache layer, per-layer inputs [B,C,L,P] or None, new k, new v)."""
    b, c = ids_BC.shape
    pos_BC = jnp.broadcast_to(start + jnp.arange(c, dtype=jnp.int32), (b, c))
    if jnp.ndim(length) == 0:
        real_C = pos_BC[0] < length
    else:
        real_C, length = pos_BC < length[:, None], jnp.max(length)  # real per row [B,C]; masks: the longest row
    h_BCD = embed(params, cfg, ids_BC, dtype)
    ple_BCLP = per_layer_inputs(params, cfg, ids_BC, h_BCD)
    rope = rope_tables(cfg, pos_BC, h_BCD.dtype)
    ks, vs = list(ks), list(vs)
    for i in cfg.cache_layers:
        lp = params.layers[i]
        with jax.named_scope(f"layer_{i}"):
            a_BCD = rms_norm(h_BCD, lp.attn_norm_D, cfg.rms_norm_eps)
            q_BCNH, k_BKCH, v_BKCH = project_qkv(lp, cfg, i, a_BCD, rope)
            if cfg.is_sliding(i):
                ring_k, ring_v = (None, None) if only else (ks[i], vs[i])
                o_BCNH = attend_ring_chunk(q_BCNH, k_BKCH, v_BKCH, ring_k, ring_v, start, length, cfg.sliding_window)
                slot_C = jnp.mod(pos_BC[0], ks[i].shape[2])  # ring slot p mod R: distinct, as C <= R
            else:
                o_BCNH = attend_full_chunk(q_BCNH, k_BKCH, v_BKCH, ks[i], vs[i], start, length)
                slot_C = pos_BC[0]
            ks[i] = write_slots(ks[i], k_BKCH, slot_C, real_C)
            vs[i] = write_slots(vs[i], v_BKCH, slot_C, real_C)
            h_BCD = layer_tail(lp, cfg, h_BCD, attn_output(lp, o_BCNH), _ple(ple_BCLP, i), i)
    return h_BCD, ple_BCLP, tuple(ks), tuple(vs)


def _last_position(params: Params, cfg: ModelConfig, h_B1D: jax.Array, ple_B1LP: jax.Array | None,
                   last: jax.Array, ks: tuple, vs: tuple) -> jax.Array:  # fmt: skip
    """The KV-shared layers and the logits for the last real position only (the only logits prefill returns),
    attending over their producers' filled caches: a ring holds the last R prompt positions, which is all the
    last position's window needs. `last`: int32 scalar, or [B] per row (`h_B1D` then holds each row's own last
    position). Returns float32 logits [B,V]."""
    b = h_B1D.shape[0]
    rope = rope_tables(cfg, _positions_B1(last, b), h_B1D.dtype)
    for i in range(cfg.first_shared_layer, cfg.num_layers):
        lp = params.layers[i]
        with jax.named_scope(f"layer_{i}"):
            a_B1D = rms_norm(h_B1D, lp.attn_norm_D, cfg.rms_norm_eps)
            q_B1NH, _, _ = project_qkv(lp, cfg, i, a_B1D, rope)
            k_BKSH, v_BKSH = ks[cfg.kv_source(i)], vs[cfg.kv_source(i)]
            vis_S = _cache_visible(cfg, i, last, k_BKSH.shape[2])
            o_B1NH = attend_one(q_B1NH, k_BKSH, v_BKSH, _row_mask(vis_S, b))
            h_B1D = layer_tail(lp, cfg, h_B1D, attn_output(lp, o_B1NH), _ple(ple_B1LP, i), i)
    return logits(params, cfg, h_B1D)[:, 0]


def prefill(
    params: Params,
    cfg: ModelConfig,
    ids_BT: jax.Array,
    length: jax.Array,
    cache: KVCache,
    *,
    dtype=None,
    chunk: int = PREFILL_CHUNK,
) -> tuple[jax.Array, KVCache]:
    """Process right-padded prompts (bucket length T, `length` real tokens, 1 <= length <= T) into an empty
    cache. Returns the float32 logits [B,V] at the last real position and the filled cache (length = `length`).
    `length` is an int32 scalar (every row alike) or [B] (each row its own: rows right-padded to T, row b's
    logits from its position length_b - 1, row b's slots holding only its positions < length_b).

    Chunked: the cache layers run on C = `prefill_chunk(cfg, T, chunk)` positions at a time in a loop of
    ceil(max(length) / C) trips (a traced count: the longest row's real chunks), so the cost grows with the real
    prompt, not with the bucket (`model.prefill`: sliding layers read R + C keys per query, full layers about
    n^2 / 2 pairs in all). When the last chunk would hold at most C // 4 real positions it runs as a tail chunk
    of `prefill_tail(C)` positions instead (`_chunk_plan`; the chunks are `model.flops.prefill_chunks`). The
    KV-shared layers, which write no cache, run only for the last real position, attending over their
    producer's filled cache (architecture notes §2.4). `dtype` is the activation dtype
    (default: the cache's).
    """
    if jnp.ndim(length):
        return _prefill_rows(params, cfg, ids_BT, length, cache, dtype=dtype, chunk=chunk)
    t = ids_BT.shape[1]
    dtype = dtype or (cache.k[0].dtype if cache.k else jnp.float32)
    c = prefill_chunk(cfg, t, chunk)
    ids_BT = jnp.pad(ids_BT, ((0, 0), (0, -(-t // c) * c - t)), constant_values=cfg.pad_token_id)
    only = ids_BT.shape[1] == c  # one chunk holds the whole bucket: no loop, and an empty cache before it
    tail = None if only else prefill_tail(c)
    n_chunks, use_tail = _chunk_plan(length, c, tail)
    carry = _run_chunks(params, cfg, ids_BT, length, cache, dtype, c, n_chunks, only=only)
    # From here on only the last real position matters; it lies in the last chunk (the tail chunk, if it runs).
    last = length - 1
    ks, vs, h_B1D, ple_B1LP = _last_chunk(params, cfg, ids_BT, length, last, dtype, c, tail, n_chunks, use_tail, carry)
    out_BV = _last_position(params, cfg, h_B1D, ple_B1LP, last, ks, vs)
    return out_BV, KVCache(k=ks, v=vs, length=jnp.asarray(length, jnp.int32))


def _run_chunks(params: Params, cfg: ModelConfig, ids_BT: jax.Array, length: jax.Array, cache: KVCache, dtype,
                c: int, n_chunks: jax.Array, *, only: bool) -> tuple:  # fmt: skip
    """`prefill`'s loop: `n_chunks` chunks of C = `c` positions of the padded ids [B, T'] (T' a multiple of C)
    through the cache layers (`_prefill_chunk`), from the empty `cache`; `only`: the one chunk holds the whole
    bucket, run without a loop. Returns the carry (K caches, V caches, the last chunk's activations [B,C,D] and
    per-layer inputs [B,C,L,P] or None)."""
    b = ids_BT.shape[0]

    def body(index, carry):
        ks, vs, _, _ = carry
        start = index * c
        ids_BC = jax.lax.dynamic_slice_in_dim(ids_BT, start, c, axis=1)
        h_BCD, ple_BCLP, ks, vs = _prefill_chunk(params, cfg, ids_BC, start, length, ks, vs, dtype, only=only)
        return ks, vs, h_BCD, ple_BCLP

    h0_BCD = jnp.zeros((b, c, cfg.hidden_size), dtype)
    ple0_BCLP = jnp.zeros((b, c, cfg.num_layers, cfg.ple_dim), dtype) if cfg.ple_dim else None
    carry = (cache.k, cache.v, h0_BCD, ple0_BCLP)
    with jax.named_scope("prefill_chunks"):
        return body(0, carry) if only else jax.lax.fori_loop(0, n_chunks, body, carry)


def _last_chunk(params: Params, cfg: ModelConfig, ids_BT: jax.Array, length: jax.Array, last: jax.Array, dtype,
                c: int, tail: int | None, n_chunks: jax.Array, use_tail: jax.Array, carry: tuple) -> tuple:  # fmt: skip
    """The last real position's (`last` = length - 1) activations after `_run_chunks`' `carry`: from the last
    chunk it ran, or, where `_chunk_plan` says so (`use_tail`), from a tail chunk of `tail` positions run after
    it. Returns (K caches, V caches, activations [B,1,D], per-layer inputs [B,1,L,P] or None) at `last`."""

    def at_last(start, h_BUD, ple_BULP):
        offset = last - start
        ple_B1LP = None if ple_BULP is None else jax.lax.dynamic_slice_in_dim(ple_BULP, offset, 1, axis=1)
        return jax.lax.dynamic_slice_in_dim(h_BUD, offset, 1, axis=1), ple_B1LP

    def from_last_chunk(carry):
        ks, vs, h_BCD, ple_BCLP = carry
        return ks, vs, *at_last((n_chunks - 1) * c, h_BCD, ple_BCLP)

    def from_tail_chunk(carry):
        ks, vs, _, _ = carry
        start = n_chunks * c
        ids_BU = jax.lax.dynamic_slice_in_dim(ids_BT, start, tail, axis=1)
        with jax.named_scope("prefill_tail_chunk"):
            h_BUD, ple_BULP, ks, vs = _prefill_chunk(params, cfg, ids_BU, start, length, ks, vs, dtype, only=False)
        return ks, vs, *at_last(start, h_BUD, ple_BULP)

    if tail is None:
        return from_last_chunk(carry)
    return jax.lax.cond(use_tail, from_tail_chunk, from_last_chunk, carry)


def _chunk_plan(length: jax.Array, c: int, tail: int | None) -> tuple[jax.Array, jax.Array]:
    """(chunks of C = `c` positions to run, whether a tail chunk of `tail` positions follows them) for a prompt of
    `length` real positions (int32 scalar, traced): with r = length mod C, the last chunk is a tail chunk when
    0 < r <= tail, else a C chunk (`model.flops.prefill_chunks`, which the FLOP count uses, is the same plan).
    Without a tail (None): ceil(length / C) chunks and False."""
    if tail is None:
        return (length + c - 1) // c, jnp.asarray(False)
    full, rest = length // c, length % c
    use_tail = (rest > 0) & (rest <= tail)
    return full + ((rest > 0) & ~use_tail).astype(full.dtype), use_tail


def _at_rows(x_BC_: jax.Array, offset_B: jax.Array) -> jax.Array:
    """Row b's entry at chunk offset `offset_B[b]`: [B,C,...] -> [B,1,...]."""
    index = offset_B.reshape((-1, 1) + (1,) * (x_BC_.ndim - 2))
    return jnp.take_along_axis(x_BC_, index, axis=1)


def _prefill_rows(params: Params, cfg: ModelConfig, ids_BT: jax.Array, length_B: jax.Array, cache: KVCache, *,
                  dtype, chunk: int) -> tuple[jax.Array, KVCache]:  # fmt: skip
    """`prefill` with one length per row [B] (int32): the same chunks, each row's real positions written per row
    (`_prefill_chunk`), and each row's last real position (which may lie in an earlier chunk than the longest
    row's) kept as the loop passes it: h [B,1,D] and per-layer inputs [B,1,L,P] carried, row b's replaced in the
    chunk that holds its position length_b - 1."""
    b, t = ids_BT.shape
    dtype = dtype or (cache.k[0].dtype if cache.k else jnp.float32)
    c = prefill_chunk(cfg, t, chunk)
    ids_BT = jnp.pad(ids_BT, ((0, 0), (0, -(-t // c) * c - t)), constant_values=cfg.pad_token_id)
    length_B = length_B.astype(jnp.int32)
    last_B = length_B - 1
    only = ids_BT.shape[1] == c
    tail = None if only else prefill_tail(c)
    n_chunks, use_tail = _chunk_plan(jnp.max(length_B), c, tail)

    def run_chunk(start, size, carry):
        ks, vs, h_B1D, ple_B1LP = carry
        ids_BU = jax.lax.dynamic_slice_in_dim(ids_BT, start, size, axis=1)
        h_BUD, ple_BULP, ks, vs = _prefill_chunk(params, cfg, ids_BU, start, length_B, ks, vs, dtype,
                                                 only=only)  # fmt: skip
        offset_B = jnp.clip(last_B - start, 0, size - 1)
        here_B = (last_B >= start) & (last_B < start + size)  # row b's last position is in this chunk
        h_B1D = jnp.where(here_B[:, None, None], _at_rows(h_BUD, offset_B), h_B1D)
        if ple_BULP is not None:
            ple_B1LP = jnp.where(here_B[:, None, None, None], _at_rows(ple_BULP, offset_B), ple_B1LP)
        return ks, vs, h_B1D, ple_B1LP

    def body(index, carry):
        return run_chunk(index * c, c, carry)

    h0_B1D = jnp.zeros((b, 1, cfg.hidden_size), dtype)
    ple0_B1LP = jnp.zeros((b, 1, cfg.num_layers, cfg.ple_dim), dtype) if cfg.ple_dim else None
    carry = (cache.k, cache.v, h0_B1D, ple0_B1LP)
    with jax.named_scope("prefill_chunks"):
        carry = body(0, carry) if only else jax.lax.fori_loop(0, n_chunks, body, carry)
    if tail is not None:
        with jax.named_scope("prefill_tail_chunk"):
            carry = jax.lax.cond(use_tail, lambda cr: run_chunk(n_chunks * c, tail, cr), lambda cr: cr, carry)
    ks, vs, h_B1D, ple_B1LP = carry
    out_BV = _last_position(params, cfg, h_B1D, ple_B1LP, last_B, ks, vs)
    return out_BV, KVCache(k=ks, v=vs, length=length_B)


def decode_step(
    params: Params, cfg: ModelConfig, token_B: jax.Array, cache: KVCache, *, dtype=None, rows: jax.Array | None = None
) -> tuple[jax.Array, KVCache]:
    """One token per row at absolute position `cache.length`: returns float32 logits [B,V] and the cache with
    that position written (full layers: slot p; sliding layers: ring slot p mod R) and length + 1.
    A per-row length [B] decodes row b at its own position p_b: its own RoPE angle, its own slot (written by a
    scatter of one slot per row instead of one slice for all rows), its own visible slots.
    `rows` (int32 [k], distinct row indices in 0..B-1; the cache's lengths per row [B]): only those rows of the cache
    decode, token_B [k] holding row rows[j]'s token and the logits [k,V] its logits; each attention reads those rows of
    its KV source (`attend_one` with rows: in place with the CPU kernel, else a gathered copy of k rows), every other
    row is neither read nor written, and only those rows' lengths move. Each row's arithmetic is that of decoding every
    row, up to float rounding (XLA may sum in another order at another row count: on the tiny preset up to 2.8e-7 in the
    logits). Not checked (the caller's promise, as `model.slots` keeps it): a scalar length raises IndexError; repeated
    rows give undefined results; a row out of range fails the CPU attention kernel's call (INVALID_ARGUMENT) and reads
    NaN through XLA's gather (its writes are dropped).
    `dtype` is the activation dtype (default: the cache's); K/V are stored in the cache's dtype."""
    b = token_B.shape[0]
    kv_dtype = cache.k[0].dtype if cache.k else jnp.float32
    dtype = dtype or kv_dtype
    p = cache.length if rows is None else cache.length[rows]
    ids_B1 = token_B[:, None]
    pos_B1 = _positions_B1(p, b)
    h_B1D = embed(params, cfg, ids_B1, dtype)
    ple_B1LP = per_layer_inputs(params, cfg, ids_B1, h_B1D)
    rope = rope_tables(cfg, pos_B1, h_B1D.dtype)
    new_k, new_v = list(cache.k), list(cache.v)
    for i, lp in enumerate(params.layers):
        with jax.named_scope(f"layer_{i}"):
            a_B1D = rms_norm(h_B1D, lp.attn_norm_D, cfg.rms_norm_eps)
            q_B1NH, k_BK1H, v_BK1H = project_qkv(lp, cfg, i, a_B1D, rope)
            src = cfg.kv_source(i)
            if not cfg.is_kv_shared(i):
                slot = jnp.mod(p, new_k[i].shape[2]) if cfg.is_sliding(i) else p
                k_new = _write_position(new_k[i], k_BK1H.astype(kv_dtype), slot, rows)
                v_new = _write_position(new_v[i], v_BK1H.astype(kv_dtype), slot, rows)
                # The barrier keeps XLA from duplicating each update into its readers (the step's output and the
                # attention below), which made XLA:CPU copy every cache buffer several times per decode step.
                new_k[i], new_v[i] = jax.lax.optimization_barrier((k_new, v_new))
            k_BKSH, v_BKSH = new_k[src], new_v[src]  # with `rows`: every row, attend_one reads those decoded
            s = k_BKSH.shape[2]
            vis_S = _cache_visible(cfg, i, p, s)
            o_B1NH = attend_one(q_B1NH, k_BKSH, v_BKSH, _row_mask(vis_S, b), rows)
            h_B1D = layer_tail(lp, cfg, h_B1D, attn_output(lp, o_B1NH), _ple(ple_B1LP, i), i)
    out_BV = logits(params, cfg, h_B1D)[:, 0]
    length = p + 1 if rows is None else cache.length.at[rows].set(p + 1, unique_indices=True)
    return out_BV, KVCache(k=tuple(new_k), v=tuple(new_v), length=length)


def _write_position(buf_BKSH: jax.Array, x_BK1H: jax.Array, slot: jax.Array, rows: jax.Array | None = None
                    ) -> jax.Array:  # fmt: skip
    """One decode position per row [B,K,1,H] written into the cache buffer [B,K,S,H] at `slot`: an int32 scalar
    (every row the same slot: one slice) or [B] (row b at slot_b: a scatter of B rows). With `rows` [k] (x and
    slot [k]): row rows[j] of the buffer at slot_j, a scatter of k rows, the others untouched."""
    if rows is None and jnp.ndim(slot) == 0:
        return jax.lax.dynamic_update_slice(buf_BKSH, x_BK1H, (0, 0, slot, 0))
    rows_B = jnp.arange(buf_BKSH.shape[0]) if rows is None else rows
    return buf_BKSH.at[rows_B, :, slot].set(x_BK1H[:, :, 0], unique_indices=True)


__all__ = ["decode_step", "embed", "forward_full", "logits", "per_layer_inputs", "prefill"]
