"""A stopped sweep keeps every measured request: partial cells, their completion by --resume, the durations that
lengthen or bound a cell, a second stop signal that ends the process at once, a killed writer named as such, and
the one-line messages of the sweep's flags. No engine: `sweep_cells` with a fake request (fast tier)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from runfolders import REPO, make_sample, manifest

from bench.errors import InputError, RunFolderError
from bench.measure.request import Measured
from bench.runs import CellRow, create_run, list_runs, open_run, summarize_cell, validate_run, writing_run
from bench.sweep.local import SweepConfig, estimate_line, sweep_cells


def fake_measure(calls: list, *, e2e_ms: float | None = None, stop_after: tuple[int, int] | None = None, stop=None):
    """A request of `n` tokens at bucket 64; with `stop_after` (cell size, timed repeats) the stop flag `stop`
    (a list) is set once that many timed repeats of that cell came back."""

    def measure(prompt, kind, repeat):
        n = int(prompt[1:])
        calls.append((n, kind, repeat))
        sample = make_sample(n, kind, repeat, n=4)
        if e2e_ms is not None:
            sample = dataclasses.replace(sample, e2e_ms=e2e_ms)
        if stop_after and (n, kind) == (stop_after[0], "timed") and repeat + 1 >= stop_after[1]:
            stop.append(signal.SIGINT)
        return Measured(sample=sample, bucket=64)

    return measure


PROMPTS = {20: "p20", 41: "p41"}


def _interrupted_run(tmp_path: Path, repeats: int = 6, stop_at: int = 3):
    """A run of cells 20 and 41 stopped (as by a first signal) after `stop_at` timed repeats of cell 41."""
    config = SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=repeats)
    stop: list = []
    with pytest.raises(KeyboardInterrupt):
        with writing_run(lambda: create_run(tmp_path, "cut", "cpu", manifest())) as run:
            sweep_cells(config, run, PROMPTS, measure=fake_measure([], stop_after=(41, stop_at), stop=stop),
                        should_stop=lambda: bool(stop))  # fmt: skip
    return config, open_run(run.path)


def test_a_stopped_cell_is_kept_partial_and_resume_completes_it(tmp_path: Path) -> None:
    config, run = _interrupted_run(tmp_path)
    assert run.status == "incomplete" and validate_run(run.path) == []
    whole, partial = run.cells()
    assert not whole.partial and whole.repeats == 6
    assert (partial.partial, partial.repeats, partial.repeats_planned) == (True, 3, 6)
    assert partial.stopped_by == "interrupted"
    assert partial.valid and partial.gauge_tok_s_median is not None  # its numbers are the repeats it has
    assert run.finished_inputs() == [20]  # --resume measures the rest of 41
    measured = [s for s in run.samples() if s.input_tokens == 41 and s.kind == "timed"]
    assert [s.repeat for s in measured] == [0, 1, 2]  # every timed request that came back, written as measured

    calls: list = []
    with writing_run(lambda: (run.resume(), run)[1]) as again:
        sweep_cells(config, again, PROMPTS, measure=fake_measure(calls), skip=again.finished_inputs())
    # the fresh engine's first request is cold-resume, then a warm-up, then repeats 3..5 only
    assert calls == [(41, "cold-resume", 0), (41, "warmup", 0)] + [(41, "timed", r) for r in range(3, 6)]
    done = open_run(run.path)
    assert done.status == "complete" and validate_run(done.path) == []
    cell = done.cells()[1]
    assert not cell.partial and cell.repeats == 6 and "partial" not in cell.to_dict()
    first = done.cells()[0]
    assert first.cold_request_s is not None  # the run's cold start: the first process's
    assert cell.cold_request_s is None  # the resumed engine's cold request is not read as the run's cold start


def test_a_kill_mid_cell_leaves_its_samples_and_resume_completes_them(tmp_path: Path) -> None:
    run = create_run(tmp_path, "killed", "cpu", manifest())
    run.append_samples([make_sample(41, "cold", 0, n=4), make_sample(41, "warmup", 0, n=4),
                        make_sample(41, "timed", 0, n=4), make_sample(41, "timed", 1, n=4)])  # fmt: skip
    run.unlock()  # as a SIGKILL leaves it: samples, no row, status running
    assert validate_run(run.path) == [] and run.finished_inputs() == []
    calls: list = []
    with writing_run(lambda: (run.resume(), run)[1]) as again:
        sweep_cells(SweepConfig(inputs=(41,), max_new_tokens=4, repeats=3), again, PROMPTS,
                    measure=fake_measure(calls), skip=again.finished_inputs())  # fmt: skip
    assert calls[-1] == (41, "timed", 2) and calls[0] == (41, "cold-resume", 0)
    (cell,) = open_run(run.path).cells()
    assert cell.repeats == 3 and not cell.partial and validate_run(run.path) == []


def test_durations_lengthen_or_bound_the_timed_repeats(tmp_path: Path) -> None:
    run = create_run(tmp_path, "dur", "cpu", manifest())
    longer = SweepConfig(inputs=(20,), max_new_tokens=4, repeats=1, min_duration_s=2.5)
    (row,) = sweep_cells(longer, run, PROMPTS, measure=fake_measure([], e2e_ms=1000.0))
    assert row.repeats == 3 and not row.partial  # 1 repeat asked, 2.5 s of 1 s requests: 3 repeats
    bounded = SweepConfig(inputs=(41,), max_new_tokens=4, repeats=1000, max_duration_s=2.5)
    (row,) = sweep_cells(bounded, run, PROMPTS, measure=fake_measure([], e2e_ms=1000.0))
    assert (row.repeats, row.partial, row.stopped_by, row.repeats_planned) == (3, True, "max-duration", 1000)
    assert run.finished_inputs() == [20, 41]  # a bounded cell is finished: --resume leaves it
    with pytest.raises(InputError, match="--max-duration 1 is below --min-duration 2"):
        SweepConfig(inputs=(20,), min_duration_s=2, max_duration_s=1).check()


def test_a_long_cell_gets_an_estimate_after_its_warm_up(tmp_path: Path) -> None:
    lines: list[str] = []
    stop: list = []
    run = create_run(tmp_path, "est", "cpu", manifest())
    config = SweepConfig(inputs=(20,), max_new_tokens=4, repeats=1_000_000)
    with pytest.raises(KeyboardInterrupt):
        sweep_cells(config, run, PROMPTS, measure=fake_measure([], e2e_ms=100.0, stop_after=(20, 5), stop=stop),
                    progress=lines.append, should_stop=lambda: bool(stop))  # fmt: skip
    (estimate,) = [line for line in lines if "about" in line]
    assert "1000000 timed repeat(s) at about 100 ms each" in estimate and "27:46:40" in estimate
    assert "--max-duration SECONDS" in estimate
    assert estimate_line(dataclasses.replace(config, max_duration_s=60.0), 100.0, []).endswith(
        "about 0:01:00 (bounded by --max-duration 60 s)")  # fmt: skip
    (cell,) = open_run(run.path).cells()
    assert cell.partial and cell.repeats == 5  # the Ctrl-C of the issue: hundreds of repeats were kept, not 0 cells


def test_a_warm_up_that_compiled_is_no_estimate_the_first_timed_repeat_is(tmp_path: Path) -> None:
    lines: list[str] = []
    run = create_run(tmp_path, "est", "cpu", manifest())

    def measure(prompt, kind, repeat):  # the warm-up compiles for 90 s; warm requests take 100 ms
        sample = make_sample(int(prompt[1:]), kind, repeat, n=4, compile_events=int(kind == "warmup"))
        return Measured(sample=dataclasses.replace(sample, e2e_ms=90_000.0 if kind == "warmup" else 100.0), bucket=64)

    config = SweepConfig(inputs=(20,), max_new_tokens=4, repeats=2_000)
    sweep_cells(config, run, PROMPTS, measure=measure, progress=lines.append)
    (estimate,) = [line for line in lines if "about" in line]  # once, from the first timed repeat, not the warm-up
    assert "1999 timed repeat(s) at about 100 ms each" in estimate and "0:03:19" in estimate
    assert lines.index(estimate) == lines.index(next(line for line in lines if "repeat 1/2000" in line)) + 1


def test_rows_without_the_partial_fields_stay_valid_and_partial_rows_round_trip(tmp_path: Path) -> None:
    from runfolders import REFERENCE_RUNS, cell_samples

    for folder in REFERENCE_RUNS:  # archived rows, written before the fields existed
        assert validate_run(folder) == [] and all(not c.partial for c in open_run(folder).cells())
    row = summarize_cell(cell_samples(41), max_new_tokens=8, stopped_by="interrupted", repeats_planned=9)
    run = create_run(tmp_path, "rt", "cpu", manifest())
    run.append_samples(cell_samples(41))
    run.append_cell(row)
    assert open_run(run.path).cells() == [row]
    assert "partial" in (run.path / "cells.csv").read_text().splitlines()[0]
    with pytest.raises(ValueError, match="stopped_by"):
        summarize_cell(cell_samples(41), max_new_tokens=8, stopped_by="bored")
    assert "unknown field" not in str(CellRow.__doc__)


def test_cold_resume_is_not_a_cold_start() -> None:
    from runfolders import cell_samples

    samples = [make_sample(41, "cold-resume", 0, ttft_ms=5000.0), *cell_samples(41)]
    row = summarize_cell(samples, max_new_tokens=8)
    assert row.cold_request_s is None and row.cold_warm_ttft_ratio is None and row.valid


# ---- a second signal ends the process at once ----------------------------------------------------------------------
HARD_STOP = textwrap.dedent(
    """
    import gc, sys, time
    sys.path[:0] = [{repo!r}, {tests!r}]
    from bench.runs import create_run, writing_run
    from bench.sweep.local import StopSignals
    from runfolders import manifest

    def busy_callback(phase, info):  # as jax's gc callback: Python code that a signal handler can land in
        t = time.perf_counter()
        while time.perf_counter() - t < 0.005:
            pass

    gc.callbacks.append(busy_callback)
    with StopSignals(lambda line: print(line, flush=True)) as stop:
        with writing_run(lambda: create_run({runs!r}, "twice", "cpu", manifest(), date="2026-11-30")) as run:
            print("ready", flush=True)
            while True:  # a cold request that ignores the first signal: it only sets the flag
                gc.collect()
    """
)


def test_a_second_signal_always_stops_at_once_and_marks_the_run_incomplete(tmp_path: Path) -> None:
    """The old handler raised KeyboardInterrupt, which a gc callback swallows ("Exception ignored in"): the
    process went on. Here almost every signal lands inside the callback; each try must end within seconds."""
    for attempt in range(5):
        runs = tmp_path / str(attempt)
        script = HARD_STOP.format(repo=str(REPO), tests=str(REPO / "tests"), runs=str(runs))
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2 + 0.075 * attempt)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"try {attempt}: the second signal was lost ({proc.communicate()[1][-300:]})")
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert "stopped at once" in err
        (folder,) = runs.iterdir()
        assert json.loads((folder / "manifest.json").read_text())["status"] == "incomplete"
        assert "second stop signal" in (folder / "run.log").read_text()


# ---- a killed writer is named -------------------------------------------------------------------------------------
def test_a_killed_writer_is_named_in_the_list(tmp_path: Path, capsys) -> None:
    code = (f"import os, signal, sys; sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests')!r}]\n"
            "from bench.runs import create_run; from runfolders import manifest\n"
            f"create_run({str(tmp_path)!r}, 'dead', 'cpu', manifest(), date='2026-11-30')\n"
            "print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGKILL)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    pid = int(done.stdout.split()[0])
    live = create_run(tmp_path, "alive", "cpu", manifest(), date="2026-11-30")  # held by this process
    notes = {s.name: (s.status, s.note) for s in list_runs(tmp_path)}
    assert notes["2026-11-30-dead-cpu"] == (
        "running", f"interrupted (writer pid {pid} is gone); resume with --resume 2026-11-30-dead-cpu")
    assert notes["2026-11-30-alive-cpu"] == ("running", None)
    from bench.cli import main

    main(["runs", "validate", "2026-11-30-dead-cpu", "--runs-dir", str(tmp_path)])
    assert f"interrupted (writer pid {pid} is gone); resume with --resume 2026-11-30-dead-cpu" in capsys.readouterr().out
    with pytest.raises(RunFolderError, match=f"being written by pid {os.getpid()} on "):
        open_run(live.path).resume()
    dead = open_run(tmp_path / "2026-11-30-dead-cpu")
    dead.resume()
    assert f"writer pid {pid} is gone" in (dead.path / "run.log").read_text()


# ---- messages --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,needles", [("64,32", ["not in increasing order", "--buckets 32,64"]),
                                          ("64,64", ["repeats a rung", "--buckets 64"])])  # fmt: skip
def test_buckets_out_of_order_or_repeated_are_refused(text, needles) -> None:
    from bench.cli.common import parse_buckets

    with pytest.raises(InputError) as info:
        parse_buckets(text)
    assert all(n in str(info.value) for n in needles), str(info.value)
    assert parse_buckets("32,64") == (32, 64)


def _cli(args: list[str], capsys) -> tuple[int, str]:
    from bench.cli import main

    with pytest.raises(SystemExit) as ended:
        main(args)
    return ended.value.code, capsys.readouterr().err


def test_an_empty_name_and_resume_latest_of_nothing_are_one_clear_line(tmp_path: Path, capsys) -> None:
    code, err = _cli(["sweep", "--name", "", "--runs-dir", str(tmp_path)], capsys)
    assert code == 2 and "--name ''" in err and "empty" in err and len(err.splitlines()) == 1
    code, err = _cli(["sweep", "--resume", "latest", "--runs-dir", str(tmp_path)], capsys)
    assert code == 2 and "--resume latest" in err and "--run " not in err and "drop --resume" in err


def test_a_label_that_cannot_name_a_folder_is_refused_before_loading(tmp_path: Path, capsys, monkeypatch) -> None:
    import model.engine

    def no_load(*_a, **_k):
        raise AssertionError("the checkpoint was loaded before the label was checked")

    monkeypatch.setattr(model.engine, "load_engine", no_load)
    code, err = _cli(["sweep", "--name", "ple4+int8_lm_head", "--runs-dir", str(tmp_path)], capsys)
    assert code == 2 and "'ple4+int8_lm_head'" in err and "letters, digits" in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())
