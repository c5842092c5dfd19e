"""The W4A16 kernel for the TPU: int4 weights with group scales (the `w4` values, stored in the TPU layout of
`model.kernels.tpu_layout`) times 16-bit activations, in Pallas with the Mosaic TPU lowering
(`jax.experimental.pallas.tpu`). Packed 32-bit words stream from HBM into VMEM block by block (a grid with
BlockSpecs: Pallas's pipeline double-buffers every block, so the copy of the next step runs under this one), are
unpacked and converted there, multiplied on the matrix unit with float32 results, scaled per group and summed in
float32. The engine's choice of it and its tiling: `model.kernels.choice`; what a tiling must satisfy and the VMEM
it needs: `model.kernels.fit_tpu`.

Key: R activation rows, K contraction length, N outputs, g the w4 group, G = K / g; bm, bn, bk: the
`model.kernels.fit_tpu.TpuTiling`.

Operands (prepared outside the kernel; none is a copy of the weight):
- x [Rp, K]: the activations as they are, rows padded to Rp (a multiple of the row block); a block [bm, bk], a
  group's activations a 128-aligned lane slice of it. No transpose or permutation of x: each was a relayout op per
  call on the TPU, together about 1.05 ms of a 3.75 ms `w4` decode step on the lent v5e (profile
  runs/2026-12-07-tpu-quant-w4-profile-tpuv5e), more than the kernel's own 1.29 ms;
- words int32 [K / 8, N] and scales [G, N]: the leaf as stored (`model.kernels.tpu_layout`);
- out float32 [Rp, N]: cast to the activation dtype after the kernel.

Grid (Rp / bm, N / bn, K / bk), the last axis the reduction ("arbitrary": the output block stays in VMEM across it
and is zeroed at its first step), the others "parallel". One step: for each of its bk / g groups (unrolled: at
most `fit_tpu.MAX_GROUPS_PER_STEP`), the group's g / 8 word rows [g / 8, bn] become its [g, bn] values as
bfloat16 f = 1 + (q + 8) / 16, two per 32-bit lane (a shift, a mask and an OR with bfloat16 1.0 in both halves,
read as bfloat16 by `pltpu.bitcast`: the group's values in natural K order, `model.kernels.tpu_layout`); x [bm, g]
times them on the matrix unit with a float32 result d; since q = 16 f - 24, the group's x . q is 16 d - 24 sum(x)
(x's row sums, float32); that scaled by the group's scales [1, bn] and added to the float32 accumulator. Every f
is exact in bfloat16 (1 + u / 16, four mantissa bits) and each product x f exact in float32; the float32 sums of d
run over values of about 1.5 |x| rather than |q x|, so their rounding is a few times larger than a product of the
integers (still about 1e-6 relative, far below the bfloat16 output's 2^-9). Why this form: at decode's one row
the kernel is bound by the vector unit's unpacking, not by HBM (issue 43's profile: 437 GB/s of packed weights at
a 698 GiB/s streaming read); shifting each nibble out and converting it to float32 and then bfloat16 took about
five vector operations per weight, this 1.5 and no conversion (`scripts/probes/w4_unpack_tpu.py` times both).
Results can differ from XLA's product (`model.quant.matmul`) in the last float32 bits before the cast to the
activation dtype.

The vector-unit variant (`tiling.vpu_rows` >= R: a decode step's few rows; `model.kernels.fit_tpu.VPU_ROWS` says
when the engine plans it, 0 until measured): the same grid, words and scales; x handed transposed per group
(float32 [G, g, 8], rows padded to 8) and the output [8, N]; in each group each run's values (float32 [g / 8, bn])
are multiplied by each row's activations for that run (a column broadcast along lanes), summed over the 8 runs
elementwise and then over the g / 8 rows (a reduction along sublanes), scaled and accumulated, all in float32 on
the vector unit: no matrix unit, whose weight loads a product of a few rows cannot amortize. Whether it is faster
is the TPU probe's question (`scripts/probes/w4a16_tpu.py`).

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

from model.kernels.fit_tpu import SCOPED_VMEM, VPU_MAX_ROWS, VPU_ROW_PAD, TpuTiling, rows_block, tiling_problem_tpu
from model.kernels.tpu_layout import OFFSET, PAIRS, PLANES

__all__ = ["KERNEL_NAME", "EXPERT_KERNEL_NAME", "w4a16_tpu_matmul", "w4a16_tpu_expert_matmul"]

KERNEL_NAME = "w4a16_pallas_tpu_kernel"
"""The kernel's name (the custom call and the named scope carry it; `bench.profile.classify` files anything
containing "w4a16_pallas" as the w4a16 kernel)."""

EXPERT_KERNEL_NAME = "w4a16_pallas_tpu_experts"
"""The expert kernel's name (`w4a16_tpu_expert_matmul`; it too contains "w4a16_pallas")."""


_MASK = 0x00780078
"""Bits 3..6 of each 16-bit half: the top four of a bfloat16's seven mantissa bits."""

_ONE = 0x3F803F80
"""bfloat16 1.0 (0x3F80) in both halves of a 32-bit lane."""


def _pair_plane(w: jax.Array, j: int) -> jax.Array:
    """int32 words [r, bn] -> bfloat16 [2 r, bn]: nibbles j (row 2i) and j + 4 (row 2i + 1) of word row i as
    1 + u / 16, u the stored nibble q + 8 (`model.kernels.tpu_layout`): nibble j moved to bits 3..6, nibble j + 4
    to bits 19..22, masked, ORed into bfloat16 1.0 in both halves, the lanes read as bfloat16 pairs."""
    t = w << 3 if j == 0 else jax.lax.shift_right_logical(w, jnp.int32(4 * j - 3))
    return pltpu.bitcast((t & jnp.int32(_MASK)) | jnp.int32(_ONE), jnp.bfloat16)


def _group_values(w: jax.Array) -> jax.Array:
    """A group's g / 8 word rows [g / 8, bn] -> its [g, bn] values f = 1 + (q + 8) / 16 in bfloat16, the 4 pair
    planes stacked: row j g / 4 + 2 i + h is K index j g / 4 + 2 i + h of the group, its natural order
    (`model.kernels.tpu_layout`)."""
    return jnp.concatenate([_pair_plane(w, j) for j in range(PAIRS)], axis=0)


def _nibble(w: jax.Array, p: int) -> jax.Array:
    """int32 words -> the value q of nibble p (bits 4p..4p+3, stored as q + 8) of each, int32 in [-8, 7]."""
    return ((w >> (4 * p)) & 15) - OFFSET


def _zero_at_first_k_step(o_ref) -> None:
    @pl.when(pl.program_id(2) == 0)
    def _zero():
        o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)


def _kernel(x_ref, w_ref, s_ref, o_ref, *, group: int, groups: int):
    """One grid step: x_ref [bm, groups g], w_ref [groups g / 8, bn] int32, s_ref [groups, bn], o_ref [bm, bn]
    float32 (resident across the K axis of the grid). Per group: f = 1 + (q + 8) / 16 exactly, so q = 16 f - 24 and
    x . q = 16 (x . f) - 24 sum(x); the product x . f on the matrix unit, the correction from the row sums."""
    _zero_at_first_k_step(o_ref)
    o_ref[...] += grouped_product(x_ref, w_ref, s_ref, group=group, groups=groups)


def grouped_product(x_ref, w_ref, s_ref, *, group: int, groups: int) -> jax.Array:
    """The body of `_kernel` without its accumulator: x_ref [bm, groups g] (a ref or an array in VMEM), w_ref
    [groups g / 8, bn] int32 and s_ref [groups, bn] (refs) -> float32 [bm, bn], x times the block's dequantized
    values. Shared with the fused MLP kernel (`model.kernels.w4_mlp_tpu`)."""
    rows = group // PLANES
    s = s_ref[...].astype(jnp.float32)
    acc = None
    for i in range(groups):
        x = x_ref[:, i * group : (i + 1) * group]
        f = _group_values(w_ref[i * rows : (i + 1) * rows, :])
        f = f if x.dtype == jnp.bfloat16 else f.astype(x.dtype)
        d = jax.lax.dot_general(x, f, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        c = jnp.sum(x.astype(jnp.float32), axis=1, keepdims=True)
        part = (d * 16.0 - c * (16.0 + OFFSET)) * s[i : i + 1, :]
        acc = part if acc is None else acc + part
    return acc


def _kernel_vpu(xt_ref, w_ref, s_ref, o_ref, *, group: int, groups: int, rows: int):
    """One grid step of the vector-unit variant: xt_ref [groups, g, 8] float32 (x transposed, rows padded to 8),
    w_ref [groups g / 8, bn] int32, s_ref [groups, bn], o_ref [8, bn] float32 (resident across the K axis)."""
    _zero_at_first_k_step(o_ref)
    run = group // PLANES
    bn = o_ref.shape[1]
    s = s_ref[...].astype(jnp.float32)
    acc = [None] * rows
    for i in range(groups):
        xt = xt_ref[i]
        w = w_ref[i * run : (i + 1) * run, :]
        sums = [None] * rows
        for p in range(PLANES):
            q = _nibble(w, p).astype(jnp.float32)
            for r in range(rows):
                term = q * jnp.broadcast_to(xt[p * run : (p + 1) * run, r : r + 1], (run, bn))
                sums[r] = term if sums[r] is None else sums[r] + term
        for r in range(rows):
            part = jnp.sum(sums[r], axis=0, keepdims=True) * s[i : i + 1, :]
            acc[r] = part if acc[r] is None else acc[r] + part
    for r in range(rows):
        o_ref[r : r + 1, :] += acc[r]


def _f32_plane(w: jax.Array, p: int) -> jax.Array:
    """int32 words -> float32 1 + u / 16 for nibble p (u = q + 8, the stored nibble): the nibble moved to bits
    19..22 (the top four of float32's 23 mantissa bits), masked and ORed into 1.0. Three integer operations, no
    conversion."""
    t = w << (19 - 4 * p) if 4 * p <= 19 else jax.lax.shift_right_logical(w, jnp.int32(4 * p - 19))
    return jax.lax.bitcast_convert_type((t & jnp.int32(0x00780000)) | jnp.int32(0x3F800000), jnp.float32)


def _kernel_hybrid(x_ref, xt_ref, w_ref, s_ref, o_ref, *, group: int, groups: int, rows: int, split: int):
    """One grid step of the hybrid form at `rows` <= 8 rows: outputs [0, split) of the block as `_kernel` (matrix
    unit), outputs [split, bn) on the vector unit: per nibble plane p the values f = 1 + u / 16 in float32
    (`_f32_plane`) times each row's activations for that plane (xt_ref [groups, g, 8] float32, as the vector-unit
    variant's), summed over the planes and the g / 8 word rows; then 16 that - 24 sum(x), scaled.
    x_ref [bm, groups g]; w_ref [groups g / 8, bn] int32; s_ref [groups, bn]; o_ref [bm, bn] float32."""
    _zero_at_first_k_step(o_ref)
    run = group // PLANES
    s = s_ref[...].astype(jnp.float32)
    acc, acc_v = None, [None] * rows
    for i in range(groups):
        w = w_ref[i * run : (i + 1) * run, :]
        x = x_ref[:, i * group : (i + 1) * group]
        d = jax.lax.dot_general(x, _group_values(w[:, :split]), (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)  # fmt: skip
        c = jnp.sum(x.astype(jnp.float32), axis=1, keepdims=True)
        part = (d * 16.0 - c * (16.0 + OFFSET)) * s[i : i + 1, :split]
        acc = part if acc is None else acc + part
        xt, wv = xt_ref[i], w[:, split:]
        sums = [None] * rows
        for p in range(PLANES):
            f = _f32_plane(wv, p)
            for r in range(rows):
                term = f * xt[p * run : (p + 1) * run, r : r + 1]
                sums[r] = term if sums[r] is None else sums[r] + term
        for r in range(rows):
            cr = jnp.sum(xt[:, r : r + 1], axis=0, keepdims=True)
            part_v = (jnp.sum(sums[r], axis=0, keepdims=True) * 16.0 - cr * (16.0 + OFFSET)) * s[i : i + 1, split:]
            acc_v[r] = part_v if acc_v[r] is None else acc_v[r] + part_v
    o_ref[:, :split] += acc
    for r in range(rows):
        o_ref[r : r + 1, split:] += acc_v[r]


def w4a16_tpu_kernel(*refs, vpu_rows: int = 0, hybrid_rows: int = 0, split: int = 0, **kw):
    """The kernel body (the vector-unit variant for `vpu_rows` > 0 rows, the hybrid form for `hybrid_rows` > 0),
    named `KERNEL_NAME` for traces."""
    if vpu_rows:
        return _kernel_vpu(*refs, rows=vpu_rows, **kw)
    if hybrid_rows:
        return _kernel_hybrid(*refs, rows=hybrid_rows, split=split, **kw)
    return _kernel(*refs, **kw)


w4a16_tpu_kernel.__name__ = KERNEL_NAME


def _transposed(x_RK: jax.Array, k: int, group: int) -> jax.Array:
    """x [R, K] -> float32 [K / g, g, 8]: per group transposed, rows padded to 8, and in the order of the nibble
    planes (position p g / 8 + i takes the K index nibble p of word row i holds, `model.kernels.tpu_layout`): the
    vector-unit variants' activations (off by default, `fit_tpu.VPU_ROWS`, `fit_tpu.VPU_COL_SHARE`)."""
    run = group // PLANES
    x = jnp.pad(x_RK.astype(jnp.float32), ((0, VPU_ROW_PAD - x_RK.shape[0]), (0, 0)))
    x = x.reshape(VPU_ROW_PAD, k // group, PAIRS, run, 2)  # (r, G, j, i, h): K index 2 run j + 2 i + h
    x = jnp.transpose(x, (1, 4, 2, 3, 0))  # (G, h, j, i, r): position (4 h + j) run + i
    return x.reshape(k // group, group, VPU_ROW_PAD)


RESIDENT_MAX_BYTES = 8 * 2**20
"""The largest packed weight (K N / 2 bytes) the experimental resident form takes (`w4a16_tpu_matmul`, resident):
the whole operand sits in VMEM, single-buffered, within the kernel's 16 MiB scoped limit."""


@functools.partial(jax.jit, static_argnames=("k", "n", "group", "tiling", "interpret", "resident"))
def w4a16_tpu_matmul(x_RK: jax.Array, words: jax.Array, scales: jax.Array, *, k: int, n: int, group: int,
                     tiling: TpuTiling, interpret: bool = False, resident: bool = False) -> jax.Array:  # fmt: skip
    """x [R, K] (bfloat16, float16 or float32; any R >= 1) times a w4 weight in the TPU layout: [R, N] in x's dtype.

    words: int32 [K / 8, N]; scales: [K / group, N], any float dtype (`model.kernels.tpu_layout`). Rows are padded
    to a multiple of the row block (`model.kernels.fit_tpu.rows_block`: R rounded up to 16, at most tiling.bm); R
    <= tiling.vpu_rows takes the vector-unit variant, R <= `fit_tpu.VPU_MAX_ROWS` with tiling.vpu_cols the hybrid
    form (`_kernel_hybrid`). Raises ValueError naming why when `tiling` does not tile the
    shape (`model.kernels.fit_tpu.tiling_problem_tpu`: a program error; the engine plans tilings with
    `model.kernels.fit_tpu`). `interpret`: run as jax ops (CPU, tests).

    An experimental form, timed alone by the TPU probe (`scripts/probes/w4_tiling_tpu.py --resident`) and used by
    the engine only under the "resident" tiling policy (`model.kernels.fit_tpu.mark_resident`; not the default):
    `resident`, one grid step with every operand whole in VMEM (`pltpu.VMEM`
    memory space, no Pallas pipeline): XLA then copies the weight into VMEM before the call, a copy its scheduler may start during earlier ops, where a pipeline's first block is copied
    inside the call with nothing to overlap (issue 43: the small products run 1.2-4.3 us a call at 137-474 GB/s).
    Resident takes rows <= tiling.bm, K / group <= `fit_tpu.MAX_GROUPS_PER_STEP` and at most `RESIDENT_MAX_BYTES`
    of packed weight; ValueError otherwise."""
    problem = tiling_problem_tpu(k, n, group, tiling)
    if problem:
        raise ValueError(f"tiling {tiling.text} does not tile K={k} N={n} group {group}: {problem}")
    r = x_RK.shape[0]
    if resident:
        return _resident(x_RK, words, scales, k=k, n=n, group=group, tiling=tiling, interpret=interpret)
    vpu = r <= tiling.vpu_rows
    hybrid = not vpu and tiling.vpu_cols and r <= VPU_MAX_ROWS
    groups, bn = tiling.bk // group, tiling.bn
    xt_spec = pl.BlockSpec((groups, group, VPU_ROW_PAD), lambda i, j, kk: (kk, 0, 0))
    extra = [(_transposed(x_RK, k, group), xt_spec)] if hybrid else []
    if vpu:  # x transposed per group, rows padded to 8 (one row block)
        bm = rp = VPU_ROW_PAD
        x_in, x_spec = _transposed(x_RK, k, group), xt_spec
    else:
        bm = rows_block(r, tiling)
        rp = -(-r // bm) * bm
        x_in = jnp.pad(x_RK, ((0, rp - r), (0, 0))) if rp != r else x_RK
        x_spec = pl.BlockSpec((bm, tiling.bk), lambda i, j, kk: (i, kk))
    grid = (rp // bm, n // bn, k // tiling.bk)
    in_specs = [
        x_spec,
        *[spec for _, spec in extra],
        pl.BlockSpec((tiling.bk // PLANES, bn), lambda i, j, kk: (kk, j)),
        pl.BlockSpec((groups, bn), lambda i, j, kk: (kk, j)),
    ]
    out_spec = pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                  vmem_limit_bytes=SCOPED_VMEM)  # fmt: skip
    kernel = functools.partial(w4a16_tpu_kernel, group=group, groups=groups, vpu_rows=r if vpu else 0,
                               hybrid_rows=r if hybrid else 0, split=bn - tiling.vpu_cols)  # fmt: skip
    with jax.named_scope(KERNEL_NAME):
        out = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((rp, n), jnp.float32), grid=grid, in_specs=in_specs,
            out_specs=out_spec, compiler_params=params, interpret=interpret, name=KERNEL_NAME,
        )(x_in, *[a for a, _ in extra], words, scales)  # fmt: skip
    return out[:r].astype(x_RK.dtype)


def _resident(x_RK: jax.Array, words: jax.Array, scales: jax.Array, *, k: int, n: int, group: int,
              tiling: TpuTiling, interpret: bool) -> jax.Array:  # fmt: skip
    """`w4a16_tpu_matmul`'s resident form: x [R, K] (R padded as one row block, `fit_tpu.rows_block`), words
    [K / 8, N] and scales [K / g, N] whole in VMEM, one grid step of `_kernel` over all K / g groups, out float32
    [Rp, N] whole in VMEM."""
    from model.kernels.fit_tpu import MAX_GROUPS_PER_STEP

    r, bm = x_RK.shape[0], tiling.bm
    rp = rows_block(r, tiling)
    if r > rp or k // group > MAX_GROUPS_PER_STEP or k * n // 2 > RESIDENT_MAX_BYTES:
        raise ValueError(f"resident form: {r} rows, K={k} N={n} group {group}: expected rows <= {bm}, K / group <= "
                         f"{MAX_GROUPS_PER_STEP} and K N / 2 <= {RESIDENT_MAX_BYTES} bytes")  # fmt: skip
    x = jnp.pad(x_RK, ((0, rp - r), (0, 0))) if rp != r else x_RK
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    params = pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary", "arbitrary"),
                                  vmem_limit_bytes=SCOPED_VMEM)  # fmt: skip
    kernel = functools.partial(w4a16_tpu_kernel, group=group, groups=k // group)
    with jax.named_scope(KERNEL_NAME):
        out = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((rp, n), jnp.float32), grid=(1, 1, 1), in_specs=[vmem] * 3,
            out_specs=vmem, compiler_params=params, interpret=interpret, name=KERNEL_NAME,
        )(x, words, scales)  # fmt: skip
    return out[:r].astype(x_RK.dtype)


def w4a16_tpu_expert_kernel(ids_ref, x_ref, w_ref, s_ref, o_ref, **kw):
    """The expert kernel's body: `_kernel` on the blocks the index maps chose (ids_ref, the tiles' expert ids in
    SMEM, is read by the index maps only), named `EXPERT_KERNEL_NAME` for traces."""
    del ids_ref
    return _kernel(x_ref, w_ref, s_ref, o_ref, **kw)


w4a16_tpu_expert_kernel.__name__ = EXPERT_KERNEL_NAME


@functools.partial(jax.jit, static_argnames=("k", "n", "group", "tiling", "interpret"))
def w4a16_tpu_expert_matmul(x_UMK: jax.Array, words_EKN: jax.Array, scales_EGN: jax.Array, experts_U: jax.Array, *,
                            k: int, n: int, group: int, tiling: TpuTiling, interpret: bool = False) -> jax.Array:  # fmt: skip
    """U tiles of M activation rows, tile u times expert experts_U[u]'s w4 weight, in ONE pallas_call: [U, M, N] in
    x's dtype (float32 sums, as `w4a16_tpu_matmul`).

    x_UMK: [U, M, K'] (bfloat16, float16 or float32), K' <= k: columns past K' are zeros (an expert leaf's K
    padded to whole groups, `model.kernels.tpu_layout.to_tpu_experts`). words_EKN: int32 [E, k / 8, N] and
    scales_EGN: [E, k / group, N], every expert's weight in the TPU layout (`model.kernels.tpu_layout`).
    experts_U: int32 [U], each tile's expert (any order, repeats allowed; clipped to 0..E-1 so that no block is
    read out of bounds).

    How: M is padded to Mp, a multiple of the row block bm (`model.kernels.fit_tpu.rows_block`: M rounded up to
    16, at most tiling.bm), the tiles stacked into x [U Mp, K], and the grid is (U Mp / bm, N / bn, K / bk) with
    the expert ids a scalar-prefetch operand (`pltpu.PrefetchScalarGridSpec`, the ids in SMEM before the grid
    runs): the index maps of the words and scales read the id of step i's tile, so each step's block [bk / 8, bn]
    of the chosen expert is copied straight from the [E, ...] arrays (the expert axis squeezed out of the block,
    `pl.Squeezed()`): no expert is sliced out or copied whole, and an expert two consecutive tiles share is not
    copied again (the pipeline skips a block whose index did not change). The body is `_kernel`'s (the matrix
    unit form; `tiling.vpu_rows` and `vpu_cols` are not used here). Raises ValueError naming why when `tiling`
    does not tile (k, n, group) (`model.kernels.fit_tpu.tiling_problem_tpu`) or the operands' shapes disagree.
    `interpret`: run as jax ops (CPU, tests)."""
    problem = tiling_problem_tpu(k, n, group, tiling)
    if problem:
        raise ValueError(f"tiling {tiling.text} does not tile K={k} N={n} group {group}: {problem}")
    u, m, kx = x_UMK.shape
    e = words_EKN.shape[0]
    want = ((e, k // PLANES, n), (e, k // group, n), (u,))
    if (words_EKN.shape, scales_EGN.shape, experts_U.shape) != want or kx > k:
        raise ValueError(f"expert kernel: words {words_EKN.shape}, scales {scales_EGN.shape}, experts "
                         f"{experts_U.shape}, x {x_UMK.shape}: expected {want[0]}, {want[1]}, ({u},) and x's last "
                         f"axis at most K={k}")  # fmt: skip
    bm = rows_block(m, tiling)
    mp = -(-m // bm) * bm
    x = jnp.pad(x_UMK, ((0, 0), (0, mp - m), (0, k - kx))) if (mp, kx) != (m, k) else x_UMK
    x_RK = x.reshape(u * mp, k)
    blocks = mp // bm  # row blocks per tile
    groups, bn = tiling.bk // group, tiling.bn
    ids = jnp.clip(experts_U.astype(jnp.int32), 0, e - 1)

    def tile(i):  # grid row i -> its tile (lax.div, truncating: i >= 0; `//` lowers a sign op Mosaic needs a TPU for)
        return i if blocks == 1 else jax.lax.div(i, jnp.int32(blocks))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(u * blocks, n // bn, k // tiling.bk),
        in_specs=[
            pl.BlockSpec((bm, tiling.bk), lambda i, j, kk, ids_ref: (i, kk)),
            pl.BlockSpec((pl.Squeezed(), tiling.bk // PLANES, bn), lambda i, j, kk, ids_ref: (ids_ref[tile(i)], kk, j)),
            pl.BlockSpec((pl.Squeezed(), groups, bn), lambda i, j, kk, ids_ref: (ids_ref[tile(i)], kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk, ids_ref: (i, j)),
    )  # fmt: skip
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                  vmem_limit_bytes=SCOPED_VMEM)  # fmt: skip
    kernel = functools.partial(w4a16_tpu_expert_kernel, group=group, groups=groups)
    with jax.named_scope(EXPERT_KERNEL_NAME):
        out = pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((u * mp, n), jnp.float32), grid_spec=grid_spec,
            compiler_params=params, interpret=interpret, name=EXPERT_KERNEL_NAME,
        )(ids, x_RK, words_EKN, scales_EGN)  # fmt: skip
    return out.reshape(u, mp, n)[:, :m].astype(x_UMK.dtype)
