"""The report's widest markdown table, the levels of a sweep under load, within a screen (at most 14 columns,
as the report at scale aims): each median shares its column with its p99, and load.csv keeps one column per
figure. In process, on the table function alone."""

from __future__ import annotations

from types import SimpleNamespace

from bench.report.tables import load_report_table
from bench.runs.columns import fmt_num

LEVEL = dict(input_tokens=521, concurrency=4, request_rate=None, completed=32, num_requests=32, output_tok_s=70.25,
             request_s=1.125, ttft_ms_median=812.5, ttft_ms_p99=37612.0, itl_ms_median=55.5, itl_ms_p99=91.25,
             tpot_ms_median=57.0, e2e_ms_median=4400.0, e2e_ms_p99=41000.5, queue_ms_median=3.5, valid=True,
             invalid_reason=None)  # fmt: skip


def test_the_load_table_fits_14_columns_and_the_csv_keeps_every_figure() -> None:
    view = SimpleNamespace(name="2026-11-30-load-cpu", label="load", load=[SimpleNamespace(**LEVEL)])
    csv_header, raw, md_header, md_rows = load_report_table([view])
    assert len(md_header) <= 14 and all(len(row) == len(md_header) for row in md_rows)
    assert len(csv_header) == 16 and all(len(row) == len(csv_header) for row in raw)
    figures = ["output_tok_s", "request_s", "ttft_ms_median", "ttft_ms_p99", "itl_ms_median", "itl_ms_p99",
               "tpot_ms_median", "e2e_ms_median", "e2e_ms_p99", "queue_ms_median"]  # fmt: skip
    assert all(LEVEL[f] in raw[0] for f in figures)  # unrounded in the CSV
    row = dict(zip(md_header, md_rows[0], strict=True))
    assert row["TTFT ms p50 / p99"] == f"{fmt_num(812.5, 1)} / {fmt_num(37612.0, 1)}"
    assert row["e2e ms p50 / p99"] == f"{fmt_num(4400.0, 1)} / {fmt_num(41000.5, 1)}"
    shown = " ".join(md_rows[0])
    for f in figures:  # every figure is in the markdown too, in the number format of every table
        assert fmt_num(LEVEL[f], 2 if f == "request_s" else 1) in shown, f
