"""The Pallas streaming read (bench/profile/stream.py): its sum in interpret mode, its lowering for a TPU on this
CPU machine (`jax.export` with platforms ["tpu"]: a Mosaic lowering error is caught here, before a lease is spent),
its measurement and the per-platform choice of read probes, and scripts/probes/stream_read.py on small sizes. No
speed is asserted: interpret mode runs the kernel in Python."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.errors import InputError
from bench.profile.bandwidth import MiB, column_sums, measure_read_probes, measure_stream_read
from bench.profile.stream import (
    BLOCK_BYTES,
    ROW_BYTES,
    STREAM_COLUMNS,
    block_rows_of,
    stream_column_sums,
    stream_sum,
    vmem_limit_bytes,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_kernel_sums_every_row_of_every_block_in_interpret_mode():
    rows = 96  # three blocks of 32 rows
    x = jnp.arange(rows * STREAM_COLUMNS, dtype=jnp.int32).reshape(rows, STREAM_COLUMNS)
    partial = jax.jit(functools.partial(stream_sum, block_rows=32, interpret=True))(x)
    want = np.asarray(x, dtype=np.int64).reshape(rows // 8, 8, STREAM_COLUMNS).sum(axis=0)
    assert partial.shape == (8, STREAM_COLUMNS) and partial.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(partial, dtype=np.int64), want)  # no wrap at this size
    sums = jax.jit(functools.partial(stream_column_sums, block_rows=32, interpret=True))(x)
    np.testing.assert_array_equal(np.asarray(sums, dtype=np.uint64), column_sums(rows, STREAM_COLUMNS))


def test_the_kernel_wraps_as_the_closed_form_says_and_sees_a_changed_block():
    rows = 4096  # 16 MiB of int32 arange: the column sums pass 2**32 and wrap
    x = jnp.arange(rows * STREAM_COLUMNS, dtype=jnp.int32).reshape(rows, STREAM_COLUMNS)
    f = jax.jit(functools.partial(stream_column_sums, block_rows=1024, interpret=True))
    expected = column_sums(rows, STREAM_COLUMNS)
    assert expected.max() < 2**32 and int(np.sum(np.arange(rows, dtype=np.uint64) * STREAM_COLUMNS)) > 2**32
    np.testing.assert_array_equal(np.asarray(f(x), dtype=np.uint64), expected)
    changed = x.at[3000, 7].add(1)  # one entry of the third block: its column's sum moves by one
    diff = np.asarray(f(changed), dtype=np.uint64) - expected
    assert diff[7] == 1 and np.count_nonzero(diff) == 1
    passes = jax.jit(functools.partial(stream_column_sums, block_rows=1024, passes=3, interpret=True))
    np.testing.assert_array_equal(np.asarray(passes(x), dtype=np.uint64), expected * 3 % 2**32)  # every pass read


@pytest.mark.parametrize(("block_bytes", "passes"), [(b, 1) for b in BLOCK_BYTES] + [(4 * MiB, 32)])
def test_the_kernel_lowers_for_a_tpu_on_this_machine(block_bytes, passes):
    rows = 2 * block_bytes // ROW_BYTES
    f = jax.jit(functools.partial(stream_column_sums, block_rows=block_rows_of(block_bytes), passes=passes))
    exported = jax.export.export(f, platforms=["tpu"])(jax.ShapeDtypeStruct((rows, STREAM_COLUMNS), jnp.int32))
    assert exported.platforms == ("tpu",)
    text = exported.mlir_module()
    assert "tpu_custom_call" in text  # the kernel went through Pallas's Mosaic lowering, not an XLA fallback
    assert exported.out_avals[0].shape == (STREAM_COLUMNS,) and exported.out_avals[0].dtype == jnp.uint32


def test_block_sizes_and_shapes_that_do_not_tile_are_refused():
    assert block_rows_of(4 * MiB) == 1024 and vmem_limit_bytes(8 * MiB) == 2 * 8 * MiB + 2 * 32 * 1024 + 4 * MiB
    with pytest.raises(ValueError, match="passes 0: expected at least 1"):
        stream_sum(jnp.zeros((16, STREAM_COLUMNS), jnp.int32), 8, passes=0, interpret=True)
    for bad in (0, 1000, 16 * 1024):  # not a positive multiple of 32 KiB (8 rows of 4 KiB)
        with pytest.raises(ValueError, match="expected a positive multiple of 32768"):
            block_rows_of(bad)
    x = jnp.zeros((40, STREAM_COLUMNS), jnp.int32)
    with pytest.raises(ValueError, match="divides the rows"):
        stream_sum(x, 16, interpret=True)
    with pytest.raises(ValueError, match=r"expected int32\[rows, 1024\]"):
        stream_sum(jnp.zeros((16, 512), jnp.int32), 8, interpret=True)


def test_the_measurement_counts_every_pass_read_once_and_checks_every_call():
    result = measure_stream_read(MiB + 12345, repeats=2, block_bytes=256 * 1024, interpret=True)
    assert result.n_bytes == result.bytes_moved == MiB  # rounded down to whole blocks; read only
    assert len(result.times_s) == result.repeats == 2 and result.bytes_per_s == pytest.approx(MiB / result.median_s)
    assert "Pallas" in result.method and "interpret mode" in result.method and "0.25 MiB (64 rows)" in result.method
    three = measure_stream_read(MiB, repeats=1, block_bytes=512 * 1024, passes=3, interpret=True)
    assert three.n_bytes == MiB and three.bytes_moved == 3 * MiB and "3 time(s) per call" in three.method
    with pytest.raises(InputError, match="passes 0: expected a whole number >= 1"):
        measure_stream_read(MiB, repeats=1, block_bytes=256 * 1024, passes=0, interpret=True)
    with pytest.raises(InputError, match="expected a whole number >= 1048576"):
        measure_stream_read(MiB // 2, repeats=1, block_bytes=256 * 1024, interpret=True)
    with pytest.raises(InputError, match="expected at least one block"):
        measure_stream_read(MiB, repeats=1, block_bytes=2 * MiB, interpret=True)


def test_the_read_probes_per_platform_and_the_fastest():
    cpu = measure_read_probes(MiB, repeats=1)  # a CPU has no streaming kernel: XLA's reduction alone
    assert len(cpu.probes) == 1 and cpu.fastest is cpu.probes[0] and "jit(x.reshape" in cpu.fastest.method
    both = measure_read_probes(MiB, repeats=1, interpret=True)  # the TPU's pair, the kernel in interpret mode
    assert [("Pallas" in p.method) for p in both.probes] == [False, True]
    assert both.fastest.bytes_per_s == max(p.bytes_per_s for p in both.probes)
    assert [p["method"] for p in both.to_json()] == [p.method for p in both.probes]


CPU_ENV = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin"}


def test_the_tpu_probe_script_runs_on_a_cpu_in_interpret_mode(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts/probes/stream_read.py"), "--mib", "1", "--blocks-kib",
                           "256", "512", "--passes", "1", "2", "--repeats", "2", "--interpret", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env=CPU_ENV, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "stream_read.json").read_text())
    assert [p["probe"] for p in data["probes"]] == ["pallas_stream"] * 4 + ["xla_read", "copy"]  # 2 blocks x 2 passes
    assert all(p["n_bytes"] == MiB for p in data["probes"]) and data["interpret"] is True
    assert data["fastest_read"]["method"] == data["probes"][4]["method"]  # interpret-mode times are not rates
    assert data["datasheet"] is None and data["ceiling"]["chosen"] == "measured read"
    assert "ceiling: roofline ceiling" in done.stdout and "pallas_stream" in done.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts/probes/stream_read.py"), "--blocks-kib", "48"],
                         capture_output=True, text=True, cwd=ROOT, env=CPU_ENV)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("error: --mib 2048") and "multiples of 32 KiB" in bad.stderr
