"""The tables of `bench report` (bench/report/build.py) and what they are built from: the runs as the report sees them
(`RunView`, loaded by `load_runs` with their column labels), the percent format, and the environment, sweep and
profile tables, each as markdown text and as CSV values (numbers unrounded). The sweep table's columns, number
format (`fmt_num`) and null ("—", `DASH`) are bench/runs/columns.py's, shared with the terminal and gpu-run tables.

No jax and no `model/` here, as in bench/report/build.py.

profile.json keys read (other keys are ignored; the first alias present wins):
- `categories.<name>.pct` (%): a category listed with a null pct is one the device cannot have ("absent", as
  `bench profile` writes it); a category not listed at all shows as "—". <name> is one of dtype_conversion |
  conversion | convert; matmul_fp32 | fp32_matmul | matmul_f32 | fp32_gemv; tensor_core | tensor_cores. Every
  category with a pct goes into the stacked bars.
- `totals.device_ms` | total_device_ms | total_kernel_ms | total_kernel_time_ms (ms); `totals.distinct_kernels` |
  distinct_ops; decode tok/s from `totals.decode_tok_s` | implied_tok_s, else `roofline.tok_s`, else `totals.tok_s`;
  the profile's device-time rate from `totals.tok_s`, else 1000 / `totals.ms_per_step` (shown beside the gauge,
  under its own name: it is not a gauge).
- `roofline.bandwidth_gib_s` | measured_bandwidth_gib_s (GiB/s), or `roofline.bandwidth_gb_s` (GB/s, converted);
  `roofline.bandwidth_kind` (text: "ceiling: <figure> (<definition>)" since the ceiling; "measured (device
  copy)" when absent, as profiles recorded before it divided by the copy); `roofline.share_pct` |
  bandwidth_roofline_share_pct (%),
  `roofline.share_approx` (bool); `roofline.bytes_per_step` (bytes); `roofline.derived.share_pct`,
  `.bytes_per_step`, `.account.terms` (the derived byte accounting, bench/profile/roofline.py).
- `config.batch` (rows per profiled decode step, `bench profile --batch`; 1 when absent).
- `read_bandwidth.gib_s` (GiB/s): the fastest read-only probe measured beside the copy (`bench profile` since it
  had one; "—" when absent). Since the roofline ceiling (bench/runs/ceiling.py) the share is against
  max(this, the datasheet figure), named by `roofline.bandwidth_kind`; before it, against the copy.
- `findings` (list; `bench profile` since it had them, `bench.profile.findings`): counted in the profile table
  ("not recorded" when absent, never "none"); each is listed in the group's findings (bench/report/build.py).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.errors import InputError, RunFolderError
from bench.report.rows import backend_of, chip_name, mesh_of, quantization_label
from bench.runs import (CellRow, CheckpointFacts, LoadRow, RunFolder, Sample, cell_key, load_reported_run, resolve_run,
                        run_folders)  # fmt: skip
from bench.runs.columns import (
    BUCKET,
    CSV_COLUMNS,
    DASH,
    DEVICE_LOOP_COLUMNS,
    E2E,
    EXPERT_COLUMNS,
    GAUGE,
    INPUT_TOKENS,
    ROOFLINE_COLUMNS,
    TTFT,
    fmt_num,
    present,
)

_CATEGORY_ALIASES = {
    "dtype_conversion": ("dtype_conversion", "conversion", "convert"),
    "matmul_fp32": ("matmul_fp32", "fp32_matmul", "matmul_f32", "fp32_gemv"),
    "tensor_core": ("tensor_core", "tensor_cores"),
}
_TOTAL_ALIASES = {
    "device_ms": ("device_ms", "total_device_ms", "total_kernel_ms", "total_kernel_time_ms"),
    "distinct_kernels": ("distinct_kernels", "distinct_ops"),
    "decode_tok_s": ("decode_tok_s", "implied_tok_s"),
}


# ---- loading -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunView:
    """One run as the report sees it, every file of its folder read and parsed once (`run_view`) and then passed
    around: the folder and its manifest, its cells by input size, its raw samples (empty for published runs), its
    profile.json and the report's figures of it (`profile_figures`; None without a profile), the other published
    figures of a published run (`other_published_figures` of published-source.json; {} when none), and the short
    label of its table columns (`assign_labels`), and the load levels of a sweep under load (`load`; empty for any
    other run). An interrupted run (status "incomplete", `incomplete`) is read like a complete one: its finished
    cells are measurements, its unfinished ones invalid ("no timed repeats"). A `--batch` sweep's `cells` are its
    B = 1 cells (every view that is not about batches reads them as a sweep without --batch); `batch_cells` holds
    every cell by (input tokens, batch) ({} for a run without --batch)."""

    run: RunFolder
    cells: dict[int, CellRow]
    samples: tuple[Sample, ...]
    profile: dict[str, Any] | None
    figures: dict[str, Any] | None
    other_published: dict[str, Any]
    label: str = ""
    load: tuple[LoadRow, ...] = ()
    batch_cells: dict[tuple[int, int], CellRow] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        """The run folder's name."""
        return self.run.name

    @property
    def m(self) -> dict[str, Any]:
        """The run's parsed manifest."""
        return self.run.manifest

    @property
    def published(self) -> bool:
        """True for figures measured elsewhere and archived as published (no raw samples)."""
        return self.run.provenance == "published"

    @property
    def incomplete(self) -> bool:
        """True for an interrupted run (status "incomplete"): only some of its planned cells were measured."""
        return self.run.status == "incomplete"


def _other_published(path: Path) -> dict[str, Any]:
    """`other_published_figures` of the folder's published-source.json copy ({} when absent or unreadable)."""
    try:
        figures = json.loads(path.read_text()).get("other_published_figures", {}) if path.exists() else {}
    except (OSError, json.JSONDecodeError, AttributeError):
        return {}
    return figures if isinstance(figures, dict) else {}


def run_view(path: str | Path) -> RunView:
    """The view of the complete or incomplete run folder `path`, each of its files parsed once
    (`bench.runs.load_reported_run`). Raises RunFolderError as that does (missing, "running" or "failed", corrupt,
    unknown schema version)."""
    run, files = load_reported_run(path)
    batched = {cell_key(c): c for c in files.cells if c.batch is not None}
    return RunView(
        run=run, cells={c.input_tokens: c for c in files.cells if (c.batch or 1) == 1}, samples=tuple(files.samples),
        profile=files.profile, figures=None if files.profile is None else profile_figures(files.profile),
        other_published=_other_published(run.path / "published-source.json"), load=tuple(files.load_rows),
        batch_cells=batched,
    )  # fmt: skip


def load_runs(
    run_dirs: Sequence[str | Path] | None, runs_dir: str | Path = "runs"
) -> tuple[list[RunView], list[tuple[str, str]]]:
    """The runs to report, labelled (`assign_labels`), and the skipped folders [(folder, reason)].

    Named runs (paths, or names inside `runs_dir`) must be complete or incomplete (interrupted) and readable:
    RunFolderError otherwise. With none named, every folder of `runs_dir` is tried and bad ones ("running",
    "failed", corrupt, unknown schema version) are skipped with their reason.
    Each file of each run is read once.
    """
    views, skipped = [], []
    if run_dirs:
        for ref in run_dirs:
            views.append(run_view(resolve_run(ref, runs_dir)))
    else:
        for path in run_folders(runs_dir):
            try:
                views.append(run_view(path))
            except RunFolderError as exc:
                skipped.append((path.name, str(exc)))
    names = [v.name for v in views]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise InputError(f"run(s) named twice: {', '.join(sorted(dupes))}")
    return assign_labels(views), skipped


def _chip(view: RunView) -> str:
    return chip_name(view.m.get("device"))


def assign_labels(views: list[RunView]) -> list[RunView]:
    """The views with short column labels: the chip, made unique with the run name when two runs share a chip,
    and "(published)" after a published run's, "(incomplete)" after an interrupted run's (`RunView.incomplete`)."""
    chips = [_chip(v) for v in views]
    out = []
    for view, chip in zip(views, chips):
        label = chip if chips.count(chip) == 1 else f"{chip} {view.name}"
        label += " (published)" if view.published else ""
        label += f" {INCOMPLETE_MARK}" if view.incomplete else ""
        out.append(dataclasses.replace(view, label=label))
    return out


INCOMPLETE_MARK = "(incomplete)"
"""What follows the label of an interrupted run in every table, plot and finding of the report."""


def _finished(cell: CellRow) -> bool:
    """True when `cell` has timed repeats (of either decode loop) and did not fail."""
    return cell.status == "ok" and bool((cell.repeats or 0) or (cell.device_repeats or 0))


def completion_text(view: RunView) -> str:
    """How much of its plan a run measured: "complete" for a complete run; for an interrupted one
    "incomplete: 3 of 4 planned cells finished; not finished: 41 tokens at batch 128 (no timed repeats)", the
    plan being its manifest's input sizes times its `--batch` values (with the cells it recorded), a cell
    finished when it has timed repeats and did not fail."""
    if not view.incomplete:
        return view.run.status
    recorded = {**{cell_key(c): c for c in view.cells.values()}, **view.batch_cells}  # every cell, by (n, batch)
    w = view.run.typed_manifest.workload
    batches = w.notes.get("batches") if isinstance(w.notes.get("batches"), list) else [1]
    planned = set(recorded) | {(n, b) for n in (w.inputs or ()) for b in batches if isinstance(b, int)}
    done = sorted(k for k, c in recorded.items() if _finished(c))
    left = []
    for n, b in sorted(planned - set(done)):
        where = f"{n:,} tokens" + (f" at batch {b}" if len(batches) > 1 or b != 1 else "")
        c = recorded.get((n, b))
        why = "not started" if c is None else c.invalid_reason or c.error or c.status
        left.append(f"{where} ({why})")
    text = f"incomplete: {len(done)} of {len(planned)} planned cell(s) finished"
    return text + (f"; not finished: {', '.join(left)}" if left else "")


# ---- formatting (numbers: `fmt_num`, bench/runs/columns.py, the one null-aware number format) ------------------
def fmt_pct(x: float | None, approx: bool = False, absent: bool = False) -> str:
    """A share in %: integers as given (26%), otherwise one decimal (54.1%); "~" when approximate."""
    if absent:
        return "absent"
    if x is None:
        return DASH
    text = f"{x}%" if isinstance(x, int) else f"{x:.1f}%"
    return ("~" if approx else "") + text


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(x: Any) -> str:
        return (DASH if x is None else str(x)).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([["" if x is None else x for x in row] for row in rows])


# ---- tables ------------------------------------------------------------------------------------------------------
def _config_text(config: dict[str, Any] | None) -> str | None:
    return ", ".join(f"{k}={DASH if x is None else x}" for k, x in (config or {}).items()) or None


def _checkpoint_text(checkpoint: dict[str, Any] | None) -> str | None:
    """The checkpoint's id, with "(dummy weights)" after it for dummy weights (`CheckpointFacts.label`)."""
    if not isinstance(checkpoint, dict):
        return None
    return CheckpointFacts(id=checkpoint.get("id"), dummy=checkpoint.get("dummy")).label


def environment_table(views: list[RunView]) -> tuple[list[str], list[list[Any]], list[list[str]]]:
    """(header, raw rows, text rows): one row per fact, one column per run."""
    def g(v: RunView, *path: str) -> Any:
        x: Any = v.m
        for p in path:
            x = x.get(p) if isinstance(x, dict) else None
        return x

    def mem_mib(v: RunView) -> str | None:
        b = g(v, "device", "memory_bytes")
        return None if b is None else f"{b / 2**20:,.0f} MiB"

    def arch(v: RunView) -> str | None:
        parts = [g(v, "device", "architecture"), g(v, "device", "compute_capability")]
        return ", SM ".join(p for p in parts if p) or None

    rows_spec = [
        ("folder", lambda v: v.name),
        ("status", completion_text),
        ("provenance", lambda v: "published: " + (g(v, "provenance", "source") or "?") if v.published else "measured"),
        ("chip", lambda v: g(v, "device", "device_kind")),
        ("architecture, compute capability", arch),
        ("device memory", mem_mib),
        ("host", lambda v: g(v, "host", "description") or g(v, "host", "cpu_model")),
        ("host architecture", lambda v: g(v, "host", "arch")),
        ("host cores (logical)", lambda v: g(v, "host", "logical_cpus")),
        ("compute dtype", lambda v: g(v, "dtype_policy", "compute_dtype")),
        ("python", lambda v: g(v, "versions", "python")),
        ("jax", lambda v: g(v, "versions", "jax")),
        ("jaxlib", lambda v: g(v, "versions", "jaxlib")),
        ("build id", lambda v: g(v, "build_id")),
        ("checkpoint", lambda v: _checkpoint_text(g(v, "checkpoint"))),
        ("checkpoint hash", lambda v: g(v, "checkpoint", "content_hash")),
        ("quantization", lambda v: quantization_label(g(v, "engine_config", "quantization"),
                                                      g(v, "engine_config", "scale_dtype"))),
        ("engine backend", lambda v: backend_of(v.run.typed_manifest)),
        *([("mesh", lambda v: mesh_of(v.run.typed_manifest) or "one device")]
          if any(mesh_of(v.run.typed_manifest) for v in views) else []),  # a row only where a run has a mesh
        ("weight bytes", lambda v: g(v, "checkpoint", "weight_bytes")),
        ("configuration", lambda v: _config_text(g(v, "engine_config"))),
        ("git commit", lambda v: g(v, "git", "commit")),
        ("started", lambda v: g(v, "started_at")),
    ]
    header = ["", *(v.label for v in views)]
    raw = [[name, *(fn(v) for v in views)] for name, fn in rows_spec]
    text = [[r[0], *(f"{x:,}" if isinstance(x, int) and r[0] == "weight bytes" else x for x in r[1:])] for r in raw]
    return header, raw, text


_RATES = {"gauge": GAUGE, "e2e": E2E}


def rate_text(cell: CellRow | None, metric: str) -> str:
    """A cell's median tok/s of `metric` ("gauge" or "e2e") as its column prints it (with (min–max) where raw
    samples exist), then ✗ when the cell is invalid and ◐ when it is partial (fewer timed repeats than planned);
    "failed" for a failed cell, — for none. The marks stand in for the terminal table's "valid" column in tables
    that have none (the report, `bench compare`)."""
    if cell is None:
        return DASH
    if cell.status == "failed":
        return "failed"
    column = _RATES[metric]
    text = column.text(cell)
    if column.value(cell) is not None and not cell.valid:
        text += " ✗"
    if cell.partial:
        text += " ◐"
    return text


def sweep_report_table(
    views: list[RunView], *, extras: bool = True,
) -> tuple[list[str], list[list[Any]], list[str], list[list[str]], list[str]]:
    """(csv header, csv rows, markdown header, markdown rows, notes on invalid cells), from the cells of `views`
    and the one column list (bench/runs/columns.py).

    Markdown: per run its gauge and end-to-end columns (`rate_text`); its bucket and TTFT columns when any of its
    cells has one (and `extras`); headers are the run's label and the column's header. CSV: `input_tokens`, then per run
    `<run>:<field>` for every field of `CSV_COLUMNS` (and of the device-loop, roofline and expert columns where a run
    has them), numbers unrounded.
    """
    sizes = sorted({s for v in views for s in v.cells})
    optional = present(DEVICE_LOOP_COLUMNS + ROOFLINE_COLUMNS + EXPERT_COLUMNS,
                       [c for v in views for c in v.cells.values()])  # fmt: skip
    fields = [f for col in (*CSV_COLUMNS, *optional) for f in col.csv_fields]  # the optional ones where a run has them
    csv_header = [INPUT_TOKENS.key, *(f"{v.name}:{f}" for v in views for f in fields)]
    csv_rows = [[s, *(getattr(v.cells.get(s), f, None) for v in views for f in fields)] for s in sizes]
    md_header = [INPUT_TOKENS.header]
    extra = {}
    for v in views:
        md_header += [f"{v.label} {GAUGE.header}", f"{v.label} {E2E.header}"]
        extra[v.name] = [c for c in (BUCKET, TTFT) if extras and any(c.value(x) is not None for x in v.cells.values())]
        md_header += [f"{v.label} {c.header}" for c in extra[v.name]]
    md_rows, notes = [], []
    for s in sizes:
        row = [fmt_num(s, 0)]
        for v in views:
            cell = v.cells.get(s)
            row += [rate_text(cell, "gauge"), rate_text(cell, "e2e")] + [c.text(cell) for c in extra[v.name]]
            if cell is not None and not cell.valid:
                numbers = (cell.gauge_tok_s_median, cell.e2e_tok_s_median)
                mark = "✗" if cell.status == "failed" or numbers != (None, None) else DASH
                notes.append(f"{mark} {v.label}, {s:,} input tokens: {cell.invalid_reason or cell.error}")
            if cell is not None and cell.partial:
                notes.append(f"◐ {v.label}, {s:,} input tokens: partial, {cell.repeats} of {cell.repeats_planned} "
                             f"timed repeats ({cell.stopped_by})")  # fmt: skip
        md_rows.append(row)
    return csv_header, csv_rows, md_header, md_rows, notes


def _first(d: dict[str, Any] | None, keys: Iterable[str]) -> Any:
    for k in keys:
        if isinstance(d, dict) and k in d:
            return d[k]
    return None


def profile_figures(prof: dict[str, Any]) -> dict[str, Any]:
    """The figures the report uses from one profile.json (the module docstring lists the keys read).

    Returns a flat dict: per category its pct (%) and `<name>_absent`; device_ms (ms), distinct_kernels,
    decode_tok_s (and whether it came from the profile itself); `gauge_tok_s` (a gauge: a joined sweep's or the
    published one; None when the profile had only its own rate) and `device_rate_tok_s` (1000 / device ms per step:
    `totals.tok_s`, else from `totals.ms_per_step`; not a gauge, docs/method.md "Profiles"); `batch` (rows per profiled step: `config.batch`, 1
    when the profile records none); bandwidth_gib_s (GiB/s), bandwidth_kind, read_bandwidth_gib_s (GiB/s, None
    without a read-only probe), bytes_per_step (bytes), share_pct (%), share_approx; the derived share, bytes per
    step and accounting terms; `categories` {name: pct} of every category with a share; `findings`: how many
    findings the profile stored (`bench.profile.findings`; None for a profile from before them)."""
    cats = prof.get("categories") or {}
    out: dict[str, Any] = {}
    for key, aliases in _CATEGORY_ALIASES.items():
        cat = _first(cats, aliases)
        out[key] = cat.get("pct") if isinstance(cat, dict) else None
        out[f"{key}_absent"] = isinstance(cat, dict) and cat.get("pct") is None  # listed without a share: absent
    totals = prof.get("totals") or {}
    for key, aliases in _TOTAL_ALIASES.items():
        out[key] = _first(totals, aliases)
    roof = prof.get("roofline") or {}
    out["decode_tok_s_from_profile"] = False
    if out["decode_tok_s"] is None:  # bench profile: the gauge it used, else the profile's own 1000 / ms per step
        out["decode_tok_s"] = roof.get("tok_s") if roof.get("tok_s") is not None else totals.get("tok_s")
        out["decode_tok_s_from_profile"] = roof.get("tok_s_source") != "gauge" and out["decode_tok_s"] is not None
    bw = _first(roof, ("bandwidth_gib_s", "measured_bandwidth_gib_s"))
    if bw is None and roof.get("bandwidth_gb_s") is not None:
        bw = roof["bandwidth_gb_s"] * 1e9 / 2**30
    kind = roof.get("bandwidth_kind") or ("measured (device copy)" if bw is not None else None)
    derived = roof.get("derived") or {}
    read = prof.get("read_bandwidth")
    ms = totals.get("ms_per_step")
    device_rate = totals.get("tok_s") if totals.get("tok_s") is not None else (1000.0 / ms if ms else None)
    out.update(
        gauge_tok_s=None if out["decode_tok_s_from_profile"] else out["decode_tok_s"], device_rate_tok_s=device_rate,
        bandwidth_gib_s=bw, bandwidth_kind=kind, bytes_per_step=roof.get("bytes_per_step"),
        read_bandwidth_gib_s=read.get("gib_s") if isinstance(read, dict) else None,
        share_pct=_first(roof, ("share_pct", "bandwidth_roofline_share_pct")),
        share_approx=bool(roof.get("share_approx")),
        derived_share_pct=derived.get("share_pct"), derived_bytes_per_step=derived.get("bytes_per_step"),
        derived_terms=(derived.get("account") or {}).get("terms"),
        categories={n: c.get("pct") for n, c in cats.items() if isinstance(c, dict) and c.get("pct") is not None},
        batch=(prof.get("config") or {}).get("batch") or 1,
        findings=len(prof["findings"]) if isinstance(prof.get("findings"), list) else None,
    )  # fmt: skip
    return out


def _unit(key: str, spec: str, unit: str = "") -> Any:
    """Formatter of figure `key` with a format spec and a unit, "—" for null."""
    return lambda f: DASH if f[key] is None else f"{format(f[key], spec)}{unit}"


_PROFILE_ROWS = (  # (csv key, markdown label, text formatter of the figures)
    ("dtype_conversion_pct", "dtype conversion",
     lambda f: fmt_pct(f["dtype_conversion"], absent=f["dtype_conversion_absent"])),
    ("fp32_matmul_pct", "fp32 matrix-vector (gemv)",
     lambda f: fmt_pct(f["matmul_fp32"], absent=f["matmul_fp32_absent"])),
    ("tensor_core_pct", "tensor core", lambda f: fmt_pct(f["tensor_core"], absent=f["tensor_core_absent"])),
    ("total_kernel_time_ms", "total kernel time", _unit("device_ms", ",.1f", " ms")),
    ("distinct_kernels", "distinct kernels", _unit("distinct_kernels", ",")),
    ("decode_gauge_tok_s", "decode gauge (sweep)",
     lambda f: DASH if f["gauge_tok_s"] is None else f"{fmt_num(f['gauge_tok_s'])} tok/s"),
    ("device_time_rate_tok_s", "device-time rate (1000 / device ms per step)",
     lambda f: DASH if f["device_rate_tok_s"] is None else f"{fmt_num(f['device_rate_tok_s'])} tok/s"),
    ("bandwidth_gib_s", "bandwidth", _unit("bandwidth_gib_s", ",.3f", " GiB/s")),
    ("bandwidth_kind", "bandwidth source", lambda f: f["bandwidth_kind"] or DASH),
    ("read_bandwidth_gib_s", "fastest read-only probe",
     _unit("read_bandwidth_gib_s", ",.3f", " GiB/s")),
    ("roofline_share_pct", "bandwidth roofline share, as reported",
     lambda f: fmt_pct(f["share_pct"], f["share_approx"])),
    ("roofline_share_derived_pct", "bandwidth roofline share, derived (bytes a step reads)",
     lambda f: fmt_pct(f["derived_share_pct"])),
    ("profile_findings", "findings (bench/profile/findings.py)",
     lambda f: "not recorded" if f["findings"] is None else "none" if not f["findings"]
     else f"{f['findings']} (listed in the group's findings)"),
)  # fmt: skip
_PROFILE_RAW = {
    "dtype_conversion_pct": "dtype_conversion", "fp32_matmul_pct": "matmul_fp32", "tensor_core_pct": "tensor_core",
    "total_kernel_time_ms": "device_ms", "distinct_kernels": "distinct_kernels", "decode_gauge_tok_s": "gauge_tok_s",
    "device_time_rate_tok_s": "device_rate_tok_s",
    "bandwidth_gib_s": "bandwidth_gib_s", "bandwidth_kind": "bandwidth_kind",
    "read_bandwidth_gib_s": "read_bandwidth_gib_s", "roofline_share_pct": "share_pct",
    "roofline_share_derived_pct": "derived_share_pct", "profile_findings": "findings",
}  # fmt: skip


_OPTIONAL_PROFILE_ROWS = frozenset({"read_bandwidth_gib_s", "profile_findings", "device_time_rate_tok_s"})
"""Rows of `_PROFILE_ROWS` shown only where some profile has the figure (profiles from before the read-only probe
or the findings keep the table they had)."""


def profile_table(views: list[RunView]) -> tuple[list[str], list[list[Any]], list[str], list[list[str]]]:
    """(csv header, csv rows, markdown header, markdown rows) over the runs that have a profile.
    CSV cells hold the numbers as stored ("absent" where a category cannot occur, empty for null). An optional row
    (`_OPTIONAL_PROFILE_ROWS`: the read-only bandwidth) is left out where no profile has it, so the table of runs
    profiled before it existed is what it was."""
    with_prof = [v for v in views if v.figures is not None]
    figs: list[dict[str, Any]] = [v.figures for v in with_prof]  # type: ignore[misc]
    csv_header = ["metric", *(v.name for v in with_prof)]
    md_header = ["", *(v.label for v in with_prof)]
    csv_rows, md_rows = [], []
    for key, label, text in _PROFILE_ROWS:
        raw_key = _PROFILE_RAW[key]
        if key in _OPTIONAL_PROFILE_ROWS and all(f.get(raw_key) is None for f in figs):
            continue
        csv_rows.append([key, *("absent" if f.get(f"{raw_key}_absent") else f[raw_key] for f in figs)])
        md_rows.append([label, *(text(f) for f in figs)])
    return csv_header, csv_rows, md_header, md_rows


def load_report_table(views: list[RunView]) -> tuple[list[str], list[list[Any]], list[str], list[list[str]]]:
    """(csv header, raw rows, markdown header, markdown rows) of the load levels of `views` (sweeps under load): one
    row per run and level (input tokens, concurrency, request rate): requests completed, output tok/s, req/s, TTFT /
    ITL / TPOT / e2e median and p99 (ms), queue median (ms), valid (or why not). The CSV has one column per figure
    (16); the markdown pairs each median with its p99 in one column ("p50 / p99": 13 columns, within a screen)."""
    header = ["run", "input tokens", "concurrency", "rate req/s", "requests", "output tok/s", "req/s",
              "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "TPOT p50 ms", "e2e p50 ms", "e2e p99 ms",
              "queue p50 ms", "valid"]  # fmt: skip
    md_header = ["run", "input tokens", "concurrency", "rate req/s", "requests", "output tok/s", "req/s",
                 "TTFT ms p50 / p99", "ITL ms p50 / p99", "TPOT p50 ms", "e2e ms p50 / p99", "queue p50 ms", "valid"]  # fmt: skip
    raw, text = [], []
    for v in views:
        for r in v.load:
            values = [r.output_tok_s, r.request_s, r.ttft_ms_median, r.ttft_ms_p99, r.itl_ms_median, r.itl_ms_p99,
                      r.tpot_ms_median, r.e2e_ms_median, r.e2e_ms_p99, r.queue_ms_median]  # fmt: skip
            valid = "yes" if r.valid else f"no: {r.invalid_reason}"
            raw.append([v.name, r.input_tokens, r.concurrency, r.request_rate, r.completed, *values, r.valid])
            out, per_s, ttft, ttft99, itl, itl99, tpot, e2e, e2e99, queue = (
                fmt_num(x, 2 if i == 1 else 1) for i, x in enumerate(values))  # fmt: skip
            text.append([v.label, f"{r.input_tokens:,}", str(r.concurrency),
                         DASH if r.request_rate is None else f"{r.request_rate:g}", f"{r.completed}/{r.num_requests}",
                         out, per_s, f"{ttft} / {ttft99}", f"{itl} / {itl99}", tpot, f"{e2e} / {e2e99}", queue,
                         valid])  # fmt: skip
    return header, raw, md_header, text
