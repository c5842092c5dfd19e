"""The parameters as the engine's jitted programs receive them: fewer arguments per call.

Every argument buffer of a jitted call costs host time at every call, before the device starts: measured on the
default preset's decode step (2-core Xeon, jax 0.12, bfloat16 weights, 41 tokens; median time for the call to
return), with the 475 parameter leaves as they are against the 262 one-dimensional leaves (norm weights and layer
scalars) packed into one vector per dtype: 1.89-2.08 -> 1.31-1.40 ms with each call alone (two rounds of 30 calls),
3.02 -> 2.30 ms while the step before it runs (the host loop's dispatch ahead, 14 rounds of 30 steps). A decode
step is one call per generated token in the host loop, so this is host overhead per token (measurement.md, "Host
overhead"): on the lent TPU v5e it was 0.94 ms of the default preset's 1.37 ms host-loop step
(runs/2026-12-06-tpu-new-tpuv5e).

`pack_params` concatenates the one-dimensional leaves once, outside any program; inside a program,
`as_params(packed)` gives back the same `model.params.Params` tree, each packed leaf a static slice of its vector
(XLA fuses the slice into the ops that read it: no copy). Matrices stay separate leaves: a kernel (a custom call,
e.g. `model.kernels.cpu`) needs each weight as a buffer of its own, and a slice of a larger one would be copied.

Stacked matrices (`pack_params(..., stack=True)`): every group of same-shaped matrices of one dtype becomes one
[n, *shape] array, and `as_params` gives each matrix back as a static index into its stack. On the lent TPU v5e XLA
reads such an index in place (a synthetic program of the default preset's matrix shapes: no copies, temporaries
5.2 MB against 11.3), and the default preset's decode call took 214 -> 10 parameter buffers (6 stacks): paired in
one process (bfloat16, 64 new tokens, 6 alternating pairs, jax 0.10.2), time per step 0.762 -> 0.651 ms at 41
input tokens with the host loop (0.852x), 0.751 -> 0.662 at 521 (0.883x); the device loop 0.983x and 0.972x;
greedy tokens equal. On the 2-core Xeon it was slower (the tiny preset, float32: host loop 1.78x, device loop
1.26x), and XLA:CPU copies a slice handed to a custom call (the bfloat16 kernels, `model.kernels.cpu`); on a GPU
it is unmeasured (a slice feeding a cuBLAS product may be copied there). So an engine stacks on a TPU only,
unless `STACK_SWITCH` says otherwise (`decide_stacking`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from model.switches import switch_state

STACK_SWITCH = "GEMMA4_BENCH_STACK_MATRICES"
"""Environment variable: 1 / true / on / yes stacks an engine's matrices on any backend, 0 / false / off / no on
none; unset: `decide_stacking`'s default (a TPU, dense weights). Read when an engine is made."""


@jax.tree_util.register_pytree_node_class
class PackedParams:
    """A parameter tree with its one-dimensional leaves packed and, where asked, its same-shaped matrices stacked:
    `vectors` (one 1-D array per dtype, in the order of `layout`'s dtypes), `stacks` (one [n, *shape] array per
    stacked (shape, dtype) group; empty unless `pack_params(..., stack=True)`), `others` (every other leaf, in tree
    order) and `layout` (static: the tree structure and, per leaf, ("vector", vector, offset, shape), ("stack",
    stack, index) or None for a leaf kept in `others`). A pytree whose children are the vectors, the stacks and the
    other leaves, so a jitted program receives len(vectors) + len(stacks) + len(others) buffers."""

    def __init__(self, vectors: tuple[jax.Array, ...], others: tuple[Any, ...], layout: tuple,
                 stacks: tuple[jax.Array, ...] = ()):  # fmt: skip
        self.vectors = tuple(vectors)
        self.stacks = tuple(stacks)
        self.others = tuple(others)
        self.layout = layout

    def tree_flatten(self):
        return (self.vectors, self.stacks, self.others), self.layout

    @classmethod
    def tree_unflatten(cls, layout, children):
        vectors, stacks, others = children
        return cls(vectors, others, layout, stacks)

    def unpack(self):
        """The parameter tree `pack_params` packed: each packed leaf a static slice of its vector, reshaped, and
        each stacked matrix a static index into its stack (inside a program XLA reads it in place)."""
        treedef, entries = self.layout
        others = iter(self.others)
        leaves = []
        for entry in entries:
            if entry is None:
                leaves.append(next(others))
            elif entry[0] == "vector":
                _, vector, offset, shape = entry
                size = math.prod(shape)
                leaves.append(jax.lax.slice_in_dim(self.vectors[vector], offset, offset + size).reshape(shape))
            else:
                _, stack, index = entry
                leaves.append(jax.lax.index_in_dim(self.stacks[stack], index, axis=0, keepdims=False))
        return jax.tree_util.tree_unflatten(treedef, leaves)


def pack_params(params, *, stack: bool = False, release: bool = False) -> PackedParams:
    """`params` (a `model.params.Params`, any leaf dtype, quantized leaves included) with every leaf of at most one
    dimension concatenated into one vector per dtype and, with `stack`, every group of two or more leaves of more
    dimensions with the same shape and dtype stacked into one [n, *shape] array (new arrays on the leaves' device;
    the leaves themselves are neither copied nor freed, so stacking holds the stacked matrices twice until the
    caller drops `params`). With `release`, each stacked matrix is deleted once its stack exists (the peak stays
    near the weights plus one stack; `params` is unusable afterwards). `PackedParams.unpack` inverts it exactly (the
    same values, shapes and dtypes)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    dtypes = sorted({str(x.dtype) for x in leaves if x.ndim <= 1})
    parts: dict[str, list] = {d: [] for d in dtypes}
    offsets = dict.fromkeys(dtypes, 0)
    groups: dict[tuple, list[int]] = {}
    if stack:
        for i, x in enumerate(leaves):
            if x.ndim > 1:
                groups.setdefault((tuple(x.shape), str(x.dtype)), []).append(i)
        groups = {key: members for key, members in groups.items() if len(members) > 1}
    stack_of = {i: (g, j) for g, members in enumerate(groups.values()) for j, i in enumerate(members)}
    entries, others = [], []
    for i, x in enumerate(leaves):
        if i in stack_of:
            entries.append(("stack", *stack_of[i]))
        elif x.ndim > 1:
            entries.append(None)
            others.append(x)
        else:
            d = str(x.dtype)
            entries.append(("vector", dtypes.index(d), offsets[d], tuple(x.shape)))
            parts[d].append(jnp.reshape(x, (-1,)))
            offsets[d] += math.prod(x.shape)
    vectors = tuple(jnp.concatenate(parts[d]) for d in dtypes)
    stacks = []
    for members in groups.values():
        stacks.append(jnp.stack([leaves[i] for i in members]))
        if release:
            jax.block_until_ready(stacks[-1])
            for i in members:
                leaves[i].delete()
    return PackedParams(vectors, tuple(others), (treedef, tuple(entries)), tuple(stacks))


def decide_stacking(platform: str, *, quantized: bool) -> bool:
    """Whether an engine on `platform` ("cpu", "gpu", "tpu", ...) holds its matrices stacked (`pack_params(...,
    stack=True)`): `STACK_SWITCH` when set, else on a TPU with dense weights only (the backend and weights where it
    was measured faster: the module docstring). Raises EngineError for a switch value that is neither on nor off
    (`model.switches.switch_state`)."""
    state = switch_state(STACK_SWITCH, default="stacked on a TPU with dense weights, else not")
    return state if state is not None else platform == "tpu" and not quantized


def as_params(params):
    """The `model.params.Params` a program computes with: `params` unpacked when it is a `PackedParams`, else
    `params` itself (a program may be called with either)."""
    return params.unpack() if isinstance(params, PackedParams) else params


__all__ = ["STACK_SWITCH", "PackedParams", "as_params", "decide_stacking", "pack_params"]
