"""The TPU layout of a w4 projection: the same int4 values and scales as the `w4` layout (`model.quant`), stored so
the TPU kernel (`model.kernels.w4a16_tpu`) reads them in 32-bit tiles with no relayout. jax only, no Pallas.

The `w4` layout stores int4 values two per uint8 byte along the leaf's last axis, scales [ceil(shape[i] /
block[i])]. A uint8 array is tiled (32, 128) in TPU memory, while a gather or product wants (8, 128)(4, 1): XLA then
copies the whole array into the other tiling inside every program that reads it (measured on the lent v5e for row
gathers and the int8 head, issue 43's TPU notes), and a 32-bit container avoids that. So, on a TPU, each w4
projection the kernel multiplies is stored at load (`model.kernels.choice.with_tilings`, the one place) in this
layout, in the logical [K, N] orientation of its product (a leaf whose contraction axis is 1, [N, K], is
transposed):

- words: int32 [K / 8, N]. K splits into groups of g values (the w4 group, a multiple of 64), each group into g / 8
  word rows; value q[gi g + j g / 4 + 2 a + h, n] (j = 0..3, a < g / 8, h = 0..1) sits in word row gi g / 8 + a of
  column n, bits 4 (j + 4 h)..4 (j + 4 h) + 3, as the unsigned nibble q + 8 (offset binary, 0..15). So nibbles j and
  j + 4 of a word are 16 bits apart: one shift, one mask and one OR with 0x3F803F80 make them two bfloat16 numbers
  1 + (q + 8) / 16 in the two halves of one 32-bit lane, and `pltpu.bitcast` reads the [g / 8, N] lanes of plane j
  as [g / 4, N] bfloat16 values in K order j g / 4 + 2 a + h (the kernel, `model.kernels.w4a16_tpu`: 1.5 integer
  operations per weight and no conversion, where shifting each nibble out and converting it took about five).
  Outputs stay along the 128-wide lanes (N), natural.
- scales: [K / g, N], those of the [K, N] orientation (the leaf's own for [K, N]; transposed for [N, K]).

Bytes: K / 8 x N words x 4 B = K N / 2 B, the same as the uint8 layout's (N or K even); the scales are the same
array (transposed for a [N, K] leaf). `to_natural` gives back the `w4` layout's arrays exactly (the tests check the
round trip and that dequantized values are identical), so every other path (`model.quant.dequantize`, XLA's
product) reads a leaf in this layout through it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["PLANES", "PAIRS", "OFFSET", "pack_words", "unpack_words", "to_tpu", "to_natural"]

PLANES = 8
"""int4 values per 32-bit word."""

PAIRS = 4
"""bfloat16 pairs per word: nibbles j and j + 4 (`pack_words`)."""

OFFSET = 8
"""Each nibble holds q + OFFSET, so 0..15 for q in [-8, 7]."""


def _split(a: jax.Array, group: int) -> jax.Array:
    """[K, N] -> [K / g, 4, g / 8, 2, N]: axis 1 j, axis 2 a, axis 3 h of K index gi g + j g / 4 + 2 a + h."""
    k, n = a.shape
    return a.reshape(k // group, PAIRS, group // PLANES, 2, n)


def pack_words(q_KN: jax.Array, group: int) -> jax.Array:
    """int values in [-8, 7] [K, N] (K a multiple of `group`, `group` of 64) -> int32 words [K / 8, N] (module
    docstring's order). Raises ValueError for a group that is not a multiple of 64."""
    if group % (PLANES * 8):
        raise ValueError(f"TPU layout: group {group} is not a multiple of 64 (g / 8 word rows fill 8 sublanes)")
    k, n = q_KN.shape
    u = _split((q_KN.astype(jnp.int32) + OFFSET) & 15, group)
    words = None
    for j in range(PAIRS):
        for h in range(2):
            plane = u[:, j, :, h, :] << (4 * (j + PAIRS * h))
            words = plane if words is None else words | plane
    return words.reshape(k // PLANES, n)


def unpack_words(words: jax.Array, group: int) -> jax.Array:
    """int32 words [K / 8, N] -> int8 values [K, N] (`pack_words`' inverse)."""
    rows, n = words.shape
    w = words.reshape(rows * PLANES // group, group // PLANES, n)
    planes = [[((w >> (4 * (j + PAIRS * h))) & 15) - OFFSET for h in range(2)] for j in range(PAIRS)]
    q = jnp.stack([jnp.stack(hs, axis=2) for hs in planes], axis=1)  # [G, 4, g / 8, 2, N]
    return q.reshape(rows * PLANES, n).astype(jnp.int8)


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


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def to_tpu(values: jax.Array, scales: jax.Array, shape: tuple[int, int], axis: int,
           group: int) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """The `w4` layout's (values uint8, scales) of a 2-D leaf of logical `shape` contracted along `axis` in groups
    of `group` -> the TPU layout's (words int32 [K / 8, N], scales [K / g, N]). K must be a multiple of the group
    and the group of 8 (the fit check's `shape_problem_tpu`); raises ValueError otherwise. Compiled once per
    (shape, axis, group): `shape` a tuple."""
    q = _unpack_bytes(values, shape[-1])
    s = scales
    if axis == 1:
        q, s = q.T, s.T
    if group % (PLANES * 8) or q.shape[0] % group:
        raise ValueError(f"TPU layout: K={q.shape[0]} of a {shape} leaf is not a multiple of its group {group}, or "
                         f"the group is not a multiple of 64")  # fmt: skip
    return pack_words(q, group), s


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def to_natural(words: jax.Array, scales: jax.Array, shape: tuple[int, int], axis: int,
               group: int) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`to_tpu`'s inverse: the TPU layout's (words, scales) -> the `w4` layout's (values uint8, scales) of a leaf
    of logical `shape` contracted along `axis` in groups of `group`."""
    q, s = unpack_words(words, group), scales
    if axis == 1:
        q, s = q.T, s.T
    return _pack_bytes(q), s
