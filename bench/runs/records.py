"""The typed records a run folder stores: `CellRow` (one per input size) and `Sample` (one per request); for a
sweep under load (`bench sweep --target URL --concurrency ...`), `LoadRow` (one per load level: input size x
concurrency x request rate) and `LoadSample` (one per request of a level).

`summarize_cell` turns one input size's raw samples into its `CellRow`, following `docs/method.md`
("Per request", "Per cell"); `failed_cell` records a cell that could not be measured; `summarize_level` and
`failed_level` do the same for a load level ("Serving under load"). `row_problems` checks a parsed JSON object
against a record's fields and types (the run-folder validator uses it).

Units: times in ms (except `cold_request_s`, seconds), rates in tok/s, ratios unitless (cold / warm median).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from bench.errors import RunFolderError

SAMPLE_KINDS = ("cold", "cold-resume", "warmup", "timed", "warmup-device", "timed-device")
LOOP_KINDS = {"host": ("warmup", "timed"), "device": ("warmup-device", "timed-device")}
"""Per decode loop (`model.engine.DECODE_LOOPS`), the kinds of its warm-up and timed requests: a sample's kind
says which loop ran it (a cold request runs the sweep's first loop, which the manifest's workload names)."""
CELL_STATUSES = ("ok", "failed")
STOPPED_BY = ("interrupted", "max-duration")
"""Why a partial cell has fewer timed repeats than planned: a stop signal (or a kill) ended it, which `--resume`
completes; or `--max-duration` bounded it, which is its end."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellRow:
    """One input size of a sweep, summarised (medians over the timed repeats). None where unknown.

    Units: tok/s for rates, ms for times except `cold_request_s` (s); ratios are cold / warm median.
    `valid` is False when any timed repeat compiled, produced a token count other than `max_new_tokens`, or was
    degenerate (`invalid_reason` says which), or when the cell failed (`status` "failed", `error` says why).

    A **partial** cell (`partial` True) has fewer timed repeats (`repeats`) than were planned (`repeats_planned`),
    because `stopped_by` (one of `STOPPED_BY`): "interrupted" (a stop signal; `--resume` measures the rest) or
    "max-duration" (the `--max-duration` bound; final). Its numbers are medians of the repeats it has. These three
    fields are optional (`OPTIONAL_FIELDS`): rows written before they existed, and every whole cell, lack them.

    The **device decode loop** (`--decode-loop device|both`, kind "timed-device" samples) adds optional fields,
    absent from rows without it: `device_repeats` (its timed repeats), `device_gauge_tok_s_*` (its gauge: median,
    min, max), `device_step_ms_median` (its ms per step: median over its repeats of decode time / (generated - 1),
    the only per-step figure it has) and, with both loops, `host_overhead_ms` = the host loop's ms per step - the
    device loop's, each the median over its repeats of decode time / (generated - 1): the same estimator on both
    sides (a pooled per-step median would leave out the host's hiccups, which the device loop's mean keeps). The
    other figures are the host loop's repeats, or, when only the device loop ran, the device loop's (no per-step
    median or p99 then: it has no per-step times).

    The **rooflines** (docs/method.md, "Rooflines"; an in-process sweep, `bench.sweep.rates`) add optional fields,
    absent from rows without them (older runs, `--target` sweeps): `bytes_per_step` (bytes one decode step reads at
    the compiled shape: weights + KV cache), `roofline_share_pct` = bytes_per_step x gauge tok/s (median) / the
    run's roofline ceiling (bytes/s; bench/runs/ceiling.py: max(fastest read probe, datasheet), or the copy in runs
    recorded before it) x 100, `device_roofline_share_pct` the same with the device loop's
    gauge; `prefill_flops` (matrix-product FLOP of the prefill of the real prompt), `prefill_flop_s` =
    prefill_flops / median prefill time (s), `prefill_matmul_share_pct` = prefill_flop_s / the run's measured
    matrix-product rate (FLOP/s) x 100.

    **Interleaving** (docs/method.md, "Interleaving"; optional, absent from older rows): `gauge_spread_pct` and
    `device_gauge_spread_pct`, each gauge's repeat spread, (max - min) / median x 100 of its timed repeats (the
    width of the cell's within-sweep interval, [min, max]: `bench.runs.agreement`); in an interleaved in-process sweep,
    `rate_probes` (the rate probes around the cell's timed repeats, `bench.sweep.rates.RoundProbes`),
    `probe_read_bytes_s_*` and `probe_matmul_flop_s_*` (their read and matrix-product rates: median, min, max) and
    `ceiling_bytes_s` (the cell's roofline denominator, max(that read median, the datasheet)): the cell's shares
    are divided by these instead of the run's start rates.

    **Experts read** (a model with experts; docs/method.md, "Bytes that follow the routing"; optional, absent
    from rows of models without experts and from older rows): from the samples' `experts_read` (the distinct experts
    each decode step's router chose per layer, the union over a batch's rows), pooled over every timed repeat of
    either loop: `experts_read_steps` (the steps pooled), `experts_read_median` / `_min` / `_max` (per step, summed
    over the layers), `experts_per_layer_median` (that median / layers), `experts_read_layers_median` / `_min` /
    `_max` (each layer's own, over the steps); `expert_routing` ("router", or "balanced" for dummy weights with the
    balanced routing) is the engine's, added with the rooflines. With them, `bytes_per_step` counts
    `experts_per_layer_median` experts per layer instead of top_k.
    """

    input_tokens: int
    bucket: int | None
    max_new_tokens: int | None
    repeats: int | None
    valid: bool
    invalid_reason: str | None
    status: str  # "ok" | "failed"
    error: str | None
    gauge_tok_s_median: float | None
    gauge_tok_s_min: float | None
    gauge_tok_s_max: float | None
    e2e_tok_s_median: float | None
    e2e_tok_s_min: float | None
    e2e_tok_s_max: float | None
    ttft_ms_median: float | None
    ttft_ms_min: float | None
    ttft_ms_max: float | None
    prefill_ms_median: float | None
    tpot_ms_median: float | None
    step_ms_median: float | None
    step_ms_p99: float | None
    cold_request_s: float | None
    cold_ttft_ms: float | None
    cold_warm_request_ratio: float | None  # whole request: cold e2e time / median timed e2e time
    cold_warm_ttft_ratio: float | None  # first token only: cold TTFT / median timed TTFT (a different claim)
    compile_events_timed: int | None
    degenerate: bool | None
    generated_tokens_per_repeat: list[int]
    partial: bool = False
    repeats_planned: int | None = None
    stopped_by: str | None = None  # one of STOPPED_BY, for a partial cell
    device_repeats: int | None = None
    device_gauge_tok_s_median: float | None = None
    device_gauge_tok_s_min: float | None = None
    device_gauge_tok_s_max: float | None = None
    device_step_ms_median: float | None = None
    host_overhead_ms: float | None = None  # host-loop ms per step - device-loop ms per step, same cell
    bytes_per_step: int | None = None
    roofline_share_pct: float | None = None
    device_roofline_share_pct: float | None = None
    prefill_flops: int | None = None
    prefill_flop_s: float | None = None
    prefill_matmul_share_pct: float | None = None
    batch: int | None = None  # rows decoded together (`--batch`); None: 1, a sweep without --batch
    aggregate_tok_s_median: float | None = None  # all rows' tokens after the first / decode time, per repeat
    aggregate_tok_s_min: float | None = None
    aggregate_tok_s_max: float | None = None
    flops_per_step: int | None = None  # matrix-product FLOP of one decode step of all rows
    arithmetic_intensity: float | None = None  # flops_per_step / bytes_per_step (FLOP/byte)
    rows_differ: int | None = None  # rows whose greedy tokens differ from the same prompt's at B = 1
    gauge_spread_pct: float | None = None  # (gauge max - min) / median x 100: the within-sweep interval's width
    device_gauge_spread_pct: float | None = None  # the same for the device loop's gauge
    rate_probes: int | None = None  # an interleaved sweep's rate probes around the cell's timed repeats
    probe_read_bytes_s_median: float | None = None  # their read rate (bytes/s): median, min, max
    probe_read_bytes_s_min: float | None = None
    probe_read_bytes_s_max: float | None = None
    probe_matmul_flop_s_median: float | None = None  # their matrix-product rate (FLOP/s): median, min, max
    probe_matmul_flop_s_min: float | None = None
    probe_matmul_flop_s_max: float | None = None
    ceiling_bytes_s: float | None = None  # the roofline denominator of this cell's shares (bytes/s)
    experts_read_steps: int | None = None  # decode steps whose routing was recorded (a model with experts)
    experts_read_median: float | None = None  # distinct experts read per step, summed over the layers: median,
    experts_read_min: int | None = None  # min and max over the cell's decode steps
    experts_read_max: int | None = None
    experts_per_layer_median: float | None = None  # experts_read_median / layers: what the bytes per step count
    experts_read_layers_median: list[float] | None = None  # per layer: its distinct experts' median, min, max over
    experts_read_layers_min: list[int] | None = None  # the decode steps
    experts_read_layers_max: list[int] | None = None
    expert_routing: str | None = None  # "router" or "balanced" (dummy weights): how the counts were chosen

    def to_dict(self) -> dict[str, Any]:
        """The JSON row; the optional fields only where they differ from their defaults (a partial cell), so that a
        whole cell's row is what it always was (archived folders are re-created byte for byte)."""
        d = _plain(dataclasses.asdict(self))
        return {k: v for k, v in d.items() if k not in OPTIONAL_FIELDS[CellRow] or v != OPTIONAL_FIELDS[CellRow][k]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One measured request. `kind`: "cold" (the first request of the run's fresh engine: its cold start),
    "cold-resume" (the first request of the fresh engine of a resumed run: cold too, but not the run's cold start;
    no cell's cold ratios use it), "warmup", or "timed" (the host decode loop), "warmup-device" or "timed-device"
    (the device decode loop, `LOOP_KINDS`).

    Times in ms (monotonic clock, device-synced); rates in tok/s; `step_ms` holds the per-step decode times
    (ms, one per generated token after the first; empty for the device loop, which syncs once per block:
    `block_ms` holds its blocks' times, absent for the host loop); `token_ids` the generated ids (prompt excluded).

    A batch request (`bench sweep --batch`, B > 1) adds `batch` (B) and `row_token_ids` (each row's generated ids,
    [B][max_new_tokens]); its `token_ids` are row 0's, its times and rates one row's (the rows share them: they run
    in lockstep), its `degenerate` True when any row is (`degenerate_reason` names the rows).

    A model with experts adds `experts_read`: for each decode step (the tokens after the first), per layer, how
    many distinct experts its router chose (the union over a batch's rows), as the engine's decode program returned
    them (`model.engine.Generation.experts_read`).
    """

    input_tokens: int
    kind: str
    repeat: int
    ttft_ms: float
    prefill_ms: float | None
    decode_ms: float | None
    e2e_ms: float
    gauge_tok_s: float | None
    e2e_tok_s: float | None
    tpot_ms: float | None
    generated_tokens: int
    compile_events: int | None  # None: not observable (a server other than this project's)
    degenerate: bool | None
    degenerate_reason: str | None
    step_ms: list[float]
    token_ids: list[int]
    block_ms: list[float] | None = None
    batch: int | None = None  # rows decoded together (a batch request); None: one sequence
    row_token_ids: list[list[int]] | None = None  # a batch request: every row's generated ids (row 0 = token_ids)
    experts_read: list[list[int]] | None = None  # a model with experts: per decode step, per layer, distinct experts

    def to_dict(self) -> dict[str, Any]:
        """The JSON row; `block_ms`, `batch`, `row_token_ids` and `experts_read` only where present (a device-loop
        sample, a batch request, a model with experts), so a host-loop row of one sequence is what it was."""
        optional = OPTIONAL_FIELDS[Sample]
        return {k: v for k, v in _plain(dataclasses.asdict(self)).items() if not (k in optional and v is None)}


def cell_key(row: CellRow | Sample) -> tuple[int, int]:
    """(input_tokens, batch) of a cell row or sample: the key of a sweep cell (a batch of None is 1)."""
    return row.input_tokens, row.batch or 1


LOAD_SAMPLE_KINDS = ("warmup", "timed")
LEVEL_STATUSES = ("ok", "failed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadSample:
    """One request of a load level (docs/method.md, "Serving under load"), client-side, `time.perf_counter_ns`
    read as each streamed chunk arrives.

    `kind`: "warmup" (one per input size, alone, before its levels; not in any level's figures) or "timed".
    `index`: the request's number in its level (send order, from 0). `concurrency`: the level's cap on requests in
    flight; `request_rate`: its Poisson arrival rate (req/s; None: each request sent as soon as a slot of the cap
    is free). `t_sent_ms`: when it was sent, from the level's start (ms). `ok`: a 200 stream that ended with
    `[DONE]` or its usage; else `error` says what went wrong. `ttft_ms`: sent -> first chunk with content;
    `itl_ms`: the gaps between consecutive content chunks (ms; one per token where the server streams one token
    per chunk: `content_chunks` == `generated_tokens` says so); `tpot_ms` = (e2e - TTFT) / (generated - 1);
    `e2e_ms`: sent -> end of the stream; `generated_tokens`: the server's usage.completion_tokens (None without
    usage); `queue_ms`: the time the server says it queued the request (this project's `server_timing.queue_ms`;
    None where the server does not report it); degeneracy as `Sample`'s; `token_ids`: the generated ids where the
    server streams them (this project's), else the re-tokenized text.
    """

    input_tokens: int
    concurrency: int
    request_rate: float | None
    kind: str
    index: int
    ok: bool
    error: str | None
    t_sent_ms: float
    ttft_ms: float | None
    itl_ms: list[float]
    tpot_ms: float | None
    e2e_ms: float | None
    generated_tokens: int | None
    content_chunks: int
    queue_ms: float | None
    degenerate: bool | None
    degenerate_reason: str | None
    token_ids: list[int]

    def to_dict(self) -> dict[str, Any]:
        """The JSON row."""
        return _plain(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadRow:
    """One load level summarised (docs/method.md, "Serving under load"): `num_requests` timed requests of exactly
    `input_tokens` tokens and `max_new_tokens` new ones (EOS ignored), at most `concurrency` in flight, arriving
    as a Poisson process of `request_rate` req/s (None: as fast as the cap allows; `seed` seeds the arrivals).

    `duration_s`: the level's wall time, first request sent to last response ended (s). `output_tok_s` = generated
    tokens of the level's successful requests / duration; `request_s` = successful requests / duration.
    Latencies in ms, each as median / p90 / p99 (linear interpolation): `ttft`, `tpot`, `e2e`, `queue` (None where
    the server reports no queue time) over the successful requests; `itl` over every inter-token gap of the level,
    pooled. `completed` / `failed`: requests that succeeded / failed. `compile_events`: jit traces on the server
    during the level (this project's /metrics; None where not observable). `degenerate_requests`: successful
    requests whose output failed the degeneracy check (recorded, not a validity rule of a load level).
    `valid`: every request succeeded with exactly max_new_tokens and nothing was seen to compile; else
    `invalid_reason` says why. `status` "failed" (`error`): the level could not run at all.
    """

    input_tokens: int
    concurrency: int
    request_rate: float | None
    seed: int | None
    max_new_tokens: int
    num_requests: int
    completed: int
    failed: int
    valid: bool
    invalid_reason: str | None
    status: str  # one of LEVEL_STATUSES
    error: str | None
    duration_s: float | None
    generated_tokens: int
    output_tok_s: float | None
    request_s: float | None
    ttft_ms_median: float | None
    ttft_ms_p90: float | None
    ttft_ms_p99: float | None
    itl_ms_median: float | None
    itl_ms_p90: float | None
    itl_ms_p99: float | None
    tpot_ms_median: float | None
    tpot_ms_p90: float | None
    tpot_ms_p99: float | None
    e2e_ms_median: float | None
    e2e_ms_p90: float | None
    e2e_ms_p99: float | None
    queue_ms_median: float | None
    queue_ms_p90: float | None
    queue_ms_p99: float | None
    compile_events: int | None
    degenerate_requests: int

    @property
    def key(self) -> tuple[int, int, float | None]:
        """(input_tokens, concurrency, request_rate): what names a level in its run."""
        return (self.input_tokens, self.concurrency, self.request_rate)

    def to_dict(self) -> dict[str, Any]:
        """The JSON row."""
        return _plain(dataclasses.asdict(self))


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """Tuples as lists, so that a row built with tuples validates and serialises like one read back from JSON."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def conforms(value: Any, tp: Any) -> bool:
    """True when a JSON value fits a field annotation (int excludes bool; float accepts int; finite only)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(conforms(v, typing.get_args(tp)[0]) for v in value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, tp)


_ROW_CLASSES = (CellRow, Sample, LoadRow, LoadSample)
_HINTS = {cls: typing.get_type_hints(cls) for cls in _ROW_CLASSES}
_CHOICES = {(CellRow, "status"): CELL_STATUSES, (Sample, "kind"): SAMPLE_KINDS, (CellRow, "stopped_by"): STOPPED_BY,
            (LoadRow, "status"): LEVEL_STATUSES, (LoadSample, "kind"): LOAD_SAMPLE_KINDS}  # fmt: skip
OPTIONAL_FIELDS: dict[type, dict[str, Any]] = {
    cls: {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    for cls in _ROW_CLASSES
}
"""Per row class, the fields a row may lack (added after rows were first written) and their values when absent."""


def row_problems(cls: type, obj: Any) -> list[str]:
    """Problems of one JSON object against a row class: missing/unknown fields, wrong types, bad choices.
    A field of `OPTIONAL_FIELDS` may be missing; a null `stopped_by` is no choice to check."""
    if not isinstance(obj, dict):
        return [f"expected a JSON object, got {type(obj).__name__}"]
    hints = _HINTS[cls]
    problems = [f"missing field {k!r}" for k in hints if k not in obj and k not in OPTIONAL_FIELDS[cls]]
    problems += [f"unknown field {k!r}" for k in obj if k not in hints]
    for key, tp in hints.items():
        if key in obj and not conforms(obj[key], tp):
            problems.append(f"field {key!r} should be {_type_name(tp)}, got {obj[key]!r}"[:160])
        choices = _CHOICES.get((cls, key))
        if choices and obj.get(key) is not None and obj[key] not in choices:
            problems.append(f"field {key!r} is {obj[key]!r}, expected one of {choices}")
    return problems


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


def row_from_dict(cls: type, obj: Any, where: str) -> Any:
    problems = row_problems(cls, obj)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RunFolderError(f"{where}: {problems[0]}{more}")
    return cls(**obj)


def as_sample(obj: Sample | Mapping[str, Any]) -> Sample:
    """A `Sample` from a Sample or a dict with exactly its fields (ValueError naming the problem)."""
    if isinstance(obj, Sample):
        return obj
    problems = row_problems(Sample, dict(obj))
    if problems:
        raise ValueError(f"sample: {problems[0]}")
    return Sample(**obj)


# ---- summarising one cell --------------------------------------------------------------------------------------
def _percentile(values: list[float], pct: float) -> float:
    """Linear-interpolation percentile (numpy's default method) of a non-empty list."""
    xs = sorted(values)
    pos = (len(xs) - 1) * pct / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
    xs = [v for v in values if v is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (None, None, None)


def summarize_cell(
    samples: Iterable[Sample | Mapping[str, Any]],
    *,
    max_new_tokens: int,
    bucket: int | None = None,
    input_tokens: int | None = None,
    stopped_by: str | None = None,
    repeats_planned: int | None = None,
    batch: int | None = None,
) -> CellRow:
    """Summarise the raw requests of one input size into a `CellRow` (docs/method.md, "Per cell").

    Medians (and min/max) are over the timed repeats only; warm-up requests are ignored; the cold request (if
    any; kind "cold" only: a resumed run's "cold-resume" request is not the run's cold start) gives
    `cold_request_s`, `cold_ttft_ms` and the two ratios, labelled separately: whole request (cold e2e time /
    median timed e2e time) and TTFT (cold TTFT / median timed TTFT). `stopped_by` (one of `STOPPED_BY`) marks a
    partial cell of `repeats_planned` planned repeats. Step-time median and p99 pool every
    per-step decode time of the timed repeats. Validity: every timed repeat compiled nothing, generated exactly
    `max_new_tokens`, and passed the degeneracy check (a verdict of None counts as not checked, so invalid); the
    device loop's timed repeats ("timed-device") by the same rules, and they give the device fields (`CellRow`).
    `input_tokens` selects that size when `samples` hold several; otherwise they must all share one.
    `batch` (B, a `--batch` sweep's cell) selects the samples of that batch (a sample's batch None is 1; without
    `batch`, those of batch 1) and adds the batch fields that come from samples (`batch`, `aggregate_tok_s_*` =
    B x each timed repeat's gauge); validity then also needs every row of a batch request to have generated
    exactly `max_new_tokens`. Raises ValueError for samples of several sizes without `input_tokens`, no samples at all, or a `stopped_by`
    not in `STOPPED_BY`.
    """
    if stopped_by is not None and stopped_by not in STOPPED_BY:
        raise ValueError(f"summarize_cell: stopped_by {stopped_by!r} is not one of {STOPPED_BY}")
    size, rows = _one_size([s for s in map(as_sample, samples) if (s.batch or 1) == (batch or 1)], input_tokens)
    host, device = (sorted((s for s in rows if s.kind == k), key=lambda s: s.repeat) for k in ("timed", "timed-device"))
    timed = host or device  # the cell's figures: the host loop's, else (the device loop alone) the device loop's
    cold = next((s for s in rows if s.kind == "cold"), None)
    reasons = _invalid_reasons(host, max_new_tokens) if host or not device else []
    reasons += _invalid_reasons(device, max_new_tokens, loop="device-loop ") if device else []
    figures = _timed_fields(timed)
    verdicts = [s.degenerate for s in timed]
    return CellRow(
        input_tokens=size,
        bucket=bucket,
        max_new_tokens=max_new_tokens,
        repeats=len(timed),
        valid=not reasons,
        invalid_reason="; ".join(reasons) or None,
        status="ok",
        error=None,
        **figures,
        **_cold_fields(cold, timed, figures["ttft_ms_median"]),
        compile_events_timed=None if any(s.compile_events is None for s in timed) else sum(s.compile_events for s in timed),
        degenerate=None if not timed or None in verdicts else any(verdicts),
        generated_tokens_per_repeat=[s.generated_tokens for s in timed],
        partial=stopped_by is not None, repeats_planned=repeats_planned if stopped_by else None, stopped_by=stopped_by,
        **_device_fields(host, device),
        **_batch_fields(batch, timed),
        **experts_fields(host + device),
    )  # fmt: skip


def experts_fields(timed: list[Sample]) -> dict[str, Any]:
    """The experts-read fields of a CellRow (see its docstring) from the `experts_read` of `timed` (every decode
    step of every timed repeat, pooled; the median of an even count of steps is the mean of the middle two); {}
    when no sample has any (a model without experts, a server's), so such a row is what it always was."""
    steps = [layers for s in timed for layers in (s.experts_read or [])]
    if not steps:
        return {}
    sums = [sum(layers) for layers in steps]
    per_layer = list(zip(*steps))
    return {"experts_read_steps": len(steps), "experts_read_median": statistics.median(sums),
            "experts_read_min": min(sums), "experts_read_max": max(sums),
            "experts_per_layer_median": statistics.median(sums) / len(per_layer),
            "experts_read_layers_median": [statistics.median(c) for c in per_layer],
            "experts_read_layers_min": [min(c) for c in per_layer],
            "experts_read_layers_max": [max(c) for c in per_layer]}  # fmt: skip


def _timed_fields(timed: list[Sample]) -> dict[str, Any]:
    """A cell's figures from its timed repeats (docs/method.md, "Per cell"): gauge, end-to-end and TTFT median, min
    and max; prefill and TPOT medians; the step-time median and p99 over every per-step decode time pooled."""
    gauge, e2e, ttft = (_stats([getattr(s, f) for s in timed]) for f in ("gauge_tok_s", "e2e_tok_s", "ttft_ms"))
    steps = [x for s in timed for x in s.step_ms]
    return dict(
        gauge_tok_s_median=gauge[0], gauge_tok_s_min=gauge[1], gauge_tok_s_max=gauge[2],
        e2e_tok_s_median=e2e[0], e2e_tok_s_min=e2e[1], e2e_tok_s_max=e2e[2],
        ttft_ms_median=ttft[0], ttft_ms_min=ttft[1], ttft_ms_max=ttft[2],
        prefill_ms_median=_stats([s.prefill_ms for s in timed])[0],
        tpot_ms_median=_stats([s.tpot_ms for s in timed])[0],
        step_ms_median=statistics.median(steps) if steps else None,
        step_ms_p99=_percentile(steps, 99) if steps else None,
    )  # fmt: skip


def _batch_fields(batch: int | None, timed: list[Sample]) -> dict[str, Any]:
    """The batch fields of a CellRow from its samples: `batch` and the aggregate throughput (B x each timed
    repeat's gauge: median, min, max); {} without `batch` (a sweep without --batch)."""
    if batch is None:
        return {}
    agg = _stats([batch * s.gauge_tok_s if s.gauge_tok_s is not None else None for s in timed])
    return {"batch": batch, "aggregate_tok_s_median": agg[0], "aggregate_tok_s_min": agg[1],
            "aggregate_tok_s_max": agg[2]}  # fmt: skip


def _ms_per_step(timed: list[Sample]) -> float | None:
    """The median over `timed` of decode time / (generated - 1) (ms), either loop; None without any."""
    return _stats([s.decode_ms / (s.generated_tokens - 1) for s in timed
                   if s.decode_ms is not None and s.generated_tokens > 1])[0]  # fmt: skip


def _device_fields(host: list[Sample], device: list[Sample]) -> dict[str, Any]:
    """The device decode loop's fields of a CellRow (see its docstring); {} without device-loop repeats, so a row
    without them is what it always was."""
    if not device:
        return {}
    gauge = _stats([s.gauge_tok_s for s in device])
    step, host_step = _ms_per_step(device), _ms_per_step(host)
    return {"device_repeats": len(device), "device_gauge_tok_s_median": gauge[0], "device_gauge_tok_s_min": gauge[1],
            "device_gauge_tok_s_max": gauge[2], "device_step_ms_median": step,
            "host_overhead_ms": host_step - step if host_step is not None and step is not None else None}  # fmt: skip


def _one_size(rows: list[Sample], input_tokens: int | None) -> tuple[int, list[Sample]]:
    """(the input size, its samples): those of `input_tokens` when given, else all, which must share one size.
    ValueError otherwise (or for no samples)."""
    if input_tokens is not None:
        rows = [s for s in rows if s.input_tokens == input_tokens]
    sizes = {s.input_tokens for s in rows}
    if len(sizes) != 1:
        raise ValueError(f"summarize_cell: expected samples of one input size, got sizes {sorted(sizes)}")
    return sizes.pop(), rows


def _invalid_reasons(timed: list[Sample], max_new_tokens: int, loop: str = "") -> list[str]:
    """Why a cell of these timed repeats is not quotable (see `summarize_cell`); [] when it is. `loop` prefixes
    each reason ("device-loop ": the device decode loop's repeats, checked by the same rules)."""
    reasons: list[str] = []
    if not timed:
        reasons.append(f"no {loop}timed repeats")
    compiled = [s.repeat for s in timed if s.compile_events]
    if compiled:
        total = sum(s.compile_events or 0 for s in timed)
        reasons.append(f"{total} compile event(s) during {loop}timed repeat(s) {', '.join(map(str, compiled))}")
    if any(s.compile_events is None for s in timed):
        reasons.append("compile events not observable on this server, so no timed repeat is proven compile-free")
    for s in timed:
        if s.generated_tokens != max_new_tokens:
            reasons.append(f"{loop}repeat {s.repeat} generated {s.generated_tokens} tokens, expected {max_new_tokens}")
        short = [b for b, ids in enumerate(s.row_token_ids or []) if len(ids) != max_new_tokens]
        if short:
            reasons.append(f"{loop}repeat {s.repeat}: row(s) {short} did not generate exactly {max_new_tokens} tokens")
        if s.degenerate is None:
            reasons.append(f"{loop}repeat {s.repeat} has no degeneracy verdict")
        elif s.degenerate:
            reasons.append(f"{loop}repeat {s.repeat} degenerate: {s.degenerate_reason or 'loop'}")
    return reasons


def _cold_fields(cold: Sample | None, timed: list[Sample], ttft_median: float | None) -> dict[str, float | None]:
    """The cold request's fields of a CellRow: its time (s) and TTFT (ms), and their ratios to the timed
    repeats' medians (whole request: cold e2e / median e2e; TTFT: cold TTFT / median TTFT); None without one."""
    e2e_ms_median = _stats([s.e2e_ms for s in timed])[0]
    return {
        "cold_request_s": cold.e2e_ms / 1000.0 if cold else None,
        "cold_ttft_ms": cold.ttft_ms if cold else None,
        "cold_warm_request_ratio": cold.e2e_ms / e2e_ms_median if cold and e2e_ms_median else None,
        "cold_warm_ttft_ratio": cold.ttft_ms / ttft_median if cold and ttft_median else None,
    }


def failed_cell(
    input_tokens: int, error: str, *, bucket: int | None = None, max_new_tokens: int | None = None,
    repeats: int | None = None, batch: int | None = None,
) -> CellRow:  # fmt: skip
    """The row of a cell that could not be measured (e.g. out of memory): status "failed", invalid, no numbers
    (`batch`: the cell's B in a `--batch` sweep)."""
    empty = {f.name: None for f in dataclasses.fields(CellRow) if f.name not in OPTIONAL_FIELDS[CellRow]}
    empty.update(
        input_tokens=input_tokens, bucket=bucket, max_new_tokens=max_new_tokens, repeats=repeats, valid=False,
        invalid_reason=f"failed: {error}", status="failed", error=error, generated_tokens_per_repeat=[],
    )  # fmt: skip
    return CellRow(**empty, batch=batch)


# ---- summarising one load level ----------------------------------------------------------------------------------
def _spread(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """(median, p90, p99) of `values` (linear interpolation); Nones when empty."""
    if not values:
        return (None, None, None)
    return (statistics.median(values), _percentile(values, 90), _percentile(values, 99))


def summarize_level(samples: Iterable[LoadSample], *, input_tokens: int, concurrency: int,
                    request_rate: float | None, seed: int | None, max_new_tokens: int, num_requests: int,
                    duration_s: float, compile_events: int | None) -> LoadRow:  # fmt: skip
    """The `LoadRow` of one level from its timed `LoadSample`s (others, and other levels', are left out), following
    docs/method.md "Serving under load" (see `LoadRow`). `duration_s`: the level's wall time (s), > 0.
    Validity: exactly `num_requests` timed requests, each ok with `generated_tokens` == `max_new_tokens`, and
    `compile_events` not > 0. Raises ValueError for a duration <= 0."""
    if not duration_s > 0:
        raise ValueError(f"summarize_level: duration_s must be > 0, got {duration_s}")
    mine = sorted((s for s in samples if s.kind == "timed" and (s.input_tokens, s.concurrency, s.request_rate)
                   == (input_tokens, concurrency, request_rate)), key=lambda s: s.index)  # fmt: skip
    good = [s for s in mine if s.ok]
    reasons = []
    if len(mine) != num_requests:
        reasons.append(f"{len(mine)} of {num_requests} requests measured")
    failed = [s for s in mine if not s.ok]
    if failed:
        reasons.append(f"{len(failed)} request(s) failed (first: #{failed[0].index}: {failed[0].error})")
    wrong = [s for s in good if s.generated_tokens != max_new_tokens]
    if wrong:
        reasons.append(f"{len(wrong)} request(s) generated a token count other than {max_new_tokens} (first: "
                       f"#{wrong[0].index}: {wrong[0].generated_tokens})")  # fmt: skip
    if compile_events:
        reasons.append(f"{compile_events} compile event(s) on the server during the level")
    generated = sum(s.generated_tokens or 0 for s in good)
    spreads = {name: _spread([getattr(s, f"{name}_ms") for s in good if getattr(s, f"{name}_ms") is not None])
               for name in ("ttft", "tpot", "e2e", "queue")}  # fmt: skip
    spreads["itl"] = _spread([x for s in good for x in s.itl_ms])
    fields = {f"{name}_ms_{stat}": value for name, trio in spreads.items()
              for stat, value in zip(("median", "p90", "p99"), trio)}  # fmt: skip
    return LoadRow(
        input_tokens=input_tokens, concurrency=concurrency, request_rate=request_rate, seed=seed,
        max_new_tokens=max_new_tokens, num_requests=num_requests, completed=len(good), failed=len(failed),
        valid=not reasons, invalid_reason="; ".join(reasons) or None, status="ok", error=None, duration_s=duration_s,
        generated_tokens=generated, output_tok_s=generated / duration_s, request_s=len(good) / duration_s,
        compile_events=compile_events, degenerate_requests=sum(1 for s in good if s.degenerate), **fields,
    )  # fmt: skip


def failed_level(input_tokens: int, concurrency: int, request_rate: float | None, error: str, *, seed: int | None,
                 max_new_tokens: int, num_requests: int) -> LoadRow:  # fmt: skip
    """The row of a level that could not run at all: status "failed", invalid, no numbers."""
    empty = {f.name: None for f in dataclasses.fields(LoadRow)}
    empty.update(input_tokens=input_tokens, concurrency=concurrency, request_rate=request_rate, seed=seed,
                 max_new_tokens=max_new_tokens, num_requests=num_requests, completed=0, failed=0, valid=False,
                 invalid_reason=f"failed: {error}", status="failed", error=error, generated_tokens=0,
                 degenerate_requests=0)  # fmt: skip
    return LoadRow(**empty)
