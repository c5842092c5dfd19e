"""The decode-shaped product with a quantized 2-D weight on CPU: a multiply-and-sum that reads the packed integers
in place (jax.numpy: part of the pure-JAX engine on CPU; asked through `model.backends.quant_matmul`).

Key: R activation rows (batch x positions; a decode step has R = 1), K the contraction length, N the output
length, G scale groups along K, b values per group (K = G b), J = N / 2 or K / 2 packed bytes of int4 values.

Why not a dot on CPU: with x[1, K] and an int8 weight, XLA:CPU turns `dot(x, convert(q))` into a dot whose
operand is converted first, and that ran at 0.2-0.4 GB/s of stored int8 bytes on this project's 2-core machine
(48 weights of [256, 4096], jax 0.12), 7-14x slower than the float32 dot over the same weights stored float32. The
same product written as an elementwise multiply followed by a sum over K is one loop fusion that reads each int8
value once, converts it in registers and accumulates: 2-3 GB/s of stored bytes, i.e. as fast as or faster than
the float32 dot while reading a quarter of the bytes. int4 values are never interleaved back into one array (a
stack + reshape over the whole weight ran at 0.3 GB/s): the low and high nibbles meet the activations (or the
outputs) they belong to, split into even and odd positions. Those measurements come from a micro-benchmark run
beside other work (shared cores), so read them as ratios.

Scales multiply partial sums: per output channel after the sum over K (w8), per (group, channel) after the sum
over each group's b values (w4), in float32. The result is float32 [R, N].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["MATVEC_ROWS", "fits_reduce", "reduce_matmul"]

MATVEC_ROWS = 8
"""Most activation rows for which `model.backends.quant_matmul` uses the reduce form on CPU (a decode step has 1 per
sequence). With more rows the weight's conversion is shared by all of them and the dot form is the better one."""


def _nibbles(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """uint8 [..., J] -> (low, high) int8 [..., J]: each nibble sign-extended by an arithmetic shift."""
    lo = jax.lax.bitcast_convert_type(packed << jnp.uint8(4), jnp.int8) >> jnp.int8(4)
    hi = jax.lax.bitcast_convert_type(packed, jnp.int8) >> jnp.int8(4)
    return lo, hi


def fits_reduce(shape: tuple[int, ...], bits: int, block: tuple[int, ...], axis: int) -> bool:
    """Whether a weight of `shape` [2 axes], `bits` and scale `block` contracted along `axis` (0 or 1) takes the
    reduce form: its scale groups tile the contraction axis exactly, the other axis has one scale per index, and
    int4 pairs never straddle a group or run past the end (even lengths)."""
    if len(shape) != 2 or axis not in (0, 1):
        return False
    k, bk, bo = shape[axis], block[axis], block[1 - axis]
    if bo != 1 or k % bk:
        return False
    if bits == 4:
        return shape[1] % 2 == 0 and (axis == 0 or bk % 2 == 0)
    return bits == 8


def reduce_matmul(x_RK: jax.Array, values: jax.Array, scales: jax.Array, bits: int, block: tuple[int, ...],
                  axis: int) -> jax.Array:  # fmt: skip
    """x [R, K] times the quantized weight (`values`, `scales`, `bits`, `block` as in `model.quant.QuantArray`),
    contracted along the weight's `axis`: 0 for a [K, N] weight, 1 for [N, K]. Returns float32 [R, N].

    Each row is its own multiply-and-sum over the weight (R <= `MATVEC_ROWS`, so the weight is read R times;
    written per row because XLA:CPU's fused reduce ran 100x slower with a broadcast row axis in the operand).
    The caller checks `fits_reduce` first (a program error otherwise: AssertionError)."""
    shape = (values.shape[0], values.shape[1] * (2 if bits == 4 else 1))
    assert fits_reduce(shape, bits, block, axis), (shape, bits, block, axis)
    # The barrier materializes the (small) activations first: without it XLA fuses their producer (a norm, the
    # GeGLU's tanh) into the multiply-and-sum and recomputes it once per output channel.
    x_RK = jax.lax.optimization_barrier(x_RK.astype(jnp.float32))
    s = scales.astype(jnp.float32)  # [G, N] (axis 0) or [N, G] (axis 1)
    g = shape[axis] // block[axis]
    row = _row_axis0 if axis == 0 else _row_axis1
    return jnp.stack([row(x_K.reshape(g, -1), values, s, bits) for x_K in x_RK])


def _row_axis0(x_GB: jax.Array, values: jax.Array, s_GN: jax.Array, bits: int) -> jax.Array:
    """One row against a [K, N] weight (K = G B): [N]. int4 values are packed along N: the low nibbles are the
    even outputs, the high ones the odd outputs, interleaved only at the end ([N] values, not the weight)."""
    g, b = x_GB.shape
    if bits == 8 and g == 1:  # one scale per output channel: the plain 2-D form (see `_row_axis1`)
        return jnp.sum(x_GB[0][:, None] * values.astype(jnp.float32), axis=0) * s_GN[0]
    if bits == 8:
        q_GBN = values.reshape(g, b, -1).astype(jnp.float32)
        return _sum_groups(jnp.sum(x_GB[..., None] * q_GBN, axis=1), s_GN)
    lo, hi = (v.reshape(g, b, -1).astype(jnp.float32) for v in _nibbles(values))
    even = _sum_groups(jnp.sum(x_GB[..., None] * lo, axis=1), s_GN[:, 0::2])
    odd = _sum_groups(jnp.sum(x_GB[..., None] * hi, axis=1), s_GN[:, 1::2])
    return jnp.stack([even, odd], axis=-1).reshape(-1)


def _row_axis1(x_GB: jax.Array, values: jax.Array, s_NG: jax.Array, bits: int) -> jax.Array:
    """One row against an [N, K] weight (K = G B): [N]. int4 values are packed along K: the low nibbles meet the
    even positions of x, the high ones the odd positions."""
    g, b = x_GB.shape
    n = values.shape[0]
    if bits == 8 and g == 1:  # 2-D: XLA:CPU ran the [N, 1, K] form of this at 0.3 GB/s (4 ms for [256, 4096])
        return jnp.sum(values.astype(jnp.float32) * x_GB[0][None, :], axis=1) * s_NG[:, 0]
    if bits == 8:
        q_NGB = values.reshape(n, g, b).astype(jnp.float32)
        return _sum_groups(jnp.sum(q_NGB * x_GB[None], axis=2).T, s_NG.T)
    lo, hi = (v.reshape(n, g, b // 2).astype(jnp.float32) for v in _nibbles(values))
    part_NG = jnp.sum(lo * x_GB[None, :, 0::2], axis=2) + jnp.sum(hi * x_GB[None, :, 1::2], axis=2)
    return _sum_groups(part_NG.T, s_NG.T)


def _sum_groups(part_GN: jax.Array, s_GN: jax.Array) -> jax.Array:
    """Scaled partial sums [G, N] x scales [G, N], summed over the groups: [N] (one group: a plain scale)."""
    if part_GN.shape[0] == 1:
        return part_GN[0] * s_GN[0]
    return jnp.sum(part_GN * s_GN, axis=0)
