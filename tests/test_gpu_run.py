"""scripts/gpu-run.sh (`bench gpu-run`, bench/gpurun) in its CPU mode: the same script the GPU task runs, on the tiny
checkpoint.

Mimics the GPU machine where it matters: the packages xprof and tensorboard_plugin_profile are made unimportable
(the machine has neither), the interpreter comes through $PYTHON, and nothing is written under the home folder.
End to end (slow), once: a run with room to finish (valid complete run folder with a profile, summary last, packed
<= 8 files). The plans, the budget, SIGTERM, --quant and --batch are tested in this process with made-up step
processes (tests/test_gpu_run_plans.py). Fast: a missing package or a module typer needs is one line and exit
code 2 with nothing run (real processes: the point is what the process imports), a bad option is one line and exit
code 2 (in this process), and the run's parent process starts without the server, the sweep or the profile code.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli_here

from bench.runs import open_run, validate_run

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


def _run(env, outdir: Path, *args: str, timeout: float = 120, tiny: bool = True):
    t = time.monotonic()
    argv = [str(SCRIPT), str(outdir), *(["--tiny"] if tiny else []), *args]
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t


def _runs(outdir: Path) -> list[Path]:
    return sorted(p for p in (outdir / "runs").iterdir() if p.is_dir())


def _absent(env, folder: Path, *names: str) -> dict:
    """`env` with a sitecustomize on PYTHONPATH that makes `names` absent (sys.modules[name] = None: not found by
    the package check, ImportError on import), in this process and in every child it starts."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{n!r}] = None\n" for n in names))
    return dict(env, PYTHONPATH=f"{folder}{os.pathsep}{env['PYTHONPATH']}")


def _one_error_line(proc) -> str:
    """The one `error:` line of a run that stopped before measuring anything (no traceback, nothing else)."""
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return errors[0]


# ---- end to end ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_run_completes_with_valid_folder_and_summary(env):
    root, e = env
    out, pack = root / "full", root / "pack"
    # A budget far above what it needs (88 s on 2 cores at load 8; a 120 s limit here killed it on such a host):
    # the run ends when its steps do, and the budget's own rules are tested in tests/test_gpu_run_plans.py.
    proc, _ = _run(e, out, "--budget-s", "400", "--inputs", "41", "--max-new-tokens", "8", "--repeats", "1",
                   "--steps", "5", "--pack", str(pack), timeout=600)  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lines[0].startswith("device: cpu") and lines[1].startswith("device policy:"), lines[:3]
    (run,) = _runs(out)
    assert validate_run(run) == []
    assert open_run(run).status == "complete" and (run / "profile.json").is_file()
    tail = lines[lines.index("==== gpu-run summary ===="):]
    assert any(ln.startswith("bandwidth:") for ln in tail) and any(ln.startswith("read-only bandwidth:") for ln in tail)
    assert any(ln.strip().startswith("41 ") for ln in tail)  # the sweep row
    assert any(ln.strip().startswith("profile (5 steps") for ln in tail)
    assert tail[-1].startswith("gpu-run: exit 0")
    assert (out / "summary.txt").read_text().strip().splitlines()[-1] == tail[-1]
    packed = sorted(p.name for p in pack.iterdir())
    assert {"summary.txt", "gpu-run.log", "results.tar.gz", "traces.tar.gz"} <= set(packed) and len(packed) <= 8
    assert all(p.stat().st_size <= 16 * 2**20 for p in pack.iterdir())


# ---- one line, exit code 2, nothing run ----------------------------------------------------------------------------
def test_missing_package_is_one_line_before_anything_runs(env, tmp_path):
    """A `REQUIRED` package absent: the standard-library check of `python -m bench.gpurun` says so before typer or
    jax is imported, and nothing is written."""
    _, e = env
    proc, _ = _run(_absent(e, tmp_path / "site", "ml_dtypes"), tmp_path / "out", "--budget-s", "60")
    line = _one_error_line(proc)
    assert "ml_dtypes" in line and sys.executable in line and proc.stdout == ""
    assert not (tmp_path / "out").exists()


def test_check_packages_names_what_is_missing():
    from bench.errors import MissingModuleError
    from bench.gpurun import check_packages, missing_packages

    assert missing_packages(("json", "no_such_package_xyz")) == ["no_such_package_xyz"]
    check_packages(("json", "pathlib"))
    with pytest.raises(MissingModuleError, match="no_such_package_xyz"):
        check_packages(("json", "no_such_package_xyz"))


@pytest.mark.skipif("pydantic" not in " ".join(importlib.metadata.requires("typer") or []),
                    reason="this typer parses options without pydantic")  # fmt: skip
def test_a_module_typer_needs_to_parse_options_is_one_line(env, tmp_path):
    """typer >= 0.22 imports pydantic when it parses an option, and the GPU image has none: the check cannot see
    that (pydantic is not a direct need), so the CLI's start says it in one line, and nothing is written."""
    _, e = env
    proc, _ = _run(_absent(e, tmp_path / "site", "pydantic"), tmp_path / "out", "--budget-s", "60")
    assert "pydantic" in _one_error_line(proc)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_module_the_commands_import_but_the_check_misses_is_one_line(env, tmp_path):
    """`REQUIRED` is found, but importing jax fails (as when one of its own dependencies is broken): one line naming
    the module, exit 2, and no step runs (the probe reports it, or the CLI's start when it imports jax itself)."""
    _, e = env
    block = tmp_path / "block"
    block.mkdir()
    (block / "ml_dtypes.py").write_text("raise ModuleNotFoundError(\"No module named 'ml_dtypes'\", name='ml_dtypes')\n")
    proc, _ = _run(dict(e, PYTHONPATH=f"{block}{os.pathsep}{e['PYTHONPATH']}"), tmp_path / "out", "--budget-s", "60")
    assert "ml_dtypes" in _one_error_line(proc)
    runs = tmp_path / "out" / "runs"
    assert not runs.exists() or not list(runs.iterdir())


@pytest.mark.slow
def test_the_probe_reports_a_module_only_the_steps_import(env, tmp_path):
    """A module the run's parent never imports but every step's `bench` does (here the sweep code): the probe child
    names it in one line, nothing is measured, the summary still comes last and the exit code is 2."""
    _, e = env
    out = tmp_path / "out"
    proc, _ = _run(_absent(e, tmp_path / "site", "bench.sweep"), out, "--budget-s", "60")
    assert "'bench.sweep" in _one_error_line(proc) and "nothing was measured" in proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert "==== gpu-run summary ====" in lines and lines[-1].startswith("gpu-run: exit 2")
    assert [ln.split()[:2] for ln in lines if ln.startswith("steps:")] == [["steps:", "probe"]]
    assert "|" not in next(ln for ln in lines if ln.startswith("steps:"))  # the probe alone ran
    assert not _runs(out) and (out / "summary.txt").is_file()


@pytest.mark.parametrize(("args", "names"), [
    (["--budget-s", "soon"], "--budget-s"),
    (["--budget-s", "0"], "--budget-s"),
    (["--no-such-option"], "--no-such-option"),
    (["--repeats", "0"], "--repeats 0"),
    (["--steps", "0"], "--steps 0"),
    (["--steps", "-3"], "--steps -3"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["--inputs", "x"], "--inputs x"),
    (["--inputs", "41,0"], "--inputs 41,0"),
    (["--checkpoint", "/nonexist"], "--checkpoint /nonexist"),
    (["--wheels", ""], "--wheels"),
    (["--wheels="], "--wheels"),
    (["--quant", "w9"], "--quant w9"),
    (["--quant", "w8", "--quant", "none", "--quant", "w8"], "--quant w8: the same option set"),
    (["--batch", "0"], "--batch 0"),
    (["--batch", "x"], "--batch x"),
    (["--batch", "2,2"], "--batch 2,2"),
])  # fmt: skip
def test_a_bad_option_is_one_line(env, tmp_path, args, names):
    """`bench gpu-run` in this process (the script's own --wheels checks: in a process, they are bash's)."""
    if args[0].startswith("--wheels"):
        proc, _ = _run(env[1], tmp_path / "out", *args)
    else:
        proc = run_cli_here(["gpu-run", str(tmp_path / "out"), "--tiny", *args])
    assert names in _one_error_line(proc) and proc.stdout == ""
    assert not (tmp_path / "out").exists()


def test_the_run_starts_without_the_server_sweep_or_profile_code(env, tmp_path):
    """`bench gpu-run` registers its command alone: with the server's packages, the sweep, the profile and the
    report code all absent, the script still parses its options and checks them (one line for --budget-s 0), and
    its help works. Fails when the gpu-run path imports any of them at startup."""
    _, e = env
    absent = ("fastapi", "uvicorn", "starlette", "xprof", "tensorboard_plugin_profile", "matplotlib", "pandas",
              "bench.sweep", "bench.serve", "bench.profile", "bench.report", "bench.measure")  # fmt: skip
    blocked = _absent(e, tmp_path / "site", *absent)
    proc, _ = _run(blocked, tmp_path / "out", "--budget-s", "0")
    assert "--budget-s" in _one_error_line(proc)
    helped = subprocess.run([str(SCRIPT), "--help"], env=blocked, cwd=REPO, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert helped.returncode == 0 and "--budget-s" in helped.stdout and "--pack" in helped.stdout, helped.stderr
