"""The W4A16 kernel for the TPU: int4 weights with group scales (the `w4` values, stored in the TPU layout of
`model.kernels.tpu_layout`) times 16-bit activations, in Pallas with the Mosaic TPU lowering
(`jax.experimental.pallas.tpu`). Packed 32-bit words stream from HBM into VMEM block by block (a grid with
BlockSpecs: Pallas's pipeline double-buffers every block, so the copy of the next step runs under this one), are
unpacked and converted there, multiplied on the matrix unit with float32 results, scaled per group and summed in
float32. The engine's choice of it and its tiling: `model.kernels.choice`; what a tiling must satisfy and the VMEM
it needs: `model.kernels.fit_tpu`.

Key: R activation rows, K contraction length, N outputs, g the w4 group, G = K / g; W = N / 8 words per row of K;
bm, bn (= 8 bw), bk: the `model.kernels.fit_tpu.TpuTiling`.

Operands (all prepared outside the kernel; none is a copy of the weight):
- x [G, Rp, g]: the activations, rows padded to Rp (a multiple of the row block), split into groups along K and
  moved group-major (a [R, K] array: small beside the weight), so a group's activations are one leading index;
- words int32 [K, W] and scales [G, 8, W]: the leaf as stored (`model.kernels.tpu_layout`);
- out float32 [8, Rp, W]: plane p, row r, word m is output p W + m; transposed to [Rp, N] after the kernel.

Grid (Rp / bm, W / bw, K / bk), the last axis the reduction ("arbitrary"; the output block stays in VMEM across
it and is zeroed at its first step), the others "parallel". One step: a loop over its bk / g groups; in each it
loads the group's words [g, bw], and for each plane p = 0..7 shifts nibble p to the top of the word and back
(arithmetic shift: the two's complement value, exact), converts it to float32 then to the activation dtype
(exact: |q| <= 8), multiplies x [bm, g] by it on the matrix unit with a float32 result, scales that [bm, bw] by
the group's scales (row p of [8, bw]) and adds it to plane p's float32 accumulator. The product is exact in the
integers; scaling after it keeps the weight's values exact whatever the scale dtype; the float32 sums are in
group order, so results can differ from XLA's product (`model.quant.matmul`) in the last float32 bits before the
cast to the activation dtype.

The vector-unit variant (`tiling.vpu_rows` >= R: a decode step's few rows; `model.kernels.fit_tpu.VPU_ROWS`
says when the engine plans it, 0 until measured): the same grid, words and scales, x handed transposed per group
(float32 [G, g, 8], rows padded to 8) and the output [8, 8, W]; in each group, each plane's values (float32) are
multiplied by each row's activations broadcast along lanes and summed over the group's g values (a reduction along
sublanes), scaled and accumulated, all in float32 on the vector unit: no matrix unit, whose weight loads a
product of a few rows cannot amortize. Whether it is faster is the TPU probe's question.

Lowering: `pltpu.CompilerParams(dimension_semantics=..., vmem_limit_bytes=fit_tpu.SCOPED_VMEM)`, the same API in
jax 0.10.2 (the lent TPU machine's) and 0.12 (the project's): the tests lower it for the TPU on CPU with
`jax.export` (platforms ["tpu"]) so a Mosaic lowering error shows in CI; the TPU's own compile (Mosaic's layout
passes) runs only on a TPU (`scripts/probes/w4a16_tpu.py`). `interpret=True` runs the same kernel as jax ops on
CPU (the tests check it against dequantize-then-matmul).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from model.kernels.fit_tpu import SCOPED_VMEM, VPU_ROW_PAD, TpuTiling, rows_block, tiling_problem_tpu
from model.kernels.tpu_layout import PLANES

__all__ = ["KERNEL_NAME", "w4a16_tpu_matmul"]

KERNEL_NAME = "w4a16_pallas_tpu_kernel"
"""The kernel's name (the custom call and the named scope carry it; `bench.profile.classify` files anything
containing "w4a16_pallas" as the w4a16 kernel)."""


def _plane(w: jax.Array, p: int) -> jax.Array:
    """int32 words -> the signed value of nibble p (bits 4p..4p+3) of each, int32 in [-8, 7]."""
    return (w << (28 - 4 * p)) >> 28 if p < PLANES - 1 else w >> 28


def _kernel(x_ref, w_ref, s_ref, o_ref, *, group: int, groups: int):
    """One grid step: x_ref [groups, bm, g], w_ref [groups g, bw] int32, s_ref [groups, 8, bw], o_ref [8, bm, bw]
    float32 (resident across the K axis of the grid)."""

    @pl.when(pl.program_id(2) == 0)
    def _zero():
        o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

    bm, bw = o_ref.shape[1], o_ref.shape[2]

    def step(i, accs):
        x = x_ref[i]
        w = w_ref[pl.ds(pl.multiple_of(i * group, group), group), :]
        s = s_ref[i].astype(jnp.float32)
        out = []
        for p in range(PLANES):
            q = _plane(w, p).astype(jnp.float32).astype(x.dtype)
            d = jax.lax.dot_general(x, q, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
            out.append(accs[p] + d * s[p : p + 1, :])
        return tuple(out)

    zero = jnp.zeros((bm, bw), jnp.float32)
    accs = jax.lax.fori_loop(0, groups, step, (zero,) * PLANES)
    for p in range(PLANES):
        o_ref[p] += accs[p]


def _kernel_vpu(xt_ref, w_ref, s_ref, o_ref, *, group: int, groups: int, rows: int):
    """One grid step of the vector-unit variant (a few rows): xt_ref [groups, g, 8] float32 (x transposed, rows
    padded to 8), w_ref [groups g, bw] int32, s_ref [groups, 8, bw], o_ref [8, 8, bw] float32 (plane, row, word;
    resident across the K axis of the grid). Each plane's values are multiplied by each row's activations (a
    column broadcast along lanes) and summed over the group's g values (a reduction along sublanes), in float32:
    no matrix unit."""

    @pl.when(pl.program_id(2) == 0)
    def _zero():
        o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

    bw = o_ref.shape[2]

    def step(i, accs):
        xt = xt_ref[i]
        w = w_ref[pl.ds(pl.multiple_of(i * group, group), group), :]
        s = s_ref[i].astype(jnp.float32)
        cols = [jnp.broadcast_to(xt[:, r : r + 1], (group, bw)) for r in range(rows)]
        out = list(accs)
        for p in range(PLANES):
            q = _plane(w, p).astype(jnp.float32)
            for r in range(rows):
                part = jnp.sum(q * cols[r], axis=0, keepdims=True)
                out[p * rows + r] = out[p * rows + r] + part * s[p : p + 1, :]
        return tuple(out)

    zero = jnp.zeros((1, bw), jnp.float32)
    accs = jax.lax.fori_loop(0, groups, step, (zero,) * (PLANES * rows))
    for p in range(PLANES):
        for r in range(rows):
            o_ref[p, r : r + 1, :] += accs[p * rows + r]


def w4a16_tpu_kernel(*refs, vpu_rows: int = 0, **kw):
    """The kernel body (the vector-unit variant for `vpu_rows` > 0 rows), named `KERNEL_NAME` for traces."""
    if vpu_rows:
        return _kernel_vpu(*refs, rows=vpu_rows, **kw)
    return _kernel(*refs, **kw)


w4a16_tpu_kernel.__name__ = KERNEL_NAME


@functools.partial(jax.jit, static_argnames=("k", "n", "group", "tiling", "interpret"))
def w4a16_tpu_matmul(x_RK: jax.Array, words: jax.Array, scales: jax.Array, *, k: int, n: int, group: int,
                     tiling: TpuTiling, interpret: bool = False) -> jax.Array:  # fmt: skip
    """x [R, K] (bfloat16, float16 or float32; any R >= 1) times a w4 weight in the TPU layout: [R, N] in x's dtype.

    words: int32 [K, N / 8]; scales: [K / group, 8, N / 8], any float dtype (`model.kernels.tpu_layout`). Rows are
    padded to a multiple of the row block (`model.kernels.fit_tpu.rows_block`: R rounded up to 16, at most
    tiling.bm). Raises ValueError naming why when `tiling` does not tile the shape
    (`model.kernels.fit_tpu.tiling_problem_tpu`: a program error; the engine plans tilings with
    `model.kernels.fit_tpu`). `interpret`: run as jax ops (CPU, tests)."""
    problem = tiling_problem_tpu(k, n, group, tiling)
    if problem:
        raise ValueError(f"tiling {tiling.text} does not tile K={k} N={n} group {group}: {problem}")
    r = x_RK.shape[0]
    vpu = r <= tiling.vpu_rows
    w_total, bw, groups = n // PLANES, tiling.bw, tiling.bk // group
    if vpu:  # x transposed per group, rows padded to 8 (one row block)
        bm = rp = VPU_ROW_PAD
        x = jnp.pad(x_RK.astype(jnp.float32), ((0, rp - r), (0, 0)))
        x_in = jnp.transpose(x.reshape(rp, k // group, group), (1, 2, 0))
        x_spec = pl.BlockSpec((groups, group, rp), lambda i, j, kk: (kk, 0, 0))
    else:
        bm = rows_block(r, tiling)
        rp = -(-r // bm) * bm
        x = jnp.pad(x_RK, ((0, rp - r), (0, 0))) if rp != r else x_RK
        x_in = jnp.transpose(x.reshape(rp, k // group, group), (1, 0, 2))
        x_spec = pl.BlockSpec((groups, bm, group), lambda i, j, kk: (kk, i, 0))
    grid = (rp // bm, w_total // bw, k // tiling.bk)
    in_specs = [
        x_spec,
        pl.BlockSpec((tiling.bk, bw), lambda i, j, kk: (kk, j)),
        pl.BlockSpec((groups, PLANES, bw), lambda i, j, kk: (kk, 0, j)),
    ]
    out_spec = pl.BlockSpec((PLANES, bm, bw), lambda i, j, kk: (0, i, j))
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                  vmem_limit_bytes=SCOPED_VMEM)  # fmt: skip
    kernel = functools.partial(w4a16_tpu_kernel, group=group, groups=groups, vpu_rows=r if vpu else 0)
    with jax.named_scope(KERNEL_NAME):
        out = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((PLANES, rp, w_total), jnp.float32), grid=grid,
            in_specs=in_specs, out_specs=out_spec, compiler_params=params, interpret=interpret, name=KERNEL_NAME,
        )(x_in, words, scales)  # fmt: skip
    y = jnp.transpose(out, (1, 0, 2)).reshape(rp, n)
    return y[:r].astype(x_RK.dtype)
