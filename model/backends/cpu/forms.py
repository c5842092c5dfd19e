"""The dense product forms written for XLA:CPU: one activation-rows-by-weight product, [R, K] x a 2-D weight.

Key: R activation rows (batch x positions; a decode step has R = 1 per sequence), K the contraction length, N the
output length; `axis` the weight's contraction axis (1: w [N, K], output-major; 0: w [K, N], input-major).

`dense_matmul` tries, in order: the bfloat16 kernels (`bf16_kernel_form`, only under the "cpu-kernels" backend:
`model.backends`), the weight-left form of a few rows (`weight_left_form`) and the split form of one row
(`split_form`); the last two are jax.numpy, part of the pure-JAX engine on CPU. Asked only on the CPU platform
(`model.backends.dense_matmul`), from `model.quant.matmul`, which reshapes the product to rows and back.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

BATCH_ROWS_WEIGHT_LEFT = (2, 64)
"""Activation rows (inclusive range) for which `weight_left_form` takes a dense output-major product."""


def dense_matmul(x_RK: jax.Array, w: jax.Array, axis: int, *, kernels: bool) -> jax.Array | None:
    """[R, N]: the first of `bf16_kernel_form` (when `kernels`), `weight_left_form` and `split_form` that takes
    this product; None when none does (the caller's einsum)."""
    forms = (bf16_kernel_form, weight_left_form, split_form) if kernels else (weight_left_form, split_form)
    for form in forms:
        y_RN = form(x_RK, w, axis)
        if y_RN is not None:
            return y_RN
    return None


def bf16_kernel_form(x_RK: jax.Array, w: jax.Array, axis: int) -> jax.Array | None:
    """A bfloat16 weight times float32 rows through the engine's hand-written kernels (`model.backends.cpu.kernels`)
    when they are loaded; else None (the other forms, where XLA widens the weight first at about 1.4 GB/s: the
    published report's "leak one").

    At most `kernels.max_rows()` rows (decode, batches, a short prompt's prefill; any number where the kernel has
    AMX tiles): `matvec` reads the weight in place in either layout and sums in float32. More rows (prefill): the
    weight is widened once by `to_float32` (exact) and XLA's float32 product runs, so the result is the float32
    product of the same values. Returns float32 [R, N]; float32 sums in another order than XLA's dot can differ in
    the last bits."""
    if w.dtype != jnp.bfloat16 or x_RK.dtype != jnp.float32:
        return None
    from model.backends.cpu import kernels  # the build is tried on the first such product in a process

    if not kernels.available():
        return None
    if x_RK.shape[0] > kernels.max_rows():
        return jnp.einsum("RK,NK->RN" if axis == 1 else "RK,KN->RN", x_RK, kernels.to_float32(w))
    return kernels.matvec(x_RK, w, axis)


def weight_left_form(x_RK: jax.Array, w: jax.Array, axis: int) -> jax.Array | None:
    """An output-major weight ([N, K], the contraction axis minor: o_proj, down_proj, the PLE gate, the tied head)
    times R rows, `BATCH_ROWS_WEIGHT_LEFT` (2-64): computed as w x^T -> [N, R], materialized, then transposed to
    [R, N] (in x's dtype); else None.

    Why (XLA:CPU, jax 0.12, 2-core AMD EPYC, float32, weights streamed from memory): x [R, K] against w [N, K] as
    one einsum with R on the left ran as a small-M matrix product at half the matrix-vector rate or less, e.g.
    [256, 2048] at R = 4: 0.67 ms, at R = 16: 0.83-0.95 ms (R = 1: 0.20 ms); with the weight on the left and its
    [N, R] result kept out of the product by an optimization barrier: 0.27-0.33 ms and 0.28-0.40 ms. Without the
    barrier XLA folds the transpose into the product's output layout and it is as slow as before. The exact sum is
    the same products in another order: float32 results can differ in the last bits."""
    if axis != 1 or not BATCH_ROWS_WEIGHT_LEFT[0] <= x_RK.shape[0] <= BATCH_ROWS_WEIGHT_LEFT[1]:
        return None
    y_NR = jax.lax.optimization_barrier(jnp.einsum("NK,RK->NR", w.astype(x_RK.dtype), x_RK))
    return y_NR.T


def _cpu_threads() -> int:
    """Logical CPUs this process may run on (`os.sched_getaffinity`; `os.cpu_count` where there is no affinity
    call), at least 1. CPU quotas (cgroups) are not seen."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this OS
        return max(1, os.cpu_count() or 1)


SPLIT_SLABS = _cpu_threads()
"""Slabs `split_form` cuts a one-row product's weight into: one per logical CPU this process may use
(`_cpu_threads`), read once at import (a later affinity change is not seen; a jitted program keeps the value it
was traced with). Measured only at 2 (the 2-core Xeon of `split_form`'s note); other counts are an assumption."""


def split_form(x_RK: jax.Array, w: jax.Array, axis: int) -> jax.Array | None:
    """One row times a dense weight as a batched product over `SPLIT_SLABS` slabs of the weight (free reshapes, no
    copy of the weight), when there are at least 2 slabs, they divide the axis cut and each slab has at least 2 of
    its rows; else None. The weight is converted to x's dtype first, as the plain einsum.

    The cut: an output-major weight [N, K] (contraction axis minor: o_proj, down_proj, the PLE gate, the tied head)
    is cut along N into [S, N/S, K], each slab times the row gives N/S outputs (each output the same K-long sum as
    before: [1, N] in x's dtype); an input-major weight [K, N] (q/k/v, gate/up, the PLE projection) is cut along K
    into [S, K/S, N], each slab times its part of the row, and the S partial sums are added in float32 ([1, N]
    float32, rounded once to x's dtype by the caller; results can differ from the one product in the last bits;
    float16 partials rounded before the add were ~1.6x farther from the exact sum, [1536, 8960] at S = 4).

    Why (XLA:CPU, jax 0.12, 2-core Intel Xeon with AVX-512, float32, weights streamed from memory): XLA:CPU runs
    a matrix-vector product of up to about 2 MB on one thread (e.g. [256, 2048]: 0.13 ms, 16 GB/s) and larger
    ones on both (e.g. [256, 4096]: 29 GB/s); a batched product with 2 slabs runs on both at any size ([256,
    2048] cut along K: 0.077 ms, 27 GB/s; [2048, 256] cut along N: 0.071 ms, 30 GB/s). The default preset's
    layer weights are 1-2.6 MB, so B = 1 decode ran its products on one of the two cores."""
    s = SPLIT_SLABS
    if s < 2 or x_RK.shape[0] != 1 or w.shape[0] % s or w.shape[0] < 2 * s:  # the cut is along axis 0 in both layouts
        return None
    w = w.astype(x_RK.dtype)
    if axis == 1:  # output-major [N, K]: slabs of outputs
        n, k = w.shape
        y_SRn = jnp.einsum("SRK,SnK->SRn", jnp.broadcast_to(x_RK, (s,) + x_RK.shape), w.reshape(s, n // s, k))
        return jnp.transpose(y_SRn, (1, 0, 2)).reshape(1, n)
    k, n = w.shape  # input-major [K, N]: slabs of the contraction, partial sums added
    x_SRk = jnp.transpose(x_RK.reshape(1, s, k // s), (1, 0, 2))
    y_SRN = jnp.einsum("SRk,SkN->SRN", x_SRk, w.reshape(s, k // s, n), preferred_element_type=jnp.float32)
    return y_SRN.sum(axis=0)


__all__ = ["BATCH_ROWS_WEIGHT_LEFT", "SPLIT_SLABS", "bf16_kernel_form", "dense_matmul", "split_form",
           "weight_left_form"]
