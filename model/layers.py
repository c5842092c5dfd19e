"""Pure building blocks of the Gemma 4 decoder: norms, RoPE, masked attention, the MLP, per-layer inputs.

Key: B batch, T query positions, S key positions, Q = G*T query rows per kv head, D model width, N query heads,
K kv heads, G = N // K query heads per kv head, H head dim, F feed-forward width, P per-layer-input width,
W window.
Formulas: ../shared/gemma4-architecture.md §2 (transformers 5.23 `modeling_gemma4.py`).
Every block sits under a `jax.named_scope`, so profiles map device time back to this code.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from model import backends
from model.accounting import has_v_projection
from model.config import ModelConfig
from model.ops import dense, geglu_mlp, gelu, rms_norm  # noqa: F401  (re-exported: the layers' names for them)
from model.params import LayerParams

_MASKED = -1e30  # finite, so a fully masked row (a padding query) softmaxes to a uniform row instead of NaN


def rope_inv_freq(cfg: ModelConfig, sliding: bool) -> np.ndarray:
    """Inverse frequencies [H/2] (float32) of a layer type.

    Sliding layers: theta_k = 1e4^(-2k/H), all pairs rotate. Full layers (proportional RoPE): the first
    int(factor * H / 2) pairs use theta_k = 1e6^(-2k/H) with the exponent over the FULL head dim, the rest are 0
    (cos 1, sin 0: they pass through unchanged). Source: architecture notes §2.3.
    """
    h = cfg.head_dim if sliding else cfg.global_head_dim
    theta = cfg.rope_local_theta if sliding else cfg.rope_global_theta
    pairs = h // 2 if sliding else cfg.rotary_pairs_global
    inv = np.zeros(h // 2, np.float32)
    k = np.arange(pairs, dtype=np.float32)
    inv[:pairs] = 1.0 / (theta ** (2.0 * k / h))
    return inv


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rope:
    """The RoPE tables of one layer type at a set of positions: cos and sin [B,T,H] in the activation dtype."""

    cos_BTH: jax.Array
    sin_BTH: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RopeTables:
    """Both layer types' tables (`Rope`) at the same positions, computed once per forward pass (`rope_tables`)
    and read by every layer of that type."""

    sliding: Rope
    full: Rope

    def of(self, cfg: ModelConfig, layer: int) -> Rope:
        """The tables `layer` rotates by (its type's)."""
        return self.sliding if cfg.is_sliding(layer) else self.full


def rope_tables(cfg: ModelConfig, pos_BT: jax.Array, dtype) -> RopeTables:
    """cos and sin of the angles pos * inv_freq (`rope_inv_freq`, duplicated to [H] for the rotate_half layout) at
    positions `pos_BT` [B,T] (int32), for both layer types: computed in float32, cast to `dtype` (the activation
    dtype), as transformers does.

    The tables leave through an optimization barrier, so they are computed once per forward pass and read by
    every layer: fused into the rotations, XLA:CPU computed cos and sin once per element of q and k in every layer
    (N times per table entry, 35 times per position; at 16 decode rows on the default preset the rotations of
    one step took 4.2 ms, and the q rotation of one sliding layer 2.2 ms per prefill chunk of 128).
    """

    def tables(sliding: bool) -> Rope:
        freqs_BTh = pos_BT.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(cfg, sliding))
        emb_BTH = jnp.concatenate([freqs_BTh, freqs_BTh], axis=-1)
        return Rope(jnp.cos(emb_BTH).astype(dtype), jnp.sin(emb_BTH).astype(dtype))

    return jax.lax.optimization_barrier(RopeTables(sliding=tables(True), full=tables(False)))


def apply_rope(x_BTNH: jax.Array, rope: Rope) -> jax.Array:
    """Rotate x [B,T,N,H] by the tables of its positions (`rope_tables`) in the rotate_half layout:
    x*cos + concat(-x2, x1)*sin (dim k pairs k+H/2). Returns [B,T,N,H] in x's dtype."""
    cos_BT1H, sin_BT1H = rope.cos_BTH[:, :, None, :], rope.sin_BTH[:, :, None, :]
    x1, x2 = jnp.split(x_BTNH, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x_BTNH * cos_BT1H + rotated * sin_BT1H


def project_qkv(
    lp: LayerParams, cfg: ModelConfig, layer: int, a_BTD: jax.Array, rope: RopeTables
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """Queries [B,T,N,H] and, on a layer that owns K/V, keys and values [B,K,T,H] (head-major, the cache's layout),
    from ONE matrix product with the fused q/k/v weight `lp.qkv_DX` (KV-shared layers: q only, k = v = None).

    Queries: q-norm (learned weight) and RoPE of the layer's type (`rope`: the tables at a_BTD's positions);
    scale 1.0 (no 1/sqrt(H)). Keys: k-norm (learned weight) and RoPE; values: v-norm without weight, of the value
    projection or, where `cfg.values_from_keys(layer)` (K = V: `qkv_DX` holds q and k only), of the key projection. The norms and
    RoPE apply per head, so splitting the fused product's columns first gives exactly the separate projections'
    results.
    """
    b, t = a_BTD.shape[:2]
    n, h, k = cfg.num_heads, cfg.layer_head_dim(layer), cfg.kv_heads(layer)
    tables = rope.of(cfg, layer)
    if _grouped(lp.qkv_DX):  # grouped by device (model.sharding): [D, G, (N/G + 2 Kd) H]
        return _project_qkv_grouped(lp, cfg, layer, a_BTD, tables, h)
    z_BTX = dense(a_BTD, lp.qkv_DX, "BTD,DX->BTX")
    q_BTNH = rms_norm(z_BTX[..., : n * h].reshape(b, t, n, h), lp.q_norm_H, cfg.rms_norm_eps)
    q_BTNH = apply_rope(q_BTNH, tables)
    if lp.k_norm_H is None:
        return q_BTNH, None, None
    raw_k_BTKH = z_BTX[..., n * h : (n + k) * h].reshape(b, t, k, h)
    k_BTKH = apply_rope(rms_norm(raw_k_BTKH, lp.k_norm_H, cfg.rms_norm_eps), tables)
    # attention_k_eq_v (31B, 26B-A4B full layers): no v_proj; the values are the key projection's raw output
    # (before k-norm and RoPE) through the v-norm (transformers `Gemma4TextAttention.forward`: v = k_proj(x)).
    raw_v_BTKH = raw_k_BTKH if cfg.values_from_keys(layer) else z_BTX[..., (n + k) * h :].reshape(b, t, k, h)
    v_BTKH = rms_norm(raw_v_BTKH, None, cfg.rms_norm_eps)
    return q_BTNH, jnp.swapaxes(k_BTKH, 1, 2), jnp.swapaxes(v_BTKH, 1, 2)


def _grouped(w) -> bool:
    """Whether a fused weight is held grouped by device, [D, G, X/G] (`model.sharding.group_layer`), rather than
    [D, X] (a dense array, a `model.quant.QuantArray` by its logical shape; a `model.quant.OutputMajor` never)."""
    return len(getattr(w, "shape", ())) == 3


def _project_qkv_grouped(lp: LayerParams, cfg: ModelConfig, layer: int, a_BTD: jax.Array, tables: Rope, h: int):
    """`project_qkv` with the fused weight grouped by device, qkv_DX [D, G, (N/G + 2 Kd) H] (`model.sharding
    .group_layer`): group g holds query heads g N/G .. (g+1) N/G - 1 and the Kd KV heads they read (its own K/G, or
    one copy of a KV head when G > K). Returns queries [B,T,N,H] in head order and keys and values [B,G Kd,T,H]
    in group order (the KV cache of a mesh, `model.sharding.MeshLayout.cache_heads`); Kd from the weight's shape
    (0: a KV-shared layer, k = v = None). The same norms and RoPE per head as `project_qkv`. A layer whose values
    are its keys' projection (K = V: `model.accounting.has_v_projection` False) holds [D, G, (N/G + Kd) H]."""
    b, t = a_BTD.shape[:2]
    _, g, x = lp.qkv_DX.shape
    nq = cfg.num_heads // g
    k_eq_v = not has_v_projection(cfg, layer)  # K = V: the values are the keys' projection
    kd = (x // h - nq) // (1 if k_eq_v else 2)
    z_BTGX = dense(a_BTD, lp.qkv_DX, "BTD,DGX->BTGX")
    q_BTNH = rms_norm(z_BTGX[..., : nq * h].reshape(b, t, g * nq, h), lp.q_norm_H, cfg.rms_norm_eps)
    q_BTNH = apply_rope(q_BTNH, tables)
    if lp.k_norm_H is None:
        return q_BTNH, None, None
    raw_k_BTKH = z_BTGX[..., nq * h : (nq + kd) * h].reshape(b, t, g * kd, h)
    k_BTKH = apply_rope(rms_norm(raw_k_BTKH, lp.k_norm_H, cfg.rms_norm_eps), tables)
    raw_v_BTKH = raw_k_BTKH if k_eq_v else z_BTGX[..., (nq + kd) * h :].reshape(b, t, g * kd, h)
    v_BTKH = rms_norm(raw_v_BTKH, None, cfg.rms_norm_eps)
    return q_BTNH, jnp.swapaxes(k_BTKH, 1, 2), jnp.swapaxes(v_BTKH, 1, 2)


def attend(q_BTNH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, mask_BTS: jax.Array) -> jax.Array:
    """Masked softmax attention with the K kv heads broadcast over G = N/K query heads (MQA/GQA); scale 1.0.

    Keys and values come head-major, [B,K,S,H] (the KV cache's layout): with the batch axes (B, K) outermost,
    XLA reads a cache in place; with [B,S,K,H] XLA:CPU transposed the whole K cache on every decode step.
    Scores accumulate in float32 and the softmax runs in float32; the probabilities are cast to v's dtype.
    Returns [B,T,N,H] in q's dtype.
    """
    with jax.named_scope("attention"):
        b, t, n, h = q_BTNH.shape
        k, s = k_BKSH.shape[1], k_BKSH.shape[2]
        g = n // k
        # Queries of one kv head side by side (Q = G*T), so both products are plain batched matmuls over (B, K).
        q_BKQH = jnp.transpose(q_BTNH.reshape(b, t, k, g, h), (0, 2, 3, 1, 4)).reshape(b, k, g * t, h)
        s_BKQS = jnp.einsum("BKQH,BKSH->BKQS", q_BKQH, k_BKSH, preferred_element_type=jnp.float32)
        mask_B1QS = jnp.broadcast_to(mask_BTS[:, None, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)
        s_BKQS = jnp.where(mask_B1QS, s_BKQS, _MASKED)
        p_BKQS = jax.nn.softmax(s_BKQS, axis=-1).astype(v_BKSH.dtype)
        o_BKQH = jnp.einsum("BKQS,BKSH->BKQH", p_BKQS, v_BKSH)
        o_BTKGH = jnp.transpose(o_BKQH.reshape(b, k, g, t, h), (0, 3, 1, 2, 4))
        return o_BTKGH.reshape(b, t, n, h).astype(q_BTNH.dtype)


def value_product_key_major(b: int, s: int, h: int) -> bool:
    """Whether decode attention's value product (`attend_one`) contracts S of the key-major probabilities
    [B,K,S,G] directly (True) or of their transpose [B,K,G,S] (False), for B rows over a value cache of S
    positions x H dims per kv head. True when a row's value cache holds at least 256K values (S*H; 1 MiB in
    float32), or 128K at B = 1.

    Measured on XLA:CPU (2-core AMD EPYC, float32, G = 8, chains of 12 distinct caches, 15 alternating rounds,
    median of paired ratios, transposed time / direct time): B = 1: S = 128 x H = 256 0.70, 128 x 512 1.01,
    512 x 256 1.22, 1088 x 512 1.29, 4160 x 512 1.70; B = 4: 512 x 256 0.99, 1088 x 512 1.44; B = 16: 128 x 256
    0.63, 128 x 512 0.77, 512 x 256 0.95, 1088 x 512 1.33 (at B = 16, S = 128, H = 512 the direct product ran as
    a plain dot in 2.5 ms of a step against 1.9 ms transposed, in the commit that introduced the transposed form).
    """
    return s * h >= (1 << 17 if b == 1 else 1 << 18)


def attend_one(q_B1NH: jax.Array, k_BKSH: jax.Array, v_BKSH: jax.Array, mask_BS: jax.Array,
               rows: jax.Array | None = None) -> jax.Array:
    """`attend` for one query position per row (decode): the same function, laid out for XLA:CPU.

    q [B,1,N,H], k/v [B,K,S,H] (head-major, the cache's layout), mask [B,S] (bool, True = visible); scale 1.0.
    With `rows` (int32 [B]), k/v hold C rows [C,K,S,H] and query row b attends to cache row rows[b] (decode slots
    stepping some of their rows): the CPU kernel reads those rows in place, XLA's products a gathered copy.
    Where the trace's backend provides decode attention (`model.backends.decode_attention`: the "cpu-kernels"
    backend, float32 on CPU), one call of the engine's CPU kernel, which reads only the visible positions (a row
    with none visible: zeros, where XLA's products give the mean of v; decode always sees its own position);
    otherwise (the pure-JAX engine) XLA's two products over the whole cache, as follows.
    The scores are key-major, [B,K,S,G]: the product k q^T keeps the cache's long axis S outermost, so the key
    and value caches are each read once in place, and the softmax runs over S. With query-major scores
    [B,K,G,S] (`attend`), XLA:CPU ran both products as G-row matrix products over the whole cache, several
    times slower than reading the cache (decode step times in the commit that introduced this). The
    value product's form follows the cache's size (`value_product_key_major`): over a long cache it contracts S
    of the key-major probabilities [B,K,S,G] directly; over a short one the probabilities are first transposed
    to [B,K,G,S] (G*S values per row, small beside the cache) so the product contracts the minor axis of p.
    Returns [B,1,N,H] in q's dtype.
    """
    with jax.named_scope("attention"):
        b, _, n, h = q_B1NH.shape
        k = k_BKSH.shape[1]
        g = n // k
        q_BKGH = q_B1NH.reshape(b, k, g, h)  # T = 1: the query heads of kv head k are rows k*G .. k*G+G-1
        o_BKGH = backends.decode_attention(q_BKGH, k_BKSH, v_BKSH, mask_BS, rows)
        if o_BKGH is not None:
            return o_BKGH.reshape(b, 1, n, h).astype(q_B1NH.dtype)
        if rows is not None:  # a gathered copy of the rows decoded, every position of them
            k_BKSH, v_BKSH = jnp.take(k_BKSH, rows, axis=0), jnp.take(v_BKSH, rows, axis=0)
        s_BKSG = jnp.einsum("BKSH,BKGH->BKSG", k_BKSH, q_BKGH, preferred_element_type=jnp.float32)
        s_BKSG = jnp.where(mask_BS[:, None, :, None], s_BKSG, _MASKED)
        p_BKSG = jax.nn.softmax(s_BKSG, axis=2).astype(v_BKSH.dtype)
        if value_product_key_major(b, *v_BKSH.shape[2:]):
            o_BKGH = jnp.einsum("BKSG,BKSH->BKGH", p_BKSG, v_BKSH)
        else:
            o_BKGH = jnp.einsum("BKGS,BKSH->BKGH", jnp.swapaxes(p_BKSG, 2, 3), v_BKSH)  # small: G*S per row
        return o_BKGH.reshape(b, 1, n, h).astype(q_B1NH.dtype)


def attn_output(lp: LayerParams, o_BTNH: jax.Array) -> jax.Array:
    """Output projection [B,T,N,H] -> [B,T,D], contracted over the flattened (N*H) axis of `lp.o_DX` [D, N*H].

    The reshape is free (row-major), and the weight is read along its long, minor axis (see `LayerParams`). Before,
    the 4-D einsum "BTNH,NHD->BTD" made XLA:CPU transpose every layer's o_proj weight on every decode step (72% of
    decode time in `bench profile` on the default checkpoint).
    """
    b, t, n, h = o_BTNH.shape
    return dense(o_BTNH.reshape(b, t, n * h), lp.o_DX, "BTX,DX->BTD")


def layer_tail(
    lp: LayerParams, cfg: ModelConfig, h_BTD: jax.Array, attn_BTD: jax.Array, ple_BTP: jax.Array | None,
    layer: int = 0,
) -> jax.Array:
    """Everything after attention in decoder layer `layer`: post-attn norm + residual, GeGLU MLP with its two
    norms, the per-layer-input gate and projection, and the layer scalar (architecture notes §2.2).

    With experts (`cfg.has_experts`, 26B-A4B) the expert block (`model.moe.expert_block`, on the residual stream
    before the MLP) runs beside the MLP: post_feedforward_layernorm_1(MLP) + the experts' normed output, then
    post_feedforward_layernorm of that sum joins the residual (transformers `Gemma4TextDecoderLayer.forward`)."""
    h_BTD = h_BTD + rms_norm(attn_BTD, lp.post_attn_norm_D, cfg.rms_norm_eps)
    with jax.named_scope("mlp"):
        x_BTD = rms_norm(h_BTD, lp.pre_ffw_norm_D, cfg.rms_norm_eps)
        if _grouped(lp.gate_up_DX):  # grouped by device (model.sharding): [D, G, 2 F/G], group g gate_g | up_g
            gu_BTGX = dense(x_BTD, lp.gate_up_DX, "BTD,DGX->BTGX")
            f = gu_BTGX.shape[-1] // 2
            m_BTGF = gelu(gu_BTGX[..., :f]) * gu_BTGX[..., f:]
            m_BTD = dense(m_BTGF.reshape(*m_BTGF.shape[:2], -1), lp.down_DF, "BTF,DF->BTD")
        else:
            m_BTD = geglu_mlp(x_BTD, lp.gate_up_DX, lp.down_DF)
        if cfg.has_experts:
            from model.moe import expert_block

            m_BTD = rms_norm(m_BTD, lp.post_ffw1_norm_D, cfg.rms_norm_eps) + expert_block(lp, cfg, h_BTD, layer=layer)
        h_BTD = h_BTD + rms_norm(m_BTD, lp.post_ffw_norm_D, cfg.rms_norm_eps)
    if ple_BTP is not None:
        with jax.named_scope("per_layer_input"):
            g_BTP = gelu(dense(h_BTD, lp.ple_gate_PD, "BTD,PD->BTP")) * ple_BTP
            p_BTD = dense(g_BTP, lp.ple_proj_PD, "BTP,PD->BTD")
            h_BTD = h_BTD + rms_norm(p_BTD, lp.post_ple_norm_D, cfg.rms_norm_eps)
    return h_BTD * lp.layer_scalar_1.astype(h_BTD.dtype)
