"""The device's measured rates for one in-process sweep, and the roofline fields they give each cell row
(docs/method.md, "Rooflines").

An in-process sweep measures its rates once, on the live device, after the engine is loaded and before its first
cell (`measure_rates`), and records them in the run manifest under `RATES_KEY`:
- `copy_bandwidth`: `bench.profile.bandwidth.measure_bandwidth` (bytes read + written / median time of a large
  donated device-to-device copy), bytes/s;
- `read_bandwidth`: the fastest of `bench.profile.bandwidth.measure_read_probes` (bytes read / median time of a
  read-only pass over a buffer of the copy's size: XLA's reduction, and on a TPU the Pallas streaming read),
  bytes/s; `read_probes`: every one of them, the fastest included; runs recorded before the Pallas probe have only
  XLA's, and runs before that none;
- `ceiling` (`bench.runs.ceiling.CEILING_KEY`): the roofline's denominator, max(the fastest read, the device's
  datasheet figure where `bench.runs.ceiling.DATASHEETS` has one), with both figures and which was chosen;
- `matmul`: `bench.profile.matmul.measure_matmul_rate` (a jitted [M,K]x[K,N] product in the policy's compute
  dtype, 2*M*N*K FLOP / median time), FLOP/s.

Each measured cell row then gets (`with_rooflines`, fields of `bench.runs.CellRow`):
- `bytes_per_step` = `Engine.decode_bytes(n, max_new_tokens)["total"]`: weights + the KV cache read (at the compiled
  shape, or the positions a step sees with the CPU attention kernel: `Engine.decode_positions`);
- `roofline_share_pct` = bytes_per_step x host-loop gauge tok/s (median) / the ceiling x 100, and
  `device_roofline_share_pct` the same with the device loop's gauge, where the cell has one;
- `prefill_flops` (`prefill_flops_of`: `model.flops.prefill_flops` at the cell's compiled shape), `prefill_flop_s` =
  prefill_flops / median prefill time, `prefill_matmul_share_pct` = prefill_flop_s / matmul rate x 100.
`--target` sweeps measure no rates: the server's device is not this process's.

A share above 100% of the ceiling is a finding (`bench.runs.columns.roofline_findings`): printed under the sweep
table and recorded under `RATES_KEY` as `bench.runs.ceiling.FINDINGS_KEY` with the probe's numbers. A run recorded
before the ceiling (no `ceiling` key) keeps its shares against its copy (`bench.runs.ceiling.ceiling_of` says so),
also when it is resumed: one denominator per run.

After its last cell an in-process sweep that was not stopped measures the copy bandwidth again and records it
under `RATES_KEY` as `COPY_END_KEY` (`drift_lines`): how far the host moved while the cells ran. The shares stay against
the start's ceiling (one denominator per run); the end copy says how much of a difference between cells of one
run the host's drift alone could make.

A batch cell (`CellRow.batch` B, `bench sweep --batch`; docs/method.md "Batches"): bytes_per_step =
`Engine.decode_bytes(n, max_new_tokens, batch=B)["total"]` (the weights once plus every row's KV cache), the shares
from the per-sequence gauge (one step per token of every row: bytes per step x steps per second), prefill_flops
B x one row's. `batch_rows` adds `flops_per_step` (`model.flops.decode_flops` of B rows) and `arithmetic_intensity`
= flops_per_step / bytes_per_step to every row of a `--batch` sweep, B = 1 included (with or without rates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from bench.runs.ceiling import CEILING_KEY, Ceiling, ceiling_of, roofline_ceiling, share_pct
from bench.runs.manifest import COPY_END_KEY, RATES_KEY, drift_pct, read_bandwidth_of
from bench.runs.records import CellRow


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceRates:
    """The rates a sweep's rows are divided by: `ceiling` (the roofline's denominator, `bench.runs.ceiling.Ceiling`)
    and `matmul_flop_s` (FLOP/s); beside them `bandwidth_bytes_s` (bytes/s, the device copy's read + written bytes
    per second: the drift check's reference, and the denominator of runs recorded before the ceiling) and
    `read_bandwidth_bytes_s` (bytes/s, the fastest read-only probe; None for a run recorded before it was
    measured). `measured` holds the measurements as the manifest records them (`{"copy_bandwidth":
    BandwidthResult.to_json(), "read_bandwidth": the fastest probe's, "read_probes": [every read probe's],
    "matmul": MatmulRateResult.to_json(), "ceiling": Ceiling.to_json()}`)."""

    bandwidth_bytes_s: float
    matmul_flop_s: float
    measured: Mapping[str, Any]
    ceiling: Ceiling
    read_bandwidth_bytes_s: float | None = None

    @property
    def line(self) -> str:
        """One line for a person: the ceiling and the figures it was chosen from, the copy and the matrix-product
        rate, in GiB/s and GFLOP/s, and how they were measured."""
        bw, mm = self.measured["copy_bandwidth"], self.measured["matmul"]
        return (f"device rates: {self.ceiling.line}; copy bandwidth {self.bandwidth_bytes_s / 2**30:,.2f} GiB/s "
                f"({bw['n_bytes'] / 2**20:,.0f} MiB device copy), matrix product "
                f"{self.matmul_flop_s / 1e9:,.1f} GFLOP/s ({mm['m']}x{mm['k']}x{mm['n']} {mm['dtype']})")  # fmt: skip


def measure_rates(compute_dtype: str, *, device=None) -> DeviceRates:
    """Measure the copy bandwidth, the read-only probes (`measure_read_probes`: XLA's reduction, and on a TPU the
    Pallas streaming read), the matrix-product rate (in `compute_dtype`, e.g. "float32") on `device` (default:
    jax's first device, where the engine lives), and the ceiling they give. Imports jax; about 3 s on a 2-core
    CPU."""
    from bench.profile.bandwidth import measure_bandwidth, measure_read_probes
    from bench.profile.matmul import measure_matmul_rate

    bw = measure_bandwidth(device=device)
    reads = measure_read_probes(device=device)
    mm = measure_matmul_rate(dtype=compute_dtype, device=device)
    fastest = reads.fastest
    ceiling = roofline_ceiling(fastest.bytes_per_s, fastest.method, fastest.device_kind, copy_bytes_s=bw.bytes_per_s)
    return DeviceRates(bandwidth_bytes_s=bw.bytes_per_s, matmul_flop_s=mm.flop_s, ceiling=ceiling,
                       read_bandwidth_bytes_s=fastest.bytes_per_s,
                       measured={"copy_bandwidth": bw.to_json(), "read_bandwidth": fastest.to_json(),
                                 "read_probes": reads.to_json(), "matmul": mm.to_json(),
                                 CEILING_KEY: ceiling.to_json()})  # fmt: skip


DRIFT_WARN_PCT = 10.0
"""A sweep warns when its copy bandwidth at the end differs from the start's by more than this (percent). On the
2-core Xeon this project was built on, the copy measured 18.8-22.0 GiB/s at the starts of set 9's sweeps within
about an hour (README, set 9), and the changes such sets compared were 5-10%."""


def drift_lines(start_bytes_s: float, end_bytes_s: float) -> tuple[str, str | None]:
    """(the run.log line of the copy bandwidth measured after the last cell against the start's, in GiB/s and
    `bench.runs.manifest.drift_pct`; a warning line when the drift exceeds `DRIFT_WARN_PCT` either way, else
    None). Bytes/s in."""
    drift = drift_pct(start_bytes_s, end_bytes_s)
    line = (f"device copy bandwidth after the last cell: {end_bytes_s / 2**30:,.2f} GiB/s, {drift:+.1f}% against the "
            f"{start_bytes_s / 2**30:,.2f} GiB/s measured before the first cell")  # fmt: skip
    if abs(drift) <= DRIFT_WARN_PCT:
        return line, None
    return line, (f"warning: the copy bandwidth moved {drift:+.1f}% while the cells ran: this host drifted, so cells "
                  "of this run and runs of another hour differ by that much with nothing changed; compare builds "
                  "paired in one session, as ratios (docs/method.md, Comparisons)")  # fmt: skip


def rates_of(extra: Mapping[str, Any]) -> DeviceRates | None:
    """The rates a run manifest's `extra` records under `RATES_KEY`; None when it has none (an older run) or the
    copy bandwidth and matrix-product rate are not positive numbers. The read-only bandwidth is None where the run
    has none (recorded before it was measured) or it is not a positive number; the ceiling is
    `bench.runs.ceiling.ceiling_of`'s (the copy, for a run recorded before the ceiling: one denominator per run)."""
    measured = extra.get(RATES_KEY)
    try:
        bw, mm = float(measured["copy_bandwidth"]["bytes_per_s"]), float(measured["matmul"]["flop_s"])
    except (TypeError, KeyError, ValueError):
        return None
    if not (bw > 0 and mm > 0):
        return None
    ceiling = ceiling_of(extra)
    if ceiling is None:
        return None
    return DeviceRates(bandwidth_bytes_s=bw, matmul_flop_s=mm, measured=measured, ceiling=ceiling,
                       read_bandwidth_bytes_s=read_bandwidth_of(extra))  # fmt: skip


def with_rooflines(row: CellRow, *, bytes_per_step: int, prefill_flops: int | None, rates: DeviceRates) -> CellRow:
    """`row` with its roofline fields (module docstring): each None where its inputs are (no gauge, no device
    loop, no prefill time, no FLOP count). A failed cell is returned as it is. Pure arithmetic."""
    if row.status == "failed":
        return row

    def share(tok_s: float | None) -> float | None:
        return None if tok_s is None else share_pct(bytes_per_step, tok_s, rates.ceiling.bytes_per_s)

    flop_s = prefill_flops / (row.prefill_ms_median / 1000.0) if prefill_flops and row.prefill_ms_median else None
    return dataclasses.replace(
        row, bytes_per_step=bytes_per_step, roofline_share_pct=share(row.gauge_tok_s_median),
        device_roofline_share_pct=share(row.device_gauge_tok_s_median), prefill_flops=prefill_flops,
        prefill_flop_s=flop_s, prefill_matmul_share_pct=None if flop_s is None else 100.0 * flop_s / rates.matmul_flop_s,
    )  # fmt: skip


def roofline_rows(engine, rates: DeviceRates, max_new_tokens: int) -> Callable[[CellRow], CellRow]:
    """The function that gives a cell row of `engine` (at `max_new_tokens`) its roofline fields: bytes per step
    from `engine.decode_bytes`, prefill FLOP from `model.flops` (`prefill_flops_of`)."""

    def finish(row: CellRow) -> CellRow:
        n, b = row.input_tokens, row.batch or 1
        return with_rooflines(row, bytes_per_step=engine.decode_bytes(n, max_new_tokens, batch=b)["total"],
                              prefill_flops=b * prefill_flops_of(engine, n, max_new_tokens), rates=rates)  # fmt: skip

    return finish


def with_batch_figures(row: CellRow, *, flops_per_step: int, bytes_per_step: int) -> CellRow:
    """`row` with `flops_per_step` and `arithmetic_intensity` (FLOP/byte, `bench.measure.batches`); a failed cell
    is returned as it is. Pure arithmetic."""
    from bench.measure.batches import arithmetic_intensity

    if row.status == "failed":
        return row
    return dataclasses.replace(row, flops_per_step=flops_per_step,
                               arithmetic_intensity=arithmetic_intensity(flops_per_step, bytes_per_step))  # fmt: skip


def batch_rows(engine, max_new_tokens: int) -> Callable[[CellRow], CellRow]:
    """The function that gives a `--batch` sweep's row of `engine` its batch figures (`with_batch_figures`): the
    FLOPs of one decode step of B rows over the cache positions its attention reads (`model.flops.decode_flops`
    over `Engine.decode_positions`: bucket + max_new_tokens slots, or the visible ones with the CPU attention
    kernel) and the bytes it reads (`Engine.decode_bytes(..., batch=B)`)."""
    from model.flops import decode_flops

    def finish(row: CellRow) -> CellRow:
        n, b = row.input_tokens, row.batch or 1
        positions = engine.decode_positions(n, max_new_tokens)
        return with_batch_figures(row, flops_per_step=int(decode_flops(engine.cfg, positions, b)),
                                  bytes_per_step=engine.decode_bytes(n, max_new_tokens, batch=b)["total"])  # fmt: skip

    return finish


def prefill_flops_of(engine, n_tokens: int, max_new_tokens: int) -> int:
    """Matrix-product FLOP of `engine`'s chunked prefill of `n_tokens` real positions at its compiled shape:
    `model.flops.prefill_flops(cfg, n, C, cache_len=bucket + max_new_tokens, bucket=bucket)` with C =
    `model.flops.prefill_chunk(cfg, bucket)`, the chunk the engine's prefill runs (see model/flops.py for what is
    counted)."""
    from model.flops import prefill_chunk, prefill_flops

    bucket = engine.bucket_for(n_tokens)
    return int(prefill_flops(engine.cfg, n_tokens, prefill_chunk(engine.cfg, bucket),
                             cache_len=bucket + max_new_tokens, bucket=bucket))  # fmt: skip
