"""`bench report`: archived run folders -> report.md, PNG plots and CSV tables. Reads run folders only.

No jax and no `model/` here (architecture.md, wall 2): a report is fast and works from archived runs.

Inputs: complete and incomplete run folders (schema version 1 or 2; `bench.runs.REPORTED_STATUSES`). An
incomplete run (interrupted: a stop signal, a lost job, a budget that ran out) is reported with the cells it
finished; its unfinished cells keep their invalid reason ("no timed repeats"), its label carries "(incomplete)",
its environment table says which cells it did not finish, and the section "Incomplete runs" lists every one shown
(`Report.incomplete`). Like with like (bench/report/sessions.py): the quantization sets are compared per session
(bench/report/quantview.py), and every table whose runs differ in host, build or date carries a note naming those
keys (`name_keys`); `Report.tables` holds every table as written. Named folders that are still "running", "failed", of an unknown schema version or corrupt
are refused (RunFolderError); when no folder is named, every folder of the runs directory is tried and the bad
ones are skipped with a warning naming the folder and the reason (`Report.skipped`). A `Selection`
(bench/report/groups.py) picks the runs shown; they are compared only within their comparison groups.

Outputs in `out_dir`: `report.md` and `report.html` (one document, bench/report/document.py and page.py); the long
format `rows.csv` and `rows.jsonl` (bench/report/rows.py); `environment.csv` (one column per run), `sweep.csv` (one
row per input size, per run `<run>:<field>` columns), `profile.csv` (one row per metric, one column per run with a
profile), `load.csv` (one row per load level of a sweep under load, per run); `batches.csv` (one row per cell of
every `--batch` sweep, only when a run has them); per group `sweep_tok_s_<G>.png`, `batch_<G>.png` /
`concurrency_<G>.png` where those axes exist (runs of another batch or concurrency), `batches_<G>.png` (throughput
and step time against batch of `--batch` sweeps, the knee marked), `load_<G>.png` (throughput against latency per
concurrency level, one line per run and input size, where a run of the group was measured under load),
`history_<G>.png` and `profile_categories_<G>.png`. Published figures are labelled "(published)"; a null is "—".

profile.json keys read: see bench/report/tables.py, which holds the loading and the tables; this module holds the
findings and writes the report. Its tables and formats are re-exported here: import them from `bench.report`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.errors import InputError, RunFolderError
from bench.profile.findings import rules_text, share_findings, stored_findings
from bench.profile.roofline import roofline_share_pct
from bench.report.ab import ab_sections, split_ab_views
from bench.report.compare import (
    describe_differences,
    manifest_differences,
    single_variable,
)
from bench.report.document import Bullets, Plot, Section, to_markdown
from bench.report.groups import Group, Selection, group_runs, nearest_splits, select_runs
from bench.report.page import render_page
from bench.report.quantview import quant_session_blocks
from bench.report.plots import plot_axis, plot_batches, plot_history, plot_load, plot_profile, plot_sweep
from bench.report.rows import ReportRow, RunKeys, report_rows, row_columns, rows_csv, rows_jsonl, run_keys
from bench.report.sessions import key_note
from bench.report.tables import (
    DASH,
    RunView,
    assign_labels,
    completion_text,
    environment_table,
    fmt_num,
    fmt_pct,
    load_report_table,
    load_runs,
    profile_table,
    run_view,
    sweep_report_table,
    write_csv,
)
from bench.report.views import (
    MAX_HISTORY_ROWS,
    Table,
    axis_series,
    axis_tables,
    batch_profile_table,
    batch_tables,
    decode_loop_tables,
    device_tables,
    device_views,
    history_series,
    history_tables,
    roofline_tables,
    runs_table,
)
from bench.runs import resolve_run


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
    from bench.runs.environment import device_slug  # light module: no jax at import

    return device_slug((view.m.get("device") or {}).get("device_kind"))


def partial_mark(drawn: list[tuple[RunView, Any]]) -> str:
    """The mark a finding carries when it draws on partial cells (fewer timed repeats than planned): " ◐ (partial
    cells: LABEL at N input tokens, k of M repeats, why; ...)", or "" when every cell in `drawn` ((view, CellRow)
    pairs) is complete."""
    parts = [f"{v.label} at {c.input_tokens:,} input tokens, {c.repeats} of {c.repeats_planned} repeats, {c.stopped_by}"
             for v, c in drawn if c.partial]  # fmt: skip
    return f" ◐ (partial cells: {'; '.join(parts)})" if parts else ""


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
        published = next((x for k, x in (v.other_published.get("decode_flatness") or {}).items()
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
        out.append(text + partial_mark([(v, v.cells[s]) for s in sizes]))
    return out


def roofline_findings_of(views: list[RunView]) -> list[str]:
    """Per run, each roofline share above 100% of the run's ceiling (`bench.runs.columns.roofline_findings` with
    `bench.runs.ceiling.ceiling_of`: the copy, for a run recorded before the ceiling, which the finding says), as
    "LABEL: finding: ...", B = 1 cells then batch cells. [] when no share is above 100."""
    from bench.runs.ceiling import ceiling_of
    from bench.runs.columns import roofline_findings

    out = []
    for v in views:
        rows = [v.cells[s] for s in sorted(v.cells)] + [v.batch_cells[k] for k in sorted(v.batch_cells)]
        out += [f"{v.label}: {f.line}" for f in roofline_findings(rows, ceiling_of(v.m))]
    return out


def matmul_findings_of(views: list[RunView]) -> list[str]:
    """Per run, each prefill matmul share above 100% of the run's measured matrix-product rate (docs/method.md,
    "Rooflines"), as "LABEL: finding: ..." with the probe's numbers (the manifest's `rates.matmul`: its shape,
    dtype and GFLOP/s) and the prefill's own rate. [] when no share is above 100."""
    out = []
    for v in views:
        probe = ((v.m.get("rates") or {}).get("matmul") or {}) if isinstance(v.m.get("rates"), dict) else {}
        shape = "x".join(str(probe.get(k, "?")) for k in ("m", "n", "k"))
        rate = (f"the matrix-product probe's {probe['gflop_s']:,.1f} GFLOP/s ({shape} {probe.get('dtype', '?')}, "
                "median of its repeats)" if probe.get("gflop_s") else "the run's matrix-product rate")  # fmt: skip
        for s in sorted(v.cells):
            c = v.cells[s]
            share = c.prefill_matmul_share_pct
            if share is None or share <= 100.0:
                continue
            gflop_s = (c.prefill_flop_s or 0.0) / 1e9
            out.append(f"{v.label}: finding: prefill matmul share {share:.1f}% above 100 at cell {s}: the prefill "
                       f"computed {gflop_s:,.1f} GFLOP/s (its matrix-product FLOP / median prefill time), above "
                       f"{rate}. The probe is no ceiling for this prefill: its products ran faster than the "
                       "probe's (other shapes, or a less busy host), or the prefill counts FLOP its program skips.")
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
                out.append(f"{v.label}, {c.input_tokens:,} input tokens: " + "; ".join(parts) + "."
                           + partial_mark([(v, c)]))  # fmt: skip
        if cold:
            continue
        other = v.other_published.get(f"cold_vs_warm_first_request_{_slug(v)}") if v.published else None
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
        parts, drawn = [], []
        for metric, name in (("gauge", "decode gauge"), ("e2e", "end-to-end")):
            b, c = dict(_points(base, metric)), dict(_points(v, metric))
            common = sorted(set(b) & set(c))
            if not common:
                continue
            drawn += [(x, x.cells[s]) for s in common for x in (base, v) if (x, x.cells[s]) not in drawn]
            ratios = [c[s] / b[s] for s in common]
            each = ", ".join(f"{r:.2f}x at {s:,}" for r, s in zip(ratios, common))
            parts.append(f"{name} {each} (median {statistics.median(ratios):.2f}x)")
        quoted = v.other_published.get(f"speedup_{_slug(v)}_over_{_slug(base)}_decode") if v.published else None
        if parts:
            note = key_note([run_keys(base), run_keys(v)], "speedup")
            parts += [note.removesuffix(".")] if note else []
            text = f"Speedup of {v.label} over {base.label}: " + "; ".join(parts)
            out.append(text + (f"; the source quotes {quoted}x for decode." if quoted is not None else ".")
                       + partial_mark(drawn))  # fmt: skip
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
        f = v.figures
        if f is None or f["derived_share_pct"] is None:
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
    """What `build_report` wrote: the markdown, every file, the runs used, the baseline, skipped folders, findings,
    the long-format rows, and the incomplete runs shown [(name, `completion_text`)]."""

    out_dir: Path
    markdown: Path
    files: list[Path]
    runs: list[str]
    baseline: str | None
    skipped: list[tuple[str, str]]
    findings: list[str]
    rows: list[ReportRow] = dataclasses.field(default_factory=list)
    incomplete: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    tables: list[Table] = dataclasses.field(default_factory=list)
    """Every table of the document, as written (each with its `sources` and the key note `name_keys` added)."""


def _slowest(views: list[RunView]) -> RunView:
    """The run with the lowest median decode gauge (so speedups read as >= 1), else the first."""
    rated = [v for v in views if _median_gauge(v) is not None]
    return min(rated, key=_median_gauge) if rated else views[0]  # type: ignore[arg-type, return-value]


def _named_baseline(loaded: list[RunView], baseline: str | Path, runs_dir: str | Path) -> RunView:
    """The run named by `--baseline`: one already loaded (by path), else its folder read now."""
    path = resolve_run(baseline, runs_dir)
    return next((v for v in loaded if v.run.path.resolve() == path.resolve()), None) or run_view(path)


def build_report(
    run_dirs: Sequence[str | Path] | None, out_dir: str | Path, baseline: str | Path | None = None,
    *, runs_dir: str | Path = "runs", selection: Selection | None = None,
) -> Report:  # fmt: skip
    """Write the report of `run_dirs` (all complete and incomplete runs in `runs_dir` when empty) into `out_dir`.

    `selection` (bench/report/groups.py; default: every run) picks the runs shown; they are compared only within
    their comparison groups. `baseline` (a run path or name; default per group: the run with the lowest median
    decode gauge) is what speedups and single-variable checks of its group are relative to; it is shown even when
    the selection leaves it out. Raises RunFolderError for a named run that is missing, "running" or "failed",
    corrupt or of an unknown schema version, or when nothing is left to report; InputError when `out_dir` cannot
    be written or the selection matches no run.
    """
    loaded, skipped = load_runs(run_dirs, runs_dir)
    sessions, loaded = split_ab_views(loaded)  # A/B sessions: their own section, never in a comparison group
    if not loaded:
        why = f" ({len(skipped)} skipped: " + "; ".join(f"{n}: {r}" for n, r in skipped) + ")" if skipped else ""
        raise RunFolderError(f"no complete or incomplete run folders to report in {runs_dir}{why}")
    named = _named_baseline(loaded, baseline, runs_dir) if baseline is not None else None
    keys = {v.name: run_keys(v) for v in [*loaded, *([named] if named else [])]}
    selected, pool = select_runs(loaded, keys, selection or Selection())
    if named is not None and named.name not in {v.name for v in selected}:
        selected = [named, *selected]
    groups = _labelled_groups(selected, pool, keys)
    bases = {g.gid: next((v for v in g.views if named is not None and v.name == named.name), None) or _slowest(g.views)
             for g in groups}  # fmt: skip
    views = [v for g in groups for v in sorted(g.views, key=lambda v: v is not bases[g.gid])]
    out = _out_dir(out_dir)
    rows, files = _write_data_files(out, views)
    sections = [_groups_section(groups), *_quant_section(groups)]
    findings: list[str] = []
    for g in groups:
        section, plots, found = group_section(g, bases[g.gid], out)
        sections.append(section)
        files += plots
        findings += found
    incomplete = [(v.name, completion_text(v)) for v in views if v.incomplete]
    if incomplete:
        sections.append(_incomplete_section(incomplete))
    sections += ab_sections(sessions)
    if skipped:
        sections.append(Section(title="Skipped folders", anchor="skipped", blocks=[Bullets(items=[f"{n}: {r}" for n, r in skipped])]))
    tables = name_keys(sections, groups[0].keys)
    intro = [
        f"{len(views)} run(s) in {len(groups)} comparison group(s); selection: {(selection or Selection()).describe()}"
        f" ({len(pool)} of {len(loaded)} run(s) passed its filters). Runs are compared only within a group "
        f"(same method, checkpoint, quantization, dtypes and tokens per request). Figures from runs marked "
        f"*(published)* were measured elsewhere and are quoted as published; {DASH} means the run has no such figure."
        + (f" {len(incomplete)} run(s) marked *(incomplete)* were interrupted: their finished cells are shown, the "
           "rest are invalid (see the section Incomplete runs)." if incomplete else ""),
        "Baselines for speedups: " + "; ".join(f"{g.gid} **{bases[g.gid].label}** ({bases[g.gid].name})"
                                               for g in groups) + ".",
    ]  # fmt: skip
    (out / "report.md").write_text(to_markdown("Benchmark report", intro, sections), encoding="utf-8")
    (out / "report.html").write_text(render_page("Benchmark report", intro, sections, out), encoding="utf-8")
    files.insert(0, out / "report.html")
    base = named or bases[groups[0].gid]
    return Report(out, out / "report.md", [out / "report.md", *files], [v.name for v in views], base.name, skipped,
                  findings, rows, incomplete, tables)  # fmt: skip


def _incomplete_section(incomplete: list[tuple[str, str]]) -> Section:
    """The list of the interrupted runs shown [(name, `completion_text`)]: which cells each did not finish."""
    intro = ("These runs were interrupted (status \"incomplete\"). The cells they finished are valid measurements "
             "and are shown with the rest; the cells they did not finish are marked invalid where they were "
             "recorded. `bench compare` still refuses them.")  # fmt: skip
    return Section(title="Incomplete runs", anchor="incomplete",
                   blocks=[intro, Bullets(items=[f"{n}: {text}" for n, text in incomplete])])


def _labelled_groups(selected: list[RunView], pool: list[RunView], keys: dict[str, Any]) -> list[Group]:
    """The comparison groups of `selected`, each view labelled uniquely within its group (the chip, with the run
    name where chips repeat), every group's `keys` carrying those labels."""
    groups = group_runs(selected, pool, keys)
    labelled = {}
    for g in groups:
        labelled.update({v.name: v for v in assign_labels(g.views)})
    keys = {n: dataclasses.replace(k, label=labelled[n].label if n in labelled else k.label) for n, k in keys.items()}
    return [dataclasses.replace(g, views=[labelled[v.name] for v in g.views], keys=keys) for g in groups]


def _out_dir(out_dir: str | Path) -> Path:
    """`out_dir`, created. InputError when it cannot be."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write the report to {out} ({exc.strerror or exc}); pass --out DIR") from None
    return out


def _write_data_files(out: Path, views: list[RunView]) -> tuple[list[ReportRow], list[Path]]:
    """Write the machine-readable files (rows.csv, rows.jsonl, environment.csv, sweep.csv, profile.csv) of
    `views` into `out`; returns (the long-format rows, the files written)."""
    rows = report_rows(views)
    (out / "rows.csv").write_text(rows_csv(row_columns(rows), rows), encoding="utf-8")
    (out / "rows.jsonl").write_text(rows_jsonl(row_columns(rows), rows), encoding="utf-8")
    env_header, env_raw, _ = environment_table(views)
    write_csv(out / "environment.csv", env_header[:1] + [v.name for v in views], env_raw)
    sw_csv_h, sw_csv, *_ = sweep_report_table(views)
    write_csv(out / "sweep.csv", sw_csv_h, sw_csv)
    pr_csv_h, pr_csv, *_ = profile_table(views)
    write_csv(out / "profile.csv", pr_csv_h, pr_csv)
    load_h, load_raw, *_ = load_report_table(views)
    write_csv(out / "load.csv", load_h, load_raw)
    names = ["rows.csv", "rows.jsonl", "environment.csv", "sweep.csv", "profile.csv", "load.csv"]
    if any(v.batch_cells for v in views):
        batch_h, batch_rows = batches_csv(views)
        write_csv(out / "batches.csv", batch_h, batch_rows)
        names.append("batches.csv")
    return rows, [out / n for n in names]


def batches_csv(views: list[RunView]) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of batches.csv: one row per cell of every `--batch` sweep of `views` (run, input tokens,
    batch, then every `BATCH_CSV_FIELDS` field as stored, numbers unrounded)."""
    header = ["run", "input_tokens", "batch", *BATCH_CSV_FIELDS]
    rows = [[v.name, n, b, *(getattr(c, f) for f in BATCH_CSV_FIELDS)]
            for v in views for (n, b), c in sorted(v.batch_cells.items())]  # fmt: skip
    return header, rows


BATCH_CSV_FIELDS = ("gauge_tok_s_median", "gauge_tok_s_min", "gauge_tok_s_max", "aggregate_tok_s_median",
                    "aggregate_tok_s_min", "aggregate_tok_s_max", "ttft_ms_median", "step_ms_median", "step_ms_p99",
                    "bytes_per_step", "roofline_share_pct", "flops_per_step", "arithmetic_intensity", "rows_differ",
                    "device_gauge_tok_s_median", "valid", "invalid_reason", "status", "partial",
                    "experts_per_layer_median", "experts_read_median", "expert_routing")  # fmt: skip
"""The `CellRow` fields of batches.csv after run, input tokens and batch."""


def _groups_section(groups: list[Group]) -> Section:
    """The groups overview: one line per group, and which key splits each from its nearest group."""
    header = ["group", "runs", "method", "devices", "checkpoint", "quant", "dtypes", "new tokens", "batch", "concurrency", "dates"]
    rows = []
    for g in groups:
        k = dict(g.key)
        dates = sorted(d for d in (g.keys[v.name].date for v in g.pool) if d)
        span = DASH if not dates else dates[0] if dates[0] == dates[-1] else f"{dates[0]}..{dates[-1]}"
        ckpt = str(k["checkpoint"] or DASH)
        rows.append([g.gid + (" (published)" if g.published else ""), f"{len(g.views)} of {len(g.pool)}", k["method"],
                     ", ".join(g.axis_values("device")), ckpt[:16] + ("…" if len(ckpt) > 16 else ""),
                     k["quantization"], k["dtypes"], fmt_num(k["new tokens"], 0),
                     ", ".join(map(str, sorted({b for v in g.views for b in g.keys[v.name].rows_per_step}))),
                     ", ".join(map(str, g.axis_values("concurrency"))),
                     span])  # fmt: skip
    splits = [f"{g.gid} is split from {h.gid} by {'; '.join(diff)}." for g, h, diff in nearest_splits(groups)]
    table = Table(title="", header=header, rows=rows, kind="groups",
                  notes=["runs: shown of those that passed the selection's filters (the history view uses all)."])
    return Section(title="Comparison groups", anchor="groups", blocks=[table, *([Bullets(items=splits)] if splits else [])])


def _quant_section(groups: list[Group]) -> list[Section]:
    """The quantization sets of each session side by side (bench/report/quantview.py), one sub-section per session
    with two or more sets; [] when there is none."""
    found = quant_session_blocks(groups)
    if not found:
        return []
    intro = ("The quantization sets (`--quant`) of one session side by side: runs of one device, host and build "
             "(dense build id) started at most 2 hours apart (docs/method.md, \"Comparisons\"), so a ratio is the "
             "quantization's, not another host's or build's. Each set is its own comparison group below.")  # fmt: skip
    subs = [Section(title=title, level=3, anchor=f"quant-{i}", blocks=blocks) for i, (title, blocks) in enumerate(found, 1)]
    return [Section(title="Quantization by session", anchor="quant", blocks=[intro, *subs])]


def name_keys(sections: list[Section], keys: dict[str, RunKeys]) -> list[Table]:
    """Every table of `sections` (walked in order, sub-sections included), each table whose `sources` differ in
    host, build or date given the key note that says so and why they still stand side by side
    (`bench.report.sessions.key_note`), in place. Returns the tables."""
    out = []
    for section in sections:
        for i, block in enumerate(section.blocks):
            if isinstance(block, Section):
                out += name_keys([block], keys)
            elif isinstance(block, Table):
                note = key_note([keys[n] for n in block.sources if n in keys], block.kind)
                if note is not None and note not in block.notes:
                    block = section.blocks[i] = dataclasses.replace(block, notes=[*block.notes, note])
                out.append(block)
    return out


def _chunks(views: list[RunView], n: int) -> list[list[RunView]]:
    return [views[i:i + n] for i in range(0, len(views), n)]


def group_section(group: Group, base: RunView, out: Path) -> tuple[Section, list[Path], list[str]]:
    """The section of one group: its views (bench/report/views.py) and plots, environment, profile and findings.
    Returns (section, plot files written, findings)."""
    gid = group.gid
    dev = assign_labels(sorted(device_views(group), key=lambda v: v is not base))  # one run per device: the chip
    blocks: list[Any] = [f"{len(group.views)} run(s) on {', '.join(group.axis_values('device'))}. Median tok/s over "
                         "the timed repeats; (min–max) where raw samples exist; ✗ marks an invalid cell."]  # fmt: skip
    sweep_blocks, files = _sweep_blocks(group, dev, out)
    blocks += sweep_blocks
    if not sweep_blocks and not any(v.load for v in group.views) and not any(v.batch_cells for v in dev):
        blocks.append("No sweep cells in this group (profile-only runs).")
    batch_views = assign_labels(sorted((v for v in group.views if v.batch_cells), key=lambda v: v is not base))
    for more_blocks, more_files in (_batch_blocks(batch_views, out, gid), _load_blocks(group, base, out)):
        blocks += more_blocks
        files += more_files
    blocks.append(runs_table(group))
    for more_blocks, more_files in (_axis_blocks(group, out), _history_blocks(group, out)):
        blocks += more_blocks
        files += more_files
    findings, found = _group_findings(group, base, dev)
    shown = {v.name for v in dev}  # and the --batch sweeps of the batch tables, which device_views may leave out
    env_blocks = [_environment_block(chunk) for chunk in
                  _chunks(assign_labels(dev + [v for v in batch_views if v.name not in shown]), 6)]  # fmt: skip
    section = Section(title=f"{gid}: {group.title()}", anchor=gid, blocks=blocks)
    subs = [Section(title=f"{gid} findings", level=3, anchor=f"{gid}-findings", blocks=findings),
            Section(title=f"{gid} environment", level=3, anchor=f"{gid}-environment", blocks=env_blocks)]
    prof, prof_files = _profile_blocks(group, sorted(group.views, key=lambda v: v is not base), out)
    if prof:
        subs.append(Section(title=f"{gid} profile", level=3, anchor=f"{gid}-profile", blocks=prof))
    section.blocks.extend(subs)
    return section, files + prof_files, found


def _environment_block(views: list[RunView]) -> Table:
    header, _, text = environment_table(views)
    return Table(title="", header=header, rows=text, kind="environment", sources=tuple(v.name for v in views))


def _sweep_blocks(group: Group, dev: list[RunView], out: Path) -> tuple[list[Any], list[Path]]:
    """The device-by-device, decode-loop and roofline tables of the group's device views `dev` and their
    tok/s-vs-input-tokens plot (each line's host named when the lines' hosts differ); ([], []) without cells."""
    if not any(v.cells for v in dev):
        return [], []
    blocks = [*device_tables(group, dev), *decode_loop_tables(dev), *roofline_tables(dev),
              *_published_notes([v for v in dev if v.published])]  # fmt: skip
    hosts = {group.keys[v.name].host for v in dev}

    def label(v: RunView) -> str:
        return v.label + (f" ({group.keys[v.name].host or 'host not recorded'})" if len(hosts) > 1 else "")

    png = plot_sweep([(label(v), v.published, list(v.cells.values())) for v in dev], out / f"sweep_tok_s_{group.gid}.png")
    return [*blocks, Plot(file=png.name, alt=f"{group.gid}: decode and end-to-end tok/s vs input tokens")], [png]


def _axis_blocks(group: Group, out: Path) -> tuple[list[Any], list[Path]]:
    """Per axis ("batch", "concurrency") the group's runs hold more than one value of: its tables and plot."""
    blocks: list[Any] = []
    files = []
    for axis in ("batch", "concurrency"):
        series = axis_series(group, axis)
        if not series:
            continue
        blocks += axis_tables(group, axis)
        sizes = sorted({s for runs in series.values() for s in runs[0].cells})[:3]
        lines = [(f"{device} {s:,} tokens", [(getattr(group.keys[v.name], axis), v.cells[s]) for v in runs
                                              if s in v.cells]) for device, runs in series.items() for s in sizes]  # fmt: skip
        files.append(plot_axis(lines, axis, out / f"{axis}_{group.gid}.png"))
        blocks.append(Plot(file=files[-1].name, alt=f"{group.gid}: tok/s against {axis}"))
    return blocks, files


def _history_blocks(group: Group, out: Path) -> tuple[list[Any], list[Path]]:
    """The history tables and plot of the group (`history_series`): the plot draws one line per configuration and
    host (a host's runs only; the others' dates stay on the axis), so runs of two hosts never make one line."""
    history = history_series(group)
    if not history:
        return [], []
    lines = []
    for name, runs in list(history.items())[:4]:
        s = min(runs[-1].cells) if runs[-1].cells else None
        shown = runs[-MAX_HISTORY_ROWS:]
        hosts = list(dict.fromkeys(group.keys[v.name].host for v in shown))
        for host in hosts:
            label = f"{name.split(',')[0]} {s:,} tokens" + (f", {host or 'host not recorded'}" if len(hosts) > 1 else "")
            lines.append((label, [(group.keys[v.name].date or v.name,
                                   v.cells.get(s) if group.keys[v.name].host == host else None) for v in shown]))  # fmt: skip
    png = plot_history(lines, out / f"history_{group.gid}.png")
    return [*history_tables(group), Plot(file=png.name, alt=f"{group.gid}: decode gauge over time, one line per host")], [png]


def _group_findings(group: Group, base: RunView, dev: list[RunView]) -> tuple[list[Any], list[str]]:
    """(the findings sub-section's blocks, the findings as lines) of one group: decode flatness, cold/warm, the
    comparisons against `base` and over time, the profiles' findings, and every share above 100% of its
    denominator (roofline, prefill matmul)."""
    compared = sorted(group.views, key=lambda v: v is not base)
    decode, cold = decode_findings(dev), cold_warm_findings(dev)
    comp = comparison_findings(compared, base) + history_findings(group)
    over = roofline_findings_of(dev) + matmul_findings_of(dev)
    blocks = [Bullets(items=decode or ["No run with sweep cells."]), "Cold vs warm:", Bullets(items=cold),
              f"Against the baseline ({base.label}):", Bullets(items=comp or ["Only one run."])]
    profiled = profile_findings(assign_labels(sorted((v for v in group.views if v.profile is not None),
                                                     key=lambda v: v is not base)))  # fmt: skip
    if profiled:
        blocks += [PROFILE_FINDINGS_INTRO, Bullets(items=profiled)]
    if over:  # a share above 100% of its denominator: said among the findings, not only under its table
        blocks += ["Shares above 100% of their denominator (docs/method.md, Rooflines):", Bullets(items=over)]
    quiet = [p for p in profiled if not p.endswith((NO_FINDINGS, NOT_RECORDED))]
    return blocks, decode + cold + comp + over + quiet


def _load_blocks(group: Group, base: RunView, out: Path) -> tuple[list[Any], list[Path]]:
    """The group's serving-under-load view (runs measured with `--concurrency`): the levels' table and the
    throughput-against-latency plot, one line per run and input size. ([], []) when no run of the group has one."""
    views = sorted((v for v in group.views if v.load), key=lambda v: v is not base)
    if not views:
        return [], []
    _, _, header, text = load_report_table(views)
    table = Table(title="Serving under load (per level)", header=header, rows=text, kind="load",
                  sources=tuple(v.name for v in views),
                  notes=["docs/method.md, \"Serving under load\": output tok/s = generated tokens of the level / its "
                         "wall time; TTFT, TPOT, e2e over its requests, ITL over every gap between tokens; queue "
                         "where the server reports it; valid: every request succeeded with exactly max_new_tokens."])  # fmt: skip
    lines = []
    for v in views:
        for n, rate in sorted({(r.input_tokens, r.request_rate) for r in v.load}, key=lambda k: (k[0], k[1] or 0.0)):
            label = f"{v.label} {n:,} tokens" + (f", {rate:g} req/s" if rate else "")
            lines.append((label, [r for r in v.load if (r.input_tokens, r.request_rate) == (n, rate)]))
    png = plot_load(lines, out / f"load_{group.gid}.png")
    if png is None:
        return [table], []
    return [table, Plot(file=png.name, alt=f"{group.gid}: output throughput against latency per concurrency level")], [png]
def _batch_blocks(views: list[RunView], out: Path, gid: str) -> tuple[list[Any], list[Path]]:
    """The batch tables of `views` (`bench.report.views.batch_tables`) and their plot `batches_<gid>.png`
    (`plot_batches`: per run its first three input sizes, the knee of each marked); ([], []) without batch cells."""
    from bench.measure.batches import knees

    tables = batch_tables(views)
    if not tables:
        return [], []
    series, marks = [], {}
    for v in views:
        by_size: dict[int, list[Any]] = {}
        for (n, _b), c in sorted(v.batch_cells.items()):
            by_size.setdefault(n, []).append(c)
        found = {k.input_tokens: k.batch for k in knees(v.batch_cells.values())}
        for n in sorted(by_size)[:3]:
            label = f"{v.label} {n:,} tokens"
            series.append((label, by_size[n]))
            marks[label] = found.get(n)
    png = plot_batches(series, out / f"batches_{gid}.png", marks)
    return [*tables, Plot(file=png.name, alt=f"{gid}: throughput and step time against batch size")], [png]


def _published_notes(published: list[RunView]) -> list[Any]:
    if not published:
        return []
    items = [f"Published runs ({', '.join(v.label for v in published)}) hold no raw samples: medians only, as published."]
    for d in sorted({(v.m.get("sweep") or {}).get("gauge_definition") for v in published} - {None}):
        items.append(f"Published gauge definition: \"{d}\". This harness's gauge is (generated tokens − 1) / decode "
                     "time (docs/method.md); for 64 tokens the two differ by 64/63 (1.6%) for one decode time.")
    return [Bullets(items=items)]


def _profile_blocks(group: Group, views: list[RunView], out: Path) -> tuple[list[Any], list[Path]]:
    """The profile tables (six runs per table), roofline notes and the category plot of a group's runs."""
    with_prof = [v for v in views if v.figures is not None]
    if not with_prof:
        return [], []
    blocks: list[Any] = []
    for chunk in _chunks(with_prof, 6):
        _, _, header, rows = profile_table(chunk)
        blocks.append(Table(title="", header=header, rows=rows, kind="profile", sources=tuple(v.name for v in chunk)))
    per_batch = batch_profile_table(with_prof)
    blocks += [per_batch] if per_batch is not None else []
    notes = roofline_notes(with_prof)
    blocks += [Bullets(items=notes)] if notes else []
    blocks += _roofline_method(with_prof)
    png = plot_profile([(v.label, v.figures["categories"]) for v in with_prof], out / f"profile_categories_{group.gid}.png")
    if png is None:
        return blocks, []
    return blocks + [Plot(file=png.name, alt=f"{group.gid}: device time by category")], [png]


PROFILE_FINDINGS_INTRO = f"In the profiles (bench/profile/findings.py: {rules_text()}):"
NOT_RECORDED = ": not recorded (a profile from before findings)"
NO_FINDINGS = ": none"


def profile_findings(views: list[RunView]) -> list[str]:
    """Per run with a profile.json: each finding its profile stored (`bench.profile.findings.format_finding`'s
    line, after the run's label), "<label>: none" when it stored none, "<label>: not recorded" for a profile
    written before findings existed (archived runs: no op finding is derived for them after the fact); then each
    share above 100% of its denominator the profile holds (`bench.profile.findings.share_findings`, for old
    profiles too: the share and its inputs are recorded)."""
    out = []
    for v in views:
        lines, shares = stored_findings(v.profile or {}), share_findings(v.profile or {})
        if lines is None:
            out.append(f"{v.label}{NOT_RECORDED}")
        elif not lines and not shares:
            out.append(f"{v.label}{NO_FINDINGS}")
        out += [f"{v.label}: {line}" for line in [*(lines or []), *shares]]
    return out


def history_findings(group: Group) -> list[str]:
    """Per configuration with at least two runs over time: the latest run's median gauge at the smallest input
    size against the previous run's, whether their min–max spreads overlap (inside the noise), and, where the
    configuration's runs were measured on more than one host (`RunKeys.host`), which hosts: a change between two
    hosts is not a change of the build alone."""
    out = []
    for name, runs in history_series(group).items():
        prev, last = runs[-2], runs[-1]
        common = sorted(set(prev.cells) & set(last.cells))
        pair = next(((s, prev.cells[s], last.cells[s]) for s in common
                     if prev.cells[s].gauge_tok_s_median and last.cells[s].gauge_tok_s_median), None)  # fmt: skip
        if pair is None:
            continue
        s, a, b = pair
        change = 100 * (b.gauge_tok_s_median - a.gauge_tok_s_median) / a.gauge_tok_s_median
        spreads = [(c.gauge_tok_s_min, c.gauge_tok_s_max) for c in (a, b)]
        if all(x is not None for sp in spreads for x in sp):
            overlap = spreads[0][0] <= spreads[1][1] and spreads[1][0] <= spreads[0][1]
            noise = "inside both runs' min–max spread" if overlap else "outside both runs' min–max spreads"
        else:
            noise = "no spread to compare"
        text = (f"History of {name}: {len(runs)} runs; the latest ({group.keys[last.name].date}, build "
                f"{group.keys[last.name].build_id}) decodes {fmt_num(b.gauge_tok_s_median)} tok/s at {s:,} input "
                f"tokens vs {fmt_num(a.gauge_tok_s_median)} the run before ({change:+.1f}%, {noise}).")  # fmt: skip
        out.append(text + _hosts_note(group, runs, prev, last) + partial_mark([(prev, a), (last, b)]))
    return out


def _hosts_note(group: Group, runs: list[RunView], prev: RunView, last: RunView) -> str:
    """The sentence a history finding ends with when the `runs` of its history were measured on more than one
    host (an unrecorded host counts as one): the hosts, and whether the two compared runs (`prev`, `last`) share
    one; "" when every run was measured on one host."""
    def host(v: RunView) -> str:
        return group.keys[v.name].host or "host not recorded"

    hosts = list(dict.fromkeys(host(v) for v in runs))
    if len(hosts) < 2:
        return ""
    pair = (f"the latest two on different hosts ({host(prev)}, then {host(last)}): their change is not the build's "
            "alone" if host(prev) != host(last) else f"the latest two on the same host ({host(last)})")  # fmt: skip
    return f" Its runs were measured on {len(hosts)} hosts ({'; '.join(hosts)}); {pair}."


def _roofline_method(views: list[RunView]) -> list[Any]:
    """The derived byte accounting, once per distinct accounting: a paragraph and a table per accounting."""
    seen, blocks = set(), []
    for v in views:
        terms = v.figures["derived_terms"] if v.figures else None
        key = json.dumps(terms, sort_keys=True)
        if not terms or key in seen:
            continue
        seen.add(key)
        blocks.append(f"Derived bytes per decode step ({v.label}; bench/profile/roofline.py). The reported share divides "
                      "every stored weight byte by the step time, but a step reads only one row of the input embedding "
                      "and of the per-layer-embedding table (the lm_head table is read whole); the KV cache is left out "
                      "because the profiled context length was not published. Bandwidth: the report's figures "
                      "(nominal datasheet peaks, not measurements).")  # fmt: skip
        blocks.append(Table(title="", header=["term", "bytes", "what"], kind="roofline",
                            rows=[[t["name"], f"{t['bytes']:,}", t["note"]] for t in terms]))  # fmt: skip
    return blocks
