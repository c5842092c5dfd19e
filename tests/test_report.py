"""The report: the published tables reproduced exactly, the derived roofline, robustness to bad folders, measured
runs beside the references, findings computed from the data, and the walls (no jax, no engine)."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import bench_captured
from runfolders import MAX_NEW, REFERENCE_RUNS, REPO, cell_samples, make_measured_run, published_figures

from bench.errors import RunFolderError
from bench.profile.roofline import (
    PLE4_INT8_LM_HEAD,
    decode_step_bytes,
    roofline_share_pct,
    stored_weight_bytes,
    total_params,
)
from bench.report import build_report, fmt_num, fmt_pct
from bench.report.groups import Selection
from bench.runs import summarize_cell
from model.config import E2B

T4G, L4 = REFERENCE_RUNS


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _num(text: str) -> float | None:
    return None if text == "" else float(text)


@pytest.fixture(scope="module")
def reference_report(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("report")
    return build_report([T4G, L4], out), out


# ---- the published tables, reproduced -------------------------------------------------------------------------------
def test_sweep_table_reproduces_the_published_figures_exactly(reference_report) -> None:
    report, out = reference_report
    rows = _csv(out / "sweep.csv")
    for folder in (T4G, L4):
        published = published_figures(folder)
        assert [int(r["input_tokens"]) for r in rows] == [c["input_tokens"] for c in published["sweep"]]
        for row, cell in zip(rows, published["sweep"]):
            assert _num(row[f"{folder.name}:gauge_tok_s_median"]) == cell["gauge_tok_s"]
            assert _num(row[f"{folder.name}:e2e_tok_s_median"]) == cell["e2e_tok_s"]
            assert row[f"{folder.name}:gauge_tok_s_min"] == "" and row[f"{folder.name}:ttft_ms_median"] == ""
    md = report.markdown.read_text()
    # the published table: input tokens | T4G gauge | T4G end-to-end | L4 gauge | L4 end-to-end
    assert "| input tokens | T4G (published) gauge tok/s | T4G (published) end-to-end tok/s | L4 (published) gauge tok/s | L4 (published) end-to-end tok/s |" in md
    for line in ("| 41 | 12.9 | 12.43 | 48.5 | 46.23 |", "| 521 | 13.0 | 11.28 | 48.4 | 42.87 |",
                 "| 2,057 | 12.9 | 8.22 | 48.3 | 34.57 |", "| 3,593 | — | — | 48.3 | 27.55 |"):  # fmt: skip
        assert line in md


def test_profile_table_reproduces_the_published_figures_exactly(reference_report) -> None:
    report, out = reference_report
    rows = {r["metric"]: r for r in _csv(out / "profile.csv")}
    for folder in (T4G, L4):
        p = published_figures(folder)["profile"]
        col = folder.name
        assert _num(rows["dtype_conversion_pct"][col]) == p["dtype_conversion_pct"]
        expected_fp32 = "absent" if p.get("fp32_gemv_note") == "absent" else p["fp32_gemv_pct"]
        assert (rows["fp32_matmul_pct"][col] if expected_fp32 == "absent" else _num(rows["fp32_matmul_pct"][col])) == expected_fp32
        assert _num(rows["tensor_core_pct"][col]) == p["tensor_core_pct"]
        assert _num(rows["total_kernel_time_ms"][col]) == p["total_kernel_time_ms"]
        assert _num(rows["distinct_kernels"][col]) == p["distinct_kernels"]
        assert _num(rows["decode_gauge_tok_s"][col]) == p["decode_gauge_tok_s"]
        assert _num(rows["bandwidth_gib_s"][col]) == p["peak_hbm_bandwidth_gib_s"]
        share = p.get("bandwidth_roofline_share_pct", p.get("bandwidth_roofline_share_pct_approx"))
        assert _num(rows["roofline_share_pct"][col]) == share
    md = report.markdown.read_text()
    for line in (
        "| dtype conversion | 54.1% | 0.0% |", "| fp32 matrix-vector (gemv) | 32.8% | absent |",
        "| tensor core | 0.0% | 0.0% |", "| total kernel time | 1,466.0 ms | 362.8 ms |",
        "| decode gauge (sweep) | 12.9 tok/s | 48.4 tok/s |", "| bandwidth | 298.083 GiB/s | 279.441 GiB/s |",
        "| bandwidth roofline share, as reported | 26% | ~100% |", "| distinct kernels | 108 | 100 |",
    ):  # fmt: skip
        assert line in md


def test_published_figures_are_labelled_everywhere(reference_report) -> None:
    report, out = reference_report
    md = report.markdown.read_text()
    assert "| provenance | published: Gemma 4 in Pure JAX" in md
    for header_line in [l for l in md.splitlines() if l.startswith("|  |") or l.startswith("| input tokens")]:
        assert header_line.count("(published)") >= 2
    assert "(published)" in md.split("### G1 findings")[1]


# ---- the derived roofline ------------------------------------------------------------------------------------------
def test_e2b_byte_accounting_reproduces_the_published_weight_bytes() -> None:
    common = json.loads((T4G / "published-source.json").read_text())["common"]
    assert total_params(E2B) == 4_628_569_379  # E2B text parameters (gemma4-architecture.md §3)
    assert stored_weight_bytes(E2B, PLE4_INT8_LM_HEAD) == common["weight_bytes"] == 6_155_450_950


def test_decode_step_bytes_count_one_embedding_row_and_the_whole_lm_head() -> None:
    account = decode_step_bytes(E2B, PLE4_INT8_LM_HEAD)
    terms = {t.name: t.bytes for t in account.terms}
    assert terms["input_embedding_row"] == 1536 * 2
    assert terms["ple_row"] == 35 * 256 // 2 + 35 * 2
    assert terms["lm_head"] == 262_144 * 1536 + 262_144 * 2
    assert terms["body"] == 2 * 1_877_105_955
    assert account.total == 4_157_397_004 and account.kv_bytes == 0
    with_kv = decode_step_bytes(E2B, PLE4_INT8_LM_HEAD, context_tokens=600)
    # 28 sliding layers read 512 window slots of 256-wide K and V; 7 full layers read all 600 of 512-wide ones
    assert with_kv.kv_bytes == 28 * 2 * 256 * 512 * 2 + 7 * 2 * 512 * 600 * 2


def test_report_shows_the_derived_share_beside_the_published_one(reference_report) -> None:
    report, out = reference_report
    rows = {r["metric"]: r for r in _csv(out / "profile.csv")}
    total = decode_step_bytes(E2B, PLE4_INT8_LM_HEAD).total
    for folder in (T4G, L4):
        p = published_figures(folder)["profile"]
        expected = roofline_share_pct(total, p["decode_gauge_tok_s"], p["peak_hbm_bandwidth_gib_s"])
        assert _num(rows["roofline_share_derived_pct"][folder.name]) == pytest.approx(expected)
    assert 16 < expected < 70
    md = report.markdown.read_text()
    assert "| bandwidth roofline share, derived (bytes a step reads) | 16.8% | 67.1% |" in md
    assert "| lm_head | 403,177,472 |" in md and "nominal datasheet peaks, not measurements" in md
    assert "give 24.8% when recomputed" in md and "give 99.3% when recomputed" in md


# ---- findings ----------------------------------------------------------------------------------------------------
def test_findings_from_the_reference_runs(reference_report) -> None:
    report, _ = reference_report
    text = "\n".join(report.findings)
    assert "T4G (published): decode gauge 12.9–13.0 tok/s across 41–2,057 input tokens (50x the context): (max − min) / median = 0.8% (the source publishes 0.8%)" in text
    assert "L4 (published): decode gauge 48.3–48.5 tok/s across 41–3,593 input tokens (88x the context): (max − min) / median = 0.4% (the source publishes 0.4%)" in text
    assert "End-to-end falls from 12.43 to 8.22 tok/s between 41 and 2,057 input tokens (-33.9%)" in text
    assert "decode gauge 3.76x at 41, 3.72x at 521, 3.74x at 2,057 (median 3.74x)" in text
    assert "the source quotes 3.7x for decode" in text
    assert "4.0x whole-request ratio (published)" in text and "56x" in text
    assert "not established as single-variable: not recorded by either run: checkpoint hash" in text
    assert "configuration.max_model_len: 4,096 vs —" in text
    assert "host architecture: aarch64 vs x86_64" in text and "compute dtype: float16 vs bfloat16" in text
    assert report.baseline == T4G.name  # default baseline: the slowest run


def test_a_measured_run_gets_its_own_group_beside_the_references(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for ref in REFERENCE_RUNS:
        shutil.copytree(ref, runs / ref.name)
    make_measured_run(runs, "mine", inputs=(41, 521, 2057), gauge=lambda n: 9.0 - n / 1000,
                      cell_kwargs={2057: {"compile_events": 1}})  # fmt: skip
    report = build_report([], tmp_path / "out", runs_dir=runs)
    assert report.runs == [T4G.name, L4.name, "2026-11-30-mine-cpu"]  # the published group first, its baseline first
    md = report.markdown.read_text()
    published, mine = md.split("## G1: ")[1].split("## G2: ")
    assert ("G2 is split from G1 by provenance: published vs measured; method: as published vs in-process; "
            "checkpoint: google/gemma-4-E2B-it") in md
    header = next(l for l in mine.splitlines() if l.startswith("| input tokens"))
    assert header == "| input tokens | CPU gauge tok/s | CPU end-to-end tok/s |"  # no published column beside it
    row41 = next(l for l in mine.splitlines() if l.startswith("| 41 |"))
    assert row41 == "| 41 | 8.96 (8.87–9.05) | 9.45 (9.37–9.53) |"  # median (min–max) where raw samples exist
    assert "| 41 | 12.9 | 12.43 | 48.5 | 46.23 |" in published  # the published table is unchanged
    row2057 = next(l for l in mine.splitlines() if l.startswith("| 2,057 |"))
    assert "✗" in row2057
    assert "✗ CPU, 2,057 input tokens: 3 compile event(s) during timed repeat(s) 0, 1, 2" in mine
    assert "whole request" in mine and "(whole-request ratio)" in mine and "(TTFT ratio: a different measurement)" in mine
    assert "CPU" not in published.split("### G1 environment")[0]  # another model never shares the published axes
    assert (tmp_path / "out" / "sweep_tok_s_G2.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "profile_categories_G1.png").exists()


def test_single_variable_comparisons_are_recognised_and_differences_named(tmp_path: Path) -> None:
    make_measured_run(tmp_path, "a", gauge=20.0)
    make_measured_run(tmp_path, "b", gauge=22.0)
    make_measured_run(tmp_path, "c", gauge=24.0, build_id="ffffffffffff", jax="0.12.1")
    report = build_report([], tmp_path / "out", baseline="2026-11-30-a-cpu", runs_dir=tmp_path)
    text = "\n".join(report.findings)
    assert "CPU 2026-11-30-b-cpu vs CPU 2026-11-30-a-cpu is a single-variable comparison" in text
    assert "is not a single-variable comparison: build id: 0123456789ab vs ffffffffffff" in text
    assert "Other differences: version jax: 0.12.0 vs 0.12.1" in text
    assert "decode gauge 1.10x at 41, 1.10x at 521 (median 1.10x)" in text


def test_findings_drawing_on_a_partial_cell_are_marked(tmp_path: Path) -> None:
    make_measured_run(tmp_path, "a", gauge=20.0)
    make_measured_run(tmp_path, "b", gauge=22.0, stopped={521: ("interrupted", 6)})
    report = build_report([], tmp_path / "out", baseline="2026-11-30-a-cpu", runs_dir=tmp_path)
    mark = "◐ (partial cells: CPU 2026-11-30-b-cpu at 521 input tokens, 3 of 6 repeats, interrupted)"
    speedup = next(f for f in report.findings if f.startswith("Speedup of CPU 2026-11-30-b-cpu"))
    assert speedup.endswith(mark)
    (decode,) = [f for f in report.findings if "(max − min) / median" in f]  # the latest run of the device: b
    assert decode.endswith("◐ (partial cells: CPU at 521 input tokens, 3 of 6 repeats, interrupted)")
    assert sum("◐" in f for f in report.findings) == 2  # the cold (41) and history (41) lines draw on no partial cell


# ---- robustness ----------------------------------------------------------------------------------------------------
@pytest.fixture
def messy_runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(T4G, runs / T4G.name)
    make_measured_run(runs, "interrupted", status="running")
    make_measured_run(runs, "broke", status="failed")
    future = make_measured_run(runs, "future")
    m = json.loads((future.path / "manifest.json").read_text())
    (future.path / "manifest.json").write_text(json.dumps({**m, "schema_version": 7}))
    corrupt = make_measured_run(runs, "corrupt")
    (corrupt.path / "cells.jsonl").write_text('{"input_tokens": 41, "trunc')
    badprof = make_measured_run(runs, "badprofile")
    (badprof.path / "profile.json").write_text("{not json")
    return runs


def test_bad_folders_are_skipped_with_a_warning_naming_them(messy_runs: Path, tmp_path: Path) -> None:
    report = build_report([], tmp_path / "out", runs_dir=messy_runs)
    assert report.runs == [T4G.name]
    skipped = dict(report.skipped)
    not_reported = "not complete or incomplete"
    assert f"status is 'running', {not_reported} (still being written" in skipped["2026-11-30-interrupted-cpu"]
    assert f"status is 'failed', {not_reported} (the run ended on an error" in skipped["2026-11-30-broke-cpu"]
    assert "schema_version 7 is not supported" in skipped["2026-11-30-future-cpu"]
    assert "cells.jsonl line 1: corrupt JSON" in skipped["2026-11-30-corrupt-cpu"]
    assert "profile.json: corrupt JSON" in skipped["2026-11-30-badprofile-cpu"]
    md = report.markdown.read_text()
    assert "## Skipped folders" in md and "- 2026-11-30-future-cpu: " in md


@pytest.mark.parametrize("name", ["interrupted", "broke", "future", "corrupt", "badprofile"])
def test_bad_folders_named_explicitly_are_refused(messy_runs: Path, tmp_path: Path, name: str) -> None:
    with pytest.raises(RunFolderError, match=f"2026-11-30-{name}-cpu"):
        build_report([T4G.name, f"2026-11-30-{name}-cpu"], tmp_path / "out", runs_dir=messy_runs)


def test_nothing_to_report_is_an_error(tmp_path: Path) -> None:
    make_measured_run(tmp_path, "half", status="failed")
    with pytest.raises(RunFolderError, match="no complete or incomplete run folders .*1 skipped"):
        build_report([], tmp_path / "out", runs_dir=tmp_path)


# ---- interrupted runs: their finished cells are reported, and said to be from an incomplete run ---------------------
def _interrupted_run(runs_dir: Path, label: str = "half", **kwargs):
    """An incomplete run planned for 41, 521 and 2,057 input tokens: 41 finished, 521 stopped before its first timed
    repeat (as a stop signal leaves it: a cell with no timed repeats), 2,057 never started."""
    config = {"buckets": [64, 512, 2048, 4096], "max_length": 4160, "inputs": [41, 521, 2057]}
    run = make_measured_run(runs_dir, label, inputs=(41,), status="running", config=config, **kwargs)
    samples = cell_samples(521, repeats=0)
    run.append_samples(samples)
    run.append_cell(summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=1024, stopped_by="interrupted",
                                   repeats_planned=3))  # fmt: skip
    run.finish("incomplete")
    return run


HALF_DONE = ("incomplete: 1 of 3 planned cell(s) finished; not finished: 521 tokens (no timed repeats), "
             "2,057 tokens (not started)")  # fmt: skip


def test_an_incomplete_run_in_the_runs_folder_is_reported_with_its_finished_cells(tmp_path: Path) -> None:
    make_measured_run(tmp_path, "whole", gauge=20.0, date="2026-11-29")
    half = _interrupted_run(tmp_path, gauge=30.0, device_kind="NVIDIA L4", slug="l4")
    report = build_report([], tmp_path / "out", runs_dir=tmp_path)
    assert half.name in report.runs and report.skipped == []
    assert report.incomplete == [(half.name, HALF_DONE)]
    sweep = {int(r["input_tokens"]): r for r in _csv(tmp_path / "out" / "sweep.csv")}
    assert _num(sweep[41][f"{half.name}:gauge_tok_s_median"]) == pytest.approx(30.0)
    assert sweep[521][f"{half.name}:gauge_tok_s_median"] == "" and sweep[521][f"{half.name}:valid"] == "False"
    md = report.markdown.read_text()
    assert "| L4 (incomplete) gauge tok/s | L4 (incomplete) end-to-end tok/s |" in md  # the label says it
    assert "- — L4 (incomplete), 521 input tokens: no timed repeats" in md  # the unfinished cell keeps its reason
    assert "## Incomplete runs" in md and f"- {half.name}: {HALF_DONE}" in md
    assert "1 run(s) marked *(incomplete)* were interrupted" in md
    (status,) = [line for line in md.splitlines() if line.startswith("| status |")]  # the environment table
    assert status in (f"| status | complete | {HALF_DONE} |", f"| status | {HALF_DONE} | complete |")
    env = {r[""]: r for r in _csv(tmp_path / "out" / "environment.csv")}
    assert env["status"] == {"": "status", "2026-11-29-whole-cpu": "complete", half.name: HALF_DONE}
    rows = _csv(tmp_path / "out" / "rows.csv")
    statuses = {(r["run"], r["run_status"]) for r in rows}
    assert statuses == {("2026-11-29-whole-cpu", "complete"), (half.name, "incomplete")}


def test_a_named_incomplete_run_is_reported_and_status_complete_leaves_it_out(tmp_path: Path) -> None:
    whole = make_measured_run(tmp_path, "whole", gauge=20.0, date="2026-11-29")
    half = _interrupted_run(tmp_path, started_at="2026-11-30T12:00:00+00:00")
    report = build_report([whole.path, half.name], tmp_path / "out", runs_dir=tmp_path)
    assert sorted(report.runs) == sorted([whole.name, half.name]) and [n for n, _ in report.incomplete] == [half.name]
    md = report.markdown.read_text()
    assert f"CPU {half.name} (incomplete)" in md and f"CPU {whole.name} (incomplete)" not in md
    assert "| 2026-11-30 (incomplete) |" in md  # the history table marks its row
    only = build_report([], tmp_path / "out2", runs_dir=tmp_path, selection=Selection(where={"status": "complete"}))
    assert only.runs == [whole.name] and only.incomplete == []
    assert "Incomplete runs" not in only.markdown.read_text()


def test_cli_report_names_the_incomplete_runs_it_includes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    half = _interrupted_run(tmp_path)
    code, out, err = bench_captured(["report", str(half.path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0 and f"wrote {tmp_path / 'out' / 'report.md'} from 1 run(s)" in out
    assert f"note: {half.name} is {HALF_DONE} (its finished cells are reported)" in err and "Traceback" not in err


# ---- the importer and the walls -------------------------------------------------------------------------------------
def test_the_importer_recreates_the_committed_reference_folders(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("import_published_runs", REPO / "scripts" / "import_published_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folders = module.import_published(T4G / "published-source.json", tmp_path)
    assert [f.name for f in folders] == [T4G.name, L4.name]
    for ref in REFERENCE_RUNS:
        made = tmp_path / ref.name
        assert sorted(p.name for p in made.iterdir()) == sorted(p.name for p in ref.iterdir())
        for file in ref.iterdir():
            assert (made / file.name).read_bytes() == file.read_bytes(), file.name
    with pytest.raises(RunFolderError, match="already exists"):
        module.import_published(T4G / "published-source.json", tmp_path)
    assert module.import_published(T4G / "published-source.json", tmp_path, force=True)


def test_report_and_compare_import_neither_jax_nor_the_engine() -> None:
    # architecture.md wall 2: of `model/`, only the jax-free facts (config, shapes, byte accounting, quantization
    # layouts, the kernels' pure-Python fit checks that say where a TPU pads a leaf) may be imported
    code = (
        "import json, sys, bench.report, bench.report.compare, bench.cli.report_cmds; "
        "print(json.dumps(sorted(m for m in sys.modules if m in ('jax', 'model') or m.startswith(('jax.', 'model.')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert set(json.loads(out.stdout)) <= {"model", "model.config", "model.accounting", "model.quantspec", "model.errors",
                                          "model.engine_config", "model.placement", "model.shapes", "model.kernels",
                                          "model.kernels.fit", "model.kernels.fit_tpu"}  # jax-free (pyproject.toml contract)


def test_number_formats() -> None:
    assert [fmt_num(x) for x in (12.9, 13.0, 12.43, 1466.0, None)] == ["12.9", "13.0", "12.43", "1,466.0", "—"]
    assert [fmt_pct(26), fmt_pct(100, approx=True), fmt_pct(54.1), fmt_pct(None), fmt_pct(None, absent=True)] == [
        "26%", "~100%", "54.1%", "—", "absent"]  # fmt: skip


def test_a_profile_written_by_bench_profile_is_read(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "prof")
    run.write_json("profile.json", {  # the shape `bench profile` writes (bench/profile/analysis.py, to_json)
        "schema_version": 1, "steps": 20,
        "categories": {"dtype_conversion": {"pct": 1.5, "ms": 3.0}, "tensor_core": {"pct": None, "ms": None},
                       "matmul_fp32": {"pct": 70.25, "ms": 140.5}, "other": {"pct": 28.25, "ms": 56.5}},
        "totals": {"device_ms": 200.0, "steps": 20, "ms_per_step": 10.0, "tok_s": 100.0, "distinct_ops": 42},
        "roofline": {"bytes_per_step": 395_000_000, "tok_s": 17.8, "tok_s_source": "gauge",
                     "bandwidth_bytes_s": 27e9, "share_pct": 26.04, "bandwidth_gib_s": 27e9 / 2**30},
    })  # fmt: skip
    report = build_report([run.path], tmp_path / "out")
    md = report.markdown.read_text()
    for line in ("| dtype conversion | 1.5% |", "| fp32 matrix-vector (gemv) | 70.2% |", "| tensor core | absent |",
                 "| total kernel time | 200.0 ms |", "| distinct kernels | 42 |", "| decode gauge (sweep) | 17.8 tok/s |",
                 "| device-time rate (1000 / device ms per step) | 100.0 tok/s |",
                 "| bandwidth | 25.146 GiB/s |", "| bandwidth source | measured (device copy) |",
                 "| bandwidth roofline share, as reported | 26.0% |"):  # fmt: skip
        assert line in md
    rows = {r["metric"]: r for r in _csv(tmp_path / "out" / "profile.csv")}
    assert rows["tensor_core_pct"][run.name] == "absent" and rows["fp32_matmul_pct"][run.name] == "70.25"
    assert "read_bandwidth_gib_s" not in rows and "read-only bandwidth" not in md  # profiled before the read probe
    prof = json.loads((run.path / "profile.json").read_text())
    run.write_json("profile.json", {**prof, "read_bandwidth": {"bytes_per_s": 33e9, "gib_s": 33e9 / 2**30}})
    build_report([run.path], tmp_path / "out-read")
    md = (tmp_path / "out-read" / "report.md").read_text()
    assert "| fastest read-only probe | 30.734 GiB/s |" in md
    assert "| bandwidth roofline share, as reported | 26.0% |" in md  # still the copy's
    rows = {r["metric"]: r for r in _csv(tmp_path / "out-read" / "profile.csv")}
    assert float(rows["read_bandwidth_gib_s"][run.name]) == 33e9 / 2**30  # unrounded


@pytest.mark.parametrize("quant", ["none", "w8", "w4:64,ple8", "ple4,int8_lm_head"])
def test_a_runs_layout_counts_what_the_engine_accounting_counts(quant) -> None:
    """`run_layout` (a run's manifest quantization and dtypes) gives the bytes of `model.accounting`: the roofline
    module keeps no arithmetic of its own."""
    from bench.profile.roofline import run_layout
    from model.accounting import decode_weight_bytes, weight_bytes
    from model.quantspec import parse_quant

    layout = run_layout(quant, "bfloat16", "float32")
    spec = parse_quant(quant)
    assert decode_step_bytes(E2B, layout).weight_bytes == decode_weight_bytes(E2B, 2, scale_itemsize=4, quant=spec)
    assert stored_weight_bytes(E2B, layout) == weight_bytes(E2B, 2, scale_itemsize=4, quant=spec)
    if spec.layer_bits:  # the layer projections are packed: the body term reads fewer bytes than dense
        dense = decode_step_bytes(E2B, run_layout(None, "bfloat16"))
        assert decode_step_bytes(E2B, layout).terms[0].bytes < dense.terms[0].bytes
