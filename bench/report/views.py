"""The views of one comparison group (bench/report/groups.py), each a `Table` that fits a screen:

- `device_tables`: one configuration, device by device (the latest run per device at the group's base batch and
  concurrency): input tokens down, each device's gauge and end-to-end tok/s across, devices split over several
  tables beyond `MAX_DEVICES_PER_TABLE` (the published T4G/L4 table is this view of the published group);
- `decode_loop_tables`: where a device's run timed the device decode loop too, input tokens down, its host-loop
  and device-loop gauges and the host overhead per step across (no table for runs without it);
- `runs_table`: the group's selected runs, one line each, their identity keys from the long format's columns;
- `axis_tables`: against batch or concurrency (generic over the axis), per device, only where the group's runs
  hold more than one value of that axis;
- `history_tables`: one configuration over time (device, batch, concurrency fixed), one line per run with each
  cell's median and (min–max), the last `MAX_HISTORY_ROWS` runs.

Batches (`bench sweep --batch`; docs/method.md "Batches"): `batch_tables`, per run with batch cells, input tokens
and batch down, the per-sequence gauge, aggregate throughput, TTFT of the batch prefill, step time (median, p99),
bytes per step, roofline share, FLOP per byte and rows differing from B = 1 across, the knee per input size under
it; `batch_profile_table`, where the group's profiles were taken at more than one batch (`bench profile --batch`),
the device-time categories per batch side by side.

Across groups, the quantization sets of one session stand side by side in bench/report/quantview.py.

A table is at most `MAX_COLUMNS` columns and `MAX_ROWS` rows. Numbers print as bench.runs.columns prints them
(`rate_text`). No jax, no engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from bench.report.groups import Group
from bench.report.rows import RowColumn, columns
from bench.report.tables import rate_text, sweep_report_table
from bench.runs import copy_bandwidths_of, drift_pct
from bench.runs.ceiling import ceiling_of
from bench.runs.columns import (
    AGGREGATE,
    BATCH,
    BYTES_PER_STEP,
    GAUGE,
    INTENSITY,
    ROWS_DIFFER,
    STEP,
    STEP_P99,
    TTFT,
    VALID,
    DEVICE_GAUGE,
    DEVICE_ROOFLINE_SHARE,
    EXPERTS_PER_LAYER,
    EXPERTS_READ,
    HOST_OVERHEAD,
    PREFILL_GFLOP_S,
    PREFILL_MATMUL_SHARE,
    ROOFLINE_SHARE,
    fmt_num,
    present,
    table_notes,
)

DASH_TEXT = "—"
MAX_COLUMNS = 12
MAX_ROWS = 40
MAX_DEVICES_PER_TABLE = 5  # 1 + 2 columns per device <= 11
MAX_HISTORY_ROWS = 12
MAX_SIZES = 5  # input sizes across in the axis and history views: 1 + 2 x 5 <= 11


@dataclasses.dataclass(frozen=True, kw_only=True)
class Table:
    """A view as text: `title`, `header`, `rows` (cells as printed), `notes` (lines under it), `kind` (the view:
    "devices", "runs", "batch", "concurrency", "history", ...), `plot` (file name of its plot, or None), `sources`
    (the names of the runs whose figures it shows: what a key note (bench/report/sessions.py) is about)."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = dataclasses.field(default_factory=list)
    kind: str = ""
    plot: str | None = None
    sources: tuple[str, ...] = ()


def _base(group: Group, axis: str, views: Sequence[Any]) -> Any:
    values = [getattr(group.keys[v.name], axis) for v in views]
    return min(values) if values else None


def device_views(group: Group) -> list[Any]:
    """The latest selected run per device at the group's smallest batch and concurrency, in the group's order; a
    run with sweep cells wins over a later one without (a profile-only run made after the sweep), so the sweep
    tables show the sweep."""
    base = [v for v in group.views if all(getattr(group.keys[v.name], a) == _base(group, a, group.views)
                                          for a in ("batch", "concurrency"))]  # fmt: skip

    def rank(v) -> tuple:
        k = group.keys[v.name]
        return (bool(v.cells or v.batch_cells), k.started_at or "", k.run)

    latest: dict[str, Any] = {}
    for v in base:
        k = group.keys[v.name]
        if k.device not in latest or rank(v) >= rank(latest[k.device]):
            latest[k.device] = v
    return [v for v in base if latest.get(group.keys[v.name].device) is v]


def device_tables(group: Group, views: Sequence[Any] | None = None) -> list[Table]:
    """The device-by-device view (see the module docstring) of `views` (default: `device_views(group)`);
    invalid cells' notes under each table."""
    views = list(device_views(group) if views is None else views)
    out = []
    for i in range(0, len(views), MAX_DEVICES_PER_TABLE):
        chunk = views[i:i + MAX_DEVICES_PER_TABLE]
        _, _, header, rows, notes = sweep_report_table(chunk, extras=False)
        k = group.keys[chunk[0].name]
        part = f" ({i // MAX_DEVICES_PER_TABLE + 1})" if len(views) > MAX_DEVICES_PER_TABLE else ""
        title = f"{group.gid} device by device{part}: batch {k.batch}, concurrency {k.concurrency}"
        out.append(Table(title=title, header=header, rows=rows, notes=notes, kind="devices",
                         sources=tuple(v.name for v in chunk)))
    return out


DECODE_LOOP_RUNS_PER_TABLE = 3  # 1 + 3 columns per run <= 10


def decode_loop_tables(views: Sequence[Any]) -> list[Table]:
    """The decode loops side by side for those of `views` (one run per device, labelled) whose cells hold the
    device loop's figures: per run its host-loop gauge, device-loop gauge and host overhead per step (host-loop ms
    per step - device-loop ms per step, same cell; bench/runs/records.py `CellRow`), a negative overhead explained
    under it (`bench.runs.columns.table_notes`). [] when none has them."""
    views = [v for v in views if any(c.device_repeats is not None for c in v.cells.values())]
    out = []
    for i in range(0, len(views), DECODE_LOOP_RUNS_PER_TABLE):
        chunk = views[i:i + DECODE_LOOP_RUNS_PER_TABLE]
        sizes = sorted({s for v in chunk for s in v.cells})[:MAX_ROWS]
        header = ["input tokens"] + [f"{v.label} {h}" for v in chunk for h in ("host-loop gauge", "device-loop gauge",
                                                                              "host overhead ms/step")]  # fmt: skip
        rows = [[fmt_num(s, 0)] + [t for v in chunk for t in (rate_text(v.cells.get(s), "gauge"),
                                                               DEVICE_GAUGE.text(v.cells.get(s)),
                                                               HOST_OVERHEAD.text(v.cells.get(s)))] for s in sizes]  # fmt: skip
        notes = ["gauge tok/s, median (min–max); host overhead per step = the host loop's ms per step - the device "
                 "loop's (each decode time / (generated - 1), median over its repeats), same cell, same session."]
        notes += [f"{v.label}: {n.removeprefix('note: ')}" for v in chunk
                  for n in table_notes([HOST_OVERHEAD], [v.cells.get(s) for s in sizes])]  # fmt: skip
        out.append(Table(title="decode loop: host-synced vs on the device", header=header, rows=rows, notes=notes,
                         kind="decode-loop", sources=tuple(v.name for v in chunk)))  # fmt: skip
    return out


def ceiling_text(manifest: dict) -> str:
    """The run's roofline ceiling for a table's note (`bench.runs.ceiling.ceiling_of`): its `line` (the
    denominator, which figure it is, the measured read and the datasheet beside it; for a run recorded before the
    ceiling, its copy and what the current definition would give), or "none recorded"."""
    ceiling = ceiling_of(manifest)
    return "none recorded" if ceiling is None else ceiling.line


ROOFLINE_RUNS_PER_TABLE = 1  # 1 + up to 5 columns per run <= 10


def roofline_tables(views: Sequence[Any]) -> list[Table]:
    """The rooflines (docs/method.md, "Rooflines"; bench/runs/records.py `CellRow`) of those of `views` whose cells
    have them, one run per table: bytes per decode step, the bandwidth roofline share of each loop's gauge, the
    prefill's GFLOP/s and its share of the measured matrix-product rate, each column where a cell has it, a share
    above 100% explained under it (`bench.runs.columns.table_notes`), and the run's copy bandwidth before its first
    cell and after its last where it measured both (`bench.runs.copy_bandwidths_of`). [] when no run has them
    (runs measured before the sweep measured its rates)."""
    wanted = (BYTES_PER_STEP, EXPERTS_PER_LAYER, EXPERTS_READ, ROOFLINE_SHARE, DEVICE_ROOFLINE_SHARE, PREFILL_GFLOP_S,
              PREFILL_MATMUL_SHARE)  # fmt: skip
    out = []
    for v in views:
        cols = present(wanted, v.cells.values())  # each optional: only those some cell has
        if not cols:
            continue
        sizes = sorted(v.cells)[:MAX_ROWS]
        rows = [[fmt_num(s, 0), *(c.text(v.cells[s]) for c in cols)] for s in sizes]
        notes = [f"roofline % = bytes per step x gauge tok/s / the run's roofline ceiling ({ceiling_text(v.m)}); "
                 "prefill matmul % = prefill FLOP / median prefill time / the run's measured matrix-product rate "
                 "(same session)."]  # fmt: skip
        notes += experts_notes([v.cells[s] for s in sizes])
        notes += [n.removeprefix("note: ") for n in table_notes(cols, [v.cells[s] for s in sizes],
                                                                ceiling=ceiling_of(v.m))]
        start, end = copy_bandwidths_of(v.m)
        if start is not None and end is not None:  # measured again after the last cell (bench.sweep.rates)
            notes.append(f"copy bandwidth {start / 2**30:,.2f} GiB/s before the first cell, "
                         f"{end / 2**30:,.2f} GiB/s after the last ({drift_pct(start, end):+.1f}%): how far this "
                         "host drifted while the cells ran.")  # fmt: skip
        out.append(Table(title=f"rooflines: {v.label}", header=["input tokens", *(c.header for c in cols)],
                         rows=rows, notes=notes, kind="rooflines", sources=(v.name,)))  # fmt: skip
    return out


def experts_notes(cells: Sequence[Any], *, per_cell: bool = False) -> list[str]:
    """The lines under a table of cells of a model with experts (docs/method.md, "Bytes that follow the routing"):
    what experts/layer is and that bytes/step counts it; with `per_cell`, each cell's figure (the batch table has
    no column for it); and the routing where it was balanced (dummy weights), beside the figure. [] when no cell
    recorded its experts read."""
    from bench.runs.columns import cell_name, experts_text

    known = [c for c in cells if c is not None and c.experts_per_layer_median is not None]
    if not known:
        return []
    out = ["experts/layer = the distinct experts a decode step's routers chose per layer (the union over a batch's "
           "rows), median over the cell's steps as the measured run recorded them; bytes/step counts that many "
           "experts per layer instead of top_k (docs/method.md, Bytes that follow the routing)."]  # fmt: skip
    if per_cell:
        out.append("experts/layer: " + ", ".join(f"{cell_name(c)} {experts_text(c)}" for c in known))
    if any(c.expert_routing == "balanced" for c in known):
        out.append("balanced routing: dummy weights whose tokens go to every expert equally often (a step reads "
                   "min(E, B x top_k) experts per layer), not a trained router's choice.")  # fmt: skip
    return out


BATCH_TABLE_COLUMNS = (GAUGE, AGGREGATE, TTFT, STEP, STEP_P99, BYTES_PER_STEP, ROOFLINE_SHARE, INTENSITY, ROWS_DIFFER,
                       VALID)  # fmt: skip
"""The batch table's columns after input tokens and batch (2 + 10 <= `MAX_COLUMNS`)."""


def batch_tables(views: Sequence[Any]) -> list[Table]:
    """Per view with batch cells (`RunView.batch_cells`, a `--batch` sweep), one table: (input tokens, batch)
    down, `BATCH_TABLE_COLUMNS` across (each optional one where a cell has it), and under it the knee per input
    size (`bench.measure.batches.knees`, its stated fraction), what the gauge and aggregate mean, and a roofline %
    above 100 explained (`bench.runs.columns.table_notes`). [] when no view has batch cells."""
    from bench.measure.batches import KNEE_FRACTION, knees

    out = []
    for v in views:
        if not v.batch_cells:
            continue
        cells = [v.batch_cells[k] for k in sorted(v.batch_cells)][:MAX_ROWS]
        cols = [c for c in BATCH_TABLE_COLUMNS if c is VALID or c.digits is None or any(c.value(x) is not None for x in cells)]
        rows = [[fmt_num(c.input_tokens, 0), BATCH.text(c), *(col.text(c) for col in cols)] for c in cells]
        notes = [f"gauge = one row's (generated - 1) / decode time (per sequence); aggregate = B x gauge (every row's "
                 "tokens per second of decode); bytes/step = the weights once plus every row's KV cache; roofline % = "
                 f"bytes/step x gauge / the run's roofline ceiling ({ceiling_text(v.m)}); FLOP/byte = "
                 "matrix-product FLOP of one step / bytes/step; rows ≠ B=1 = rows whose greedy tokens differ from "
                 "their prompt's alone."]  # fmt: skip
        notes += [f"knee (median step > {1 + KNEE_FRACTION:g} x B = 1's): {k.line}" for k in knees(cells)]
        notes += experts_notes(cells, per_cell=True)
        notes += [n.removeprefix("note: ") for n in table_notes(cols, cells, ceiling=ceiling_of(v.m))]
        out.append(Table(title=f"batches: {v.label}", header=["input tokens", BATCH.header, *(c.header for c in cols)],
                         rows=rows, notes=notes, kind="batches", sources=(v.name,)))  # fmt: skip
    return out


def batch_profile_table(views: Sequence[Any]) -> Table | None:
    """The device-time categories per batch size side by side: one column per profile of `views` (sorted by its
    batch, `profile_figures`' `batch`), one row per category (% of device time; "absent" where the device cannot
    have it) and the device ms per step. None unless the profiles were taken at two or more batch sizes."""
    profiled = sorted((v for v in views if v.figures is not None), key=lambda v: (v.figures["batch"], v.name))
    if len({v.figures["batch"] for v in profiled}) < 2:
        return None
    profiled = profiled[: MAX_COLUMNS - 1]
    names = list(dict.fromkeys(n for v in profiled for n in v.profile.get("categories") or {}))
    rows = []
    for name in names:
        row = [name.replace("_", " ")]
        for v in profiled:
            cat = (v.profile.get("categories") or {}).get(name)
            row.append(DASH_TEXT if not isinstance(cat, dict) else "absent" if cat.get("pct") is None else f"{cat['pct']:.1f}%")
        rows.append(row)
    rows.append(["device ms per step", *(fmt_num((v.profile.get("totals") or {}).get("ms_per_step"), 3) for v in profiled)])
    return Table(title="device time by category per batch size", kind="profile-batches",
                 sources=tuple(v.name for v in profiled),
                 header=["category", *(f"B = {v.figures['batch']} ({v.label})" for v in profiled)], rows=rows,
                 notes=["% of device (kernel) time over the profiled decode steps (`bench profile --batch B`); at "
                        "B = 1 every matrix product is a matrix-vector product, which no tensor core runs."])


ROWS_PER_STEP = RowColumn(key="batch", header="batch", align="right",
                          get=lambda k: ", ".join(f"{b:,}" for b in k.rows_per_step))
"""The runs table's batch: the rows per decode step the run measured (`RunKeys.rows_per_step`: a `--batch`
sweep's sizes, a profile-only run's `--batch`), not the engine's recorded batch, which is 1 for both."""
RUN_COLUMNS: tuple[RowColumn, ...] = (*columns("device", "date", "build_id", "backend"), ROWS_PER_STEP,
                                      *columns("concurrency", "host", "run"))
"""The runs table's columns: the long format's key columns (bench/report/rows.py), batch as `ROWS_PER_STEP`."""


def runs_table(group: Group) -> Table:
    """The group's selected runs, one line each (`RUN_COLUMNS`), by date; the last `MAX_ROWS` when more."""
    views = sorted(group.views, key=lambda v: (group.keys[v.name].started_at or "", v.name))
    shown = views[-MAX_ROWS:]
    rows = [[c.key_text(group.keys[v.name]) for c in RUN_COLUMNS] for v in shown]
    notes = [f"{len(views) - len(shown)} earlier run(s) left out here; rows.csv holds them all."] if shown != views else []
    return Table(title=f"{group.gid} runs", header=[c.header for c in RUN_COLUMNS], rows=rows, notes=notes, kind="runs",
                 sources=tuple(v.name for v in shown))


def _sizes(views: Sequence[Any]) -> list[int]:
    sizes = sorted({s for v in views for s in v.cells})
    return sizes[:MAX_SIZES]


def axis_series(group: Group, axis: str) -> dict[str, list[Any]]:
    """{device: runs} for the view against `axis` ("batch" or "concurrency"): per device the latest selected run
    per value of `axis`, the other axis at its smallest value for that device, sorted by `axis`; a device with
    one value of `axis` is left out. {} when the group holds one value of `axis` in all."""
    if len(group.axis_values(axis)) < 2:
        return {}
    other = "concurrency" if axis == "batch" else "batch"
    out = {}
    for device in group.axis_values("device"):
        runs = [v for v in group.views if group.keys[v.name].device == device]
        low = _base(group, other, runs)
        latest: dict[Any, Any] = {}
        for v in sorted(runs, key=lambda v: (group.keys[v.name].started_at or "", v.name)):
            if getattr(group.keys[v.name], other) == low:
                latest[getattr(group.keys[v.name], axis)] = v
        if len(latest) > 1:
            out[device] = [latest[x] for x in sorted(latest)]
    return out


def axis_tables(group: Group, axis: str) -> list[Table]:
    """Per device: rows by `axis` value, gauge and end-to-end tok/s per input size across (`axis_series`)."""
    out = []
    for device, runs in axis_series(group, axis).items():
        sizes = _sizes(runs)
        header = [axis] + [f"{s:,} {m}" for s in sizes for m in ("gauge", "e2e")]
        rows = [[fmt_num(getattr(group.keys[v.name], axis), 0)]
                + [rate_text(v.cells.get(s), m) for s in sizes for m in ("gauge", "e2e")] for v in runs]  # fmt: skip
        notes = [f"tok/s as the runs' cells record them, at {', '.join(f'{s:,}' for s in sizes)} input tokens; "
                 f"one run per {axis} value (the latest)."]  # fmt: skip
        out.append(Table(title=f"{group.gid}, {device}: against {axis}", header=header, rows=rows, notes=notes,
                         kind=axis, sources=tuple(v.name for v in runs)))  # fmt: skip
    return out


def history_series(group: Group) -> dict[str, list[Any]]:
    """{"DEVICE, batch B, concurrency C": runs of the pool in time order} for each such configuration of the
    group with at least two runs."""
    series: dict[str, list[Any]] = {}
    for v in group.pool:
        k = group.keys[v.name]
        if v.cells:
            series.setdefault(f"{k.device}, batch {k.batch}, concurrency {k.concurrency}", []).append(v)
    return {name: runs for name, runs in series.items() if len(runs) > 1}


def history_tables(group: Group) -> list[Table]:
    """One table per `history_series`: date (marked "(incomplete)" for an interrupted run), build, host (the
    manifest's host description, else its CPU model), then each input size's median gauge (min–max), oldest
    first."""
    out = []
    for name, runs in history_series(group).items():
        shown = runs[-MAX_HISTORY_ROWS:]
        sizes = _sizes(shown)[:MAX_COLUMNS - 3]
        header = ["date", "build", "host"] + [f"{s:,} gauge" for s in sizes]
        rows = [[(group.keys[v.name].date or "—") + (" (incomplete)" if v.incomplete else ""),
                 group.keys[v.name].build_id or "—", group.keys[v.name].host or "—"]
                + [rate_text(v.cells.get(s), "gauge") for s in sizes] for v in shown]  # fmt: skip
        notes = ["decode gauge tok/s, median (min–max) over each run's timed repeats; ✗ an invalid cell."]
        if any(v.incomplete for v in shown):
            notes.append("(incomplete): an interrupted run; its finished cells are shown, its unfinished ones as —.")
        if len(shown) < len(runs):
            notes.append(f"{len(runs) - len(shown)} earlier run(s) left out here; rows.csv holds them all.")
        out.append(Table(title=f"{group.gid} history: {name}", header=header, rows=rows, notes=notes, kind="history",
                         sources=tuple(v.name for v in shown)))
    return out
