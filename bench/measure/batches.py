"""The figures of a batch cell that are arithmetic on measured ones (docs/method.md, "Batches").

- aggregate throughput: all rows' tokens after the first / decode time = B x the per-sequence gauge (rows in
  lockstep share one decode time);
- arithmetic intensity: FLOPs of one decode step / bytes one step reads (`model.flops.decode_flops`,
  `model.engine.Engine.decode_bytes(..., batch=B)`: the weights once plus every row's KV cache);
- the knee: the smallest B whose median step time exceeds B = 1's by more than a stated fraction: beyond it a step
  no longer costs about the same as reading the weights once, i.e. decode has left the bandwidth roofline.
`knees` applies `knee` to the cells of a `--batch` sweep, per input size (what the sweep table, the gpu-run summary
and the report print under their tables). Pure functions on Python numbers: no jax, no engine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

KNEE_FRACTION = 0.25
"""The default fraction for `knee`: a step 25% slower than at B = 1. A stated choice, not a measured constant."""


def aggregate_tok_s(sequence_tok_s: float, batch: int) -> float:
    """Aggregate throughput (tok/s) of `batch` rows in lockstep, each at the per-sequence gauge `sequence_tok_s`.
    Raises ValueError for a batch below 1 or a rate that is not finite and >= 0."""
    if batch < 1 or not (math.isfinite(sequence_tok_s) and sequence_tok_s >= 0):
        raise ValueError(f"aggregate_tok_s: batch {batch} must be >= 1, rate {sequence_tok_s} finite and >= 0")
    return batch * sequence_tok_s


def arithmetic_intensity(flops_per_step: int, bytes_per_step: int) -> float:
    """FLOPs per byte of one decode step. Raises ValueError for bytes_per_step below 1 or negative FLOPs."""
    if bytes_per_step < 1 or flops_per_step < 0:
        raise ValueError(f"arithmetic_intensity: bytes {bytes_per_step} must be >= 1, FLOPs {flops_per_step} >= 0")
    return flops_per_step / bytes_per_step


def knee(step_ms_by_batch: Mapping[int, float], fraction: float = KNEE_FRACTION) -> int | None:
    """The smallest batch B > 1 whose median step time (ms) exceeds B = 1's by more than `fraction`
    (step_ms[B] > (1 + fraction) x step_ms[1]); None when no batch does (decode stayed bound by reading the
    weights over the measured batches). Raises ValueError without a B = 1 entry, for a fraction not > 0, or a
    step time that is not finite and > 0."""
    if 1 not in step_ms_by_batch:
        raise ValueError(f"knee: needs the B = 1 step time, got batches {sorted(step_ms_by_batch)}")
    if not (math.isfinite(fraction) and fraction > 0):
        raise ValueError(f"knee: fraction must be finite and > 0, got {fraction}")
    bad = {b: t for b, t in step_ms_by_batch.items() if not (math.isfinite(t) and t > 0)}
    if bad:
        raise ValueError(f"knee: step times must be finite and > 0 ms, got {bad}")
    limit = (1 + fraction) * step_ms_by_batch[1]
    return next((b for b in sorted(step_ms_by_batch) if b > 1 and step_ms_by_batch[b] > limit), None)


@dataclasses.dataclass(frozen=True)
class Knee:
    """The knee of one input size of a `--batch` sweep (`knees`): `step_ms` the median decode step (ms) of each
    valid batch cell, by B; `fraction` the stated fraction; `batch` the knee (`knee`), None when no batch passed
    it or it could not be computed (`note` says why: no valid B = 1 cell)."""

    input_tokens: int
    step_ms: dict[int, float]
    fraction: float
    batch: int | None
    note: str | None = None

    @property
    def line(self) -> str:
        """One line for a person: the knee (or none) with the step times it was decided from."""
        steps = ", ".join(f"B={b}: {t:,.2f}" for b, t in sorted(self.step_ms.items()))
        head = f"{self.input_tokens:,} input tokens: "
        if self.note is not None:
            return head + f"knee not computed ({self.note}); step ms {steps or 'none'}"
        base, top = self.step_ms[1], max(self.step_ms)
        if self.batch is None:
            return (head + f"no knee up to B = {top} (step {100 * (self.step_ms[top] / base - 1):+.0f}% over B = 1, "
                    f"within {100 * self.fraction:.0f}%): decode stayed bound by reading the weights; step ms {steps}")
        grown = 100 * (self.step_ms[self.batch] / base - 1)
        return (head + f"knee at B = {self.batch} (step {self.step_ms[self.batch]:,.2f} ms vs {base:,.2f} ms at B = 1, "
                f"{grown:+.0f}% > {100 * self.fraction:.0f}%); step ms {steps}")


def step_of(row: Any) -> float | None:
    """The median decode step (ms) of a cell row (`bench.runs.CellRow`) the knee uses: the host loop's pooled
    per-step median (`step_ms_median`), else the device loop's ms per step (a sweep of the device loop alone)."""
    return row.step_ms_median if row.step_ms_median is not None else row.device_step_ms_median


def knees(rows: Iterable[Any], fraction: float = KNEE_FRACTION) -> list[Knee]:
    """Per input size of the `--batch` cells among `rows` (`bench.runs.CellRow`s whose `batch` is set), in order:
    its `Knee` from the valid cells' step times (`step_of`). [] when no row has a batch. Raises ValueError for a
    fraction that is not finite and > 0 (as `knee`)."""
    by_size: dict[int, dict[int, float]] = {}
    for r in rows:
        if r.batch is None:
            continue
        steps = by_size.setdefault(r.input_tokens, {})
        step = step_of(r)
        if r.valid and r.status == "ok" and step is not None and step > 0:
            steps[r.batch] = step
    out = []
    for n, steps in sorted(by_size.items()):
        if 1 not in steps:
            out.append(Knee(n, steps, fraction, None, "no valid B = 1 cell to compare with"))
        else:
            out.append(Knee(n, steps, fraction, knee(steps, fraction)))
    return out
