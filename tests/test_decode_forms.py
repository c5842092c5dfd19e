"""The decode-shaped forms chosen for XLA:CPU compute the same function as the plain forms.

`model.layers.attend_one` (key-major scores) against `attend`, and `model.quant.matmul`'s weight-left form for a
dense output-major weight at 2-64 rows against the plain einsum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import quant
from model.layers import attend, attend_one


@pytest.mark.parametrize(("b", "k", "g", "s", "h"), [(1, 1, 8, 128, 256), (3, 2, 4, 40, 16), (4, 1, 2, 9, 8)])
def test_attend_one_equals_attend(b, k, g, s, h):
    rng = np.random.default_rng(b * 100 + s)
    q = jnp.asarray(rng.standard_normal((b, 1, k * g, h)), jnp.float32)
    kc = jnp.asarray(rng.standard_normal((b, k, s, h)), jnp.float32)
    vc = jnp.asarray(rng.standard_normal((b, k, s, h)), jnp.float32)
    mask_BS = jnp.asarray(rng.random((b, s)) < 0.7).at[:, 0].set(True)  # every row sees at least one slot
    want = attend(q, kc, vc, mask_BS[:, None, :])
    got = jax.jit(attend_one)(q, kc, vc, mask_BS)
    assert got.shape == want.shape == (b, 1, k * g, h)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)  # summation order: scores of size ~sqrt(H)


def _barriers(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("optimization_barrier")


@pytest.mark.parametrize("rows", [1, 2, 5, 64, 65])
def test_weight_left_form_equals_einsum(rows):
    rng = np.random.default_rng(rows)
    x_BTX = jnp.asarray(rng.standard_normal((rows, 1, 48)), jnp.float32)
    w_DX = jnp.asarray(rng.standard_normal((24, 48)), jnp.float32)  # output-major: the contraction X is minor
    got = quant.matmul(x_BTX, w_DX, "BTX,DX->BTD")
    want = jnp.einsum("BTX,DX->BTD", x_BTX, w_DX)
    assert got.shape == (rows, 1, 24)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    lo, hi = quant.BATCH_ROWS_WEIGHT_LEFT
    taken = _barriers(lambda x, w: quant.matmul(x, w, "BTX,DX->BTD"), x_BTX, w_DX) > 0
    assert taken == (lo <= rows <= hi and jax.default_backend() == "cpu")


def test_weight_left_form_leaves_input_major_weights_alone():
    x_BTD = jnp.ones((4, 1, 24), jnp.float32)
    w_DX = jnp.ones((24, 48), jnp.float32)  # input-major: the contraction D is the major axis
    assert _barriers(lambda x, w: quant.matmul(x, w, "BTD,DX->BTX"), x_BTD, w_DX) == 0
