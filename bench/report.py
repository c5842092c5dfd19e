"""`bench report`: archived run folders -> report.md, PNG plots and CSV tables. Reads run folders only.

No jax and no `model/` here (architecture.md, wall 2): a report is fast and works from archived runs.

Inputs: complete run folders (schema version 1). Named folders that are incomplete, of an unknown schema version
or corrupt are refused (RunFolderError); when no folder is named, every folder of the runs directory is tried and
the bad ones are skipped with a warning naming the folder and the reason (`Report.skipped`).

Outputs in `out_dir`: `report.md`; `environment.csv` (one column per run), `sweep.csv` (one row per input size,
per run `<run>:<field>` columns), `profile.csv` (one row per metric, one column per run with a profile);
`sweep_tok_s.png` (gauge and end-to-end tok/s vs input tokens, one line per run) and `profile_categories.png`
(device-time categories stacked per run). Published figures are labelled "(published)" everywhere; a null is "—".

profile.json keys read (other keys are ignored; the first alias present wins):
- `categories.<name>.pct` (%): a category listed with a null pct is one the device cannot have ("absent", as
  `bench profile` writes it); a category not listed at all shows as "—". <name> is one of dtype_conversion |
  conversion | convert; matmul_fp32 | fp32_matmul | matmul_f32 | fp32_gemv; tensor_core | tensor_cores. Every
  category with a pct goes into the stacked bars.
- `totals.device_ms` | total_device_ms | total_kernel_ms | total_kernel_time_ms (ms); `totals.distinct_kernels` |
  distinct_ops; decode tok/s from `totals.decode_tok_s` | implied_tok_s, else `roofline.tok_s`, else `totals.tok_s`.
- `roofline.bandwidth_gib_s` | measured_bandwidth_gib_s (GiB/s), or `roofline.bandwidth_gb_s` (GB/s, converted);
  `roofline.bandwidth_kind` (text; "measured (device copy)" when absent); `roofline.share_pct` |
  bandwidth_roofline_share_pct (%),
  `roofline.share_approx` (bool); `roofline.bytes_per_step` (bytes); `roofline.derived.share_pct`,
  `.bytes_per_step`, `.account.terms` (the derived byte accounting, bench/roofline.py).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.compare import describe_differences, manifest_differences, single_variable
from bench.errors import InputError, RunFolderError
from bench.plots import plot_profile, plot_sweep
from bench.roofline import roofline_share_pct
from bench.runs import CellRow, RunFolder, list_runs, open_complete_run, resolve_run

DASH = "—"
_VENDOR = ("NVIDIA ", "Tesla ", "GeForce ")
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
@dataclasses.dataclass
class RunView:
    """A loaded run as the report sees it: folder, cells by input size, profile, short label for tables."""

    run: RunFolder
    cells: dict[int, CellRow]
    profile: dict[str, Any] | None
    label: str = ""

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def m(self) -> dict[str, Any]:
        return self.run.manifest

    @property
    def published(self) -> bool:
        return self.run.provenance == "published"

    def other_published(self) -> dict[str, Any]:
        """`other_published_figures` of the folder's published-source.json copy, if any."""
        path = self.run.path / "published-source.json"
        try:
            return json.loads(path.read_text()).get("other_published_figures", {}) if path.exists() else {}
        except (OSError, json.JSONDecodeError, AttributeError):
            return {}


def _view(run: RunFolder) -> RunView:
    return RunView(run, {c.input_tokens: c for c in run.cells()}, run.profile())


def load_runs(
    run_dirs: Sequence[str | Path] | None, runs_dir: str | Path = "runs"
) -> tuple[list[RunView], list[tuple[str, str]]]:
    """The runs to report and the skipped folders [(folder, reason)].

    Named runs (paths, or names inside `runs_dir`) must be complete and readable: RunFolderError otherwise.
    With none named, every folder of `runs_dir` is tried and bad ones are skipped with their reason.
    """
    views, skipped = [], []
    if run_dirs:
        for ref in run_dirs:
            views.append(_view(open_complete_run(resolve_run(ref, runs_dir))))
    else:
        for summary in list_runs(runs_dir):
            try:
                views.append(_view(open_complete_run(summary.path)))
            except RunFolderError as exc:
                skipped.append((summary.name, str(exc)))
    names = [v.name for v in views]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise InputError(f"run(s) named twice: {', '.join(sorted(dupes))}")
    _assign_labels(views)
    return views, skipped


def _chip(view: RunView) -> str:
    kind = (view.m.get("device") or {}).get("device_kind") or (view.m.get("device") or {}).get("platform") or "?"
    for word in _VENDOR:
        kind = kind.replace(word, "")
    return "CPU" if kind.lower().startswith("cpu") else kind.strip()


def _assign_labels(views: list[RunView]) -> None:
    """Short column labels: the chip, made unique with the run name when two runs share a chip."""
    chips = [_chip(v) for v in views]
    for view, chip in zip(views, chips):
        label = chip if chips.count(chip) == 1 else f"{chip} {view.name}"
        view.label = label + (" (published)" if view.published else "")


# ---- formatting --------------------------------------------------------------------------------------------------
def fmt_num(x: float | None, digits: int = 2) -> str:
    """`digits` decimals with thousands separators, one trailing zero dropped: 12.90 -> 12.9, 13.00 -> 13.0."""
    if x is None:
        return DASH
    text = f"{x:,.{digits}f}"
    return text[:-1] if digits >= 2 and text.endswith("0") else text


def fmt_pct(x: float | None, approx: bool = False, absent: bool = False) -> str:
    """A share in %: integers as given (26%), otherwise one decimal (54.1%); "~" when approximate."""
    if absent:
        return "absent"
    if x is None:
        return DASH
    text = f"{x}%" if isinstance(x, int) else f"{x:.1f}%"
    return ("~" if approx else "") + text


def _md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(x: Any) -> str:
        return (DASH if x is None else str(x)).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([["" if x is None else x for x in row] for row in rows])


# ---- tables ------------------------------------------------------------------------------------------------------
def _config_text(config: dict[str, Any] | None) -> str | None:
    return ", ".join(f"{k}={DASH if x is None else x}" for k, x in (config or {}).items()) or None


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
        ("checkpoint", lambda v: g(v, "checkpoint", "id")),
        ("checkpoint hash", lambda v: g(v, "checkpoint", "content_hash")),
        ("weight bytes", lambda v: g(v, "checkpoint", "weight_bytes")),
        ("configuration", lambda v: _config_text(g(v, "engine_config"))),
        ("git commit", lambda v: g(v, "git", "commit")),
        ("started", lambda v: g(v, "started_at")),
    ]
    header = ["", *(v.label for v in views)]
    raw = [[name, *(fn(v) for v in views)] for name, fn in rows_spec]
    text = [[r[0], *(f"{x:,}" if isinstance(x, int) and r[0] == "weight bytes" else x for x in r[1:])] for r in raw]
    return header, raw, text


_SWEEP_FIELDS = (
    "gauge_tok_s_median", "gauge_tok_s_min", "gauge_tok_s_max", "e2e_tok_s_median", "e2e_tok_s_min",
    "e2e_tok_s_max", "bucket", "ttft_ms_median", "valid", "status",
)  # fmt: skip


def rate_text(cell: CellRow | None, metric: str) -> str:
    """A cell's median tok/s of `metric` ("gauge" or "e2e") with (min–max) where raw samples exist, ✗ when
    the cell is invalid, "failed" for a failed cell, — for none."""
    if cell is None:
        return DASH
    if cell.status == "failed":
        return "failed"
    median = getattr(cell, f"{metric}_tok_s_median")
    lo, hi = getattr(cell, f"{metric}_tok_s_min"), getattr(cell, f"{metric}_tok_s_max")
    text = fmt_num(median)
    if median is not None and lo is not None and hi is not None:
        text += f" ({fmt_num(lo)}–{fmt_num(hi)})"
    if median is not None and not cell.valid:
        text += " ✗"
    return text


def sweep_table(views: list[RunView]) -> tuple[list[str], list[list[Any]], list[str], list[list[str]], list[str]]:
    """(csv header, csv rows, markdown header, markdown rows, notes on invalid cells).

    Markdown: per run gauge and end-to-end tok/s, "median (min–max)" where raw samples exist, ✗ on invalid cells;
    bucket and TTFT columns for runs that have any. CSV: every field, numbers unrounded.
    """
    sizes = sorted({s for v in views for s in v.cells})
    csv_header = ["input_tokens", *(f"{v.name}:{f}" for v in views for f in _SWEEP_FIELDS)]
    csv_rows = [[s, *(getattr(v.cells.get(s), f, None) for v in views for f in _SWEEP_FIELDS)] for s in sizes]
    md_header = ["input tokens"]
    extras = {}
    for v in views:
        md_header += [f"{v.label} gauge tok/s", f"{v.label} end-to-end tok/s"]
        cells = v.cells.values()
        extras[v.name] = [f for f in ("bucket", "ttft_ms_median") if any(getattr(c, f) is not None for c in cells)]
        md_header += [f"{v.label} {'bucket' if f == 'bucket' else 'TTFT ms'}" for f in extras[v.name]]
    md_rows, notes = [], []
    for s in sizes:
        row = [f"{s:,}"]
        for v in views:
            cell = v.cells.get(s)
            row += [rate_text(cell, "gauge"), rate_text(cell, "e2e")]
            for f in extras[v.name]:
                value = getattr(cell, f, None) if cell else None
                row.append(DASH if value is None else f"{value:,}" if f == "bucket" else fmt_num(value, 1))
            if cell is not None and not cell.valid:
                numbers = (cell.gauge_tok_s_median, cell.e2e_tok_s_median)
                mark = "✗" if cell.status == "failed" or numbers != (None, None) else DASH
                notes.append(f"{mark} {v.label}, {s:,} input tokens: {cell.invalid_reason or cell.error}")
        md_rows.append(row)
    return csv_header, csv_rows, md_header, md_rows, notes


def _first(d: dict[str, Any] | None, keys: Iterable[str]) -> Any:
    for k in keys:
        if isinstance(d, dict) and k in d:
            return d[k]
    return None


def profile_figures(prof: dict[str, Any]) -> dict[str, Any]:
    """The figures the report uses from one profile.json (see the module docstring for the keys read)."""
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
    out.update(
        bandwidth_gib_s=bw, bandwidth_kind=kind, bytes_per_step=roof.get("bytes_per_step"),
        share_pct=_first(roof, ("share_pct", "bandwidth_roofline_share_pct")),
        share_approx=bool(roof.get("share_approx")),
        derived_share_pct=derived.get("share_pct"), derived_bytes_per_step=derived.get("bytes_per_step"),
        derived_terms=(derived.get("account") or {}).get("terms"),
        categories={n: c.get("pct") for n, c in cats.items() if isinstance(c, dict) and c.get("pct") is not None},
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
    ("decode_gauge_tok_s", "decode, gauge",
     lambda f: DASH if f["decode_tok_s"] is None else f"{fmt_num(f['decode_tok_s'])} tok/s"
     + (" (from profile: 1000 / device ms per step, not a gauge)" if f["decode_tok_s_from_profile"] else "")),
    ("bandwidth_gib_s", "bandwidth", _unit("bandwidth_gib_s", ",.3f", " GiB/s")),
    ("bandwidth_kind", "bandwidth source", lambda f: f["bandwidth_kind"] or DASH),
    ("roofline_share_pct", "bandwidth roofline share, as reported",
     lambda f: fmt_pct(f["share_pct"], f["share_approx"])),
    ("roofline_share_derived_pct", "bandwidth roofline share, derived (bytes a step reads)",
     lambda f: fmt_pct(f["derived_share_pct"])),
)  # fmt: skip
_PROFILE_RAW = {
    "dtype_conversion_pct": "dtype_conversion", "fp32_matmul_pct": "matmul_fp32", "tensor_core_pct": "tensor_core",
    "total_kernel_time_ms": "device_ms", "distinct_kernels": "distinct_kernels", "decode_gauge_tok_s": "decode_tok_s",
    "bandwidth_gib_s": "bandwidth_gib_s", "bandwidth_kind": "bandwidth_kind", "roofline_share_pct": "share_pct",
    "roofline_share_derived_pct": "derived_share_pct",
}  # fmt: skip


def profile_table(views: list[RunView]) -> tuple[list[str], list[list[Any]], list[str], list[list[str]]]:
    """(csv header, csv rows, markdown header, markdown rows) over the runs that have a profile.
    CSV cells hold the numbers as stored ("absent" where a category cannot occur, empty for null)."""
    with_prof = [v for v in views if v.profile is not None]
    figs = [profile_figures(v.profile) for v in with_prof]  # type: ignore[arg-type]
    csv_header = ["metric", *(v.name for v in with_prof)]
    md_header = ["", *(v.label for v in with_prof)]
    csv_rows, md_rows = [], []
    for key, label, text in _PROFILE_ROWS:
        raw_key = _PROFILE_RAW[key]
        csv_rows.append([key, *("absent" if f.get(f"{raw_key}_absent") else f[raw_key] for f in figs)])
        md_rows.append([label, *(text(f) for f in figs)])
    return csv_header, csv_rows, md_header, md_rows


# ---- findings ----------------------------------------------------------------------------------------------------
def _points(view: RunView, metric: str, sizes: set[int] | None = None) -> list[tuple[int, float]]:
    """(input tokens, median) of the valid cells that have `metric` ("gauge" or "e2e"), by input size."""
    out = []
    for s, c in sorted(view.cells.items()):
        value = getattr(c, f"{metric}_tok_s_median")
        if c.valid and value is not None and (sizes is None or s in sizes):
            out.append((s, value))
    return out


def _spread_pct(values: list[float]) -> float:
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


def _slug(view: RunView) -> str:
    from bench.environment import device_slug  # light module: no jax at import

    return device_slug((view.m.get("device") or {}).get("device_kind"))


def _median_gauge(view: RunView) -> float | None:
    pts = _points(view, "gauge")
    return statistics.median(v for _, v in pts) if pts else None


def decode_findings(views: list[RunView]) -> list[str]:
    """Decode flatness ((max - min) / median of the gauge medians, %) and the end-to-end fall, per run."""
    out = []
    for v in views:
        gauge = _points(v, "gauge")
        if len(gauge) < 2:
            out.append(f"{v.label}: fewer than two valid cells with a decode gauge; flatness not computed.")
            continue
        sizes = [s for s, _ in gauge]
        values = [x for _, x in gauge]
        text = (
            f"{v.label}: decode gauge {fmt_num(min(values))}–{fmt_num(max(values))} tok/s across "
            f"{sizes[0]:,}–{sizes[-1]:,} input tokens ({sizes[-1] / sizes[0]:.0f}x the context): "
            f"(max − min) / median = {_spread_pct(values):.1f}%"
        )
        published = next((x for k, x in (v.other_published().get("decode_flatness") or {}).items()
                          if k.startswith(_slug(v) + "_")), None)  # fmt: skip
        text += f" (the source publishes {published}%)." if published is not None and v.published else "."
        both = set(sizes) & {s for s, _ in _points(v, "e2e")}
        e2e = _points(v, "e2e", both)
        if len(e2e) >= 2:
            (s0, e0), (s1, e1) = e2e[0], e2e[-1]
            flat = _spread_pct([x for s, x in gauge if s in both])
            text += (
                f" End-to-end falls from {fmt_num(e0)} to {fmt_num(e1)} tok/s between {s0:,} and {s1:,} input tokens "
                f"({100 * (e1 - e0) / e0:+.1f}%) while the gauge moves {flat:.1f}% over the same cells"
            )
            text += ": the fall is outside steady-state decode (prefill, TTFT)." if flat < 5 else "."
        out.append(text)
    return out


def _seconds(x: float | None) -> str:
    return DASH if x is None else f"{x:.2f} s"


def cold_warm_findings(views: list[RunView]) -> list[str]:
    """Cold-vs-warm ratios per run, whole request and TTFT labelled as the different measurements they are."""
    out = []
    for v in views:
        cold = [c for c in v.cells.values() if c.cold_request_s is not None or c.cold_ttft_ms is not None]
        for c in cold:
            parts = []
            if c.cold_request_s is not None and c.cold_warm_request_ratio:
                warm_s = c.cold_request_s / c.cold_warm_request_ratio
                parts.append(f"whole request {c.cold_request_s:.2f} s cold vs {warm_s:.2f} s warm median = "
                             f"{c.cold_warm_request_ratio:.1f}x (whole-request ratio)")  # fmt: skip
            if c.cold_ttft_ms is not None and c.cold_warm_ttft_ratio and c.ttft_ms_median is not None:
                parts.append(f"TTFT {c.cold_ttft_ms:,.1f} ms cold vs {c.ttft_ms_median:,.1f} ms warm median = "
                             f"{c.cold_warm_ttft_ratio:.1f}x (TTFT ratio: a different measurement)")  # fmt: skip
            if parts:
                out.append(f"{v.label}, {c.input_tokens:,} input tokens: " + "; ".join(parts) + ".")
        if cold:
            continue
        other = v.other_published().get(f"cold_vs_warm_first_request_{_slug(v)}") if v.published else None
        if other:
            out.append(
                f"{v.label}: no cold request among this run's figures. The source reports, for run {other.get('run')} "
                f"(not archived here): {_seconds(other.get('cold_s'))} cold vs {_seconds(other.get('warm_s'))} warm, a "
                f"{other.get('ratio')}x whole-request ratio (published)."
                + (f" Source note: {other['note']}." if other.get("note") else "")
            )
        else:
            out.append(f"{v.label}: no cold request recorded.")
    return out


def comparison_findings(views: list[RunView], base: RunView) -> list[str]:
    """Speedup of each run over `base` (gauge and end-to-end median ratios per common valid cell) and whether
    each comparison is single-variable, with exactly what differs. Runs of another model (checkpoint content hash,
    else checkpoint id) get no speedup, only a line saying so."""
    out = []
    for v in views:
        if v is base:
            continue
        ckpts = [x.m.get("checkpoint") or {} for x in (base, v)]
        key = "content_hash" if all(c.get("content_hash") for c in ckpts) else "id"  # like with like
        models = [c.get(key) for c in ckpts]
        if models[0] != models[1]:
            out.append(f"{v.label} vs {base.label}: no speedup is computed, they ran different models "
                       f"({models[1]} vs {models[0]}); their tok/s are not comparable.")  # fmt: skip
            continue
        parts = []
        for metric, name in (("gauge", "decode gauge"), ("e2e", "end-to-end")):
            b, c = dict(_points(base, metric)), dict(_points(v, metric))
            common = sorted(set(b) & set(c))
            if not common:
                continue
            ratios = [c[s] / b[s] for s in common]
            each = ", ".join(f"{r:.2f}x at {s:,}" for r, s in zip(ratios, common))
            parts.append(f"{name} {each} (median {statistics.median(ratios):.2f}x)")
        quoted = v.other_published().get(f"speedup_{_slug(v)}_over_{_slug(base)}_decode") if v.published else None
        if parts:
            text = f"Speedup of {v.label} over {base.label}: " + "; ".join(parts)
            out.append(text + (f"; the source quotes {quoted}x for decode." if quoted is not None else "."))
        else:
            out.append(f"Speedup of {v.label} over {base.label}: no common valid cells.")
        same, diffs = single_variable(base.m, v.m)
        others = [d for d in manifest_differences(base.m, v.m) if not d.single_variable_key]
        if same:
            text = (f"{v.label} vs {base.label} is a single-variable comparison (same build id, checkpoint hash, "
                    "configuration and weight bytes)")  # fmt: skip
        else:
            verdict = "not a single-variable comparison" if same is False else "not established as single-variable"
            text = f"{v.label} vs {base.label} is {verdict}: " + describe_differences(diffs)
        if others:
            text += ". Other differences: " + describe_differences(others)
        out.append(text + ".")
    return out


def roofline_notes(views: list[RunView]) -> list[str]:
    """What the derived roofline share counts, and how it differs from the reported one, per run."""
    out = []
    for v in views:
        if v.profile is None:
            continue
        f = profile_figures(v.profile)
        if f["derived_share_pct"] is None:
            continue
        text = (
            f"{v.label}: reported share {fmt_pct(f['share_pct'], f['share_approx'])} counts "
            f"{f['bytes_per_step']:,} bytes per step (every stored weight byte); derived share "
            f"{fmt_pct(f['derived_share_pct'])} counts the {f['derived_bytes_per_step']:,} bytes a step reads"
        )
        if f["bytes_per_step"] and f["decode_tok_s"] and f["bandwidth_gib_s"]:
            again = roofline_share_pct(f["bytes_per_step"], f["decode_tok_s"], f["bandwidth_gib_s"])
            inputs = f"{f['bytes_per_step']:,} B x {fmt_num(f['decode_tok_s'])} tok/s"
            inputs += f" / {f['bandwidth_gib_s']:,.3f} GiB/s"
            text += f"; the reported inputs ({inputs}) give {again:.1f}% when recomputed with consistent units"
        out.append(text + ".")
    return out


# ---- the report --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Report:
    """What `build_report` wrote: the markdown, every file, the runs used, the baseline, skipped folders, findings."""

    out_dir: Path
    markdown: Path
    files: list[Path]
    runs: list[str]
    baseline: str | None
    skipped: list[tuple[str, str]]
    findings: list[str]


def _pick_baseline(views: list[RunView], baseline: str | Path | None, runs_dir: str | Path) -> RunView:
    if baseline is None:  # default: the slowest run by median decode gauge, so speedups read as >= 1
        rated = [v for v in views if _median_gauge(v) is not None]
        return min(rated, key=_median_gauge) if rated else views[0]  # type: ignore[arg-type, return-value]
    path = resolve_run(baseline, runs_dir)
    for v in views:
        if v.run.path.resolve() == path.resolve():
            return v
    view = _view(open_complete_run(path))
    views.insert(0, view)
    _assign_labels(views)
    return view


def build_report(
    run_dirs: Sequence[str | Path] | None, out_dir: str | Path, baseline: str | Path | None = None,
    *, runs_dir: str | Path = "runs",
) -> Report:  # fmt: skip
    """Write the report of `run_dirs` (all complete runs in `runs_dir` when empty) into `out_dir`.

    `baseline` (a run path or name; default: the run with the lowest median decode gauge) is what speedups and
    single-variable checks are relative to. Raises RunFolderError for a named run that is missing, incomplete,
    corrupt or of an unknown schema version, or when nothing is left to report; InputError when `out_dir`
    cannot be written.
    """
    views, skipped = load_runs(run_dirs, runs_dir)
    if not views:
        why = f" ({len(skipped)} skipped: " + "; ".join(f"{n}: {r}" for n, r in skipped) + ")" if skipped else ""
        raise RunFolderError(f"no complete run folders to report in {runs_dir}{why}")
    base = _pick_baseline(views, baseline, runs_dir)
    views.sort(key=lambda v: v is not base)  # the baseline is the first column; the others keep their order
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write the report to {out} ({exc.strerror or exc}); pass --out DIR") from None

    files = []
    env_header, env_raw, env_text = environment_table(views)
    _write_csv(out / "environment.csv", env_header[:1] + [v.name for v in views], env_raw)
    sw_csv_h, sw_csv, sw_md_h, sw_md, sw_notes = sweep_table(views)
    _write_csv(out / "sweep.csv", sw_csv_h, sw_csv)
    pr_csv_h, pr_csv, pr_md_h, pr_md = profile_table(views)
    _write_csv(out / "profile.csv", pr_csv_h, pr_csv)
    sweep_png = plot_sweep([(v.label, v.published, list(v.cells.values())) for v in views], out / "sweep_tok_s.png")
    files += [out / "environment.csv", out / "sweep.csv", out / "profile.csv", sweep_png]
    prof_png = plot_profile(
        [(v.label, profile_figures(v.profile)["categories"]) for v in views if v.profile is not None],
        out / "profile_categories.png",
    )
    files += [prof_png] if prof_png else []

    decode, cold, comp = decode_findings(views), cold_warm_findings(views), comparison_findings(views, base)
    published = [v for v in views if v.published]
    md = ["# Benchmark report", ""]
    md.append(f"{len(views)} run(s); baseline for speedups: **{base.label}** ({base.name}). "
              "Figures from runs marked *(published)* were measured elsewhere and are quoted as published; "
              f"{DASH} means the run has no such figure.")  # fmt: skip
    md += ["", "## Environment", "", _md_table(env_header, env_text), "", "## Sweep", ""]
    md.append("Median tok/s over the timed repeats; (min–max) where raw samples exist; ✗ marks an invalid cell.")
    md += ["", _md_table(sw_md_h, sw_md), ""]
    md += [f"- {n}" for n in sw_notes]
    if published:
        labels = ", ".join(v.label for v in published)
        md.append(f"- Published runs ({labels}) hold no raw samples: medians only, as published.")
        defs = {(v.m.get("sweep") or {}).get("gauge_definition") for v in published} - {None}
        for d in sorted(defs):
            md.append(f"- Published gauge definition: \"{d}\". This harness's gauge is (generated tokens − 1) / "
                      "decode time (measurement.md); for 64 tokens the two differ by 64/63 (1.6%) for one decode "
                      "time.")  # fmt: skip
    md += ["", "![tok/s vs input tokens](sweep_tok_s.png)", "", "## Profile", ""]
    if pr_md_h[1:]:
        md += [_md_table(pr_md_h, pr_md), ""]
        md += [f"- {n}" for n in roofline_notes(views)]
        md += _roofline_method(views)
        md += ["", "![device time by category](profile_categories.png)"] if prof_png else []
    else:
        md.append("No run has a profile.")
    md += ["", "## Findings", "", "### Decode flatness and end-to-end", ""] + [f"- {x}" for x in decode]
    md += ["", "### Cold vs warm", ""] + [f"- {x}" for x in cold]
    md += ["", f"### Against the baseline ({base.label})", ""] + ([f"- {x}" for x in comp] or ["- Only one run."])
    if skipped:
        md += ["", "## Skipped folders", ""] + [f"- {name}: {reason}" for name, reason in skipped]
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    return Report(out, out / "report.md", [out / "report.md", *files], [v.name for v in views], base.name, skipped,
                  decode + cold + comp)  # fmt: skip


def _roofline_method(views: list[RunView]) -> list[str]:
    """The derived byte accounting, once per distinct accounting, as markdown lines."""
    seen, lines = set(), []
    for v in views:
        terms = profile_figures(v.profile)["derived_terms"] if v.profile else None
        key = json.dumps(terms, sort_keys=True)
        if not terms or key in seen:
            continue
        seen.add(key)
        lines += ["", f"Derived bytes per decode step ({v.label}; bench/roofline.py). The reported share divides "
                  "every stored weight byte by the step time, but a step reads only one row of the input embedding "
                  "and of the per-layer-embedding table (the lm_head table is read whole); the KV cache is left out "
                  "because the profiled context length was not published. Bandwidth: the report's figures "
                  "(nominal datasheet peaks, not measurements).", ""]  # fmt: skip
        lines.append(_md_table(["term", "bytes", "what"], [[t["name"], f"{t['bytes']:,}", t["note"]] for t in terms]))
    return lines
