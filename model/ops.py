"""The decoder's elementwise and product primitives, shared by `model.layers` and `model.moe` (which
`model.layers` calls for the expert block, so they live below both): `dense`, `geglu_mlp`, `rms_norm`, `gelu`.
Formulas: ../shared/gemma4-architecture.md §2 (transformers 5.23 `modeling_gemma4.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from model import quant


def dense(x: jax.Array, w, spec: str) -> jax.Array:
    """`einsum(spec, x, w)` in the activation dtype: `model.quant.matmul`, for a dense weight (converted to x's
    dtype first) or a `model.quant.QuantArray` (integer values converted, scales applied after the product).

    The one place where stored weights meet activations, so the layers never branch on quantization: when the
    stored dtype differs from the compute dtype this convert is what a profile shows as dtype-conversion time
    (the published report's "leak one").
    """
    return quant.matmul(x, w, spec)


def geglu_mlp(x: jax.Array, gate_up, down) -> jax.Array:
    """The GeGLU MLP down(gelu_tanh(x gate) * (x up)) for x [B, T, D]: gate_up [D, 2F] (gate columns, then up) and
    down [D, F], dense or `model.quant.QuantArray`; [B, T, D] in x's dtype. One kernel call where the engine fused
    the MLP (`model.quant.fused_mlp`: `w4` on a TPU under the "fused" tiling policy), else two `dense` products."""
    y = quant.fused_mlp(x, gate_up, down)
    if y is not None:
        return y
    gu_BTX = dense(x, gate_up, "BTD,DX->BTX")  # one product: gate and up side by side
    f = gu_BTX.shape[-1] // 2
    return dense(gelu(gu_BTX[..., :f]) * gu_BTX[..., f:], down, "BTF,DF->BTD")


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
