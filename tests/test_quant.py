"""Quantized arrays (model/quant.py): round trip within half a step, the row lookup, the matmul, jit, bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model.quant as quant
from model.quant import (
    QuantArray,
    dequantize,
    matmul,
    packed_bytes,
    quantize,
    quantize_channels,
    quantize_rows,
    take_rows,
    tree_bytes,
    with_words,
)
from model.quantspec import packed_value_bytes, value_dtype, value_shape

EPS32 = np.finfo(np.float32).eps


def _table(rows: int = 9, cols: int = 13) -> np.ndarray:
    """Random rows, then the special groups: all zero, constant, a negative extreme, tiny values (1e-8)."""
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    x[1] = 0.0
    x[2] = 0.75
    x[3, :] = np.linspace(-0.2, 0.1, cols)
    x[3, 5] = -3.0  # the group's extreme is negative: it must map to -qmax
    x[4] *= 1e-8
    return x


def _expanded_scales(q: QuantArray) -> np.ndarray:
    s = np.asarray(q.scales, np.float32)
    for i, (b, n) in enumerate(zip(q.block, q.shape, strict=True)):
        s = np.repeat(s, b, axis=i).take(np.arange(n), axis=i) if s.shape[i] > 1 else s
    return np.broadcast_to(s, q.shape)


@pytest.mark.parametrize("scale_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("bits,group", [(8, 4), (4, 4), (8, 13), (4, 13), (4, 5)])
def test_round_trip_within_half_a_step_of_every_group(bits, group, scale_dtype):
    x = _table()  # 13 columns: groups of 4 or 5 leave a short last group; 13 is the whole row
    q = quantize_rows(x, bits, group, scale_dtype=scale_dtype)
    assert q.scales.dtype == scale_dtype and q.scales.shape == (9, -(-13 // group)) and q.block == (1, group)
    back = np.asarray(dequantize(q, jnp.float32))
    s = _expanded_scales(q)
    assert np.all(np.abs(back - x) <= s / 2 + 4 * EPS32 * np.abs(x)), np.max(np.abs(back - x) - s / 2)
    assert np.isfinite(back).all()
    np.testing.assert_array_equal(back[1], 0.0)  # all-zero row: scale 0, values 0, no division by zero
    assert (np.asarray(q.scales[1], np.float32) == 0).all()
    qmax = {8: 127, 4: 7}[bits]
    exact = np.abs(x).reshape(9, -1) if group == 13 else None
    if exact is not None:  # the stored scale is max|x| / qmax rounded up, never down (to float32 rounding)
        assert (np.asarray(q.scales[:, 0], np.float32) >= exact.max(axis=1) / qmax * (1 - 2 * EPS32)).all()
    assert (np.asarray(q.scales[4], np.float32) > 0).all()  # tiny values: the scale rounds up, never to 0
    if scale_dtype == jnp.float32:  # exact scales: each non-zero group uses its extreme code, here -qmax
        assert back[3, 5] == pytest.approx(-3.0, rel=1e-6)


def test_int4_values_are_symmetric_and_packed_two_per_byte():
    x = _table()
    q = quantize_rows(x, 4, 13, scale_dtype=jnp.float32)
    assert q.values.dtype == jnp.uint8 and q.values.shape == (9, 7)  # 13 values -> 7 bytes (one pad nibble)
    ints = np.rint(np.asarray(dequantize(q, jnp.float32)) / _expanded_scales(q).clip(1e-30)).astype(int)
    assert ints.min() == -7 and ints.max() == 7  # [-7, 7]: -8 is never produced
    assert ints[3, 5] == -7
    q8 = quantize_rows(x, 8, 13, scale_dtype=jnp.float32)
    assert q8.values.dtype == jnp.int8 and q8.values.shape == (9, 13)
    assert int(jnp.min(q8.values)) == -127 and int(jnp.max(q8.values)) == 127


@pytest.mark.parametrize("bits", [8, 4])
def test_take_rows_equals_dequantize_then_take(bits):
    table = quantize_rows(_table(), bits, 4)
    ids = jnp.array([[0, 8, 3], [3, 3, 1]])
    got = take_rows(table, ids, jnp.float32)
    assert got.shape == (2, 3, 13)
    np.testing.assert_array_equal(got, jnp.take(dequantize(table, jnp.float32), ids, axis=0))
    dense = jnp.asarray(_table())
    np.testing.assert_array_equal(take_rows(dense, ids), jnp.take(dense, ids, axis=0))
    with pytest.raises(ValueError, match="one scale block per row"):
        take_rows(quantize_channels(_table(), bits, 0), ids)


# ---- uint32 word storage of a row-gathered table (model.quantspec.WORD_TABLES, issue 43) ----------------------------
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("cols", [1, 2, 3, 7, 8, 13, 16, 256])
def test_words_hold_the_same_values_bit_for_bit(bits, cols):
    x = np.random.default_rng(cols).standard_normal((9, cols)).astype(np.float32)
    x[1] = 0.0
    raw, words = quantize_rows(x, bits, 4), quantize_rows(x, bits, 4, words=True)
    assert not raw.words and words.words
    assert words.values.dtype == jnp.uint32 and raw.values.dtype == np.dtype(value_dtype(bits))
    row = cols if bits == 8 else -(-cols // 2)
    assert words.values.shape == value_shape(x.shape, bits, True) == (9, -(-row // 4))
    np.testing.assert_array_equal(words.scales, raw.scales)
    np.testing.assert_array_equal(dequantize(words, jnp.float32), dequantize(raw, jnp.float32))
    ids = jnp.array([[0, 8, 3], [1, 1, 5]])
    np.testing.assert_array_equal(take_rows(words, ids, jnp.float32), take_rows(raw, ids, jnp.float32))
    np.testing.assert_array_equal(jax.jit(take_rows)(words, ids), take_rows(raw, ids))  # bfloat16, traced
    # the word form holds the byte form's bytes, little-endian, then zero padding; and converts back exactly
    b = np.asarray(raw.values).view(np.uint8)
    padded = np.zeros((9, 4 * words.values.shape[1]), np.uint8)
    padded[:, : b.shape[1]] = b
    np.testing.assert_array_equal(np.asarray(words.values), padded.view("<u4").astype(np.uint32))
    assert with_words(raw, True).values.dtype == jnp.uint32
    np.testing.assert_array_equal(with_words(raw, True).values, words.values)
    np.testing.assert_array_equal(with_words(words, False).values, raw.values)
    assert with_words(raw, False) is raw
    # bytes as stored: the padding to a whole word counts, and only it
    pad = 9 * (4 * words.values.shape[1] - row)
    assert packed_bytes(words) == packed_bytes(raw) + pad
    assert packed_value_bytes(x.shape, bits, True) == packed_value_bytes(x.shape, bits) + pad


def test_every_byte_and_nibble_code_survives_the_words():
    """All 256 byte values (so every nibble code, -8 included, at both positions) through uint32 words: the
    unpacked int8 values equal the byte form's, at 8 and at 4 bits."""
    codes = np.arange(256, dtype=np.uint8).reshape(2, 128)
    for bits, n in ((8, 128), (4, 256)):
        raw = QuantArray(values=jnp.asarray(codes.view(np.int8) if bits == 8 else codes),
                         scales=jnp.ones((2, 1), jnp.float32), shape=(2, n), bits=bits, block=(1, n))  # fmt: skip
        words = with_words(raw, True)
        assert words.values.shape == (2, 32)
        want = codes.view(np.int8).astype(np.float32) if bits == 8 else np.stack(
            [(codes.astype(np.int8) << 4) >> 4, codes.astype(np.int8) >> 4], -1).reshape(2, 256)  # fmt: skip
        np.testing.assert_array_equal(dequantize(words, jnp.float32), want)
        np.testing.assert_array_equal(dequantize(raw, jnp.float32), want)


def _rand(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


QC, QR = quantize_channels, quantize_rows
MATMULS = [  # (name, spec, x shape, the quantized weight)
    ("w8 q-projection", "BTD,DNH->BTNH", (2, 3, 40), lambda: QC(_rand(40, 4, 6), 8, 0)),
    ("w4 q-projection, short last group", "BTD,DNH->BTNH", (2, 3, 40), lambda: QC(_rand(40, 4, 6), 4, 0, 16)),
    ("w8 o-projection", "BTNH,NHD->BTD", (2, 3, 4, 6), lambda: QC(_rand(4, 6, 10), 8, (0, 1))),
    ("w4 o-projection", "BTNH,NHD->BTD", (2, 3, 4, 6), lambda: QC(_rand(4, 6, 10), 4, (0, 1), 4)),
    ("w4 down, odd output", "BTF,FD->BTD", (1, 2, 24), lambda: QC(_rand(24, 9), 4, 0, 8)),
    ("int8 head", "BTD,VD->BTV", (2, 1, 12), lambda: QR(_rand(30, 12), 8, 12)),
    ("groups along the head's rows", "BTD,VD->BTV", (2, 1, 12), lambda: QR(_rand(30, 12), 4, 5)),
    ("groups along an output axis", "BD,DF->BF", (3, 8), lambda: quantize(_rand(8, 10), 8, (1, 4))),
]


@pytest.mark.parametrize("spec,x_shape,make", [m[1:] for m in MATMULS], ids=[m[0] for m in MATMULS])
def test_matmul_equals_the_dense_product_of_the_dequantized_weight(spec, x_shape, make):
    w = make()
    x = jnp.asarray(_rand(*x_shape, seed=2))
    want = jnp.einsum(spec, x, dequantize(w, jnp.float32))
    got = matmul(x, w, spec)
    assert got.dtype == x.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    dense = dequantize(w, jnp.float32)
    # A dense weight: the einsum itself, or on CPU at 2-64 rows of an output-major weight the weight-left form (the
    # same sums in another order: equal up to float32 rounding, tests/test_decode_forms.py).
    np.testing.assert_allclose(matmul(x, dense, spec), jnp.einsum(spec, x, dense), rtol=1e-6,
                               atol=1e-6 * float(jnp.max(jnp.abs(want))))  # fmt: skip


MORE_WORDS = [  # 2-D leaves the word form's plane product covers: contraction along the words or across them
    ("int8 head, 12 rows (the dot per plane)", "BTD,VD->BTV", (3, 4, 12), lambda: QR(_rand(30, 12), 8, 12)),
    ("int8 head, odd width", "BTD,VD->BTV", (2, 1, 13), lambda: QR(_rand(30, 13), 8, 13)),
    ("int4 rows, groups of 8 along the words", "BTD,VD->BTV", (2, 1, 20), lambda: QR(_rand(30, 20), 4, 8)),
    ("int8 rows, groups of 4 along the words", "BD,VD->BV", (1, 10), lambda: QR(_rand(7, 10), 8, 4)),
    ("w4 [K, N] along the outputs", "BK,KN->BN", (2, 24), lambda: QC(_rand(24, 9), 4, 0, 8)),
    ("w8 [K, N] along the outputs, 12 rows", "BK,KN->BN", (12, 24), lambda: QC(_rand(24, 11), 8, 0)),
]


@pytest.mark.parametrize("spec,x_shape,make", [m[1:] for m in MATMULS + MORE_WORDS],
                         ids=[m[0] for m in MATMULS + MORE_WORDS])  # fmt: skip
def test_matmul_reads_words_as_it_reads_bytes(spec, x_shape, make):
    """The same leaf stored in uint32 words (model.quantspec.WORD_TABLES). Off a TPU `matmul` reads the bytes the
    words hold (`_byte_view`) and runs the byte storage's forms: the same product bit for bit. On a TPU it takes
    the plane form (`_planes_form`, run here directly on CPU): the same values summed in another order."""
    w = make()
    x = jnp.asarray(_rand(*x_shape, seed=2))
    words = with_words(w, True)
    np.testing.assert_array_equal(matmul(x, words, spec), matmul(x, w, spec))
    jitted = jax.jit(lambda a, q: matmul(a, q, spec))  # one program each: compared like with like
    np.testing.assert_array_equal(jitted(x, words), jitted(x, w))
    np.testing.assert_array_equal(quant._byte_view(words).values, w.values)  # little-endian bytes of the words
    lhs, rest = spec.split(",")
    rhs, out = rest.split("->")
    planes = quant._planes_form(x, words, lhs, rhs, out)
    o = 1 if rhs[-1] in out else 0  # the output axis; the words run along axis 1
    covered = w.scales.shape[o] in (1, w.shape[o]) and (o == 1 or w.scales.shape[1] == 1 or w.block[1] % (32 // w.bits) == 0)
    if w.ndim == 2 and covered:  # scales per output (or one), groups along a packed contraction whole words
        want = jnp.einsum(spec, x, dequantize(w, jnp.float32))
        assert planes is not None and planes.dtype == x.dtype and planes.shape == want.shape
        np.testing.assert_allclose(planes, want, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(want))))
        bf16 = quant._planes_form(x.astype(jnp.bfloat16), words, lhs, rhs, out)  # the TPU's activation dtype
        np.testing.assert_allclose(bf16.astype(jnp.float32), want, rtol=0.02, atol=0.02 * float(jnp.max(jnp.abs(want))))
    else:
        assert planes is None  # another rank, or groups across words: matmul unpacks the values (the dot form)


def test_a_quantized_array_is_a_pytree_through_jit():
    q = quantize_channels(_rand(40, 4, 6), 4, 0, 16)
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert len(leaves) == 2  # values and scales; the layout is static
    same = jax.jit(lambda a: a)(q)
    assert isinstance(same, QuantArray) and (same.shape, same.bits, same.block) == (q.shape, q.bits, q.block)
    np.testing.assert_array_equal(same.values, q.values)
    np.testing.assert_array_equal(same.scales, q.scales)
    x = jnp.asarray(_rand(2, 3, 40, seed=3))
    np.testing.assert_allclose(jax.jit(lambda a, w: matmul(a, w, "BTD,DNH->BTNH"))(x, q),
                               matmul(x, q, "BTD,DNH->BTNH"), rtol=1e-6, atol=1e-6)  # fmt: skip
    np.testing.assert_array_equal(jax.jit(dequantize)(q), dequantize(q))
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.grouped_axes == (0,) and rebuilt.packed_axis == -1


def test_packed_bytes_are_exact():
    x = _table()  # [9, 13]
    assert packed_bytes(quantize_rows(x, 8, 4)) == 9 * 13 + 9 * 4 * 2
    assert packed_bytes(quantize_rows(x, 4, 4)) == 9 * 7 + 9 * 4 * 2  # ceil(13 / 2) bytes per row
    assert packed_bytes(quantize_rows(x, 4, 4, scale_dtype=jnp.float32)) == 9 * 7 + 9 * 4 * 4
    assert packed_bytes(jnp.zeros((3, 5), jnp.bfloat16)) == 30
    int4 = jnp.zeros((7,), jnp.int4)
    assert int4.nbytes == 7 and packed_bytes(int4) == 4  # nbytes counts a byte per int4 value
    assert packed_bytes(jax.ShapeDtypeStruct((262_144, 8960), jnp.bfloat16)) == 262_144 * 8960 * 2
    tree = {"a": quantize_rows(x, 4, 4), "b": jnp.zeros(10, jnp.float32), "c": None}
    assert tree_bytes(tree) == 9 * 7 + 9 * 4 * 2 + 40


def test_bad_layouts_are_program_errors():
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        quantize(_table(), 3, (1, 4))
    with pytest.raises(ValueError, match="does not fit"):
        quantize(_table(), 8, (1, 14))
