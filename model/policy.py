"""The dtype policy: what the live device is, and which dtypes it computes in. Never read from a config file.

Rules (the published T4G/L4 report, "Leak One"; docs/method.md "Measured facts behind the defaults"):
- CPU -> float32 (XLA:CPU emulates bfloat16: a matrix-vector product ran 19x slower here);
- NVIDIA compute capability < 8.0 (Turing and older) -> float16: no bfloat16 datapath, bfloat16 is emulated
  through float32 and cost 87% of decode in the report;
- NVIDIA compute capability >= 8.0 (Ampere, Ada, Hopper, ...) -> bfloat16;
- TPU -> bfloat16.
An explicit override is honoured; one the device can only emulate is flagged (`emulated`, and a warning line).

The line also says how w4 weights are multiplied (`w4a16_kernel`: "pallas", the fused kernel of
`model.kernels.w4a16`, or "xla", and why), decided by `model.kernels.choice.with_kernel_mode`; and whether a
Pallas kernel would run in interpret mode here (`pallas_interpret`: true on CPU, where only the tests run the
kernel, as a simulator).

The backend (`backend`, `model.backends`): "jax", the pure-JAX engine, on every platform unless the engine
configuration asks for another (`with_backend`, from `--backend`); the line ends with it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from model.backends import DEFAULT_BACKEND, check_backend

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DevicePolicy:
    """The decided policy. Dtype fields are names ("float32", "bfloat16", "float16")."""

    platform: str  # "cpu", "gpu", "tpu"
    device_kind: str  # e.g. "cpu", "NVIDIA H200", "NVIDIA L4"
    compute_capability: str | None  # NVIDIA only, e.g. "9.0"
    compute_dtype: str
    weight_dtype: str
    activation_dtype: str
    kv_dtype: str
    pallas_interpret: bool  # a Pallas kernel would run in interpret mode here (CPU: the tests run the w4a16 kernel so)
    overridden: bool = False
    emulated: bool = False  # the compute dtype has no native datapath on this device
    w4a16_kernel: str = "xla"  # how w4 weights are multiplied: "pallas" (the fused kernel) or "xla"
    w4a16_reason: str = "no w4 weights"  # why (`model.kernels.choice.decide_mode`)
    backend: str = DEFAULT_BACKEND  # what runs beside XLA's programs (`model.backends`): "jax" (none) or "cpu-kernels"

    @property
    def pre_ampere(self) -> bool:
        """True on NVIDIA devices of compute capability below 8.0."""
        return self.platform == "gpu" and _cc(self.compute_capability) < (8, 0)

    def line(self) -> str:
        """The policy as the one line the engine logs first."""
        return (
            f"device policy: platform={self.platform} device_kind={self.device_kind!r} "
            f"compute_capability={self.compute_capability or 'n/a'} compute_dtype={self.compute_dtype} "
            f"weights={self.weight_dtype} activations={self.activation_dtype} kv_cache={self.kv_dtype} "
            f"pre_ampere={str(self.pre_ampere).lower()} pallas_interpret={self.pallas_interpret}"
            + (" (override)" if self.overridden else "")
            + f" w4a16_kernel={self.w4a16_kernel} ({self.w4a16_reason}) backend={self.backend}"
        )

    def warning(self) -> str | None:
        """A one-line warning when the compute dtype is emulated on this device, else None."""
        if not self.emulated:
            return None
        return (
            f"warning: {self.compute_dtype} has no native datapath on {self.device_kind} "
            f"({self.platform}, compute capability {self.compute_capability or 'n/a'}); it will be emulated and "
            f"decode will be much slower; the device's own policy is {native_dtype(self.platform, self.compute_capability)}"
        )


def _cc(cc: str | None) -> tuple[int, int]:
    if not cc:
        return (0, 0)
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


def native_dtype(platform: str, compute_capability: str | None) -> str:
    """The compute dtype the rules above give for a platform and compute capability."""
    if platform == "gpu":
        return "bfloat16" if _cc(compute_capability) >= (8, 0) else "float16"
    if platform == "tpu":
        return "bfloat16"
    return "float32"


def _emulated(platform: str, cc: str | None, dtype: str) -> bool:
    if dtype == "float32":
        return False
    if platform == "cpu":
        return True
    if platform == "gpu":
        return dtype == "bfloat16" and _cc(cc) < (8, 0)
    return dtype == "float16" and platform == "tpu"


def device_facts(device=None) -> tuple[str, str, str | None]:
    """(platform, device_kind, compute_capability) of the live device (the first one by default)."""
    device = device or jax.local_devices()[0]
    platform = device.platform
    if platform in ("cuda", "rocm"):
        platform = "gpu"
    cc = getattr(device, "compute_capability", None)
    return platform, str(device.device_kind), None if cc is None else str(cc)


def decide_policy(override: str | None = None, *, weight_dtype: str | None = None, device=None) -> DevicePolicy:
    """The policy for the live device; `override` forces the compute dtype, `weight_dtype` the stored dtype
    (default: the compute dtype, so no per-step conversion). Raises ValueError for an unknown dtype name."""
    platform, kind, cc = device_facts(device)
    for name in (override, weight_dtype):
        if name is not None and name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    compute = override or native_dtype(platform, cc)
    return DevicePolicy(
        platform=platform,
        device_kind=kind,
        compute_capability=cc,
        compute_dtype=compute,
        weight_dtype=weight_dtype or compute,
        activation_dtype=compute,
        kv_dtype=compute,
        pallas_interpret=platform not in ("gpu", "tpu"),
        overridden=override is not None,
        emulated=_emulated(platform, cc, compute),
    )


def with_backend(policy: DevicePolicy, backend: str | None) -> DevicePolicy:
    """`policy` with `backend` (`model.backends.BACKENDS`; None: `DEFAULT_BACKEND`, the pure-JAX engine). Raises
    EngineError (one line) for an unknown name; whether the backend can run here is `model.backends.plan_backend`'s
    question, asked when the engine is made."""
    return dataclasses.replace(policy, backend=check_backend(backend or DEFAULT_BACKEND))
