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
  shape, or the positions a step sees with the CPU attention kernel: `Engine.decode_positions`); for a model with
  experts, the experts per layer the cell's decode steps read (`step_bytes`: the row's measured
  `experts_per_layer_median`, docs/method.md "Bytes that follow the routing"), labelled with the routing that
  chose them (`routing_rows`);
- `roofline_share_pct` = bytes_per_step x host-loop gauge tok/s (median) / the ceiling x 100, and
  `device_roofline_share_pct` the same with the device loop's gauge, where the cell has one;
- `prefill_flops` (`prefill_flops_of`: `model.flops.prefill_flops` at the cell's compiled shape), `prefill_flop_s` =
  prefill_flops / median prefill time, `prefill_matmul_share_pct` = prefill_flop_s / matmul rate x 100.
`--target` sweeps measure no rates: the server's device is not this process's.

A share above 100% of the ceiling is a finding (`bench.runs.columns.roofline_findings`): printed under the sweep
table and recorded under `RATES_KEY` as `bench.runs.ceiling.FINDINGS_KEY` with the probe's numbers. A run recorded
before the ceiling (no `ceiling` key) keeps its shares against its copy (`bench.runs.ceiling.ceiling_of` says so),
also when it is resumed: one denominator per run.

An interleaved sweep (`bench sweep`'s default order; docs/method.md, "Interleaving") measures the rates again
before its first round and after each (`RoundProbes`, recorded under `RATES_KEY` as `PROBES_KEY`): each cell's
shares are divided by the medians of the probes around its repeats (its own ceiling and matrix-product rate, on
its row), and a sweep that was not stopped ends with the host's movement across the probes against the cells'
repeat spread (`host_movement`, `HOST_KEY`), its last probe's copy recorded as `COPY_END_KEY`.

In the sequential order, after its last cell an in-process sweep that was not stopped measures the copy bandwidth
again and records it under `RATES_KEY` as `COPY_END_KEY` (`drift_lines`): how far the host moved while the cells
ran. The shares stay against the start's ceiling (one denominator per run); the end copy says how much of a
difference between cells of one run the host's drift alone could make.

A batch cell (`CellRow.batch` B, `bench sweep --batch`; docs/method.md "Batches"): bytes_per_step =
`Engine.decode_bytes(n, max_new_tokens, batch=B)["total"]` (the weights once plus every row's KV cache), the shares
from the per-sequence gauge (one step per token of every row: bytes per step x steps per second), prefill_flops
B x one row's. `batch_rows` adds `flops_per_step` (`model.flops.decode_flops` of B rows) and `arithmetic_intensity`
= flops_per_step / bytes_per_step to every row of a `--batch` sweep, B = 1 included (with or without rates).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from bench.runs.ceiling import CEILING_KEY, Ceiling, ceiling_of, roofline_ceiling, share_pct
from bench.runs.manifest import COPY_END_KEY, RATES_KEY, drift_pct, read_bandwidth_of
from bench.runs.records import CellRow, cell_key


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
    this process's first device, `jax.local_devices()[0]`, where the engine lives; under jax.distributed each
    process measures its own), and the ceiling they give. Imports jax; about 3 s on a 2-core CPU."""
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


def roofline_rows(engine, rates: DeviceRates, max_new_tokens: int, *,
                  probes: RoundProbes | None = None) -> Callable[[CellRow], CellRow]:  # fmt: skip
    """The function that gives a cell row of `engine` (at `max_new_tokens`) its roofline fields: bytes per step
    from `bench.engines.step_read_bytes` (`engine.decode_bytes`; under a mesh the slowest device's), prefill FLOP from `model.flops` (`prefill_flops_of`). With `probes` (an
    interleaved sweep's, `RoundProbes`) a row whose cell has probes is divided by their rates (`rates_for`) and
    records them (`RoundProbes.fields`); `rates` (the sweep's start) otherwise."""

    from bench.engines import step_read_bytes

    def finish(row: CellRow) -> CellRow:
        n, b = row.input_tokens, row.batch or 1
        own = probes.rates_for(cell_key(row)) if probes is not None else None
        row = with_rooflines(row, bytes_per_step=step_bytes(engine, row, max_new_tokens),
                             prefill_flops=b * prefill_flops_of(engine, n, max_new_tokens),
                             rates=own or rates)  # fmt: skip
        return probes.fields(row, own) if own is not None and row.status != "failed" else row

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
                                  bytes_per_step=step_bytes(engine, row, max_new_tokens))  # fmt: skip

    return finish


def step_bytes(engine, row: CellRow, max_new_tokens: int) -> int:
    """Bytes one decode step of `row`'s cell reads (the rooflines' numerator): `Engine.decode_bytes(n,
    max_new_tokens, batch=B)["total"]`, with the experts the cell's steps read where it recorded them
    (`CellRow.experts_per_layer_median`, a model with experts: docs/method.md, "Bytes that follow the routing"),
    else the engine's estimate (top_k experts per layer; none without experts); under a mesh the slowest device's
    (`bench.engines.step_read_bytes`, whose experts per device stay the placement's estimate)."""
    from bench.engines import step_read_bytes

    return step_read_bytes(engine, row.input_tokens, max_new_tokens, batch=row.batch or 1,
                           experts=row.experts_per_layer_median)["total"]  # fmt: skip


def routing_rows(engine) -> Callable[[CellRow], CellRow]:
    """The function that labels a row of `engine` (a model with experts) that recorded its experts read with how
    they were chosen (`CellRow.expert_routing`: the engine config's "router", or "balanced" for dummy weights with
    the balanced routing, `model.moe.ROUTINGS`); other rows are returned as they are."""

    def finish(row: CellRow) -> CellRow:
        if row.experts_read_steps is None:
            return row
        return dataclasses.replace(row, expert_routing=engine.cfg.expert_routing)

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


# ---- an interleaved sweep's probes between rounds (docs/method.md, "Interleaving") ------------------------------
PROBES_KEY = "probes"
"""The key, under the run manifest's `RATES_KEY`, of an interleaved sweep's rate probes (`RoundProbes`)."""
HOST_KEY = "host_movement"
"""The key, under the run manifest's `RATES_KEY`, of how far the probes moved against the cells' spread
(`host_movement`), written when an interleaved sweep ends without a stop."""


PROBE_SPACING = 10.0
"""An interleaved sweep probes after a round only once this many times the previous probe's own time has passed
since it (and always before the first round and after the last), so that probes take at most about 1/10 of the
sweep: every round of the default sweep (about 27 s on a quiet 2-core CPU, a probe 1.5 s), every few of a sweep
of one small cell and many repeats."""


def host_load() -> float | None:
    """The host's 1-minute load average (`os.getloadavg`: runnable processes, whoever runs them), None where the
    platform has none. Recorded with each rate probe (`RoundProbes`): a rerun interval stated at one load held
    poorly at another (a fresh clone's sweep at load 3.4-3.8 read 33 tok/s where two sweeps an hour before at
    1.6-2.1 read 52-54, 2026-12-08), so a run says what load it was measured under."""
    import os

    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


class RoundProbes:
    """The rate probes of an interleaved in-process sweep, one before its first round, one after a round once
    `PROBE_SPACING` allows, and one after the last (`bench.sweep.local.sweep_cells`' `probe`), each a `measure`
    (`measure_rates`: the copy, the read probes, the matrix product). Each is recorded in the run manifest under `RATES_KEY` -> `PROBES_KEY` as it is taken:
    {"session": this process's number among the run's (0 for the first; each resume adds one), "after_round": r
    (0: before the first round), "cells": [[n, B], ...] (the cells that measured a timed repeat since the probe
    before), "at"
    (ISO time), "load_1m" (`host_load`), "seconds" (the probe's own wall time: its cost to the sweep), "copy_bytes_s", "read_bytes_s",
    "read_probe", "matmul_flop_s", "copy_bandwidth" (the copy's `BandwidthResult.to_json()`)}; a probe that raises
    is recorded
    with its "error" instead of figures and logged: it never stops the sweep.

    A cell's probes (`around`) are those next to a round in which it measured a timed repeat, in every session of
    the run: the one before that round and the one after it. Its rates (`rates_for`) are their medians: the read
    rate gives its ceiling (`bench.runs.ceiling.roofline_ceiling`: max(read, datasheet)), the matrix product its
    prefill share's denominator; `fields` records them with their min and max on its row."""

    def __init__(self, run, measure: Callable[[], DeviceRates], start: DeviceRates,
                 log: Callable[[str], None] = lambda _: None):  # fmt: skip
        self._run, self._measure, self._start, self._log = run, measure, start, log
        self.records: list[dict[str, Any]] = list((run.manifest.get(RATES_KEY) or {}).get(PROBES_KEY) or [])
        self.session = 1 + max((int(p.get("session", 0)) for p in self.records), default=-1)
        self._pending: list[tuple[int, int]] = []  # cells measured since the last probe
        self._last_at, self._last_s = 0.0, 0.0  # when the last probe ended, and how long it took (perf_counter s)

    def __call__(self, after_round: int, cells: list[tuple[int, int]], *, last: bool = False) -> None:
        """Measure now, before the first round (`after_round` 0), at the end (`last`: when a round is not measured
        yet), or after a round once `PROBE_SPACING` x the previous probe's time has passed since it; otherwise
        keep the round's `cells` for the next probe (each probe records every cell measured since the one before)."""
        from bench.runs import now_iso

        self._pending.extend(k for k in cells if k not in self._pending)
        if last and not self._pending:
            return
        spaced = time.perf_counter() - self._last_at >= PROBE_SPACING * self._last_s
        if not (after_round == 0 or last or spaced):
            return
        record: dict[str, Any] = {"session": self.session, "after_round": after_round,
                                  "cells": [list(k) for k in self._pending], "at": now_iso(), "load_1m": host_load()}  # fmt: skip
        self._pending = []
        t0 = time.perf_counter()
        try:
            rates = self._measure()
            record["seconds"] = time.perf_counter() - t0  # what the probe cost the sweep
            record.update(copy_bytes_s=rates.bandwidth_bytes_s, read_bytes_s=rates.read_bandwidth_bytes_s,
                          read_probe=rates.ceiling.read_probe, matmul_flop_s=rates.matmul_flop_s,
                          copy_bandwidth=rates.measured.get("copy_bandwidth"))  # fmt: skip
            self._log(f"rate probe {'before round 1' if after_round == 0 else f'after round {after_round}'}: copy "
                      f"{rates.bandwidth_bytes_s / 2**30:,.2f} GiB/s, read {_gib(rates.read_bandwidth_bytes_s)}, "
                      f"matrix product {rates.matmul_flop_s / 1e9:,.1f} GFLOP/s"
                      + ("" if record["load_1m"] is None else f", host load {record['load_1m']:.2f}"))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 -- a probe is context: it must not stop the sweep
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
            self._log(f"rate probe after round {after_round} failed ({record['error']})")
        self._last_at, self._last_s = time.perf_counter(), time.perf_counter() - t0
        self.records.append(record)
        self._update(**{PROBES_KEY: self.records})

    def _update(self, **fields: Any) -> None:
        recorded = self._run.manifest.get(RATES_KEY) or dict(self._start.measured)
        self._run.update_manifest(**{RATES_KEY: {**recorded, **fields}})

    def around(self, key: tuple[int, int]) -> list[dict[str, Any]]:
        """The probes next to the rounds in which cell `key` ((input tokens, batch)) measured a timed repeat, in
        every session of the run, oldest first; only those with figures (no "error")."""
        out = []
        for session in sorted({p.get("session", 0) for p in self.records}):
            ps = sorted((p for p in self.records if p.get("session", 0) == session), key=lambda p: p["after_round"])
            for i, p in enumerate(ps):
                nearby = [p] + ps[i + 1 : i + 2]  # the round before this probe, and the round after it
                if any(list(key) in q.get("cells", []) for q in nearby) and "error" not in p:
                    out.append(p)
        return out

    def rates_for(self, key: tuple[int, int]) -> DeviceRates | None:
        """Cell `key`'s rates from the medians of its probes (`around`); None when it has none."""
        import statistics

        probes = self.around(key)
        reads = [p["read_bytes_s"] for p in probes if p.get("read_bytes_s")]
        if not probes or not reads:
            return None
        copy, read = statistics.median(p["copy_bytes_s"] for p in probes), statistics.median(reads)
        matmul = statistics.median(p["matmul_flop_s"] for p in probes)
        ceiling = roofline_ceiling(read, probes[-1].get("read_probe"), self._start.ceiling.device_kind,
                                   copy_bytes_s=copy)  # fmt: skip
        return DeviceRates(bandwidth_bytes_s=copy, matmul_flop_s=matmul, ceiling=ceiling, read_bandwidth_bytes_s=read,
                           measured={"probes": probes, CEILING_KEY: ceiling.to_json()})  # fmt: skip

    def fields(self, row: CellRow, rates: DeviceRates) -> CellRow:
        """`row` with its probes' figures (`CellRow`: `rate_probes`, the read rate's and the matrix product's
        median, min and max over its probes, and `ceiling_bytes_s`, the denominator its shares used)."""
        probes = self.around(cell_key(row))
        reads = [p["read_bytes_s"] for p in probes if p.get("read_bytes_s")]
        matmuls = [p["matmul_flop_s"] for p in probes]
        return dataclasses.replace(
            row, rate_probes=len(probes), probe_read_bytes_s_median=rates.read_bandwidth_bytes_s,
            probe_read_bytes_s_min=min(reads), probe_read_bytes_s_max=max(reads),
            probe_matmul_flop_s_median=rates.matmul_flop_s, probe_matmul_flop_s_min=min(matmuls),
            probe_matmul_flop_s_max=max(matmuls), ceiling_bytes_s=rates.ceiling.bytes_per_s,
        )  # fmt: skip

    def finish(self, rows: list[CellRow]) -> tuple[list[str], str | None]:
        """After the last round of a sweep that was not stopped: the host's movement across this session's probes
        against the cells' spread (`host_movement`), recorded under `RATES_KEY` as `HOST_KEY`, with the last probe's
        copy as `bench.runs.manifest.COPY_END_KEY` (the report's and compare's drift notes read it). Returns
        (the lines to log, a warning line or None)."""
        mine = [p for p in self.records if p.get("session", 0) == self.session and "error" not in p]
        moved = host_movement(mine, rows)
        fields: dict[str, Any] = {HOST_KEY: moved.to_json()} if moved is not None else {}
        if mine and mine[-1].get("copy_bandwidth"):
            fields[COPY_END_KEY] = mine[-1]["copy_bandwidth"]  # the copy's BandwidthResult, as a sequential end's
        if fields:
            self._update(**fields)
        if moved is None:
            return [], None
        return [moved.line], moved.warning


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostMovement:
    """How far the host moved across an interleaved sweep's probes, against the spread of its cells
    (docs/method.md, "Interleaving"). `probes`: how many; `copy_pct`, `read_pct`, `matmul_pct`: each figure's
    (max - min) / median x 100 over them (None where fewer than 2 have it); `moved_pct` the largest of the three,
    `figure` its name. `cells_spread_pct`: the median over the cells' gauges (either loop) of their repeat spread
    (`CellRow.gauge_spread_pct`, `device_gauge_spread_pct`); `largest_spread_pct` the largest, of `largest_cell`.
    `moved_more`: moved_pct > cells_spread_pct."""

    probes: int
    copy_pct: float | None
    read_pct: float | None
    matmul_pct: float | None
    moved_pct: float
    figure: str
    cells_spread_pct: float
    largest_spread_pct: float
    largest_cell: str

    @property
    def moved_more(self) -> bool:
        return self.moved_pct > self.cells_spread_pct

    @property
    def line(self) -> str:
        def pct(v: float | None) -> str:
            return "—" if v is None else f"{v:.1f}%"

        return (f"host movement across the sweep's {self.probes} rate probes (max - min over median): copy "
                f"{pct(self.copy_pct)}, read {pct(self.read_pct)}, matrix product {pct(self.matmul_pct)}; the cells' "
                f"repeat spread: median {self.cells_spread_pct:.1f}%, largest {self.largest_spread_pct:.1f}% (cell "
                f"{self.largest_cell})")  # fmt: skip

    @property
    def warning(self) -> str | None:
        if not self.moved_more:
            return None
        return (f"warning: the host moved more than the cells' spread: the {self.figure} probe {self.moved_pct:.1f}% "
                f"across the sweep, the cells' repeat spread {self.cells_spread_pct:.1f}% (median): the cells' "
                "within-sweep intervals may not hold for a run of another hour (their rerun intervals, below, widen "
                "them); compare builds paired in one session, as ratios (docs/method.md, Interleaving)")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "moved_more": self.moved_more}


def host_movement(probes: list[Mapping[str, Any]], rows: list[CellRow]) -> HostMovement | None:
    """`HostMovement` of `probes` (`RoundProbes` records with figures) against the repeat spreads of `rows`; None
    with fewer than 2 probes or no row with a spread. Pure arithmetic."""
    import statistics

    def moved(key: str) -> float | None:
        xs = [float(p[key]) for p in probes if p.get(key)]
        return 100.0 * (max(xs) - min(xs)) / statistics.median(xs) if len(xs) >= 2 else None

    figures = {"copy": moved("copy_bytes_s"), "read": moved("read_bytes_s"), "matrix product": moved("matmul_flop_s")}
    spreads = [(v, r) for r in rows if r.valid for v in (r.gauge_spread_pct, r.device_gauge_spread_pct)
               if v is not None]  # fmt: skip
    known = {k: v for k, v in figures.items() if v is not None}
    if not known or not spreads:
        return None
    figure = max(known, key=known.get)
    largest, cell = max(spreads, key=lambda vr: vr[0])
    name = str(cell.input_tokens) if cell.batch is None else f"{cell.input_tokens}x{cell.batch}"
    return HostMovement(probes=len(probes), copy_pct=figures["copy"], read_pct=figures["read"],
                        matmul_pct=figures["matrix product"], moved_pct=known[figure], figure=figure,
                        cells_spread_pct=statistics.median(v for v, _ in spreads), largest_spread_pct=largest,
                        largest_cell=name)  # fmt: skip


def _gib(bytes_s: float | None) -> str:
    return "none" if not bytes_s else f"{bytes_s / 2**30:,.2f} GiB/s"
