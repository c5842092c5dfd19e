"""`bench compare` and the regression gate: deltas with spreads, token agreement, differences, exit codes; and
the CLI of the run-folder commands (user errors: one line, exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench_captured
from runfolders import REFERENCE_RUNS, make_measured_run

from bench.errors import RunFolderError
from bench.report.compare import (
    compare_runs,
    first_divergence,
    manifest_differences,
    single_variable,
)

T4G, L4 = REFERENCE_RUNS
IDS = [11, 22, 33, 44, 55, 66, 77, 88]



def _pair(tmp_path: Path, *, cand_gauge: float = 20.0, cand_ids=None, **cand_kwargs):
    base = make_measured_run(tmp_path, "base", gauge=20.0, token_ids=lambda n: IDS)
    cand = make_measured_run(tmp_path, "cand", gauge=cand_gauge, token_ids=cand_ids or (lambda n: IDS), **cand_kwargs)
    return base, cand


# ---- the library ---------------------------------------------------------------------------------------------------
def test_each_hosts_copy_bandwidth_is_a_note_never_a_threshold(tmp_path: Path) -> None:
    base, cand = _pair(tmp_path)
    assert not any("copy bandwidth" in n for n in compare_runs(base.path, cand.path).notes)  # neither measured one
    gib = 2**30
    base.update_manifest(rates={"copy_bandwidth": {"bytes_per_s": 18.75 * gib}})  # a run from before the end probe
    assert not any("copy bandwidth" in n for n in compare_runs(base.path, cand.path).notes)  # one side only
    cand.update_manifest(rates={"copy_bandwidth": {"bytes_per_s": 22.5 * gib},
                                "copy_bandwidth_end": {"bytes_per_s": 20.25 * gib}})  # fmt: skip
    result = compare_runs(base.path, cand.path)
    assert ("device copy bandwidth (GiB/s, before the first cell -> after the last): baseline 18.75, candidate 22.50 "
            "-> 20.25; the candidate's start is +20.0% against the baseline's") in result.notes
    assert result.passed and result.failures == []
    assert not any("host" in n for n in result.notes)  # the sweep's word: the device's memory (a CPU's on CPU)


def test_identical_runs_pass(tmp_path: Path) -> None:
    base, cand = _pair(tmp_path)
    result = compare_runs(base.path, cand.path, require_same_tokens=True)
    assert result.passed and result.exit_code == 0 and result.failures == []
    assert [c.gauge_delta_pct for c in result.cells] == [pytest.approx(0.0)] * 2
    assert all(c.within_noise("gauge") for c in result.cells)
    assert [t.status for t in result.tokens] == ["identical", "identical"]
    assert result.single_variable is True and result.differences == []


def test_a_slowdown_beyond_the_limit_fails_and_names_the_cell(tmp_path: Path) -> None:
    base, cand = _pair(tmp_path, cand_gauge=18.0)  # 10% slower decode
    result = compare_runs(base.path, cand.path, max_slowdown_pct=5.0)
    assert result.exit_code == 1
    assert result.cells[0].gauge_delta_pct == pytest.approx(-10.0)
    assert result.cells[0].spread(result.cells[0].candidate, "gauge") == (pytest.approx(17.82), pytest.approx(18.18))
    assert result.cells[0].within_noise("gauge") is False
    assert any(f.startswith("41 input tokens: gauge tok/s -10.0% vs baseline (limit -5%; interval -11.8%..-8.2%)")
               for f in result.failures)  # the interval: the two runs' repeats resampled (docs/method.md)
    assert compare_runs(base.path, cand.path, max_slowdown_pct=15.0).exit_code == 0


def test_token_divergence_reports_the_first_differing_index(tmp_path: Path) -> None:
    diverged = IDS[:5] + [999, 998, 997]
    base, cand = _pair(tmp_path, cand_ids=lambda n: diverged if n == 521 else IDS)
    result = compare_runs(base.path, cand.path)
    by_size = {t.input_tokens: t for t in result.tokens}
    assert by_size[41].status == "identical" and by_size[41].first_divergence is None
    assert by_size[521].status == "differ" and by_size[521].first_divergence == 5
    assert result.exit_code == 0  # tokens are not required by default
    strict = compare_runs(base.path, cand.path, require_same_tokens=True)
    assert strict.exit_code == 1
    assert "521 input tokens: generated ids differ from token 5" in strict.failures


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) is None  # fewer tokens is not a divergence
    assert first_divergence([1, 5], [1, 2, 3]) == 1


def test_invalid_or_missing_candidate_cells_fail(tmp_path: Path) -> None:
    base, cand = _pair(tmp_path, cell_kwargs={521: {"compile_events": 2}})
    result = compare_runs(base.path, cand.path)
    assert result.exit_code == 1
    assert any(f.startswith("521 input tokens: candidate cell invalid (6 compile event(s)") for f in result.failures)
    short = make_measured_run(tmp_path, "short", inputs=(41,), token_ids=lambda n: IDS)
    result = compare_runs(base.path, short.path)
    assert "521 input tokens: the candidate has no cell (the baseline has one)" in result.failures


def test_differences_name_build_checkpoint_config_and_versions(tmp_path: Path) -> None:
    base, cand = _pair(tmp_path, build_id="ffffffffffff", config={"buckets": [64, 1024], "max_length": 4160},
                       jax="0.11.1", content_hash="sha256:beef")  # fmt: skip
    result = compare_runs(base.path, cand.path)
    described = [d.describe() for d in result.differences]
    assert "build id: 0123456789ab vs ffffffffffff" in described
    assert "checkpoint hash: sha256:feed vs sha256:beef" in described
    assert "configuration.buckets: [64, 512, 2048, 4096] vs [64, 1024]" in described
    assert "version jax: 0.12.0 vs 0.11.1" in described
    assert result.single_variable is False
    assert result.exit_code == 0  # differences are facts, not thresholds


def test_single_variable_is_not_established_when_values_are_unknown() -> None:
    t4g = json.loads((T4G / "manifest.json").read_text())
    l4 = json.loads((L4 / "manifest.json").read_text())
    same, diffs = single_variable(t4g, l4)
    assert same is None
    assert [d.field for d in diffs] == ["checkpoint hash", "configuration.max_model_len"]
    assert {d.field for d in manifest_differences(t4g, l4)} >= {"device", "compute dtype", "host architecture"}


def test_published_runs_compare_without_samples(tmp_path: Path) -> None:
    result = compare_runs(T4G, L4)
    assert result.exit_code == 0
    assert result.cells[0].gauge_delta_pct == pytest.approx(100 * (48.5 - 12.9) / 12.9)
    assert result.cells[0].spread(result.cells[0].baseline, "gauge") is None
    assert {t.status for t in result.tokens} == {"unknown"}
    strict = compare_runs(T4G, L4, require_same_tokens=True)
    assert strict.exit_code == 1 and "token agreement cannot be checked" in strict.failures[0]
    backwards = compare_runs(L4, T4G)  # the slower card as a candidate fails the gate
    assert backwards.exit_code == 1
    assert "3593 input tokens: candidate cell invalid (no figure published for this cell)" in backwards.failures


@pytest.mark.parametrize("status", ["running", "incomplete", "failed"])
def test_unfinished_runs_are_refused(tmp_path: Path, status: str) -> None:
    base = make_measured_run(tmp_path, "base")
    half = make_measured_run(tmp_path, "half", status=status)
    with pytest.raises(RunFolderError, match=f"2026-11-30-half-cpu: status is '{status}', not complete "):
        compare_runs(base.path, half.path)
    with pytest.raises(RunFolderError, match=f"status is '{status}'"):
        compare_runs(half.path, base.path, require_same_tokens=True)


# ---- the command line ------------------------------------------------------------------------------------------------
def test_cli_compare_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = _pair(tmp_path, cand_gauge=18.0)
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path)], capsys)
    assert code == 1 and "FAIL: 41 input tokens: gauge tok/s -10.0%" in out and "verdict: FAIL" in out
    code, out, _ = bench_captured(["compare", "2026-11-30-base-cpu", "2026-11-30-cand-cpu", "--runs-dir", str(tmp_path),
                            "--max-slowdown", "12%"], capsys)  # fmt: skip
    assert code == 0 and "verdict: PASS (max slowdown 12%)" in out
    assert "identical" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["compare", "nope-a", "nope-b"], "error: run 'nope-a' not found"),
        (["compare", str(T4G), str(L4), "--max-slowdown", "fast"], "error: --max-slowdown 'fast': expected"),
        (["compare", str(T4G), str(L4), "--max-slowdown", "-3%"], "error: --max-slowdown '-3%': expected"),
        (["report", "nope", "--out", "{tmp}/out"], "error: run 'nope' not found"),
        (["runs", "validate", "nope"], "error: run 'nope' not found"),
        (["runs", "list", "--runs-dir", "{tmp}/missing"], "error: runs folder"),
    ],
)
def test_cli_user_errors_are_one_line_and_exit_2(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = bench_captured([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2
    assert err.startswith(expected), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_compare_refuses_an_incomplete_run_and_report_a_failed_one(tmp_path, capsys) -> None:
    base = make_measured_run(tmp_path, "base")
    half = make_measured_run(tmp_path, "half", status="incomplete")
    code, _, err = bench_captured(["compare", str(base.path), str(half.path), "--require-same-tokens"], capsys)
    assert code == 2 and "2026-11-30-half-cpu: status is 'incomplete', not complete (an interrupted run; " in err
    assert "`bench report` shows its finished cells" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    broke = make_measured_run(tmp_path, "broke", status="failed")
    code, _, err = bench_captured(["report", str(broke.path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "2026-11-30-broke-cpu: status is 'failed', not complete or incomplete" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_report_skips_bad_folders_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_measured_run(tmp_path, "good")
    make_measured_run(tmp_path, "half", status="running")
    code, out, err = bench_captured(["report", "--runs-dir", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert code == 0
    assert "warning: skipped 2026-11-30-half-cpu: " in err
    assert f"wrote {tmp_path / 'out' / 'report.md'} from 1 run(s)" in out
    assert (tmp_path / "out" / "sweep.csv").exists()


def test_cli_runs_list_and_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = make_measured_run(tmp_path, "good")
    bad = make_measured_run(tmp_path, "bad")
    (bad.path / "cells.jsonl").write_text("{broken\n")
    code, out, _ = bench_captured(["runs", "list", "--runs-dir", str(tmp_path)], capsys)
    assert code == 0 and "2026-11-30-good-cpu" in out and "2026-11-30-bad-cpu" in out and "corrupt JSON" in out
    code, out, _ = bench_captured(["runs", "validate", str(good.path)], capsys)
    assert code == 0 and "valid (schema version 2)" in out  # the version the folder has, not a constant
    code, out, _ = bench_captured(["runs", "validate", str(T4G)], capsys)
    assert code == 0 and "valid (schema version 1)" in out
    code, out, _ = bench_captured(["runs", "validate", "2026-11-30-bad-cpu", "--runs-dir", str(tmp_path)], capsys)
    assert code == 1 and "cells.jsonl line 1: corrupt JSON" in out and "cells.csv: 2 rows but cells.jsonl has 0" in out


def test_a_partial_candidate_is_compared_and_said_in_the_verdict(tmp_path: Path, capsys) -> None:
    base = make_measured_run(tmp_path, "base")
    cand = make_measured_run(tmp_path, "cand", stopped={521: ("max-duration", 6)})
    result = compare_runs(base.path, cand.path)
    assert result.passed  # partial cells count toward the verdict: compared on the repeats they have
    assert result.partial == [f"candidate {cand.name}, 521 input tokens: 3 of 6 repeats (max-duration)"]
    assert result.verdict.startswith("PASS with partial cells: candidate ")
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path)], capsys)
    assert code == 0 and "◐ partial cell: fewer timed repeats than planned" in out
    assert "partial: candidate" in out and "3 of 6 repeats (max-duration)" in out
    assert "verdict: PASS with partial cells:" in out
    code, out, _ = bench_captured(["compare", str(cand.path), str(base.path)], capsys)
    assert "partial: baseline" in out  # a partial baseline is said too


def test_complete_runs_say_no_partial_cells(tmp_path: Path) -> None:
    base, cand = make_measured_run(tmp_path, "base"), make_measured_run(tmp_path, "cand")
    result = compare_runs(base.path, cand.path)
    assert result.partial == [] and result.verdict == "PASS"


# ---- the verdicts that know the noise (docs/method.md, "Comparisons") -----------------------------------------------
def _aa_session(runs_dir: Path, ratios: list[float], *, aa: bool = True, label: str = "aa"):
    """A complete A/A session of `bench ab` (kind "ab") whose pairs have these ratios B / A (A at 20 tok/s)."""
    from bench.ab.archive import Measurement, pairs_csv
    from bench.runs import create_run
    from runfolders import manifest

    run = create_run(runs_dir, label, "cpu", {**manifest(build_id=None), "kind": "ab", "ab": {"aa": aa}},
                     date="2026-12-01")  # fmt: skip
    rows = []
    for k, r in enumerate(ratios):
        for side, value in (("A", 20.0), ("B", 20.0 * r)):
            rows.append(Measurement(index=len(rows), kind="pair", pair=k, side=side, value=value, lo=value, hi=value,
                                    repeats=3, repeat_values=(value,) * 3, valid=True, build_id="0123456789ab",
                                    run=None, exit_code=0, seconds=10.0, started_at="2026-12-01T00:00:00+00:00"))  # fmt: skip
    (run.path / "pairs.csv").write_text(pairs_csv(rows))
    run.finish("complete")
    return run


def test_the_default_gate_is_twice_the_repeats_noise(tmp_path: Path) -> None:
    base, cand = _pair(tmp_path)  # repeats at -1%, 0, +1% on both sides
    result = compare_runs(base.path, cand.path)
    noise = result.noise
    assert noise.gate_from == "noise" and noise.calibration is None
    # the median over cells and metrics of the intervals' half-widths: the gauge's reach the extremes of 3 repeats
    # (+-2.0%), the end-to-end rate's are narrower (its TTFT is a part that the jitter moves less)
    assert 1.0 < noise.repeats_pct <= 100 * (1.01 / 0.99 - 1) + 1e-9
    assert noise.gate_pct == pytest.approx(2 * noise.repeats_pct)
    assert result.word == "PASS" and result.exit_code == 0
    assert result.cells[0].verdicts == {"gauge": "PASS", "e2e": "PASS"}
    assert result.cells[0].intervals["gauge"] == (pytest.approx(0.99 / 1.01), pytest.approx(1.01 / 0.99))


@pytest.mark.parametrize(
    ("cand_gauge", "word", "code"),
    [(20.0, "PASS", 0), (19.2, "UNRESOLVED", 3), (18.0, "FAIL", 1)],  # no change; 4% slower; 10% slower
)
def test_pass_unresolved_and_fail_by_the_interval_against_the_gate(tmp_path: Path, cand_gauge: float, word: str,
                                                                   code: int, capsys) -> None:  # fmt: skip
    """Gate about 3.4% (2 x 1.7% of noise): a 4% slower candidate's gauge interval (-5.9..-2.1%) reaches across it."""
    base, cand = _pair(tmp_path, cand_gauge=cand_gauge)
    result = compare_runs(base.path, cand.path)
    assert result.word == word and result.exit_code == code
    assert result.cells[0].verdicts["gauge"] == word
    out_code, out, _ = bench_captured(["compare", str(base.path), str(cand.path), "--calibration", "none"], capsys)
    assert out_code == code and f"verdict: {word} (max slowdown {result.max_slowdown_pct:.3g}%)" in out
    assert f"noise: gate {result.max_slowdown_pct:.1f}% (2 x the noise, at least 1%); noise: the runs' repeats +-" in out
    if word == "UNRESOLVED":
        assert (f"UNRESOLVED: 41 input tokens: gauge tok/s -4.0% vs baseline (limit -{result.max_slowdown_pct:.3g}%; "
                "interval -5.9%..-2.1%)") in out


def test_the_gate_flag_overrides_the_noise(tmp_path: Path, capsys) -> None:
    base, cand = _pair(tmp_path, cand_gauge=19.2)
    assert compare_runs(base.path, cand.path, max_slowdown_pct=10.0).word == "PASS"
    assert compare_runs(base.path, cand.path, max_slowdown_pct=1.0).word == "FAIL"
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path), "--gate", "10%"], capsys)
    assert code == 0 and "gate 10.0% (as given)" in out


def test_an_aa_calibration_widens_every_interval(tmp_path: Path, capsys) -> None:
    base, cand = _pair(tmp_path, cand_gauge=18.0)  # 10% slower: FAIL on the repeats alone
    assert compare_runs(base.path, cand.path).word == "FAIL"
    aa = _aa_session(tmp_path, [1.06, 0.95, 1.04, 0.97, 1.05, 0.94])
    result = compare_runs(base.path, cand.path, calibration=aa.path)
    c = result.noise.calibration_pct
    assert result.noise.calibration == aa.name and result.noise.calibration_pairs == 6
    assert 9.0 < c < 11.0 and result.noise.noise_pct == c and result.noise.gate_pct == pytest.approx(2 * c)
    lo, hi = result.cells[0].intervals["gauge"]
    assert lo == pytest.approx(0.9 / (1 + c / 100)) and hi == pytest.approx(0.9 * (1 + c / 100))
    assert result.word == "PASS"  # 10% slower, where runs of one build move by ~10% alone: inside a gate of ~20%
    assert compare_runs(base.path, cand.path, 5.0, calibration=aa.path).word == "UNRESOLVED"  # a 5% gate: can't tell
    # found by itself in --runs-dir: the nearest usable A/A session of the candidate's host (bench.runs.calibration)
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path), "--runs-dir", str(tmp_path), "--gate",
                                   "5%"], capsys)  # fmt: skip
    assert code == 3 and f"the A/A session {aa.name} +-" in out and "(6 pairs)" in out


def test_a_calibration_must_be_an_aa_session(tmp_path: Path, capsys) -> None:
    base, cand = _pair(tmp_path)
    ab = _aa_session(tmp_path, [1.1, 1.1, 1.1], aa=False, label="ab")
    with pytest.raises(RunFolderError, match="not an A/A session of `bench ab`"):
        compare_runs(base.path, cand.path, calibration=ab.path)
    code, _, err = bench_captured(["compare", str(base.path), str(cand.path), "--calibration", str(base.path)], capsys)
    assert code == 2 and "not an A/A session" in err and len(err.strip().splitlines()) == 1
    code, _, err = bench_captured(["compare", str(base.path), str(ab.path)], capsys)  # a session is no sweep
    assert code == 2 and "an A/B session of `bench ab`, which holds ratios, not cells" in err
