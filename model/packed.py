"""The parameters as the engine's jitted programs receive them: fewer arguments per call.

Every argument buffer of a jitted call costs host time at every call, before the device starts: measured on the
default preset's decode step (2-core Xeon, jax 0.12, bfloat16 weights, 41 tokens; median time for the call to
return), with the 475 parameter leaves as they are against the 262 one-dimensional leaves (norm weights and layer
scalars) packed into one vector per dtype: 1.89-2.08 -> 1.31-1.40 ms with each call alone (two rounds of 30 calls),
3.02 -> 2.30 ms while the step before it runs (the host loop's dispatch ahead, 14 rounds of 30 steps). A decode
step is one call per generated token in the host loop, so this is host overhead per token (docs/method.md,
"Decode loops and host overhead"): on the lent TPU v5e it was 0.94 ms of the default preset's 1.37 ms host-loop step
(runs/2026-12-06-tpu-new-tpuv5e).

`pack_params` concatenates the one-dimensional leaves once, outside any program; inside a program,
`as_params(packed)` gives back the same `model.params.Params` tree, each packed leaf a static slice of its vector
(XLA fuses the slice into the ops that read it: no copy). Matrices stay separate leaves: a kernel (a custom call,
e.g. `model.kernels.cpu`) needs each weight as a buffer of its own, and a slice of a larger one would be copied.
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
