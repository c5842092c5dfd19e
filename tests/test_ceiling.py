"""The roofline's denominator (bench/runs/ceiling.py, docs/method.md "Rooflines"): max(fastest measured read,
datasheet figure), the datasheet table by jax device kind, the share against it, the finding a share above 100%
becomes, and manifests recorded with and without the ceiling (older runs keep their copy, and say so)."""

from __future__ import annotations

import json

import pytest

from bench.errors import InputError
from bench.runs.ceiling import (
    CEILING_DEFINITION,
    CEILING_KEY,
    COPY_DEFINITION,
    DATASHEETS,
    Ceiling,
    ceiling_of,
    datasheet_for,
    finding_of,
    roofline_ceiling,
    share_pct,
)

GIB = 2**30
V5E = "TPU v5 lite"


def test_the_datasheet_table_matches_jax_device_kinds_and_cites_each_figure():
    v5e = datasheet_for(V5E)
    assert v5e is not None and v5e.bytes_per_s == 819e9 and "cloud.google.com/tpu/docs/v5e" in v5e.source
    assert datasheet_for(" tpu v5 LITE ") is v5e and datasheet_for("TPU v5e") is v5e
    assert datasheet_for("NVIDIA L4").bytes_per_s == 300e9 and datasheet_for("NVIDIA T4G").bytes_per_s == 320e9
    assert datasheet_for("TPU v5").bytes_per_s == 2765e9  # v5p, as jax names it; not v5e
    for unknown in ("cpu", "TPU v5 lite pro", "", None):
        assert datasheet_for(unknown) is None
    kinds = [k.lower() for d in DATASHEETS for k in d.device_kinds]
    assert len(kinds) == len(set(kinds))  # one figure per kind
    assert all(d.source and d.figure and d.bytes_per_s > 1e11 for d in DATASHEETS)


def test_the_ceiling_is_the_larger_of_the_fastest_read_and_the_datasheet():
    # the TPU v5e of issue 43: XLA's read probe 570 GiB/s, below the datasheet's 819 GB/s (762.7 GiB/s)
    slow = roofline_ceiling(570 * GIB, "xla read", V5E, copy_bytes_s=546 * GIB)
    assert slow.bytes_per_s == 819e9 and slow.chosen == "datasheet" and slow.definition == CEILING_DEFINITION
    assert slow.read_bytes_s == 570 * GIB and slow.copy_bytes_s == 546 * GIB
    assert "819 GB/s" in slow.line and "570.0 GiB/s" in slow.line and "not the denominator" in slow.line
    fast = roofline_ceiling(800e9 * 1.05, "pallas", V5E)  # a probe above the datasheet wins
    assert fast.chosen == "measured read" and fast.bytes_per_s == 840e9
    cpu = roofline_ceiling(30e9, "xla read", "cpu")  # no datasheet: the measured read alone
    assert cpu.chosen == "measured read" and cpu.datasheet is None and "none known for cpu" in cpu.line
    for bad in (0, -1.0, None, "fast"):
        with pytest.raises(InputError, match="expected a positive number"):
            roofline_ceiling(bad, "x", V5E)


def test_the_share_divides_by_the_ceiling_and_a_share_above_100_is_a_finding():
    ceiling = roofline_ceiling(570 * GIB, "xla read", V5E, copy_bytes_s=546 * GIB)
    bytes_per_step, gauge = 4.565e9, 161.4  # dense E2B on the v5e (issue 43): 737 GB/s
    assert share_pct(bytes_per_step, gauge, ceiling.bytes_per_s) == pytest.approx(4.565e9 * 161.4 / 819e9 * 100)
    assert finding_of("41", "host loop", 89.96, bytes_per_step, gauge, ceiling) is None  # at or below 100: none
    assert finding_of("41", "host loop", 100.0, bytes_per_step, gauge, ceiling) is None
    over = finding_of("41", "device loop", 104.2, 4.565e9, 187.0, ceiling)
    assert over is not None and over.step_bytes_s == pytest.approx(4.565e9 * 187.0)
    assert over.line.startswith("finding: roofline share 104.2% above 100 at cell 41 (device loop): the step read "
                                "4.565 GB x 187.00 tok/s = ")
    assert "above the datasheet 762.8 GiB/s (819.0 GB/s)" in over.line and "measured read 570.0 GiB/s" in over.line
    assert over.line.endswith("no device streams faster than its maker's figure.")
    cpu = finding_of("41", "host loop", 101.0, 1e9, 31.0, roofline_ceiling(30e9, "xla read", "cpu"))
    assert "or the probe was slowed" in cpu.line and "no datasheet figure for cpu" in cpu.line
    record = json.loads(json.dumps(over.to_json()))
    assert record["share_pct"] == 104.2 and record["ceiling"]["bytes_per_s"] == 819e9 and record["line"] == over.line
    assert finding_of("41", "host loop", 120.0, None, gauge, ceiling) is None  # inputs unknown: nothing to say
    assert finding_of("41", "host loop", 120.0, bytes_per_step, gauge, None) is None
    with pytest.raises(InputError, match="expected a measured bandwidth > 0"):
        share_pct(1.0, 1.0, 0.0)


def test_a_manifest_with_the_ceiling_reads_it_back_whole():
    ceiling = roofline_ceiling(700 * GIB, "pallas 8 MiB", V5E, copy_bytes_s=546 * GIB)
    manifest = json.loads(json.dumps({"rates": {"copy_bandwidth": {"bytes_per_s": 546 * GIB},
                                                CEILING_KEY: ceiling.to_json()}}))  # fmt: skip
    assert ceiling_of(manifest) == ceiling
    assert Ceiling.from_json({"bytes_per_s": 0, "chosen": "x", "definition": "y"}) is None
    assert Ceiling.from_json({"chosen": "x"}) is None


def test_a_manifest_recorded_before_the_ceiling_falls_back_to_its_copy_and_says_so():
    copy = {"bytes_per_s": 546 * GIB, "device_kind": V5E, "method": "copy"}
    read = {"bytes_per_s": 570 * GIB, "method": "xla read"}
    old = ceiling_of({"rates": {"copy_bandwidth": copy, "read_bandwidth": read, "matmul": {"flop_s": 1e12}}})
    assert old is not None and old.definition == COPY_DEFINITION and old.chosen == "device copy"
    assert old.bytes_per_s == 546 * GIB and old.read_bytes_s == 570 * GIB and old.datasheet is datasheet_for(V5E)
    assert old.current_bytes_s == 819e9 and "predates the read-rate ceiling" in old.line
    # the TPU run's 123% against the copy: the finding says which definition, and the share under the current one
    finding = finding_of("41", "host loop", 123.0, 4.565e9, 161.4, old)
    assert "This run divided its shares by the device copy" in finding.line
    assert f"the share is {4.565e9 * 161.4 / 819e9 * 100:.1f}%" in finding.line
    older = ceiling_of({"rates": {"copy_bandwidth": {"bytes_per_s": 20 * GIB}}})  # no read probe, no device kind
    assert older.read_bytes_s is None and older.datasheet is None and older.current_bytes_s is None
    assert "measured no read rate" in finding_of("41", "host loop", 101.0, 1e9, 25.0, older).line
    for nothing in ({}, {"rates": None}, {"rates": {"copy_bandwidth": {"bytes_per_s": 0}}}, {"rates": {}}):
        assert ceiling_of(nothing) is None
