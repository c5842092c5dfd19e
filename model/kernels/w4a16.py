"""The fused W4A16 kernel: int4 weights with group scales (the `w4` layout, `model.quant.QuantArray`) times 16-bit
activations, each weight tile unpacked and converted in registers and multiplied on the matrix unit, partial sums
scaled per group and accumulated in float32; and the engine's choice between it and XLA.

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
  So the kernel runs on NVIDIA GPUs of compute capability >= 8.0 (`MIN_CAPABILITY`) and nowhere else but interpret
  mode; a TPU would need Mosaic TPU's own kernel (not written).
- the fit check (`model.kernels.fit`) models exactly what Triton puts in shared memory: `num_stages` buffers of
  each pipelined load, the dequantized tile handed to the matrix unit, the accumulator and output tiles.

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
`with_tilings`, at load, from the engine's `KernelPlan`) goes through this kernel when its form fits
(`fits_kernel`), with at most `KERNEL_MAX_ROWS` rows; prefill's longer products keep XLA's dot, which fuses the
int4 convert into its GEMM. Layers never branch on it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from model.errors import KernelError
from model.kernels import fit
from model.kernels.fit import Tiling

__all__ = ["KERNEL_NAME", "MIN_CAPABILITY", "KERNEL_MAX_ROWS", "KernelPlan", "w4a16_matmul", "fits_kernel",
           "decide_mode", "with_kernel_mode", "plan_kernel", "log_plan", "with_tilings", "device_limit"]  # fmt: skip

KERNEL_NAME = "w4a16_pallas_kernel"
"""The kernel's name: the Triton kernel and the named scope around the call carry it, so a profile can tell it
(`bench.profile.classify`: category w4a16_kernel)."""

MIN_CAPABILITY = (8, 0)
"""Lowest NVIDIA compute capability the Triton lowering runs on."""

KERNEL_MAX_ROWS = 64
"""Most activation rows a product goes through the kernel with (4 row blocks); longer products (prefill chunks)
take XLA's dot."""


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


def fits_kernel(k: int, n: int, group: int, t: Tiling) -> bool:
    """Whether tiling `t` tiles a K x N product with w4 groups of `group` (bk a multiple of the group, blocks
    dividing K and N, the splits dividing the steps)."""
    return (t.bk % group == 0 and k % t.bk == 0 and n % t.bn == 0 and t.bn % 2 == 0 and group % 2 == 0
            and (k // t.bk) % t.splits == 0)  # fmt: skip


@functools.partial(jax.jit, static_argnames=("k", "n", "group", "axis", "tiling", "interpret"))
def w4a16_matmul(x_RK: jax.Array, values: jax.Array, scales: jax.Array, *, k: int, n: int, group: int, axis: int,
                 tiling: Tiling, interpret: bool = False) -> jax.Array:  # fmt: skip
    """x [R, K] (16-bit or float32) times an int4 weight with group scales: [R, N] in x's dtype.

    values: uint8 [K, N / 2] (axis 0: packed along N) or [N, K / 2] (axis 1: packed along K), two's complement
    nibbles, the even index low (`model.quant` int4 layout); scales: [K / group, N] (axis 0) or [N, K / group]
    (axis 1), any float dtype. The product is exact in the integers, scaled per group in float32 and summed in
    float32. Raises ValueError when `tiling` does not tile the shape (`fits_kernel`: a program error; the engine
    plans tilings with `model.kernels.fit`). `interpret`: run as jax ops (CPU, tests)."""
    t = tiling
    if not fits_kernel(k, n, group, t):
        raise ValueError(f"tiling {t.text} does not tile K={k} N={n} group {group}")
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



# ---- the engine's choice -----------------------------------------------------------------------------------------
def _cc(cc: str | None) -> tuple[int, int]:
    if not cc:
        return (0, 0)
    major, _, minor = str(cc).partition(".")
    return int(major), int(minor or 0)


def decide_mode(platform: str, compute_capability: str | None, w4: bool, requested: str | None) -> tuple[str, str]:
    """("pallas" | "xla", why) for the w4 product on a device, before any shape is known.

    requested: "pallas", "xla" or None (decide: pallas where it can run). Raises KernelError (one line: what was
    asked, why it cannot run, the fix) for "pallas" without w4 quantization, on CPU (interpret mode is for tests),
    on a TPU, or on a GPU of compute capability below 8.0."""
    if not w4:
        if requested == "pallas":
            raise KernelError("--kernel w4a16=pallas: the kernel multiplies w4 weights, and --quant has no w4; add "
                              "--quant w4 (or drop --kernel)")  # fmt: skip
        return "xla", "no w4 weights"
    if requested == "xla":
        return "xla", "--kernel w4a16=xla"
    why = None
    if platform == "cpu":
        why = "CPU: Pallas would only interpret the kernel there (a simulator, for tests)"
    elif platform == "tpu":
        why = "TPU: the kernel is written for the Triton lowering (GPU); a TPU needs a Mosaic TPU kernel"
    elif platform != "gpu":
        why = f"platform {platform}: the kernel runs on NVIDIA GPUs only"
    elif _cc(compute_capability) < MIN_CAPABILITY:
        why = (f"compute capability {compute_capability} < 8.0: Pallas's Triton lowering (and XLA's own Triton "
               "path) needs 8.0 or above")  # fmt: skip
    if why is None:
        return "pallas", ("--kernel w4a16=pallas" if requested == "pallas" else
                          f"GPU compute capability {compute_capability} >= 8.0")  # fmt: skip
    if requested == "pallas":
        raise KernelError(f"--kernel w4a16=pallas: cannot run here ({why}); use --kernel w4a16=xla or drop --kernel")
    return "xla", why


def with_kernel_mode(policy, quant, requested: str | None):
    """`policy` (a `model.policy.DevicePolicy`) with its w4a16 fields set by `decide_mode` for its device, the
    quantization `quant` (a `model.quantspec.QuantSpec`) and the `--kernel` choice `requested` (None, "pallas",
    "xla"). Raises KernelError as `decide_mode`."""
    impl, why = decide_mode(policy.platform, policy.compute_capability, quant.layer_bits == 4, requested)
    return dataclasses.replace(policy, w4a16_kernel=impl, w4a16_reason=why)


def device_limit(device=None) -> tuple[int | None, str]:
    """(scratch bytes per block, where the figure comes from) of a jax device (default: the first): its
    `shared_memory_per_block_optin` where jax exposes it, else `model.kernels.fit.limit_for` of its compute
    capability (or TPU VMEM); (None, why) when neither is known."""
    device = device or jax.devices()[0]
    exposed = getattr(device, "shared_memory_per_block_optin", None)
    if isinstance(exposed, int) and exposed > 0:
        return exposed, "the device's shared_memory_per_block_optin"
    cc = getattr(device, "compute_capability", None)
    if device.platform == "tpu":
        return fit.TPU_VMEM, "TPU scoped VMEM"
    limit = fit.limit_for(str(cc)) if cc else None
    if limit is None:
        return None, f"no table entry for compute capability {cc}"
    return limit, f"the table for compute capability {cc}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelPlan:
    """The engine's w4 product: `impl` ("pallas" or "xla"), `reason` (why), the scratch `limit` (bytes, pallas
    only) and its `limit_source`, and `fits`: the fit check of each projection (pallas only; a projection whose
    Fit has no tiling takes XLA's product).

    `option` ("w4a16=pallas") and `tiles` ({projection label: tiling text, or "xla (why)"}) are what the manifest's
    engine configuration records, and so the build id."""

    impl: str
    reason: str
    limit: int | None = None
    limit_source: str | None = None
    fits: tuple[fit.Fit, ...] = ()

    @property
    def option(self) -> str:
        return f"w4a16={self.impl}"

    @property
    def tiles(self) -> dict[str, str] | None:
        if self.impl != "pallas":
            return None
        return {f.projection.label: f.tiling.text if f.fits else f"xla ({f.problem})" for f in self.fits}

    def tiling_of(self, field: str, shape: tuple[int, ...]) -> Tiling | None:
        """The tiling chosen for a leaf `field` of `shape` (None: XLA's product)."""
        for f in self.fits:
            p = f.projection
            want = (p.k, p.n) if p.axis == 0 else (p.n, p.k)
            if p.field == field and tuple(shape) == want:
                return f.tiling
        return None

    def lines(self) -> list[str]:
        """The log lines of the plan: one per projection (K, N, tiling, bytes needed, limit)."""
        if self.impl != "pallas":
            return [f"w4a16 kernel: xla ({self.reason})"]
        out = [f"w4a16 kernel: pallas (Triton lowering); scratch limit {self.limit:,} B per block "
               f"({self.limit_source})"]  # fmt: skip
        for f in self.fits:
            shown = (f"{f.tiling.text}, needs {f.need.total:,} B" if f.fits else
                     f"xla ({f.problem}{', needs ' + format(f.need.total, ',') + ' B' if f.need else ''})")  # fmt: skip
            out.append(f"w4a16 kernel: {f.projection.label} (x{f.projection.layers} layers): {shown}")
        return out


def plan_kernel(cfg, quant, *, impl: str, reason: str, act_bytes: int, scale_bytes: int, device=None,
                forced: bool = False) -> KernelPlan:  # fmt: skip
    """The `KernelPlan` of a model config under `quant` (a `model.quantspec.QuantSpec`) for the mode `decide_mode`
    gave: for pallas, the fit check of every w4 projection at the device's limit (`device_limit`). Where a
    projection's shape cannot be tiled it takes XLA's product (logged). Where nothing fits in memory: with
    `forced` (--kernel w4a16=pallas) KernelError with the refusal's arithmetic (`model.kernels.fit.refusal`),
    else the plan is xla with the same arithmetic as its reason. An unknown limit: KernelError when forced,
    else xla."""
    if impl != "pallas":
        return KernelPlan(impl=impl, reason=reason)
    limit, source = device_limit(device)
    if limit is None:
        if forced:
            raise KernelError(f"--kernel w4a16=pallas: the scratch limit of this device is unknown ({source}); use "
                              "--kernel w4a16=xla")  # fmt: skip
        return KernelPlan(impl="xla", reason=f"scratch limit unknown ({source})")
    projs = fit.projections(cfg, quant.w4_group)
    fits = fit.plan(projs, limit, act_bytes=act_bytes, scale_bytes=scale_bytes)
    over = [f for f in fits if not f.fits and f.problem == "over the limit"]
    if over:
        device_name = f"this device (limit from {source})"
        message = fit.refusal(over[0], device_name, act_bytes=act_bytes, scale_bytes=scale_bytes)
        if forced:
            raise KernelError(message + "; --kernel w4a16=xla runs the XLA product")
        return KernelPlan(impl="xla", reason=message)
    if not any(f.fits for f in fits):
        why = "; ".join(sorted({f"{f.projection.label}: {f.problem}" for f in fits}))
        if forced:
            raise KernelError(f"--kernel w4a16=pallas: no projection of this model can be tiled ({why}); use "
                              "--kernel w4a16=xla")  # fmt: skip
        return KernelPlan(impl="xla", reason=f"no projection can be tiled ({why})")
    return KernelPlan(impl="pallas", reason=reason, limit=limit, limit_source=source, fits=fits)


def with_tilings(params, plan: KernelPlan):
    """`params` (a `model.params.Params`) with each w4 layer projection's `QuantArray.tiling` set to the plan's
    tiling for its field and shape (None for xla). Returns the new tree; the arrays are not copied."""
    from model.quant import QuantArray

    def layer(lp):
        changed = {}
        for f in dataclasses.fields(lp):
            leaf = getattr(lp, f.name)
            if isinstance(leaf, QuantArray) and leaf.bits == 4 and leaf.ndim == 2:
                changed[f.name] = dataclasses.replace(leaf, tiling=plan.tiling_of(f.name, leaf.shape))
        return dataclasses.replace(lp, **changed)

    return dataclasses.replace(params, layers=tuple(layer(lp) for lp in params.layers))


def log_plan(plan: KernelPlan, log: logging.Logger | None = None) -> None:
    """Log the plan's lines (logger "model.engine")."""
    log = log or logging.getLogger("model.engine")
    for line in plan.lines():
        log.info(line)
