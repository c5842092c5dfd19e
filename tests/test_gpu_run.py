"""scripts/gpu-run.sh (bench/gpurun/main.py) in its CPU mode: the same script the GPU task runs, on the tiny checkpoint.

Mimics the GPU machine where it matters: the packages xprof and tensorboard_plugin_profile are made unimportable
(the machine has neither), the interpreter comes through $PYTHON, and nothing is written under the home folder.
One run with room to finish (valid complete run folder with a profile, summary last, packed <= 8 files), one with
a budget too small to finish (the sweep is stopped, the folder is valid and incomplete, exit code 3, summary last).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.runs import open_run, validate_run

pytestmark = pytest.mark.slow  # end-to-end through the CLI: left out by `make test-fast`

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-run.sh"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_run")
    block = root / "block"
    block.mkdir()
    for name in ("xprof", "tensorboard_plugin_profile"):  # absent on the GPU machine: the profile must not need them
        (block / f"{name}.py").write_text(f"raise ImportError('{name} is not installed on the GPU machine')\n")
    e = dict(os.environ, PYTHON=sys.executable, GEMMA4_BENCH_CACHE=str(root / "cache"), PYTHONPATH=str(block),
             JAX_PLATFORMS="cpu")  # fmt: skip
    return root, e


def _run(env, outdir: Path, *args: str, timeout: float = 120):
    t = time.monotonic()
    proc = subprocess.run([str(SCRIPT), str(outdir), "--tiny", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    return proc, time.monotonic() - t


def _runs(outdir: Path) -> list[Path]:
    return sorted(p for p in (outdir / "runs").iterdir() if p.is_dir())


def test_tiny_run_completes_with_valid_folder_and_summary(env):
    root, e = env
    out, pack = root / "full", root / "pack"
    proc, _ = _run(e, out, "--budget-s", "150", "--inputs", "41", "--max-new-tokens", "8", "--repeats", "1",
                   "--steps", "5", "--pack", str(pack))  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lines[0].startswith("device: cpu") and lines[1].startswith("device policy:"), lines[:3]
    (run,) = _runs(out)
    assert validate_run(run) == []
    assert open_run(run).status == "complete" and (run / "profile.json").is_file()
    tail = lines[lines.index("==== gpu-run summary ===="):]
    assert any(ln.startswith("bandwidth:") for ln in tail)
    assert any(ln.strip().startswith("41 ") for ln in tail)  # the sweep row
    assert any(ln.strip().startswith("profile (5 steps") for ln in tail)
    assert tail[-1].startswith("gpu-run: exit 0")
    assert (out / "summary.txt").read_text().strip().splitlines()[-1] == tail[-1]
    packed = sorted(p.name for p in pack.iterdir())
    assert {"summary.txt", "gpu-run.log", "results.tar.gz", "traces.tar.gz"} <= set(packed) and len(packed) <= 8
    assert all(p.stat().st_size <= 16 * 2**20 for p in pack.iterdir())


def test_budget_too_small_stops_cleanly(env):
    root, e = env
    out, budget = root / "short", 25
    proc, took = _run(e, out, "--budget-s", str(budget), "--inputs", "20,41,100,200", "--max-new-tokens", "16",
                      "--repeats", "1000")  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert took < budget + 15
    (run,) = _runs(out)
    assert validate_run(run) == []
    assert open_run(run).status == "incomplete"
    assert any("sweep-tiny" in ln and ("interrupted" in ln or "killed" in ln) for ln in lines)
    # The sweep now stops after its current request, so what is left may or may not fit the profile step: it is
    # either skipped for lack of time or run within the budget (the total time is asserted above).
    assert any(ln.startswith("== profile-tiny") for ln in lines)
    assert "==== gpu-run summary ====" in lines and lines[-1].startswith("gpu-run: exit 3")


def test_missing_package_fails_in_one_line(tmp_path, monkeypatch, capsys):
    import bench.gpurun.main as gpurun_main
    from bench.gpurun import EXIT_USAGE

    monkeypatch.setattr(gpurun_main, "missing_packages", lambda: ["no_such_package_xyz"])
    assert gpurun_main.main([str(tmp_path / "out"), "--tiny"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "no_such_package_xyz" in err[0]
    assert not (tmp_path / "out").exists()


def test_missing_packages_finds_real_and_absent_names():
    from bench.gpurun import missing_packages

    assert missing_packages(("json", "no_such_package_xyz")) == ["no_such_package_xyz"]


def test_pilot_plan_sweeps_pilot_and_big_into_two_valid_runs(env):
    """The GPU plan (pilot sweep + profile while the big checkpoint is generated in the background, then the big
    one) with the tiny preset for both (GPURUN_TEST_PLAN=pilot): the logic the GPU task runs, on this CPU."""
    root, e = env
    out = root / "pilot"
    proc, _ = _run(dict(e, GPURUN_TEST_PLAN="pilot"), out, "--budget-s", "200", "--inputs", "41",
                   "--max-new-tokens", "8", "--repeats", "1", "--steps", "3", timeout=260)  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = _runs(out)
    assert len(runs) == 2 and any("pilot" in r.name for r in runs), [r.name for r in runs]
    for run in runs:
        assert validate_run(run) == [] and open_run(run).status == "complete"
        assert (run / "profile.json").is_file()
    tail = lines[lines.index("==== gpu-run summary ===="):]
    assert sum(ln.startswith("run ") for ln in tail) == 2 and tail[-1].startswith("gpu-run: exit 0")


def test_a_module_the_commands_import_but_the_check_misses_is_one_line(env, tmp_path):
    """`REQUIRED` is found, but importing the bench commands fails (as when typer's own dependency is absent):
    the probe reports that module in one line, exit 2, and no step runs."""
    root, e = env
    block = tmp_path / "block"
    block.mkdir()
    (block / "pydantic.py").write_text("raise ModuleNotFoundError(\"No module named 'pydantic'\", name='pydantic')\n")
    proc, _ = _run(dict(e, PYTHONPATH=f"{block}{os.pathsep}{e['PYTHONPATH']}"), tmp_path / "out", "--budget-s", "60")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "'pydantic'" in errors[0] and "Traceback" not in proc.stdout + proc.stderr
    assert not list((tmp_path / "out" / "runs").iterdir())
