"""The decode-shaped quantized product (model/backends/cpu/qreduce.py) equals the product with the dequantized
weight, and model.quant.matmul takes it exactly where it applies (a few rows on CPU, with the default backend) and
the dot form elsewhere."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from model.backends.cpu.qreduce import MATVEC_ROWS, fits_reduce
from model.quant import dequantize, matmul, quantize_channels

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("bits,group", [(8, None), (4, 128), (4, 32)])
@pytest.mark.parametrize("spec,shape,axis", [("BTD,DX->BTX", (256, 384), 0), ("BTX,DX->BTD", (192, 256), 1)])
@pytest.mark.parametrize("rows", [1, 3, MATVEC_ROWS, MATVEC_ROWS + 1])
def test_quantized_product_equals_the_dequantized_product(bits, group, spec, shape, axis, rows):
    w = RNG.standard_normal(shape).astype(np.float32)
    q = quantize_channels(w, bits, axis, group)
    x = jnp.asarray(RNG.standard_normal((1, rows, shape[axis])).astype(np.float32))
    got = matmul(x, q, spec)
    want = jnp.einsum(spec, x, dequantize(q, jnp.float32))
    # Same products, another summation order: float32 rounding of sums of ~K terms of size ~|x||q s|.
    scale = float(jnp.einsum(spec, jnp.abs(x), jnp.abs(dequantize(q, jnp.float32))).max())
    assert got.shape == want.shape and got.dtype == x.dtype
    assert float(jnp.abs(got - want).max()) <= 1e-5 * scale


def test_layouts_that_do_not_tile_take_the_dot_form():
    assert fits_reduce((256, 384), 8, (256, 1), 0) and fits_reduce((384, 256), 4, (1, 128), 1)
    assert not fits_reduce((250, 384), 4, (128, 1), 0)  # groups do not tile K
    assert not fits_reduce((256, 385), 4, (128, 1), 0)  # an odd packed axis
    assert not fits_reduce((384, 256), 8, (2, 256), 1)  # output channels sharing a scale
    assert not fits_reduce((4, 4, 4), 8, (4, 1, 1), 0)  # not 2-D
    w = RNG.standard_normal((250, 64)).astype(np.float32)
    q = quantize_channels(w, 4, 0, 128)  # one short group: the dot form, same result
    x = jnp.asarray(RNG.standard_normal((1, 1, 250)).astype(np.float32))
    np.testing.assert_allclose(matmul(x, q, "BTD,DX->BTX"), jnp.einsum("BTD,DX->BTX", x, dequantize(q, jnp.float32)),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
