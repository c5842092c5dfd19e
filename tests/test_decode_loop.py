"""The device decode loop in the harness: a cell timed with both loops (its own warm-up and samples, the device
loop's gauge, ms per step and the host overhead per step in the row), validity of its repeats, a stopped cell that
keeps its device samples and resumes, the report and compare showing the fields where present only, and the flag's
bad values as one line."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli_here, seeded_cache_root
from runfolders import MAX_NEW, REFERENCE_RUNS, make_measured_run, make_sample, manifest

from bench.report import build_report
from bench.runs import create_run, open_run, summarize_cell, validate_run
from bench.runs.columns import DEVICE_LOOP_COLUMNS, plain_table, table_columns


def _device_sample(n: int, repeat: int, *, gauge: float, kind: str = "timed-device", **kwargs):
    """A device-loop request: no per-step times, one block."""
    s = make_sample(n, kind, repeat, gauge=gauge, **kwargs)
    return dataclasses.replace(s, step_ms=[], block_ms=[s.decode_ms])


def _both_samples(n: int, *, host_gauge: float = 20.0, device_gauge: float = 25.0, **device_kwargs):
    host = [make_sample(n, "warmup", 0, gauge=host_gauge)]
    host += [make_sample(n, "timed", r, gauge=host_gauge * j) for r, j in enumerate((0.99, 1.0, 1.01))]
    device = [_device_sample(n, 0, gauge=device_gauge, kind="warmup-device")]
    device += [_device_sample(n, r, gauge=device_gauge * j, **device_kwargs) for r, j in enumerate((0.98, 1.0, 1.02))]
    return host + device


def test_the_cell_row_has_the_device_loop_and_the_host_overhead_per_step():
    row = summarize_cell(_both_samples(41), max_new_tokens=MAX_NEW)
    assert row.valid and row.repeats == 3 and row.device_repeats == 3
    assert row.gauge_tok_s_median == pytest.approx(20.0)  # the host loop's figures are what they were
    assert row.device_gauge_tok_s_min < row.device_gauge_tok_s_median < row.device_gauge_tok_s_max
    assert row.device_gauge_tok_s_median == pytest.approx(25.0)
    assert row.device_step_ms_median == pytest.approx(1000 / 25.0)
    assert row.host_overhead_ms == pytest.approx(1000 / 20.0 - 1000 / 25.0)
    host_only = summarize_cell([s for s in _both_samples(41) if "device" not in s.kind], max_new_tokens=MAX_NEW)
    assert not {f.name for f in dataclasses.fields(host_only) if f.name.startswith("device")} & set(host_only.to_dict())
    assert "host_overhead_ms" not in host_only.to_dict()  # a row without the device loop is what it always was


def test_device_loop_repeats_are_held_to_the_validity_rules():
    compiled = summarize_cell(_both_samples(41, compile_events=1), max_new_tokens=MAX_NEW)
    assert not compiled.valid and "compile event(s) during device-loop timed repeat(s)" in compiled.invalid_reason
    short = summarize_cell(_both_samples(41, token_ids=[5, 6, 7]), max_new_tokens=MAX_NEW)
    assert "device-loop repeat 0 generated 3 tokens, expected 8" in short.invalid_reason
    looping = summarize_cell(_both_samples(41, degenerate=True), max_new_tokens=MAX_NEW)
    assert not looping.valid and "device-loop repeat 0 degenerate" in looping.invalid_reason
    alone = summarize_cell([s for s in _both_samples(41) if "device" in s.kind], max_new_tokens=MAX_NEW)
    assert alone.valid and alone.gauge_tok_s_median == alone.device_gauge_tok_s_median and alone.step_ms_median is None
    assert alone.host_overhead_ms is None


@pytest.fixture(scope="module")
def tiny_engine(tiny_checkpoint):
    from model.engine import load_engine

    engine, _ = load_engine(tiny_checkpoint, log_policy=False)
    return engine


def test_an_in_process_sweep_times_each_cell_with_both_loops(tiny_engine, tmp_path):
    from bench.sweep.local import SweepConfig, run_sweep

    config = SweepConfig(inputs=(20,), max_new_tokens=6, repeats=2, decode_loops=("host", "device"), block=2)
    run = create_run(tmp_path, "both", "cpu", manifest())
    (row,) = run_sweep(tiny_engine, config, run)
    kinds = [s.kind for s in run.samples()]
    assert kinds == ["cold", "warmup", "timed", "timed", "warmup-device", "timed-device", "timed-device"]
    assert row.valid and row.repeats == 2 and row.device_repeats == 2 and row.compile_events_timed == 0
    assert row.device_gauge_tok_s_min <= row.device_gauge_tok_s_median <= row.device_gauge_tok_s_max
    device = [s for s in run.samples() if s.kind == "timed-device"]
    host = [s for s in run.samples() if s.kind == "timed"]
    assert all(s.step_ms == [] and len(s.block_ms) == 3 and s.generated_tokens == 6 for s in device)  # 5 = 2 + 2 + 1
    assert all(len(s.step_ms) == 5 and s.block_ms is None for s in host)
    assert [s.token_ids for s in device] == [s.token_ids for s in host]  # greedy: the same tokens either way
    per_step = sorted(s.decode_ms / 5 for s in host)
    assert row.host_overhead_ms == pytest.approx(sum(per_step) / 2 - row.device_step_ms_median)
    assert validate_run(run.path) == []
    lines = plain_table(table_columns([row]), [row])
    assert all(c.table_header in lines[0] for c in DEVICE_LOOP_COLUMNS)


def test_a_stopped_cell_keeps_its_device_samples_and_resumes(tiny_engine, tmp_path):
    from bench.sweep.local import SweepConfig, run_sweep

    config = SweepConfig(inputs=(20,), max_new_tokens=6, repeats=2, decode_loops=("host", "device"))
    run = create_run(tmp_path, "stopped", "cpu", manifest())
    with pytest.raises(KeyboardInterrupt):
        run_sweep(tiny_engine, config, run, should_stop=lambda: any(s.kind == "timed-device" for s in run.samples()))
    (partial,) = open_run(run.path).cells()
    assert partial.partial and partial.stopped_by == "interrupted" and (partial.repeats, partial.device_repeats) == (2, 1)
    assert "1 of 2 device-loop" in table_columns([partial])[-1].text(partial)
    run = open_run(run.path)
    (row,) = run_sweep(tiny_engine, config, run, skip=run.finished_inputs())
    assert not row.partial and (row.repeats, row.device_repeats) == (2, 2)
    kinds = [s.kind for s in run.samples()]
    assert kinds.count("timed-device") == 2 and kinds.count("timed") == 2 and "cold-resume" in kinds
    assert validate_run(run.path) == []


def test_the_report_shows_the_device_loop_where_present_and_nothing_where_absent(tmp_path):
    root = tmp_path / "runs"
    for ref in REFERENCE_RUNS:  # archived schema-1 runs
        shutil.copytree(ref, root / ref.name)
    make_measured_run(root, "plain", inputs=(41,))
    plain = build_report([], tmp_path / "without", runs_dir=root)
    text = (tmp_path / "without" / "report.md").read_text()
    assert "decode loop" not in text and "device_gauge" not in (tmp_path / "without" / "rows.csv").read_text()
    assert "device_gauge" not in (tmp_path / "without" / "sweep.csv").read_text() and plain.rows
    run = create_run(root, "both", "cpu", manifest(device_kind="cpu-b"), date="2026-12-01")
    run.append_samples(_both_samples(41))
    run.append_cell(summarize_cell(_both_samples(41), max_new_tokens=MAX_NEW, bucket=64))
    run.finish("complete")
    build_report([], tmp_path / "with", runs_dir=root)
    text = (tmp_path / "with" / "report.md").read_text()
    assert "decode loop: host-synced vs on the device" in text and "host overhead ms/step" in text
    header = (tmp_path / "with" / "rows.csv").read_text().splitlines()[0]
    assert "device_gauge_tok_s_median" in header and "host_overhead_ms" in header
    assert "host_overhead_ms" in (tmp_path / "with" / "sweep.csv").read_text().splitlines()[0]


@pytest.mark.parametrize(
    "args,needles",
    [
        (["sweep", "-c", "builtin:tiny", "--inputs", "20", "--decode-loop", "gpu"], ["--decode-loop 'gpu'", "both"]),
        (["sweep", "-c", "builtin:tiny", "--inputs", "20", "--decode-loop", "host", "--decode-block", "4"],
         ["--decode-block 4", "device or both"]),
        (["sweep", "--target", "http://127.0.0.1:9/v1", "--inputs", "20", "--decode-loop", "both"],
         ["--decode-loop both", "--target", "server"]),
        (["generate", "-p", "hi", "-c", "builtin:tiny", "--decode-loop", "both"], ["--decode-loop 'both'"]),
        (["gpu-run", "/tmp/never-made-gpu-run", "--decode-loop", "x"], ["--decode-loop x", "host, device or both"]),
    ],
)
def test_a_bad_decode_loop_flag_is_one_clear_line(args, needles, tmp_path, builtin_checkpoints):
    env = {"GEMMA4_BENCH_CACHE": str(seeded_cache_root(tmp_path / "cache", builtin_checkpoints)), "JAX_PLATFORMS": "cpu"}
    proc = run_cli_here([*args, *(["--runs-dir", str(tmp_path / "r")] if args[0] == "sweep" else [])], env=env)
    assert_one_line_error(proc, *needles)
    assert not Path("/tmp/never-made-gpu-run").exists()
