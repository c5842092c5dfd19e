"""The parameters as the engine's jitted programs receive them: fewer arguments per call.

Every argument buffer of a jitted call costs host time at every call, before the device starts, and a decode step
is one call per generated token in the host loop, so fewer buffers are less host overhead per token (docs/method.md,
"Decode loops and host overhead"). Packing the one-dimensional leaves cut a decode step's call by 24-33% on the
2-core Xeon and sped up the TPU v5e's host loop by 28-33%; the measurements:
reports/2026-12-06-filing-build-dispatch-ahead/notes.md, "Why model/packed.py".

`pack_params` concatenates the one-dimensional leaves once, outside any program; inside a program,
`as_params(packed)` gives back the same `model.params.Params` tree, each packed leaf a static slice of its vector
(XLA fuses the slice into the ops that read it: no copy). Matrices stay separate leaves: a kernel (a custom call,
e.g. `model.backends.cpu.kernels`) needs each weight as a buffer of its own, and a slice of a larger one would be
copied.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp


@jax.tree_util.register_pytree_node_class
class PackedParams:
    """A parameter tree with its one-dimensional leaves packed: `vectors` (one 1-D array per dtype, in the order
    of `layout`'s dtypes), `others` (every other leaf, in tree order) and `layout` (static: the tree structure and,
    per leaf, its vector, offset and shape, or None for a leaf kept in `others`). A pytree whose children are the
    vectors and the other leaves, so a jitted program receives len(vectors) + len(others) buffers."""

    def __init__(self, vectors: tuple[jax.Array, ...], others: tuple[Any, ...], layout: tuple):
        self.vectors = tuple(vectors)
        self.others = tuple(others)
        self.layout = layout

    def tree_flatten(self):
        return (self.vectors, self.others), self.layout

    @classmethod
    def tree_unflatten(cls, layout, children):
        vectors, others = children
        return cls(vectors, others, layout)

    def unpack(self):
        """The parameter tree `pack_params` packed: each packed leaf a static slice of its vector, reshaped."""
        treedef, entries = self.layout
        others = iter(self.others)
        leaves = []
        for entry in entries:
            if entry is None:
                leaves.append(next(others))
                continue
            vector, offset, shape = entry
            size = math.prod(shape)
            leaves.append(jax.lax.slice_in_dim(self.vectors[vector], offset, offset + size).reshape(shape))
        return jax.tree_util.tree_unflatten(treedef, leaves)


def pack_params(params) -> PackedParams:
    """`params` (a `model.params.Params`, any leaf dtype, quantized leaves included) with every leaf of at most one
    dimension concatenated into one vector per dtype (new arrays on the leaves' device; the leaves themselves are
    neither copied nor freed). `PackedParams.unpack` inverts it exactly (the same values, shapes and dtypes)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    dtypes = sorted({str(x.dtype) for x in leaves if x.ndim <= 1})
    parts: dict[str, list] = {d: [] for d in dtypes}
    offsets = dict.fromkeys(dtypes, 0)
    entries, others = [], []
    for x in leaves:
        if x.ndim > 1:
            entries.append(None)
            others.append(x)
            continue
        d = str(x.dtype)
        entries.append((dtypes.index(d), offsets[d], tuple(x.shape)))
        parts[d].append(jnp.reshape(x, (-1,)))
        offsets[d] += math.prod(x.shape)
    vectors = tuple(jnp.concatenate(parts[d]) for d in dtypes)
    return PackedParams(vectors, tuple(others), (treedef, tuple(entries)))


def as_params(params):
    """The `model.params.Params` a program computes with: `params` unpacked when it is a `PackedParams`, else
    `params` itself (a program may be called with either)."""
    return params.unpack() if isinstance(params, PackedParams) else params


__all__ = ["PackedParams", "as_params", "pack_params"]
