"""The run folder (schema version 2; version 1 folders are read too): how a sweep or profile is archived, read back, validated, listed, resumed.

A run folder `runs/<YYYY-MM-DD>-<label>-<device_slug>/` holds:

| file | written | content |
|---|---|---|
| `manifest.json` | at creation, on updates, at the end | who/what/where: `bench.runs.manifest.Manifest` |
| `cells.jsonl`, `cells.csv` | rewritten whole as each cell ends | one `CellRow` per input size (two formats) |
| `samples.jsonl` | rewritten whole as each cell's samples arrive | one `Sample` per request (cold, warmup, timed) |
| `profile.json` | by `bench profile` / the importer | device-time categories, totals, roofline |
| `run.log` | appended line by line | the human log of the run |

Every JSON/CSV write goes to a temporary file in the same folder and is moved into place with `os.replace`, so a
reader sees either the old file or the new one, never half of one. A process killed at any moment therefore
leaves every finished cell readable and a manifest whose status is still `running` (or `incomplete` when the
sweep could say so); only `finish("complete")` marks a run complete. A command writes a run inside `writing_run`,
which ends it however the command ends: complete, incomplete (a signal), failed (an error), or, for a run it only
joined (`bench profile --run`), with the status it had; the lock released in every case. `run.log` is appended
(one write per line), so at worst its last line is cut.

Order of writes for a cell: `append_samples` first, then `append_cell`: a cell row never exists without its samples.

Definitions of every number: `../shared/measurement.md`. Errors: `RunFolderError` for a folder that is missing,
exists already, is unwritable, corrupt or of another schema version; `InputError` for a bad label.

This module is the folder: creating, writing (atomically), locking, opening, resolving and listing runs. The schema
itself (file names, `MANIFEST_FIELDS`), the readers and `validate_run` are in `bench/runs/schema.py`; the package
`bench.runs` names the public API of both.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as dt
import io
import json
import os
import re
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.errors import InputError, RunFolderError
from bench.runs.manifest import Manifest
from bench.runs.records import CellRow, Sample, as_sample, row_problems
from bench.runs.schema import (
    CELLS_CSV,
    CELLS_JSONL,
    LOG,
    MANIFEST,
    PROFILE,
    SAMPLES,
    SCHEMA_VERSION,
    STATUSES,
    RunFiles,
    manifest_problems,
    profile_problems,
    read_json,
    read_jsonl,
    read_run_files,
    run_files_problems,
)
from bench.signals import stop_signals_handled

LOCK = ".lock"  # flock held by the process that writes the run (RunFolder.lock)
_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# ---- manifest defaults -----------------------------------------------------------------------------------------
def _default_manifest(name: str) -> dict[str, Any]:
    """An empty measured manifest named `name`: status running, started now, every fact unknown."""
    return Manifest(name=name, started_at=now_iso()).to_dict()


def now_iso() -> str:
    """Current UTC time, ISO 8601 to the second (what manifest times use)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# ---- atomic files ----------------------------------------------------------------------------------------------
def _atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same folder and `os.replace` (RunFolderError on OSError)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RunFolderError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n"


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, allow_nan=False, separators=(",", ":")) + "\n" for r in rows)


def _cells_csv(rows: list[CellRow]) -> str:
    """CSV mirror of cells.jsonl: empty for null, lists as JSON text (pandas reads it with `read_csv`)."""
    out = io.StringIO()
    names = [f.name for f in dataclasses.fields(CellRow)]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        d = row.to_dict()
        writer.writerow(["" if d[k] is None else json.dumps(d[k]) if isinstance(d[k], list) else d[k] for k in names])
    return out.getvalue()


# ---- the folder --------------------------------------------------------------------------------------------------
class RunFolder:
    """An open run folder. Create one with `create_run`, open an existing one with `open_run`.

    `manifest` is the parsed manifest.json (updated in place by the writers below); `typed_manifest` is its
    typed view (`bench.runs.manifest.Manifest`), for readers.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self.manifest = manifest
        self._lock_file = None

    def lock(self) -> None:
        """Take the folder's writer lock (an flock on `.lock`, released when this process ends, even by SIGKILL).

        One process writes a run at a time: RunFolderError when another process holds it (a sweep still running,
        or a second `--resume` of the same run)."""
        import fcntl

        if self._lock_file is not None:
            return
        fh = open(self.path / LOCK, "a+", encoding="utf-8")  # noqa: SIM115  (held for the process's life)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise RunFolderError(
                f"run {self.path} is being written by {holder}; wait for it to finish (or stop it), then --resume"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._lock_file = fh

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r}, status={self.status!r})"

    @property
    def typed_manifest(self) -> Manifest:
        """The manifest as a `Manifest` (schema 1 or 2), read from `manifest` now (RunFolderError when it breaks
        its schema)."""
        return Manifest.from_dict(self.manifest, where=str(self.path / MANIFEST))

    @property
    def name(self) -> str:
        """The folder's name, `<YYYY-MM-DD>-<label>-<device_slug>`."""
        return self.path.name

    @property
    def status(self) -> str:
        """The manifest's status: one of `STATUSES` ("?" when missing)."""
        return self.manifest.get("status", "?")

    @property
    def provenance(self) -> str:
        """The provenance kind, "measured" or "published" (manifest provenance.kind; "?" when missing)."""
        return (self.manifest.get("provenance") or {}).get("kind", "?")

    # -- writing --
    def _write_manifest(self) -> None:
        _atomic_write(self.path / MANIFEST, _dumps(self.manifest))

    def update_manifest(self, **fields: Any) -> None:
        """Set top-level manifest keys (e.g. compile_cache=..., build_id=...) and rewrite manifest.json atomically.
        ValueError (and nothing written) when the result breaks the schema."""
        problems = manifest_problems({**self.manifest, **fields})
        if problems:
            raise ValueError(f"update_manifest: {problems[0]}")
        self.manifest.update(fields)
        self._write_manifest()

    def write_json(self, name: str, obj: Any) -> Path:
        """Write `obj` as `<folder>/<name>` atomically (e.g. "profile.json"). Returns the path.
        ValueError for a name that is not a plain file name, or is the manifest; RunFolderError when unwritable."""
        if "/" in name or name.startswith(".") or name == MANIFEST:
            raise ValueError(f"write_json: {name!r} is not a plain file name (use update_manifest for the manifest)")
        path = self.path / name
        _atomic_write(path, _dumps(obj))
        return path

    def append_cell(self, row: CellRow) -> None:
        """Add (or replace, same input_tokens) one cell row; rewrites cells.jsonl and cells.csv whole, atomically.
        ValueError (and nothing written) when the row breaks the schema."""
        problems = row_problems(CellRow, row.to_dict())
        if problems:
            raise ValueError(f"append_cell: {problems[0]}")
        rows = {r.input_tokens: r for r in self.cells()}
        rows[row.input_tokens] = row
        ordered = [rows[k] for k in sorted(rows)]
        _atomic_write(self.path / CELLS_JSONL, _jsonl(r.to_dict() for r in ordered))
        _atomic_write(self.path / CELLS_CSV, _cells_csv(ordered))

    def append_samples(self, rows: Iterable[Sample | Mapping[str, Any]]) -> None:
        """Append request samples; samples.jsonl is rewritten whole, atomically (old rows plus the new ones).
        RunFolderError for a published run (it holds none); ValueError (nothing written) for a row that breaks the
        schema."""
        if self.provenance == "published":
            raise RunFolderError(f"{self.path}: a published run holds no raw samples")
        new = [as_sample(r).to_dict() for r in rows]
        for row in new:
            problems = row_problems(Sample, row)
            if problems:
                raise ValueError(f"append_samples: {problems[0]}")
        path = self.path / SAMPLES
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old and not old.endswith("\n"):
            old += "\n"
        _atomic_write(path, old + _jsonl(new))

    def log(self, line: str) -> None:
        """Append one timestamped line to run.log."""
        try:
            with open(self.path / LOG, "a", encoding="utf-8") as fh:
                fh.write(f"{now_iso()} {line.rstrip()}\n")
        except OSError as exc:
            raise RunFolderError(f"{self.path / LOG}: cannot append ({exc.strerror or exc})") from None

    def finish(self, status: str) -> None:
        """Set the final status ("complete", "incomplete" or "failed") and ended_at; rewrite the manifest, log the
        status and release the writer lock (released even when the writes fail). SIGINT / SIGTERM arriving
        meanwhile are handled once it is done. ValueError for any other status."""
        if status not in STATUSES or status == "running":
            raise ValueError(f"finish: status must be complete, incomplete or failed, got {status!r}")
        with _signals_deferred():  # a signal now is handled once the manifest says so and the lock is released
            self.manifest["status"] = status
            if self.provenance == "measured":
                self.manifest["ended_at"] = now_iso()
            try:
                self._write_manifest()
                self.log(f"run {status}")
            finally:
                self.unlock()

    def unlock(self) -> None:
        """Release the writer lock and remove `.lock` (a process that dies leaves a stale, unheld `.lock`)."""
        if self._lock_file is None:
            return
        import fcntl

        with _signals_deferred():
            try:
                (self.path / LOCK).unlink(missing_ok=True)
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            finally:
                self._lock_file.close()
                self._lock_file = None

    def resume(self) -> None:
        """Mark an interrupted run as running again, holding its lock (RunFolderError for a complete or published
        run, one that another process is still writing, or a corrupt cells.jsonl; then the run is left as it was,
        unlocked)."""
        if self.status == "complete" or self.provenance == "published":
            raise RunFolderError(
                f"{self.path}: run is {self.status} ({self.provenance}); nothing to resume, start a new run with --name"
            )
        self.lock()
        previous = {key: self.manifest.get(key) for key in ("status", "ended_at")}
        written = False
        try:
            cells = self.cells()  # a corrupt row is refused before anything changes
            self.manifest["status"] = "running"
            self.manifest["ended_at"] = None
            self._write_manifest()
            written = True
            if cells:  # a kill between the two cell files can leave the CSV mirror one row behind
                _atomic_write(self.path / CELLS_CSV, _cells_csv(cells))
            self.log(f"resumed; finished inputs: {[r.input_tokens for r in cells]}")
        except BaseException:
            self.manifest.update(previous)
            with _signals_deferred():
                if written:
                    with contextlib.suppress(RunFolderError):
                        self._write_manifest()
                self.unlock()
            raise

    # -- reading --
    def cells(self) -> list[CellRow]:
        """The cell rows, sorted by input_tokens (RunFolderError naming file and line on a bad row)."""
        return read_jsonl(self.path / CELLS_JSONL, CellRow)

    def samples(self) -> list[Sample]:
        """Every recorded request (empty for published runs, which hold none)."""
        return read_jsonl(self.path / SAMPLES, Sample)

    def finished_inputs(self) -> list[int]:
        """Input sizes that already have a cell row (ok or failed): what `--resume` skips."""
        return [r.input_tokens for r in self.cells()]

    def read_json(self, name: str) -> Any:
        """Parse `<folder>/<name>` (RunFolderError naming the file when missing or corrupt)."""
        return read_json(self.path / name)

    def profile(self) -> dict[str, Any] | None:
        """profile.json, or None when the run has none (RunFolderError when corrupt or of another version)."""
        if not (self.path / PROFILE).exists():
            return None
        prof = self.read_json(PROFILE)
        problems = profile_problems(prof)
        if problems:
            raise RunFolderError(f"{self.path}: {problems[0]}")
        return prof


# ---- writing a run: however the command ends, the run ends -----------------------------------------------------
@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held while the body runs, then handled as they would have been (their previous Python
    handlers, called once each, or the default action), so that a short, must-finish write (the final manifest,
    the lock's release) is never cut in half by a signal. Outside the main thread (where Python cannot install
    handlers) nothing is held."""
    received: list[int] = []
    previous: dict = {}
    try:
        with stop_signals_handled(lambda signum, _frame: received.append(signum)) as previous:
            yield
    finally:
        for sig in received:
            handler = previous[sig]
            if callable(handler):
                handler(sig, None)  # e.g. Ctrl-C's KeyboardInterrupt, or StopSignals' flag
            elif handler in (signal.SIG_DFL, None):
                signal.raise_signal(sig)  # e.g. SIGTERM's default: end the process, now that the run is settled


def outcome_of(exc: BaseException | None) -> str:
    """The status a run ends with after its command ended by `exc`: complete (no exception), incomplete
    (KeyboardInterrupt: Ctrl-C, SIGTERM, a stop request) or failed (any other error)."""
    if exc is None:
        return "complete"
    return "incomplete" if isinstance(exc, KeyboardInterrupt) else "failed"


@contextlib.contextmanager
def writing_run(start: Callable[[], RunFolder], *, joined: bool = False,
                before_end: Callable[[RunFolder, str], None] | None = None,
                after_end: Callable[[RunFolder, str], None] | None = None) -> Iterator[RunFolder]:  # fmt: skip
    """Write a run inside `with writing_run(start) as run:`; the run never stays "running" or locked after it.

    `start()` returns the run, locked and being written: `create_run(...)`, a `run.resume()`, or, with
    `joined=True`, a run this command only adds to (it takes the lock; e.g. `bench profile --run`). It runs with
    signals held, inside the guarantee, so no signal can land between the run's start and its protection.
    However the body ends, the run ends: its status (`outcome_of`: complete, incomplete on KeyboardInterrupt,
    failed on another error) is passed to `before_end(run, status)` (final counters, extra files), then the run
    is finished with it (`finish`), or, when joined, keeps the status it had and is only unlocked; then
    `after_end(run, status)` (a closing log line). The end runs even when `before_end` fails or a second signal
    interrupts it (an error there turns "complete" into "failed", a KeyboardInterrupt into "incomplete"), and
    the final write holds signals off until done. Exceptions propagate. If `start()` raises, nothing is ended:
    `create_run` and `resume` leave nothing half-done."""
    run: RunFolder | None = None
    status = "complete"
    try:
        with _signals_deferred():
            run = start()
        yield run
    except BaseException as exc:
        status = outcome_of(exc)
        raise
    finally:
        if run is not None:
            try:
                if before_end is not None:
                    before_end(run, status)
            except BaseException as exc:
                if status == "complete":
                    status = outcome_of(exc)
                raise
            finally:
                if joined:
                    run.unlock()
                else:
                    run.finish(status)
                if after_end is not None:
                    after_end(run, status)


# ---- creating, opening, listing ----------------------------------------------------------------------------------
def run_name(label: str, device_slug: str, date: dt.date | str | None = None) -> str:
    """`<YYYY-MM-DD>-<label>-<device_slug>` (InputError for a label or slug that is not a plain name)."""
    for what, value in (("label", label), ("device slug", device_slug)):
        if not _NAME_PART.fullmatch(value or ""):
            raise InputError(f"run {what} {value!r}: use letters, digits, '.', '_' or '-' (e.g. --name my-test)")
    day = date or dt.date.today()
    day = day.isoformat() if isinstance(day, dt.date) else str(day)
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", day):
        raise InputError(f"run date {day!r}: expected YYYY-MM-DD")
    return f"{day}-{label}-{device_slug}"


def _unwritable(root: Path, exc: OSError) -> RunFolderError:
    return RunFolderError(f"runs folder {root} is not writable ({exc.strerror or exc}); pass --runs-dir DIR")


def free_label(runs_dir: str | Path, label: str, device_slug: str, date: dt.date | str | None = None) -> str:
    """`label`, or `label-2`, `label-3`, ... : the first whose run folder does not exist yet in `runs_dir`.

    For default labels only (a user who names a run explicitly gets the clash error instead of a surprise)."""
    candidate, k = label, 2
    while (Path(runs_dir) / run_name(candidate, device_slug, date)).exists():
        candidate, k = f"{label}-{k}", k + 1
    return candidate


def create_run(
    runs_dir: str | Path, label: str, device_slug: str, manifest: Manifest | Mapping[str, Any], *,
    date: dt.date | str | None = None,
) -> RunFolder:  # fmt: skip
    """Create `runs_dir/<date>-<label>-<device_slug>/` with a manifest (status "running") and an empty run.log.

    `manifest` is a `Manifest` (`bench.runs.manifest.build_manifest`), or a mapping giving any of
    `MANIFEST_FIELDS` (plus extra keys); missing ones get defaults (provenance measured, started_at now, the
    rest null/empty); name and status are set here, and schema_version unless the mapping names a readable
    one (`scripts/import_published_runs.py` recreates the archived schema-1 folders byte for byte). Raises RunFolderError when the folder exists (never overwrites) or the
    runs folder cannot be written, InputError for a bad label, ValueError when `manifest` breaks the schema.
    """
    name = run_name(label, device_slug, date)
    full = _default_manifest(name)
    if isinstance(manifest, Manifest):  # built, not yet started: its unset start time is now
        given = {k: v for k, v in manifest.to_dict().items() if not (k == "started_at" and v is None)}
    else:
        given = dict(manifest)
    full.update(given)
    full.update(schema_version=given.get("schema_version", SCHEMA_VERSION), name=name, status="running")
    problems = manifest_problems(full)
    if problems:
        raise ValueError(f"create_run: {problems[0]}")
    root = Path(runs_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(root, exc) from None
    path = root / name
    try:
        path.mkdir()
    except FileExistsError:
        raise RunFolderError(
            f"run {path} already exists; choose another --name, or continue it with --resume {path}"
        ) from None
    except OSError as exc:
        raise _unwritable(root, exc) from None
    run = RunFolder(path, full)
    run.lock()
    try:
        run._write_manifest()
        (path / LOG).touch()
    except BaseException:  # e.g. the disk filled up: no half-made folder is left behind
        run.unlock()
        for leftover in (path / MANIFEST, path / LOG):
            leftover.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.rmdir()
        raise
    return run


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

    What the report and compare accept. Raises RunFolderError naming the folder and the reason (status not
    complete, a corrupt cells.jsonl line, a bad profile.json, ...).
    """
    return load_complete_run(path)[0]


def load_complete_run(path: str | Path) -> tuple[RunFolder, RunFiles]:
    """`open_complete_run` (the same checks and errors), also returning the files as it parsed them, each once:
    a reader (the report) takes cells, samples and profile from them instead of reading the folder again."""
    p = Path(path)
    if not p.is_dir():
        raise RunFolderError(f"{p}: no such run folder")
    files = read_run_files(p)
    if files.manifest_error is not None:
        raise RunFolderError(files.manifest_error)
    run = _with_manifest(p, files.manifest)
    if run.status != "complete":
        raise RunFolderError(f"{run.path}: status is {run.status!r}, not complete (an interrupted or failed run)")
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


def latest_measured_run(runs_dir: str | Path) -> Path:
    """The measured run of `runs_dir` with sweep cells that started last (RunFolderError when there is none)."""
    best = None
    for summary in list_runs(runs_dir) if Path(runs_dir).is_dir() else []:
        if summary.ok and summary.provenance == "measured" and summary.cells and summary.started_at:
            if best is None or summary.started_at > best.started_at:
                best = summary
    if best is None:
        raise RunFolderError(f"no measured sweep run in {runs_dir}/ for 'latest'; run `make sweep` first, or drop --run")
    return best.path


def resolve_run(ref: str | Path, runs_dir: str | Path = "runs") -> Path:
    """A run given as a path, as a folder name inside `runs_dir`, or as "latest" (`latest_measured_run`).
    RunFolderError names both places when it is neither."""
    if str(ref) == "latest":
        return latest_measured_run(runs_dir)
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
        out.append(RunSummary(p.name, p, m.status, m.provenance.kind, m.device_kind, m.build_id, m.started_at, ncells))
    return out
