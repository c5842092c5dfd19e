"""Pure building blocks of the Gemma 4 decoder: norms, RoPE, masked attention, the MLP, per-layer inputs.

Key: B batch, T query positions, S key positions, Q = G*T query rows per kv head, D model width, N query heads,
K kv heads, G = N // K query heads per kv head, H head dim, F feed-forward width, P per-layer-input width,
W window; blocked attention: C query blocks, A queries per block, U keys per block.
Formulas: ../shared/gemma4-architecture.md §2 (transformers 5.23 `modeling_gemma4.py`).
Every block sits under a `jax.named_scope`, so profiles map device time back to this code.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from model.config import ModelConfig
from model.params import LayerParams

_MASKED = -1e30  # finite, so a fully masked row (a padding query) softmaxes to a uniform row instead of NaN


def dense(x: jax.Array, w: jax.Array, spec: str) -> jax.Array:
    """`einsum(spec, x, w)` with the weight converted to the activation dtype first.

    The one place where stored weights meet activations: when the stored dtype differs from the compute dtype
    this convert is what a profile shows as dtype-conversion time (the published report's "leak one").
    """
    return jnp.einsum(spec, x, w.astype(x.dtype))


def rms_norm(x: jax.Array, w: jax.Array | None, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32 and cast back: x * (mean(x^2) + eps)^-1/2 * w.

    Gemma 4 multiplies by w directly (Gemma 2/3 used 1 + w); w=None is the weightless v-norm.
    """
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(jnp.float32)
    return y.astype(x.dtype)


def gelu(x: jax.Array) -> jax.Array:
    """GELU with the tanh approximation (`gelu_pytorch_tanh`)."""
    return jax.nn.gelu(x, approximate=True)


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


def apply_rope(x_BTNH: jax.Array, pos_BT: jax.Array, inv_freq_h: np.ndarray) -> jax.Array:
    """Rotate x by absolute positions in the rotate_half layout: x*cos + concat(-x2, x1)*sin (dim k pairs k+H/2).

    cos/sin are computed in float32 and cast to the activation dtype, as transformers does.
    """
    freqs_BTh = pos_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq_h)
    emb_BTH = jnp.concatenate([freqs_BTh, freqs_BTh], axis=-1)
    cos_BT1H = jnp.cos(emb_BTH).astype(x_BTNH.dtype)[:, :, None, :]
    sin_BT1H = jnp.sin(emb_BTH).astype(x_BTNH.dtype)[:, :, None, :]
    x1, x2 = jnp.split(x_BTNH, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x_BTNH * cos_BT1H + rotated * sin_BT1H


def project_q(lp: LayerParams, cfg: ModelConfig, layer: int, a_BTD: jax.Array, pos_BT: jax.Array) -> jax.Array:
    """Queries [B,T,N,H]: projection, q-norm (learned weight), RoPE of the layer's type. Scale is 1.0 (no 1/sqrt)."""
    q_BTNH = dense(a_BTD, lp.wq_DNH, "BTD,DNH->BTNH")
    q_BTNH = rms_norm(q_BTNH, lp.q_norm_H, cfg.rms_norm_eps)
    return apply_rope(q_BTNH, pos_BT, rope_inv_freq(cfg, cfg.is_sliding(layer)))


def project_kv(
    lp: LayerParams, cfg: ModelConfig, layer: int, a_BTD: jax.Array, pos_BT: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B,K,T,H] (head-major, the cache's layout) of a layer that owns K/V: k-norm (learned
    weight) and RoPE on keys; v-norm without weight on values."""
    k_BTKH = rms_norm(dense(a_BTD, lp.wk_DKH, "BTD,DKH->BTKH"), lp.k_norm_H, cfg.rms_norm_eps)
    k_BTKH = apply_rope(k_BTKH, pos_BT, rope_inv_freq(cfg, cfg.is_sliding(layer)))
    v_BTKH = rms_norm(dense(a_BTD, lp.wv_DKH, "BTD,DKH->BTKH"), None, cfg.rms_norm_eps)
    return jnp.swapaxes(k_BTKH, 1, 2), jnp.swapaxes(v_BTKH, 1, 2)


def project_qkv(
    lp: LayerParams, cfg: ModelConfig, layer: int, a_BTD: jax.Array, pos_BT: jax.Array
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """Queries [B,T,N,H] and, for a layer that owns K/V, keys and values [B,K,T,H] (head-major); (q, None, None)
    for a KV-shared layer. Norms and RoPE as `project_q` / `project_kv`."""
    q_BTNH = project_q(lp, cfg, layer, a_BTD, pos_BT)
    if cfg.is_kv_shared(layer):
        return q_BTNH, None, None
    k_BKTH, v_BKTH = project_kv(lp, cfg, layer, a_BTD, pos_BT)
    return q_BTNH, k_BKTH, v_BKTH


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


def attend_windowed(
    q_BTNH: jax.Array, k_BKTH: jax.Array, v_BKTH: jax.Array, window: int, length: jax.Array, block: int | None = None
) -> jax.Array:
    """Causal sliding-window self-attention over one sequence, in blocks of `block` queries (default: the window):
    O(T * (W + block)) instead of O(T^2).

    Query block c (positions c*A .. c*A+A-1, A = block, which must divide W = window) sees the W/A + 1 key blocks
    that end with its own: keys c*A - W .. c*A+A-1, every key any of its queries can see. The mask keeps j <= i,
    j > i - W and j < length (right padding never visible). Equals `attend` with the full sliding mask.
    Smaller blocks read fewer keys per query (W + A) but copy K/V into W/A + 1 shifted views.
    Raises ValueError when `block` does not divide `window`.
    """
    q_len = window if block is None else block
    if q_len < 1 or window % q_len:
        raise ValueError(f"block {block} must be a positive divisor of the window {window}")
    m = window // q_len  # key blocks before the query's own
    b, t, n, h = q_BTNH.shape
    kh = k_BKTH.shape[1]
    c = -(-t // q_len)
    tp = c * q_len
    q_BCANH = jnp.pad(q_BTNH, [(0, 0), (0, tp - t), (0, 0), (0, 0)]).reshape(b, c, q_len, n, h)
    lead = [(0, 0), (0, 0), (window, tp - t), (0, 0)]  # W zeros before position 0

    def blocks(x_BKTH):  # [B,K,T,H] -> [B*C, K, U=W+A, H]: key blocks c-m .. c for each query block c
        x_BKcAH = jnp.pad(x_BKTH, lead).reshape(b, kh, c + m, q_len, h)
        x_BKCUH = jnp.concatenate([x_BKcAH[:, :, o : o + c] for o in range(m + 1)], axis=3)
        return jnp.swapaxes(x_BKCUH, 1, 2).reshape(b * c, kh, window + q_len, h)

    qpos_CA = jnp.arange(tp).reshape(c, q_len)
    kpos_CU = jnp.arange(c)[:, None] * q_len - window + jnp.arange(window + q_len)[None, :]
    i, j = qpos_CA[:, :, None], kpos_CU[:, None, :]
    mask_CAU = (j <= i) & (j > i - window) & (j >= 0) & (j < length)
    # Fold the blocks into the batch axis and reuse the plain kernel.
    out = attend(
        q_BCANH.reshape(b * c, q_len, n, h),
        blocks(k_BKTH),
        blocks(v_BKTH),
        jnp.broadcast_to(mask_CAU[None], (b, c, q_len, window + q_len)).reshape(b * c, q_len, window + q_len),
    )
    return out.reshape(b, tp, n, h)[:, :t]


def attend_causal(
    q_BTNH: jax.Array, k_BKTH: jax.Array, v_BKTH: jax.Array, length: jax.Array, chunk: int
) -> jax.Array:
    """Causal full self-attention over one right-padded sequence, one block of `chunk` queries at a time.

    Query block c (positions cC .. cC+C-1, C = chunk) attends only keys 0 .. cC+C-1, the ones it can see, so the
    two products cost T^2/2 * (1 + C/T) multiply-adds per head instead of T^2, and the float32 score block is
    [B,K,G*C,<=T] instead of [B,K,G*T,T]. The mask keeps j <= i and j < length (right padding never visible).
    Equals `attend` with the full causal mask up to float summation order. Returns [B,T,N,H] in q's dtype.
    """
    b, t = q_BTNH.shape[:2]
    kpos_T = jnp.arange(t)
    outs = []
    for start in range(0, t, chunk):
        stop = min(start + chunk, t)
        qpos_C = jnp.arange(start, stop)
        mask_CS = (kpos_T[None, :stop] <= qpos_C[:, None]) & (kpos_T[None, :stop] < length)
        outs.append(
            attend(
                q_BTNH[:, start:stop],
                k_BKTH[:, :, :stop],
                v_BKTH[:, :, :stop],
                jnp.broadcast_to(mask_CS[None], (b, stop - start, stop)),
            )
        )
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def attn_output(lp: LayerParams, o_BTNH: jax.Array) -> jax.Array:
    """Output projection [B,T,N,H] -> [B,T,D], contracted over the flattened (N*H) axis.

    Both reshapes are free (row-major), and a 2-D contraction lets XLA lay out the small activation rather than
    the weight: with the 4-D einsum "BTNH,NHD->BTD", XLA:CPU transposed every layer's o_proj weight on every
    decode step (72% of decode time in `bench profile` on the default checkpoint, before this change).
    """
    b, t, n, h = o_BTNH.shape
    return dense(o_BTNH.reshape(b, t, n * h), lp.wo_NHD.reshape(n * h, -1), "BTX,XD->BTD")


def layer_tail(
    lp: LayerParams, cfg: ModelConfig, h_BTD: jax.Array, attn_BTD: jax.Array, ple_BTP: jax.Array | None
) -> jax.Array:
    """Everything after attention in a decoder layer: post-attn norm + residual, GeGLU MLP with its two norms,
    the per-layer-input gate and projection, and the layer scalar (architecture notes §2.2)."""
    h_BTD = h_BTD + rms_norm(attn_BTD, lp.post_attn_norm_D, cfg.rms_norm_eps)
    with jax.named_scope("mlp"):
        x_BTD = rms_norm(h_BTD, lp.pre_ffw_norm_D, cfg.rms_norm_eps)
        g_BTF = gelu(dense(x_BTD, lp.gate_DF, "BTD,DF->BTF")) * dense(x_BTD, lp.up_DF, "BTD,DF->BTF")
        m_BTD = dense(g_BTF, lp.down_FD, "BTF,FD->BTD")
        h_BTD = h_BTD + rms_norm(m_BTD, lp.post_ffw_norm_D, cfg.rms_norm_eps)
    if ple_BTP is not None:
        with jax.named_scope("per_layer_input"):
            g_BTP = gelu(dense(h_BTD, lp.ple_gate_DP, "BTD,DP->BTP")) * ple_BTP
            p_BTD = dense(g_BTP, lp.ple_proj_PD, "BTP,PD->BTD")
            h_BTD = h_BTD + rms_norm(p_BTD, lp.post_ple_norm_D, cfg.rms_norm_eps)
    return h_BTD * lp.layer_scalar_1.astype(h_BTD.dtype)
