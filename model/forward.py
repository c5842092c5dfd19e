"""The Gemma 4 forward pass in three forms: full sequence (no cache), prefill into a cache, one decode step.

Key: B batch, T positions, D model width, V vocab, L layers, P per-layer-input width, K kv heads, H head dim,
S cache slots, R ring slots. K/V arrays are head-major, [B,K,T,H] / [B,K,S,H], as the cache stores them.
All three compute the same function (tests prove it): `forward_full` is the reference form and the public
full-sequence logits; `prefill` + `decode_step` are what the engine jits. Formulas: architecture notes §2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model.cache import KVCache, ring_positions
from model.config import ModelConfig
from model.layers import (
    attend,
    attend_causal,
    attend_windowed,
    attn_output,
    dense,
    layer_tail,
    project_qkv,
    rms_norm,
)
from model.params import Params

PREFILL_Q_CHUNK = 512
"""Queries per block in prefill's causal full attention (`attend_causal`). Measured on the default preset at the
4096 bucket with 3593 real tokens (2-core CPU, float32, median of 3 jitted prefills): one dense block 19.1 s,
blocks of 1024 13.5 s, 512 11.8 s, 256 11.7 s; compile time also fell (22.8 s to 18.8 s). The blocks are unrolled, so the prefill
program grows with the bucket: T/512 attentions per full layer (8 at 4096; at E2B's 131072 positions, 256 per
layer, and lowering alone took about 11 s in review), against a dense [G*T, T] float32 score block per layer."""


PREFILL_WINDOW_Q_BLOCK = 128
"""Queries per block in prefill's sliding-window attention (`attend_windowed`), when it divides the window (else
the window itself): a block of Q queries reads W + Q keys, 640 instead of 1024 at E2B's W = 512. Measured on the
default preset (2-core CPU, float32, median of 3 jitted prefills): 3593 tokens at bucket 4096, 10.8 s with blocks
of 512 (the window), 9.3 s with 128 or 64, 10.4 s with 256; 521 tokens at bucket 1024, 1.94 s -> 1.53 s."""


def window_q_block(cfg: ModelConfig) -> int:
    """`PREFILL_WINDOW_Q_BLOCK` when it divides the sliding window, else the window (e.g. the tiny preset's 8)."""
    w = cfg.sliding_window
    return PREFILL_WINDOW_Q_BLOCK if PREFILL_WINDOW_Q_BLOCK <= w and w % PREFILL_WINDOW_Q_BLOCK == 0 else w


def embed(params: Params, cfg: ModelConfig, ids_BT: jax.Array, dtype) -> jax.Array:
    """Input embeddings [B,T,D] in `dtype`: E[ids] * sqrt(D), the scale cast to the table's dtype first (as HF)."""
    with jax.named_scope("embed"):
        e_BTD = jnp.take(params.embed_VD, ids_BT, axis=0)
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
        tok_BTX = jnp.take(params.ple_embed_VX, jnp.where(valid_BT, ids_BT, 0), axis=0)
        tok_BTX = tok_BTX * jnp.asarray(p**0.5, params.ple_embed_VX.dtype)
        tok_BTLP = jnp.where(valid_BT[..., None], tok_BTX, 0).astype(h_BTD.dtype).reshape(b, t, l, p)
        proj_BTX = dense(h_BTD, params.ple_proj_DX, "BTD,DX->BTX") * jnp.asarray(
            cfg.hidden_size**-0.5, h_BTD.dtype
        )
        proj_BTLP = rms_norm(proj_BTX.reshape(b, t, l, p), params.ple_norm_P, cfg.rms_norm_eps)
        return (proj_BTLP + tok_BTLP) * jnp.asarray(2**-0.5, h_BTD.dtype)


def logits(params: Params, cfg: ModelConfig, h_BTD: jax.Array) -> jax.Array:
    """Final norm, tied output projection and softcap: float32 logits [B,T,V] = cap * tanh((h E^T) / cap)."""
    with jax.named_scope("logits"):
        h_BTD = rms_norm(h_BTD, params.final_norm_D, cfg.rms_norm_eps)
        z_BTV = dense(h_BTD, params.embed_VD, "BTD,VD->BTV").astype(jnp.float32)
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
    params: Params, cfg: ModelConfig, ids_BT: jax.Array, *, dtype=jnp.float32, return_hidden: bool = False
):
    """Logits of every position [B,T,V] (float32) by one causal pass over the whole sequence, no cache.

    The reference form: every layer at every position, plain masked attention. With return_hidden, also the
    residual stream [L+1,B,T,D]: the embeddings, then the output of each layer.
    """
    b, t = ids_BT.shape
    pos_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    h_BTD = embed(params, cfg, ids_BT, dtype)
    ple_BTLP = per_layer_inputs(params, cfg, ids_BT, h_BTD)
    kv: dict[int, tuple[jax.Array, jax.Array]] = {}
    hidden = [h_BTD]
    for i, lp in enumerate(params.layers):
        with jax.named_scope(f"layer_{i}"):
            a_BTD = rms_norm(h_BTD, lp.attn_norm_D, cfg.rms_norm_eps)
            q_BTNH, k_BKTH, v_BKTH = project_qkv(lp, cfg, i, a_BTD, pos_BT)
            if not cfg.is_kv_shared(i):
                kv[i] = (k_BKTH, v_BKTH)
            k_BKTH, v_BKTH = kv[cfg.kv_source(i)]
            mask_BTT = jnp.broadcast_to(_visible(cfg, i, pos_BT[0][:, None], pos_BT[0][None, :]), (b, t, t))
            o_BTNH = attend(q_BTNH, k_BKTH, v_BKTH, mask_BTT)
            h_BTD = layer_tail(lp, cfg, h_BTD, attn_output(lp, o_BTNH), _ple(ple_BTLP, i))
            hidden.append(h_BTD)
    out = logits(params, cfg, h_BTD)
    return (out, jnp.stack(hidden)) if return_hidden else out


def _write_prefill(cfg: ModelConfig, layer: int, buf_BKSH: jax.Array, x_BKTH: jax.Array, length: jax.Array):
    """Prefill K or V [B,K,T,H] written into a layer's cache buffer [B,K,S,H], keeping the invariant: only real
    positions (< length) are written; a sliding ring receives the last R real positions, position p in slot
    p mod R."""
    t = x_BKTH.shape[2]
    x_BKTH = x_BKTH.astype(buf_BKSH.dtype)
    if cfg.is_sliding(layer):
        r = buf_BKSH.shape[2]
        pos_R = ring_positions(length, r)  # absolute position each slot must hold
        gathered = jnp.take(x_BKTH, jnp.clip(pos_R, 0, t - 1), axis=2)
        return jnp.where((pos_R >= 0)[None, None, :, None], gathered, jnp.zeros_like(gathered))
    real_BKTH = jnp.where((jnp.arange(t) < length)[None, None, :, None], x_BKTH, jnp.zeros_like(x_BKTH))
    return jax.lax.dynamic_update_slice(buf_BKSH, real_BKTH, (0, 0, 0, 0))


def prefill(
    params: Params,
    cfg: ModelConfig,
    ids_BT: jax.Array,
    length: jax.Array,
    cache: KVCache,
    *,
    dtype=None,
    q_chunk: int = PREFILL_Q_CHUNK,
    window_block: int | None = None,
) -> tuple[jax.Array, KVCache]:
    """Process a right-padded prompt (bucket length T, `length` real tokens) into an empty cache.

    Returns the float32 logits [B,V] at the last real position and the filled cache (length = `length`).
    Exact shortcuts: sliding layers attend in blocks of `window_block` queries (default `window_q_block(cfg)`),
    each reading W + block keys (O(T*W)); full layers attend in causal blocks of
    `q_chunk` queries (`attend_causal`: about half of dense T^2); the KV-shared layers, which write no
    cache, run only for the last real position (the only one whose logits are needed), attending over their
    producer's prompt K/V (architecture notes §2.4). `dtype` is the activation dtype (default: the cache's).
    """
    b, t = ids_BT.shape
    dtype = dtype or (cache.k[0].dtype if cache.k else jnp.float32)
    pos_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    h_BTD = embed(params, cfg, ids_BT, dtype)
    ple_BTLP = per_layer_inputs(params, cfg, ids_BT, h_BTD)
    kv: dict[int, tuple[jax.Array, jax.Array]] = {}
    new_k, new_v = list(cache.k), list(cache.v)
    kpos_T = jnp.arange(t)
    for i in cfg.cache_layers:
        lp = params.layers[i]
        with jax.named_scope(f"layer_{i}"):
            a_BTD = rms_norm(h_BTD, lp.attn_norm_D, cfg.rms_norm_eps)
            q_BTNH, k_BKTH, v_BKTH = project_qkv(lp, cfg, i, a_BTD, pos_BT)
            kv[i] = (k_BKTH, v_BKTH)
            if cfg.is_sliding(i) and t > cfg.sliding_window:
                block = window_block or window_q_block(cfg)
                o_BTNH = attend_windowed(q_BTNH, k_BKTH, v_BKTH, cfg.sliding_window, length, block)
            elif not cfg.is_sliding(i) and t > q_chunk:
                o_BTNH = attend_causal(q_BTNH, k_BKTH, v_BKTH, length, q_chunk)
            else:
                mask_TT = _visible(cfg, i, kpos_T[:, None], kpos_T[None, :]) & (kpos_T[None, :] < length)
                o_BTNH = attend(q_BTNH, k_BKTH, v_BKTH, jnp.broadcast_to(mask_TT, (b, t, t)))
            h_BTD = layer_tail(lp, cfg, h_BTD, attn_output(lp, o_BTNH), _ple(ple_BTLP, i))
            new_k[i] = _write_prefill(cfg, i, cache.k[i], k_BKTH, length)
            new_v[i] = _write_prefill(cfg, i, cache.v[i], v_BKTH, length)
    # From here on only the last real position matters.
    last = length - 1
    h_B1D = jax.lax.dynamic_slice_in_dim(h_BTD, last, 1, axis=1)
    ple_B1LP = None if ple_BTLP is None else jax.lax.dynamic_slice_in_dim(ple_BTLP, last, 1, axis=1)
    qpos_B1 = jnp.full((b, 1), last, jnp.int32)
    for i in range(cfg.first_shared_layer, cfg.num_layers):
        lp = params.layers[i]
        with jax.named_scope(f"layer_{i}"):
            a_B1D = rms_norm(h_B1D, lp.attn_norm_D, cfg.rms_norm_eps)
            q_B1NH, _, _ = project_qkv(lp, cfg, i, a_B1D, qpos_B1)
            k_BKTH, v_BKTH = kv[cfg.kv_source(i)]
            mask_1T = _visible(cfg, i, last, kpos_T)[None, :]
            o_B1NH = attend(q_B1NH, k_BKTH, v_BKTH, jnp.broadcast_to(mask_1T, (b, 1, t)))
            h_B1D = layer_tail(lp, cfg, h_B1D, attn_output(lp, o_B1NH), _ple(ple_B1LP, i))
    out_BV = logits(params, cfg, h_B1D)[:, 0]
    return out_BV, KVCache(k=tuple(new_k), v=tuple(new_v), length=jnp.asarray(length, jnp.int32))


def decode_step(
    params: Params, cfg: ModelConfig, token_B: jax.Array, cache: KVCache, *, dtype=None
) -> tuple[jax.Array, KVCache]:
    """One token per row at absolute position `cache.length`: returns float32 logits [B,V] and the cache with
    that position written (full layers: slot p; sliding layers: ring slot p mod R) and length + 1.
    `dtype` is the activation dtype (default: the cache's); K/V are stored in the cache's dtype."""
    b = token_B.shape[0]
    kv_dtype = cache.k[0].dtype if cache.k else jnp.float32
    dtype = dtype or kv_dtype
    p = cache.length
    ids_B1 = token_B[:, None]
    pos_B1 = jnp.full((b, 1), p, jnp.int32)
    h_B1D = embed(params, cfg, ids_B1, dtype)
    ple_B1LP = per_layer_inputs(params, cfg, ids_B1, h_B1D)
    new_k, new_v = list(cache.k), list(cache.v)
    for i, lp in enumerate(params.layers):
        with jax.named_scope(f"layer_{i}"):
            a_B1D = rms_norm(h_B1D, lp.attn_norm_D, cfg.rms_norm_eps)
            q_B1NH, k_BK1H, v_BK1H = project_qkv(lp, cfg, i, a_B1D, pos_B1)
            src = cfg.kv_source(i)
            if not cfg.is_kv_shared(i):
                slot = jnp.mod(p, new_k[i].shape[2]) if cfg.is_sliding(i) else p
                k_new = jax.lax.dynamic_update_slice(new_k[i], k_BK1H.astype(kv_dtype), (0, 0, slot, 0))
                v_new = jax.lax.dynamic_update_slice(new_v[i], v_BK1H.astype(kv_dtype), (0, 0, slot, 0))
                # The barrier keeps XLA from duplicating each update into its readers (the step's output and the
                # attention below), which made XLA:CPU copy every cache buffer several times per decode step.
                new_k[i], new_v[i] = jax.lax.optimization_barrier((k_new, v_new))
            k_BKSH, v_BKSH = new_k[src], new_v[src]
            s = k_BKSH.shape[2]
            if cfg.is_sliding(i):
                kpos_S = ring_positions(p + 1, s)
                vis_S = (kpos_S >= 0) & _visible(cfg, i, p, kpos_S)
            else:
                vis_S = jnp.arange(s) <= p
            o_B1NH = attend(q_B1NH, k_BKSH, v_BKSH, jnp.broadcast_to(vis_S[None, None, :], (b, 1, s)))
            h_B1D = layer_tail(lp, cfg, h_B1D, attn_output(lp, o_B1NH), _ple(ple_B1LP, i))
    out_BV = logits(params, cfg, h_B1D)[:, 0]
    return out_BV, KVCache(k=tuple(new_k), v=tuple(new_v), length=p + 1)


__all__ = ["PREFILL_Q_CHUNK", "PREFILL_WINDOW_Q_BLOCK", "window_q_block", "embed", "per_layer_inputs", "logits",
           "forward_full", "prefill", "decode_step"]
