"""The carried-wheels scripts (issue 19) without a network: scripts/gpu_image.py's checks on hand-made wheels, the
image list's consistency with what the prepared run imports, and the shell scripts' bad-input lines. The download
and the whole rehearsal run in `make gpu-rehearsal` (.ci/run), not here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"

spec = importlib.util.spec_from_file_location("gpu_image", SCRIPTS / "gpu_image.py")
gpu_image = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_image)


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel holding module `name` (importable, `VERSION` set) that pip installs."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires), "\n"])  # fmt: skip
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n", f"{dist}/METADATA": meta,
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, text in files.items():
            zf.writestr(p, text)
    return path


def test_image_list_parses_and_gives_the_issue_versions():
    img = gpu_image.image()
    assert img["python"] == "3.12.3"
    for name, version in {"jax": "0.11.2", "jaxlib": "0.11.2", "numpy": "2.5.2", "huggingface-hub": "1.33.0",
                          "tokenizers": "0.23.2", "safetensors": "0.8.0"}.items():  # fmt: skip
        assert img[name] == version, name
    assert img["typer"] is None and "flax" in img  # there, at a version nobody has read
    for absent in ("fastapi", "uvicorn", "pydantic", "starlette", "xprof", "tensorboard-plugin-profile"):
        assert absent not in img


def test_what_the_prepared_run_checks_for_is_in_the_image():
    from bench.gpurun import REQUIRED

    img = gpu_image.image()
    assert [n for n in REQUIRED if gpu_image.norm(n) not in img] == []


def test_pins_prefer_the_image_version_then_constraints():
    ours = gpu_image.constraints()
    assert gpu_image.pins(["jax", "fastapi", "Pydantic_Core"]) == [
        "jax==0.11.2", f"fastapi=={ours['fastapi']}", f"pydantic-core=={ours['pydantic-core']}"]
    merged = dict(line.split("==") for line in gpu_image.merged_constraints())
    assert merged["numpy"] == "2.5.2" and merged["fastapi"] == ours["fastapi"] and "python" not in merged


def test_pins_of_an_unknown_name_is_one_error_line(capsys):
    assert gpu_image.main(["pins", "no-such-package-xyz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "no-such-package-xyz" in err[0]


def test_read_pins_rejects_duplicates_and_bad_lines(tmp_path):
    f = tmp_path / "list.txt"
    f.write_text("a==1\nA==2\n")
    with pytest.raises(gpu_image.Bad, match="listed twice"):
        gpu_image.read_pins(f, allow_bare=True)
    f.write_text("a>=1\n")
    with pytest.raises(gpu_image.Bad, match="expected"):
        gpu_image.read_pins(f, allow_bare=True)
    f.write_text("a\n")
    with pytest.raises(gpu_image.Bad, match="name==version"):
        gpu_image.read_pins(f, allow_bare=False)


def test_check_wheels_accepts_carried_and_image_needs(tmp_path, capsys):
    make_wheel(tmp_path, "fastapi", "1.0", ("starlette>=0.5", "anyio>=4", "numpy>=2", "httpx; extra == 'all'",
                                            "exceptiongroup; python_version < '3.11'"))  # fmt: skip
    make_wheel(tmp_path, "starlette", "0.9")
    assert gpu_image.check_wheels(tmp_path) == []
    out = capsys.readouterr().out
    assert "assumed: the image's anyio (version not read)" in out and "total, 2 wheels" in out
    assert "numpy" not in out  # the image's 2.5.2 was checked, not assumed


def test_check_wheels_finds_what_would_fail_there(tmp_path):
    make_wheel(tmp_path, "fastapi", "1.0", ("starlette>=2", "numpy<2", "opentelemetry-api", "duckdb"))
    make_wheel(tmp_path, "starlette", "1.0")
    problems = gpu_image.check_wheels(tmp_path, frozenset({"duckdb"}))
    assert any("starlette>=2" in p and "carried starlette is 1.0" in p for p in problems)
    assert any("numpy<2" in p and "image numpy is 2.5.2" in p for p in problems)
    assert any("opentelemetry-api" in p and "neither carried" in p for p in problems)
    assert not any("duckdb" in p for p in problems)  # left out on purpose
    make_wheel(tmp_path / "two", "starlette", "1.0")
    make_wheel(tmp_path / "two", "Starlette", "1.1")
    assert any("two versions of starlette" in p for p in gpu_image.check_wheels(tmp_path / "two"))


def test_check_wheels_without_wheels_is_one_error_line(tmp_path, capsys):
    assert gpu_image.main(["check-wheels", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no .whl files" in err[0]


def test_extras_names_what_a_python_sees_beyond_the_image():
    extras = gpu_image.extras(sys.executable)  # the project's venv: it holds fastapi, pydantic, xprof, ...
    assert {"fastapi", "pydantic"} <= {gpu_image.norm(n) for n in extras}
    assert "numpy" not in {gpu_image.norm(n) for n in extras}


def _sh(*args, env=None, timeout=60):
    e = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run([str(a) for a in args], cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args", [(), ("a", "b"), ("a", "--nope")])
def test_gpu_wheels_bad_usage_exits_2(args):
    proc = _sh(SCRIPTS / "gpu-wheels.sh", *args)
    assert proc.returncode == 2 and proc.stderr.startswith(("error:", "usage:")), proc.stderr


def test_gpu_run_wheels_errors_are_one_line(tmp_path):
    for args, needle in [((tmp_path / "out", "--wheels", tmp_path / "empty"), "no .whl files"),
                         (("--tiny", tmp_path / "out", "--wheels", tmp_path), "OUTDIR comes first"),
                         ((tmp_path / "out", "--wheels"), "needs a folder")]:  # fmt: skip
        (tmp_path / "empty").mkdir(exist_ok=True)
        proc = _sh(SCRIPTS / "gpu-run.sh", *args)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and needle in err[0], (args, proc.stderr)


def test_gpu_run_installs_wheels_into_outdir_site_before_the_run(tmp_path):
    """The wheel lands in OUTDIR/site, which the run's Python imports from (after the repository); bench.gpurun
    then gets the other arguments unchanged (here a bad --budget-s, so it stops at once with its own error)."""
    make_wheel(tmp_path / "whl", "carried_probe_pkg", "1.2")
    out = tmp_path / "out"
    proc = _sh(SCRIPTS / "gpu-run.sh", out, f"--wheels={tmp_path / 'whl'}", "--budget-s", "0", "--tiny")
    assert proc.returncode == 2 and "--budget-s 0" in proc.stderr, proc.stderr
    assert "installed 1 wheels" in proc.stderr
    assert (out / "site" / "carried_probe_pkg" / "__init__.py").is_file()
    check = _sh(sys.executable, "-c", "import carried_probe_pkg as m; print(m.VERSION)",
                env={"PYTHONPATH": str(out / "site")})  # fmt: skip
    assert check.stdout.strip() == "1.2"
