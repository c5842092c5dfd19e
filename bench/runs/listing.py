"""Finding run folders: opening one (checked against its schema), resolving a reference (a path, a name in the
runs folder, or "latest"), and listing a runs folder with what each run's state is.

`bench/runs/folder.py` is the folder itself (creating, writing, the end of a run); `bench/runs/lock.py` the writer
lock and the liveness of a run's writer, which `list_runs` reports for a run that says "running".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bench.errors import RunFolderError
from bench.runs.folder import RunFolder
from bench.runs.lock import writer_state
from bench.runs.schema import (
    MANIFEST,
    RunFiles,
    manifest_problems,
    profile_problems,
    read_json,
    read_run_files,
    run_files_problems,
)


def open_run(path: str | Path) -> RunFolder:
    """Open an existing run folder: its manifest must parse and have schema version 1 or 2 and its keys.

    Raises RunFolderError (naming the folder and file) when the folder or manifest is missing, corrupt, of an
    unknown schema version, or breaks the schema. Cells and samples are read on demand.
    """
    p = Path(path)
    if not p.is_dir():
        raise RunFolderError(f"{p}: no such run folder")
    return _with_manifest(p, read_json(p / MANIFEST))


def _with_manifest(p: Path, manifest: Any) -> RunFolder:
    """The run folder `p` holding the parsed `manifest`, once it passes the schema (RunFolderError naming `p`)."""
    problems = manifest_problems(manifest)
    if problems:
        raise RunFolderError(f"{p}: {problems[0]}")
    return RunFolder(p, manifest)


def open_complete_run(path: str | Path) -> RunFolder:
    """`open_run`, then check that the run is complete and valid (`validate_run`: schema, and numbers that agree).

    What `bench compare` accepts. Raises RunFolderError naming the folder and the reason (status not complete, a
    corrupt cells.jsonl line, a bad profile.json, ...).
    """
    return load_complete_run(path)[0]


def load_complete_run(path: str | Path) -> tuple[RunFolder, RunFiles]:
    """`open_complete_run` (the same checks and errors), also returning the files as it parsed them, each once:
    a reader takes cells, samples and profile from them instead of reading the folder again."""
    return _load_checked(Path(path), ("complete",))


REPORTED_STATUSES = ("complete", "incomplete")
"""The run statuses `bench report` reads: a finished run, and an interrupted one (status "incomplete": a stop
signal, a lost job, a budget that ran out), whose finished cells are valid measurements and whose unfinished cells
say so ("no timed repeats"). A "running" run is still being written (or its writer was killed: `bench runs
list`); a "failed" one ended on an error."""


def load_reported_run(path: str | Path) -> tuple[RunFolder, RunFiles]:
    """`load_complete_run`, but a run whose status is "incomplete" is accepted too (`REPORTED_STATUSES`): what
    the report reads. The same checks and errors otherwise (RunFolderError for a missing, corrupt, "running" or
    "failed" run, or one of an unknown schema version)."""
    return _load_checked(Path(path), REPORTED_STATUSES)


_STATUS_WHY = {
    "running": "still being written, or its writer was killed: see `bench runs list`",
    "incomplete": "an interrupted run; `bench report` shows its finished cells",
    "failed": "the run ended on an error: see its run.log",
}


def _load_checked(p: Path, statuses: tuple[str, ...]) -> tuple[RunFolder, RunFiles]:
    """The run folder `p` and its parsed files, once its status is one of `statuses` and its files pass the
    schema and agree with one another. RunFolderError naming the folder and the first problem otherwise."""
    if not p.is_dir():
        raise RunFolderError(f"{p}: no such run folder")
    files = read_run_files(p)
    if files.manifest_error is not None:
        raise RunFolderError(files.manifest_error)
    run = _with_manifest(p, files.manifest)
    if run.status not in statuses:
        why = _STATUS_WHY.get(run.status)
        raise RunFolderError(f"{run.path}: status is {run.status!r}, not {' or '.join(statuses)}"
                             + (f" ({why})" if why else ""))  # fmt: skip
    files.cells  # noqa: B018 -- RunFolderError naming the file and line of the first bad row, as run.cells()
    if files.profile_error is not None:
        raise RunFolderError(files.profile_error)
    bad_profile = profile_problems(files.profile) if files.profile is not None else []
    if bad_profile:
        raise RunFolderError(f"{run.path}: {bad_profile[0]}")
    problems = run_files_problems(files)
    if problems:
        more = f" (and {len(problems) - 1} more; see bench runs validate)" if len(problems) > 1 else ""
        raise RunFolderError(f"{run.path}: {problems[0]}{more}")
    return run, files


def latest_measured_run(runs_dir: str | Path, *, flag: str = "--run") -> Path:
    """The measured run of `runs_dir` with sweep cells that started last. RunFolderError when there is none,
    naming `flag`, the option that was given 'latest' (`bench profile --run`, `bench sweep --resume`, ...)."""
    best = None
    for summary in list_runs(runs_dir) if Path(runs_dir).is_dir() else []:
        if summary.ok and summary.provenance == "measured" and summary.cells and summary.started_at:
            if best is None or summary.started_at > best.started_at:
                best = summary
    if best is None:
        fix = "drop --resume to start a new run" if flag == "--resume" else f"run `bench sweep` first, or drop {flag}"
        raise RunFolderError(f"no measured sweep run in {runs_dir}/ for {flag} latest; {fix}")
    return best.path


def resolve_run(ref: str | Path, runs_dir: str | Path = "runs", *, flag: str = "--run") -> Path:
    """A run given as a path, as a folder name inside `runs_dir`, or as "latest" (`latest_measured_run`, whose
    error names `flag`). RunFolderError names both places when it is neither."""
    if str(ref) == "latest":
        return latest_measured_run(runs_dir, flag=flag)
    p = Path(ref)
    if p.is_dir():
        return p
    q = Path(runs_dir) / str(ref)
    if q.is_dir():
        return q
    raise RunFolderError(f"run {ref!r} not found (neither a folder nor a run in {runs_dir}/); see `bench runs list`")


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One line of `bench runs list`. `problem` is set (and the rest mostly None) for a folder that cannot be read."""

    name: str
    path: Path
    status: str | None
    provenance: str | None
    device: str | None
    build_id: str | None
    started_at: str | None
    cells: int | None
    problem: str | None = None
    note: str | None = None  # e.g. "interrupted (writer pid N is gone); resume with --resume NAME"

    @property
    def ok(self) -> bool:
        """True when the folder could be read (no `problem`)."""
        return self.problem is None


def run_folders(runs_dir: str | Path) -> list[Path]:
    """The sub-folders of `runs_dir` that may be runs (sorted by name; hidden ones left out), none of them read.
    Raises RunFolderError when `runs_dir` itself does not exist."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise RunFolderError(f"runs folder {root} does not exist; pass --runs-dir DIR")
    return sorted(q for q in root.iterdir() if q.is_dir() and not q.name.startswith("."))


def list_runs(runs_dir: str | Path) -> list[RunSummary]:
    """Every sub-folder of `runs_dir` (sorted by name), bad ones included with `problem` saying why.

    Raises RunFolderError when `runs_dir` itself does not exist. Never raises for a bad run folder.
    """
    out = []
    for p in run_folders(runs_dir):
        try:
            run = open_run(p)
            ncells = len(run.cells())
        except RunFolderError as exc:
            out.append(RunSummary(p.name, p, None, None, None, None, None, None, problem=str(exc)))
            continue
        m = run.typed_manifest
        out.append(RunSummary(p.name, p, m.status, m.provenance.kind, m.device_kind, m.build_id, m.started_at, ncells,
                              note=run_note(run)))  # fmt: skip
    return out


def run_note(run: RunFolder) -> str | None:
    """What a user should know about the state of `run` beyond its status: for a run that says "running" but
    whose writer is gone (killed), "interrupted (writer pid N is gone); resume with --resume NAME"; None
    otherwise (its status says it all)."""
    if run.status == "running":
        return writer_state(run.path).interrupted_note(run.name)
    return None
