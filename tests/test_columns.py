"""One column list for the sweep cell: the terminal table, the gpu-run summary, the report's markdown and its CSV
print the same cell the same way (bench/runs/columns.py), and a published row (medians only) prints everywhere."""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import shutil
import types
from pathlib import Path

from rich.console import Console
from runfolders import REFERENCE_RUNS, cell_samples, make_measured_run, make_sample

from bench.cli.sweep_cmds import _print_table, sweep_table
from bench.gpurun.summary import summary_lines
from bench.report import build_report, rate_text
from bench.runs import failed_cell, open_run, summarize_cell
from bench.runs.ceiling import roofline_ceiling
from bench.runs.columns import (
    CSV_COLUMNS,
    DASH,
    GAUGE,
    HOST_OVERHEAD,
    ROOFLINE_SHARE,
    TABLE_COLUMNS,
    TTFT,
    VALID,
    fmt_num,
    plain_table,
    roofline_findings,
    table_columns,
    table_notes,
)


def _cell(size: int = 2057, **changes):
    row = summarize_cell(cell_samples(size, cold=True), max_new_tokens=8, bucket=2560)
    return dataclasses.replace(row, **changes)


def _terminal(rows) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200).print(sweep_table(rows))
    return buf.getvalue()


def test_one_number_format_with_one_dash() -> None:
    assert [fmt_num(x) for x in (12.9, 13.0, 12.43, 1466.0, None)] == ["12.9", "13.0", "12.43", "1,466.0", DASH]
    assert [fmt_num(2057, 0), fmt_num(12552.94, 1), fmt_num(None, 1)] == ["2,057", "12,552.9", DASH]


def test_a_cell_prints_the_same_in_the_terminal_the_summary_and_the_report() -> None:
    cell = _cell()
    texts = [c.text(cell) for c in TABLE_COLUMNS]
    gauge = GAUGE.text(cell)
    assert gauge == f"{fmt_num(cell.gauge_tok_s_median)} ({fmt_num(cell.gauge_tok_s_min)}–{fmt_num(cell.gauge_tok_s_max)})"
    assert texts[0] == "2,057" and texts[1] == "2,560" and texts[-1] == "yes"
    terminal = _terminal([cell])
    plain = plain_table(TABLE_COLUMNS, [cell])
    for text in texts:
        assert text in terminal and text in plain[1]
    assert all(col.table_header in terminal and col.table_header in plain[0] for col in TABLE_COLUMNS)
    assert rate_text(cell, "gauge") == gauge  # the report's and `bench compare`'s rate text: the same column


def test_a_narrow_terminal_wraps_the_sweep_table_and_cuts_nothing() -> None:
    rows = [_cell(41, bucket=64), _cell(2057, valid=False, invalid_reason="repeat 0 degenerate: a 1-token loop")]
    buf = io.StringIO()
    Console(file=buf, width=120).print(sweep_table(rows))
    out = buf.getvalue()
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 120
    pieces = set(out.replace("│", " ").split())

    def printed(word: str) -> bool:  # whole, or folded into consecutive pieces on the lines below
        return word in pieces or any(word.startswith(p) and printed(word[len(p):]) for p in pieces if 0 < len(p) < len(word))

    for row in rows:
        for col in TABLE_COLUMNS:
            for word in col.text(row).split():
                assert printed(word), (col.table_header, word)


def test_the_plain_table_aligns_each_column_to_its_widest_entry() -> None:
    rows = [_cell(41, bucket=64), _cell(2057, valid=False, invalid_reason="repeat 0 degenerate: loop")]
    lines = plain_table(TABLE_COLUMNS, rows, indent="  ")
    assert len(lines) == 3 and all(line.startswith("  ") and line == line.rstrip() for line in lines)
    valid_at = lines[0].index("valid")  # the text column is left-aligned under its header
    assert [line[valid_at:] for line in lines[1:]] == ["yes", "NO: repeat 0 degenerate: loop"]
    gauge_end = lines[0].index("gauge tok/s (min–max)") + len("gauge tok/s (min–max)")
    for line in lines[1:]:  # numbers are right-aligned: each ends where its header ends
        assert line[gauge_end - 1] == ")" and line[gauge_end] == " "
    assert lines[1].split()[:2] == ["41", "64"] and lines[2].split()[:2] == ["2,057", "2,560"]


def test_published_rows_and_failed_cells_print_without_spreads() -> None:
    published = open_run(REFERENCE_RUNS[0]).cells()  # medians only: no min or max
    terminal = _terminal(published)
    body = terminal.split("┡")[1]  # below the headers
    assert "12.43" in body and "12.9 " in body and "–" not in body  # no spread without raw samples
    failed = failed_cell(3593, "out of memory", bucket=4096)
    assert [c.text(failed) for c in (GAUGE, TTFT)] == [DASH, DASH]
    assert VALID.text(failed) == "NO: failed: out of memory" and rate_text(failed, "gauge") == "failed"
    assert plain_table(TABLE_COLUMNS, [failed])[1].split()[:2] == ["3,593", "4,096"]


def test_the_gpu_run_summary_prints_the_terminal_columns(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path / "runs", "summary", inputs=(41, 521))
    published = Path(shutil.copytree(REFERENCE_RUNS[0], tmp_path / REFERENCE_RUNS[0].name))
    (published / "profile.json").unlink()  # the published profile's shape is not one the gpu-run summary prints
    ctx = types.SimpleNamespace(device_line="device: cpu", policy_line="device policy: x", steps=[],
                                bandwidth_lines=[], runs=[run.path, published], elapsed=lambda: 1.0,
                                budget=10.0, outdir=tmp_path)  # fmt: skip
    lines = summary_lines(ctx, 0)
    headers = [ln for ln in lines if ln.strip().startswith("input tokens")]
    assert len(headers) == 2 and all(c.table_header in headers[0] for c in TABLE_COLUMNS)
    rows = plain_table(TABLE_COLUMNS, run.cells(), indent="  ")
    assert rows[1] in lines and rows[2] in lines
    assert any(ln.strip().startswith("41 ") and "12.43" in ln for ln in lines)  # the published run's medians


def test_the_report_csv_holds_every_csv_column_unrounded(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path / "runs", "csv", inputs=(41,))
    report = build_report([run.path], tmp_path / "out")
    with open(report.out_dir / "sweep.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    fields = [f for c in CSV_COLUMNS for f in c.csv_fields]
    assert list(row) == ["input_tokens", *(f"{run.name}:{f}" for f in fields)]
    (cell,) = run.cells()
    assert float(row[f"{run.name}:gauge_tok_s_median"]) == cell.gauge_tok_s_median
    assert row[f"{run.name}:valid"] == str(cell.valid) and row[f"{run.name}:status"] == "ok"


# ---- footnotes under the table: figures that look impossible, explained ---------------------------------------------
def _both_loops(n: int, host: float, device: float) -> list:
    """A cell's samples of both decode loops: host loop at `host` tok/s (cold, warm-up, three timed), device loop
    at `device` tok/s (warm-up, three timed; no per-step times, one block each)."""
    out = cell_samples(n, gauge=host, cold=True)
    for kind, r, j in (("warmup-device", 0, 1.0), ("timed-device", 0, 0.99), ("timed-device", 1, 1.0),
                       ("timed-device", 2, 1.01)):  # fmt: skip
        s = make_sample(n, kind, r, gauge=device * j)
        out.append(dataclasses.replace(s, step_ms=[], block_ms=[s.decode_ms]))
    return out


SURPRISING = {  # input tokens: (host tok/s, device tok/s, roofline %, device-loop roofline %, prefill matmul %)
    41: (20.0, 25.0, 102.9, 135.8, 40.0),  # above both rooflines
    521: (20.0, 19.0, 100.0, 99.0, 104.25),  # exactly 100 is not above; the prefill is; the device loop is slower
    2057: (20.0, 21.0, 90.0, 95.0, 50.0),  # unremarkable
}


def _surprising_samples_and_cells() -> list:
    """(samples, cell) per input size of `SURPRISING`, the cells as a TPU sweep of both loops records them."""
    out = []
    for n, (host, device, roof, device_roof, prefill) in SURPRISING.items():
        samples = _both_loops(n, host, device)
        cell = summarize_cell(samples, max_new_tokens=8, bucket=2560)
        out.append((samples, dataclasses.replace(cell, roofline_share_pct=roof, device_roofline_share_pct=device_roof,
                                                 prefill_matmul_share_pct=prefill)))  # fmt: skip
    return out


def _surprising_cells() -> list:
    return [cell for _, cell in _surprising_samples_and_cells()]


def test_shares_above_100_and_a_negative_host_overhead_get_one_line_each() -> None:
    rows = _surprising_cells()
    roof, prefill, overhead = table_notes(table_columns(rows), rows)  # no ceiling: one finding naming the cells
    assert roof.startswith("finding: roofline % above 100 (41: 102.9, device loop 41: 135.8): the step read its "
                           "bytes faster than the rate it is a share of; this run records no ceiling")
    # 521 at exactly 100 is not above it
    assert prefill.startswith("note: prefill matmul % above 100 (521: 104.2): ") and "probe shape" in prefill
    below = HOST_OVERHEAD.text(rows[1])
    assert rows[1].host_overhead_ms < 0 and rows[0].host_overhead_ms > 0 and rows[2].host_overhead_ms > 0
    assert overhead == (f"note: host overhead ms/step below 0 (521: {below}): the device loop was slower per step "
                        "than the host loop (noise, or a different compiled program).")  # fmt: skip
    assert table_notes(TABLE_COLUMNS, rows) == []  # only for the columns a table shows
    assert table_notes(table_columns(rows), rows[2:]) == []
    batched = [dataclasses.replace(rows[0], batch=8)]
    assert table_notes([ROOFLINE_SHARE], batched)[0].startswith("finding: roofline % above 100 (41x8: 102.9): ")


CEILING = roofline_ceiling(25 * 2**30, "a read probe", "cpu", copy_bytes_s=20 * 2**30)
"""A CPU run's ceiling: its fastest read, 25 GiB/s (no datasheet for a CPU)."""


def test_a_share_above_100_of_the_ceiling_is_a_finding_per_cell_and_loop() -> None:
    rows = [dataclasses.replace(r, bytes_per_step=2**30) for r in _surprising_cells()]
    cols = table_columns(rows)
    host, device, *others = table_notes(cols, rows, ceiling=CEILING)
    assert host.startswith("finding: roofline share 102.9% above 100 at cell 41 (host loop): the step read 1.074 GB x "
                           "20.00 tok/s = 20.0 GiB/s (21.5 GB/s), above the measured read 25.0 GiB/s")
    assert device.startswith("finding: roofline share 135.8% above 100 at cell 41 (device loop): ")
    assert "no datasheet figure for cpu" in host and "or the probe was slowed" in host
    assert others == table_notes(cols, rows)[1:]  # the other notes do not change
    found = roofline_findings(rows, CEILING)
    assert [(f.cell, f.loop, f.share_pct) for f in found] == [("41", "host loop", 102.9), ("41", "device loop", 135.8)]
    assert table_notes([ROOFLINE_SHARE], rows, ceiling=CEILING) == [host]
    # a cell without bytes per step: still a finding, naming it, never silent
    assert table_notes(cols, _surprising_cells(), ceiling=CEILING) == table_notes(cols, _surprising_cells())
    assert table_notes(cols, rows[2:], ceiling=CEILING) == []  # nothing above 100: no line


def test_the_findings_print_under_every_table_of_a_run_that_recorded_its_ceiling(tmp_path: Path, capsys) -> None:
    run = make_measured_run(tmp_path / "runs", "read", inputs=(), status="running")
    for samples, cell in _surprising_samples_and_cells():
        run.append_samples(samples)
        run.append_cell(dataclasses.replace(cell, bytes_per_step=2**30))
    run.update_manifest(rates={"copy_bandwidth": {"bytes_per_s": 20.0 * 2**30}, "matmul": {"flop_s": 1e11},
                               "read_bandwidth": {"bytes_per_s": 25.0 * 2**30}, "ceiling": CEILING.to_json()})  # fmt: skip
    run.finish("complete")
    _print_table(run, logging.getLogger("test"))
    found = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("finding: roofline share")]
    assert len(found) == 2 and "at cell 41 (host loop)" in found[0] and "at cell 41 (device loop)" in found[1]
    ctx = types.SimpleNamespace(device_line="device: tpu", policy_line="device policy: x", steps=[],
                                bandwidth_lines=[], runs=[run.path], elapsed=lambda: 1.0, budget=10.0,
                                outdir=tmp_path)  # fmt: skip
    assert all(f"  {line}" in summary_lines(ctx, 0) for line in found)
    md = build_report([run.path], tmp_path / "out").markdown.read_text()
    assert all(f"- {line}" in md for line in found)  # under the rooflines table


def test_the_footnotes_print_under_the_terminal_table_and_the_gpu_run_summary(tmp_path: Path, capsys) -> None:
    run = make_measured_run(tmp_path / "runs", "notes", inputs=(), status="running")
    for samples, cell in _surprising_samples_and_cells():
        run.append_samples(samples)
        run.append_cell(cell)
    run.finish("complete")
    _print_table(run, logging.getLogger("test"))
    out = capsys.readouterr().out
    notes = [ln for ln in out.splitlines() if ln.startswith(("note: ", "finding: "))]
    assert [n.split(" (")[0] for n in notes] == ["finding: roofline % above 100", "note: prefill matmul % above 100",
                                                 "note: host overhead ms/step below 0"]  # fmt: skip
    ctx = types.SimpleNamespace(device_line="device: tpu", policy_line="device policy: x", steps=[],
                                bandwidth_lines=[], runs=[run.path], elapsed=lambda: 1.0, budget=10.0,
                                outdir=tmp_path)  # fmt: skip
    lines = summary_lines(ctx, 0)
    assert [f"  {n}" for n in notes] == [ln for ln in lines if ln.startswith(("  note: ", "  finding: "))]
    md = build_report([run.path], tmp_path / "out").markdown.read_text()
    assert "- finding: roofline % above 100 (41: 102.9, device loop 41: 135.8): the step read its bytes faster" in md
    assert "- prefill matmul % above 100 (521: 104.2): " in md  # under the rooflines table
    below = HOST_OVERHEAD.text(run.cells()[1])
    assert f"- CPU: host overhead ms/step below 0 (521: {below}): the device loop was slower" in md  # decode loops
