"""The TPU layout of a w4 projection: the same int4 values and scales as the `w4` layout (`model.quant`), stored so
the TPU kernel (`model.kernels.w4a16_tpu`) reads them in 32-bit tiles with no relayout. jax only, no Pallas.

The `w4` layout stores int4 values two per uint8 byte along the leaf's last axis, scales [ceil(shape[i] /
block[i])]. A uint8 array is tiled (32, 128) in TPU memory and 32-bit ones (8, 128); a uint8 weight handed to a
kernel that reads 32-bit words would be copied into the other tiling on every call (the per-step relayout issue 43
found on the PLE table). So, on a TPU, each w4 projection the kernel multiplies is stored at load
(`model.kernels.choice.with_tilings`, the one place) in this layout, in the logical [K, N] orientation of its
product (a leaf whose contraction axis is 1, [N, K], is transposed):

- words: int32 [K, N / 8]; word (k, m) holds the 8 values q[k, p N / 8 + m], p = 0..7, value p in bits 4p..4p+3
  (two's complement nibbles). A block of bw words along N then holds, for each p, bw consecutive outputs: the
  kernel's 8 "planes" (output columns p N / 8 + [j bw, (j + 1) bw)), each a plain [bk, bw] matrix after a shift.
- scales: [K / g, 8, N / 8] in the scales' dtype; [i, p, m] is the scale of group i, output p N / 8 + m: the [K / g,
  N] scales of the [K, N] orientation reshaped (row-major), so a block's plane p reads its scales as row p.

Bytes: K N / 8 words x 4 B = K N / 2 B, the same as the uint8 layout's (N or K even); the scales are the same
values in another order. `to_natural` gives back the `w4` layout's arrays exactly (the tests check the round trip
and that dequantized values are identical), so every other path (`model.quant.dequantize`, XLA's product) reads a
leaf in this layout through it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["PLANES", "pack_words", "unpack_words", "plane_scales", "unplane_scales", "to_tpu", "to_natural"]

PLANES = 8
"""int4 values per 32-bit word."""


def pack_words(q_KN: jax.Array) -> jax.Array:
    """int values in [-8, 7] [K, N] (N a multiple of 8) -> int32 words [K, N / 8] (module docstring's order)."""
    k, n = q_KN.shape
    nib = (q_KN.astype(jnp.int32) & 15).reshape(k, PLANES, n // PLANES)
    words = nib[:, 0, :]
    for p in range(1, PLANES):
        words = words | (nib[:, p, :] << (4 * p))
    return words


def unpack_words(words: jax.Array) -> jax.Array:
    """int32 words [K, N / 8] -> int8 values [K, N] (`pack_words`' inverse): nibble p sign-extended by shifting it
    to the top bits and back (arithmetic shift)."""
    planes = [(words << (28 - 4 * p)) >> 28 for p in range(PLANES)]
    return jnp.concatenate(planes, axis=1).astype(jnp.int8)


def plane_scales(s_GN: jax.Array) -> jax.Array:
    """Scales [K / g, N] of the [K, N] orientation -> [K / g, 8, N / 8] (a row-major reshape)."""
    g, n = s_GN.shape
    return s_GN.reshape(g, PLANES, n // PLANES)


def unplane_scales(s_G8W: jax.Array) -> jax.Array:
    """[K / g, 8, N / 8] -> [K / g, N]."""
    return s_G8W.reshape(s_G8W.shape[0], -1)


def _unpack_bytes(packed: jax.Array, n: int) -> jax.Array:
    """uint8 [..., m] (two's complement nibbles, value 2j low) -> int8 [..., n]: the `w4` layout's unpacking."""
    lo = jax.lax.bitcast_convert_type(packed << jnp.uint8(4), jnp.int8) >> jnp.int8(4)
    hi = jax.lax.bitcast_convert_type(packed, jnp.int8) >> jnp.int8(4)
    return jnp.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])[..., :n]


def _pack_bytes(q: jax.Array) -> jax.Array:
    """int8 [..., n] in [-8, 7] -> uint8 [..., ceil(n / 2)] (the `w4` layout's packing)."""
    if q.shape[-1] % 2:
        q = jnp.pad(q, [(0, 0)] * (q.ndim - 1) + [(0, 1)])
    u = jax.lax.bitcast_convert_type(q.astype(jnp.int8), jnp.uint8) & jnp.uint8(0xF)
    pairs = u.reshape(*u.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << jnp.uint8(4))


@functools.partial(jax.jit, static_argnums=(2, 3))
def to_tpu(values: jax.Array, scales: jax.Array, shape: tuple[int, int], axis: int) -> tuple[jax.Array, jax.Array]:
    """The `w4` layout's (values uint8, scales) of a 2-D leaf of logical `shape` contracted along `axis` -> the TPU
    layout's (words int32 [K, N / 8], scales [K / g, 8, N / 8]). N must be a multiple of 8 (the fit check's
    `shape_problem_tpu`); raises ValueError otherwise. Compiled once per (shape, axis): `shape` a tuple."""
    q = _unpack_bytes(values, shape[-1])
    s = scales
    if axis == 1:
        q, s = q.T, s.T
    if q.shape[1] % PLANES:
        raise ValueError(f"TPU layout: N={q.shape[1]} of a {shape} leaf is not a multiple of {PLANES}")
    return pack_words(q), plane_scales(s)


@functools.partial(jax.jit, static_argnums=(2, 3))
def to_natural(words: jax.Array, scales: jax.Array, shape: tuple[int, int], axis: int) -> tuple[jax.Array, jax.Array]:
    """`to_tpu`'s inverse: the TPU layout's (words, scales) -> the `w4` layout's (values uint8, scales) of a leaf
    of logical `shape` contracted along `axis`."""
    q, s = unpack_words(words), unplane_scales(scales)
    if axis == 1:
        q, s = q.T, s.T
    return _pack_bytes(q), s
