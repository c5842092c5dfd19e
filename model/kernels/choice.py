"""The engine's choice between a W4A16 Pallas kernel (`model.kernels.w4a16` on NVIDIA GPUs, `model.kernels.w4a16_tpu`
on TPUs) and XLA's product, before any shape compiles: the mode for a device (`decide_mode`), the tiling of each w4
projection at the device's scratch limit (`plan_kernel`, a `KernelPlan`, from `model.kernels.fit` or
`model.kernels.fit_tpu`), and the tilings set on the weights (`with_tilings`; on a TPU it also stores those
leaves in the TPU layout, `model.kernels.tpu_layout`).

No Pallas here, and no jax at import (`device_limit` imports it when called): a dense engine, and the CLI deciding
its policy line, never load Pallas. Pallas is imported by `model.quant` only on the kernel's dispatch path, the
first time a leaf with a tiling is multiplied.

Dispatch: `model.quant.matmul` is the one product; a `QuantArray` whose static `tiling` is set (by
`with_tilings`, at load, from the engine's `KernelPlan`) goes through the kernel when the tiling tiles its shape
(`model.kernels.fit.fits_kernel`), with at most `model.kernels.fit.KERNEL_MAX_ROWS` rows on a GPU (prefill's
longer products keep XLA's dot, which fuses the int4 convert into its GEMM) and any number on a TPU (the leaf is
stored in the kernel's layout; longer products take several row blocks). Layers never branch on it.
"""

from __future__ import annotations

import dataclasses
import logging

from model.errors import KernelError
from model.kernels import fit, fit_tpu
from model.kernels.fit import Tiling
from model.kernels.fit_tpu import TpuTiling
from model.quantspec import EXPERT_PROJECTIONS as EXPERTS

__all__ = ["MIN_CAPABILITY", "KernelPlan", "decide_mode", "with_kernel_mode", "device_limit",
           "plan_kernel", "with_tilings", "log_plan"]  # fmt: skip

MIN_CAPABILITY = (8, 0)
"""Lowest NVIDIA compute capability the Triton lowering runs on (`model.kernels.w4a16` says why)."""


def _cc(cc: str | None) -> tuple[int, int]:
    if not cc:
        return (0, 0)
    major, _, minor = str(cc).partition(".")
    return int(major), int(minor or 0)


def decide_mode(platform: str, compute_capability: str | None, w4: bool, requested: str | None) -> tuple[str, str]:
    """("pallas" | "xla", why) for the w4 product on a device, before any shape is known.

    requested: "pallas", "xla" or None (decide: pallas where it can run: a TPU, through the Mosaic TPU kernel
    `model.kernels.w4a16_tpu`; an NVIDIA GPU of compute capability >= 8.0, through the Triton kernel
    `model.kernels.w4a16`). "pallas:POLICY" (`model.kernels.fit.parse_kernel`) asks for the TPU kernel with a
    tiling policy. Raises KernelError (one line: what was asked, why it cannot run, the fix) for "pallas"
    without w4 quantization, on CPU (interpret mode is for tests), or on a GPU of compute capability below 8.0,
    and for a tiling policy anywhere but on a TPU."""
    asked = requested
    requested, policy = fit.split_kernel(requested)
    if policy and platform != "tpu" and w4:
        raise KernelError(f"--kernel w4a16={asked}: a tiling policy chooses the TPU kernel's tiling, and this device "
                          f"is {platform}; use --kernel w4a16=pallas (or xla)")  # fmt: skip
    if not w4:
        if requested == "pallas":
            raise KernelError("--kernel w4a16=pallas: the kernel multiplies w4 weights, and --quant has no w4; add "
                              "--quant w4 (or drop --kernel)")  # fmt: skip
        return "xla", "no w4 weights"
    if requested == "xla":
        return "xla", "--kernel w4a16=xla"
    why = None
    if platform == "tpu":
        return "pallas", ("--kernel w4a16=pallas" if requested == "pallas" else
                          "TPU: the Mosaic TPU kernel (model.kernels.w4a16_tpu)")  # fmt: skip
    if platform == "cpu":
        why = "CPU: Pallas would only interpret the kernel there (a simulator, for tests)"
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


def tpu_vmem(device) -> tuple[int | None, str]:
    """(VMEM bytes per TensorCore, where the figure comes from) of a TPU jax device:
    `jax.experimental.pallas.tpu.get_tpu_info().vmem_capacity_bytes` (jax 0.10.2 and 0.12 have it; a table in jax
    keyed by the device kind), else `model.kernels.fit_tpu.TPU_VMEM_BYTES` by the generation in the device kind
    ("TPU v5 lite" -> v5e); (None, why) when neither knows the device. Imports Pallas (called on the kernel's
    path only)."""
    try:
        from jax.experimental.pallas import tpu as pltpu

        return int(pltpu.get_tpu_info().vmem_capacity_bytes), "jax's pltpu.get_tpu_info()"
    except Exception as exc:  # noqa: BLE001 - an old jax, or a kind jax's table lacks: our table
        kind = str(getattr(device, "device_kind", ""))
        gen = fit_tpu.generation_of(kind)
        cap = fit_tpu.vmem_capacity(gen) if gen else None
        if cap is None:
            return None, f"device kind {kind!r} not in jax's table ({exc}) nor ours"
        return cap, f"the table for TPU {gen} (device kind {kind!r})"


def device_limit(device=None) -> tuple[int | None, str]:
    """(scratch bytes per block, where the figure comes from) of a jax device (default: the first): on a TPU the
    VMEM budget of the TPU kernel (`model.kernels.fit_tpu.budget` of the core's VMEM, `tpu_vmem`); on a GPU its
    `shared_memory_per_block_optin` where jax exposes it, else `model.kernels.fit.limit_for` of its compute
    capability; (None, why) when neither is known."""
    if device is None:
        import jax

        device = jax.local_devices()[0]
    if device.platform == "tpu":
        cap, source = tpu_vmem(device)
        return fit_tpu.budget(cap), (f"{fit_tpu.BUDGET_SHARE:.0%} of the {fit_tpu.SCOPED_VMEM // 2**20} MiB scoped "
                                     f"VMEM limit the kernel sets; the core has {cap // 2**20 if cap else '?'} MiB "
                                     f"({source})")  # fmt: skip
    exposed = getattr(device, "shared_memory_per_block_optin", None)
    if isinstance(exposed, int) and exposed > 0:
        return exposed, "the device's shared_memory_per_block_optin"
    cc = getattr(device, "compute_capability", None)
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
    tpu: bool = False  # the Mosaic TPU kernel (model.kernels.w4a16_tpu) rather than the Triton one
    policy: str | None = None  # the TPU tiling policy (model.kernels.fit_tpu.TILING_POLICIES); None: the default

    @property
    def option(self) -> str:
        """"w4a16=pallas", "w4a16=pallas:fewest" (a tiling policy other than the default) or "w4a16=xla"."""
        return f"w4a16={self.impl}" + (f":{self.policy}" if self.policy and self.impl == "pallas" else "")

    @property
    def tiles(self) -> dict[str, str] | None:
        if self.impl != "pallas":
            return None
        return {f.projection.label: f.tiling.text if f.fits else f"xla ({f.problem})" for f in self.fits}

    def tiling_of(self, field: str, shape: tuple[int, ...]) -> Tiling | TpuTiling | None:
        """The tiling chosen for a leaf `field` of `shape` (None: XLA's product); an expert leaf's `shape` is
        [E, A, B], matched by one expert's slice with K padded to whole groups (`fit_tpu.expert_projections`), as a
        2-D leaf's is on a TPU (its plan's projections have K padded, `plan_kernel`)."""
        for f in self.fits:
            p = f.projection
            want = (p.k, p.n) if p.axis == 0 else (p.n, p.k)
            got = tuple(shape)
            if len(got) == 3 or (self.tpu and len(got) == 2):  # [E, A, B]: one expert's slice; on a TPU K padded
                a, b = got[-2:]
                got = (fit_tpu.padded_k(a, p.group), b) if p.axis == 0 else (a, fit_tpu.padded_k(b, p.group))
            if p.field == field and got == want:
                return f.tiling
        return None

    def lines(self) -> list[str]:
        """The log lines of the plan: one per projection (K, N, tiling, bytes needed, limit)."""
        if self.impl != "pallas":
            return [f"w4a16 kernel: xla ({self.reason})"]
        if self.tpu:
            out = [f"w4a16 kernel: pallas (Mosaic TPU lowering); VMEM budget {self.limit:,} B per grid step "
                   f"({self.limit_source}); tiling policy {fit_tpu.parse_policy(self.policy)}"]  # fmt: skip
        else:
            out = [f"w4a16 kernel: pallas (Triton lowering); scratch limit {self.limit:,} B per block "
                   f"({self.limit_source})"]  # fmt: skip
        for f in self.fits:
            steps = (f", {fit_tpu.grid_steps(f.projection.k, f.projection.n, f.tiling)} grid steps"
                     if self.tpu and f.fits else "")  # fmt: skip
            shown = (f"{f.tiling.text}{steps}, needs {f.need.total:,} B" if f.fits else
                     f"xla ({f.problem}{', needs ' + format(f.need.total, ',') + ' B' if f.need else ''})")  # fmt: skip
            out.append(f"w4a16 kernel: {f.projection.label} (x{f.projection.layers} layers): {shown}")
        return out


def plan_kernel(cfg, quant, *, impl: str, reason: str, act_bytes: int, scale_bytes: int, device=None,
                forced: bool = False, policy: str | None = None) -> KernelPlan:  # fmt: skip
    """The `KernelPlan` of a model config under `quant` (a `model.quantspec.QuantSpec`) for the mode `decide_mode`
    gave: for pallas, the fit check of every w4 projection at the device's limit (`device_limit`), on a TPU under
    the tiling `policy` (`model.kernels.fit_tpu.TILING_POLICIES`; None: the default, recorded as None). Where a
    projection's shape cannot be tiled it takes XLA's product (logged). Where nothing fits in memory: with
    `forced` (--kernel w4a16=pallas) KernelError with the refusal's arithmetic (`model.kernels.fit.refusal`),
    else the plan is xla with the same arithmetic as its reason. An unknown limit: KernelError when forced,
    else xla."""
    if impl != "pallas":
        return KernelPlan(impl=impl, reason=reason)
    if device is None:
        import jax

        device = jax.local_devices()[0]
    tpu = device.platform == "tpu"
    limit, source = device_limit(device)
    if limit is None:
        if forced:
            raise KernelError(f"--kernel w4a16=pallas: the scratch limit of this device is unknown ({source}); use "
                              "--kernel w4a16=xla")  # fmt: skip
        return KernelPlan(impl="xla", reason=f"scratch limit unknown ({source})")
    projs = fit.projections(cfg, quant.w4_group)
    if tpu:  # K padded to whole groups (the TPU layout stores the padding: to_tpu); the experts' products too
        projs = tuple(dataclasses.replace(p, k=fit_tpu.padded_k(p.k, p.group)) for p in projs)
        projs = projs + fit_tpu.expert_projections(cfg, quant.w4_group)
    policy = None if not tpu or fit_tpu.parse_policy(policy) == fit_tpu.DEFAULT_POLICY else policy
    if tpu:
        fits = fit_tpu.plan_tpu(projs, limit, act_bytes=act_bytes, scale_bytes=scale_bytes,
                                policy=fit_tpu.parse_policy(policy))  # fmt: skip
    else:
        fits = fit.plan(projs, limit, act_bytes=act_bytes, scale_bytes=scale_bytes)
    refuse = fit_tpu.refusal_tpu if tpu else fit.refusal
    # An expert projection that fits nowhere keeps the per-expert XLA route; it never turns the plan to xla.
    over = [f for f in fits if not f.fits and f.problem == "over the limit" and f.projection.field not in EXPERTS]
    if over:
        device_name = f"this device (limit from {source})"
        message = refuse(over[0], device_name, act_bytes=act_bytes, scale_bytes=scale_bytes)
        if forced:
            raise KernelError(message + "; --kernel w4a16=xla runs the XLA product")
        return KernelPlan(impl="xla", reason=message)
    if not any(f.fits for f in fits):
        why = "; ".join(sorted({f"{f.projection.label}: {f.problem}" for f in fits}))
        if forced:
            raise KernelError(f"--kernel w4a16=pallas: no projection of this model can be tiled ({why}); use "
                              "--kernel w4a16=xla")  # fmt: skip
        return KernelPlan(impl="xla", reason=f"no projection can be tiled ({why})")
    return KernelPlan(impl="pallas", reason=reason, limit=limit, limit_source=source, fits=fits, tpu=tpu,
                      policy=policy)  # fmt: skip


def with_tilings(params, plan: KernelPlan, *, release: bool = False):
    """`params` (a `model.params.Params`) with each w4 layer projection's `QuantArray.tiling` set to the plan's
    tiling for its field and shape (None for xla). Returns the new tree. A GPU tiling shares the arrays (not
    copied). A TPU tiling (`TpuTiling`) also stores the leaf in the TPU layout (`model.kernels.tpu_layout.to_tpu`:
    the same values and bytes as 32-bit words in the kernel's order): this is the one place where that layout is
    chosen, leaf by leaf, at load. The expert leaves (`model.quantspec.EXPERT_PROJECTIONS`, 3-D) the plan tiles
    (TPU only) go to the batched TPU layout (`model.kernels.tpu_layout.to_tpu_experts`, from the uint32 words a
    TPU's storage holds them in, `model.quantspec.WORD_TABLES`, one expert at a time), which `model.moe` multiplies
    with the expert kernel; with `release`, each expert leaf's arrays are deleted once its copy exists (the load:
    26B-A4B's w4 experts are about 11 GB, two copies would not fit a 16 GB chip). Raises ValueError where the
    plan gives a leaf a tiling that does not tile it (`model.kernels.fit.fits_kernel` /
    `model.kernels.fit_tpu.fits_tpu`: a program error; `plan_kernel` chooses only tilings that do, and the
    dispatch would take XLA's product)."""
    from model.quant import QuantArray

    axes = {p.field: p.axis for p in (f.projection for f in plan.fits)}

    def layer(lp):
        changed = {}
        for f in dataclasses.fields(lp):
            leaf = getattr(lp, f.name)
            if (isinstance(leaf, QuantArray) and leaf.bits == 4 and leaf.ndim == 2
                    and not isinstance(leaf.tiling, TpuTiling)  # a leaf in the TPU layout stays as it is
                    and not getattr(leaf, "words", False)):  # bytes held in uint32 words: another layout's
                t = plan.tiling_of(f.name, leaf.shape)
                if t is not None:
                    axis = axes[f.name]
                    k, n, group = leaf.shape[axis], leaf.shape[1 - axis], leaf.block[axis]
                    tpu = isinstance(t, TpuTiling)
                    problem = (fit_tpu.tiling_problem_tpu(fit_tpu.padded_k(k, group), n, group, t) if tpu else
                               fit.tile_problem(t) or fit.tiling_problem(k, n, group, t))  # fmt: skip
                    if problem:
                        raise ValueError(f"kernel plan: {f.name} {leaf.shape}: tiling {t.text} does not tile it "
                                         f"({problem})")  # fmt: skip
                    if tpu:
                        values, scales = _to_tpu(leaf.values, leaf.scales, leaf.shape, axis, group)
                        leaf = dataclasses.replace(leaf, values=values, scales=scales)
                changed[f.name] = dataclasses.replace(leaf, tiling=t)
        return dataclasses.replace(lp, **changed)

    return dataclasses.replace(params, layers=tuple(_tiled_experts(layer(lp), plan, release) for lp in params.layers))


def _tiled_experts(lp, plan: KernelPlan, release: bool):
    """One layer's w4 expert leaves the plan tiles (TPU only) in the batched TPU layout (`with_tilings`)."""
    from model.quant import QuantArray

    changed = {}
    for name in EXPERTS:
        leaf = getattr(lp, name, None)
        if not (isinstance(leaf, QuantArray) and leaf.bits == 4 and leaf.ndim == 3 and leaf.tiling is None):
            continue
        t = plan.tiling_of(name, leaf.shape)
        if not isinstance(t, TpuTiling):  # experts are planned on a TPU only
            continue
        axis = EXPERTS[name][0]
        k, n, group = leaf.shape[axis], leaf.shape[3 - axis], leaf.block[axis]
        problem = fit_tpu.tiling_problem_tpu(fit_tpu.padded_k(k, group), n, group, t)
        if problem:
            raise ValueError(f"kernel plan: {name} {leaf.shape}: tiling {t.text} does not tile it ({problem})")
        values, scales = _to_tpu_experts(leaf.values, leaf.scales, leaf.shape, axis, group, leaf.words)
        if release:
            _release(leaf)
        changed[name] = dataclasses.replace(leaf, values=values, scales=scales, tiling=t, words=False)
    return dataclasses.replace(lp, **changed) if changed else lp


def _to_tpu(values, scales, shape, axis, group):
    """`model.kernels.tpu_layout.to_tpu` (jax; imported on the TPU kernel's path only)."""
    from model.kernels.tpu_layout import to_tpu

    return to_tpu(values, scales, tuple(shape), axis, group)


def _to_tpu_experts(values, scales, shape, axis, group, words):
    """`model.kernels.tpu_layout.to_tpu_experts` (jax; imported on the TPU kernel's path only)."""
    from model.kernels.tpu_layout import to_tpu_experts
    from model.quant import int4_from_words

    return to_tpu_experts(values, scales, tuple(shape), axis, group, int4_from_words if words else None)


def _release(leaf) -> None:
    """Delete a converted leaf's device arrays (`with_tilings(release=True)`), after its copy is computed."""
    for a in (leaf.values, leaf.scales):
        if hasattr(a, "delete"):
            a.block_until_ready()
            a.delete()


def log_plan(plan: KernelPlan, log: logging.Logger | None = None) -> None:
    """Log the plan's lines (logger "model.engine")."""
    log = log or logging.getLogger("model.engine")
    for line in plan.lines():
        log.info(line)
