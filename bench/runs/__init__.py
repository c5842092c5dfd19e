"""Run folders: the schema (typed rows, typed manifest), atomic writes, reading, validation, listing, resuming.

Standard library only (no jax): the report and `bench runs` read archived runs of machines you no longer have.
- `CellRow`, `Sample`, `summarize_cell`, `failed_cell`, `as_sample`, `cell_key`; `LoadRow`, `LoadSample`,
  `summarize_level`, `failed_level` (a sweep under load)              (bench.runs.records: the typed rows)
- file names, `MANIFEST_FIELDS`, `SCHEMA_VERSION`, `READABLE_VERSIONS`, `PROFILE_SCHEMA_VERSION`, `validate_run`,
  `manifest_problems`, `profile_problems`, `read_json`, `read_jsonl`, `RunFiles`, `read_run_files` (each file
  parsed once)                                                        (bench.runs.schema)
- `RunFolder`, `create_run`, `check_writable`, `writing_run`, `run_name`, `free_label`, `outcome_of`  (bench.runs.folder)
- `open_run`, `open_complete_run`, `load_complete_run`, `load_reported_run` (complete or incomplete runs:
  `REPORTED_STATUSES`), `resolve_run`, `latest_measured_run`, `list_runs`, `run_folders`, `RunSummary`,
  `run_note`                                                          (bench.runs.listing)
- `WriterState`, `writer_state`: is a run's writer alive             (bench.runs.lock)
- `Manifest` and its parts (`PeerEngine`: another engine measured as a peer), `build_manifest` (the one
  builder), `payload_build_id` (the one build id), `engine_config_of`, `policy_facts`, `checkpoint_facts`,
  `checkpoint_id`, `checkpoint_source`, `portable_dir`, `local_dir`, `RATES_KEY` (a sweep's measured rates) and
  `read_bandwidth_of` (its read-only bandwidth, None for older runs), `copy_bandwidths_of` (its copy bandwidth
  before the first cell and after the last) and `drift_pct`  (bench.runs.manifest)
- the roofline's ceiling (max(fastest read, datasheet)), the share against it and the finding above 100%:
  `Ceiling`, `ceiling_of`, `roofline_ceiling`, `DATASHEETS`, `share_pct`, `RooflineFinding`  (bench.runs.ceiling)
- environment facts and the raw build id hash                         (bench.runs.environment)
- the sweep cell's columns and the one number format, for every printer (bench.runs.columns)
"""

from bench.runs.folder import (
    RunFolder,
    check_writable,
    create_run,
    free_label,
    now_iso,
    outcome_of,
    run_name,
    writing_run,
)
from bench.runs.listing import (
    REPORTED_STATUSES,
    RunSummary,
    latest_measured_run,
    list_runs,
    load_complete_run,
    load_reported_run,
    open_complete_run,
    open_run,
    resolve_run,
    run_folders,
    run_note,
)
from bench.runs.lock import WriterState, writer_state
from bench.runs.manifest import (
    CheckpointFacts,
    CompileCacheFacts,
    EngineConfig,
    GitState,
    Manifest,
    PeerEngine,
    Provenance,
    TargetFacts,
    Workload,
    build_manifest,
    checkpoint_facts,
    checkpoint_id,
    checkpoint_source,
    copy_bandwidths_of,
    drift_pct,
    engine_config_of,
    engine_options_of,
    ENGINE_OPTIONS_KEY,
    local_dir,
    payload_build_id,
    policy_facts,
    portable_dir,
    RATES_KEY,
    read_bandwidth_of,
)
from bench.runs.records import (
    CellRow,
    LoadRow,
    LoadSample,
    Sample,
    as_sample,
    cell_key,
    failed_cell,
    failed_level,
    summarize_cell,
    summarize_level,
)
from bench.runs.schema import (
    CELLS_CSV,
    CELLS_JSONL,
    LOAD_JSONL,
    LOAD_SAMPLES,
    LOG,
    MANIFEST,
    MANIFEST_FIELDS,
    PROFILE,
    PROFILE_SCHEMA_VERSION,
    PROVENANCES,
    READABLE_VERSIONS,
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
    "RunFolder", "RunSummary", "check_writable", "create_run", "free_label", "latest_measured_run", "list_runs", "load_complete_run",
    "load_reported_run", "REPORTED_STATUSES", "now_iso", "open_complete_run", "open_run", "outcome_of", "resolve_run",
    "run_folders", "run_name", "writing_run",
    "run_note", "WriterState", "writer_state",
    "CellRow", "Sample", "as_sample", "cell_key", "failed_cell", "summarize_cell", "LoadRow", "LoadSample",
    "failed_level", "summarize_level",
    "CheckpointFacts", "CompileCacheFacts", "EngineConfig", "GitState", "Manifest", "PeerEngine", "Provenance",
    "TargetFacts",
    "Workload", "build_manifest", "checkpoint_facts", "checkpoint_id", "checkpoint_source", "copy_bandwidths_of",
    "drift_pct", "engine_config_of", "engine_options_of", "ENGINE_OPTIONS_KEY",
    "local_dir", "payload_build_id", "policy_facts", "portable_dir", "RATES_KEY", "read_bandwidth_of",
    "CELLS_CSV", "CELLS_JSONL", "LOAD_JSONL", "LOAD_SAMPLES", "LOG", "MANIFEST", "MANIFEST_FIELDS", "PROFILE", "PROFILE_SCHEMA_VERSION",
    "PROVENANCES", "READABLE_VERSIONS", "SAMPLES", "SCHEMA_VERSION", "STATUSES", "RunFiles", "manifest_problems",
    "profile_problems", "read_json", "read_jsonl", "read_run_files", "validate_run",
]  # fmt: skip
