"""Run folders: atomic writes that survive a kill, resume, schema validation naming the file, name clashes,
and the per-cell summary of raw samples."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from runfolders import (
    MAX_NEW,
    REPO,
    cell_samples,
    make_measured_run,
    make_sample,
    manifest,
)

from bench.runs import folder as runs_mod
from bench.errors import InputError, RunFolderError
from bench.runs import (
    CellRow,
    create_run,
    failed_cell,
    list_runs,
    open_run,
    summarize_cell,
    validate_run,
)


# ---- creating, naming, clashing ----------------------------------------------------------------------------------
def test_create_run_names_the_folder_and_starts_running(tmp_path: Path) -> None:
    run = create_run(tmp_path / "runs", "smoke", "cpu", manifest(), date="2026-11-30")
    assert run.path == tmp_path / "runs" / "2026-11-30-smoke-cpu"
    m = json.loads((run.path / "manifest.json").read_text())
    assert m["schema_version"] == 2 and m["status"] == "running" and m["name"] == run.name
    assert m["provenance"] == {"kind": "measured", "source": None}
    assert m["started_at"] and m["ended_at"] is None
    assert (run.path / "run.log").exists()
    assert validate_run(run.path) == []


def test_run_log_lines_carry_the_time_given_or_now(tmp_path: Path) -> None:
    """A line about something that happened before the folder existed keeps its own time (`at`); others get now."""
    run = create_run(tmp_path / "runs", "smoke", "cpu", manifest(), date="2026-11-30")
    run.log("device policy: before the folder", at="2026-01-02T03:04:05+00:00")
    run.log("a line of now")
    first, second = (run.path / "run.log").read_text().splitlines()
    assert first == "2026-01-02T03:04:05+00:00 device policy: before the folder"
    assert second.endswith(" a line of now") and not second.startswith("2026-01-02T03:04:05")
    run.finish("complete")


def test_a_name_clash_is_an_error_and_loses_nothing(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "same")
    before = (run.path / "cells.jsonl").read_bytes()
    with pytest.raises(RunFolderError) as err:
        create_run(tmp_path, "same", "cpu", manifest(), date="2026-11-30")
    message = str(err.value)
    assert "2026-11-30-same-cpu already exists" in message and "--name" in message and "--resume" in message
    assert "\n" not in message
    assert (run.path / "cells.jsonl").read_bytes() == before


def test_an_unwritable_runs_folder_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(RunFolderError, match=r"runs folder .*a-file/runs is not writable"):
        create_run(blocker / "runs", "x", "cpu", manifest())


@pytest.mark.parametrize("label", ["", "has space", "../escape", "-leading-dash"])
def test_bad_labels_are_refused(tmp_path: Path, label: str) -> None:
    with pytest.raises(InputError, match="run label"):
        create_run(tmp_path, label, "cpu", manifest())


def test_a_manifest_that_breaks_the_schema_is_refused_at_creation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="build_id"):
        create_run(tmp_path, "x", "cpu", {**manifest(), "build_id": 12})
    assert not any(tmp_path.iterdir())


# ---- writing and reading back --------------------------------------------------------------------------------------
def test_cells_and_samples_round_trip_and_pandas_reads_both(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "rt", inputs=(41, 521, 2057))
    again = open_run(run.path)
    assert again.status == "complete" and again.manifest["ended_at"]
    cells = again.cells()
    assert [c.input_tokens for c in cells] == [41, 521, 2057]
    assert len(again.samples()) == 1 + 3 * 4  # one cold, then warm-up + 3 timed per cell
    jl = pd.read_json(run.path / "cells.jsonl", lines=True)
    cs = pd.read_csv(run.path / "cells.csv")
    assert list(jl["input_tokens"]) == list(cs["input_tokens"]) == [41, 521, 2057]
    assert jl["gauge_tok_s_median"].tolist() == pytest.approx(cs["gauge_tok_s_median"].tolist())
    assert cs["valid"].dtype == bool and cs["valid"].all()
    samples = pd.read_json(run.path / "samples.jsonl", lines=True)
    assert set(samples["kind"]) == {"cold", "warmup", "timed"}
    assert samples["step_ms"].map(len).eq(MAX_NEW - 1).all()


def test_append_cell_replaces_the_row_of_the_same_size(tmp_path: Path) -> None:
    run = create_run(tmp_path, "replace", "cpu", manifest())
    run.append_cell(failed_cell(41, "out of memory", bucket=64, max_new_tokens=MAX_NEW, repeats=3))
    samples = cell_samples(41)
    run.append_samples(samples)
    run.append_cell(summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64))
    (row,) = open_run(run.path).cells()
    assert row.status == "ok" and row.valid


def test_writers_refuse_bad_rows_and_names(tmp_path: Path) -> None:
    run = create_run(tmp_path, "bad", "cpu", manifest())
    with pytest.raises(ValueError, match="compile_cache"):
        run.update_manifest(compile_cache={"dir": None, "hits": "many", "misses": 0})
    assert open_run(run.path).manifest["compile_cache"]["hits"] == 3
    run.update_manifest(compile_cache={"dir": "/x", "hits": 7, "misses": 0})
    assert open_run(run.path).manifest["compile_cache"]["hits"] == 7
    row = summarize_cell(cell_samples(41), max_new_tokens=MAX_NEW)
    with pytest.raises(ValueError, match="gauge_tok_s_median"):
        run.append_cell(CellRow(**{**row.to_dict(), "gauge_tok_s_median": "fast"}))
    with pytest.raises(ValueError, match="kind"):
        run.append_samples([{**make_sample(41).to_dict(), "kind": "lukewarm"}])
    with pytest.raises(ValueError):
        run.write_json("manifest.json", {})
    assert not (run.path / "cells.jsonl").exists() and not (run.path / "samples.jsonl").exists()


# ---- crashes and resume ---------------------------------------------------------------------------------------------
KILLED_SWEEP = textwrap.dedent(
    """
    import os, signal, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from bench.runs import create_run, summarize_cell
    from runfolders import MAX_NEW, cell_samples, manifest
    run = create_run({runs!r}, "killed", "cpu", manifest(), date="2026-11-30")
    for i, n in enumerate((41, 521, 2057)):
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # the sweep dies in its third cell
        samples = cell_samples(n, cold=i == 0)
        run.append_samples(samples)
        run.append_cell(summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64))
    """
)


def test_a_process_killed_after_two_cells_leaves_two_readable_cells(tmp_path: Path) -> None:
    script = KILLED_SWEEP.format(repo=str(REPO), tests=str(REPO / "tests"), runs=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    run = open_run(tmp_path / "2026-11-30-killed-cpu")
    assert run.status == "running"  # never marked complete
    assert run.finished_inputs() == [41, 521]
    assert all(c.valid for c in run.cells())
    assert {s.input_tokens for s in run.samples()} == {41, 521}
    assert validate_run(run.path) == []
    assert not list(run.path.glob(".*.tmp"))


def test_a_failed_write_keeps_the_previous_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_measured_run(tmp_path, "crash", inputs=(41, 521), status="running")
    before = (run.path / "cells.jsonl").read_text()
    calls = {"n": 0}
    real_replace = os.replace

    def failing_replace(src, dst):  # the disk fills up while the third cell is written
        calls["n"] += 1
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runs_mod.os, "replace", failing_replace)
    with pytest.raises(RunFolderError, match="cells.jsonl: cannot write"):
        run.append_cell(summarize_cell(cell_samples(2057), max_new_tokens=MAX_NEW))
    monkeypatch.setattr(runs_mod.os, "replace", real_replace)
    assert calls["n"] == 1
    assert (run.path / "cells.jsonl").read_text() == before
    assert open_run(run.path).finished_inputs() == [41, 521]
    assert not list(run.path.glob(".*.tmp"))


def test_resume_continues_an_interrupted_run(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "resume", inputs=(41, 521), status="incomplete")
    csv_lines = (run.path / "cells.csv").read_text().splitlines()
    (run.path / "cells.csv").write_text("\n".join(csv_lines[:2]) + "\n")  # killed between cells.jsonl and its mirror
    assert validate_run(run.path) == []  # an interrupted run may have its CSV mirror one row behind
    again = open_run(run.path)
    assert again.status == "incomplete"
    again.resume()
    assert open_run(run.path).status == "running"
    assert len(pd.read_csv(run.path / "cells.csv")) == 2  # resume rebuilt the mirror
    todo = [n for n in (41, 521, 2057) if n not in again.finished_inputs()]
    assert todo == [2057]
    samples = cell_samples(2057)
    again.append_samples(samples)
    again.append_cell(summarize_cell(samples, max_new_tokens=MAX_NEW))
    again.finish("complete")
    final = open_run(run.path)
    assert final.status == "complete" and final.finished_inputs() == [41, 521, 2057]
    assert "resumed" in (run.path / "run.log").read_text()
    with pytest.raises(RunFolderError, match="nothing to resume"):
        final.resume()


# ---- validation and opening ---------------------------------------------------------------------------------------
def _edit_manifest(path: Path, **changes) -> None:
    m = json.loads((path / "manifest.json").read_text())
    m.update(changes)
    for key in [k for k, v in changes.items() if v is ...]:
        del m[key]
    (path / "manifest.json").write_text(json.dumps(m))


def test_validation_names_the_file_and_line(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "v")
    lines = (run.path / "cells.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["gauge_tok_s_median"] = "fast"
    del bad["bucket"]
    lines[1] = json.dumps(bad)
    (run.path / "cells.jsonl").write_text("\n".join(lines) + "\n{not json\n")
    _edit_manifest(run.path, build_id=..., status="finished")
    problems = validate_run(run.path)
    assert "manifest.json: missing key 'build_id'" in problems
    assert any(p.startswith("manifest.json: status 'finished'") for p in problems)
    assert "cells.jsonl line 2: missing field 'bucket'" in problems
    assert any(p.startswith("cells.jsonl line 2: field 'gauge_tok_s_median'") for p in problems)
    assert any(p.startswith("cells.jsonl line 3: corrupt JSON") for p in problems)
    with pytest.raises(RunFolderError, match="manifest.json: missing key 'build_id'"):
        open_run(run.path)


def test_validation_of_samples_csv_and_profile(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "v2")
    (run.path / "cells.csv").write_text("input_tokens\n41\n")
    with open(run.path / "samples.jsonl", "a") as fh:
        fh.write(json.dumps({**make_sample(41).to_dict(), "kind": "hot"}) + "\n")
    run.write_json("profile.json", {"schema_version": 1, "categories": {"convert": {"pct": "lots"}}})
    problems = validate_run(run.path)
    assert "cells.csv: 1 rows but cells.jsonl has 2" in problems
    line = len((run.path / "samples.jsonl").read_text().splitlines())
    assert any(p.startswith(f"samples.jsonl line {line}: field 'kind' is 'hot'") for p in problems)
    assert any(p.startswith("profile.json: category 'convert'") for p in problems)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: (p / "manifest.json").write_text("{oops"), "manifest.json: corrupt JSON"),
        (lambda p: _edit_manifest(p, schema_version=3), "schema_version 3 is not supported"),
        (lambda p: (p / "manifest.json").unlink(), "manifest.json: missing"),
    ],
)
def test_open_and_validate_refuse_broken_manifests(tmp_path: Path, damage, expected: str) -> None:
    run = make_measured_run(tmp_path, "broken")
    damage(run.path)
    with pytest.raises(RunFolderError) as err:
        open_run(run.path)
    assert expected in str(err.value) and str(run.path) in str(err.value)
    (problem,) = validate_run(run.path)
    assert expected in problem


def test_a_published_run_must_not_hold_samples(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "pub")
    _edit_manifest(run.path, provenance={"kind": "published", "source": "a report"})
    assert "samples.jsonl: a published run must not hold raw samples (it never had any)" in validate_run(run.path)
    with pytest.raises(RunFolderError, match="no raw samples"):
        open_run(run.path).append_samples([make_sample(41)])
    _edit_manifest(run.path, provenance={"kind": "published", "source": None})
    assert any("must name its source" in p for p in validate_run(run.path))


def test_list_runs_skips_bad_folders_with_a_reason(tmp_path: Path) -> None:
    make_measured_run(tmp_path, "good")
    make_measured_run(tmp_path, "half", status="running")
    (tmp_path / "2026-11-30-corrupt-cpu").mkdir()
    (tmp_path / "2026-11-30-corrupt-cpu" / "manifest.json").write_text("[1, 2")
    (tmp_path / "stray-file.txt").write_text("ignored")
    summaries = {s.name: s for s in list_runs(tmp_path)}
    assert set(summaries) == {"2026-11-30-good-cpu", "2026-11-30-half-cpu", "2026-11-30-corrupt-cpu"}
    assert summaries["2026-11-30-good-cpu"].ok and summaries["2026-11-30-good-cpu"].cells == 2
    assert summaries["2026-11-30-half-cpu"].status == "running"
    assert not summaries["2026-11-30-corrupt-cpu"].ok
    assert "corrupt JSON" in summaries["2026-11-30-corrupt-cpu"].problem
    with pytest.raises(RunFolderError, match="does not exist"):
        list_runs(tmp_path / "missing")


def test_the_reference_runs_validate() -> None:
    for name in ("2026-08-28-full-run-cached-g5g", "2026-08-28-first-serve-g6"):
        path = REPO / "runs" / name
        assert validate_run(path) == []
        run = open_run(path)
        assert run.provenance == "published" and run.status == "complete"
        assert run.samples() == [] and not (path / "samples.jsonl").exists()


# ---- summarising a cell -------------------------------------------------------------------------------------------
def test_summary_takes_medians_of_the_timed_repeats_only() -> None:
    samples = cell_samples(41, gauge=20.0, cold=True)
    row = summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64)
    assert row.valid and row.invalid_reason is None and row.repeats == 3
    assert row.gauge_tok_s_median == pytest.approx(20.0)
    assert row.gauge_tok_s_min == pytest.approx(19.8) and row.gauge_tok_s_max == pytest.approx(20.2)
    assert row.gauge_tok_s_min <= row.gauge_tok_s_median <= row.gauge_tok_s_max
    assert row.e2e_tok_s_min <= row.e2e_tok_s_median <= row.e2e_tok_s_max
    assert row.gauge_tok_s_median >= row.e2e_tok_s_median
    assert row.generated_tokens_per_repeat == [MAX_NEW] * 3
    assert row.compile_events_timed == 0 and row.degenerate is False


def test_cold_ratios_are_separate_for_whole_request_and_ttft() -> None:
    samples = cell_samples(41, cold=True)
    cold = next(s for s in samples if s.kind == "cold")
    timed = [s for s in samples if s.kind == "timed"]
    row = summarize_cell(samples, max_new_tokens=MAX_NEW)
    assert row.cold_request_s == pytest.approx(cold.e2e_ms / 1000)
    assert row.cold_ttft_ms == pytest.approx(cold.ttft_ms)
    assert row.cold_warm_request_ratio == pytest.approx(cold.e2e_ms / sorted(s.e2e_ms for s in timed)[1])
    assert row.cold_warm_ttft_ratio == pytest.approx(cold.ttft_ms / sorted(s.ttft_ms for s in timed)[1])
    assert row.cold_warm_ttft_ratio != pytest.approx(row.cold_warm_request_ratio)
    assert summarize_cell(cell_samples(41), max_new_tokens=MAX_NEW).cold_request_s is None


def test_step_time_median_and_p99_pool_every_timed_step() -> None:
    samples = cell_samples(41)
    slow = samples[-1].step_ms.copy()
    slow[3] = 500.0  # one host hiccup in the last timed repeat
    samples[-1] = dataclasses.replace(samples[-1], step_ms=slow)
    row = summarize_cell(samples, max_new_tokens=MAX_NEW)
    steps = sorted(x for s in samples if s.kind == "timed" for x in s.step_ms)
    assert row.step_ms_median == pytest.approx(steps[len(steps) // 2])
    assert row.step_ms_median < row.step_ms_p99 <= 500.0


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"compile_events": 1}, "3 compile event(s) during timed repeat(s) 0, 1, 2"),
        ({"n": MAX_NEW - 1}, "repeat 0 generated 7 tokens, expected 8"),
        ({"degenerate": True}, "repeat 0 degenerate: token id 5"),
        ({"degenerate": None}, "repeat 0 has no degeneracy verdict"),
    ],
)
def test_invalid_cells_say_why(kwargs: dict, reason: str) -> None:
    row = summarize_cell(cell_samples(41, **kwargs), max_new_tokens=MAX_NEW)
    assert not row.valid
    assert reason in row.invalid_reason
    assert row.gauge_tok_s_median is not None  # the numbers are kept, marked invalid, never averaged in silently


def test_summary_needs_one_size_and_failed_cells_have_no_numbers() -> None:
    with pytest.raises(ValueError, match="one input size"):
        summarize_cell(cell_samples(41) + cell_samples(521), max_new_tokens=MAX_NEW)
    row = summarize_cell(cell_samples(41) + cell_samples(521), max_new_tokens=MAX_NEW, input_tokens=521)
    assert row.input_tokens == 521
    assert not summarize_cell([make_sample(41, "warmup")], max_new_tokens=MAX_NEW).valid
    failed = failed_cell(3593, "RESOURCE_EXHAUSTED: out of memory", bucket=4096)
    assert failed.status == "failed" and not failed.valid and failed.gauge_tok_s_median is None
    assert failed.invalid_reason == "failed: RESOURCE_EXHAUSTED: out of memory"


def test_free_label_suffixes_a_taken_default_label(tmp_path):
    from bench.runs import free_label, run_name

    assert free_label(tmp_path, "sweep", "cpu", "2026-11-30") == "sweep"
    (tmp_path / run_name("sweep", "cpu", "2026-11-30")).mkdir()
    (tmp_path / run_name("sweep-2", "cpu", "2026-11-30")).mkdir()
    assert free_label(tmp_path, "sweep", "cpu", "2026-11-30") == "sweep-3"


def test_one_writer_per_run_folder(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "locked", inputs=(41,), status="incomplete")
    again = open_run(run.path)
    again.resume()  # holds the lock now
    code = f"from bench.runs import open_run; open_run({str(run.path)!r}).resume()"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert other.returncode != 0 and "is being written by pid" in other.stderr
    again.finish("complete")
    assert not (run.path / ".lock").exists()


def test_a_readers_instant_shared_lock_does_not_refuse_a_writer(tmp_path: Path) -> None:
    """`bench runs list` tests a writer's liveness with a brief LOCK_SH on `.lock`; a writer starting then retries
    instead of failing with "being written by"."""
    import fcntl
    import threading

    run = make_measured_run(tmp_path, "peeked", inputs=(41,), status="incomplete")
    (run.path / ".lock").write_text("")
    reader = open(run.path / ".lock", encoding="utf-8")  # noqa: SIM115
    fcntl.flock(reader, fcntl.LOCK_SH | fcntl.LOCK_NB)
    released = threading.Event()

    def release() -> None:
        fcntl.flock(reader, fcntl.LOCK_UN)
        released.set()

    timer = threading.Timer(0.1, release)
    timer.start()
    try:
        again = open_run(run.path)
        again.resume()  # waited for the reader instead of refusing
        assert released.is_set() and f"pid {os.getpid()}" in (run.path / ".lock").read_text()
        again.finish("complete")
    finally:
        timer.join()
        reader.close()


def test_validate_catches_numbers_that_contradict_each_other(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "contradict", inputs=(41, 521))
    rows = [json.loads(line) for line in (run.path / "cells.jsonl").read_text().splitlines()]
    rows[0]["gauge_tok_s_median"] = rows[0]["gauge_tok_s_max"] + 1
    (run.path / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = (run.path / "samples.jsonl").read_text().splitlines()
    kept = [line for line in samples if not (json.loads(line)["input_tokens"] == 521 and json.loads(line)["kind"] == "timed")]
    (run.path / "samples.jsonl").write_text("\n".join(kept) + "\n")
    problems = validate_run(run.path)
    assert any("cell 41: gauge_tok_s median" in p for p in problems)
    assert any("cell 521" in p and "timed repeats []" in p for p in problems)
    from bench.report import build_report

    make_measured_run(tmp_path, "good", inputs=(41,))
    report = build_report([], tmp_path / "report", runs_dir=tmp_path)  # the report skips it, naming why
    assert [name for name, _ in report.skipped] == [run.path.name] and "median" in report.skipped[0][1]
    (run.path / "manifest.json").write_text("[]")
    assert validate_run(run.path) == ["manifest.json: expected a JSON object, got list"]


def test_unobservable_compile_events_leave_a_cell_unproven() -> None:
    samples = [dataclasses.replace(s, compile_events=None) if s.kind == "timed" else s for s in cell_samples(41)]
    row = summarize_cell(samples, max_new_tokens=MAX_NEW)
    assert not row.valid and "not observable" in row.invalid_reason and row.compile_events_timed is None


# ---- writing a run: however the command ends, the run ends -------------------------------------------------------
def _ended(path: Path) -> tuple[str, bool]:
    """(manifest status on disk, whether the `.lock` file is still there)."""
    return open_run(path).status, (path / ".lock").exists()


@pytest.mark.parametrize("raised,status", [(None, "complete"), (KeyboardInterrupt, "incomplete"),
                                           (RuntimeError, "failed")])  # fmt: skip
def test_writing_run_ends_a_created_run_however_the_body_ends(tmp_path: Path, raised, status) -> None:
    seen: list[tuple[str, str]] = []
    with pytest.raises(raised) if raised else contextlib.nullcontext():
        with runs_mod.writing_run(lambda: create_run(tmp_path, "w", "cpu", manifest()),
                                  before_end=lambda run, s: seen.append(("before", s)),
                                  after_end=lambda run, s: seen.append(("after", s))) as run:  # fmt: skip
            assert run.status == "running" and (run.path / ".lock").exists()
            if raised:
                raise raised
    assert seen == [("before", status), ("after", status)]
    assert _ended(run.path) == (status, False)
    assert f"run {status}" in (run.path / "run.log").read_text()


def test_writing_run_leaves_a_joined_run_its_status_and_unlocks_it(tmp_path: Path) -> None:
    joined = open_run(make_measured_run(tmp_path, "joined", inputs=(41,)).path)

    def start():
        joined.lock()
        return joined

    with pytest.raises(KeyboardInterrupt), runs_mod.writing_run(start, joined=True):
        assert (joined.path / ".lock").exists()
        raise KeyboardInterrupt
    assert _ended(joined.path) == ("complete", False)


def test_a_second_signal_while_the_run_ends_does_not_leave_it_running(tmp_path: Path) -> None:
    def before_end(run, status):  # e.g. the final manifest update, cut by a second Ctrl-C
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with runs_mod.writing_run(lambda: create_run(tmp_path, "twice", "cpu", manifest()),
                                  before_end=before_end) as run:  # fmt: skip
            raise KeyboardInterrupt
    assert _ended(run.path) == ("incomplete", False)
    with pytest.raises(KeyboardInterrupt):  # the body succeeded, the end was interrupted: not complete
        with runs_mod.writing_run(lambda: create_run(tmp_path, "late", "cpu", manifest()),
                                  before_end=before_end) as run:  # fmt: skip
            pass
    assert _ended(run.path) == ("incomplete", False)


def test_a_signal_during_the_final_write_is_handled_after_it(tmp_path: Path, monkeypatch) -> None:
    # Python's own Ctrl-C handler, also where this process inherited SIGINT ignored (started in the background by
    # a non-interactive shell, e.g. `nohup make test &`): there the deferred Ctrl-C had nothing to raise
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _final_write_interrupted(tmp_path, monkeypatch)
    finally:
        signal.signal(signal.SIGINT, inherited)


def _final_write_interrupted(tmp_path: Path, monkeypatch) -> None:
    real = runs_mod._atomic_write

    def interrupted_write(path, text):  # Ctrl-C lands while the final manifest is being written
        os.kill(os.getpid(), signal.SIGINT)
        real(path, text)

    with pytest.raises(KeyboardInterrupt):
        with runs_mod.writing_run(lambda: create_run(tmp_path, "cut", "cpu", manifest())) as run:
            monkeypatch.setattr(runs_mod, "_atomic_write", interrupted_write)
    monkeypatch.setattr(runs_mod, "_atomic_write", real)
    assert _ended(run.path) == ("complete", False)  # the interrupt came after the run was settled
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers were restored


def test_resume_refuses_a_corrupt_cells_file_and_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    run = make_measured_run(tmp_path, "corrupt", inputs=(41, 521), status="incomplete")
    with open(run.path / "cells.jsonl", "a") as fh:
        fh.write("{not json\n")
    manifest_before = (run.path / "manifest.json").read_bytes()
    with pytest.raises(RunFolderError, match="cells.jsonl line 3"):
        open_run(run.path).resume()
    assert (run.path / "manifest.json").read_bytes() == manifest_before
    assert _ended(run.path) == ("incomplete", False)


def _hard_stop_actions() -> None:
    """What `bench.signals.stop_now` runs before `os._exit`: the registered last actions, last first."""
    import bench.signals

    for action in reversed(list(bench.signals._LAST_ACTIONS)):
        action()


def test_a_hard_stop_marks_a_created_run_incomplete_and_removes_its_lock_file(tmp_path: Path) -> None:
    with runs_mod.writing_run(lambda: create_run(tmp_path, "hard", "cpu", manifest())) as run:
        _hard_stop_actions()
        assert _ended(run.path) == ("incomplete", False)
        assert "stopped at once" in (run.path / "run.log").read_text()


def test_a_hard_stop_leaves_a_joined_run_its_status_and_removes_its_lock_file(tmp_path: Path) -> None:
    joined = open_run(make_measured_run(tmp_path, "joined", inputs=(41,)).path)
    log_before = (joined.path / "run.log").read_text()

    def start():
        joined.lock()
        return joined

    with runs_mod.writing_run(start, joined=True):
        assert (joined.path / ".lock").exists()
        _hard_stop_actions()
        assert _ended(joined.path) == ("complete", False)
        assert (joined.path / "run.log").read_text() == log_before
