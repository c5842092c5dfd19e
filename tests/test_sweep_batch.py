"""`bench sweep --batch`, `bench profile --batch`, the report and `bench compare` of batch cells
(docs/method.md, "Batches").

Fast: the flag's parsing and refusals (one line, exit 2, before the checkpoint loads), the records of a batch cell
(aggregate = B x the per-sequence gauge, every row's length in validity, a cell keyed by (input tokens, batch), old
rows unchanged), the knee per input size, the table's batch columns, and the report and `bench compare` of a
synthetic batch run. Slow: the in-process sweep on the tiny checkpoint (every row equal to its prompt alone, the
B = 1 cell the cell of a sweep without --batch), a batch that does not fit, and `bench profile --batch`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import bench_captured
from runfolders import MAX_NEW, cell_samples, manifest

from bench.errors import InputError
from bench.measure.batches import knees
from bench.runs import CellRow, Sample, cell_key, create_run, open_run, summarize_cell, validate_run
from bench.runs.columns import AGGREGATE, BATCH, ROWS_DIFFER, table_columns
from bench.sweep.local import SweepConfig, parse_batches

GAUGES = {1: 20.0, 4: 19.0, 16: 12.0}  # per-sequence tok/s: steps of 50, 52.6 and 83.3 ms -> the knee at 16


def batch_samples(n: int, b: int, gauge: float, *, row_ids=None) -> list[Sample]:
    """A cell's warm-up and three timed requests of `b` rows (B = 1: plain samples, as without --batch)."""
    samples = cell_samples(n, gauge=gauge, repeats=3)
    if b == 1:
        return samples
    rows = row_ids or [[(n + 3 * r + i) % 97 + 3 for i in range(MAX_NEW)] for r in range(b)]
    return [dataclasses.replace(s, batch=b, row_token_ids=rows, token_ids=rows[0]) for s in samples]


def make_batch_run(runs_dir: Path, label: str, *, inputs=(41,), gauges=GAUGES, rows_differ=None, **kw):
    """A complete measured run of a `--batch` sweep: every input size at every batch of `gauges`."""
    m = manifest(**kw)
    m["workload"] = {"inputs": list(inputs), "max_new_tokens": MAX_NEW, "repeats": 3, "notes": {"batches": list(gauges)}}
    run = create_run(runs_dir, label, "cpu", m, date="2026-12-01")
    for n in inputs:
        for b, g in gauges.items():
            samples = batch_samples(n, b, g)
            run.append_samples(samples)
            row = summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64, input_tokens=n, batch=b)
            run.append_cell(dataclasses.replace(row, rows_differ=(rows_differ or {}).get(b, 0), bytes_per_step=1000 * b,
                                                flops_per_step=4000 * b, arithmetic_intensity=4.0))  # fmt: skip
    run.finish("complete")
    return run


# ---- the flag ------------------------------------------------------------------------------------------------------
def test_batches_parse_in_order_and_bad_values_are_one_line():
    assert parse_batches("1, 4,16") == (1, 4, 16) and parse_batches("16,1") == (16, 1)
    for text, needle in (("0", "0 is not a batch size"), ("x", "'x' is not a whole number"),
                         ("4,4", "batch 4 is given twice"), ("1,,2", "'' is not a whole number"),
                         ("-2", "-2 is not a batch size")):  # fmt: skip
        with pytest.raises(InputError, match=needle):
            parse_batches(text)
    assert SweepConfig(inputs=(41, 521), batches=(1, 4)).cells == [(41, 1), (41, 4), (521, 1), (521, 4)]
    assert SweepConfig(inputs=(41, 521)).cells == [(41, 1), (521, 1)]  # without --batch: one cell per size
    with pytest.raises(InputError, match="--batch"):
        SweepConfig(inputs=(41,), batches=(2, 2)).check()


@pytest.mark.parametrize("args,needles", [
    (["--batch", "0"], ["--batch 0", "at least 1 row"]),
    (["--batch", "x"], ["--batch x", "whole number"]),
    (["--batch", "1,4,4"], ["--batch 1,4,4", "twice"]),
    (["--batch", "4", "--target", "http://127.0.0.1:9/v1"], ["--batch 4", "--target"]),
])  # fmt: skip
def test_bad_batch_is_one_line_and_exit_2_before_the_checkpoint_loads(args, needles, capsys, tmp_path):
    code, _out, err = bench_captured(["sweep", "--checkpoint", str(tmp_path / "no-such-checkpoint"), "--inputs", "41",
                                      "--runs-dir", str(tmp_path / "runs"), *args], capsys)  # fmt: skip
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert all(n in errors[0] for n in needles) and "no-such-checkpoint" not in errors[0], errors
    assert not (tmp_path / "runs").exists()


# ---- the records ---------------------------------------------------------------------------------------------------
def test_a_batch_cell_summarises_one_row_and_the_aggregate_is_b_times_it():
    samples = batch_samples(41, 4, 19.0) + batch_samples(41, 1, 20.0)  # both cells' samples together
    row = summarize_cell(samples, max_new_tokens=MAX_NEW, input_tokens=41, batch=4)
    assert row.batch == 4 and row.repeats == 3 and row.valid
    assert row.gauge_tok_s_median == pytest.approx(19.0) and row.aggregate_tok_s_median == pytest.approx(4 * 19.0)
    assert row.aggregate_tok_s_min == pytest.approx(4 * row.gauge_tok_s_min)
    one = summarize_cell(samples, max_new_tokens=MAX_NEW, input_tokens=41)  # without batch: the B = 1 samples only
    assert one.batch is None and one.gauge_tok_s_median == pytest.approx(20.0) and one.aggregate_tok_s_median is None
    assert "batch" not in one.to_dict() and "aggregate_tok_s_median" not in one.to_dict()  # rows as they always were
    short = [dataclasses.replace(s, row_token_ids=[s.token_ids, s.token_ids[:-1]]) for s in batch_samples(41, 2, 19.0)]
    bad = summarize_cell(short, max_new_tokens=MAX_NEW, input_tokens=41, batch=2)
    assert not bad.valid and "row(s) [1] did not generate exactly 8 tokens" in bad.invalid_reason


def test_a_sample_without_batch_writes_what_it_always_did():
    plain = batch_samples(41, 1, 20.0)[1]
    assert set(plain.to_dict()) == {f.name for f in dataclasses.fields(Sample)} - {"block_ms", "batch", "row_token_ids",
                                                                                         "experts_read"}
    batched = batch_samples(41, 2, 20.0)[1]
    assert batched.to_dict()["batch"] == 2 and len(batched.to_dict()["row_token_ids"]) == 2
    assert cell_key(plain) == (41, 1) and cell_key(batched) == (41, 2)


def test_a_batch_run_keys_cells_by_input_and_batch_and_validates(tmp_path):
    run = make_batch_run(tmp_path, "b", inputs=(41, 521))
    assert validate_run(run.path) == []
    assert [cell_key(c) for c in run.cells()] == [(41, 1), (41, 4), (41, 16), (521, 1), (521, 4), (521, 16)]
    assert run.finished_cells() == [cell_key(c) for c in run.cells()] and run.finished_inputs() == [41, 521]
    lines = (run.path / "cells.jsonl").read_text().splitlines()
    lines.append(lines[1])  # the (41, 4) cell twice
    (run.path / "cells.jsonl").write_text("\n".join(lines) + "\n")
    assert any("duplicate cell for input_tokens=41, batch=4" in p for p in validate_run(run.path))


# ---- the knee, the table -------------------------------------------------------------------------------------------
def test_the_knee_per_input_size_from_valid_cells(tmp_path):
    run = make_batch_run(tmp_path, "k", inputs=(41, 521), gauges={1: 20.0, 4: 19.0, 16: 18.0})
    cells = run.cells()
    (a, b) = knees(cells)
    assert (a.input_tokens, a.batch) == (41, None) and "no knee up to B = 16" in a.line
    faster = [dataclasses.replace(c, step_ms_median=100.0) if cell_key(c) == (521, 16) else c for c in cells]
    k = knees(faster)[1]
    assert k.batch == 16 and "knee at B = 16" in k.line and "+100%" in k.line
    no_base = [c for c in cells if c.batch != 1]
    assert knees(no_base)[0].note and "no valid B = 1 cell" in knees(no_base)[0].line
    assert knees([dataclasses.replace(c, batch=None) for c in cells]) == []  # a sweep without --batch: no knee


def test_the_table_has_the_batch_columns_only_for_a_batch_sweep(tmp_path):
    cells = make_batch_run(tmp_path, "t").cells()
    cols = table_columns(cells)
    assert cols[1] is BATCH and AGGREGATE in cols and ROWS_DIFFER in cols
    plain = [dataclasses.replace(c, batch=None) for c in cells if c.batch == 1]
    assert BATCH not in table_columns(plain) and AGGREGATE not in table_columns(plain)


# ---- the report, compare -------------------------------------------------------------------------------------------
def _profile_run(runs_dir: Path, label: str, batch: int, tensor_core: float) -> None:
    m = manifest()
    m["workload"] = {"inputs": [41], "max_new_tokens": MAX_NEW, "repeats": None, "notes": {}}
    run = create_run(runs_dir, label, "cpu", m, date="2026-12-01")
    run.write_json("profile.json", {
        "schema_version": 1, "steps": 5, "device": {"platform": "gpu", "device_kind": "H200"},
        "categories": {"matmul_fp32": {"pct": 60.0 - tensor_core, "ms": 1.0}, "tensor_core": {"pct": tensor_core, "ms": 1.0}},
        "totals": {"device_ms": 10.0, "distinct_kernels": 40, "ms_per_step": 2.0}, "config": {"batch": batch},
    })  # fmt: skip
    run.finish("complete")


def test_the_report_shows_batches_the_knee_and_the_categories_per_batch(tmp_path):
    from bench.report import build_report

    runs = tmp_path / "runs"
    make_batch_run(runs, "sweep", rows_differ={16: 2})
    for b, tc in ((1, 0.0), (16, 35.0)):
        _profile_run(runs, f"prof-b{b}", b, tc)
    report = build_report(None, tmp_path / "out", runs_dir=runs)
    md = report.markdown.read_text()
    assert "**batches: " in md and "| 41 | 16 |" in md
    assert "knee at B = 16 (step 83.33 ms vs 50.00 ms at B = 1" in md
    assert "device time by category per batch size" in md and "B = 1 (" in md and "B = 16 (" in md
    assert "| tensor core | 0.0% | 35.0% |" in md
    names = {p.name for p in report.files}
    assert "batches.csv" in names and any(n.startswith("batches_G") and n.endswith(".png") for n in names)
    csv_rows = (tmp_path / "out" / "batches.csv").read_text().splitlines()
    assert csv_rows[0].startswith("run,input_tokens,batch,gauge_tok_s_median") and len(csv_rows) == 4
    assert csv_rows[3].split(",")[2] == "16"


def test_the_report_of_runs_without_batches_writes_no_batch_files(tmp_path):
    from runfolders import make_measured_run

    from bench.report import build_report

    make_measured_run(tmp_path / "runs", "plain")
    report = build_report(None, tmp_path / "out", runs_dir=tmp_path / "runs")
    assert not any("batch" in p.name for p in report.files) and "**batches: " not in report.markdown.read_text()


def test_compare_matches_cells_by_input_and_batch(tmp_path):
    from bench.report.compare import compare_runs

    base = make_batch_run(tmp_path, "base")
    cand = make_batch_run(tmp_path, "cand", gauges={1: 20.0, 4: 19.0})  # no B = 16 cell
    result = compare_runs(base.path, cand.path)
    assert [(d.input_tokens, d.batch) for d in result.cells] == [(41, 1), (41, 4), (41, 16)]
    assert result.cells[1].gauge_delta_pct == pytest.approx(0.0)
    assert result.failures == ["41 input tokens x 16 rows: the candidate has no cell (the baseline has one)"]
    assert [t.input_tokens for t in result.tokens] == [41] and result.tokens[0].status == "identical"


# ---- in process, on the tiny checkpoint ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_engine(tiny_checkpoint):
    from model.engine import load_engine

    return load_engine(tiny_checkpoint)[0]


@pytest.mark.slow
def test_the_sweep_with_batches_on_the_tiny_checkpoint(tiny_engine, tmp_path):
    """Every row of every batch equals its prompt alone (rows_differ 0); the B = 1 cell is the cell of a sweep
    without --batch (same tokens); every row generated exactly max_new_tokens; a valid, complete run folder."""
    from bench.sweep.local import run_sweep

    def sweep(name, batches):
        config = SweepConfig(inputs=(41,), max_new_tokens=6, repeats=1, batches=batches)
        run = create_run(tmp_path, name, "cpu", manifest(), date="2026-12-01")
        rows = run_sweep(tiny_engine, config, run)
        run.finish("complete")
        return run, rows

    run, rows = sweep("batch", (1, 2, 3))
    plain, _ = sweep("plain", ())
    assert validate_run(run.path) == [] and [cell_key(r) for r in rows] == [(41, 1), (41, 2), (41, 3)]
    assert all(r.valid and r.rows_differ == 0 and r.flops_per_step and r.arithmetic_intensity for r in rows)
    assert [r.batch for r in rows] == [1, 2, 3] and rows[2].flops_per_step == 3 * rows[0].flops_per_step
    assert rows[2].aggregate_tok_s_median == pytest.approx(3 * rows[2].gauge_tok_s_median)
    timed = {cell_key(s): s for s in run.samples() if s.kind == "timed"}
    assert len(timed[(41, 3)].row_token_ids) == 3 and all(len(r) == 6 for r in timed[(41, 3)].row_token_ids)
    assert len({tuple(r) for r in timed[(41, 3)].row_token_ids}) == 3  # different prompts, different work
    (alone,) = [s for s in plain.samples() if s.kind == "timed"]
    assert timed[(41, 1)].token_ids == alone.token_ids == timed[(41, 3)].row_token_ids[0]
    assert "batch" not in (plain.path / "cells.jsonl").read_text()  # without --batch: today's rows
    # one per input size (B = 1's): the step-0 logits and the per-step top-2 summary
    assert sorted(p.name for p in (run.path / "logits").iterdir()) == ["41.npy", "41.steps.npy"]


@pytest.mark.slow
def test_a_batch_that_does_not_fit_is_one_line_before_anything_is_timed(tiny_checkpoint, capsys, tmp_path):
    code, _out, err = bench_captured(["sweep", "--checkpoint", str(tiny_checkpoint), "--inputs", "41", "--batch",
                                      "1,1000000000", "--max-new-tokens", "4", "--runs-dir", str(tmp_path / "r")],
                                     capsys)  # fmt: skip
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "does not fit" in errors[0] and "at most" in errors[0], err
    assert not (tmp_path / "r").exists()  # refused before a run folder was made or anything timed


@pytest.mark.slow
def test_profile_at_a_batch_records_it(tiny_checkpoint, capsys, tmp_path):
    code, out, err = bench_captured(["profile", "--checkpoint", str(tiny_checkpoint), "--input-tokens", "41", "--batch",
                                     "3", "--steps", "2", "--runs-dir", str(tmp_path), "--name", "pb"], capsys)  # fmt: skip
    assert code == 0, err
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    prof = json.loads((folder / "profile.json").read_text())
    assert prof["config"]["batch"] == 3 and "3 rows per decode step" in out
    assert open_run(folder).typed_manifest.workload.notes["profile_batch"] == 3 and validate_run(folder) == []
    code, _, err = bench_captured(["profile", "--checkpoint", str(tiny_checkpoint), "--batch", "0"], capsys)
    assert code == 2 and "--batch 0" in err


def test_an_interrupted_batch_sweep_is_reported_beside_a_later_sweep_of_input_sizes(tmp_path):
    from runfolders import make_measured_run

    from bench.report import build_report
    from bench.report.groups import Selection

    runs = tmp_path / "runs"
    m = manifest(config={"buckets": [64, 512], "max_length": 600, "inputs": [41], "batches": [1, 4, 16]})
    half = create_run(runs, "batches", "cpu", m, date="2026-12-01")
    for b, g in ((1, 20.0), (4, 19.0)):
        samples = batch_samples(41, b, g)
        half.append_samples(samples)
        half.append_cell(summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64, input_tokens=41, batch=b))
    warmup = batch_samples(41, 16, 12.0)[:1]  # stopped after the warm-up of B = 16: no timed repeat
    half.append_samples(warmup)
    half.append_cell(summarize_cell(warmup, max_new_tokens=MAX_NEW, bucket=64, input_tokens=41, batch=16,
                                    stopped_by="interrupted", repeats_planned=3))  # fmt: skip
    half.finish("incomplete")
    later = make_measured_run(runs, "sizes", date="2026-12-02", started_at="2026-12-02T12:00:00+00:00")
    report = build_report(None, tmp_path / "out", runs_dir=runs, selection=Selection(latest_per=("device",)))
    assert sorted(report.runs) == sorted([half.name, later.name])  # the later sweep does not hide the batch sweep
    md = report.markdown.read_text()
    assert "**batches: CPU (incomplete)**" in md
    (b16,) = [line for line in md.splitlines() if line.startswith("| 41 | 16 |")]
    assert b16.endswith("| NO: no timed repeats (partial: 0 of 3 repeats, interrupted) |")
    assert f"- {half.name}: incomplete: 2 of 3 planned cell(s) finished; not finished: 41 tokens at batch 16 " \
           "(no timed repeats)" in md
    assert [p.name for p in report.files if p.name.startswith("batches_")] == ["batches_G1.png"]
    assert ",".join([half.name, "41", "16"]) in (tmp_path / "out" / "batches.csv").read_text()
