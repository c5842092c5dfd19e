"""What a `bench ab` session measures and how (docs/commands/ab.md): the plan (`AbPlan`: sides, cell, mode, pairs,
statistics), a side ready to measure (`Target`), the test-only slowdown's arithmetic (`slowdown_wait_ms`) and the
pieces both modes share (`bench.ab.workers`, `bench.ab.processes`); the session itself is `bench.ab.session`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from bench.ab.archive import Measurement
from bench.ab.sides import Checkout, Side
from bench.ab.stats import CONFIDENCE, MIN_EFFECT_PCT, RESAMPLES, SEED
from bench.errors import InputError
from model.switches import TEST_DELAY_ENV  # the engine's test-only decode delay: `test-only:<ms>ms`

METRICS = {"gauge": "gauge_tok_s", "e2e": "e2e_tok_s", "cpu": "cpu_tok_s"}
"""The metrics a session can measure (docs/method.md, "A/B runs"): the host-loop decode gauge (default), the
end-to-end rate, or (worker mode) the CPU rate: generated tokens per CPU second of the worker process during the
request (every thread), what other work on a shared CPU host disturbs least; tok/s."""
MODES = ("workers", "processes")
"""How the sides are measured: "workers" (one long-lived process per side, pairs of requests seconds apart) or
"processes" (each measurement a `bench sweep` process)."""
DEFAULT_PAIRS = {"workers": 24, "processes": 8}
"""`--pairs` by default, per mode: a worker's measurement is one request (about 1-2 s of the default cell on a
2-core CPU host), a process's a whole sweep (15-60 s)."""
A_WAIT_MS = 0.001
"""Test only: side A's wait per decode step (ms) when B's is injected: the waiting program runs on both sides, so
its own cost cancels in the ratio."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    """What each measurement measures: one request of `input_tokens` exact input tokens generating
    `max_new_tokens` tokens on the host decode loop; `metric` ("gauge" or "e2e", `METRICS`, tok/s). In process
    mode a measurement is a sweep of the cell with `repeats` timed repeats (the sweep's cold request and warm-up
    before them), its value their median; in worker mode a measurement is one request and `repeats` is unused."""

    input_tokens: int = 41
    max_new_tokens: int = 64
    repeats: int = 3
    metric: str = "gauge"

    def check(self) -> None:
        """InputError (one line) for a value out of range."""
        for flag, value, least in (("--inputs", self.input_tokens, 1), ("--max-new-tokens", self.max_new_tokens, 2),
                                   ("--repeats", self.repeats, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InputError(f"{flag} {value!r}: expected a whole number >= {least} (one cell: e.g. --inputs 41 "
                                 "--max-new-tokens 64)")  # fmt: skip
        if self.metric not in METRICS:
            raise InputError(f"--metric {self.metric!r}: expected one of {', '.join(METRICS)}")

    def sweep_args(self) -> list[str]:
        """The sweep flags of the cell (process mode)."""
        return ["--inputs", str(self.input_tokens), "--max-new-tokens", str(self.max_new_tokens), "--repeats",
                str(self.repeats), "--decode-loop", "host"]  # fmt: skip

    def worker_args(self) -> list[str]:
        """The worker flags of the cell (worker mode)."""
        return ["--inputs", str(self.input_tokens), "--max-new-tokens", str(self.max_new_tokens)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbPlan:
    """A session: the sides `a` and `b`, the `cell`, the `mode` (`MODES`), `pairs` pairs (None: `DEFAULT_PAIRS`
    of the mode), the interval's `confidence`, the smallest change claimed (`min_effect_pct`), the bootstrap's
    `resamples` and `seed`; `python` (the interpreter of every process), `runs_dir` and `label` (the ab run
    folder), `keep_sweeps` (a folder for the processes' own run folders and logs, or None: removed), and
    `test_slowdown_b` (test only: the share of A's step, 0..0.9, that side B's steps wait more)."""

    a: Side
    b: Side
    cell: Cell = Cell()
    mode: str = "workers"
    pairs: int | None = None
    confidence: float = CONFIDENCE
    min_effect_pct: float = MIN_EFFECT_PCT
    resamples: int = RESAMPLES
    seed: int = SEED
    python: str = sys.executable
    runs_dir: Path = Path("runs")
    label: str | None = None
    keep_sweeps: Path | None = None
    test_slowdown_b: float | None = None

    def check(self) -> None:
        """InputError (one line) for a value out of range, before anything runs."""
        self.cell.check()
        if self.mode not in MODES:
            raise InputError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)} (workers by default)")
        if self.cell.metric == "cpu" and self.mode != "workers":
            raise InputError("--metric cpu: worker mode only (a worker measures its CPU time per request; a sweep "
                             "process records none); drop --mode processes or use --metric gauge")  # fmt: skip
        if self.pairs is not None and (isinstance(self.pairs, bool) or not isinstance(self.pairs, int)
                                       or not 3 <= self.pairs <= 1000):  # fmt: skip
            raise InputError(f"--pairs {self.pairs!r}: expected a whole number from 3 to 1000 ({DEFAULT_PAIRS['workers']}"
                             f" by default in worker mode, {DEFAULT_PAIRS['processes']} in process mode)")  # fmt: skip
        if not 0.5 <= self.confidence < 1.0:
            raise InputError(f"--confidence {100 * self.confidence:g}%: expected 50% to under 100% (95% by default)")
        if not 0.0 <= self.min_effect_pct < 100.0:
            raise InputError(f"--min-effect {self.min_effect_pct:g}%: expected 0% to under 100% (1% by default)")
        if self.resamples < 100:
            raise InputError(f"--resamples {self.resamples}: expected at least 100 ({RESAMPLES:,} by default)")
        if self.test_slowdown_b is not None and not 0 < self.test_slowdown_b <= 0.9:
            raise InputError(f"--test-slowdown-b {100 * self.test_slowdown_b:g}%: expected above 0% and at most 90%")

    @property
    def n_pairs(self) -> int:
        """The pairs to run: `pairs`, or the mode's default."""
        return self.pairs if self.pairs is not None else DEFAULT_PAIRS[self.mode]


@dataclasses.dataclass(frozen=True)
class Target:
    """A side ready to measure: its `Side` and `Checkout`."""

    side: Side
    checkout: Checkout


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without `TEST_DELAY_ENV` (never inherited by accident), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != TEST_DELAY_ENV}
    env.update(extra or {})
    return env


def slowdown_wait_ms(a_cost_ms: float, share: float, metric: str, max_new_tokens: int) -> float:
    """The work per decode step (ms) that lowers B's `metric` below A's by `share` (0 < share < 1) when both run
    A's code, from A's cost per token of the metric in the warm-up (`a_cost_ms`: `a_cost`). The gauge's token is
    a step, so the work w adds w to it: c / (c + w) = 1 - share gives w = c x share / (1 - share) (10%: 1/9 of A's
    step). The end-to-end and CPU rates count all `max_new_tokens` (n) tokens of a request but only n - 1 steps do
    the work, so w is n / (n - 1) times that. ValueError for a cost that is not positive."""
    if not a_cost_ms > 0:
        raise ValueError(f"A's cost {a_cost_ms!r} ms per token: expected a positive time")
    per_step = 1.0 if metric == "gauge" else max_new_tokens / (max_new_tokens - 1)
    return a_cost_ms * share / (1.0 - share) * per_step


A_COST = {"gauge": "the lower quartile of the decode steps of A's warm-ups after the first",
          "e2e": "1000 / the median end-to-end rate of A's warm-ups after the first",
          "cpu": "1000 / the median CPU rate of A's warm-ups after the first"}  # fmt: skip
"""What A's cost per token is taken from, per metric (worker mode). The gauge's is a lower quartile because on a
busy host other work inflates whole requests (steps of 25 ms alone and 100-120 ms under a load average of 12 on
the 2-core host), and the work is CPU time, which that load inflates as it does the step's own work: a share of the
step A takes when it has the cores is that share in either state."""


def a_cost(metric: str, values: list[float], steps: list[float]) -> float:
    """A's cost per token (ms) of `metric` (`A_COST`): from the `steps` (ms) of its warm-ups after the first for
    the gauge, else from their `values` (tok/s). ValueError when there is none."""
    from bench.ab.stats import median, quantile

    if metric == "gauge":
        if not steps:
            raise ValueError("no decode steps of A's warm-ups")
        return quantile(sorted(steps), 0.25)
    return 1000.0 / median(values)


def injection_record(share: float, metric: str, cost_ms: float, cost_from: str, wait_ms: float,
                     how: str) -> dict[str, Any]:  # fmt: skip
    """The manifest's `ab.test_injection` of a session with a test-only slowdown: the share asked for (%), the
    metric, A's cost per token it was computed from (ms) and from what, B's work per step and A's (ms), and how
    the work was given (`how`)."""
    return {"side": "B", "share_pct": 100.0 * share, "metric": metric, "a_cost_ms": cost_ms, "a_cost": cost_from,
            "delay_ms": wait_ms, "a_delay_ms": A_WAIT_MS, "how": how}  # fmt: skip


def measured_line(row: Measurement, what: str, metric: str) -> str:
    """The progress line of one measurement."""
    shown = "no value" if row.value is None else f"{row.value:,.2f} tok/s" + ("" if row.valid else " (invalid)")
    step = f", step {row.step_ms:.2f} ms" if row.step_ms is not None else ""
    wait = f", wait {row.delay_ms:g} ms" if row.delay_ms is not None else ""
    return f"{what} {row.side}: {shown} ({metric}{step}{wait}; {row.seconds:.1f} s)"
