"""The fused W4A16 kernel: int4 weights with group scales (the `w4` layout, `model.quant.QuantArray`) times 16-bit
activations, each weight tile unpacked and converted in registers and multiplied on the matrix unit, partial sums
scaled per group and accumulated in float32. The engine's choice between it and XLA (and the tilings) is
`model.kernels.choice`; what a tiling must satisfy, and the scratch it needs, `model.kernels.fit`.

Key: R activation rows (a decode step has 1), K contraction length, N outputs, g the w4 group (values per scale
along K), G = K / g groups; bm, bn, bk, stages, splits: the `model.kernels.fit.Tiling`.

Lowering: Pallas's Triton lowering, selected by passing `jax.experimental.pallas.triton.CompilerParams`
(num_warps, num_stages). The choice, and why:
- which lowering a `pallas_call` on an NVIDIA GPU takes: jax 0.10 had a flag, `jax_pallas_use_mosaic_gpu`, for a
  call without `compiler_params`. The sources of jax 0.11.2 (the GPU machine's) and 0.12.0.1 (ours), read for
  this module, no longer have it: `gpu_lowering` dispatches on the type of `compiler_params`, a bare call takes
  Triton's, and Mosaic GPU is chosen by passing `jax.experimental.pallas.mosaic_gpu.CompilerParams`. Passing
  Triton's `CompilerParams` explicitly keeps the lowering the same on every version that has it, and carries
  `num_warps` / `num_stages` (the fit check's stages).
- Mosaic GPU is Hopper-first (Ampere experimental) and is programmed differently (explicit shared memory,
  warpgroup products): a kernel for it would not run on the Ampere/Ada cards (8.0, 8.6, 8.9: the L4 of the
  published report) that the Triton lowering serves.
- the Triton lowering is deprecated since jax 0.11 (a DeprecationWarning at lowering) but works on compute
  capability 8.0 and above; XLA gates its own Triton path at 8.0, and below it (Turing, 7.5) neither lowering runs.
  So the kernel runs on NVIDIA GPUs of compute capability >= 8.0 (`model.kernels.choice.MIN_CAPABILITY`) and
  nowhere else but interpret mode; a TPU takes its own kernel, `model.kernels.w4a16_tpu` (Mosaic TPU).
- the fit check (`model.kernels.fit`) models exactly what Triton puts in shared memory: `num_stages` buffers of
  each pipelined load, the dequantized tile handed to the matrix unit, the accumulator and output tiles.
- what Triton requires of the tiles (`model.kernels.fit.tile_problem`): loads and stores of power-of-two sizes
  (bm, bn, the group), and matrix products at least 16 along each axis (bm >= 16, bn / 2 >= 16 for a [K, N]
  weight, g / 2 >= 16 for an [N, K] one). What the grid requires of the shape (`fit.tiling_problem`): bk a
  multiple of g dividing K, bn dividing N, the splits dividing the K / bk steps.

The kernel (`w4a16_matmul`): a grid of (row blocks, output blocks, K splits); each program loops over its
K / (splits x bk) steps, and in each step over the bk / g groups: it loads the group's activations and packed
bytes, unpacks the two nibbles with integer ops (`_nibbles`: (b & 15) ^ 8 - 8 sign-extends a nibble), converts
them to the activation dtype (exact: |q| <= 8), multiplies on the matrix unit with a float32 result, scales that
by the group's scales and adds it to the float32 accumulator. A weight packed along N ([K, N] layout, axis 0:
q/k/v, gate/up, the PLE projection) gives even outputs from low nibbles and odd ones from high nibbles, stored
with a stride of 2; one packed along K ([N, K], axis 1: o_proj, down_proj, the PLE gate) meets the even and odd
activations. The splits' float32 partial sums [splits, R, N] are added after the kernel and cast to the
activation dtype. Rows are padded to a multiple of bm (16: the matrix unit's smallest M).

Interpret mode (`interpret=True`) runs the same kernel on CPU as jax ops: the tests check it against
dequantize-then-matmul. The engine never runs it on CPU (a simulator is not a serving path): there the product
is XLA's (`model.quant.matmul`'s dot or reduce form), and `--kernel w4a16=pallas` is refused.

Dispatch: `model.quant.matmul` is the one product; a `QuantArray` whose static `tiling` is set (by
`model.kernels.choice.with_tilings`, at load) goes through this kernel when the tiling tiles its shape
(`model.kernels.fit.fits_kernel`), with at most `model.kernels.fit.KERNEL_MAX_ROWS` rows. This module imports
Pallas: `model.quant` imports it on that path only, so a dense engine never loads Pallas.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from model.kernels.fit import Tiling, fits_kernel, tile_problem, tiling_problem

__all__ = ["KERNEL_NAME", "w4a16_matmul"]

KERNEL_NAME = "w4a16_pallas_kernel"
"""The kernel's name: the Triton kernel and the named scope around the call carry it, so a profile can tell it
(`bench.profile.classify`: category w4a16_kernel)."""

# ---- the kernel -----------------------------------------------------------------------------------------------
def _nibbles(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """uint8 [..] -> (low, high) int32 [..] in [-8, 7]: two's complement nibbles, sign-extended by xor and subtract
    (integer ops every lowering has)."""
    b = packed.astype(jnp.int32)
    return ((b & 15) ^ 8) - 8, (((b >> 4) & 15) ^ 8) - 8


def _dot(a: jax.Array, b: jax.Array, contract_b: int) -> jax.Array:
    """a [M, C] times b ([C, N] for contract_b 0, [N, C] for 1): float32 [M, N]."""
    return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


def _kernel_axis0(x_ref, w_ref, s_ref, o_ref, *, t: Tiling, group: int, steps: int):
    """One program, weight [K, N] packed along N: x_ref [bm, K], w_ref [K, bn / 2] uint8, s_ref [G, bn],
    o_ref [bm, bn] float32 (this split's partial sums)."""
    split = pl.program_id(2)
    half = t.bn // 2

    def step(i, acc):
        acc_even, acc_odd = acc
        for j in range(t.bk // group):  # the step's groups, unrolled
            k0 = (split * steps + i) * t.bk + j * group
            x = x_ref[:, pl.ds(k0, group)]
            lo, hi = _nibbles(w_ref[pl.ds(k0, group), :])
            g = k0 // group
            s_even = s_ref[g, pl.ds(0, half, stride=2)].astype(jnp.float32)
            s_odd = s_ref[g, pl.ds(1, half, stride=2)].astype(jnp.float32)
            acc_even += _dot(x, lo.astype(x.dtype), 0) * s_even[None, :]
            acc_odd += _dot(x, hi.astype(x.dtype), 0) * s_odd[None, :]
        return acc_even, acc_odd

    zero = jnp.zeros((t.bm, half), jnp.float32)
    acc_even, acc_odd = jax.lax.fori_loop(0, steps, step, (zero, zero))
    o_ref[:, pl.ds(0, half, stride=2)] = acc_even
    o_ref[:, pl.ds(1, half, stride=2)] = acc_odd


def _kernel_axis1(x_ref, w_ref, s_ref, o_ref, *, t: Tiling, group: int, steps: int):
    """One program, weight [N, K] packed along K: x_ref [bm, K], w_ref [bn, K / 2] uint8, s_ref [bn, G],
    o_ref [bm, bn] float32 (this split's partial sums)."""
    split = pl.program_id(2)
    half = group // 2

    def step(i, acc):
        for j in range(t.bk // group):
            k0 = (split * steps + i) * t.bk + j * group
            x_even = x_ref[:, pl.ds(k0, half, stride=2)]
            x_odd = x_ref[:, pl.ds(k0 + 1, half, stride=2)]
            lo, hi = _nibbles(w_ref[:, pl.ds(k0 // 2, half)])
            s = s_ref[:, k0 // group].astype(jnp.float32)
            part = _dot(x_even, lo.astype(x_even.dtype), 1) + _dot(x_odd, hi.astype(x_odd.dtype), 1)
            acc += part * s[None, :]
        return acc

    o_ref[...] = jax.lax.fori_loop(0, steps, step, jnp.zeros((t.bm, t.bn), jnp.float32))


def w4a16_kernel_fn(axis: int):
    """The kernel body for a weight contracted along `axis` (named `KERNEL_NAME` for traces)."""
    body = _kernel_axis0 if axis == 0 else _kernel_axis1

    def w4a16_pallas_kernel(*refs, **kw):
        return body(*refs, **kw)

    return w4a16_pallas_kernel


@functools.partial(jax.jit, static_argnames=("k", "n", "group", "axis", "tiling", "interpret"))
def w4a16_matmul(x_RK: jax.Array, values: jax.Array, scales: jax.Array, *, k: int, n: int, group: int, axis: int,
                 tiling: Tiling, interpret: bool = False) -> jax.Array:  # fmt: skip
    """x [R, K] (16-bit or float32) times an int4 weight with group scales: [R, N] in x's dtype.

    values: uint8 [K, N / 2] (axis 0: packed along N) or [N, K / 2] (axis 1: packed along K), two's complement
    nibbles, the even index low (`model.quant` int4 layout); scales: [K / group, N] (axis 0) or [N, K / group]
    (axis 1), any float dtype. The product is exact in the integers, scaled per group in float32 and summed in
    float32. Raises ValueError naming why when `tiling` does not tile the shape (`model.kernels.fit.fits_kernel`:
    a program error; the engine plans tilings with `model.kernels.fit`). `interpret`: run as jax ops (CPU, tests)."""
    t = tiling
    if not fits_kernel(k, n, group, t):
        why = tile_problem(t) or tiling_problem(k, n, group, t)
        raise ValueError(f"tiling {t.text} does not tile K={k} N={n} group {group}: {why}")
    r = x_RK.shape[0]
    rp = -(-r // t.bm) * t.bm
    x = jnp.pad(x_RK, ((0, rp - r), (0, 0))) if rp != r else x_RK
    steps = k // t.bk // t.splits
    grid = (rp // t.bm, n // t.bn, t.splits)
    x_spec = pl.BlockSpec((t.bm, k), lambda i, j, s: (i, 0))
    if axis == 0:
        w_spec = pl.BlockSpec((k, t.bn // 2), lambda i, j, s: (0, j))
        s_spec = pl.BlockSpec((k // group, t.bn), lambda i, j, s: (0, j))
    else:
        w_spec = pl.BlockSpec((t.bn, k // 2), lambda i, j, s: (j, 0))
        s_spec = pl.BlockSpec((t.bn, k // group), lambda i, j, s: (j, 0))
    out_spec = pl.BlockSpec((None, t.bm, t.bn), lambda i, j, s: (s, i, j))
    kernel = functools.partial(w4a16_kernel_fn(axis), t=t, group=group, steps=steps)
    params = None if interpret else pltriton.CompilerParams(num_warps=t.warps, num_stages=t.stages)
    with jax.named_scope(KERNEL_NAME):
        parts = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((t.splits, rp, n), jnp.float32), grid=grid,
            in_specs=[x_spec, w_spec, s_spec], out_specs=out_spec, interpret=interpret, name=KERNEL_NAME,
            compiler_params=params,
        )(x, values, scales)  # fmt: skip
    y = parts[0] if t.splits == 1 else jnp.sum(parts, axis=0)
    return y[:r].astype(x_RK.dtype)
