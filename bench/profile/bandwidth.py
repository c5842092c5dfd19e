"""Measured memory bandwidth of the live device: the copy and the read probes the roofline's ceiling is chosen from
(docs/method.md, "Rooflines"; bench/runs/ceiling.py).

The bandwidth is that of a large device-to-device copy on the device being benchmarked, in the same process:
bytes read + bytes written, over the median time of one copy. The copy is a jitted `dst.at[:].set(src)` with `dst`
donated: XLA compiles it to one `copy` of `src` into `dst`'s buffer (as the compiled HLO shows on CPU; it cannot
be elided, since `src` is not donated and the result must hold its values), so each call reads n bytes and writes
n bytes, and no call allocates (a fresh output buffer would add page-fault time on CPU and measure the allocator,
not memory: 4-7 GB/s against 25 GB/s for the donated copy on this project's CPU machine). Also avoided: `x + 0`
(XLA simplifies it to `x`, no copy at all) and timing the first call (it compiles).

On this project's CPU machines a numpy copy gives about 27 GB/s on one core
(docs/method.md, "Measured facts behind the defaults"); the test suite checks that this measurement lands within a
small factor of a numpy copy measured the same way.

Beside the copy, the read probes measure read-only streams: bytes read / the median time of one call that must
read every byte of an n-byte buffer. A decode step only reads its weights, and a read can be faster than a copy (no
write traffic): on the TPU v5e the archived E2B decode steps read at up to 137% of the copy measured in the same
run, so the copy is not the ceiling. `measure_read_bandwidth` is XLA's read-only reduction (its form, and why, in
its docstring); `measure_stream_read` is the Pallas streaming read (bench/profile/stream.py), which on a TPU walks
the buffer many times per call and reaches the chip's streaming rate where XLA's reduction stops short of it
(`STREAM_PROBES` has the numbers); `measure_read_probes` runs the probes a platform has, and its fastest is the
measured read rate of the roofline's ceiling: max(that rate, the device's datasheet figure) (bench/runs/ceiling.py).
The copy is recorded beside it, never its denominator.

jax is imported only when a probe runs; the ceiling and the share are `bench.runs.ceiling` (no jax, so the report
can use them on archived runs).
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
READ_TILE = (8, 128)
"""The read probe views its uint32 buffer as [rows, 8, 128] (a TPU's native 32-bit tile: `measure_read_bandwidth`)."""
READ_COLUMNS = READ_TILE[0] * READ_TILE[1]
"""Entries of one row of the view (1024): the buffer's size is a multiple of 4 * READ_COLUMNS bytes."""
_READ_METHOD = (f"jit(x.reshape(rows, {READ_TILE[0]}, {READ_TILE[1]}).sum(axis=0)), uint32 wrapping: reads n "
                f"bytes; every column sum checked")  # fmt: skip


@dataclass(frozen=True)
class BandwidthResult:
    """One bandwidth measurement: a copy (`measure_bandwidth`) or a read-only stream (`measure_read_bandwidth`,
    `measure_stream_read`).

    n_bytes: size of the buffer in bytes; each call moves `bytes_moved` bytes: 2 * n_bytes for a copy (read +
    written), n_bytes for a read, passes * n_bytes for a streaming read of several passes per call.
    times_s: every timed call, in seconds (after one untimed warm-up call that compiles).
    bytes_per_s: bytes_moved / median(times_s).
    gib_s / gb_s: the same in GiB/s (2**30) and GB/s (10**9).
    platform / device_kind: the device measured, e.g. "gpu" / "NVIDIA L4".
    method: how the bytes were moved.
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
    """Time `repeats` device-to-device copies of `n_bytes` bytes on `device` (default: this process's first device,
    `jax.local_devices()[0]`: under jax.distributed the others' devices cannot be read back here).

    `n_bytes` defaults to `default_bytes(platform)` and is rounded down to a multiple of 4 (the buffer is uint32).
    Raises InputError for `n_bytes` under 1 MiB or `repeats` under 1.
    """
    import jax
    import jax.numpy as jnp

    device = device if device is not None else jax.local_devices()[0]
    n_bytes = _checked_size("copy", n_bytes, repeats, device.platform, multiple=4, device=device, buffers=2)
    n_elements = n_bytes // 4

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

    return _result(device, n_bytes, 2 * n_bytes, times, _METHOD)


def measure_read_bandwidth(n_bytes: int | None = None, repeats: int = DEFAULT_REPEATS, *,
                           device=None) -> BandwidthResult:  # fmt: skip
    """Time `repeats` read-only passes over an `n_bytes` buffer on `device` (default: this process's first device,
    `jax.local_devices()[0]`).

    `bytes_moved` = n_bytes (read only). `n_bytes` defaults to `default_bytes(platform)`, the copy's size, and is
    rounded down to a multiple of 4 * READ_COLUMNS bytes (4 KiB). Raises InputError for `n_bytes` under 1 MiB or
    `repeats` under 1; RuntimeError when a pass's result is wrong (a read was skipped).

    The pass: the buffer is uint32 `arange(N)`, viewed as [rows, READ_COLUMNS] (a free reshape), summed over the
    rows in wrapping uint32: a [READ_COLUMNS] result whose every entry depends on every row, so no byte can be
    skipped, and each column's sum is known in closed form; every timed pass's result is checked against it. The
    only writes are the reduction's small partial sums, not counted: if anything, the figure is low.

    Why this form: XLA:CPU rewrites a large reduction into a tree of 32-element reduce-windows and splits the
    first (the one that reads the buffer) over the cores, whatever the shape; a reduction over the rows (down the
    columns) then adds whole contiguous rows element-wise, which vectorizes, while a 1-D sum, or a sum along each
    row, adds 32 neighbouring elements per output, which does not keep up with memory. Informal medians on this
    project's 2-core Intel Xeon machine (shared and noisy; 256 MiB, 10 passes each, 2026-12-05), in GB/s read: 1-D
    sum 18-20, sum along rows ([8192, N/8192] or [2, N/2]) 21, the same buffer split by slicing into two halves
    and summed 2.7 (the slices were materialized), [rows, 1024] summed over the rows 28-30 (26-32 for 128 to 65,536
    columns; a max reads at the same rate); numpy on one thread 19 (np.add.reduce), on two threads 27-34 (halves
    in two threads); the donated copy in this module 28 GB/s of read + written bytes, a numpy copy on one core 26.
    Pinned to one core the XLA forms halved and the numpy one did not: XLA uses both cores. The view is
    [rows, 8, 128] (`READ_TILE`, the same bytes and sums as [rows, 1024]): on a TPU v5e (2 GiB, jax 0.10.2,
    2026-12-05) the [rows, 1024] form read 190 GiB/s and [rows, 8, 128] 551 GiB/s (as did a 1-D sum, 545, and a
    bfloat16 max, 556; the copy there: 549 GiB/s of read + written bytes), while on the Xeon both forms read 28-30
    GB/s. Neither is the TPU's ceiling: its decode step's own matrix-vector fusions read 733 GB/s (683 GiB/s).
    """
    import jax
    import jax.numpy as jnp

    device = device if device is not None else jax.local_devices()[0]
    n_bytes = _checked_size("read", n_bytes, repeats, device.platform, multiple=4 * READ_COLUMNS, device=device)
    rows = n_bytes // (4 * READ_COLUMNS)

    read = jax.jit(lambda x: jnp.sum(x.reshape(rows, *READ_TILE), axis=0, dtype=jnp.uint32).reshape(READ_COLUMNS))
    src = jax.device_put(jnp.arange(rows * READ_COLUMNS, dtype=jnp.uint32), device)
    times = _timed_column_sums(read, src, repeats, column_sums(rows),
                               "the bandwidth read did not read every byte: a column sum differs")  # fmt: skip
    return _result(device, n_bytes, n_bytes, times, _READ_METHOD)


def measure_stream_read(n_bytes: int | None = None, repeats: int = DEFAULT_REPEATS, *, block_bytes: int,
                        passes: int = 1, device=None, interpret: bool = False) -> BandwidthResult:  # fmt: skip
    """Time `repeats` calls of the Pallas streaming read (`bench.profile.stream`: HBM -> VMEM block by block,
    summed into a 32 KiB accumulator), each reading an `n_bytes` buffer `passes` times, on `device` (default:
    this process's first device, `jax.local_devices()[0]`).

    `bytes_moved` = passes x n_bytes (read only; the 32 KiB written once per call is not counted). `n_bytes` defaults to
    `default_bytes(platform)` and is rounded down to a multiple of `block_bytes`. `block_bytes`: bytes of one
    block, a multiple of 32 KiB (`bench.profile.stream.BLOCK_BYTES` are the TPU probe's). `interpret=True` runs the
    kernel in Python (the tests, on a CPU; its time says nothing about memory). Raises InputError for `n_bytes`
    under 1 MiB or under one block, or `repeats` under 1; ValueError for a block size that does not tile;
    RuntimeError when a call's result is wrong (a block was skipped). The kernel lowers for TPUs only (Mosaic):
    call it elsewhere with `interpret=True`.
    """
    if not isinstance(passes, int) or passes < 1:
        raise InputError(f"stream read passes {passes!r}: expected a whole number >= 1")
    import functools

    import jax
    import jax.numpy as jnp

    from bench.profile.stream import ROW_BYTES, STREAM_COLUMNS, block_rows_of, stream_column_sums

    device = device if device is not None else jax.local_devices()[0]
    block_rows = block_rows_of(block_bytes)
    n_bytes = _checked_size("stream read", n_bytes, repeats, device.platform, multiple=block_bytes, device=device)
    if n_bytes < block_bytes:
        raise InputError(f"bandwidth stream read of {n_bytes} bytes: expected at least one block ({block_bytes})")
    rows = n_bytes // ROW_BYTES

    read = jax.jit(functools.partial(stream_column_sums, block_rows=block_rows, passes=passes, interpret=interpret))
    src = jax.device_put(jnp.arange(rows * STREAM_COLUMNS, dtype=jnp.int32).reshape(rows, STREAM_COLUMNS), device)
    times = _timed_column_sums(read, src, repeats, column_sums(rows, STREAM_COLUMNS) * passes % 2**32,
                               "the stream read did not read every block: a column sum differs")  # fmt: skip
    method = (f"Pallas TPU kernel: int32[{rows}, {STREAM_COLUMNS}] read HBM -> VMEM {passes} time(s) per call in "
              f"blocks of {block_bytes // MiB if block_bytes % MiB == 0 else block_bytes / MiB} MiB ({block_rows} "
              f"rows), summed into one [8, {STREAM_COLUMNS}] accumulator; every column sum checked"
              + (" (interpret mode)" if interpret else ""))  # fmt: skip
    return _result(device, n_bytes, passes * n_bytes, times, method)


STREAM_PROBES = {"tpu": ((4 * MiB, 32),)}
"""Per platform, the (block bytes, passes per call) of each Pallas streaming read that `measure_read_probes` runs
beside XLA's read; a platform not listed has no Pallas streaming probe (the kernel lowers through Mosaic, for TPUs
only). On the TPU v5e (2 GiB buffer, jax 0.10.2, 2026-12-07; scripts/probes/stream_read.py) the block size did not
matter (2-16 MiB within 1%), the passes did: one pass per call read 560-566 GiB/s (as XLA's read, 562), 4 passes
655-659, 16 passes 690-691 GiB/s (742 GB/s; the decode step's own reads, issue 43: 686 GiB/s), the increment from
4 to 16 passes 703 GiB/s: a call's fixed cost is about 0.6 ms. 32 passes of 2 GiB take about 90 ms a call."""


@dataclass(frozen=True)
class ReadProbes:
    """Every read-only probe `measure_read_probes` ran on one device, and the fastest (the measured read rate of
    docs/method.md, "Rooflines"). probes: the `BandwidthResult`s in the order run; fastest: the one with the most
    bytes read per second."""

    probes: tuple[BandwidthResult, ...]

    @property
    def fastest(self) -> BandwidthResult:
        """The probe with the highest bytes_per_s."""
        return max(self.probes, key=lambda r: r.bytes_per_s)

    def to_json(self) -> list[dict]:
        """Each probe's `BandwidthResult.to_json()`, in the order run."""
        return [r.to_json() for r in self.probes]


def measure_read_probes(n_bytes: int | None = None, repeats: int = DEFAULT_REPEATS, *, device=None,
                        interpret: bool = False) -> ReadProbes:  # fmt: skip
    """The best read-only probes the device's platform has, each over `n_bytes` (default `default_bytes`): XLA's
    read-only reduction (`measure_read_bandwidth`) everywhere, and on a platform in `STREAM_PROBES` (a TPU) the
    Pallas streaming read (`measure_stream_read`) at each of its (block size, passes). `interpret=True` also runs
    the streaming read where the platform has none, in interpret mode (64 KiB blocks, 2 passes: the tests). Same
    errors as the probes."""
    import jax

    device = device if device is not None else jax.local_devices()[0]
    probes = [measure_read_bandwidth(n_bytes, repeats, device=device)]
    streams = STREAM_PROBES.get(device.platform, ()) or (((64 * 1024, 2),) if interpret else ())
    for block, passes in streams:
        probes.append(measure_stream_read(n_bytes, repeats, block_bytes=block, passes=passes, device=device,
                                          interpret=interpret))  # fmt: skip
    return ReadProbes(tuple(probes))


def column_sums(rows: int, columns: int = READ_COLUMNS):
    """The read probes' known result: uint64 [columns], the wrapping 32-bit sums over the rows of
    `arange(rows * columns)` viewed as [rows, columns] (READ_COLUMNS: the XLA read probe's; the stream read's
    int32 buffer gives the same bits). Column j holds i * columns + j for i < rows, so its sum is
    columns * rows (rows - 1) / 2 + rows * j, mod 2**32."""
    import numpy as np

    first = columns * (rows * (rows - 1) // 2) % 2**32  # a Python int: exact at any size
    return (first + rows * np.arange(columns, dtype=np.uint64)) % 2**32


def _timed_column_sums(read, src, repeats: int, expected, failure: str) -> list[float]:
    """Call `read(src)` (a jitted read probe returning its column sums) once untimed (the warm-up: compiles), then
    `repeats` times, each timed to completion; every timed result must equal `expected` (uint64 [columns], as
    `column_sums`). Returns the seconds of each timed call; RuntimeError(`failure`) when a result differs."""
    import jax
    import numpy as np

    jax.block_until_ready(read(src))  # warm-up: compiles
    times, sums = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sums.append(jax.block_until_ready(read(src)))
        times.append(time.perf_counter() - t0)
    if any(not np.array_equal(np.asarray(s, dtype=np.uint64), expected) for s in sums):
        raise RuntimeError(failure)
    return times


PROBE_FREE_SHARE = 0.5
"""The share of the device's free memory a probe's buffers may take when its size is the default: a sweep probes
after the weights are placed, and 26B-A4B `w4` (14.48 GB) left 0.26 GB free on the 16 GB TPU v5e when the 2 GiB
copy asked for a second buffer (2026-12-08, an out-of-memory error). The size is then the largest power of two
of MiB within it, and each probe records its size (`BandwidthResult.n_bytes`)."""


def fitting_bytes(wanted: int, device=None, buffers: int = 1) -> int:
    """`wanted` bytes, or less where the device's free memory (`device.memory_stats()`: bytes_limit less
    bytes_in_use; a device that reports none, as jax's CPU, keeps `wanted`) holds fewer than `buffers` buffers of
    it within `PROBE_FREE_SHARE`: then the largest power of two of MiB that does, at least 1 MiB."""
    stats = device.memory_stats() if device is not None and hasattr(device, "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
        return wanted
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    room = int(free * PROBE_FREE_SHARE) // buffers
    if room >= wanted:
        return wanted
    size = MiB
    while size * 2 <= room:
        size *= 2
    return size


def _checked_size(what: str, n_bytes: int | None, repeats: int, platform: str, *, multiple: int, device=None,
                  buffers: int = 1) -> int:  # fmt: skip
    """`n_bytes` (default: `default_bytes(platform)`, cut to the device's free memory for `buffers` buffers by
    `fitting_bytes`) rounded down to a multiple of `multiple`; InputError for a size under 1 MiB or repeats under
    1 (`what` names the probe in the message: "copy", "read")."""
    if n_bytes is None:
        n_bytes = fitting_bytes(default_bytes(platform), device, buffers)
    if not isinstance(n_bytes, int) or n_bytes < MiB:
        raise InputError(f"bandwidth {what} size {n_bytes!r} bytes: expected a whole number >= {MiB} (1 MiB)")
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats {repeats!r}: expected a whole number >= 1")
    return n_bytes // multiple * multiple


def _result(device, n_bytes: int, bytes_moved: int, times: list[float], method: str) -> BandwidthResult:
    """The BandwidthResult of `times` (seconds per call, each moving `bytes_moved` bytes) on `device`."""
    median_s = statistics.median(times)
    rate = bytes_moved / median_s
    return BandwidthResult(
        platform=device.platform,
        device_kind=getattr(device, "device_kind", device.platform),
        n_bytes=n_bytes,
        bytes_moved=bytes_moved,
        repeats=len(times),
        times_s=tuple(times),
        median_s=median_s,
        bytes_per_s=rate,
        gib_s=rate / GiB,
        gb_s=rate / 1e9,
        method=method,
    )
