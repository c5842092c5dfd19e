"""What a command checks before a model loads: a --runs-dir (or a run) it cannot write, a --resume of a run that no
sweep wrote, a --steps that the host's memory cannot trace. Each is one line and exit code 2, with the loader
replaced by one that fails the test (in process: nothing here loads or compiles)."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pytest
from runfolders import manifest

from bench.errors import RunFolderError
from bench.runs import check_writable, create_run


@pytest.fixture
def no_load(monkeypatch):
    """Any model load fails the test: the refusals below must come first."""
    import model.engine

    def refuse(*_a, **_k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(model.engine, "load_engine", refuse)


def _cli(args: list[str], capsys) -> tuple[int, str]:
    from bench.cli import main

    with pytest.raises(SystemExit) as ended:
        main(args)
    return ended.value.code, capsys.readouterr().err


def _unwritable(monkeypatch) -> None:
    """mkstemp as on a folder without write permission (tests may run as root, which no chmod stops)."""

    def denied(*_a, **_k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)


# ---- check_writable ----------------------------------------------------------------------------------------------
def test_a_writable_folder_and_a_missing_one_under_it_pass_and_nothing_stays(tmp_path: Path) -> None:
    check_writable(tmp_path)
    check_writable(tmp_path / "not" / "yet")  # created later by create_run, in a parent that can be written
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    with pytest.raises(RunFolderError, match=r"--runs-dir .*plain/runs: .*plain is not a folder; pass --runs-dir"):
        check_writable(tmp_path / "plain" / "runs")


def test_a_folder_that_cannot_be_written_is_named_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    _unwritable(monkeypatch)
    with pytest.raises(RunFolderError, match=r"--run .*: cannot write there \(Permission denied\); pass --run DIR"):
        check_writable(tmp_path, flag="--run")
    with pytest.raises(RunFolderError, match=r"cannot create it in "):
        check_writable(tmp_path / "new")


# ---- the commands: refused before loading --------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["sweep", "--inputs", "41"], ["profile", "--steps", "2"]])
def test_an_unwritable_runs_dir_is_one_line_before_the_model_loads(command, tmp_path, capsys, monkeypatch,
                                                                   no_load) -> None:  # fmt: skip
    _unwritable(monkeypatch)
    code, err = _cli([*command, "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--runs-dir" in err and "cannot create it in" in err and "Permission denied" in err


def test_a_profile_run_left_running_is_not_resumed_as_a_sweep(tmp_path: Path, capsys, no_load) -> None:
    """A profile killed mid-capture stays "running"; `sweep --resume` once turned it into a sweep."""
    run = create_run(tmp_path, "profile", "cpu", {**manifest(), "command": "profile"}, date="2026-11-30")
    run.unlock()  # as a killed writer leaves it: status running, no writer
    for resume in (run.path.name, "latest"):
        code, err = _cli(["sweep", "--resume", resume, "--runs-dir", str(tmp_path)], capsys)
        if resume == "latest":  # latest looks for sweeps: this run is not one
            assert code == 2 and "no measured sweep run" in err, err
            continue
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "`bench profile`" in err and "not by a sweep" in err and "without --resume" in err
    assert (run.path / "manifest.json").read_text().count('"running"') == 1  # left as it was


# ---- bench profile --steps: bounded by the trace's memory ----------------------------------------------------------
def test_steps_whose_trace_cannot_fit_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch,
                                                                         no_load) -> None:  # fmt: skip
    """8,200 steps of the default preset were killed for memory at 20.7 GB, leaving the run "running"."""
    import bench.runs.environment as environment
    from bench.profile.command import TRACE_BYTES_PER_LAYER_STEP
    from model.config import PRESETS

    monkeypatch.setattr(environment, "host_available_bytes", lambda: 20 * 2**30)
    code, err = _cli(["profile", "--steps", "8200", "--runs-dir", str(tmp_path)], capsys)
    per_step = PRESETS["default"].num_layers * TRACE_BYTES_PER_LAYER_STEP
    most = 20 * 2**30 // per_step
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--steps 8200" in err and f"{8200 * per_step / 2**30:.1f} GiB" in err and "20.0 GiB" in err
    assert f"pass --steps {most} or fewer" in err and most < 8200
    assert list(tmp_path.iterdir()) == []  # no run folder was created, so none is left "running"


def test_the_bound_passes_what_fits_and_reads_the_checkpoints_layers(monkeypatch) -> None:
    import bench.runs.environment as environment
    from bench.profile.command import TRACE_BYTES_PER_LAYER_STEP, check_trace_memory
    from bench.errors import InputError
    from model.config import PRESETS

    tiny = PRESETS["tiny"].num_layers * TRACE_BYTES_PER_LAYER_STEP
    monkeypatch.setattr(environment, "host_available_bytes", lambda: 100 * tiny)
    check_trace_memory(100, "builtin:tiny")  # exactly fits
    with pytest.raises(InputError, match="pass --steps 100 or fewer"):
        check_trace_memory(101, "builtin:tiny")
    monkeypatch.setattr(environment, "host_available_bytes", lambda: tiny)  # one step of tiny's 6 layers
    with pytest.raises(InputError, match="free host memory first"):
        check_trace_memory(1, None)  # the default preset's 35 layers: not even one step
    check_trace_memory(10**9, "org/some-model")  # a repo id: its config comes with the download; the engine loads
    monkeypatch.setattr(environment, "host_available_bytes", lambda: None)
    check_trace_memory(10**9, "builtin:tiny")  # memory unknown: nothing to check against
