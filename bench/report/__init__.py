"""The report and the regression gate: tables, plots, findings and run-to-run comparisons from run folders alone.

Imports neither jax nor the engine (checked by an import contract): it works from archived runs of machines you no
longer have.
- `build_report`, `Report`                              (bench.report.build: findings, report.md, CSV, plots)
- `load_runs`, `RunView`, `fmt_pct`, `rate_text`        (bench.report.tables: views and formats)
- `fmt_num`                                             (bench.runs.columns: the one number format, for every table)
- `compare_runs`, `Comparison`, `manifest_differences`  (bench.report.compare: `bench compare`)
- `ReportRow`, `RunKeys`, `report_rows`, `ROW_COLUMNS`  (bench.report.rows: the long format and its column list)
- `Selection`, `Group`                                  (bench.report.groups: selection and comparison groups)
- sessions and key notes (bench.report.sessions), the quantization-by-session view (bench.report.quantview) and
  accuracy against a session's dense run, ties told from errors (bench.report.accuracy)
"""

from bench.report.build import Report, build_report
from bench.report.compare import Comparison, compare_runs, manifest_differences
from bench.report.groups import Group, Selection
from bench.report.rows import ROW_COLUMNS, ReportRow, RunKeys, report_rows
from bench.report.tables import RunView, fmt_pct, load_runs, rate_text
from bench.runs.columns import fmt_num

__all__ = [
    "Report", "build_report", "Comparison", "compare_runs", "manifest_differences", "RunView", "fmt_num",
    "fmt_pct", "load_runs", "rate_text", "Group", "Selection", "ROW_COLUMNS", "ReportRow", "RunKeys", "report_rows",
]  # fmt: skip
