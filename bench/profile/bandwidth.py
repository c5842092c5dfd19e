"""Measured memory bandwidth of the live device, and the bandwidth roofline share (measurement.md, "Rooflines").

The bandwidth is that of a large device-to-device copy on the device being benchmarked, in the same process:
bytes read + bytes written, over the median time of one copy. The copy is a jitted `dst.at[:].set(src)` with `dst`
donated: XLA compiles it to one `copy` of `src` into `dst`'s buffer (as the compiled HLO shows on CPU; it cannot
be elided, since `src` is not donated and the result must hold its values), so each call reads n bytes and writes
n bytes, and no call allocates (a fresh output buffer would add page-fault time on CPU and measure the allocator,
not memory: 4-7 GB/s against 25 GB/s for the donated copy on this project's CPU machine). Also avoided: `x + 0`
(XLA simplifies it to `x`, no copy at all) and timing the first call (it compiles).

On this project's CPU machines a numpy copy gives about 27 GB/s on one core (measurement.md); the test suite checks
that this measurement lands within a small factor of a numpy copy measured the same way.

jax is imported only by `measure_bandwidth`; the roofline share of a measured bandwidth is
`bench.profile.roofline.roofline_share` (no jax, so the report can use it on archived runs).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from bench.errors import InputError

MiB = 2**20
GiB = 2**30

# Default copy size per platform (bytes of the source buffer; the copy reads these and writes as many again):
# large enough to dwarf caches (CPU last-level caches are tens of MiB; H100/H200 L2 is 50 MiB) and dispatch
# overhead, small enough to fit beside a loaded model.
DEFAULT_BYTES = {"cpu": 256 * MiB, "gpu": 2 * GiB, "cuda": 2 * GiB, "rocm": 2 * GiB, "tpu": 2 * GiB}
DEFAULT_REPEATS = 10
_METHOD = "jit(dst.at[:].set(src)), dst donated: one HLO copy, reads n bytes, writes n bytes"


@dataclass(frozen=True)
class BandwidthResult:
    """One bandwidth measurement.

    n_bytes: size of the copied buffer in bytes; each copy moves `bytes_moved` = 2 * n_bytes (read + written).
    times_s: every timed copy, in seconds (after one untimed warm-up call that compiles).
    bytes_per_s: bytes_moved / median(times_s).
    gib_s / gb_s: the same in GiB/s (2**30) and GB/s (10**9).
    platform / device_kind: the device measured, e.g. "gpu" / "NVIDIA L4".
    method: how the copy was made.
    """

    platform: str
    device_kind: str
    n_bytes: int
    bytes_moved: int
    repeats: int
    times_s: tuple[float, ...]
    median_s: float
    bytes_per_s: float
    gib_s: float
    gb_s: float
    method: str = _METHOD

    def to_json(self) -> dict:
        """A JSON-ready dict of every field (times in seconds, rates in bytes/s, GiB/s and GB/s)."""
        return {
            "platform": self.platform,
            "device_kind": self.device_kind,
            "n_bytes": self.n_bytes,
            "bytes_moved": self.bytes_moved,
            "repeats": self.repeats,
            "times_s": list(self.times_s),
            "median_s": self.median_s,
            "bytes_per_s": self.bytes_per_s,
            "gib_s": self.gib_s,
            "gb_s": self.gb_s,
            "method": self.method,
        }


def default_bytes(platform: str) -> int:
    """The default copy size in bytes for a jax platform name ("cpu", "gpu", ...); 256 MiB when unknown."""
    return DEFAULT_BYTES.get(platform, 256 * MiB)


def measure_bandwidth(n_bytes: int | None = None, repeats: int = DEFAULT_REPEATS, *, device=None) -> BandwidthResult:
    """Time `repeats` device-to-device copies of `n_bytes` bytes on `device` (default: jax's first device).

    `n_bytes` defaults to `default_bytes(platform)` and is rounded down to a multiple of 4 (the buffer is uint32).
    Raises InputError for `n_bytes` under 1 MiB or `repeats` under 1.
    """
    import jax
    import jax.numpy as jnp

    device = device if device is not None else jax.devices()[0]
    platform = device.platform
    if n_bytes is None:
        n_bytes = default_bytes(platform)
    if not isinstance(n_bytes, int) or n_bytes < MiB:
        raise InputError(f"bandwidth copy size {n_bytes!r} bytes: expected a whole number >= {MiB} (1 MiB)")
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats {repeats!r}: expected a whole number >= 1")
    n_elements = n_bytes // 4
    n_bytes = n_elements * 4

    copy = jax.jit(lambda src, dst: dst.at[:].set(src), donate_argnums=1)
    src = jax.device_put(jnp.arange(n_elements, dtype=jnp.uint32), device)
    dst = jax.device_put(jnp.zeros((n_elements,), dtype=jnp.uint32), device)
    dst = jax.block_until_ready(copy(src, dst))  # warm-up: compiles and touches every page of dst
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst = jax.block_until_ready(copy(src, dst))
        times.append(time.perf_counter() - t0)
    if int(dst[n_elements - 1]) != n_elements - 1:
        raise RuntimeError("the bandwidth copy did not copy: last element differs")

    median_s = statistics.median(times)
    bytes_moved = 2 * n_bytes
    rate = bytes_moved / median_s
    return BandwidthResult(
        platform=platform,
        device_kind=getattr(device, "device_kind", platform),
        n_bytes=n_bytes,
        bytes_moved=bytes_moved,
        repeats=repeats,
        times_s=tuple(times),
        median_s=median_s,
        bytes_per_s=rate,
        gib_s=rate / GiB,
        gb_s=rate / 1e9,
    )
