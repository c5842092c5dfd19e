"""`bench sweep` end to end on the tiny checkpoint: a complete, consistent run folder; interruption and resume;
every bad input as one clear line with exit code 2 and nothing previously written lost."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest
from conftest import assert_one_line_error, run_cli, run_cli_here, seeded_cache_root

from bench.runs import open_run, validate_run

pytestmark = pytest.mark.slow  # end-to-end through the CLI: left out by `make test-fast`

INPUTS = "20,41,70"


@pytest.fixture(scope="module")
def env(tmp_path_factory, builtin_checkpoints):
    cache = seeded_cache_root(tmp_path_factory.mktemp("cache"), builtin_checkpoints)
    return {"GEMMA4_BENCH_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def finished_run(env, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    proc = run_cli(["sweep", "--inputs", INPUTS, "--max-new-tokens", "12", "--repeats", "2", "--checkpoint",
                    "builtin:tiny", "--name", "t", "--runs-dir", str(runs)], env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return folder, proc


def test_sweep_writes_a_complete_consistent_run_folder(finished_run, env):
    folder, proc = finished_run
    assert validate_run(folder) == []
    run = open_run(folder)
    assert run.status == "complete" and folder.name.endswith("-t-cpu")
    cells = run.cells()
    assert [c.input_tokens for c in cells] == [20, 41, 70]
    for c in cells:
        assert c.repeats == 2 and c.generated_tokens_per_repeat == [12, 12]
        assert c.compile_events_timed == 0
        assert c.gauge_tok_s_min <= c.gauge_tok_s_median <= c.gauge_tok_s_max
        assert c.e2e_tok_s_min <= c.e2e_tok_s_median <= c.e2e_tok_s_max
        assert c.gauge_tok_s_median >= c.e2e_tok_s_median  # prefill and tokenization are outside the gauge
        assert c.ttft_ms_median >= c.prefill_ms_median > 0
    samples = run.samples()
    # the default decode loops (both) in the default interleaved order: each loop's warm-up first, then the rounds
    assert [s.kind for s in samples if s.input_tokens == 20] == ["cold", "warmup", "warmup-device", "timed",
                                                                 "timed-device", "timed", "timed-device"]  # fmt: skip
    assert [s.input_tokens for s in samples if s.kind == "timed"] == [20, 41, 70, 20, 41, 70]  # round-robin
    rates = json.loads((folder / "manifest.json").read_text())["rates"]
    # before round 1 and after the last always; after round 1 only when PROBE_SPACING allows (the host's timing)
    after = [p["after_round"] for p in rates["probes"]]
    assert after in ([0, 1, 2], [0, 2]) and "host_movement" in rates
    assert all(c.rate_probes == len(after) and c.ceiling_bytes_s > 0 and c.gauge_spread_pct >= 0 for c in cells)
    for c in cells:  # each cell divided by the median of the probes around its repeats (all of them here)
        reads = sorted(p["read_bytes_s"] for p in rates["probes"])
        assert c.ceiling_bytes_s == c.probe_read_bytes_s_median == pytest.approx(statistics.median(reads))
        assert c.probe_read_bytes_s_min == reads[0]
        assert c.roofline_share_pct == pytest.approx(100 * c.bytes_per_step * c.gauge_tok_s_median / c.ceiling_bytes_s)
    assert rates["copy_bandwidth_end"] == rates["probes"][-1]["copy_bandwidth"]  # the report's drift note reads it
    assert f"host movement across the sweep's {len(after)} rate probes" in proc.stderr
    # the end states each cell's rerun interval (docs/method.md, Rerun intervals): the within-sweep one and wider
    stated = json.loads((folder / "manifest.json").read_text())["rerun_intervals"]
    assert [(c["cell"], c["figure"]) for c in stated["cells"]] == [
        (n, f) for n in ("20", "41", "70") for f in ("gauge", "device-loop gauge")]  # fmt: skip
    assert all(c["rerun"][0] <= c["within"][0] <= c["median"] <= c["within"][1] <= c["rerun"][1]
               for c in stated["cells"])  # fmt: skip
    assert stated["drift"]["probes"] == len(after) and stated["calibration"]["chosen"] is None  # a fresh runs folder
    assert "rerun intervals (where a rerun of this build on this host is stated to land" in proc.stderr
    assert sum(s.kind == "cold" for s in samples) == 1  # the fresh engine's first request only
    assert all(s.input_tokens in (20, 41, 70) for s in samples)  # exact input sizes, checked after tokenization
    for s in samples:
        device = s.kind.endswith("-device")
        assert len(s.token_ids) == 12 and len(s.step_ms) == (0 if device else 11)  # the device loop: no per-step
        assert s.gauge_tok_s == pytest.approx(11 / (s.decode_ms / 1000))
        assert s.tpot_ms == pytest.approx((s.e2e_ms - s.ttft_ms) / 11)
    assert all(c.device_repeats == 2 and c.host_overhead_ms is not None for c in cells)
    assert json.loads((folder / "manifest.json").read_text())["engine_config"]["decode_loop"] == "both"
    assert json.loads((folder / "manifest.json").read_text())["engine_config"]["order"] == "interleaved"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["dtype_policy"]["compute_dtype"] == "float32"
    assert len(manifest["build_id"]) == 12 and manifest["checkpoint"]["content_hash"]
    assert manifest["engine_config"]["buckets"][0] == 32
    assert manifest["compile_cache"]["dir"] and manifest["compile_cache"]["misses"] is not None
    # the bucket each cell records is the one its requests ran (the engine's report), the smallest rung >= n
    assert [c.bucket for c in cells] == [min(b for b in manifest["engine_config"]["buckets"] if b >= c.input_tokens)
                                         for c in cells]  # fmt: skip
    # schema 2: no local path (the checkpoint by source and hash, the compile cache relative to the cache root)
    assert manifest["schema_version"] == 2 and manifest["command"] == "sweep"
    assert manifest["checkpoint"]["source"] == "builtin:tiny" and "path" not in manifest["checkpoint"]
    assert manifest["compile_cache"]["dir"] == "<cache>/xla"
    assert env["GEMMA4_BENCH_CACHE"] not in (folder / "manifest.json").read_text()
    assert "input tokens" in proc.stdout and "41" in proc.stdout  # the printed table
    assert proc.stderr.splitlines()[0].startswith("device policy: platform=cpu")  # the policy is the first line
    # run.log carries the engine's kernels beside the policy: the default backend, pure JAX, has none
    log_lines = [line.split(" ", 1)[1] for line in (folder / "run.log").read_text().splitlines()]
    assert "engine kernels: none (XLA products throughout)" in log_lines and manifest["engine_config"]["kernel"] is None
    assert manifest["engine_config"]["backend"] == "jax" and log_lines[0].endswith(" backend=jax")
    # and how XLA:CPU compiled the decode programs (the pure-JAX engine: XLA's default passes)
    assert log_lines[2] == "XLA:CPU decode programs compiled with XLA's default passes"
    # each line stamped when it happened: the policy before the rates (measured after the load), none out of order
    lines = (folder / "run.log").read_text().splitlines()
    stamps = [dt.datetime.fromisoformat(line.split(" ", 1)[0]) for line in lines]
    assert stamps == sorted(stamps) and log_lines[0].startswith("device policy:")
    assert log_lines[3].startswith("device rates:") and stamps[0] <= stamps[3]


def test_name_clash_is_refused_and_the_old_run_is_kept(finished_run, env):
    folder, _ = finished_run
    before = (folder / "cells.jsonl").read_bytes()
    date = folder.name[:10]
    proc = run_cli_here(["sweep", "--inputs", "20", "--max-new-tokens", "4", "--repeats", "1", "--checkpoint",
                         "builtin:tiny", "--name", "t", "--runs-dir", str(folder.parent)], env=env)  # fmt: skip
    assert_one_line_error(proc, "already exists", "--resume")
    assert (folder / "cells.jsonl").read_bytes() == before and folder.name.startswith(date)


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--inputs", "0"], ["--inputs", "positive"]),
        (["--inputs", ""], ["--inputs ''", "empty entry"]),  # not the default sweep
        (["--inputs", "-5"], ["--inputs", "positive"]),
        (["--inputs", "41,abc"], ["'abc'", "whole number"]),
        (["--inputs", "99999"], ["99999", "largest bucket", "256 positions", "neither --max-length nor --buckets"]),
        (["--inputs", "100", "--max-length", "64"], ["100 tokens", "--max-length 100..256"]),
        (["--inputs", "20", "--buckets", "64,32"], ["--buckets 64,32", "increasing", "--buckets 32,64"]),
        (["--repeats", "0"], ["--repeats 0"]),
        (["--inputs", "20", "--runs-dir", "/proc/gemma4-bench-runs"], ["--runs-dir", "cannot create"]),
        (["--inputs", "5"], ["below the smallest possible prompt"]),
        (["--inputs", "20", "--buckets", "64,x"], ["--buckets 64,x", "whole numbers"]),
        (["--inputs", "100", "--buckets", "32,64"], ["100 tokens", "largest bucket 64", "--buckets"]),
    ],
)
def test_bad_sweep_input_is_one_clear_line(args, needles, env, tmp_path):
    base = ["sweep", "--checkpoint", "builtin:tiny", "--max-new-tokens", "4", "--runs-dir", str(tmp_path / "r")]
    proc = run_cli_here(base + args, env=env)
    assert_one_line_error(proc, *needles)


def test_interrupted_sweep_keeps_finished_cells_and_resumes(env, tmp_path):
    runs = tmp_path / "runs"
    code = "import sys; from bench.cli import main; main(sys.argv[1:])"
    args = ["sweep", "--inputs", "20,41,70,100", "--max-new-tokens", "24", "--repeats", "3", "--checkpoint",
            "builtin:tiny", "--name", "cut", "--runs-dir", str(runs), "--order", "sequential"]  # fmt: skip
    # sequential: finished cells while others are still to come (interleaved: tests/test_sweep_interleave.py)
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=dict(os.environ, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 300
    cells = None
    while time.time() < deadline:
        folders = [p for p in runs.glob("*-cut-cpu")] if runs.exists() else []
        cells = folders[0] / "cells.jsonl" if folders else None
        if cells and cells.exists() and len(cells.read_text().splitlines()) >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # a kill in the middle of the sweep
    proc.communicate(timeout=120)
    run = open_run(cells.parent)
    done = run.finished_inputs()
    assert 1 <= len(done) < 4 and run.status == "incomplete"
    assert validate_run(cells.parent) == []
    assert "copy_bandwidth_end" not in run.manifest["rates"]  # a stopped sweep stops: no probe after its last cell
    changed = run_cli_here(["sweep", "--max-new-tokens", "16", "--resume", str(cells.parent)], env=env)
    assert_one_line_error(changed, "--max-new-tokens 16 differs", "24")
    # Flags not given are the run's own (inputs, max_new_tokens, repeats and the checkpoint).
    resumed = run_cli_here(["sweep", "--resume", str(cells.parent)], env=env)
    assert resumed.returncode == 0, resumed.stderr
    run = open_run(cells.parent)
    assert run.status == "complete" and sorted(run.finished_inputs()) == [20, 41, 70, 100]
    assert run.manifest["rates"]["copy_bandwidth_end"]["bytes_per_s"] > 0  # the resumed sweep's end, beside the start
    assert "device copy bandwidth after the last cell" in (cells.parent / "run.log").read_text()
    assert [c.input_tokens for c in run.cells()][: len(done)] == done  # the earlier cells kept as they were


def test_a_second_signal_while_the_sweep_ends_still_ends_the_run(tiny_checkpoint, tmp_path, monkeypatch):
    """Ctrl-C stops the sweep; a second one lands in the final manifest update: the run still ends incomplete and
    unlocked (the end is nested as in `bench sweep --target`: bench.runs.writing_run)."""
    import bench.sweep.local
    from bench.cli import main
    from bench.runs import RunFolder

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench.sweep.local, "run_sweep", interrupted)
    monkeypatch.setattr(RunFolder, "update_manifest", interrupted)
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as stopped:
        main(["sweep", "--inputs", "20", "--max-new-tokens", "4", "--repeats", "1", "--checkpoint",
              str(tiny_checkpoint), "--runs-dir", str(runs), "--name", "twice", "--compile-cache", "off"])  # fmt: skip
    assert stopped.value.code == 130
    (folder,) = runs.iterdir()
    assert json.loads((folder / "manifest.json").read_text())["status"] == "incomplete"
    assert not (folder / ".lock").exists()


@pytest.mark.parametrize("order", ["sequential", "interleaved"])
def test_a_cell_records_the_bucket_its_requests_report(tmp_path, order):
    """sweep_cells takes the bucket from what each request reports; requests of one cell that disagree fail it."""
    from runfolders import make_sample

    from bench.measure.request import Measured
    from bench.runs import create_run
    from bench.sweep.local import SweepConfig, sweep_cells

    config = SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=2, order=order)
    prompts = {20: "p20", 41: "p41"}
    calls = []

    def measure(prompt, kind, repeat):
        n = int(prompt[1:])
        calls.append((n, kind))
        bucket = 48 if n == 20 else (64 if sum(c[0] == 41 for c in calls) % 2 else 96)  # the 41 cell's disagree
        return Measured(sample=make_sample(n, kind, repeat, n=4), bucket=bucket)

    run = create_run(tmp_path, "fake", "cpu", {})
    rows = sweep_cells(config, run, prompts, measure=measure)
    assert rows[0].bucket == 48 and rows[0].status == "ok"  # not a rung of any ladder: the report is what counts
    assert rows[1].status == "failed" and "buckets [64, 96]" in rows[1].error and rows[1].bucket == 64


def _start_sweep(env, runs, *extra):
    code = "import sys; from bench.cli import main; main(sys.argv[1:])"
    args = ["sweep", "--checkpoint", "builtin:tiny", "--runs-dir", str(runs), "--compile-cache", "off", *extra]
    return subprocess.Popen([sys.executable, "-c", code, *args], env=dict(os.environ, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for(proc, needle: str, lines: list[str], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if needle in line or not line:
            return
    raise AssertionError(f"no {needle!r} within {timeout} s")


def test_ctrl_c_in_a_huge_cell_keeps_it_partial_with_an_estimate(env, tmp_path):
    """The issue's `--inputs 41 --max-new-tokens 4 --repeats 1000000` stopped by Ctrl-C: a partial cell, not 0."""
    runs = tmp_path / "runs"
    proc = _start_sweep(env, runs, "--inputs", "41", "--max-new-tokens", "4", "--repeats", "1000000", "--name", "big")
    lines: list[str] = []
    _wait_for(proc, "repeat 5/1000000", lines)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = "".join(lines) + err
    assert proc.returncode == 130, err
    assert "1000000 timed repeat(s) at about" in err and "--max-duration SECONDS" in err  # the estimate
    (folder,) = runs.iterdir()
    (cell,) = open_run(folder).cells()
    assert cell.partial and cell.stopped_by == "interrupted" and cell.repeats >= 4 and cell.repeats_planned == 1000000
    assert validate_run(folder) == [] and open_run(folder).status == "incomplete"


def test_a_second_sigterm_during_the_cold_request_stops_at_once(env, tmp_path):
    """The issue's race (a second SIGTERM 0.2-0.5 s after the first, during the cold request), tried 3 times."""
    for attempt, delay in enumerate((0.2, 0.35, 0.5)):
        runs = tmp_path / f"runs{attempt}"
        proc = _start_sweep(env, runs, "--inputs", "20,41", "--max-new-tokens", "8", "--repeats", "2")
        lines: list[str] = []
        _wait_for(proc, "cold first request", lines)
        proc.send_signal(signal.SIGTERM)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)  # a compile in flight finishes first, then the process ends
        err = "".join(lines) + err
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        (folder,) = runs.iterdir()
        assert open_run(folder).status == "incomplete" and validate_run(folder) == []
