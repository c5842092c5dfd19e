"""The report's long format: one typed row per (run, cell) with the run's identity keys (absent axes at their
defaults), and every printer (markdown, CSV, JSON Lines, plain text, `bench report --format`) from one column list."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest
from conftest import bench_captured
from runfolders import REFERENCE_RUNS, make_measured_run

from bench.report import build_report
from bench.report.rows import ROW_COLUMNS, SUMMARY_COLUMNS, report_rows, rows_csv, rows_jsonl, rows_markdown, rows_plain
from bench.report.tables import load_runs



@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for ref in REFERENCE_RUNS:
        shutil.copytree(ref, root / ref.name)
    make_measured_run(root, "plain", inputs=(41, 521))
    make_measured_run(root, "served", inputs=(41,), config={"buckets": [64], "max_length": 64, "batch": 4,
                                                            "quantization": "int8", "concurrency": 8})  # fmt: skip
    return root


def test_one_row_per_run_and_cell_with_the_run_keys(runs: Path) -> None:
    views, _ = load_runs(None, runs)
    rows = report_rows(views)
    assert [(r.keys.run, r.cell.input_tokens) for r in rows] == [
        (REFERENCE_RUNS[1].name, 41), (REFERENCE_RUNS[1].name, 521), (REFERENCE_RUNS[1].name, 2057),
        (REFERENCE_RUNS[1].name, 3593), (REFERENCE_RUNS[0].name, 41), (REFERENCE_RUNS[0].name, 521),
        (REFERENCE_RUNS[0].name, 2057), (REFERENCE_RUNS[0].name, 3593),
        ("2026-11-30-plain-cpu", 41), ("2026-11-30-plain-cpu", 521), ("2026-11-30-served-cpu", 41),
    ]  # fmt: skip
    by_run = {r.keys.run: r.keys for r in rows}
    plain, served, t4g = by_run["2026-11-30-plain-cpu"], by_run["2026-11-30-served-cpu"], by_run[REFERENCE_RUNS[0].name]
    # absent axes are recorded as their defaults
    assert (plain.batch, plain.concurrency, plain.quantization) == (1, 1, "none")
    assert (served.batch, served.concurrency, served.quantization) == (4, 8, "int8")
    assert plain.device == "CPU" and plain.checkpoint_hash == "sha256:feed" and plain.provenance == "measured"
    assert plain.date == plain.started_at[:10]  # the start time's date
    assert t4g.device == "T4G" and t4g.provenance == "published" and t4g.date == "2026-08-28"
    assert t4g.compute_dtype == "float16" and t4g.max_new_tokens == 64  # from the cells: the manifest has none
    assert t4g.host == "g5g.2xlarge spot, Graviton2" and t4g.weight_bytes == 6_155_450_950


def test_every_printer_comes_from_the_one_column_list(runs: Path) -> None:
    views, _ = load_runs(None, runs)
    rows = report_rows(views)
    fields = [f for c in ROW_COLUMNS for f in c.fields]
    table = list(csv.reader(io.StringIO(rows_csv(ROW_COLUMNS, rows))))
    assert table[0] == fields and len(table) == len(rows) + 1
    objs = [json.loads(line) for line in rows_jsonl(ROW_COLUMNS, rows).splitlines()]
    assert [list(o) for o in objs] == [fields] * len(rows)
    for row, obj, line in zip(rows, objs, table[1:]):
        assert obj["gauge_tok_s_median"] == row.cell.gauge_tok_s_median  # unrounded
        assert obj["gauge_tok_s_min"] == row.cell.gauge_tok_s_min and obj["batch"] == row.keys.batch
        assert line[fields.index("run")] == row.keys.run
    md = rows_markdown(SUMMARY_COLUMNS, rows).splitlines()
    assert md[0] == "| " + " | ".join(c.header for c in SUMMARY_COLUMNS) + " |" and len(md) == len(rows) + 2
    measured = next(r for r in rows if r.keys.run == "2026-11-30-plain-cpu")
    gauge = next(c for c in ROW_COLUMNS if c.key == "gauge_tok_s_median")
    assert gauge.text(measured) == gauge.cell.text(measured.cell) and "(" in gauge.text(measured)  # with spread
    assert any(gauge.text(measured) in line for line in md)
    plain = rows_plain(SUMMARY_COLUMNS, rows)
    assert len(plain) == len(rows) + 1 and all(not line.endswith(" ") for line in plain)


def test_the_report_writes_the_long_format(runs: Path, tmp_path: Path) -> None:
    report = build_report([], tmp_path / "out", runs_dir=runs)
    assert (tmp_path / "out" / "rows.csv").read_text() == rows_csv(ROW_COLUMNS, report.rows)
    assert (tmp_path / "out" / "rows.jsonl").read_text() == rows_jsonl(ROW_COLUMNS, report.rows)
    assert len(report.rows) == 11


@pytest.mark.parametrize("fmt", ["md", "csv", "jsonl"])
def test_cli_format_prints_the_rows_on_stdout(runs: Path, tmp_path: Path, capsys, fmt: str) -> None:
    code, out, err = bench_captured(["report", "--runs-dir", str(runs), "--out", str(tmp_path / "o"),
                               "--format", fmt], capsys)  # fmt: skip
    assert code == 0, err
    assert "wrote " in err and "wrote " not in out
    if fmt == "jsonl":
        assert len([json.loads(line) for line in out.splitlines()]) == 11
    elif fmt == "csv":
        assert out == (tmp_path / "o" / "rows.csv").read_text()
    else:
        assert out.startswith("| device | host | date |") and len(out.splitlines()) == 13


def test_cli_bad_format_is_one_line_exit_2(runs: Path, tmp_path: Path, capsys) -> None:
    code, out, err = bench_captured(["report", "--runs-dir", str(runs), "--out", str(tmp_path / "o"), "--format", "pdf"],
                              capsys)  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --format 'pdf': expected one of md, csv, jsonl, html"]


def test_machine_readable_rows_say_a_cell_is_partial(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path / "runs", "part", stopped={521: ("interrupted", 6)})
    report = build_report([run.path], tmp_path / "out")
    objs = {o["input_tokens"]: o for o in map(json.loads, (report.out_dir / "rows.jsonl").read_text().splitlines())}
    assert (objs[521]["partial"], objs[521]["repeats"], objs[521]["repeats_planned"]) == (True, 3, 6)
    assert objs[521]["stopped_by"] == "interrupted"
    assert (objs[41]["partial"], objs[41]["repeats_planned"], objs[41]["stopped_by"]) == (False, None, None)
    with open(report.out_dir / "rows.csv", newline="") as fh:
        by_size = {r["input_tokens"]: r for r in csv.DictReader(fh)}
    assert (by_size["521"]["partial"], by_size["521"]["repeats_planned"]) == ("True", "6")
    assert by_size["41"]["partial"] == "False" and by_size["41"]["stopped_by"] == ""
    with open(report.out_dir / "sweep.csv", newline="") as fh:
        sweep = {r["input_tokens"]: r for r in csv.DictReader(fh)}
    assert sweep["521"][f"{run.name}:partial"] == "True" and sweep["521"][f"{run.name}:stopped_by"] == "interrupted"
    assert sweep["41"][f"{run.name}:partial"] == "False"


def test_an_old_row_without_completeness_fields_prints_as_not_partial() -> None:
    from bench.runs.records import CellRow

    old = {f.name: None for f in dataclasses.fields(CellRow) if f.name not in ("partial", "repeats_planned",
                                                                                "stopped_by")}  # fmt: skip
    old.update(input_tokens=41, valid=True, status="ok", repeats=3)
    row = CellRow(**old)
    cols = {c.key: c for c in ROW_COLUMNS}
    assert cols["partial"].cell.value(row) is False and cols["repeats_planned"].cell.value(row) is None
