"""How much memory the live device (or, where it reports none, the host) can hold for this process.

The one reading of it for every memory bound checked before work starts: a batch's and the decode slots' KV
cache beside the weights (`model.engine.Engine.check_batch`, `check_slots`) and dummy weights drawn on the device
(`model.random_weights.check_fits`).
"""

from __future__ import annotations

import os

import jax

from model.errors import EngineError


def _host_available_bytes() -> int | None:
    """Host memory available to a new allocation (bytes): MemAvailable of /proc/meminfo, else the available
    physical pages (os.sysconf); None when neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_capacity(weight_bytes: int, device=None) -> tuple[int, str]:
    """(bytes, where) the live device (default: this process's first, `jax.local_devices()[0]`) can hold for this
    process, weights included: the allocator's `bytes_limit` of `device.memory_stats()` where the device reports it
    (GPUs), else the host's available memory plus `weight_bytes` (the weights are already loaded there, so no
    longer "available"). Raises EngineError when neither can be read."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # backends without the call raise, others return None
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"of {device.platform} memory (bytes_limit)"
    host = _host_available_bytes()
    if host is None:
        raise EngineError("cannot tell how much memory a batch may use: the device reports no memory_stats and "
                          "the host neither /proc/meminfo nor os.sysconf pages")  # fmt: skip
    return host + weight_bytes, "of host memory (MemAvailable + the weights already loaded)"
