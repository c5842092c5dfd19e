"""Commands over archived run folders (no jax): `bench report`, `bench compare`, `bench runs list|validate`.

Exit codes: 0 success (`bench compare`: PASS); 1 `bench compare` FAIL (a threshold crossed beyond the noise), or
`bench runs validate` found problems; 3 `bench compare` UNRESOLVED (a cell's change cannot be told from the noise
at its gate); 2 a user error (missing or unreadable run, bad flag), printed as one line by `bench.cli.main`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from bench.cli.root import app
from bench.cli.common import make_console
from bench.errors import InputError

runs_app = typer.Typer(help="Archived run folders: list them, check one against the schema.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")

RUNS_HELP = "Run folders, or names in --runs-dir (default: every complete or incomplete run there)."
BASELINE_HELP = "Run that speedups and single-variable checks are relative to (default: the slowest run)."
FORMATS = ("md", "csv", "jsonl", "html")
FORMAT_HELP = ("Also print the report's rows (one per run and cell) on stdout: md (a table), csv or jsonl "
               "(every column), or html (the page); the lines naming the files then go to stderr.")
WHERE_HELP = ("Only runs whose keys match, e.g. device=l4,quant=none (keys: device, host, checkpoint, hash, quant, "
              "dtype, batch, concurrency, build, date, provenance, run, method, status; each key once).")
LATEST_HELP = ("Keep the latest run per configuration and these keys, e.g. device or device,host (default without "
               "RUNs or --all: device).")
RunsDirOpt = Annotated[Path, typer.Option("--runs-dir", help="Folder that holds the run folders.")]


def parse_percent(text: str, flag: str = "--max-slowdown") -> float:
    """"5%", "5", "2.5 %" -> 5.0, 5.0, 2.5. InputError for anything else or a negative value."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", text or "")
    if not m:
        raise InputError(f"{flag} {text!r}: expected a non-negative percentage such as 5% or 2.5")
    return float(m.group(1))


@app.command("report")
def report_cmd(
    runs: Annotated[list[str] | None, typer.Argument(help=RUNS_HELP)] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for report.md, plots, tables.")] = Path("reports/latest"),
    runs_dir: RunsDirOpt = Path("runs"),
    baseline: Annotated[str | None, typer.Option("--baseline", help=BASELINE_HELP)] = None,
    fmt: Annotated[str | None, typer.Option("--format", help=FORMAT_HELP)] = None,
    where: Annotated[str | None, typer.Option("--where", help=WHERE_HELP)] = None,
    latest_per: Annotated[str | None, typer.Option("--latest-per", help=LATEST_HELP)] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only runs started on or after DATE (YYYY-MM-DD).")] = None,
    every: Annotated[bool, typer.Option("--all", help="Every run (no --latest-per default).")] = False,
) -> None:
    """Write a report (report.md, report.html, tables, plots, findings, the long-format rows) of archived runs,
    compared only within their comparison groups. Default view: the latest run per device and configuration.
    Interrupted (incomplete) runs are reported with the cells they finished, and named on stderr."""
    from bench.report import build_report
    from bench.report.groups import Selection, parse_latest_per, parse_since, parse_where

    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if every and latest_per is not None:
        raise InputError("--all and --latest-per: expected one of them; --all shows every run")
    per = parse_latest_per(latest_per)
    if per is None and not every and not runs:
        per = ("device",)  # the default view
    selection = Selection(where=parse_where(where), since=parse_since(since), latest_per=per)
    report = build_report(runs or [], out, baseline, runs_dir=runs_dir, selection=selection)
    for name, reason in report.skipped:
        typer.echo(f"warning: skipped {name}: {reason}", err=True)
    for name, text in report.incomplete:
        typer.echo(f"note: {name} is {text} (its finished cells are reported)", err=True)
    status = fmt is not None  # rows on stdout: the lines about files go to stderr
    typer.echo(f"wrote {report.markdown} from {len(report.runs)} run(s), baseline {report.baseline}", err=status)
    for path in report.files[1:]:
        typer.echo(f"  {path}", err=status)
    if fmt is not None:
        typer.echo(print_rows(report, fmt), nl=False)


def print_rows(report, fmt: str) -> str:  # noqa: ANN001 -- a bench.report.Report
    """The report's long-format rows as `fmt` prints them on stdout: "md" the summary columns as a markdown table,
    "csv" and "jsonl" every column (numbers unrounded); "html" the report's page (report.html)."""
    from bench.report.rows import SUMMARY_COLUMNS, row_columns, rows_csv, rows_jsonl, rows_markdown

    if fmt == "html":
        return (report.out_dir / "report.html").read_text(encoding="utf-8")
    if fmt == "md":
        return rows_markdown(SUMMARY_COLUMNS, report.rows) + "\n"
    return (rows_csv if fmt == "csv" else rows_jsonl)(row_columns(report.rows), report.rows)


@app.command("compare")
def compare_cmd(
    baseline: Annotated[str, typer.Argument(help="Baseline run (folder or name in --runs-dir).")],
    candidate: Annotated[str, typer.Argument(help="Candidate run (folder or name in --runs-dir).")],
    max_slowdown: Annotated[str | None, typer.Option(
        "--max-slowdown", "--gate", help="The gate: the largest slowdown allowed, e.g. 5%. Default: 2 x the "
        "measured noise (the runs' repeats, and the A/A calibration), at least 1%; 5% when no noise is known.")] = None,
    require_same_tokens: Annotated[bool, typer.Option(help="Fail when the greedy token ids differ.")] = False,
    calibration: Annotated[str, typer.Option(
        "--calibration", help="A calibration of the host's noise between runs, which widens each cell's "
        "interval: an A/A session of `bench ab` (a run folder or name), 'auto' (the nearest usable A/A session or "
        "sweep pair of one build of the candidate's host in --runs-dir; refused ones are named with why) or "
        "'none'.")] = "auto",
    runs_dir: RunsDirOpt = Path("runs"),
) -> None:
    """Compare a candidate run with a baseline: PASS (exit 0), FAIL (exit 1: a threshold crossed beyond the noise)
    or UNRESOLVED (exit 3: a cell's interval reaches across the gate); exit 2 for bad input."""
    from bench.report.compare import compare_runs, find_calibration
    from bench.runs import open_complete_run, resolve_run

    limit = parse_percent(max_slowdown) if max_slowdown is not None else None
    base_path, cand_path = resolve_run(baseline, runs_dir), resolve_run(candidate, runs_dir)
    if calibration == "auto":  # never one that holds either compared run
        cal = find_calibration(runs_dir, open_complete_run(cand_path).manifest, (base_path.name, cand_path.name))
    else:
        cal = None if calibration == "none" else resolve_run(calibration, runs_dir, flag="--calibration")
    result = compare_runs(base_path, cand_path, limit, require_same_tokens, calibration=cal)
    console = make_console()
    if result.cells or not result.levels:
        console.print(_cells_table(result))
    if result.levels:
        console.print(_load_table(result))
    if any(cell.has_device_loop for cell in result.cells):
        console.print(_device_loop_table(result))
    if result.tokens:
        console.print(_accuracy_table(result))
    _print_verdict(console, result)
    if result.exit_code:
        raise SystemExit(result.exit_code)  # not typer.Exit: in non-standalone mode click returns its code unseen


def _cells_table(result):  # noqa: ANN001 -- a bench.report.compare.CompareResult
    """The per-cell table of `bench compare`: gauges and end-to-end rates, their deltas and intervals, the speed
    verdict and whether the greedy tokens agree."""
    from rich.table import Table

    from bench.report import rate_text

    table = Table(title=f"{result.candidate} vs {result.baseline} (baseline)")
    for col in ("input tokens", "gauge base", "gauge cand", "Δ gauge", "interval", "e2e base", "e2e cand", "Δ e2e",
                "interval ", "speed", "tokens"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("tokens", "speed") else "right")
    tokens = {t.input_tokens: t for t in result.tokens}
    for cell in result.cells:
        t = tokens.get(cell.input_tokens) if cell.batch == 1 else None
        agree = "—" if t is None else t.status if t.status != "differ" else f"differ from token {t.first_divergence}"
        if t is not None and t.note and t.status != "unknown":
            agree += f" ({t.note})"
        table.add_row(
            f"{cell.input_tokens:,}" + (f" x{cell.batch}" if cell.batch != 1 else ""), rate_text(cell.baseline, "gauge"),
            rate_text(cell.candidate, "gauge"),
            "—" if cell.gauge_delta_pct is None else f"{cell.gauge_delta_pct:+.1f}%", _interval(cell, "gauge"),
            rate_text(cell.baseline, "e2e"), rate_text(cell.candidate, "e2e"),
            "—" if cell.e2e_delta_pct is None else f"{cell.e2e_delta_pct:+.1f}%", _interval(cell, "e2e"),
            _speed_verdict(cell), agree,
        )  # fmt: skip
    return table


def _print_verdict(console, result) -> None:  # noqa: ANN001
    """`bench compare`'s closing lines: whether the comparison is single-variable, its notes, the noise, each
    failure and unresolved cell, and the verdict."""
    verdict = {True: "single-variable", False: "NOT single-variable", None: "single-variable not established"}
    variable = f" ({result.variable})" if result.variable else ""
    console.print(f"comparison: {verdict[result.single_variable]}{variable}", markup=False)
    if result.differences:
        from bench.report.compare import describe_differences

        console.print(f"  differs: {describe_differences(result.differences)}", markup=False)
    for note in result.notes:
        console.print(f"  note: {note}", markup=False)
    if result.partial:
        console.print("  ◐ partial cell: fewer timed repeats than planned; compared on the repeats it has", markup=False)
    for line in result.partial:
        console.print(f"  partial: {line}", markup=False)
    console.print(f"  noise: {result.noise.describe()}", markup=False)
    if result.noise.calibration is None:
        console.print("  note: no calibration: the intervals hold the runs' own repeats only, not the host's "
                      "drift between runs; measure one with two consecutive sweeps of one build, or `bench ab --mode "
                      "processes --a \"\" --b \"\"` (docs/commands/compare.md)", markup=False)  # fmt: skip
    for failure in result.failures:
        console.print(f"  FAIL: {failure}", markup=False)
    for line in result.unresolved:
        console.print(f"  UNRESOLVED: {line}", markup=False)
    said = result.noise.calibration_choice or "no calibration (--calibration none)"
    console.print(f"verdict: {result.verdict} (max slowdown {result.max_slowdown_pct:.3g}%); {said}", markup=False)


def _interval(cell, metric: str) -> str:  # noqa: ANN001 -- a bench.report.compare.CellDelta
    """The cell's interval of the candidate's change (`CellDelta.intervals`), e.g. "-11.8..-8.2%"; "—" without."""
    iv = cell.intervals.get(metric)
    return "—" if iv is None else f"{100 * (iv[0] - 1):+.1f}..{100 * (iv[1] - 1):+.1f}%"


def _speed_verdict(cell) -> str:  # noqa: ANN001 -- a bench.report.compare.CellDelta
    """The cell's speed verdict: the worse of its metrics' (FAIL, then UNRESOLVED, then PASS), "—" without."""
    found = set(cell.verdicts.values())
    return next((w for w in ("FAIL", "UNRESOLVED", "PASS") if w in found), "—")


def _load_table(result) -> "rich.table.Table":  # noqa: F821
    """The load levels both runs have (`bench.report.compare.LevelDelta`): output tok/s and its change, p99
    inter-token latency (ms) and its change, median TTFT (ms), per side, and validity."""
    from rich.table import Table

    from bench.runs.columns import DASH, fmt_num

    table = Table(title="load levels both runs have (candidate vs baseline)")
    for col in ("input tokens", "concurrency", "rate req/s", "output base", "output cand", "Δ output", "ITL p99 base",
                "ITL p99 cand", "Δ ITL p99", "TTFT p50 base", "TTFT p50 cand", "valid"):  # fmt: skip
        table.add_column(col, justify="left" if col == "valid" else "right")

    def pct(x):
        return DASH if x is None else f"{x:+.1f}%"

    for d in result.levels:
        b, c = d.baseline, d.candidate
        valid = "yes" if b.valid and c.valid else "base no" if c.valid else "cand no" if b.valid else "no"
        table.add_row(f"{d.key[0]:,}", str(d.key[1]), DASH if d.key[2] is None else f"{d.key[2]:g}",
                      fmt_num(b.output_tok_s, 1), fmt_num(c.output_tok_s, 1), pct(d.output_delta_pct),
                      fmt_num(b.itl_ms_p99, 1), fmt_num(c.itl_ms_p99, 1), pct(d.itl_p99_delta_pct),
                      fmt_num(b.ttft_ms_median, 1), fmt_num(c.ttft_ms_median, 1), valid)  # fmt: skip
    return table


def _device_loop_table(result) -> "rich.table.Table":  # noqa: F821
    """The device decode loop's figures of a comparison (`bench.report.compare.CellDelta`): each side's gauge and
    host overhead per step, and the gauge's change; "—" where a side did not time the device loop."""
    from rich.table import Table

    from bench.runs.columns import DEVICE_GAUGE, HOST_OVERHEAD

    table = Table(title="device decode loop (shown, not a threshold)")
    for col in ("input tokens", "device gauge base", "device gauge cand", "Δ device gauge", "host overhead ms/step base",
                "host overhead ms/step cand"):  # fmt: skip
        table.add_column(col, justify="right")
    for cell in result.cells:
        delta = cell.device_gauge_delta_pct
        table.add_row(f"{cell.input_tokens:,}" + (f" x{cell.batch}" if cell.batch != 1 else ""),
                      DEVICE_GAUGE.text(cell.baseline), DEVICE_GAUGE.text(cell.candidate),
                      "—" if delta is None else f"{delta:+.1f}%", HOST_OVERHEAD.text(cell.baseline),
                      HOST_OVERHEAD.text(cell.candidate))  # fmt: skip
    return table


def _accuracy_table(result) -> "rich.table.Table":  # noqa: F821
    """Per shared cell of a comparison: greedy-token agreement (`bench.report.compare.TokenAgreement`: equal
    positions of the compared ones, the first differing index) and the next-token logit error
    (`LogitAgreement`: max and mean |Δlogit|, same argmax), or why a figure is missing."""
    from rich.table import Table

    table = Table(title="accuracy: candidate vs baseline (shown, not a threshold)")
    for col in ("input tokens", "tokens equal", "first divergence", "max |Δlogit|", "mean |Δlogit|", "same argmax"):
        table.add_column(col, justify="right")
    logits = {g.input_tokens: g for g in result.logits}
    for t in result.tokens:
        if t.status == "unknown":
            equal, first = t.note or "unknown", "—"
        else:
            equal = f"{t.equal_tokens}/{t.compared_tokens} ({100 * t.equal_share:.1f}%)"
            first = "none" if t.first_divergence is None else str(t.first_divergence)
        g = logits.get(t.input_tokens)
        if g is None or g.max_abs is None:
            worst, mean, same = (g.note if g else "no logits recorded"), "—", "—"
        else:
            worst, mean, same = f"{g.max_abs:.4g}", f"{g.mean_abs:.4g}", "yes" if g.argmax_equal else "no"
        table.add_row(f"{t.input_tokens:,}", equal, first, worst, mean, same)
    return table


@runs_app.command("list")
def runs_list_cmd(runs_dir: RunsDirOpt = Path("runs")) -> None:
    """List the run folders with status, provenance, device, build id and cell count."""
    from rich.table import Table

    from bench.runs import list_runs

    summaries = list_runs(runs_dir)
    table = Table(title=f"runs in {runs_dir}/")
    for col in ("name", "status", "provenance", "device", "build id", "cells", "started", "problem"):
        table.add_column(col)
    for s in summaries:
        table.add_row(
            s.name, s.status or "unreadable", s.provenance or "—", s.device or "—", s.build_id or "—",
            "—" if s.cells is None else str(s.cells), s.started_at or "—", s.problem or s.note or "",
        )  # fmt: skip
    make_console().print(table)
    if not summaries:
        typer.echo(f"no run folders in {runs_dir}")


@runs_app.command("validate")
def runs_validate_cmd(
    run: Annotated[str, typer.Argument(help="Run folder or name in --runs-dir.")], runs_dir: RunsDirOpt = Path("runs")
) -> None:
    """Check a run folder against the schema; exit 1 and list the problems when it does not conform."""
    from bench.runs import MANIFEST, read_json, resolve_run, validate_run

    path = resolve_run(run, runs_dir)
    problems = validate_run(path)
    note = _state_note(path)
    if note:
        typer.echo(f"{path}: {note}")
    if not problems:
        version = read_json(path / MANIFEST).get("schema_version")  # validated above: an object with a version
        typer.echo(f"{path}: valid (schema version {version})")
        return
    typer.echo(f"{path}: {len(problems)} problem(s)")
    for problem in problems:
        typer.echo(f"  {problem}")
    raise SystemExit(1)  # see compare_cmd


def _state_note(path: Path) -> str | None:
    """`bench.runs.run_note` of the run at `path` (e.g. a killed writer), None when it cannot be opened (then
    validate_run names the problem)."""
    from bench.errors import RunFolderError
    from bench.runs import open_run, run_note

    try:
        return run_note(open_run(path))
    except RunFolderError:
        return None
