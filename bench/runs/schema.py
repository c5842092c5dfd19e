"""The run-folder schema (version 2; version 1 folders are read too) and its checks: file names, manifest keys and
types, the readers of the JSON and JSONL files, and `validate_run`, which lists every problem of a folder.

Versions: 2 (written now) differs from 1 in the manifest only: `checkpoint.path` (a folder of the machine that
ran) is gone, `checkpoint.source` (how to get the checkpoint again: builtin:NAME or a hub repo id; null for a
local folder) is new, and `build_id` is `bench.runs.manifest.payload_build_id` (code, checkpoint content hash and
the engine configuration only, the same for every command). Cells, samples and profile.json are unchanged.
The typed view of a manifest of either version is `bench.runs.manifest.Manifest`.

`bench/runs/folder.py` (the folder itself: creating, writing, locking, opening, listing) builds on this module and
re-exports its public names; what each file holds is in that module's docstring. Every problem is one line naming
its file (and line); the readers raise RunFolderError naming the file, `validate_run` never raises for a bad folder.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from bench.errors import RunFolderError
from bench.runs.records import CellRow, LoadRow, LoadSample, Sample, cell_key, conforms, row_from_dict, row_problems

SCHEMA_VERSION = 2
"""The manifest schema version this harness writes."""
READABLE_VERSIONS = (1, 2)
"""Manifest schema versions this harness reads, validates, lists, reports and compares."""
PROFILE_SCHEMA_VERSION = 1
"""The version of profile.json (its own: `bench.profile.analysis` writes it; independent of the manifest's)."""
STATUSES = ("running", "complete", "incomplete", "failed")
PROVENANCES = ("measured", "published")
MANIFEST, CELLS_JSONL, CELLS_CSV, SAMPLES, PROFILE, LOG = (
    "manifest.json", "cells.jsonl", "cells.csv", "samples.jsonl", "profile.json", "run.log",
)  # fmt: skip
AB_PAIRS = "pairs.csv"
"""An A/B session's measurements (`bench ab`, kind "ab": bench/ab/archive.py reads and writes it)."""
LOAD_JSONL, LOAD_SAMPLES = "load.jsonl", "load_samples.jsonl"
"""A sweep under load (`--concurrency`): one `LoadRow` per level, one `LoadSample` per request. Older folders have
neither file and read as before."""
_JSONL_FILES = ((CELLS_JSONL, CellRow), (SAMPLES, Sample), (LOAD_JSONL, LoadRow), (LOAD_SAMPLES, LoadSample))


# ---- manifest schema -------------------------------------------------------------------------------------------
_NULL = type(None)
MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "name": (str,),
    "status": (str,),  # one of STATUSES
    "provenance": (dict,),  # {"kind": "measured"|"published", "source": str|None}
    "started_at": (str, _NULL),  # ISO 8601, UTC
    "ended_at": (str, _NULL),
    "command_line": (list, str, _NULL),
    "build_id": (str, _NULL),  # environment.build_id: 12 hex chars
    "git": (dict,),  # {"commit": str|None, "dirty": bool|None}
    "versions": (dict,),  # {"python": ..., "jax": ..., ...}: environment.package_versions
    "device": (dict,),  # environment.device_facts (+ free-form notes)
    "host": (dict,),  # environment.host_facts (+ "description" for published hosts)
    "dtype_policy": (dict, _NULL),  # {"compute_dtype", "weights", "activations", "kv_cache", ...}
    "checkpoint": (dict,),  # {"id", "content_hash", "weight_bytes", "source"} (version 1: "path" for "source")
    "engine_config": (dict,),  # buckets, max length, quantization/layout, cache dtype, ...
    "compile_cache": (dict,),  # {"dir", "hits", "misses"}
}
"""Required top-level manifest keys and their JSON types (None = null allowed). Extra keys are allowed."""

_CHECKPOINT_V1 = {"id": (str, _NULL), "path": (str, _NULL), "content_hash": (str, _NULL), "weight_bytes": (int, _NULL)}
_CHECKPOINT_V2 = {"id": (str, _NULL), "source": (str, _NULL), "content_hash": (str, _NULL), "weight_bytes": (int, _NULL)}
MANIFEST_NESTED: dict[int, dict[str, dict[str, tuple[type, ...]]]] = {
    version: {
        "provenance": {"kind": (str,), "source": (str, _NULL)},
        "git": {"commit": (str, _NULL), "dirty": (bool, _NULL)},
        "checkpoint": checkpoint,
        "compile_cache": {"dir": (str, _NULL), "hits": (int, _NULL), "misses": (int, _NULL)},
    }
    for version, checkpoint in ((1, _CHECKPOINT_V1), (2, _CHECKPOINT_V2))
}
"""Required keys inside the nested manifest objects, per schema version."""


def _json_type_ok(value: Any, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed)


def manifest_problems(manifest: Any) -> list[str]:
    """Problems of a parsed manifest against its schema version, 1 or 2 (each prefixed with `manifest.json`)."""
    if not isinstance(manifest, dict):
        return [f"{MANIFEST}: expected a JSON object, got {type(manifest).__name__}"]
    version = manifest.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        readable = " and ".join(map(str, READABLE_VERSIONS))
        return [f"{MANIFEST}: schema_version {version!r} is not supported (this harness reads {readable})"]
    problems = []
    for key, allowed in MANIFEST_FIELDS.items():
        if key not in manifest:
            problems.append(f"{MANIFEST}: missing key {key!r}")
        elif not _json_type_ok(manifest[key], allowed):
            names = "/".join("null" if t is _NULL else t.__name__ for t in allowed)
            problems.append(f"{MANIFEST}: key {key!r} should be {names}, got {type(manifest[key]).__name__}")
    for key, fields in MANIFEST_NESTED[version].items():
        sub = manifest.get(key)
        if not isinstance(sub, dict):
            continue
        for field, allowed in fields.items():
            if field not in sub:
                problems.append(f"{MANIFEST}: missing key {key}.{field}")
            elif not _json_type_ok(sub[field], allowed):
                problems.append(f"{MANIFEST}: key {key}.{field} has the wrong type ({type(sub[field]).__name__})")
    if manifest.get("status") not in STATUSES:
        problems.append(f"{MANIFEST}: status {manifest.get('status')!r} is not one of {STATUSES}")
    kind = (manifest.get("provenance") or {}).get("kind") if isinstance(manifest.get("provenance"), dict) else None
    if kind not in PROVENANCES:
        problems.append(f"{MANIFEST}: provenance.kind {kind!r} is not one of {PROVENANCES}")
    elif kind == "published" and not manifest["provenance"].get("source"):
        problems.append(f"{MANIFEST}: a published run must name its source (provenance.source)")
    return problems


def profile_problems(prof: Any) -> list[str]:
    """Problems of a parsed profile.json: an object, schema_version 1 (`PROFILE_SCHEMA_VERSION`), categories
    {name: {"pct": number|null}}."""
    if not isinstance(prof, dict):
        return [f"{PROFILE}: expected a JSON object"]
    if prof.get("schema_version") != PROFILE_SCHEMA_VERSION:
        version = prof.get("schema_version")
        return [f"{PROFILE}: schema_version {version!r} is not supported (expected {PROFILE_SCHEMA_VERSION})"]
    problems = []
    cats = prof.get("categories", {})
    if not isinstance(cats, dict):
        problems.append(f"{PROFILE}: categories should be an object")
    else:
        for name, cat in cats.items():
            if not isinstance(cat, dict) or not conforms(cat.get("pct"), float | None):
                problems.append(f"{PROFILE}: category {name!r} should be {{'pct': number|null, ...}}")
    for key in ("totals", "roofline"):
        if key in prof and not isinstance(prof[key], dict):
            problems.append(f"{PROFILE}: {key} should be an object")
    return problems


# ---- reading ---------------------------------------------------------------------------------------------------
def read_json(path: Path) -> Any:
    """The parsed JSON file `path` (RunFolderError naming it when missing, unreadable or corrupt)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path}: unreadable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: corrupt JSON (line {exc.lineno}: {exc.msg})") from None


_Lines = tuple[tuple[int, Any], ...]  # (line number, parsed object or the JSONDecodeError), blank lines left out


def _parse_lines(text: str) -> _Lines:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            out.append((lineno, exc))
    return tuple(out)


def _typed_rows(path: Path, lines: _Lines, cls: type) -> list[Any]:
    rows = []
    for lineno, obj in lines:
        if isinstance(obj, json.JSONDecodeError):
            raise RunFolderError(f"{path} line {lineno}: corrupt JSON ({obj.msg})") from None
        rows.append(row_from_dict(cls, obj, f"{path} line {lineno}"))
    return rows


def read_jsonl(path: Path, cls: type) -> list[Any]:
    """The rows of the JSONL file `path` as `cls` records (CellRow or Sample); [] when the file does not exist.
    RunFolderError naming the file and line for corrupt JSON or a row that breaks the record's schema."""
    if not path.exists():
        return []
    return _typed_rows(path, _parse_lines(path.read_text(encoding="utf-8")), cls)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFiles:
    """One run folder's files, each read and parsed once (`read_run_files`): what `validate_run` checks and what a
    reader such as the report then uses, so that nothing is parsed twice.

    manifest: parsed manifest.json, or None with `manifest_error` (the RunFolderError text: missing, corrupt).
    lines: per JSONL file present (CELLS_JSONL, SAMPLES), its non-blank lines as (line number, parsed object or
        the json.JSONDecodeError). csv_rows: rows of cells.csv (None when it is missing).
    profile: parsed profile.json (None when absent or unreadable; `profile_error` says why when unreadable).
    `cells` and `samples` are the typed rows (built once; RunFolderError naming file and line, as `read_jsonl`).
    """

    path: Path
    manifest: Any
    manifest_error: str | None
    lines: dict[str, _Lines]
    csv_rows: int | None
    profile: Any
    profile_error: str | None

    @property
    def has_profile(self) -> bool:
        """True when the folder holds a profile.json (readable or not)."""
        return self.profile is not None or self.profile_error is not None

    @functools.cached_property
    def cells(self) -> list[CellRow]:
        """The cell rows of cells.jsonl ([] when it does not exist)."""
        return _typed_rows(self.path / CELLS_JSONL, self.lines.get(CELLS_JSONL, ()), CellRow)

    @functools.cached_property
    def samples(self) -> list[Sample]:
        """The requests of samples.jsonl ([] when it does not exist)."""
        return _typed_rows(self.path / SAMPLES, self.lines.get(SAMPLES, ()), Sample)

    @functools.cached_property
    def load_rows(self) -> list[LoadRow]:
        """The load levels of load.jsonl ([] when it does not exist)."""
        return _typed_rows(self.path / LOAD_JSONL, self.lines.get(LOAD_JSONL, ()), LoadRow)

    @functools.cached_property
    def load_samples(self) -> list[LoadSample]:
        """The requests of load_samples.jsonl ([] when it does not exist)."""
        return _typed_rows(self.path / LOAD_SAMPLES, self.lines.get(LOAD_SAMPLES, ()), LoadSample)


def read_run_files(path: str | Path) -> RunFiles:
    """Read and parse every file of the run folder `path` once. Never raises for a missing or corrupt file (the
    problem is kept for `run_files_problems`); OSError only when a present file cannot be read at all."""
    p = Path(path)
    try:
        manifest, manifest_error = read_json(p / MANIFEST), None
    except RunFolderError as exc:
        manifest, manifest_error = None, str(exc)
    lines = {name: _parse_lines((p / name).read_text(encoding="utf-8", errors="replace"))
             for name, _cls in _JSONL_FILES if (p / name).exists()}  # fmt: skip
    csv_rows = None
    if (p / CELLS_CSV).exists():
        with open(p / CELLS_CSV, encoding="utf-8", newline="") as fh:
            csv_rows = sum(1 for _ in csv.DictReader(fh))
    profile, profile_error = None, None
    if (p / PROFILE).exists():
        try:
            profile = read_json(p / PROFILE)
        except RunFolderError as exc:
            profile_error = str(exc)
    return RunFiles(path=p, manifest=manifest, manifest_error=manifest_error, lines=lines, csv_rows=csv_rows,
                    profile=profile, profile_error=profile_error)  # fmt: skip


# ---- validation ------------------------------------------------------------------------------------------------
def validate_run(path: str | Path) -> list[str]:
    """Every problem of a run folder against its schema version (1 or 2); an empty list means valid.

    Checks the manifest (keys, types, status, provenance), each cells.jsonl and samples.jsonl line, that
    cells.csv exists and (in a complete run) mirrors cells.jsonl, that a complete run has cells, that a published run has no samples, and
    profile.json when present. Each problem names its file (and line). Never raises for a bad folder.
    """
    p = Path(path)
    if not p.is_dir():
        return [f"{p}: no such run folder"]
    return run_files_problems(read_run_files(p))


def run_files_problems(files: RunFiles) -> list[str]:
    """`validate_run` of a folder already read (`read_run_files`): the same problems, no file read again."""
    p = files.path
    if files.manifest_error is not None:
        return [files.manifest_error.replace(f"{p}/", "")]
    manifest = files.manifest
    problems = manifest_problems(manifest)
    if problems and ("schema_version" in problems[0] or not isinstance(manifest, dict)):
        return problems
    published = isinstance(manifest.get("provenance"), dict) and manifest["provenance"].get("kind") == "published"

    for fname, cls in _JSONL_FILES:
        if fname not in files.lines:
            continue
        seen: set[Any] = set()
        for lineno, obj in files.lines[fname]:
            if isinstance(obj, json.JSONDecodeError):
                problems.append(f"{fname} line {lineno}: corrupt JSON ({obj.msg})")
                continue
            problems += [f"{fname} line {lineno}: {msg}" for msg in row_problems(cls, obj)]
            if cls is CellRow and isinstance(obj, dict):
                key = (obj.get("input_tokens"), obj.get("batch") or 1)  # a cell: input size and batch (None: 1)
                if key in seen:
                    batch = f", batch={key[1]}" if obj.get("batch") is not None else ""
                    problems.append(f"{fname} line {lineno}: duplicate cell for input_tokens={obj['input_tokens']}{batch}")
                seen.add(key)
            if cls is LoadRow and isinstance(obj, dict):
                key = (obj.get("input_tokens"), obj.get("concurrency"), obj.get("request_rate"))
                if key in seen:
                    problems.append(f"{fname} line {lineno}: duplicate level for input_tokens={key[0]}, "
                                    f"concurrency={key[1]}, request_rate={key[2]}")  # fmt: skip
                seen.add(key)
        if cls is CellRow:
            if files.csv_rows is None:
                problems.append(f"{CELLS_CSV}: missing (it mirrors {CELLS_JSONL})")
            elif files.csv_rows != len(seen) and manifest.get("status") == "complete":  # a kill may leave it behind
                problems.append(f"{CELLS_CSV}: {files.csv_rows} rows but {CELLS_JSONL} has {len(seen)}")
    if not problems and not published:
        problems += _consistency_problems(files)
    measured = (CELLS_JSONL in files.lines or LOAD_JSONL in files.lines or files.has_profile
                or (p / AB_PAIRS).is_file())  # an A/B session's measurements (bench/ab/archive.py)
    if manifest.get("status") == "complete" and not measured:
        problems.append(f"{CELLS_JSONL}: missing in a complete run (and no {LOAD_JSONL} or {PROFILE} either)")
    if published and (SAMPLES in files.lines or LOAD_SAMPLES in files.lines):
        problems.append(f"{SAMPLES}: a published run must not hold raw samples (it never had any)")
    if files.profile_error is not None:
        problems.append(files.profile_error.replace(f"{p}/", ""))
    elif files.profile is not None:
        problems += profile_problems(files.profile)
    return problems


def manifest_status(files: RunFiles) -> str | None:
    """The status the parsed manifest of `files` states (None when it has none)."""
    return files.manifest.get("status") if isinstance(files.manifest, dict) else None


def _consistency_problems(files: RunFiles) -> list[str]:
    """Numbers that contradict each other in a schema-valid measured run: a cell whose median lies outside its
    min..max, whose timed samples are not `repeats` distinct repeats, or whose validity ignores its samples."""
    try:
        cells, samples = files.cells, files.samples
    except RunFolderError as exc:
        return [str(exc)]
    problems = []
    for c in cells:
        where = f"{CELLS_JSONL}: cell {c.input_tokens}" + (f" batch {c.batch}" if c.batch is not None else "")
        for metric in ("gauge_tok_s", "e2e_tok_s", "ttft_ms"):
            lo, mid, hi = (getattr(c, f"{metric}_{k}") for k in ("min", "median", "max"))
            if None not in (lo, mid, hi) and not lo <= mid <= hi:
                problems.append(f"{where}: {metric} median {mid} is outside min..max {lo}..{hi}")
        if c.status != "ok":
            continue
        mine = [s for s in samples if cell_key(s) == cell_key(c)]
        host = [s.repeat for s in mine if s.kind == "timed"]
        expected = {"timed": c.repeats or 0, "timed-device": c.device_repeats}
        if c.device_repeats is not None and not host:  # the device loop alone: its repeats are the cell's
            expected["timed"] = 0
        for kind, count in expected.items():
            if count is None:
                continue
            timed = [s.repeat for s in mine if s.kind == kind]
            if c.partial and c.stopped_by == "interrupted" and manifest_status(files) != "complete":
                timed = timed[:count]  # a resume that completes it may have been cut too, after more repeats
            if sorted(timed) != list(range(count)):
                problems.append(f"{where}: {SAMPLES} holds {kind} repeats {sorted(timed)}, expected 0..{count - 1}"
                                " (missing samples, or two processes wrote this run)")  # fmt: skip
    return problems
