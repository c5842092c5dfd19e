"""Bandwidth: the copy and the read-only probe move what they say, the copy lands near a numpy copy of the same size,
the read probe's known result, and the roofline arithmetic.

No test of `make test` asserts a speed: the numpy comparison (a consistency check with a wide margin: same machine,
same size, same moment, which catches a copy that XLA elided, far too fast, or one that measures page faults, far
too slow) is a canary, run and recorded by `make canary`, since a busy host has moved it past its margin.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from bench.errors import InputError
from bench.profile.bandwidth import (MiB, READ_COLUMNS, column_sums, default_bytes, measure_bandwidth,
                                     measure_read_bandwidth)
from bench.profile.roofline import roofline_share

N_BYTES = 64 * MiB


def _numpy_copy_bytes_per_s(n_bytes: int, repeats: int) -> float:
    src = np.arange(n_bytes // 4, dtype=np.uint32)  # written, so no page is the shared zero page
    dst = np.ones_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * n_bytes / statistics.median(times)


def test_bandwidth_counts_read_and_written_bytes_over_the_median():
    result = measure_bandwidth(N_BYTES, repeats=5)
    assert result.n_bytes == N_BYTES and result.bytes_moved == 2 * N_BYTES
    assert len(result.times_s) == 5 == result.repeats
    assert min(result.times_s) <= result.median_s <= max(result.times_s)
    assert result.bytes_per_s == pytest.approx(2 * N_BYTES / result.median_s)
    assert result.gib_s == pytest.approx(result.bytes_per_s / 2**30)
    assert result.gb_s == pytest.approx(result.bytes_per_s / 1e9)
    assert result.platform == "cpu" and result.to_json()["n_bytes"] == N_BYTES


@pytest.mark.canary  # a ratio of two timings: a busy host moved it past 5x (make canary records it)
def test_bandwidth_is_sane_against_a_numpy_copy(canary_figure):
    ours = measure_bandwidth(N_BYTES, repeats=7).bytes_per_s
    numpy = _numpy_copy_bytes_per_s(N_BYTES, repeats=7)
    canary_figure("jax copy", ours / 1e9, unit="GB/s")
    canary_figure("numpy copy", numpy / 1e9, unit="GB/s")
    canary_figure("jax / numpy", ours / numpy, bound="between 0.2 and 5")
    assert numpy / 5 < ours < numpy * 5, f"jax copy {ours / 1e9:.1f} GB/s vs numpy {numpy / 1e9:.1f} GB/s"


def test_bandwidth_is_a_positive_finite_rate_of_positive_times():
    """What host noise cannot break: every repeat took time, and the rate is a finite positive number."""
    import math

    result = measure_bandwidth(N_BYTES, repeats=3)
    assert all(t > 0 for t in result.times_s) and math.isfinite(result.bytes_per_s) and result.bytes_per_s > 0
    read = measure_read_bandwidth(8 * MiB, repeats=2)
    assert all(t > 0 for t in read.times_s) and math.isfinite(read.bytes_per_s) and read.bytes_per_s > 0


def test_read_probe_counts_the_bytes_read_once_over_the_median():
    n_bytes = 8 * MiB
    result = measure_read_bandwidth(n_bytes, repeats=4)
    copy = measure_bandwidth(n_bytes, repeats=1)
    assert result.n_bytes == result.bytes_moved == n_bytes  # read only: half of what a copy of the size moves
    assert copy.bytes_moved == 2 * result.bytes_moved
    assert len(result.times_s) == 4 == result.repeats
    assert result.median_s == statistics.median(result.times_s)
    assert result.bytes_per_s == pytest.approx(n_bytes / result.median_s)
    assert result.gib_s == pytest.approx(result.bytes_per_s / 2**30)
    assert result.gb_s == pytest.approx(result.bytes_per_s / 1e9)
    assert result.platform == "cpu" and result.method != copy.method and "sum" in result.method
    data = result.to_json()
    assert data["bytes_moved"] == n_bytes and data["method"] == result.method and len(data["times_s"]) == 4


def test_read_probe_rounds_its_size_down_to_whole_rows():
    result = measure_read_bandwidth(MiB + 4 * READ_COLUMNS - 4, repeats=1)
    assert result.n_bytes == result.bytes_moved == MiB


def test_read_probe_known_result_is_the_wrapping_column_sums():
    for rows in (1, 256, 5000):  # 5000 rows: the sums wrap past 2**32
        view = np.arange(rows * READ_COLUMNS, dtype=np.uint32).reshape(rows, READ_COLUMNS)
        assert np.array_equal(column_sums(rows), view.sum(axis=0, dtype=np.uint32).astype(np.uint64))
    assert int(column_sums(5000).max()) < 2**32 and int(1024 * 5000 * 4999 // 2) >= 2**32


def test_read_probe_refuses_a_result_that_is_not_the_known_sums(monkeypatch):
    """Every timed pass's column sums are checked: with the expected sums off by one, the probe raises, not times."""
    import bench.profile.bandwidth as bandwidth

    monkeypatch.setattr(bandwidth, "column_sums", lambda rows, columns=READ_COLUMNS: column_sums(rows, columns) + 1)
    with pytest.raises(RuntimeError, match="did not read every byte: a column sum differs"):
        measure_read_bandwidth(MiB, repeats=1)


def test_default_size_per_platform():
    assert default_bytes("cpu") == 256 * MiB
    assert default_bytes("gpu") == 2 * 2**30
    assert default_bytes("something-new") == 256 * MiB


@pytest.mark.parametrize(("n_bytes", "repeats"), [(1024, 3), (N_BYTES, 0)])
def test_bad_sizes_are_input_errors(n_bytes, repeats):
    with pytest.raises(InputError):
        measure_bandwidth(n_bytes, repeats=repeats)
    with pytest.raises(InputError, match="read size|--repeats"):
        measure_read_bandwidth(n_bytes, repeats=repeats)


def test_roofline_share_is_bytes_times_rate_over_bandwidth():
    # The published L4 row: 6,155,450,950 weight bytes x 48.4 tok/s against 279.441 GiB/s is ~1.0 ("~100%").
    share = roofline_share(6_155_450_950, 48.4, 279.441 * 2**30)
    assert share == pytest.approx(6_155_450_950 * 48.4 / (279.441 * 2**30))
    assert 0.95 < share < 1.05
    assert roofline_share(0, 10.0, 1e9) == 0.0
    with pytest.raises(InputError):
        roofline_share(1, 1.0, 0.0)


def test_matmul_rate_counts_2mnk_flop_over_the_median():
    from bench.profile.matmul import measure_matmul_rate

    result = measure_matmul_rate((64, 48, 32), repeats=3)
    assert (result.m, result.n, result.k, result.dtype) == (64, 48, 32, "float32")
    assert result.flops == 2 * 64 * 48 * 32 and len(result.times_s) == 3 == result.repeats
    assert min(result.times_s) <= result.median_s <= max(result.times_s)
    assert result.flop_s > 0 and result.flop_s == pytest.approx(result.flops / result.median_s)
    assert result.gflop_s == pytest.approx(result.flop_s / 1e9)
    assert result.platform == "cpu" and result.to_json()["flops"] == result.flops


@pytest.mark.parametrize(("size", "repeats", "dtype"), [(8, 3, "float32"), (64, 0, "float32"), (64, 3, "float99")])
def test_bad_matmul_settings_are_input_errors(size, repeats, dtype):
    from bench.profile.matmul import measure_matmul_rate

    with pytest.raises(InputError):
        measure_matmul_rate(size, repeats=repeats, dtype=dtype)


# ---- probe sizes within the device's free memory (26B-A4B w4 on the 16 GB v5e left 0.26 GB free) ---------------
class _Device:
    """A device reporting `memory_stats` as a TPU's does."""

    def __init__(self, limit: int, in_use: int):
        self.stats = {"bytes_limit": limit, "bytes_in_use": in_use}

    def memory_stats(self):
        return self.stats


def test_a_probe_buffer_fits_the_device_s_free_memory():
    from bench.profile.bandwidth import GiB, MiB, fitting_bytes

    assert fitting_bytes(2 * GiB, _Device(16 * GiB, 1 * GiB), buffers=2) == 2 * GiB  # room for two
    free = 16_909_336_064 - 16_646_000_000  # about 0.26 GB free
    assert fitting_bytes(2 * GiB, _Device(16_909_336_064, 16_646_000_000), buffers=2) == 32 * MiB
    assert 2 * 32 * MiB <= free * 0.5 < 2 * 64 * MiB
    assert fitting_bytes(2 * GiB, _Device(16 * GiB, 15 * GiB)) == 512 * MiB
    assert fitting_bytes(2 * GiB, None) == 2 * GiB and fitting_bytes(256 * MiB, object()) == 256 * MiB


def test_an_out_of_memory_error_is_one_line_and_exit_1(monkeypatch, capsys):
    import bench.cli as cli

    class JaxRuntimeError(RuntimeError):
        pass

    def boom(*args, **kwargs):
        raise JaxRuntimeError("RESOURCE_EXHAUSTED: E0100: Error allocating device buffer: Attempting to allocate "
                              "2.00G. That was not possible.\nSee https://openxla.org/xla/errors/error_0100")

    monkeypatch.setattr(cli, "app", boom)
    monkeypatch.setattr(cli, "_register", lambda argv: None)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sweep"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.strip().splitlines()) == 1
    assert "ran out of memory (RESOURCE_EXHAUSTED: E0100" in err and "--quant" in err
