"""Run folders: the schema (typed rows, manifest fields), atomic writes, reading, validation, listing, resuming.

Standard library only (no jax): the report and `bench runs` read archived runs of machines you no longer have.
- `CellRow`, `Sample`, `summarize_cell`, `failed_cell`, `as_sample`   (bench.runs.records: the typed rows)
- file names, `MANIFEST_FIELDS`, `SCHEMA_VERSION`, `validate_run`, `manifest_problems`, `profile_problems`,
  `read_json`, `read_jsonl`, `RunFiles`, `read_run_files` (each file parsed once)  (bench.runs.schema)
- `RunFolder`, `create_run`, `open_run`, `open_complete_run`, `load_complete_run`, `writing_run`, `resolve_run`,
  `latest_measured_run`, `list_runs`, `run_folders`, `RunSummary`, `run_name`, `free_label`  (bench.runs.folder)
- environment facts and the build id                                  (bench.runs.environment)
- the sweep cell's columns and the one number format, for every printer (bench.runs.columns)
"""

from bench.runs.folder import (
    RunFolder,
    RunSummary,
    create_run,
    free_label,
    latest_measured_run,
    list_runs,
    load_complete_run,
    now_iso,
    open_complete_run,
    open_run,
    outcome_of,
    resolve_run,
    run_folders,
    run_name,
    writing_run,
)
from bench.runs.records import CellRow, Sample, as_sample, failed_cell, summarize_cell
from bench.runs.schema import (
    CELLS_CSV,
    CELLS_JSONL,
    LOG,
    MANIFEST,
    MANIFEST_FIELDS,
    PROFILE,
    PROVENANCES,
    SAMPLES,
    SCHEMA_VERSION,
    STATUSES,
    RunFiles,
    manifest_problems,
    profile_problems,
    read_json,
    read_jsonl,
    read_run_files,
    validate_run,
)

__all__ = [
    "RunFolder", "RunSummary", "create_run", "free_label", "latest_measured_run", "list_runs", "load_complete_run",
    "now_iso", "open_complete_run", "open_run", "outcome_of", "resolve_run", "run_folders", "run_name", "writing_run",
    "CellRow", "Sample", "as_sample", "failed_cell", "summarize_cell",
    "CELLS_CSV", "CELLS_JSONL", "LOG", "MANIFEST", "MANIFEST_FIELDS", "PROFILE", "PROVENANCES", "SAMPLES",
    "SCHEMA_VERSION", "STATUSES", "RunFiles", "manifest_problems", "profile_problems", "read_json", "read_jsonl",
    "read_run_files", "validate_run",
]  # fmt: skip
