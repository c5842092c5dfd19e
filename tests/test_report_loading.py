"""`bench report` loads each run folder once: every file of every run is read (and parsed) exactly once per report,
whether the runs are named or found in the runs folder, and the view it builds holds what the report prints."""

from __future__ import annotations

import builtins
import collections
import shutil
from pathlib import Path

import pytest
from runfolders import REFERENCE_RUNS, make_measured_run

from bench.report import build_report
from bench.report.tables import run_view


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for ref in REFERENCE_RUNS:  # published: manifest, cells, profile, published-source.json
        shutil.copytree(ref, root / ref.name)
    make_measured_run(root, "measured", inputs=(41, 521))  # measured: samples and cells.csv too
    return root


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch, runs: Path) -> collections.Counter:
    """Counts each read of a file inside the runs folder, through Path.read_text, Path.read_bytes or open()."""
    counts: collections.Counter = collections.Counter()
    root = str(runs.resolve())

    def count(path) -> None:
        text = str(Path(path).resolve())
        if text.startswith(root):
            counts[text[len(root) + 1:]] += 1

    real_read_text, real_read_bytes, real_open = Path.read_text, Path.read_bytes, builtins.open

    def read_text(self, *args, **kwargs):
        count(self)
        return real_read_text(self, *args, **kwargs)

    def read_bytes(self):
        count(self)
        return real_read_bytes(self)

    def open_(file, *args, **kwargs):
        if isinstance(file, (str, Path)):
            count(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(builtins, "open", open_)
    return counts


def _run_files(runs: Path) -> set[str]:
    return {str(p.relative_to(runs)) for p in runs.glob("*/*") if p.is_file() and p.suffix in (".json", ".jsonl", ".csv")}


@pytest.mark.parametrize("named", [False, True])
def test_each_file_of_each_run_is_read_once_per_report(runs: Path, reads, tmp_path: Path, named: bool) -> None:
    names = sorted(p.name for p in runs.iterdir()) if named else None
    report = build_report(names, tmp_path / "out", runs_dir=runs)
    assert len(report.runs) == 3 and not report.skipped
    expected = _run_files(runs)
    assert {"manifest.json", "cells.jsonl", "cells.csv", "samples.jsonl", "profile.json", "published-source.json"} <= {
        Path(f).name for f in expected}  # every kind of file is in the test
    assert dict(reads) == {f: 1 for f in expected}


def test_a_named_baseline_outside_the_runs_is_read_once_too(runs: Path, reads, tmp_path: Path) -> None:
    measured = next(p.name for p in runs.iterdir() if "measured" in p.name)
    report = build_report([REFERENCE_RUNS[0].name], tmp_path / "out", baseline=measured, runs_dir=runs)
    assert report.baseline == measured and len(report.runs) == 2
    touched = {f for f in _run_files(runs) if not f.startswith(REFERENCE_RUNS[1].name)}
    assert dict(reads) == {f: 1 for f in touched}


def test_the_view_holds_cells_samples_profile_and_published_figures(runs: Path) -> None:
    measured = run_view(next(p for p in runs.iterdir() if "measured" in p.name))
    assert sorted(measured.cells) == [41, 521] and len(measured.samples) > 0
    assert measured.profile is None and measured.figures is None and measured.other_published == {}
    published = run_view(runs / REFERENCE_RUNS[0].name)
    assert published.samples == () and published.figures is not None
    assert published.figures["device_ms"] is not None and published.other_published  # from published-source.json
