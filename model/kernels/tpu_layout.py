"""The TPU layout of a w4 projection: the same int4 values and scales as the `w4` layout (`model.quant`), stored so
the TPU kernel (`model.kernels.w4a16_tpu`) reads them in 32-bit tiles with no relayout. jax only, no Pallas.

The `w4` layout stores int4 values two per uint8 byte along the leaf's last axis, scales [ceil(shape[i] /
block[i])]. A uint8 array is tiled (32, 128) in TPU memory, while a gather or product wants (8, 128)(4, 1): XLA then
copies the whole array into the other tiling inside every program that reads it (measured on the lent v5e for row
gathers and the int8 head, issue 43's TPU notes), and a 32-bit container avoids that. So, on a TPU, each w4
projection the kernel multiplies is stored at load (`model.kernels.choice.with_tilings`, the one place) in this
layout, in the logical [K, N] orientation of its product (a leaf whose contraction axis is 1, [N, K], is
transposed):

- words: int32 [K / 8, N]. K splits into groups of g values (the w4 group, a multiple of 8); a group is r = g / 8
  word rows. Word row gi r + i (i < r) of column n holds, in bits 4p..4p+3 with p = j + 4h (j < 4, h < 2), value
  q[gi g + 2 r j + 2 i + h, n] + 8 (offset binary: 0..15 for q in [-8, 7]). Nibbles j and j + 4 of a word are 16
  bits apart, so one shift, one mask and one OR with 0x3F803F80 make them two bfloat16 numbers 1 + (q + 8) / 16 in
  the two halves of one 32-bit lane, which `pltpu.bitcast` reads as rows 2i and 2i + 1 of a bfloat16 [2r, N]
  array: the group's values 2 r j .. 2 r (j + 1) - 1 in their natural order along K. The 4 planes stacked in j
  order are the group's [g, N] values in natural order, so the kernel (`model.kernels.w4a16_tpu`) takes the
  activations as they are (1.5 integer operations per weight, no conversion, no relayout of the activations: a
  permutation of them in each call cost about 1.05 ms of a 3.75 ms `w4` decode step on the lent v5e,
  runs/2026-12-07-tpu-quant-w4-profile-tpuv5e). Outputs stay along the 128-wide lanes (N), natural.
- scales: [K / g, N], those of the [K, N] orientation (the leaf's own for [K, N]; transposed for [N, K]).

Bytes: K / 8 x N words x 4 B = K N / 2 B, the same as the uint8 layout's (N or K even); the scales are the same
array (transposed for a [N, K] leaf). `to_natural` gives back the `w4` layout's arrays exactly (the tests check the
round trip and that dequantized values are identical), so every other path (`model.quant.dequantize`, XLA's
product) reads a leaf in this layout through it.

Expert leaves (`model.quantspec.EXPERT_PROJECTIONS`, [E, D, 2I] contracted along D, [E, D, I] along I) take the
batched form (`to_tpu_experts`, `to_natural_experts`): each expert's [K, N] in the layout above, stacked, words
int32 [E, Kp / 8, N] and scales [E, Kp / g, N], where Kp is K rounded up to a whole group (`padded_k`): the w4
layout gives a K that the group does not divide a short last group with its own scale (26B-A4B's down projection:
K = I = 704 = 5.5 groups of 128), and the batched form fills that group up with zero values (nibble 8), so the
expert kernel (`model.kernels.w4a16_tpu.w4a16_tpu_expert_matmul`, activations padded with zeros to Kp) adds
exactly nothing for them. Bytes: E Kp N / 2 + the scales, so a padded K stores (Kp - K) / K more value bytes (64 /
704 = 9.1% of 26B-A4B's down weights, about 3% of its expert bytes). Converted one expert at a time
(`jax.lax.map`): the int32 intermediates of one [K, N], not of the whole leaf.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from model.kernels.fit_tpu import padded_k

__all__ = ["PLANES", "PAIRS", "OFFSET", "pack_words", "unpack_words", "to_tpu", "to_natural", "padded_k",
           "to_tpu_experts", "to_natural_experts"]  # fmt: skip

PLANES = 8
"""int4 values per 32-bit word."""

PAIRS = 4
"""bfloat16 pairs per word: nibbles j and j + 4 (the kernel's unpacking)."""

OFFSET = 8
"""Each nibble holds q + OFFSET, so 0..15 for q in [-8, 7]."""


def _first(p: int, group: int) -> int:
    """Nibble p of a group's word rows holds the group's values first, first + 2, ..., g / 4 of them: p = j + 4h
    holds values 2 r j + h + 2 i, i < r = g / 8 (module docstring)."""
    return 2 * (group // PLANES) * (p % PAIRS) + p // PAIRS


def pack_words(q_KN: jax.Array, group: int) -> jax.Array:
    """int values in [-8, 7] [K, N] (K a multiple of `group`, `group` of 8) -> int32 words [K / 8, N] (module
    docstring's order). Each nibble's values are one strided slice of the [K / g, g, N] values (no array with a
    dimension of 2 or 4 before the lanes, which TPU tiling would pad)."""
    k, n = q_KN.shape
    r = group // PLANES
    nib = ((q_KN.astype(jnp.int32) + OFFSET) & 15).reshape(k // group, group, n)
    words = None
    for p in range(PLANES):
        first = _first(p, group)
        part = nib[:, first : first + 2 * r : 2] << (4 * p)  # [K / g, r, N], a strided slice
        words = part if words is None else words | part
    return words.reshape(k // PLANES, n)


def unpack_words(words: jax.Array, group: int) -> jax.Array:
    """int32 words [K / 8, N] -> int8 values [K, N] (`pack_words`' inverse): nibble p masked out, less the offset,
    put back at its K indices."""
    rows, n = words.shape
    r = group // PLANES
    w = words.reshape(rows // r, r, n)
    values = [((w >> (4 * p)) & 15) - OFFSET for p in range(PLANES)]  # [G, r, N] each
    planes = [jnp.stack([values[j], values[j + PAIRS]], axis=2).reshape(rows // r, 2 * r, n) for j in range(PAIRS)]
    return jnp.concatenate(planes, axis=1).reshape(rows * PLANES, n).astype(jnp.int8)


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
    of `group` -> the TPU layout's (words int32 [Kp / 8, N], scales [Kp / g, N]), Kp = `padded_k`: a K that the
    group does not divide (26B-A4B's MLP down projection, K = 2112 = 16.5 groups of 128) has its short last group
    filled up with zero values, as the experts' batched form does (the leaf's scales already count ceil(K / g)
    groups; the kernel pads the activations with zeros to Kp). Raises ValueError for a group that is not a
    multiple of 8. Compiled once per (shape, axis, group): `shape` a tuple."""
    if group % PLANES:
        raise ValueError(f"TPU layout: the group {group} of a {shape} leaf is not a multiple of {PLANES}")
    return _words_kn(_unpack_bytes(values, shape[-1]), scales, axis == 1, group)


def _words_kn(q: jax.Array, s: jax.Array, transposed: bool, group: int) -> tuple[jax.Array, jax.Array]:
    """One [K, N] product's int values q and scales s (both [N, ...] when `transposed`: a leaf contracted along its
    last axis) -> (words int32 [Kp / 8, N], scales [Kp / g, N]): K padded with zero values to `padded_k`, packed
    (`pack_words`). The step `to_tpu` and `to_tpu_experts` (per expert) share."""
    if transposed:
        q, s = q.T, s.T
    k = q.shape[0]
    kp = padded_k(k, group)
    return pack_words(jnp.pad(q, ((0, kp - k), (0, 0))) if kp != k else q, group), s


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def to_natural(words: jax.Array, scales: jax.Array, shape: tuple[int, int], axis: int,
               group: int) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`to_tpu`'s inverse: the TPU layout's (words, scales) -> the `w4` layout's (values uint8, scales) of a leaf
    of logical `shape` contracted along `axis` in groups of `group` (the padding values dropped)."""
    q, s = unpack_words(words, group)[: shape[axis]], scales
    if axis == 1:
        q, s = q.T, s.T
    return _pack_bytes(q), s


def _contraction(shape: tuple[int, int, int], axis: int) -> tuple[int, int]:
    """(K, N) of one expert of an [E, A, B] leaf contracted along `axis` (1 or 2); ValueError for another axis."""
    if axis not in (1, 2) or len(shape) != 3:
        raise ValueError(f"TPU layout of experts: a {shape} leaf contracted along axis {axis}; expected [E, A, B] "
                         "contracted along axis 1 or 2")  # fmt: skip
    return shape[axis], shape[3 - axis]


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def to_tpu_experts(values: jax.Array, scales: jax.Array, shape: tuple[int, int, int], axis: int, group: int,
                   from_words=None) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """The `w4` layout's (values uint8 [E, A, ceil(B / 2)], scales) of an expert leaf of logical `shape` [E, A, B]
    contracted along `axis` (1: [E, K, N]; 2: [E, N, K]) in groups of `group` -> the batched TPU layout (module
    docstring): words int32 [E, Kp / 8, N], scales [E, Kp / g, N] (Kp = `padded_k`; the leaf's scales already
    count ceil(K / g) groups). `from_words`: None for value bytes, else the values are those bytes held in uint32
    words (`model.quant.QuantArray.words`, a TPU's storage of experts) and `from_words(words [A, W], n)` gives one
    expert's int4 values [A, n] (`model.quant.int4_from_words`, passed in by the caller so that this module never
    imports `model.quant`, which imports it); a module-level function, so one compile serves every leaf. Raises
    ValueError for a group that is not a multiple of 8 or another axis."""
    _contraction(shape, axis)
    if group % PLANES:
        raise ValueError(f"TPU layout of experts: group {group} of a {shape} leaf is not a multiple of {PLANES}")

    def one(arrays):
        v, s = arrays
        q = from_words(v, shape[-1]) if from_words is not None else _unpack_bytes(v, shape[-1])
        return _words_kn(q, s, axis == 2, group)

    return jax.lax.map(one, (values, scales))


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def to_natural_experts(words: jax.Array, scales: jax.Array, shape: tuple[int, int, int], axis: int,
                       group: int) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`to_tpu_experts`' inverse: the batched TPU layout's (words, scales) -> the `w4` layout's (values uint8,
    scales) of an expert leaf of logical `shape` [E, A, B] contracted along `axis` in groups of `group` (the
    padding values dropped). Works on any number of experts along axis 0 (one expert's slice [1, ...] too)."""
    k, _ = _contraction(shape, axis)

    def one(arrays):
        q, s = unpack_words(arrays[0], group)[:k], arrays[1]
        if axis == 2:
            q, s = q.T, s.T
        return _pack_bytes(q), s

    return jax.lax.map(one, (words, scales))
