"""The sweep's rooflines (docs/method.md, "Rooflines"): the copy bandwidth, the read probes, the ceiling and the
matrix-product rate measured once per in-process sweep and recorded in the manifest; each row's bytes per step,
bandwidth roofline shares against the ceiling and prefill FLOP/s against the matrix-product rate, recomputed here
from the row's own numbers; rows without them (archived runs) print as they did. No speed is asserted."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from conftest import bench_captured
from rich.console import Console
from runfolders import cell_samples, make_measured_run

from bench.cli.sweep_cmds import sweep_table
from bench.report import build_report
from bench.runs import failed_cell, open_run, summarize_cell
from bench.runs.ceiling import CEILING_DEFINITION, COPY_DEFINITION, FINDINGS_KEY, roofline_ceiling
from bench.runs.columns import ROOFLINE_COLUMNS, TABLE_COLUMNS, table_columns
from bench.runs.manifest import COPY_END_KEY, drift_pct
from bench.sweep.rates import RATES_KEY, DeviceRates, drift_lines, rates_of, with_rooflines
from model.config import TINY
from model.flops import prefill_chunk, prefill_flops

RATES = DeviceRates(bandwidth_bytes_s=1.5 * 2**30, matmul_flop_s=5e9, measured={},
                    ceiling=roofline_ceiling(2.0 * 2**30, "a read probe", "cpu", copy_bytes_s=1.5 * 2**30))


def test_an_in_process_sweep_records_its_rates_and_every_row_its_rooflines(tiny_checkpoint, tmp_path, monkeypatch,
                                                                           capsys):  # fmt: skip
    runs = tmp_path / "runs"
    code, out, _ = bench_captured(["sweep", "--inputs", "20,41", "--max-new-tokens", "4", "--repeats", "1",
                                   "--checkpoint", str(tiny_checkpoint), "--runs-dir", str(runs), "--name", "r",
                                   "--compile-cache", "off", "--order", "sequential"], capsys)  # fmt: skip
    assert code == 0  # sequential: one rate measurement, every cell divided by it (interleaved: test_sweep.py)
    (folder,) = runs.iterdir()
    manifest = json.loads((folder / "manifest.json").read_text())
    bw, mm = manifest[RATES_KEY]["copy_bandwidth"], manifest[RATES_KEY]["matmul"]
    assert bw["bytes_per_s"] > 0 and bw["bytes_per_s"] == pytest.approx(bw["bytes_moved"] / bw["median_s"])
    assert mm["flop_s"] > 0 and mm["flop_s"] == pytest.approx(2 * mm["m"] * mm["n"] * mm["k"] / mm["median_s"])
    assert mm["dtype"] == manifest["dtype_policy"]["compute_dtype"] == "float32"
    read = manifest[RATES_KEY]["read_bandwidth"]
    assert read["bytes_moved"] == read["n_bytes"] > 0 and read["bytes_per_s"] == pytest.approx(
        read["n_bytes"] / read["median_s"])  # read only: n bytes, where the copy moves 2 n
    rates = rates_of(open_run(folder).typed_manifest.extra)
    assert rates is not None and rates.bandwidth_bytes_s == bw["bytes_per_s"] and rates.matmul_flop_s == mm["flop_s"]
    assert rates.read_bandwidth_bytes_s == read["bytes_per_s"] == manifest[RATES_KEY]["read_probes"][0]["bytes_per_s"]
    ceiling = manifest[RATES_KEY]["ceiling"]  # a CPU: no datasheet, so the fastest read is the denominator
    assert ceiling["bytes_per_s"] == read["bytes_per_s"] and ceiling["chosen"] == "measured read"
    assert ceiling["definition"] == CEILING_DEFINITION and ceiling["copy_bytes_s"] == bw["bytes_per_s"]
    assert rates.ceiling.bytes_per_s == read["bytes_per_s"] and isinstance(manifest[RATES_KEY][FINDINGS_KEY], list)
    assert rates.line in (folder / "run.log").read_text()  # printed once, before the first cell
    end = manifest[RATES_KEY][COPY_END_KEY]  # measured again after the last cell, as the start's
    assert end["bytes_per_s"] == pytest.approx(end["bytes_moved"] / end["median_s"]) and end["n_bytes"] == bw["n_bytes"]
    assert drift_lines(bw["bytes_per_s"], end["bytes_per_s"])[0] in (folder / "run.log").read_text()
    assert "GiB/s" in rates.line and "GFLOP/s" in rates.line and "roofline ceiling" in rates.line
    cells = open_run(folder).cells()
    for c in cells:
        assert c.bytes_per_step == manifest["decode_bytes"][str(c.input_tokens)]["total"]
        assert c.roofline_share_pct == pytest.approx(c.bytes_per_step * c.gauge_tok_s_median / read["bytes_per_s"] * 100)
        assert c.device_roofline_share_pct == pytest.approx(
            c.bytes_per_step * c.device_gauge_tok_s_median / read["bytes_per_s"] * 100)
        chunk = prefill_chunk(TINY, c.bucket)  # the chunk the engine's prefill ran at the cell's bucket
        assert c.prefill_flops == prefill_flops(TINY, c.input_tokens, chunk, cache_len=c.bucket + 4, bucket=c.bucket)
        assert c.prefill_flop_s == pytest.approx(c.prefill_flops / (c.prefill_ms_median / 1000))
        assert c.prefill_matmul_share_pct == pytest.approx(c.prefill_flop_s / mm["flop_s"] * 100)
    assert {c.input_tokens for c in cells} == {20, 41} and all(c.prefill_flops > 0 for c in cells)
    assert "device-loop roofline %" in out and "prefill matmul %" in out  # the printed table, whole (a pipe)
    assert f"{cells[0].roofline_share_pct:,.1f}" in out and "…" not in out


def test_the_arithmetic_and_its_gaps():
    row = summarize_cell(cell_samples(41), max_new_tokens=8, bucket=64)
    done = with_rooflines(row, bytes_per_step=3 * 2**20, prefill_flops=10**9, rates=RATES)
    assert done.roofline_share_pct == pytest.approx(3 * 2**20 * row.gauge_tok_s_median / (2.0 * 2**30) * 100)
    assert done.device_roofline_share_pct is None  # no device loop in this cell
    assert done.prefill_flop_s == pytest.approx(1e9 / (row.prefill_ms_median / 1000))
    assert done.prefill_matmul_share_pct == pytest.approx(done.prefill_flop_s / 5e9 * 100)
    no_flops = with_rooflines(row, bytes_per_step=100, prefill_flops=None, rates=RATES)
    assert no_flops.prefill_flop_s is None and no_flops.prefill_matmul_share_pct is None
    failed = failed_cell(41, "out of memory")
    assert with_rooflines(failed, bytes_per_step=100, prefill_flops=10, rates=RATES) == failed
    assert rates_of({}) is None and rates_of({RATES_KEY: {"copy_bandwidth": {"bytes_per_s": 0}}}) is None


def test_the_drift_after_the_last_cell_is_one_line_and_a_warning_past_ten_percent():
    gib = 2.0**30
    assert drift_pct(20 * gib, 22 * gib) == pytest.approx(10.0) and drift_pct(20 * gib, 17 * gib) == pytest.approx(-15.0)
    line, warning = drift_lines(20 * gib, 22 * gib)  # 10%: said, not warned
    assert line == ("device copy bandwidth after the last cell: 22.00 GiB/s, +10.0% against the 20.00 GiB/s "
                    "measured before the first cell") and warning is None
    for end, said in ((22.1, "+10.5%"), (17.0, "-15.0%")):
        line, warning = drift_lines(20 * gib, end * gib)
        assert said in line and warning is not None and warning.startswith(f"warning: the copy bandwidth moved {said}")
    with pytest.raises(ValueError, match="expected bytes/s > 0"):
        drift_pct(0.0, 1.0)


def test_measure_rates_records_the_read_probes_and_the_ceiling_beside_the_copy(monkeypatch):
    from bench.profile import bandwidth
    from bench.sweep.rates import measure_rates

    monkeypatch.setitem(bandwidth.DEFAULT_BYTES, "cpu", 4 * bandwidth.MiB)  # small: no speed is asserted
    rates = measure_rates("float32")
    copy, read = rates.measured["copy_bandwidth"], rates.measured["read_bandwidth"]
    assert copy["bytes_moved"] == 2 * read["bytes_moved"] == 2 * read["n_bytes"] == 8 * bandwidth.MiB
    assert rates.bandwidth_bytes_s == copy["bytes_per_s"] and rates.read_bandwidth_bytes_s == read["bytes_per_s"]
    assert read["method"] != copy["method"] and [p["method"] for p in rates.measured["read_probes"]] == [read["method"]]
    assert rates.ceiling.bytes_per_s == read["bytes_per_s"] and rates.ceiling.read_probe == read["method"]
    again = rates_of({RATES_KEY: dict(rates.measured)})  # as a resumed sweep reads its manifest
    assert again == rates and f"roofline ceiling {read['bytes_per_s'] / 2**30:,.1f} GiB/s" in again.line


def test_rates_of_a_manifest_with_and_without_the_ceiling():
    copy = {"bytes_per_s": 2.0 * 2**30, "n_bytes": 256 * 2**20, "device_kind": "cpu"}
    matmul = {"flop_s": 5e9, "m": 8, "k": 16, "n": 32, "dtype": "float32"}
    old = rates_of({RATES_KEY: {"copy_bandwidth": copy, "matmul": matmul}})  # recorded before the read probe
    assert old is not None and old.bandwidth_bytes_s == 2.0 * 2**30 and old.read_bandwidth_bytes_s is None
    assert old.ceiling.definition == COPY_DEFINITION and old.ceiling.bytes_per_s == 2.0 * 2**30
    assert "predates the read-rate ceiling" in old.line
    read = {"bytes_per_s": 3.0 * 2**30, "n_bytes": 256 * 2**20, "method": "xla read"}
    between = rates_of({RATES_KEY: {"copy_bandwidth": copy, "matmul": matmul, "read_bandwidth": read}})
    assert between.read_bandwidth_bytes_s == 3.0 * 2**30 and between.ceiling.definition == COPY_DEFINITION
    ceiling = roofline_ceiling(3.0 * 2**30, "xla read", "cpu", copy_bytes_s=2.0 * 2**30)
    new = rates_of({RATES_KEY: {"copy_bandwidth": copy, "matmul": matmul, "read_bandwidth": read,
                                "ceiling": ceiling.to_json()}})  # fmt: skip
    assert new.ceiling == ceiling and "copy bandwidth 2.00 GiB/s" in new.line
    for bad in ({"bytes_per_s": 0}, {"bytes_per_s": "fast"}, None):
        odd = rates_of({RATES_KEY: {"copy_bandwidth": copy, "matmul": matmul, "read_bandwidth": bad}})
        assert odd is not None and odd.read_bandwidth_bytes_s is None and odd.ceiling.read_bytes_s is None
    # one denominator per run: a run recorded before the ceiling keeps its shares against its copy
    row = summarize_cell(cell_samples(41), max_new_tokens=8, bucket=64)
    by_copy = with_rooflines(row, bytes_per_step=3 * 2**20, prefill_flops=10**9, rates=between)
    by_ceiling = with_rooflines(row, bytes_per_step=3 * 2**20, prefill_flops=10**9, rates=new)
    assert by_copy.roofline_share_pct == pytest.approx(3 * 2**20 * row.gauge_tok_s_median / (2.0 * 2**30) * 100)
    assert by_ceiling.roofline_share_pct == pytest.approx(by_copy.roofline_share_pct * 2 / 3)


def _terminal(rows) -> str:
    buf = io.StringIO()
    Console(file=buf, width=300).print(sweep_table(rows))
    return buf.getvalue()


def test_rows_without_rooflines_print_as_before_and_rows_with_them_show_them(tmp_path: Path):
    runs = tmp_path / "runs"
    old = make_measured_run(runs, "old", inputs=(41, 521))
    rows = old.cells()
    assert not any(k in r.to_dict() for r in rows for k in (c.key for c in ROOFLINE_COLUMNS))  # absent, not null
    assert table_columns(rows) == TABLE_COLUMNS and "roofline" not in _terminal(rows)
    new = make_measured_run(runs, "new", inputs=(41, 521))
    for r in new.cells():
        new.append_cell(with_rooflines(r, bytes_per_step=1_234_567, prefill_flops=2 * 10**9, rates=RATES))
    done = new.cells()
    text = _terminal(done)
    assert "roofline %" in text and "prefill matmul %" in text
    share = f"{done[0].roofline_share_pct:,.1f}"
    assert share in text and "device-loop roofline" not in text  # shown only where a row has it
    md = build_report([new.path], tmp_path / "out", runs_dir=runs).markdown.read_text()
    rooflines = md.split("**rooflines: ")[1]  # the run's own table
    header = next(line for line in rooflines.splitlines() if line.startswith("| input tokens"))
    assert header == "| input tokens | bytes/step | roofline % | prefill GFLOP/s | prefill matmul % |"
    assert f"| 41 | 1,234,567 | {share} |" in rooflines  # no device-loop column: no cell has one
    rows_csv = (tmp_path / "out" / "rows.csv").read_text()
    assert "bytes_per_step" in rows_csv.splitlines()[0] and "1234567" in rows_csv
    assert "after the last" not in rooflines  # the run recorded no copy bandwidth after its last cell
    new.update_manifest(rates={"copy_bandwidth": {"bytes_per_s": 20 * 2**30},
                               "copy_bandwidth_end": {"bytes_per_s": 17 * 2**30}})  # fmt: skip
    md = build_report([new.path], tmp_path / "out-end", runs_dir=runs).markdown.read_text()
    tables = md.split("**rooflines: ")[1]
    assert ("copy bandwidth 20.00 GiB/s before the first cell, 17.00 GiB/s after the last (-15.0%): how far this host "
            "drifted while the cells ran.") in tables
    assert ("the run's roofline ceiling (roofline ceiling 20.0 GiB/s (21.5 GB/s) = device copy; this run predates the "
            "read-rate ceiling") in tables  # a run without a recorded ceiling says its shares are against its copy
    old_md = build_report([old.path], tmp_path / "out-old", runs_dir=runs).markdown.read_text()
    assert "rooflines: " not in old_md  # an archived run's report is what it was
    assert "bytes_per_step" not in (tmp_path / "out-old" / "rows.csv").read_text()
    assert "bytes_per_step" not in dataclasses.replace(done[0], bytes_per_step=None).to_dict()
