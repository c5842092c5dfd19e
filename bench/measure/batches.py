"""The figures of a batch cell that are arithmetic on measured ones (../shared/measurement.md, "Batches").

- aggregate throughput: all rows' tokens after the first / decode time = B x the per-sequence gauge (rows in
  lockstep share one decode time);
- arithmetic intensity: FLOPs of one decode step / bytes one step reads (`model.flops.decode_flops`,
  `model.engine.Engine.decode_bytes(..., batch=B)`: the weights once plus every row's KV cache);
- the knee: the smallest B whose median step time exceeds B = 1's by more than a stated fraction: beyond it a step
  no longer costs about the same as reading the weights once, i.e. decode has left the bandwidth roofline.
Pure functions on Python numbers: no jax, no engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

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
