"""Quantized arrays as data: a pytree leaf of integer values, scales and layout, and the one matmul and row lookup
that dispatch on a leaf being dense or quantized (so the layers never branch on quantization).

Scheme: symmetric, per block. Each block of values (the layout's `block`, see `model.quantspec`) has one scale
s = max|x| / qmax, rounded UP to the scale dtype (so no value leaves the integer range after rounding the scale),
and each value is q = round(x / s) (to nearest, ties to even). qmax is 127 for int8 (range [-127, 127]) and 7 for
int4 (range [-7, 7]): the range is symmetric, so -max|x| maps to -qmax exactly as +max|x| maps to +qmax; the codes
-128 / -8 are never produced (using -8 would need an asymmetric scale or a zero point). A block of zeros gets scale
0 and values 0 (the division uses 1 there: nothing divides by zero). Hence |dequantize(q) - x| <= s / 2 for every
value (up to float32 rounding): half a quantization step of its block, the stored scale.

Storage: int8 values as int8 in the array's shape; int4 values two per uint8 byte along the LAST axis (value 2j in
the low nibble, 2j+1 in the high one, two's complement), so the packed axis is the minor, contiguous one; a last
axis of odd length gets a zero pad nibble. The tables of `model.quantspec.WORD_TABLES` (the PLE table everywhere,
the int8 head copy on a TPU) hold those same bytes four to a uint32 word (`QuantArray.words`; byte k of a row in
bits 8 (k mod 4) and up of word k // 4, a row padded with zero bytes to a whole word): XLA:TPU reads a 32-bit
array in its own tiling, where it copied a whole 8-bit table into another in every decode step (issue 43). A row
gather unpacks only the rows it read, with shifts on int32 (`_from_words`): the same int8 values. Scales are
16-bit by default (bfloat16: float32's range, so a small block's scale never underflows) or any float dtype
(`scale_dtype`). The published runs stored 16-bit scales:
their weight total, 6,155,450,950 bytes, is reproduced to the byte with 2-byte scales
(`model.accounting.weight_bytes`), and their dtype counts {float16: 541, uint8: 1, int8: 1} fit E2B's 539 dense
tensors plus two scale tensors, all float16 (an inference: the layout was not published); the byte count is the
same for bfloat16.

The matmul form (`matmul`): the integer values are converted to the activation dtype and multiplied in one product,
and the scales are applied AFTER the product, on its output channels (`einsum(x, convert(q)) * s`). Where the
scales vary along a contraction axis (w4 groups), that axis is kept in the product
(split into groups x values per group) and the scaled partial products are summed. On NVIDIA GPUs of compute
capability >= 8.0 XLA can fuse an int8/int4 -> 16-bit convert into the matrix product (the GEMM reads the narrow
operand) when the graph has this form: the convert feeding the dot directly, the per-channel scale a multiply on
the dot's output, and the packed dimension minor (here the last axis). Dequantizing first (`dot(x, convert(q) *
s)`) puts a multiply between the convert and the dot. Two caveats, to be settled by a profile, not assumed: the
int4 values are unpacked here with shifts on uint8 (not XLA's native s4 type, which `jnp.int4` would give), and
XLA:CPU may materialize the converted weight in every step.

A leaf stored in uint32 words (`QuantArray.words`) is multiplied on a TPU as a sum over its byte (or nibble)
planes (`_planes_form`), so no program holds the weight as one 8-bit array; on every other platform as the bytes
its words hold (`_byte_view`: a bitcast, the same memory), by the forms below, exactly as the byte storage was.

Three forms of the one product, chosen per leaf and call (layers never branch on them): the fused W4A16 Pallas
kernel (`model.kernels.w4a16`) for an int4 2-D leaf whose static `tiling` was set at load (the engine's
`--kernel` choice and fit check) and tiles its shape (`model.kernels.fit.fits_kernel`), with at most
`model.kernels.fit.KERNEL_MAX_ROWS` activation rows; on CPU the multiply-and-sum of the backend's reduce form
for a few rows (`model.backends.quant_matmul`); otherwise the dot form above. A dense weight's product may take a
form of the platform's backend too (`model.backends.dense_matmul`), else the einsum. The kernel's module (and
with it Pallas) is imported on the kernel's path only, the first time such a leaf is multiplied: a dense or
XLA-only engine never loads Pallas.

Bytes: `packed_bytes` counts the arrays as stored: values (already packed: 1 byte holds two int4 values) plus
scales, and a dense leaf of a sub-byte dtype (e.g. jnp.int4, whose `nbytes` counts one byte per value) at
ceil(size x bits / 8).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from model import backends
from model.kernels.fit import KERNEL_MAX_ROWS, Tiling, fits_kernel
from model.kernels.fit_tpu import MLP_MAX_ROWS, TpuTiling, fits_tpu, padded_k
from model.quantspec import (
    LM_HEAD,
    WORD_BYTES,
    QuantSpec,
    Shape,
    channels_block,
    leaf_layout,
    parse_quant,
    rows_block,
    scale_shape,
    value_dtype,
    value_shape,
)

__all__ = ["QuantArray", "QuantSpec", "parse_quant", "quantize", "quantize_rows", "quantize_channels", "dequantize",
           "matmul", "take_rows", "packed_bytes", "tree_bytes", "quantize_blocks", "quantize_fields",
           "quantize_params", "with_words", "int4_from_words", "grouped_axis", "fused_mlp"]  # fmt: skip

QMAX = {8: 127, 4: 7}
"""Largest integer magnitude per bit width (symmetric range [-qmax, qmax])."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantArray:
    """A quantized array: a jax pytree whose children are `values` and `scales` and whose layout is static.

    values: int8 [*shape] (bits 8), or uint8 [*shape[:-1], ceil(shape[-1] / 2)] (bits 4, two per byte along the
        last axis). scales: float [ceil(shape[i] / block[i]) per axis] (bfloat16 by default).
    shape: the logical (dequantized) shape; bits: 8 or 4; block: values per scale along each axis
        (`model.quantspec.QuantLayout`). The packed axis is always the last one (`packed_axis`).
    tiling: how `matmul` multiplies it: None for XLA's product, a `model.kernels.fit.Tiling` for the fused W4A16
        kernel (`model.kernels.w4a16`; set at load by `model.kernels.choice.with_tilings`). Static, like the
        layout. A tiling that does not tile the leaf's shape is never run: `matmul` takes XLA's product then.
        A `model.kernels.fit_tpu.TpuTiling` also says the leaf is stored in the TPU layout
        (`model.kernels.tpu_layout`: values int32 words [K / 8, N], scales [K / g, N], the same values and
        bytes), set at load on a TPU; `dequantize` and XLA's product read such a leaf through `_natural`.
    words: the value bytes above held in uint32 words instead, values uint32 [*shape[:-1], ceil(bytes per row /
        4)] (`model.quantspec.QuantLayout.words`, chosen by `leaf_layout` for `WORD_TABLES`). Static.
    """

    values: jax.Array
    scales: jax.Array
    shape: Shape
    bits: int
    block: Shape
    tiling: Tiling | None = None
    words: bool = False

    packed_axis = -1

    @property
    def ndim(self) -> int:
        """Number of logical axes."""
        return len(self.shape)

    @property
    def grouped_axes(self) -> tuple[int, ...]:
        """Axes along which several values share a scale (block > 1)."""
        return tuple(i for i, b in enumerate(self.block) if b > 1)


jax.tree_util.register_dataclass(QuantArray, data_fields=["values", "scales"],
                                 meta_fields=["shape", "bits", "block", "tiling", "words"])  # fmt: skip


# ---- int4 packing ----------------------------------------------------------------------------------------------
def _pack_int4(q: jax.Array) -> jax.Array:
    """int8 values in [-8, 7] [..., n] -> uint8 [..., ceil(n / 2)]: value 2j in the low nibble, 2j+1 in the high."""
    if q.shape[-1] % 2:
        q = jnp.pad(q, [(0, 0)] * (q.ndim - 1) + [(0, 1)])
    u = jax.lax.bitcast_convert_type(q, jnp.uint8) & jnp.uint8(0xF)
    pairs = u.reshape(*u.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << jnp.uint8(4))


def _unpack_int4(packed: jax.Array, n: int) -> jax.Array:
    """uint8 [..., m] -> int8 [..., n] (n <= 2m): each nibble sign-extended by an arithmetic shift."""
    lo = jax.lax.bitcast_convert_type(packed << jnp.uint8(4), jnp.int8) >> jnp.int8(4)
    hi = jax.lax.bitcast_convert_type(packed, jnp.int8) >> jnp.int8(4)
    both = jnp.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])
    return both[..., :n]


def _to_words(b: jax.Array) -> jax.Array:
    """int8 or uint8 bytes [..., m] -> uint32 words [..., ceil(m / 4)]: byte k in bits 8 (k mod 4) .. 8 (k mod 4)
    + 7 of word k // 4 (little-endian, by shifts: the same on every host), the row padded with zero bytes."""
    m = b.shape[-1]
    b = jax.lax.bitcast_convert_type(b, jnp.uint8) if b.dtype == jnp.int8 else b
    b = jnp.pad(b, [(0, 0)] * (b.ndim - 1) + [(0, -m % WORD_BYTES)]).astype(jnp.uint32)
    b = b.reshape(*b.shape[:-1], -1, WORD_BYTES) << (8 * jnp.arange(WORD_BYTES, dtype=jnp.uint32))
    return functools.reduce(jnp.bitwise_or, (b[..., k] for k in range(WORD_BYTES)))


def _word_planes(w: jax.Array, bits: int) -> list[jax.Array]:
    """uint32 words [..., W] of `_to_words` -> 32 / bits planes, int32 [..., W] each: plane k holds the values at
    positions (32 / bits) j + k of the row (byte 4j + k at 8 bits; at 4 bits the nibble in bits 4k .. 4k + 3 of
    word j, i.e. value 8j + k in `_pack_int4`'s order), each moved to the top of the int32 by a left shift and
    sign-extended by an arithmetic right shift. Elementwise: XLA fuses a plane into the op that reads it."""
    wi = jax.lax.bitcast_convert_type(w, jnp.int32)
    return [(wi << jnp.int32(32 - bits * (k + 1))) >> jnp.int32(32 - bits) for k in range(32 // bits)]


def _from_words(w: jax.Array, bits: int, n: int) -> jax.Array:
    """uint32 words [..., W] of `_to_words` -> the int8 values [..., n] (n <= W x 32 / bits) they hold, in row
    order: the planes of `_word_planes` interleaved. For a few gathered rows; a product reads the planes."""
    v = jnp.stack(_word_planes(w, bits), axis=-1)
    return v.reshape(*w.shape[:-1], -1)[..., :n].astype(jnp.int8)


def int4_from_words(w: jax.Array, n: int) -> jax.Array:
    """uint32 words [..., W] holding int4 values (`_to_words` of a `w4` leaf) -> int8 [..., n]: `_from_words` at 4
    bits, for `model.kernels.tpu_layout.to_tpu_experts`."""
    return _from_words(w, 4, n)


def with_words(q: QuantArray, words: bool) -> QuantArray:
    """`q` with its value bytes stored as uint32 words (`words` True) or as int8 / uint8 bytes (False): the same
    integer values and scales, so `dequantize` and every product give the same results bit for bit; a row's
    padding to a whole word is added or dropped. Returns `q` itself when it is stored that way already. For tests
    and probes comparing the two storages; the loaders store each table as `model.quantspec.leaf_layout` says."""
    if q.words == words:
        return q
    if words:
        values = _to_words(q.values)
    else:
        ints = _from_words(q.values, q.bits, q.shape[-1])
        values = ints if q.bits == 8 else _pack_int4(ints)
    return dataclasses.replace(q, values=values, words=words)


def _int_values(q: QuantArray) -> jax.Array:
    """The integer values of `q` as int8 in its logical shape (unpacked when 4-bit or held in words)."""
    if q.words:
        return _from_words(q.values, q.bits, q.shape[-1])
    return q.values if q.bits == 8 else _unpack_int4(q.values, q.shape[-1])


# ---- quantize / dequantize -------------------------------------------------------------------------------------
def _expand(s: jax.Array, block: Shape, shape: Shape) -> jax.Array:
    """Scales [ceil(n_i / b_i)] repeated to the values' shape: each scale over its block (a short last block cut)."""
    for i, (b, n) in enumerate(zip(block, shape, strict=True)):
        if s.shape[i] == 1:
            continue  # broadcasts
        s = jnp.repeat(s, b, axis=i)[(slice(None),) * i + (slice(0, n),)]
    return s


def _round_up(s: jax.Array, dtype) -> jax.Array:
    """float32 scales -> `dtype`, rounded up where the cast rounded down (so max|x| / s never exceeds qmax)."""
    r = s.astype(dtype)
    up = jnp.nextafter(r, jnp.asarray(jnp.inf, dtype))
    return jnp.where(r.astype(jnp.float32) < s, up, r)


def quantize(x, bits: int, block: Shape, *, scale_dtype=jnp.bfloat16, words: bool = False) -> QuantArray:
    """Quantize `x` (any float array or numpy array) to `bits` (8 or 4) with one scale per `block` of values.

    block: one entry per axis, 1 <= block[i] <= x.shape[i] (the last block along an axis may be short).
    The scale is max|x| / qmax of its block in float32, rounded up to `scale_dtype`; values round to nearest.
    words: store the value bytes in uint32 words (`QuantArray.words`; the same values, dequantized bit for bit).
    Raises ValueError for a bits value other than 8 or 4 or a block that does not fit the shape (program errors).
    """
    if bits not in QMAX:
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    x = jnp.asarray(x)
    shape, block = tuple(x.shape), tuple(int(b) for b in block)
    if len(block) != len(shape) or any(not 1 <= b <= max(n, 1) for b, n in zip(block, shape, strict=True)):
        raise ValueError(f"block {block} does not fit shape {shape}")
    values, scales = _quantize_arrays(x, bits, block, scale_dtype, words)
    return QuantArray(values=values, scales=scales, shape=shape, bits=bits, block=block, words=words)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _quantize_arrays(x: jax.Array, bits: int, block: Shape, scale_dtype, words: bool = False
                     ) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """(values, scales) of `quantize`, one compiled program per (shape, dtype, bits, block, scale dtype, words);
    computed in float32 (a caller quantizing a table far larger than memory allows quantizes it in blocks of
    rows)."""
    x = x.astype(jnp.float32)
    shape = tuple(x.shape)
    groups = scale_shape(shape, block)
    padded = jnp.pad(jnp.abs(x), [(0, g * b - n) for g, b, n in zip(groups, block, shape, strict=True)])
    blocked = padded.reshape([d for g, b in zip(groups, block, strict=True) for d in (g, b)])
    amax = jnp.max(blocked, axis=tuple(range(1, 2 * len(shape), 2)))
    scales = _round_up(amax / QMAX[bits], scale_dtype)
    s = _expand(scales.astype(jnp.float32), block, shape)
    q = jnp.clip(jnp.round(x / jnp.where(s == 0, 1.0, s)), -QMAX[bits], QMAX[bits]).astype(jnp.int8)
    values = q if bits == 8 else _pack_int4(q)
    return (_to_words(values) if words else values), scales


def quantize_blocks(blocks: Iterable[tuple[int, np.ndarray]], shape: Shape, bits: int, block: Shape, *,
                    scale_dtype=jnp.bfloat16, empty=np.empty, words: bool = False) -> QuantArray:  # fmt: skip
    """`quantize` of an array of `shape` given as blocks of rows, never whole: the same arithmetic
    (`_quantize_arrays` on each block), so the result equals `quantize` of the whole array bit for bit.

    blocks: (first row, x [r, *shape[1:]]) covering axis 0 in order; each first row and each r but the last's a
    multiple of block[0], so that no scale block spans two of them (a block may be reused by the caller once the
    next is drawn). The values (`model.quantspec.value_shape`: int8 [*shape], or uint8 [*shape[:-1], ceil(shape[-1]
    / 2)] at 4 bits, or with `words` uint32 words holding those bytes) and scales (`scale_dtype` [ceil(shape[i] /
    block[i])]) are preallocated host arrays from `empty(shape, dtype)` (e.g. an aligned allocator) and filled
    block by block: host memory is the result plus one block's float32 work.
    Returns a `QuantArray` with numpy values and scales. Raises ValueError for a bits value other than 8 or 4, a
    block that does not fit the shape, or blocks that are misaligned, out of order or do not cover axis 0.
    """
    shape, block = tuple(shape), tuple(int(b) for b in block)
    if bits not in QMAX:
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    if not shape or len(block) != len(shape) or any(not 1 <= b <= max(n, 1) for b, n in zip(block, shape, strict=True)):
        raise ValueError(f"block {block} does not fit shape {shape}")
    values = empty(value_shape(shape, bits, words), np.dtype(value_dtype(bits, words)))
    scales = empty(scale_shape(shape, block), scale_dtype)
    row = 0
    for r0, x in blocks:
        r = x.shape[0]
        if r0 != row or tuple(x.shape[1:]) != shape[1:] or (r % block[0] and r0 + r != shape[0]):
            raise ValueError(f"block of rows {r0}:{r0 + r} (shape {tuple(x.shape)}) does not continue rows 0:{row} "
                             f"of {shape} in whole scale blocks of {block[0]}")  # fmt: skip
        v, s = _quantize_arrays(jnp.asarray(x), bits, (min(block[0], r), *block[1:]), scale_dtype, words)
        values[r0 : r0 + r] = np.asarray(v)
        scales[r0 // block[0] : r0 // block[0] + s.shape[0]] = np.asarray(s)
        row = r0 + r
    if row != shape[0]:
        raise ValueError(f"blocks covered rows 0:{row} of {shape}")
    return QuantArray(values=values, scales=scales, shape=shape, bits=bits, block=block, words=words)


def quantize_rows(x, bits: int, group: int, *, scale_dtype=jnp.bfloat16, words: bool = False) -> QuantArray:
    """A table [..., n] with one scale per (row, `group` values along the last axis): the PLE table (group 256),
    the LM head copy (group = the whole row). A group longer than the row is the row. `words` as `quantize`."""
    return quantize(x, bits, rows_block(tuple(np.shape(x)), group), scale_dtype=scale_dtype, words=words)


def quantize_channels(w, bits: int, axis: int | tuple[int, ...], group: int | None = None, *,
                      scale_dtype=jnp.bfloat16) -> QuantArray:  # fmt: skip
    """A weight with contraction axes `axis`: group None (w8) gives one scale per output channel (every other
    axis); group g (w4) groups g values along the last contraction axis (`model.quantspec.channels_block`)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    shape = tuple(np.shape(w))
    axes = tuple(a % len(shape) for a in axes)
    return quantize(w, bits, channels_block(shape, axes, group), scale_dtype=scale_dtype)


def dequantize(q: QuantArray, dtype=None) -> jax.Array:
    """The float array [*q.shape] that `q` stands for: values x their block's scale, computed in float32 and cast
    to `dtype` (default: the scales' dtype). A leaf in the TPU layout is read through `_natural`."""
    q = _natural(q)
    out = _int_values(q).astype(jnp.float32) * _expand(q.scales.astype(jnp.float32), q.block, q.shape)
    return out.astype(dtype or q.scales.dtype)


# ---- the one matmul and the one row lookup -----------------------------------------------------------------------
def _split(a: jax.Array, letters: list[str], c: str, groups: int, block: int, g: str) -> tuple[jax.Array, list[str]]:
    """Axis `c` of `a` (letters name its axes) zero-padded to groups x block and split into (g, c)."""
    j = letters.index(c)
    a = jnp.pad(a, [(0, 0)] * j + [(0, groups * block - a.shape[j])] + [(0, 0)] * (a.ndim - j - 1))
    return a.reshape(a.shape[:j] + (groups, block) + a.shape[j + 1 :]), letters[:j] + [g, c] + letters[j + 1 :]


def matmul(x: jax.Array, w, spec: str) -> jax.Array:
    """`einsum(spec, x, w)` in the activation dtype, for a dense `w` (converted to x.dtype first, as
    `model.layers.dense`) or a `QuantArray` (its integer values converted, the scales applied after the product:
    see the module docstring for the form and why). spec: explicit letters, two operands, e.g. "BTD,DNH->BTNH".

    A contraction axis along which the scales vary is kept in the product: split into (groups, values per group)
    when the block is longer than 1 (w4), as is when every index has its own scale (a weight with several contraction axes);
    the scaled partial products are then summed. Zero padding of a short last group adds nothing.
    """
    lhs, rest = spec.replace(" ", "").split(",")
    rhs, out = rest.split("->")
    if isinstance(w, OutputMajor):  # the same product with the stored [N, K] array: the weight letters swapped
        return matmul(x, w.w_NK, f"{lhs},{rhs[::-1]}->{out}")
    if not isinstance(w, QuantArray):
        y = _backend_form(backends.dense_matmul, x, w, lhs, rhs, out)
        return jnp.einsum(spec, x, w.astype(x.dtype)) if y is None else y
    y = _kernel_form(x, w, lhs, rhs, out)
    if y is not None:
        return y
    w = _natural(w)  # a leaf in the TPU layout that the kernel did not take (not 2-D form): the w4 layout's arrays
    if w.words:  # uint32 words (model.quantspec.WORD_TABLES): their planes on a TPU, else the bytes they hold
        y = _planes_form(x, w, lhs, rhs, out) if jax.default_backend() == "tpu" else None
        if y is not None:
            return y
        w = _byte_view(w)
    y = _reduce_form(x, w, lhs, rhs, out)
    if y is not None:
        return y
    assert len(rhs) == w.ndim and "." not in spec, (spec, w.shape)
    free = (c for c in "abcdefghijklmnopqrstuvwxyz" if c not in spec)
    wv, s = _int_values(w).astype(x.dtype), w.scales.astype(x.dtype)
    x_l, w_l, s_shape, s_l, kept = list(lhs), list(rhs), [], [], []
    for i, (c, n, b, g) in enumerate(zip(rhs, w.shape, w.block, w.scales.shape, strict=True)):
        if g == 1:
            continue  # one scale along this axis: it broadcasts
        if c in out:  # an output axis: the scale follows it
            if b > 1:
                s = jnp.repeat(s, b, axis=i)[(slice(None),) * i + (slice(0, n),)]
            s_l.append(c)
        elif b == 1:  # every index its own scale: keep the axis, sum after scaling
            kept.append(c)
            s_l.append(c)
        else:  # groups of b values: split the axis, keep the group axis
            assert c in lhs, (spec, c)
            grp = next(free)
            x, x_l = _split(x, x_l, c, g, b, grp)
            wv, w_l = _split(wv, w_l, c, g, b, grp)
            kept.append(grp)
            s_l.append(grp)
        s_shape.append(s.shape[i])
    s = s.reshape(s_shape)
    prod = jnp.einsum(f"{''.join(x_l)},{''.join(w_l)}->{out}{''.join(kept)}", x, wv)
    return jnp.einsum(f"{out}{''.join(kept)},{''.join(s_l)}->{out}", prod, s)


@dataclasses.dataclass(frozen=True)
class OutputMajor:
    """A dense 2-D weight held transposed, for batched decode products on CPU: `w_NK` [N, K] (its contraction axis
    K minor) stands for the logical [K, N] weight of an input-major compute-layout leaf (q/k/v, gate/up, the PLE
    model projection), so `matmul` can take the weight-left form (`model.backends.cpu.forms.weight_left_form`) at
    2-64 rows. Made by `output_major` (a copy).

    Why (XLA:CPU, jax 0.12, 2-core AMD EPYC, float32, weights streamed from memory): a [256, 4096] weight times 16
    rows ran at 23 GFLOP/s input-major (1.48 ms) and 40 GFLOP/s output-major, weight-left (0.84 ms); at one row
    the input-major form is the faster one (`model.params.LayerParams`), so the engine keeps both."""

    w_NK: jax.Array

    @property
    def shape(self) -> tuple[int, int]:
        """The logical [K, N] shape."""
        return self.w_NK.shape[1], self.w_NK.shape[0]

    @property
    def dtype(self):
        return self.w_NK.dtype

    @property
    def nbytes(self) -> int:
        return int(self.w_NK.nbytes)


jax.tree_util.register_dataclass(OutputMajor, data_fields=["w_NK"], meta_fields=[])


def output_major(w):
    """`OutputMajor` of a dense 2-D jax array [K, N] (a transposed copy, [N, K] row-major); any other leaf (None, a
    `QuantArray`, another rank) is returned as it is."""
    if w is None or isinstance(w, QuantArray | OutputMajor) or getattr(w, "ndim", 0) != 2:
        return w
    return OutputMajor(jnp.array(jnp.transpose(w), copy=True))


def _backend_form(hook, x: jax.Array, w, lhs: str, rhs: str, out: str) -> jax.Array | None:
    """The product as `hook(x_RK, w, axis)` (a `model.backends` hook: [R, N] or None) computes it, in the spec's
    output axes and x.dtype; None where the platform's backend rewrites no product, the product is not a 2-D
    weight's (`_matrix_form`) or the hook declines."""
    if not backends.rewrites_products():
        return None
    form = _matrix_form(x, w, lhs, rhs, out)
    if form is None:
        return None
    x_RK, axis, free = form
    y_RN = hook(x_RK, w, axis)
    return None if y_RN is None else _unrows(y_RN, x, w, lhs, rhs, out, axis, free)


def _matrix_form(x: jax.Array, w, lhs: str, rhs: str, out: str) -> tuple[jax.Array, int, str] | None:
    """(x as [R, K], the weight's contraction axis, the free letters of x) when the product is a 2-D weight (a
    `QuantArray` or a dense array: only its shape is read) with one contracted and one output axis; else None."""
    if w.ndim != 2:
        return None
    contracted = [c for c in rhs if c not in out]
    if len(contracted) != 1 or contracted[0] not in lhs:
        return None
    c = contracted[0]
    axis = rhs.index(c)
    free = "".join(ch for ch in lhs if ch != c)
    rows = math.prod(x.shape[lhs.index(ch)] for ch in free)
    return jnp.einsum(f"{lhs}->{free}{c}", x).reshape(rows, w.shape[axis]), axis, free


def _unrows(y_RN: jax.Array, x: jax.Array, w, lhs: str, rhs: str, out: str, axis: int, free: str):
    """[R, N] back to the spec's output axes."""
    o = rhs[1 - axis]
    y = y_RN.reshape(tuple(x.shape[lhs.index(ch)] for ch in free) + (w.shape[1 - axis],)).astype(x.dtype)
    return jnp.einsum(f"{free}{o}->{out}", y)


def grouped_axis(q: QuantArray) -> int:
    """The axis a w4 leaf's groups run along (its block is the group there, 1 elsewhere but a leading expert axis):
    the contraction axis of its products. A 2-D leaf [K, N] or [N, K]: 0 or 1; an expert leaf [E, A, B]: 1 or 2."""
    lead = q.ndim - 2
    return lead if q.block[lead] > 1 else lead + 1


def _natural(q):
    """`q` in the `w4` layout: a leaf stored in the TPU layout (its tiling a `TpuTiling`, set at load by
    `model.kernels.choice.with_tilings`) converted back with `model.kernels.tpu_layout.to_natural` (the same
    values and scales, tiling None); an expert leaf [E, A, B] in the batched form likewise
    (`model.kernels.tpu_layout.to_natural_experts`); any other leaf as it is."""
    if not isinstance(q, QuantArray) or not isinstance(q.tiling, TpuTiling):
        return q
    from model.kernels.tpu_layout import to_natural, to_natural_experts

    axis = grouped_axis(q)
    convert = to_natural_experts if q.ndim == 3 else to_natural  # an expert leaf [E, A, B]: the batched form
    values, scales = convert(q.values, q.scales, tuple(q.shape), axis, q.block[axis])
    return dataclasses.replace(q, values=values, scales=scales, tiling=None)


def _kernel_form(x: jax.Array, w: QuantArray, lhs: str, rhs: str, out: str) -> jax.Array | None:
    """The product through a W4A16 Pallas kernel when `w` carries a tiling; else None.

    A `TpuTiling` (the leaf stored in the TPU layout, `model.kernels.tpu_layout`): the TPU kernel
    (`model.kernels.w4a16_tpu`) for any number of activation rows, when the product is the leaf's 2-D
    contraction and the tiling tiles it (`fits_tpu`). A GPU `Tiling`: the fused Triton kernel
    (`model.kernels.w4a16`) when `w` is int4 with groups along its contraction axis and one scale per output,
    the tiling tiles it (`fits_kernel`: else the kernel is never called), and there are at most
    `KERNEL_MAX_ROWS` activation rows. The kernel's module (Pallas) is imported here, past those checks. On CPU
    a kernel runs in interpret mode (tests set a tiling; the engine never does there)."""
    if w.tiling is None or w.bits != 4:
        return None
    form = _matrix_form(x, w, lhs, rhs, out)
    if form is None:
        return None
    x_RK, axis, free = form
    k, n, group = w.shape[axis], w.shape[1 - axis], w.block[axis]
    if isinstance(w.tiling, TpuTiling):
        kp = padded_k(k, group)  # the TPU layout's K, whole groups (`model.kernels.tpu_layout.to_tpu`)
        if w.block[1 - axis] != 1 or not fits_tpu(kp, n, group, w.tiling):  # contracted along its groups only
            return None
        from model.kernels.w4a16_tpu import w4a16_tpu_matmul  # Pallas: loaded on this path only

        x_RK = jnp.pad(x_RK, ((0, 0), (0, kp - k))) if kp != k else x_RK  # zeros meet the zero padding values
        resident = w.tiling.resident and x_RK.shape[0] <= w.tiling.bm  # the resident form: one row block
        y_RN = w4a16_tpu_matmul(x_RK, w.values, w.scales, k=kp, n=n, group=group, tiling=w.tiling,
                                interpret=jax.default_backend() == "cpu", resident=resident)  # fmt: skip
        return _unrows(y_RN, x, w, lhs, rhs, out, axis, free)
    if x_RK.shape[0] > KERNEL_MAX_ROWS or w.block[1 - axis] != 1 or not fits_kernel(k, n, group, w.tiling):
        return None
    from model.kernels.w4a16 import w4a16_matmul  # Pallas: loaded on this path only

    y_RN = w4a16_matmul(x_RK, w.values, w.scales, k=k, n=n, group=group, axis=axis, tiling=w.tiling,
                        interpret=jax.default_backend() == "cpu")  # fmt: skip
    return _unrows(y_RN, x, w, lhs, rhs, out, axis, free)


def fused_mlp(x: jax.Array, gate_up, down) -> jax.Array | None:
    """down(gelu_tanh(x gate) * (x up)) for x [..., D] in one kernel call (`model.kernels.w4_mlp_tpu`), when gate_up
    (w4 [D, 2F], gate columns first) carries a `TpuTiling` with `mlp` set (the "fused" policy,
    `model.kernels.fit_tpu.fuse_mlp`), down (w4 [D, F], contracted along F) is in the TPU layout too, their groups
    agree and x has at most `MLP_MAX_ROWS` rows; else None (the caller takes the two products). [..., D] in x's
    dtype. On CPU the kernel runs in interpret mode (tests set the tilings; the engine never does there)."""
    t = getattr(gate_up, "tiling", None)
    if not (isinstance(t, TpuTiling) and t.mlp and isinstance(down, QuantArray) and isinstance(down.tiling, TpuTiling)
            and gate_up.ndim == 2 and down.ndim == 2 and gate_up.bits == 4 and down.bits == 4):  # fmt: skip
        return None
    d, f = gate_up.shape[0], gate_up.shape[1] // 2
    rows = math.prod(x.shape[:-1])
    group = gate_up.block[0]
    if x.shape[-1] != d or tuple(down.shape) != (d, f) or down.block != (1, group) or not 1 <= rows <= MLP_MAX_ROWS:
        return None
    from model.kernels.w4_mlp_tpu import w4_mlp_tpu  # Pallas: loaded on this path only

    y = w4_mlp_tpu(x.reshape(rows, d), gate_up.values, gate_up.scales, down.values, down.scales, d=d, f=f,
                   group=group, bf=t.mlp, interpret=jax.default_backend() == "cpu")  # fmt: skip
    return y.reshape(x.shape)


def _planes_form(x: jax.Array, w: QuantArray, lhs: str, rhs: str, out: str) -> jax.Array | None:
    """The product with a 2-D `words` leaf (the int8 head, `model.quantspec.WORD_TABLES`) as a sum of one dot per
    plane (`_word_planes`), never unpacking the weight into one array: `matmul`'s form on a TPU. None for a leaf
    of another rank or a scale layout it does not cover (scales per output or one for all outputs; groups along
    a packed contraction axis a whole number of words long).

    Plane k meets the activations at positions (32 / bits) j + k when the words run along the contraction axis
    ([N, K]: the head), or gives the outputs (32 / bits) j + k when they run along the outputs ([K, N]: the [R, N]
    results interleaved at the end). Each dot converts its plane to the activation dtype and accumulates in
    float32; the scales multiply the float32 partial sums of each group, then the groups are summed.

    Why (TPU v5e, jax 0.10.2; the lead's probes, issue 43): an s8 [262144, 1536] head multiplied as one array was
    copied whole into another tiling in every call (1.39 ms, with a call floor of about 0.6 ms); the same values
    as s32 words multiplied as 4 planes: 1.185 ms and no copy (about 690 GB/s above the floor); unpacking the
    words into one int8 array first: 2.48 ms. The sums run in another order than one dot's: float32 results can
    differ from the byte form's in the last bits."""
    form = _matrix_form(x, w, lhs, rhs, out)
    if form is None:
        return None
    x_RK, axis, free = form
    per = 32 // w.bits
    k_len, n_len = w.shape[axis], w.shape[1 - axis]
    bk, g, words = w.block[axis], w.scales.shape[axis], w.values.shape[-1]
    if w.scales.shape[1 - axis] not in (1, n_len) or (axis == 1 and g > 1 and bk % per):
        return None
    planes = [p.astype(x.dtype) for p in _word_planes(w.values, w.bits)]
    s = w.scales.astype(jnp.float32)
    if axis == 1:  # [N, W] words along K: plane k meets x[:, per j + k]; groups of bk / per words
        x_RK = jnp.pad(x_RK, [(0, 0), (0, per * words - k_len)])
        span = words if g == 1 else bk // per
        xs = [jnp.pad(x_RK[:, k::per], [(0, 0), (0, g * span - words)]).reshape(-1, g, span) for k in range(per)]
        ps = [jnp.pad(p, [(0, 0), (0, g * span - words)]).reshape(n_len, g, span) for p in planes]
        part_RNG = sum(jnp.einsum("RGb,NGb->RNG", xk, p, preferred_element_type=jnp.float32)
                       for p, xk in zip(ps, xs, strict=True))  # fmt: skip
        y_RN = jnp.sum(part_RNG * s[None], axis=-1)
    else:  # [K, W] words along N: plane k gives outputs per j + k; groups of bk along K
        x_RGb = jnp.pad(x_RK, [(0, 0), (0, g * bk - k_len)]).reshape(-1, g, bk)
        ps = [jnp.pad(p, [(0, g * bk - k_len), (0, 0)]).reshape(g, bk, words) for p in planes]
        parts = [jnp.einsum("RGb,GbW->RGW", x_RGb, p, preferred_element_type=jnp.float32) for p in ps]
        part_RGN = jnp.stack(parts, axis=-1).reshape(x_RK.shape[0], g, per * words)[..., :n_len]
        y_RN = jnp.sum(part_RGN * s[None], axis=1)
    return _unrows(y_RN, x, w, lhs, rhs, out, axis, free)


def _byte_view(q: QuantArray) -> QuantArray:
    """A `words` leaf read as the bytes its words hold (int8 [*shape] at 8 bits, uint8 [..., ceil(n / 2)] at 4; a
    row's padding cut): `lax.bitcast_convert_type` of each word into its 4 bytes, little-endian as `_to_words`
    stores them (the tests check it on CPU), then a reshape. Where arrays are row-major (CPU, GPU) that is a view
    of the same memory, so every product form for the byte storage runs as before on the same values, bit for
    bit. XLA:TPU lays the result out anew (the lead's probe: 2.48 ms for the head), hence `_planes_form` there."""
    b = jax.lax.bitcast_convert_type(q.values, jnp.uint8)
    b = b.reshape(*q.values.shape[:-1], -1)[..., : value_shape(q.shape, q.bits)[-1]]
    return dataclasses.replace(q, values=jax.lax.bitcast_convert_type(b, jnp.int8) if q.bits == 8 else b, words=False)


def _reduce_form(x: jax.Array, w: QuantArray, lhs: str, rhs: str, out: str) -> jax.Array | None:
    """The product in the backend's multiply-and-sum form when it applies (`model.backends.quant_matmul`: on CPU, a
    2-D weight with one contracted and one output axis, a few activation rows); else None (the caller takes the dot
    form). GPUs keep the dot form: that is the form XLA fuses into the GEMM."""
    return _backend_form(backends.quant_matmul, x, w, lhs, rhs, out)


def take_rows(table, ids: jax.Array, dtype=None) -> jax.Array:
    """Rows `ids` (int [...]) of a table [R, n]: `jnp.take(table, ids, axis=0)` for a dense table (in its own
    dtype; `dtype` applies to quantized tables only, so the dense path is unchanged); for a
    `QuantArray` with one scale block per row, only the rows read are gathered (values and scales) and only those
    are unpacked and scaled, in float32, then cast to `dtype` (default: the scales' dtype). Returns [..., n].
    The gather reads the values as stored: a `words` table (the PLE table, `model.quantspec.WORD_TABLES`) is
    gathered as uint32 rows, which XLA:TPU reads in place (an 8-bit table it first relaid whole: issue 43).
    Raises ValueError for a quantized table whose scale blocks span rows (a program error)."""
    if not isinstance(table, QuantArray):
        return jnp.take(table, ids, axis=0)
    if table.ndim != 2 or table.block[0] != 1:
        raise ValueError(f"take_rows needs a [R, n] table with one scale block per row, got block {table.block}")
    ids = jnp.asarray(ids)
    rows = QuantArray(values=jnp.take(table.values, ids, axis=0), scales=jnp.take(table.scales, ids, axis=0),
                      shape=tuple(ids.shape) + table.shape[1:], bits=table.bits,
                      block=(1,) * ids.ndim + table.block[1:], words=table.words)  # fmt: skip
    return dequantize(rows, dtype)


# ---- bytes -------------------------------------------------------------------------------------------------------
def _bits(dtype) -> int:
    """Bits per element of a dtype (4 for jnp.int4, whose numpy itemsize says 1)."""
    dt = np.dtype(dtype)
    for info in (jnp.iinfo, jnp.finfo):
        try:
            return int(info(dt).bits)
        except (ValueError, TypeError):
            pass
    return 8 * dt.itemsize


def packed_bytes(leaf) -> int:
    """Bytes of one leaf as stored (real arrays or `jax.ShapeDtypeStruct`s; None counts 0).

    A `QuantArray`: its values array (int8, or uint8 already holding two int4 values per byte, or uint32 words
    holding those bytes, a row's padding to a whole word included) plus its scales.
    A dense array: ceil(size x bits / 8), so a sub-byte dtype (jnp.int4) counts packed end to end, not at the one
    byte per value its `nbytes` reports.
    """
    if leaf is None:
        return 0
    if isinstance(leaf, QuantArray):
        return packed_bytes(leaf.values) + packed_bytes(leaf.scales)
    return -(-math.prod(leaf.shape) * _bits(leaf.dtype) // 8)


def tree_bytes(tree) -> int:
    """The sum of `packed_bytes` over a pytree's leaves, a `QuantArray` counted as one leaf: the weight-bytes
    gauge of a parameter tree (dense and quantized leaves)."""
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, QuantArray))
    return sum(packed_bytes(leaf) for leaf in leaves)


# ---- a whole parameter tree ----------------------------------------------------------------------------------------
def quantize_fields(node, spec: QuantSpec, *, scale_dtype=jnp.bfloat16, platform: str | None = None):
    """`node` (a `model.params.Params` or `LayerParams`) with each field that `leaf_layout` quantizes under `spec`
    replaced by its `quantize`d `QuantArray`, stored as `leaf_layout` says for `platform` (a jax backend name;
    None: `jax.default_backend()`, where the engine places its parameters); the other fields, `layers` and
    `lm_head_VD` as they are. A field that is already a `QuantArray` (quantized while it streamed) is kept.
    Returns the new node."""
    platform = platform or jax.default_backend()

    def leaf(field: str, x):
        if x is None or isinstance(x, QuantArray):
            return x
        layout = leaf_layout(field, tuple(x.shape), spec, platform)
        if layout is None:
            return x
        return quantize(x, layout.bits, layout.block, scale_dtype=scale_dtype, words=layout.words)

    skip = ("layers", LM_HEAD)
    changed = {f.name: leaf(f.name, getattr(node, f.name)) for f in dataclasses.fields(node) if f.name not in skip}
    return dataclasses.replace(node, **changed)


def quantize_params(params, spec: QuantSpec, *, scale_dtype=jnp.bfloat16, platform: str | None = None):
    """Quantize an in-memory `model.params.Params` tree as `spec` says (`model.quantspec.leaf_layout`, the same
    rule the byte accounting uses): those leaves become `QuantArray`s, and with `int8_lm_head` the tree gains
    `lm_head_VD`, an int8 copy of the tied `embed_VD` (which itself stays dense for the input lookup). Returns the
    new tree, each table stored as `leaf_layout` says for `platform` (None: `jax.default_backend()`; e.g. "tpu"
    gives the TPU's storage on a CPU, for tests). Works under `jax.eval_shape` on an abstract tree (full E2B size
    without memory). A checkpoint is quantized while it streams by `model.checkpoint.load_params(quant=...)`,
    with the same layouts and results."""
    platform = platform or jax.default_backend()
    kw = {"scale_dtype": scale_dtype, "platform": platform}
    layers = tuple(quantize_fields(lp, spec, **kw) for lp in params.layers)
    head = None
    if spec.int8_lm_head:
        layout = leaf_layout(LM_HEAD, tuple(params.embed_VD.shape), spec, platform)
        head = quantize(params.embed_VD, layout.bits, layout.block, scale_dtype=scale_dtype, words=layout.words)
    return dataclasses.replace(quantize_fields(params, spec, **kw), layers=layers, lm_head_VD=head)
