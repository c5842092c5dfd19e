"""A layer's whole `w4` MLP in one TPU kernel call: down(gelu_tanh(x gate) * (x up)) with gate, up and down in the
TPU layout (`model.kernels.tpu_layout`), the "fused" tiling policy (`model.kernels.fit_tpu.fuse_mlp`). Pallas with
the Mosaic TPU lowering, built from the W4A16 kernel's grouped product (`model.kernels.w4a16_tpu.grouped_product`).

Why: at decode a `w4` step on the lent v5e is a chain of about 210 kernel calls, each paying a fixed cost of about
1-1.5 us (the PLE products read 137-165 GB/s, reports/2026-12-07-w4-natural-order-tpuv5e/notes.md), and each call's
pipeline starts with a block copy nothing overlaps. Two calls and XLA's GeGLU fusion between them become one grid
whose weight blocks stream without a gap.

Key: R activation rows (padded to Rp, one row block, at most `fit_tpu.MLP_MAX_ROWS`), D hidden size, F MLP width,
g the w4 group, bf the intermediate values per grid step (`fit_tpu.mlp_block`).

Operands: x [Rp, D]; the gate_up leaf's words int32 [D / 8, 2F] and scales [D / g, 2F] (gate columns first), each
handed twice with two index maps (the gate block j and the up block F / bf + j); the down leaf's words
[F / 8, D] and scales [F / g, D]. Grid (F / bf,), "arbitrary" (the output block [Rp, D] float32 stays in VMEM
across it, zeroed at step 0). Step j: gate and up values [Rp, bf] (float32 sums of the grouped product), each
rounded to the activation dtype as the unfused path's products are, h = gelu_tanh(gate) * up in float32 rounded
to the activation dtype, and out += h times the down block j ([bf / 8, D] words: rows j bf .. (j + 1) bf of F).
The unfused path rounds gelu's result to the activation dtype before the product with up; here that product is
in float32 and rounded once, so results can differ in the activation dtype's last bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from model.kernels.fit_tpu import MLP_MAX_ROWS, ROW_TILE, SCOPED_VMEM
from model.kernels.tpu_layout import PLANES
from model.kernels.w4a16_tpu import grouped_product

__all__ = ["MLP_KERNEL_NAME", "w4_mlp_tpu"]

MLP_KERNEL_NAME = "w4a16_pallas_tpu_mlp"
"""The fused MLP kernel's name (it contains "w4a16_pallas", so `bench.profile.classify` files it as the w4a16
kernel)."""


def _mlp_kernel(x_ref, wg_ref, sg_ref, wu_ref, su_ref, wd_ref, sd_ref, o_ref, *, group: int, d_groups: int,
                f_groups: int):  # fmt: skip
    """One grid step (module docstring): x_ref [Rp, D]; wg_ref, wu_ref [D / 8, bf] int32; sg_ref, su_ref
    [D / g, bf]; wd_ref [bf / 8, D] int32; sd_ref [bf / g, D]; o_ref [Rp, D] float32."""

    @pl.when(pl.program_id(0) == 0)
    def _zero():
        o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

    dt = x_ref.dtype
    gate = grouped_product(x_ref, wg_ref, sg_ref, group=group, groups=d_groups).astype(dt).astype(jnp.float32)
    up = grouped_product(x_ref, wu_ref, su_ref, group=group, groups=d_groups).astype(dt).astype(jnp.float32)
    h = (jax.nn.gelu(gate, approximate=True) * up).astype(dt)
    o_ref[...] += grouped_product(h, wd_ref, sd_ref, group=group, groups=f_groups)


@functools.partial(jax.jit, static_argnames=("d", "f", "group", "bf", "interpret"))
def w4_mlp_tpu(x_RD: jax.Array, gu_words: jax.Array, gu_scales: jax.Array, down_words: jax.Array,
               down_scales: jax.Array, *, d: int, f: int, group: int, bf: int, interpret: bool = False) -> jax.Array:  # fmt: skip
    """x [R, D] (bfloat16, float16 or float32; 1 <= R <= `fit_tpu.MLP_MAX_ROWS`) through a `w4` GeGLU MLP -> [R, D]
    in x's dtype: down(gelu_tanh(x gate) * (x up)).

    gu_words int32 [D / 8, 2F], gu_scales [D / g, 2F] (gate columns, then up); down_words int32 [F / 8, D],
    down_scales [F / g, D]: the leaves in the TPU layout (`model.kernels.tpu_layout`). bf: intermediate values per
    grid step (`model.kernels.fit_tpu.mlp_block`). Raises ValueError naming the sizes when R, f / bf or d / g do
    not fit the kernel. `interpret`: run as jax ops (CPU, tests)."""
    r = x_RD.shape[0]
    if not 1 <= r <= MLP_MAX_ROWS or f % bf or bf % group or d % group or group % PLANES:
        raise ValueError(f"fused w4 MLP: {r} rows, D={d} F={f} group {group} bf {bf}: expected 1..{MLP_MAX_ROWS} "
                         "rows and bf, D multiples of the group, F a multiple of bf")  # fmt: skip
    rp = -(-r // ROW_TILE) * ROW_TILE
    x = jnp.pad(x_RD, ((0, rp - r), (0, 0))) if rp != r else x_RD
    nf, dg = f // bf, d // group
    in_specs = [
        pl.BlockSpec((rp, d), lambda j: (0, 0)),
        pl.BlockSpec((d // PLANES, bf), lambda j: (0, j)),
        pl.BlockSpec((dg, bf), lambda j: (0, j)),
        pl.BlockSpec((d // PLANES, bf), lambda j: (0, j + nf)),
        pl.BlockSpec((dg, bf), lambda j: (0, j + nf)),
        pl.BlockSpec((bf // PLANES, d), lambda j: (j, 0)),
        pl.BlockSpec((bf // group, d), lambda j: (j, 0)),
    ]
    params = pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=SCOPED_VMEM)
    kernel = functools.partial(_mlp_kernel, group=group, d_groups=dg, f_groups=bf // group)
    with jax.named_scope(MLP_KERNEL_NAME):
        out = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((rp, d), jnp.float32), grid=(nf,), in_specs=in_specs,
            out_specs=pl.BlockSpec((rp, d), lambda j: (0, 0)), compiler_params=params, interpret=interpret,
            name=MLP_KERNEL_NAME,
        )(x, gu_words, gu_scales, gu_words, gu_scales, down_words, down_scales)  # fmt: skip
    return out[:r].astype(x_RD.dtype)
