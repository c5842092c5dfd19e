"""The run folder (schema version 2; version 1 folders are read too): how a sweep or profile is archived, read back, validated, listed, resumed.

A run folder `runs/<YYYY-MM-DD>-<label>-<device_slug>/` holds:

| file | written | content |
|---|---|---|
| `manifest.json` | at creation, on updates, at the end | who/what/where: `bench.runs.manifest.Manifest` |
| `cells.jsonl`, `cells.csv` | rewritten whole as each cell ends | one `CellRow` per input size (two formats) |
| `samples.jsonl` | appended as each request is measured | one `Sample` per request (cold, cold-resume, warmup, timed) |
| `load.jsonl` | rewritten whole as each load level ends | one `LoadRow` per level (`--concurrency` sweeps only) |
| `load_samples.jsonl` | appended as each request of a level ends | one `LoadSample` per request (`--concurrency`) |
| `profile.json` | by `bench profile` / the importer | device-time categories, totals, roofline |
| `run.log` | appended line by line | the human log of the run |

Every JSON/CSV write goes to a temporary file in the same folder and is moved into place with `os.replace`, so a
reader sees either the old file or the new one, never half of one; samples.jsonl is appended, one `write` per
request, which a killed process cannot cut. A process killed at any moment therefore
leaves every finished cell readable and a manifest whose status is still `running` (or `incomplete` when the
sweep could say so); only `finish("complete")` marks a run complete. A command writes a run inside `writing_run`,
which ends it however the command ends: complete, incomplete (a signal), failed (an error), or, for a run it only
joined (`bench profile --run`), with the status it had; the lock released in every case. `run.log` is appended
(one write per line), so at worst its last line is cut.

Order of writes for a cell: its samples as they are measured, then `append_cell`: a cell row never exists without
its samples. A cell stopped part-way (a signal) gets a partial row (`CellRow.partial`); one cut by a kill or a
second signal has samples and no row yet; `--resume` completes both (`bench.sweep.local.sweep_cells`).

Definitions of every number: `docs/method.md`. Errors: `RunFolderError` for a folder that is missing,
exists already, is unwritable, corrupt or of another schema version; `InputError` for a bad label.

This module is the folder: creating, writing (atomically) and ending runs. The writer lock and the liveness of a
run's writer are `bench/runs/lock.py`; opening, resolving and listing runs `bench/runs/listing.py`; the schema
itself (file names, `MANIFEST_FIELDS`), the readers and `validate_run` `bench/runs/schema.py`; the package
`bench.runs` names the public API of all of them.
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
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.errors import InputError, RunFolderError
from bench.runs.manifest import Manifest
from bench.runs.records import OPTIONAL_FIELDS, CellRow, LoadRow, LoadSample, Sample, as_sample, cell_key, row_problems
from bench.runs.schema import (
    CELLS_CSV,
    CELLS_JSONL,
    LOAD_JSONL,
    LOAD_SAMPLES,
    LOG,
    MANIFEST,
    PROFILE,
    SAMPLES,
    SCHEMA_VERSION,
    STATUSES,
    manifest_problems,
    profile_problems,
    read_json,
    read_jsonl,
)
from bench.runs.lock import LOCK, release_lock, take_lock, writer_state
from bench.signals import on_hard_stop, stop_signals_handled

_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# ---- manifest defaults -----------------------------------------------------------------------------------------
def _default_manifest(name: str) -> dict[str, Any]:
    """An empty measured manifest named `name`: status running, started now, every fact unknown."""
    return Manifest(name=name, started_at=now_iso()).to_dict()


def now_iso() -> str:
    """Current UTC time, ISO 8601 to the second (what manifest times use)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# ---- atomic files ----------------------------------------------------------------------------------------------
def _atomic_write(path: Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path` via a temporary file in the same folder and `os.replace`
    (RunFolderError on OSError)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
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


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _cells_csv(rows: list[CellRow]) -> str:
    """CSV mirror of cells.jsonl: empty for null, lists as JSON text (pandas reads it with `read_csv`)."""
    out = io.StringIO()
    dicts = [row.to_dict() for row in rows]
    optional = OPTIONAL_FIELDS[CellRow]  # columns only when a row has them (a partial cell), as in cells.jsonl
    names = [f.name for f in dataclasses.fields(CellRow) if f.name not in optional or any(f.name in d for d in dicts)]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for d in dicts:
        d = {**optional, **d}
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
        self._ended = False  # finish() has settled the run's status: a hard stop then leaves it as it is

    def lock(self) -> None:
        """Take the folder's writer lock (`bench.runs.lock.take_lock`: an flock on `.lock` naming this pid and
        host, released when this process ends, even by SIGKILL).

        One process writes a run at a time: RunFolderError when another process holds it (a sweep still running,
        or a second `--resume` of the same run)."""
        if self._lock_file is None:
            self._lock_file = take_lock(self.path)

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
        """Add (or replace, same cell: input_tokens and batch, `cell_key`) one cell row; rewrites cells.jsonl and
        cells.csv whole, atomically, ordered by (input_tokens, batch). ValueError (and nothing written) when the
        row breaks the schema."""
        problems = row_problems(CellRow, row.to_dict())
        if problems:
            raise ValueError(f"append_cell: {problems[0]}")
        rows = {cell_key(r): r for r in self.cells()}
        rows[cell_key(row)] = row
        ordered = [rows[k] for k in sorted(rows)]
        _atomic_write(self.path / CELLS_JSONL, _jsonl(r.to_dict() for r in ordered))
        _atomic_write(self.path / CELLS_CSV, _cells_csv(ordered))

    def append_samples(self, rows: Iterable[Sample | Mapping[str, Any]]) -> None:
        """Append request samples to samples.jsonl, all of them in one `write` (the sweep calls it once per request,
        as it is measured, so a stopped or killed sweep keeps every request that came back). A killed process
        leaves the file whole: a write to a file completes or does not happen (only a machine crash could cut the
        last line). RunFolderError for a published run (it holds none) or an unwritable file; ValueError (nothing
        written) for a row that breaks the schema."""
        if self.provenance == "published":
            raise RunFolderError(f"{self.path}: a published run holds no raw samples")
        self._append_rows(SAMPLES, Sample, [as_sample(r).to_dict() for r in rows], "append_samples")

    def append_load_samples(self, rows: Iterable[LoadSample]) -> None:
        """Append requests of a load level to load_samples.jsonl in one `write`, as `append_samples` does
        (RunFolderError for a published run or an unwritable file; ValueError for a row that breaks the schema)."""
        if self.provenance == "published":
            raise RunFolderError(f"{self.path}: a published run holds no raw samples")
        self._append_rows(LOAD_SAMPLES, LoadSample, [r.to_dict() for r in rows], "append_load_samples")

    def append_load(self, row: LoadRow) -> None:
        """Add (or replace, same level key) one load level row; rewrites load.jsonl whole, atomically.
        ValueError (and nothing written) when the row breaks the schema."""
        problems = row_problems(LoadRow, row.to_dict())
        if problems:
            raise ValueError(f"append_load: {problems[0]}")
        rows = {r.key: r for r in self.load_rows()}
        rows[row.key] = row
        ordered = sorted(rows.values(), key=lambda r: (r.input_tokens, r.request_rate or 0.0, r.concurrency))
        _atomic_write(self.path / LOAD_JSONL, _jsonl(r.to_dict() for r in ordered))

    def _append_rows(self, name: str, cls: type, new: list[dict[str, Any]], caller: str) -> None:
        """Append `new` rows (checked against `cls` first: ValueError naming `caller`) to the JSONL file `name` in one
        `write` (RunFolderError when it cannot be written)."""
        for row in new:
            problems = row_problems(cls, row)
            if problems:
                raise ValueError(f"{caller}: {problems[0]}")
        path = self.path / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                cut = os.fstat(fd).st_size > 0 and not _ends_with_newline(path)
                os.write(fd, (("\n" if cut else "") + _jsonl(new)).encode("utf-8"))
            finally:
                os.close(fd)
        except OSError as exc:
            raise RunFolderError(f"{path}: cannot append ({exc.strerror or exc})") from None

    def log(self, line: str, *, at: str | None = None) -> None:
        """Append one timestamped line to run.log: stamped `at` (an ISO 8601 time, `now_iso()`'s form) when the line
        says what happened before the run folder existed (the policy, the kernels, the device rates), else now."""
        try:
            with open(self.path / LOG, "a", encoding="utf-8") as fh:
                fh.write(f"{at or now_iso()} {line.rstrip()}\n")
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
                self._ended = True
                self.unlock()

    def end_at_once(self) -> None:
        """The run's end when the process must end now (a second stop signal, `bench.signals.stop_now`): mark a
        run that is not yet settled incomplete, in one atomic manifest write and a log line; the lock goes with the
        process, and `.lock` is removed while this process still holds it. Never raises (it runs in a signal
        handler, on the way out); a run already finished is left."""
        if self._ended:
            return
        self._ended = True
        try:
            self.manifest["status"] = "incomplete"
            if self.provenance == "measured":
                self.manifest["ended_at"] = now_iso()
            self._write_manifest()
            self.log("run incomplete (stopped at once: a second stop signal, or bench profile's first; "
                     "the work in flight dropped)")
        except BaseException:  # noqa: BLE001 -- on the way out: nothing can be done about a failed write here
            pass
        self._drop_lock_file()

    def _drop_lock_file(self) -> None:
        """Remove `.lock` if this process holds the lock (the flock itself goes with the process); never raises."""
        if self._lock_file is None:  # unlocked already: the .lock may be another writer's now
            return
        with contextlib.suppress(BaseException):  # on the way out: nothing can be done about a failed unlink here
            (self.path / LOCK).unlink(missing_ok=True)

    def leave_at_once(self) -> None:
        """The end of a run this process only joined (`writing_run(joined=True)`) when the process must end now
        (`bench.signals.stop_now`): the run keeps its status and files as they were; `.lock` is removed (the flock
        goes with the process). Never raises (it runs in a signal handler, on the way out)."""
        if self._ended:
            return
        self._ended = True
        self._drop_lock_file()

    def unlock(self) -> None:
        """Release the writer lock and remove `.lock` (a process that dies leaves a stale, unheld `.lock`)."""
        if self._lock_file is None:
            return
        with _signals_deferred():
            try:
                release_lock(self.path, self._lock_file)
            finally:
                self._lock_file = None

    def resume(self) -> None:
        """Mark an interrupted run as running again, holding its lock (RunFolderError for a complete or published
        run, one that another process is still writing, or a corrupt cells.jsonl; then the run is left as it was,
        unlocked)."""
        if self.status == "complete" or self.provenance == "published":
            raise RunFolderError(
                f"{self.path}: run is {self.status} ({self.provenance}); nothing to resume, start a new run with --name"
            )
        gone = writer_state(self.path).interrupted_note(self.name) if self.status == "running" else None
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
            batched = any(r.batch is not None for r in cells)
            finished = self.finished_cells() if batched else self.finished_inputs()
            partial = [cell_key(r) if batched else r.input_tokens for r in cells
                       if (cell_key(r) if batched else r.input_tokens) not in finished]  # fmt: skip
            self.log(f"resumed{' a run that was ' + gone.split(';')[0] if gone else ''}; finished "
                     f"{'cells (input tokens, batch)' if batched else 'inputs'}: {finished}"
                     + (f"; partial: {partial}" if partial else ""))  # fmt: skip
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
        """The cell rows, sorted by (input_tokens, batch) (RunFolderError naming file and line on a bad row)."""
        return read_jsonl(self.path / CELLS_JSONL, CellRow)

    def samples(self) -> list[Sample]:
        """Every recorded request (empty for published runs, which hold none)."""
        return read_jsonl(self.path / SAMPLES, Sample)

    def load_rows(self) -> list[LoadRow]:
        """The load levels of a `--concurrency` sweep ([] for any other run; RunFolderError on a bad row)."""
        return read_jsonl(self.path / LOAD_JSONL, LoadRow)

    def load_samples(self) -> list[LoadSample]:
        """Every recorded request of the load levels ([] for any other run)."""
        return read_jsonl(self.path / LOAD_SAMPLES, LoadSample)

    def finished_inputs(self) -> list[int]:
        """Input sizes whose cell needs no more measuring, what `--resume` skips: a row that is whole, failed, or
        partial by `--max-duration`. A cell stopped part-way (partial, "interrupted"), or one with samples but no
        row (a kill), is not finished: the sweep completes it."""
        return [r.input_tokens for r in self.cells() if not (r.partial and r.stopped_by == "interrupted")
                and (r.batch or 1) == 1]  # fmt: skip

    def finished_cells(self) -> list[tuple[int, int]]:
        """`finished_inputs` as cells of a `--batch` sweep: the (input_tokens, batch) keys (`cell_key`) of the rows
        that need no more measuring."""
        return [cell_key(r) for r in self.cells() if not (r.partial and r.stopped_by == "interrupted")]

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
    `create_run` and `resume` leave nothing half-done. A process ended at once from inside (`bench.signals.stop_now`:
    a second stop signal, or `bench profile`'s first) marks a run it created or resumed incomplete on the way out
    (`RunFolder.end_at_once`) and leaves a joined one with its status, unlocked (`RunFolder.leave_at_once`)."""
    run: RunFolder | None = None
    status = "complete"
    with contextlib.ExitStack() as hard_stop:  # left last: until then a hard stop marks the run incomplete
        try:
            with _signals_deferred():
                run = start()
                # a process ended at once (bench.signals.stop_now) marks a run it started incomplete and leaves a
                # joined one as it was, unlocked
                hard_stop.enter_context(on_hard_stop(run.leave_at_once if joined else run.end_at_once))
            yield run
        except BaseException as exc:
            status = outcome_of(exc)
            raise
        finally:
            if run is not None:
                _end_run(run, status, joined, before_end, after_end)


def _end_run(run: RunFolder, status: str, joined: bool, before_end, after_end) -> None:
    """`writing_run`'s end of `run` (see there): before_end, then finish (or unlock, joined), then after_end."""
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


def check_writable(folder: str | Path, *, flag: str = "--runs-dir") -> None:
    """Check, before a model loads, that a run folder can be created in `folder` (or files written into an
    existing run's folder): a temporary file is created and removed in it, or, when `folder` does not exist yet,
    in its nearest existing parent (create_run makes the missing folders). Writes nothing that stays. Raises
    RunFolderError (one line naming `flag`, the folder and why) when the folder or that parent is a file, or
    cannot be written (permissions, a read-only file system)."""
    root = Path(folder)
    existing = next((p for p in (root, *root.absolute().parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise RunFolderError(f"{flag} {root}: {existing or root} is not a folder; pass {flag} DIR, a folder "
                             "that exists or can be created")  # fmt: skip
    try:
        fd, tmp = tempfile.mkstemp(prefix=".write-check-", dir=existing)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        where = "cannot write there" if existing == root else f"cannot create it in {existing}"
        raise RunFolderError(f"{flag} {root}: {where} ({exc.strerror or exc}); pass {flag} DIR, a folder you can "
                             "write") from None  # fmt: skip


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
