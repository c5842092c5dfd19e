"""The columns of a sweep cell (`CellRow`), each described once: its field, header, unit, decimals and how a null
prints. Every printer of cells takes its columns from here: the terminal sweep table (`bench.cli.sweep_cmds`), the
gpu-run summary (`plain_table`, plain text), and the report's markdown table and CSV (`bench.report.tables`).

Standard library only (like the rest of `bench.runs`), so the gpu-run summary and the report can use it without
jax. A printer chooses which columns it shows (`TABLE_COLUMNS`, `CSV_COLUMNS`); it never formats a number itself.

Formats:
- a number: `fmt_num` (`digits` decimals, thousands separators, one trailing zero dropped); None prints as "—"
  (`DASH`), in every printer;
- a spread column (`Column.spread`): "median (min–max)" where the cell has both ends (raw samples), else the median
  alone (published figures hold medians only);
- `valid`: "yes", or "NO: " and the reason the cell is not quotable; a partial cell adds "(partial: k of N
  repeats, why)";
- completeness (`COMPLETENESS_COLUMNS`): `partial`, `repeats`, `repeats_planned`, `stopped_by`, the same fact as
  fields, in every CSV and JSONL;
- the device decode loop (`DEVICE_LOOP_COLUMNS`: its gauge, ms per step, the host overhead per step, its repeats):
  optional fields, shown only where a row has them (`present`), so a run without the device loop prints as it did;
- the rooflines (`ROOFLINE_COLUMNS`: bytes per decode step with thousands separators, the bandwidth roofline
  shares in %, the prefill's GFLOP/s and its share of the measured matrix-product rate in %): optional the same way;
- experts (`EXPERT_COLUMNS`: a model with experts' distinct experts read per layer and per step, and the routing
  that chose them): optional the same way;
- batches (`BATCH`, `BATCH_COLUMNS`: a `--batch` sweep's batch, aggregate throughput, step time median and p99,
  bytes per step, FLOP per byte, rows differing from B = 1): shown only for the rows of a `--batch` sweep (some row
  has `batch`), so every other run prints as it did.

Under a table, `table_notes` explains a figure that looks impossible: a roofline % above 100 becomes a finding
(`roofline_findings`: one line per cell and loop with the ceiling's numbers, bench/runs/ceiling.py), a prefill
matmul % above 100 and a negative host overhead per step a note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bench.runs.ceiling import Ceiling, RooflineFinding, finding_of
from bench.runs.records import CellRow

DASH = "—"
"""How a null (an unknown or absent figure) prints, everywhere."""


def fmt_num(x: float | None, digits: int = 2) -> str:
    """`x` with `digits` decimals and thousands separators, one trailing zero dropped when `digits` >= 2
    (12.90 -> "12.9", 13.00 -> "13.0", 1466 -> "1,466.0"; the published tables print their figures so);
    `digits` 0 for counts (2057 -> "2,057"). None -> "—"."""
    if x is None:
        return DASH
    text = f"{x:,.{digits}f}"
    return text[:-1] if digits >= 2 and text.endswith("0") else text


@dataclasses.dataclass(frozen=True, kw_only=True)
class Column:
    """One column of the sweep cell.

    key: the `CellRow` field shown (for a spread column, the median); also the CSV field name.
    header: the column's name in every table (the report puts the run's label in front of it).
    unit: the unit of the values ("tokens", "tok/s", "ms", "x" for a cold / warm ratio, "" for text).
    digits: decimals of a number (0 for counts); None for a field shown as text.
    spread: the median is followed by "(min–max)" from the `<name>_min` and `<name>_max` fields where both exist.
    align: "right" (numbers) or "left" (text), for the terminal and plain-text tables.
    text_of: the text of a non-numeric field from its row (None: the value as given).
    scale: the tables print value / scale (1e9: FLOP/s as GFLOP/s); CSVs keep the value as stored.
    """

    key: str
    header: str
    unit: str
    digits: int | None
    spread: bool = False
    align: str = "right"
    text_of: Callable[[CellRow], str] | None = None
    scale: float = 1.0

    @property
    def table_header(self) -> str:
        """The header of the terminal and plain-text tables: a spread column says "(min–max)"."""
        return f"{self.header} (min–max)" if self.spread else self.header

    @property
    def csv_fields(self) -> tuple[str, ...]:
        """The CellRow fields this column writes to a CSV: the key, and a spread column's min and max."""
        if not self.spread:
            return (self.key,)
        stem = self.key.removesuffix("_median")
        return (self.key, f"{stem}_min", f"{stem}_max")

    def value(self, row: CellRow | None) -> Any:
        """The raw value of the key field (None for no row)."""
        return None if row is None else getattr(row, self.key)

    def text(self, row: CellRow | None) -> str:
        """The value as the tables print it (see the module docstring); "—" for no row or a null."""
        if row is not None and self.text_of is not None:
            return self.text_of(row)
        value = self.value(row)
        if value is None or self.digits is None:
            return DASH if value is None else str(value)
        text = fmt_num(value / self.scale if self.scale != 1.0 else value, self.digits)
        if self.spread:
            lo, hi = (getattr(row, f) for f in self.csv_fields[1:])
            if lo is not None and hi is not None:
                text += f" ({fmt_num(lo, self.digits)}–{fmt_num(hi, self.digits)})"
        return text


def _valid_text(row: CellRow) -> str:
    device = f", {row.device_repeats} of {row.repeats_planned} device-loop" if row.device_repeats is not None else ""
    partial = f" (partial: {row.repeats} of {row.repeats_planned} repeats{device}, {row.stopped_by})" if row.partial else ""
    return ("yes" if row.valid else f"NO: {row.invalid_reason}") + partial


INPUT_TOKENS = Column(key="input_tokens", header="input tokens", unit="tokens", digits=0)
BUCKET = Column(key="bucket", header="bucket", unit="tokens", digits=0)
GAUGE = Column(key="gauge_tok_s_median", header="gauge tok/s", unit="tok/s", digits=2, spread=True)
E2E = Column(key="e2e_tok_s_median", header="end-to-end tok/s", unit="tok/s", digits=2, spread=True)
TTFT = Column(key="ttft_ms_median", header="TTFT ms", unit="ms", digits=1)
TPOT = Column(key="tpot_ms_median", header="TPOT ms", unit="ms", digits=2)
COLD_WARM_REQUEST = Column(key="cold_warm_request_ratio", header="cold/warm request", unit="x", digits=1)
COLD_WARM_TTFT = Column(key="cold_warm_ttft_ratio", header="cold/warm TTFT", unit="x", digits=1)
VALID = Column(key="valid", header="valid", unit="", digits=None, align="left", text_of=_valid_text)
STATUS = Column(key="status", header="status", unit="", digits=None, align="left")
PARTIAL = Column(key="partial", header="partial", unit="", digits=None, align="left")
REPEATS = Column(key="repeats", header="repeats", unit="", digits=0)
REPEATS_PLANNED = Column(key="repeats_planned", header="repeats planned", unit="", digits=0)
STOPPED_BY = Column(key="stopped_by", header="stopped by", unit="", digits=None, align="left")
DEVICE_GAUGE = Column(key="device_gauge_tok_s_median", header="device-loop gauge tok/s", unit="tok/s", digits=2,
                      spread=True)  # fmt: skip
DEVICE_STEP = Column(key="device_step_ms_median", header="device-loop ms/step", unit="ms", digits=3)
HOST_OVERHEAD = Column(key="host_overhead_ms", header="host overhead ms/step", unit="ms", digits=3)
DEVICE_REPEATS = Column(key="device_repeats", header="device-loop repeats", unit="", digits=0)
BYTES_PER_STEP = Column(key="bytes_per_step", header="bytes/step", unit="bytes", digits=0)
ROOFLINE_SHARE = Column(key="roofline_share_pct", header="roofline %", unit="%", digits=1)
DEVICE_ROOFLINE_SHARE = Column(key="device_roofline_share_pct", header="device-loop roofline %", unit="%",
                               digits=1)  # fmt: skip
PREFILL_FLOPS = Column(key="prefill_flops", header="prefill FLOP", unit="FLOP", digits=0)
PREFILL_GFLOP_S = Column(key="prefill_flop_s", header="prefill GFLOP/s", unit="GFLOP/s", digits=1, scale=1e9)
PREFILL_MATMUL_SHARE = Column(key="prefill_matmul_share_pct", header="prefill matmul %", unit="%", digits=1)
BATCH = Column(key="batch", header="batch", unit="rows", digits=0)
AGGREGATE = Column(key="aggregate_tok_s_median", header="aggregate tok/s", unit="tok/s", digits=2, spread=True)
STEP = Column(key="step_ms_median", header="step ms", unit="ms", digits=3)
STEP_P99 = Column(key="step_ms_p99", header="step p99 ms", unit="ms", digits=3)
FLOPS_PER_STEP = Column(key="flops_per_step", header="FLOP/step", unit="FLOP", digits=0)
INTENSITY = Column(key="arithmetic_intensity", header="FLOP/byte", unit="FLOP/byte", digits=2)
ROWS_DIFFER = Column(key="rows_differ", header="rows ≠ B=1", unit="rows", digits=0)


def experts_text(row: CellRow | None) -> str:
    """A cell's experts read per layer as the tables print it (`EXPERTS_PER_LAYER`): the median over its decode
    steps, with "(balanced routing)" where dummy weights chose them so (docs/method.md, "Bytes that follow the
    routing"); "—" for none."""
    if row is None or row.experts_per_layer_median is None:
        return DASH
    text = fmt_num(row.experts_per_layer_median, 2)
    return text + " (balanced routing)" if row.expert_routing == "balanced" else text


EXPERTS_PER_LAYER = Column(key="experts_per_layer_median", header="experts/layer", unit="experts", digits=2,
                           text_of=experts_text)  # fmt: skip
EXPERTS_READ = Column(key="experts_read_median", header="experts read/step", unit="experts", digits=1, spread=True)
EXPERT_ROUTING = Column(key="expert_routing", header="expert routing", unit="", digits=None, align="left")

CELL_COLUMNS: tuple[Column, ...] = (
    INPUT_TOKENS, BUCKET, GAUGE, E2E, TTFT, TPOT, COLD_WARM_REQUEST, COLD_WARM_TTFT, VALID, STATUS,
)  # fmt: skip
"""Every described column of a sweep cell, in table order."""
COMPLETENESS_COLUMNS: tuple[Column, ...] = (PARTIAL, REPEATS, REPEATS_PLANNED, STOPPED_BY)
"""Whether a cell is complete, as fields a program reads (the tables a person reads say it in `valid`): `partial`
(False for a row written before partial cells existed), the timed `repeats`, and for a partial cell the repeats
planned and what stopped it. Written by every machine-readable output (rows.csv, rows.jsonl, sweep.csv)."""
DEVICE_LOOP_COLUMNS: tuple[Column, ...] = (DEVICE_GAUGE, DEVICE_STEP, HOST_OVERHEAD, DEVICE_REPEATS)
"""The device decode loop's figures (`--decode-loop device|both`): its gauge (median, min–max), its ms per step
(decode time / (generated - 1)), the host overhead per step (host-loop ms per step - device-loop ms per step, same
cell; `CellRow`) and its timed repeats. Optional: every printer shows them only where a row has them (`present`)."""
ROOFLINE_COLUMNS: tuple[Column, ...] = (
    BYTES_PER_STEP, ROOFLINE_SHARE, DEVICE_ROOFLINE_SHARE, PREFILL_FLOPS, PREFILL_GFLOP_S, PREFILL_MATMUL_SHARE,
)  # fmt: skip
"""The rooflines of an in-process sweep (`CellRow`; docs/method.md, "Rooflines"): bytes one decode step reads,
the bandwidth roofline share of each loop's gauge (bytes/step x gauge / the run's measured copy bandwidth), the
prefill's matrix-product FLOP, its FLOP/s (printed as GFLOP/s) and their share of the run's measured
matrix-product rate. Optional, like the device-loop columns (`present`)."""
EXPERT_COLUMNS: tuple[Column, ...] = (EXPERTS_PER_LAYER, EXPERTS_READ, EXPERT_ROUTING)
"""A model with experts (`CellRow`; docs/method.md, "Bytes that follow the routing"): the distinct experts its
decode steps read per layer (median over the steps; what bytes/step counts), per step summed over the layers
(median, min–max), and the routing that chose them ("router", or "balanced" for dummy weights). Optional, like the
rooflines (`present`): rows of models without experts print as they did."""
OPTIONAL_COLUMNS: tuple[Column, ...] = DEVICE_LOOP_COLUMNS + ROOFLINE_COLUMNS + EXPERT_COLUMNS
"""The columns of optional `CellRow` fields: a printer shows each only where some row has a value (`present`)."""
BATCH_COLUMNS: tuple[Column, ...] = (AGGREGATE, STEP, STEP_P99, BYTES_PER_STEP, INTENSITY, ROWS_DIFFER)
"""A `--batch` sweep's cell figures (`CellRow`; docs/method.md, "Batches") beside the per-sequence gauge: the
aggregate throughput (B x the gauge: median, min–max), the decode step's median and p99 (ms, host loop), the
bytes one step reads (weights once, every row's KV cache), the arithmetic intensity (FLOP per byte of a step) and
how many rows' greedy tokens differ from their prompt's at B = 1. Shown only where a row has `batch`
(`is_batch_sweep`)."""
TABLE_ROOFLINE_COLUMNS: tuple[Column, ...] = (ROOFLINE_SHARE, DEVICE_ROOFLINE_SHARE, PREFILL_MATMUL_SHARE,
                                              EXPERTS_PER_LAYER)  # fmt: skip
"""The rooflines the terminal's sweep table shows: the three shares, so that a sweep of both loops fits 200
columns (bytes per step, prefill FLOP and GFLOP/s are in the run's cells.csv and the report's rows), and for a
model with experts the experts read per layer its bytes per step count (with the routing where it was balanced)."""
TABLE_COLUMNS: tuple[Column, ...] = CELL_COLUMNS[:-1]
"""The sweep table of the terminal (`bench sweep`) and of the gpu-run summary: one row per input size (plus the
device-loop columns where a row has them: `table_columns`)."""
CSV_COLUMNS: tuple[Column, ...] = (GAUGE, E2E, BUCKET, TTFT, VALID, STATUS, *COMPLETENESS_COLUMNS)
"""The report's sweep.csv, per run after `input_tokens` (numbers unrounded)."""


def present(columns: Sequence[Column], rows: Iterable[CellRow | None]) -> tuple[Column, ...]:
    """The optional columns of `columns` (`OPTIONAL_COLUMNS`: device loop, rooflines) that some row has a value of,
    and every other column: what a printer shows, so that rows without them print as they always did."""
    rows = [r for r in rows if r is not None]
    return tuple(c for c in columns if c not in OPTIONAL_COLUMNS or any(c.value(r) is not None for r in rows))


def is_batch_sweep(rows: Iterable[CellRow | None]) -> bool:
    """True when some row is a cell of a `--batch` sweep (has `batch`)."""
    return any(r is not None and r.batch is not None for r in rows)


def table_columns(rows: Iterable[CellRow]) -> tuple[Column, ...]:
    """The terminal's and the gpu-run summary's sweep-table columns for `rows`: `TABLE_COLUMNS`, then (before
    `valid`) the device-loop columns and the rooflines (`TABLE_ROOFLINE_COLUMNS`) where a row has them; a `--batch`
    sweep's rows add `BATCH` after the input tokens and `BATCH_COLUMNS` before the device-loop columns."""
    rows = list(rows)
    batched = is_batch_sweep(rows)
    extra = (*(BATCH_COLUMNS if batched else ()), *present(DEVICE_LOOP_COLUMNS + TABLE_ROOFLINE_COLUMNS, rows))
    cut = TABLE_COLUMNS.index(VALID)
    head = (TABLE_COLUMNS[0], BATCH, *TABLE_COLUMNS[1:cut]) if batched else TABLE_COLUMNS[:cut]
    return (*head, *extra, *TABLE_COLUMNS[cut:])


def cell_name(row: CellRow) -> str:
    """A cell as the notes under a table name it: its input size ("41"), with its batch in a `--batch` sweep
    ("41x8")."""
    return str(row.input_tokens) if row.batch is None else f"{row.input_tokens}x{row.batch}"


_OVER_100 = (
    ((PREFILL_MATMUL_SHARE,), 100.0,
     "the prefill's matrix products ran faster than the measured matrix-product rate at its probe shape"),
)  # fmt: skip
_ROOFLINE_NO_CEILING = ("the step read its bytes faster than the rate it is a share of; this run records no "
                        "ceiling, or the cell no bytes per step or gauge, to say by how much (docs/method.md, "
                        "Rooflines)")  # fmt: skip


def table_notes(columns: Sequence[Column], rows: Iterable[CellRow | None], *,
                ceiling: Ceiling | None = None) -> list[str]:  # fmt: skip
    """The lines under a table of `columns` over `rows` (the terminal's sweep table, the gpu-run summary's, the
    report's rooflines, decode-loop and batch tables), one per figure that looks impossible among the columns
    shown: a roofline % above 100 (either loop's) is a finding per cell and loop (`roofline_findings` against
    `ceiling`, the run's `bench.runs.ceiling.ceiling_of`; one note naming the cells where the run has none); a
    prefill matmul % above 100 and a negative host overhead per step a note naming the cells ("41", "41x8") and
    saying what it means. [] when no row has one."""
    rows = [r for r in rows if r is not None]
    shown = tuple(c for c in (ROOFLINE_SHARE, DEVICE_ROOFLINE_SHARE) if c in columns)
    found = roofline_findings(rows, ceiling, shown)
    out = [f.line for f in found]
    named = {(f.cell, f.loop) for f in found}
    over = [f"{'device loop ' if col is DEVICE_ROOFLINE_SHARE else ''}{cell_name(r)}: {col.text(r)}"
            for col in shown for r in rows
            if (col.value(r) or 0.0) > 100.0 and (cell_name(r), _loop(col)) not in named]  # fmt: skip
    if over:  # no ceiling, or a cell without its bytes per step or gauge: still said, never silent
        out.append(f"finding: {ROOFLINE_SHARE.header} above 100 ({', '.join(over)}): {_ROOFLINE_NO_CEILING}.")
    for shares, limit, meaning in _OVER_100:
        cells = [(col, r) for col in shares if col in columns for r in rows if (col.value(r) or 0.0) > limit]
        if cells:
            over = [f"{cell_name(r)}: {col.text(r)}" for col, r in cells]
            out.append(f"note: {shares[0].header} above 100 ({', '.join(over)}): {meaning}.")
    below = [f"{cell_name(r)}: {HOST_OVERHEAD.text(r)}" for r in rows if (HOST_OVERHEAD.value(r) or 0.0) < 0.0]
    if below and HOST_OVERHEAD in columns:
        out.append(f"note: {HOST_OVERHEAD.header} below 0 ({', '.join(below)}): the device loop was slower per step "
                   "than the host loop (noise, or a different compiled program).")  # fmt: skip
    return out


_ROOFLINE_GAUGES = {ROOFLINE_SHARE.key: GAUGE.key, DEVICE_ROOFLINE_SHARE.key: DEVICE_GAUGE.key}
"""Per roofline share column's key, the key of the gauge it is the share of (the same loop's)."""


def _loop(col: Column) -> str:
    """The decode loop a roofline share column is of: "device loop" or "host loop"."""
    return "device loop" if col is DEVICE_ROOFLINE_SHARE else "host loop"


def roofline_findings(rows: Iterable[CellRow | None], ceiling: Ceiling | None,
                      columns: Sequence[Column] = (ROOFLINE_SHARE, DEVICE_ROOFLINE_SHARE),
                      ) -> list[RooflineFinding]:  # fmt: skip
    """One `bench.runs.ceiling.RooflineFinding` per (row, roofline share column of `columns`) whose share is above
    100% of `ceiling` (the row's own where it has one, `row_ceiling`; the share as the row records it, with that
    loop's gauge and the row's bytes per step), in row order, host loop first. [] without a ceiling or a share
    above 100."""
    out = []
    for r in (r for r in rows if r is not None):
        for col in columns:
            found = finding_of(cell_name(r), _loop(col), col.value(r), r.bytes_per_step,
                               getattr(r, _ROOFLINE_GAUGES[col.key]), row_ceiling(r, ceiling))  # fmt: skip
            if found is not None:
                out.append(found)
    return out


def row_ceiling(row: CellRow, ceiling: Ceiling | None) -> Ceiling | None:
    """The ceiling `row`'s shares were divided by: the run's `ceiling`, or, for a cell of an interleaved sweep that
    records its own (`CellRow.ceiling_bytes_s`: the probes around its repeats, docs/method.md "Interleaving"), the
    run's with the cell's denominator and read rate in place of the start's. None without a run ceiling."""
    if ceiling is None or row.ceiling_bytes_s is None:
        return ceiling
    sheet = ceiling.datasheet is not None and row.ceiling_bytes_s == ceiling.datasheet.bytes_per_s
    return dataclasses.replace(ceiling, bytes_per_s=row.ceiling_bytes_s, read_bytes_s=row.probe_read_bytes_s_median,
                               chosen="datasheet" if sheet else "measured read")  # fmt: skip


def text_rows(columns: Sequence[Column], rows: Iterable[CellRow]) -> list[list[str]]:
    """The printed text of `columns` for each row, in order."""
    return [[c.text(r) for c in columns] for r in rows]


def plain_table(columns: Sequence[Column], rows: Iterable[CellRow], indent: str = "") -> list[str]:
    """`rows` as a plain-text table (header line, then one line per row): each column as wide as its widest
    entry, right- or left-aligned as the column says, two spaces between columns, no trailing spaces."""
    body = text_rows(columns, rows)
    lines = [[c.table_header for c in columns], *body]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    out = []
    for line in lines:
        cells = [t.rjust(w) if c.align == "right" else t.ljust(w) for c, t, w in zip(columns, line, widths)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out
