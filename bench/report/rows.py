"""The report's long format (llama-bench style): one typed row per (run, cell), the run's identity keys beside the
cell's measured values with their spread, and the one column list every printer of these rows takes.

`run_keys(view)` reads a run's keys from its typed manifest (`bench.runs.Manifest`): device, host, checkpoint id and
content hash, weight bytes, quantization, dtypes, batch, concurrency, max_new_tokens, build id, date, provenance,
engine backend (`backend_of`).
An axis the run does not record gets its default: batch 1, concurrency 1, quantization "none" (every run so far
decoded one sequence, one request at a time, unquantized). Concurrency is read from `engine_config.concurrency`
(a workload note: a sweep through a server); batch and quantization from the engine configuration.

`ROW_COLUMNS` is the column list: the run's keys (`RowColumn` with `get`), then every sweep-cell column of
`bench.runs.columns.CELL_COLUMNS` applied to the row's cell, then the device decode loop's columns, written only
where a row has them (`row_columns`). The printers (`rows_markdown`, `rows_csv`,
`rows_jsonl`, `rows_plain`, and the HTML page of bench/report/page.py) print a choice of these columns and format
no number themselves: a cell column prints as its `Column` does, a key as its text ("—" for null).

Standard library only (no jax, no engine).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bench.runs.columns import (
    CELL_COLUMNS,
    COMPLETENESS_COLUMNS,
    DASH,
    DEVICE_LOOP_COLUMNS,
    EXPERT_COLUMNS,
    ROOFLINE_COLUMNS,
    Column,
    present,
)
from bench.runs.records import CellRow

_VENDOR = ("NVIDIA ", "Tesla ", "GeForce ")
_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})")
DEFAULT_BATCH = 1
DEFAULT_CONCURRENCY = 1
DEFAULT_QUANTIZATION = "none"
DEFAULT_SCALE_DTYPE = "bfloat16"


METHOD_IN_PROCESS = "in-process"
METHOD_REMOTE = "remote target"
METHOD_PUBLISHED = "as published"
METHOD_PEER = "peer"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunKeys:
    """A run's identity, as the long format and the comparison groups use it (None: not recorded).

    `device`: the chip's short name ("T4G", "L4", "CPU"); `host`: the host's description, else its CPU model;
    `checkpoint_hash`: sha256 hex of the checkpoint content; `weight_bytes`: bytes of the loaded parameters;
    `quantization` ("none" when unrecorded), `weight_dtype`, `compute_dtype`, `kv_cache_dtype`: dtype names;
    `batch`, `concurrency`: sequences decoded together and requests in flight (1 when unrecorded);
    `max_new_tokens`: tokens generated per request (the manifest's, else its cells'); `date`: YYYY-MM-DD the run started (else its folder name's);
    `started_at`: ISO time (ordering); `provenance`: "measured" or "published"; `label`: the report's short name;
    `batch_sweep`: the batch sizes of a `--batch` sweep (as its manifest records them, else as its cells have
    them), None for any other run;
    `profile_batch`: the rows a profile-only run (`bench profile [--batch B]`) decoded per step (1 without
    --batch), None for any other run;
    `run_status`: the run's status, "complete" or "incomplete" (interrupted: only its finished cells are valid);
    `backend`: which engine ran (`backend_of`: "jax", "cpu-kernels", with "(inferred)" for a manifest from
    before it was recorded; None for published figures and peers);
    `mesh`: the device mesh the run's engine was placed on (`mesh_of`: "tp=2"), None on one device; such a run's
    `device` names it after the chip ("CPU tp=2"), so a mesh is drawn beside one device, never as one;
    `method`: how the numbers were timed (`method_of`): "in-process" (the engine timed in this process),
    "remote target" (`sweep --target`: client-side timing over HTTP, streamed), "<engine> (peer)" (another engine,
    e.g. transformers, timed in its own process on the same workload) or "as published".
    """

    run: str
    label: str
    device: str
    host: str | None
    checkpoint_id: str | None
    checkpoint_hash: str | None
    weight_bytes: int | None
    quantization: str
    weight_dtype: str | None
    compute_dtype: str | None
    kv_cache_dtype: str | None
    batch: int
    concurrency: int
    max_new_tokens: int | None
    build_id: str | None
    date: str | None
    started_at: str | None
    provenance: str
    method: str = METHOD_IN_PROCESS
    run_status: str = "complete"
    batch_sweep: tuple[int, ...] | None = None
    profile_batch: int | None = None
    backend: str | None = None
    mesh: str | None = None

    @property
    def published(self) -> bool:
        """True for figures measured elsewhere (no raw samples)."""
        return self.provenance == "published"

    @property
    def rows_per_step(self) -> tuple[int, ...]:
        """The rows per decode step this run measured, as the runs tables print them: a `--batch` sweep's batch
        sizes (`batch_sweep`), a profile-only run's profiled rows (`profile_batch`), else (`batch`,). `batch`
        stays the engine's recorded batch (the configuration key); this is what a reader asks of a run."""
        if self.batch_sweep:
            return self.batch_sweep
        return (self.profile_batch,) if self.profile_batch is not None else (self.batch,)

    @property
    def dtypes(self) -> str:
        """"weights/compute/kv cache" dtype names, "?" for an unrecorded one."""
        return "/".join(x or "?" for x in (self.weight_dtype, self.compute_dtype, self.kv_cache_dtype))


def chip_name(device: dict[str, Any] | None) -> str:
    """The short name of a manifest's device: its kind without the vendor words ("NVIDIA L4" -> "L4"), "CPU" for
    any CPU, "?" when unrecorded."""
    kind = (device or {}).get("device_kind") or (device or {}).get("platform") or "?"
    for word in _VENDOR:
        kind = kind.replace(word, "")
    return "CPU" if kind.lower().startswith("cpu") else kind.strip()


def method_of(manifest: Any) -> str:
    """How a run's numbers were timed, from its typed manifest (`bench.runs.Manifest`): "as published" for
    published figures, "remote target" for a sweep through a server (the manifest records a `target`, or its
    command is "sweep --target"), "<engine> (peer)" (e.g. "transformers 5.24.0 (peer)") for another engine
    measured on the sweep's workload (the manifest records a `peer`), else "in-process". A peer is therefore a
    comparison group of its own, never mixed into our engine's."""
    if manifest.provenance.kind == "published":
        return METHOD_PUBLISHED
    if manifest.peer is not None:
        return f"{manifest.peer.label} ({METHOD_PEER})"
    if manifest.extra.get("target") is not None or manifest.command == "sweep --target":
        return METHOD_REMOTE
    return METHOD_IN_PROCESS


def backend_of(manifest: Any) -> str | None:
    """The engine backend of a run, from its typed manifest (`bench.runs.manifest.EngineConfig.backend`): "jax"
    (the pure-JAX engine) or "cpu-kernels" as recorded; for a manifest from before it was recorded, inferred from
    the kernels it names (`EngineConfig.kernel`: "bf16=cpu" or "attention=cpu" ran only under the CPU kernels, then
    on by default where they built), as "cpu-kernels (inferred)" or "jax (inferred)"; None for published figures
    and for a peer (another engine)."""
    if manifest.provenance.kind == "published" or manifest.peer is not None:
        return None
    if manifest.engine.backend:
        return manifest.engine.backend
    kernel = (manifest.engine.kernel or "").split()
    cpu = any(part in ("bf16=cpu", "attention=cpu") for part in kernel)
    return f"{'cpu-kernels' if cpu else 'jax'} (inferred)"


def mesh_of(manifest: Any) -> str | None:
    """The device mesh a run's engine was placed on, from its typed manifest's stored engine configuration
    (`engine_options.mesh`, e.g. "tp=2"); None on one device, and for a run that records none (every run before
    meshes ran on one device)."""
    stored = manifest.extra.get("engine_options")
    mesh = stored.get("mesh") if isinstance(stored, dict) else None
    return mesh if isinstance(mesh, str) and mesh else None


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def quantization_label(quantization: str | None, scale_dtype: str | None) -> str:
    """A run's quantization as its key: the recorded option set ("none" when unrecorded: a manifest from before
    `--quant` is dense), with its scale dtype named when not the default bfloat16 ("w8 (float16 scales)"), so runs
    whose weights differ never share a key."""
    quant = quantization or DEFAULT_QUANTIZATION
    if quant == DEFAULT_QUANTIZATION or scale_dtype in (None, DEFAULT_SCALE_DTYPE):
        return quant
    return f"{quant} ({scale_dtype} scales)"


def run_keys(view: Any) -> RunKeys:
    """The identity keys of a `bench.report.tables.RunView` (from its typed manifest; defaults as the module
    docstring says). Raises RunFolderError when the manifest breaks its schema (it was validated on loading)."""
    m = view.run.typed_manifest
    policy = m.dtype_policy or {}
    date = (m.started_at or "")[:10] or (_DATE.match(view.name).group(1) if _DATE.match(view.name) else None)
    mesh = mesh_of(m)
    return RunKeys(
        run=view.name, label=view.label, device=chip_name(dict(m.device)) + (f" {mesh}" if mesh else ""),
        host=m.host.get("description") or m.host.get("cpu_model"), checkpoint_id=m.checkpoint.id,
        checkpoint_hash=m.checkpoint.content_hash, weight_bytes=m.checkpoint.weight_bytes,
        quantization=quantization_label(m.engine.quantization, m.engine.scale_dtype),
        weight_dtype=m.engine.weight_dtype or policy.get("weights"),
        compute_dtype=m.engine.compute_dtype or policy.get("compute_dtype"),
        kv_cache_dtype=m.engine.kv_cache_dtype or policy.get("kv_cache"),
        batch=_int_or(m.engine.batch, DEFAULT_BATCH),
        concurrency=_int_or(m.workload.notes.get("concurrency"), DEFAULT_CONCURRENCY),
        max_new_tokens=m.workload.max_new_tokens or next((c.max_new_tokens for c in view.cells.values()), None),
        build_id=m.build_id, date=date, started_at=m.started_at,
        provenance=m.provenance.kind, method=method_of(m), run_status=m.status, batch_sweep=_batch_sweep(m, view),
        profile_batch=_profile_batch(m, view.run.manifest), backend=backend_of(m), mesh=mesh,
    )  # fmt: skip


def _profile_batch(manifest: Any, raw: dict[str, Any]) -> int | None:
    """The rows a profile-only run (command "profile") decoded per step: its manifest's
    `engine_config.profile_batch` (written for B > 1), else 1; None for any other run."""
    if manifest.command != "profile":
        return None
    return _int_or((raw.get("engine_config") or {}).get("profile_batch"), 1)


def _batch_sweep(manifest: Any, view: Any) -> tuple[int, ...] | None:
    """The `--batch` values of a sweep: as its manifest records them (the workload note "batches"), else the
    batches of its cells (`RunView.batch_cells`); None for a run that is not a `--batch` sweep."""
    batches = manifest.workload.notes.get("batches")
    if isinstance(batches, list):
        return tuple(b for b in batches if isinstance(b, int))
    return tuple(sorted({b for _, b in view.batch_cells})) if view.batch_cells else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReportRow:
    """One (run, cell): the run's keys and one input size's measured values (medians, min, max)."""

    keys: RunKeys
    cell: CellRow


def report_rows(views: Iterable[Any]) -> list[ReportRow]:
    """The long format of `views` (RunViews): one row per run and input size, runs in the given order, cells by
    input size. A run without cells (a profile-only run) gives no row."""
    out = []
    for view in views:
        keys = run_keys(view)
        out += [ReportRow(keys=keys, cell=view.cells[s]) for s in sorted(view.cells)]
    return out


# ---- the column list ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class RowColumn:
    """One column of the long format: a run key (`get` reads it from the row's keys) or a sweep-cell column
    (`cell`, printed exactly as `bench.runs.columns` prints it). `key` names it in CSV and JSON Lines and in
    `--where`-style selections; `header` in the tables; `align` "right" for numbers, "left" for text."""

    key: str
    header: str
    align: str = "left"
    get: Callable[[RunKeys], Any] | None = None
    cell: Column | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        """The CSV / JSON field names: a spread cell column writes its median, min and max."""
        return self.cell.csv_fields if self.cell is not None else (self.key,)

    def values(self, row: ReportRow) -> tuple[Any, ...]:
        """The raw values of `fields` (numbers unrounded, None for null)."""
        if self.cell is not None:
            return tuple(getattr(row.cell, f) for f in self.cell.csv_fields)
        return (self.get(row.keys),)  # type: ignore[misc]

    def text(self, row: ReportRow) -> str:
        """The printed value: a cell column as its `Column.text`, a key as text ("—" for null)."""
        return self.cell.text(row.cell) if self.cell is not None else self.key_text(row.keys)

    def key_text(self, keys: RunKeys) -> str:
        """A key column's text of a run's keys ("—" for null; integers with thousands separators)."""
        value = self.get(keys)  # type: ignore[misc]
        return DASH if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _key(key: str, header: str, align: str = "left") -> RowColumn:
    return RowColumn(key=key, header=header, align=align, get=lambda k: getattr(k, key))


KEY_COLUMNS: tuple[RowColumn, ...] = (
    _key("run", "run"), _key("device", "device"), _key("host", "host"), _key("checkpoint_id", "checkpoint"),
    _key("checkpoint_hash", "checkpoint hash"), _key("weight_bytes", "weight bytes", "right"),
    _key("quantization", "quant"), _key("weight_dtype", "weights"), _key("compute_dtype", "compute"),
    _key("kv_cache_dtype", "kv cache"), _key("batch", "batch", "right"), _key("concurrency", "concurrency", "right"),
    _key("max_new_tokens", "new tokens", "right"), _key("build_id", "build"), _key("date", "date"),
    _key("provenance", "provenance"), _key("method", "method"), _key("run_status", "run status"),
    _key("backend", "backend"),
)  # fmt: skip
"""The run's identity keys, in table order."""
CELL_ROW_COLUMNS: tuple[RowColumn, ...] = tuple(
    RowColumn(key=c.key, header=c.header, align=c.align, cell=c) for c in (*CELL_COLUMNS, *COMPLETENESS_COLUMNS)
)
"""The sweep cell's columns (bench/runs/columns.py), applied to a row's cell, then its completeness fields
(`partial`, `repeats`, `repeats_planned`, `stopped_by`), so no program reads a partial cell as complete."""
DEVICE_ROW_COLUMNS: tuple[RowColumn, ...] = tuple(
    RowColumn(key=c.key, header=c.header, align=c.align, cell=c)
    for c in (*DEVICE_LOOP_COLUMNS, *ROOFLINE_COLUMNS, *EXPERT_COLUMNS)
)
"""The optional cell columns (bench/runs/columns.py): the device decode loop's (`DEVICE_LOOP_COLUMNS`), the
rooflines (`ROOFLINE_COLUMNS`) and a model with experts' experts read (`EXPERT_COLUMNS`), where a row has them."""
ROW_COLUMNS: tuple[RowColumn, ...] = KEY_COLUMNS + CELL_ROW_COLUMNS
"""Every column of the long format that every row has: what rows.csv and rows.jsonl hold (then the device-loop
columns where a row has them: `row_columns`)."""
BY_KEY = {c.key: c for c in ROW_COLUMNS + DEVICE_ROW_COLUMNS}


def row_columns(rows: Sequence[ReportRow]) -> tuple[RowColumn, ...]:
    """`ROW_COLUMNS`, then the optional columns (`DEVICE_ROW_COLUMNS`: device loop, rooflines) some row of `rows`
    has a value of: the long format of runs without them is what it always was."""
    shown = present(DEVICE_LOOP_COLUMNS + ROOFLINE_COLUMNS + EXPERT_COLUMNS, [r.cell for r in rows])
    return ROW_COLUMNS + tuple(c for c in DEVICE_ROW_COLUMNS if c.cell in shown)


def columns(*keys: str) -> tuple[RowColumn, ...]:
    """The columns named `keys` (their `key`), in that order. KeyError for a name not in `ROW_COLUMNS` or
    `DEVICE_ROW_COLUMNS`."""
    return tuple(BY_KEY[k] for k in keys)


SUMMARY_COLUMNS = columns("device", "host", "date", "build_id", "input_tokens", "gauge_tok_s_median",
                          "e2e_tok_s_median", "ttft_ms_median", "valid")  # fmt: skip
"""The long table a person reads (the markdown printed by `bench report --format md`): 9 columns, the host, date
and build of each row named, since its rows come from every run shown."""


# ---- printers ----------------------------------------------------------------------------------------------------
def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows_markdown(cols: Sequence[RowColumn], rows: Iterable[ReportRow]) -> str:
    """A markdown table of `rows`, one line per row, the columns' headers and texts ("|" escaped)."""
    lines = ["| " + " | ".join(c.header for c in cols) + " |", "|" + "".join("---:|" if c.align == "right" else
                                                                            "---|" for c in cols)]  # fmt: skip
    lines += ["| " + " | ".join(_escape(c.text(r)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def rows_csv(cols: Sequence[RowColumn], rows: Iterable[ReportRow]) -> str:
    """CSV text: a header of every column's `fields`, then per row the raw values (numbers unrounded; empty for
    null)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([f for c in cols for f in c.fields])
    for r in rows:
        writer.writerow(["" if v is None else v for c in cols for v in c.values(r)])
    return buf.getvalue()


def rows_jsonl(cols: Sequence[RowColumn], rows: Iterable[ReportRow]) -> str:
    """JSON Lines: one object per row, {field: raw value} over every column's `fields` (null for null)."""
    out = []
    for r in rows:
        obj = {f: v for c in cols for f, v in zip(c.fields, c.values(r))}
        out.append(json.dumps(obj, ensure_ascii=False))
    return "".join(line + "\n" for line in out)


def rows_plain(cols: Sequence[RowColumn], rows: Iterable[ReportRow]) -> list[str]:
    """A plain-text table (the terminal's): each column as wide as its widest entry, aligned as it says, two spaces
    between columns, no trailing spaces."""
    lines = [[c.header for c in cols], *([c.text(r) for c in cols] for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(cols))]
    return [
        "  ".join(t.rjust(w) if c.align == "right" else t.ljust(w) for c, t, w in zip(cols, line, widths)).rstrip()
        for line in lines
    ]
