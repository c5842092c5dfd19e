"""The sweep's terminal table fits the terminal (bench/cli/sweep_cmds.py: `fit_columns`, `column_widths`): in 120
characters no header or cell word breaks, the columns left out are named under it and are all in cells.csv, and a
pipe still gets every column. In process, no engine."""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
from pathlib import Path

import pytest
from rich.console import Console
from runfolders import cell_samples, manifest

import bench.cli.sweep_cmds as sweep_cmds
from bench.cli.sweep_cmds import fit_columns, sweep_table, table_width
from bench.runs import create_run, summarize_cell
from bench.runs.columns import INPUT_TOKENS, GAUGE, TTFT, TPOT, VALID, table_columns, text_rows

FULL = dict(device_gauge_tok_s_median=55.12, device_gauge_tok_s_min=54.0, device_gauge_tok_s_max=56.3,
            device_step_ms_median=18.123, host_overhead_ms=1.234, device_repeats=3, bytes_per_step=123456789,
            roofline_share_pct=45.6, device_roofline_share_pct=50.1, prefill_flops=123456789012,
            prefill_flop_s=1.2e11, prefill_matmul_share_pct=33.3)  # fmt: skip
"""A sweep of both decode loops with its rooflines: the widest table (16 columns)."""


def _rows():
    def cell(n: int, **changes):
        return dataclasses.replace(summarize_cell(cell_samples(n, cold=True), max_new_tokens=8, bucket=2560),
                                   **FULL, **changes)  # fmt: skip

    return [cell(41, bucket=64), cell(2057, valid=False, invalid_reason="repeat 0 degenerate: a 1-token loop")]


def _words_whole(out: str, texts) -> None:
    """Every word of `texts` is printed whole somewhere in `out` (no fragment of a folded word)."""
    pieces = set(out.replace("│", " ").replace("┃", " ").split())
    for text in texts:
        for word in text.split():
            assert word in pieces, word


def test_the_widest_table_is_16_columns_and_too_wide_for_120() -> None:
    rows = _rows()
    assert len(table_columns(rows)) == 16 and table_width(table_columns(rows), rows) > 120


def test_in_120_characters_no_header_or_word_breaks() -> None:
    rows = _rows()
    shown, left = fit_columns(table_columns(rows), rows, 120)
    assert table_width(shown, rows) <= 120 and left
    assert {INPUT_TOKENS, GAUGE, TTFT, TPOT, VALID} <= set(shown)  # what the sweep is read for stays
    assert [c for c in table_columns(rows) if c in shown] == list(shown)  # in the table's order
    buf = io.StringIO()
    Console(file=buf, width=120).print(sweep_table(rows, shown, width=120))
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 120 and "…" not in out
    _words_whole(out, [c.table_header for c in shown])
    _words_whole(out, [t for line in text_rows(shown, rows) for t in line])


def test_a_wide_terminal_leaves_nothing_out() -> None:
    rows = _rows()
    shown, left = fit_columns(table_columns(rows), rows, 250)
    assert shown == table_columns(rows) and left == ()


def _run(tmp_path: Path):
    run = create_run(tmp_path, "wide", "cpu", manifest(), date="2026-11-30")
    for row in _rows():
        run.append_samples(cell_samples(row.input_tokens, cold=row.input_tokens == 41))
        run.append_cell(row)
    run.finish("complete")
    return run


@pytest.mark.parametrize("terminal", [True, False])
def test_the_printed_table_names_what_it_left_out_and_the_csv_has_it(terminal, tmp_path, monkeypatch) -> None:
    run = _run(tmp_path)
    buf = io.StringIO()
    console = Console(file=buf, width=120 if terminal else 200, force_terminal=terminal)
    monkeypatch.setattr(sweep_cmds, "_table_console", lambda: console)
    sweep_cmds._print_table(run, logging.getLogger("test"))
    out = buf.getvalue()
    columns = table_columns(run.cells())
    if not terminal:  # a pipe: every column, as wide as it needs
        assert "left out" not in out
        _words_whole(out, [c.table_header for c in columns])
        return
    (line,) = [ln for ln in out.splitlines() if "columns left out to fit 120 characters" in ln]
    _shown, left = fit_columns(columns, run.cells(), 120)
    assert line.startswith(f"{len(left)} columns left out") and "cells.csv" in line
    assert all(c.header in line for c in left)
    with open(run.path / "cells.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert all(c.key in header for c in left)  # every figure left out is in the CSV
