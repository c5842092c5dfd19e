"""`bench report`: archived run folders -> report.md, PNG plots and CSV tables. Reads run folders only.

No jax and no `model/` here (architecture.md, wall 2): a report is fast and works from archived runs.

Inputs: complete run folders (schema version 1). Named folders that are incomplete, of an unknown schema version
or corrupt are refused (RunFolderError); when no folder is named, every folder of the runs directory is tried and
the bad ones are skipped with a warning naming the folder and the reason (`Report.skipped`).

Outputs in `out_dir`: `report.md`; `environment.csv` (one column per run), `sweep.csv` (one row per input size,
per run `<run>:<field>` columns), `profile.csv` (one row per metric, one column per run with a profile);
`sweep_tok_s.png` (gauge and end-to-end tok/s vs input tokens, one line per run) and `profile_categories.png`
(device-time categories stacked per run). Published figures are labelled "(published)" everywhere; a null is "—".

profile.json keys read: see bench/report/tables.py, which holds the loading and the tables; this module holds the
findings and writes the report. Its tables and formats are re-exported here: import them from `bench.report`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from bench.errors import InputError, RunFolderError
from bench.profile.roofline import roofline_share_pct
from bench.report.compare import (
    describe_differences,
    manifest_differences,
    single_variable,
)
from bench.report.plots import plot_profile, plot_sweep
from bench.report.rows import ROW_COLUMNS, ReportRow, report_rows, rows_csv, rows_jsonl
from bench.report.tables import (
    DASH,
    RunView,
    assign_labels,
    environment_table,
    fmt_num,
    fmt_pct,
    load_runs,
    md_table,
    profile_table,
    run_view,
    sweep_report_table,
    write_csv,
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
        parts = []
        for metric, name in (("gauge", "decode gauge"), ("e2e", "end-to-end")):
            b, c = dict(_points(base, metric)), dict(_points(v, metric))
            common = sorted(set(b) & set(c))
            if not common:
                continue
            ratios = [c[s] / b[s] for s in common]
            each = ", ".join(f"{r:.2f}x at {s:,}" for r, s in zip(ratios, common))
            parts.append(f"{name} {each} (median {statistics.median(ratios):.2f}x)")
        quoted = v.other_published.get(f"speedup_{_slug(v)}_over_{_slug(base)}_decode") if v.published else None
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
    """What `build_report` wrote: the markdown, every file, the runs used, the baseline, skipped folders, findings."""

    out_dir: Path
    markdown: Path
    files: list[Path]
    runs: list[str]
    baseline: str | None
    skipped: list[tuple[str, str]]
    findings: list[str]
    rows: list[ReportRow] = dataclasses.field(default_factory=list)


def _pick_baseline(views: list[RunView], baseline: str | Path | None, runs_dir: str | Path) -> RunView:
    if baseline is None:  # default: the slowest run by median decode gauge, so speedups read as >= 1
        rated = [v for v in views if _median_gauge(v) is not None]
        return min(rated, key=_median_gauge) if rated else views[0]  # type: ignore[arg-type, return-value]
    path = resolve_run(baseline, runs_dir)
    for v in views:
        if v.run.path.resolve() == path.resolve():
            return v
    views[:] = assign_labels([run_view(path), *views])  # the baseline first, every label made again
    return views[0]


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

    rows = report_rows(views)
    (out / "rows.csv").write_text(rows_csv(ROW_COLUMNS, rows), encoding="utf-8")
    (out / "rows.jsonl").write_text(rows_jsonl(ROW_COLUMNS, rows), encoding="utf-8")
    files = [out / "rows.csv", out / "rows.jsonl"]
    env_header, env_raw, env_text = environment_table(views)
    write_csv(out / "environment.csv", env_header[:1] + [v.name for v in views], env_raw)
    sw_csv_h, sw_csv, sw_md_h, sw_md, sw_notes = sweep_report_table(views)
    write_csv(out / "sweep.csv", sw_csv_h, sw_csv)
    pr_csv_h, pr_csv, pr_md_h, pr_md = profile_table(views)
    write_csv(out / "profile.csv", pr_csv_h, pr_csv)
    sweep_png = plot_sweep([(v.label, v.published, list(v.cells.values())) for v in views], out / "sweep_tok_s.png")
    files += [out / "environment.csv", out / "sweep.csv", out / "profile.csv", sweep_png]
    prof_png = plot_profile(
        [(v.label, v.figures["categories"]) for v in views if v.figures is not None],
        out / "profile_categories.png",
    )
    files += [prof_png] if prof_png else []

    decode, cold, comp = decode_findings(views), cold_warm_findings(views), comparison_findings(views, base)
    published = [v for v in views if v.published]
    md = ["# Benchmark report", ""]
    md.append(f"{len(views)} run(s); baseline for speedups: **{base.label}** ({base.name}). "
              "Figures from runs marked *(published)* were measured elsewhere and are quoted as published; "
              f"{DASH} means the run has no such figure.")  # fmt: skip
    md += ["", "## Environment", "", md_table(env_header, env_text), "", "## Sweep", ""]
    md.append("Median tok/s over the timed repeats; (min–max) where raw samples exist; ✗ marks an invalid cell.")
    md += ["", md_table(sw_md_h, sw_md), ""]
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
        md += [md_table(pr_md_h, pr_md), ""]
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
                  decode + cold + comp, rows)  # fmt: skip


def _roofline_method(views: list[RunView]) -> list[str]:
    """The derived byte accounting, once per distinct accounting, as markdown lines."""
    seen, lines = set(), []
    for v in views:
        terms = v.figures["derived_terms"] if v.figures else None
        key = json.dumps(terms, sort_keys=True)
        if not terms or key in seen:
            continue
        seen.add(key)
        lines += ["", f"Derived bytes per decode step ({v.label}; bench/profile/roofline.py). The reported share divides "
                  "every stored weight byte by the step time, but a step reads only one row of the input embedding "
                  "and of the per-layer-embedding table (the lm_head table is read whole); the KV cache is left out "
                  "because the profiled context length was not published. Bandwidth: the report's figures "
                  "(nominal datasheet peaks, not measurements).", ""]  # fmt: skip
        lines.append(md_table(["term", "bytes", "what"], [[t["name"], f"{t['bytes']:,}", t["note"]] for t in terms]))
    return lines
