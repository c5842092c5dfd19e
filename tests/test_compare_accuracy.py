"""The accuracy part of `bench compare`: next-token logits recorded per cell (`bench.runs.logits`), read back, and
compared (max and mean |Δlogit|, same argmax), greedy-token agreement with the share of equal positions, and runs
that recorded no logits ("no logits recorded", never a failure)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import bench_captured
from runfolders import REFERENCE_RUNS, make_measured_run

from bench.errors import RunFolderError
from bench.report.compare import compare_runs, logit_error
from bench.runs import create_run, validate_run
from bench.runs.logits import logits_path, read_logits, read_logits_file, read_step_summaries, write_logits

IDS = [11, 22, 33, 44, 55, 66, 77, 88]
V = 64


def _vector(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(V) * 0.1).astype(np.float32)


def _runs_with_logits(tmp_path: Path, base_logits: dict, cand_logits: dict, cand_ids=None):
    base = make_measured_run(tmp_path, "dense", token_ids=lambda n: IDS)
    cand = make_measured_run(tmp_path, "quant", token_ids=cand_ids or (lambda n: IDS))
    for run, given in ((base, base_logits), (cand, cand_logits)):
        for n, values in given.items():
            write_logits(run.path, n, values)
    return base, cand


# ---- the files -------------------------------------------------------------------------------------------------------
def test_logits_round_trip_as_npy_that_numpy_reads(tmp_path: Path) -> None:
    x = _vector(0)
    path = write_logits(tmp_path, 41, x)
    assert path == logits_path(tmp_path, 41) == tmp_path / "logits" / "41.npy"
    assert path.stat().st_size == 128 + 4 * V  # the size the module docstring states: 32,896 bytes at V = 8192
    np.testing.assert_array_equal(np.load(path), x)  # a standard .npy file
    assert np.load(path).dtype == np.float32
    back = read_logits_file(path)
    np.testing.assert_array_equal(np.asarray(back, np.float32), x)  # float32 bits kept exactly
    np.save(tmp_path / "logits" / "521.npy", _vector(1))  # and numpy's own file reads back here
    assert sorted(read_logits(tmp_path)) == [41, 521]
    assert read_logits(tmp_path / "elsewhere") == {}  # no logits folder: an older run


def test_bad_logits_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="NaN or infinity"):
        write_logits(tmp_path, 41, [0.0, float("nan")])
    with pytest.raises(ValueError, match="none"):
        write_logits(tmp_path, 41, [])
    folder = tmp_path / "logits"
    folder.mkdir()
    np.save(folder / "1.npy", np.zeros(4, np.float64))
    np.save(folder / "2.npy", np.zeros((2, 2), np.float32))
    (folder / "3.npy").write_bytes(b"not an npy file")
    cut = write_logits(tmp_path, 4, _vector(2))
    cut.write_bytes(cut.read_bytes()[:-4])
    cases = [("1.npy", "not a float32"), ("2.npy", "not a float32"), ("3.npy", "not a float32"), ("4.npy", "holds 252")]
    for name, needle in cases:
        with pytest.raises(RunFolderError, match=needle):
            read_logits_file(folder / name)


def test_logit_error_is_max_and_mean_absolute_difference() -> None:
    a, b = [0.0, 1.0, -2.0, 0.5], [0.25, 1.0, -1.0, 0.0]
    assert logit_error(a, b) == (1.0, pytest.approx((0.25 + 0 + 1.0 + 0.5) / 4))
    with pytest.raises(ValueError):
        logit_error([1.0], [1.0, 2.0])


# ---- compare -----------------------------------------------------------------------------------------------------------
def test_compare_reports_logit_error_and_token_agreement(tmp_path: Path, capsys) -> None:
    dense = {41: _vector(0), 521: _vector(1)}
    noise = {41: _vector(10) * 0.01, 521: np.zeros(V, np.float32)}
    quant = {n: dense[n] + noise[n] for n in dense}
    quant[521][int(np.argmax(dense[521]))] -= 1.0  # the top logit falls: the argmax changes at 521
    diverged = IDS[:5] + [999, 77, 998]  # differs at 5 and 7; equal at 6
    base, cand = _runs_with_logits(tmp_path, dense, quant, cand_ids=lambda n: diverged if n == 521 else IDS)
    result = compare_runs(base.path, cand.path)
    by_size = {g.input_tokens: g for g in result.logits}
    d41 = np.abs(quant[41] - dense[41])
    assert by_size[41].max_abs == pytest.approx(float(d41.max()), rel=1e-6)
    assert by_size[41].mean_abs == pytest.approx(float(d41.mean()), rel=1e-5)
    assert by_size[41].argmax_equal is True and by_size[41].vocab == V and by_size[41].note is None
    assert by_size[521].max_abs == pytest.approx(1.0, rel=1e-6) and by_size[521].argmax_equal is False
    tokens = {t.input_tokens: t for t in result.tokens}
    assert (tokens[41].equal_tokens, tokens[41].equal_share) == (8, 1.0)
    assert (tokens[521].first_divergence, tokens[521].equal_tokens, tokens[521].equal_share) == (5, 6, 0.75)
    assert result.passed  # accuracy is shown, never a threshold (--require-same-tokens is the token gate)
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path)], capsys)
    assert code == 0
    assert "accuracy" in out and "8/8 (100.0%)" in out and "6/8 (75.0%)" in out
    cells = next([c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "6/8" in line)
    assert cells[:3] == ["521", "6/8 (75.0%)", "5"] and float(cells[3]) == pytest.approx(1.0) and cells[5] == "no"
    assert f"{by_size[41].max_abs:.4g}" in out


def test_runs_without_logits_say_so_and_still_compare(tmp_path: Path, capsys) -> None:
    base, cand = _runs_with_logits(tmp_path, {}, {41: _vector(0)})  # old baseline; candidate has 41 only
    result = compare_runs(base.path, cand.path)
    notes = {g.input_tokens: g.note for g in result.logits}
    assert notes == {41: "no logits recorded in the baseline", 521: "no logits recorded in the baseline and candidate"}
    assert all(g.max_abs is None for g in result.logits) and result.passed
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path)], capsys)
    assert code == 0 and "no logits recorded in the baseline" in out
    t4g, l4 = REFERENCE_RUNS  # published runs: no samples, no logits
    published = compare_runs(t4g, l4, max_slowdown_pct=100.0)
    assert {g.note for g in published.logits} == {"no logits recorded in the baseline and candidate"}


def test_vocabularies_that_differ_are_named(tmp_path: Path) -> None:
    base, cand = _runs_with_logits(tmp_path, {41: _vector(0)}, {41: np.zeros(V + 1, np.float32)})
    (g, *_) = compare_runs(base.path, cand.path).logits
    assert g.max_abs is None and g.note == "vocabularies differ: 64 and 65 logits"


# ---- the sweep records them ---------------------------------------------------------------------------------------------
def test_the_in_process_sweep_records_each_cells_next_token_logits(tiny_checkpoint, tmp_path: Path) -> None:
    from runfolders import manifest

    from bench.sweep.local import SweepConfig, build_prompts, run_sweep
    from model.engine import load_engine

    engine, _ = load_engine(tiny_checkpoint, log_policy=False)
    config = SweepConfig(inputs=(20, 40), max_new_tokens=4, repeats=1)
    run = create_run(tmp_path, "logits", "cpu", manifest())
    rows = run_sweep(engine, config, run)
    logits = read_logits(run.path)
    assert sorted(logits) == [20, 40] and all(r.valid for r in rows)
    prompts = build_prompts(engine, config)
    for n, values in logits.items():
        z = np.asarray(values, np.float32)
        assert z.shape == (engine.cfg.vocab_size,) and np.isfinite(z).all()
        np.testing.assert_array_equal(z, engine.next_token_logits(prompts[n].ids, config.max_new_tokens))
        first = [s.token_ids[0] for s in run.samples() if s.input_tokens == n and s.kind == "timed"]
        assert first == [int(np.argmax(z))]  # the distribution the first greedy token was chosen from
    steps = read_step_summaries(run.path)
    assert sorted(steps) == [20, 40]
    for n, summary in steps.items():
        (ids,) = [s.token_ids for s in run.samples() if s.input_tokens == n and s.kind == "timed"]
        assert list(summary.chosen) == list(ids) and len(summary) == config.max_new_tokens
        assert all(r != c for r, c in zip(summary.runner_up, summary.chosen, strict=True))
        # greedy tokens: the teacher-forced logits rank the chosen token first, up to the two forms' rounding
        assert min(summary.margin(t) for t in range(len(summary))) > -1e-4
        z0 = np.asarray(logits[n], np.float32)  # step 0 agrees with the prefill's vector (float32 engine)
        assert abs(summary.chosen_logit[0] - z0[ids[0]]) < 1e-4
        assert abs(summary.runner_up_logit[0] - np.max(np.delete(z0, ids[0]))) < 1e-4
    run.finish("complete")
    assert validate_run(run.path) == []
