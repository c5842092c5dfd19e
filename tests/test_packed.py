"""model/packed.py: the parameters as programs receive them, one-dimensional leaves packed into one vector per dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.config import TINY
from model.packed import PackedParams, as_params, pack_params
from model.params import init_params
from model.quant import quantize_params
from model.quantspec import parse_quant


def _tree(dtype=np.float32):
    return jax.tree_util.tree_map(jnp.asarray, init_params(TINY, seed=3, dtype=dtype))


def _assert_same_tree(a, b):
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_packing_keeps_matrices_apart_and_gathers_every_vector():
    params = _tree()
    leaves = jax.tree_util.tree_leaves(params)
    packed = pack_params(params)
    vectors = [x for x in leaves if x.ndim <= 1]
    assert len(vectors) > len(TINY.layer_types)  # norms and layer scalars: several per layer
    # one vector per dtype (all float32 here) plus every matrix, which stays the same array (not copied)
    assert len(packed.vectors) == 1 and packed.vectors[0].size == sum(x.size for x in vectors)
    assert len(jax.tree_util.tree_leaves(packed)) == 1 + len(leaves) - len(vectors)
    assert all(m is x for m, x in zip(packed.others, [x for x in leaves if x.ndim > 1], strict=True))


@pytest.mark.parametrize("quant", ["", "w8,ple8,int8_lm_head", "w4"])
def test_unpacking_gives_back_the_same_tree_outside_and_inside_a_program(quant):
    params = _tree(np.float32)
    if quant:
        params = quantize_params(params, parse_quant(quant))
    packed = pack_params(params)
    _assert_same_tree(as_params(packed), params)
    _assert_same_tree(jax.jit(as_params)(packed), params)  # static slices of the vectors, inside a program
    assert as_params(params) is params  # a tree that is not packed passes through


def test_vectors_of_two_dtypes_pack_into_two_vectors():
    params = _tree(np.float32)
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16) if x.ndim == 1 and x.size == 1 else x, params)
    packed = pack_params(params)
    assert sorted(str(v.dtype) for v in packed.vectors) == ["bfloat16", "float32"]
    _assert_same_tree(as_params(packed), params)


def test_a_packed_tree_is_a_pytree_with_a_static_layout():
    packed = pack_params(_tree())
    leaves, treedef = jax.tree_util.tree_flatten(packed)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(again, PackedParams) and again.layout == packed.layout
    hash(packed.layout)  # jit keys its cache on it
