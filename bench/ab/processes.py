"""Process mode of `bench ab` (`--mode processes`; docs/commands/ab.md): each measurement a whole
`python -m bench sweep` process of the cell, run in its side's checkout. The mode of builds older than worker mode
(their checkouts have no worker), and what worker mode is checked against.

Warm-ups: one measurement per distinct side (checkout, flags, environment), so that every side's programs are in
the persistent compilation cache before the pairs start. A measurement's value is its cell's median over its timed
repeats; its step the cell's pooled median decode step. The measurements' own run folders and logs go to the
session's scratch folder.

The test-only slowdown: the processes get `TEST_DELAY_ENV` (`test-only:<ms>ms`), A's with `A_WAIT_MS`, B's with
`slowdown_wait_ms` of A's warm-up (its median step for the gauge), so B's warm-up runs after A's.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ab.archive import Measurement
from bench.ab.channel import last_lines
from bench.ab.plan import A_WAIT_MS, METRICS, AbPlan, Cell, Target, environment, injection_record, \
    measured_line, slowdown_wait_ms  # fmt: skip
from bench.errors import InputError
from model.switches import TEST_DELAY_ENV


def delay_value(ms: float) -> str:
    """`TEST_DELAY_ENV`'s value for a wait of `ms` (decimal, never an exponent: `test-only:0.001ms`)."""
    return f"test-only:{f'{ms:.6f}'.rstrip('0').rstrip('.')}ms"


def sweep_argv(plan: AbPlan, target: Target, runs_dir: Path, label: str) -> list[str]:
    """The command line of one measurement: `python -m bench sweep` with the cell, the run folder and the side's
    flags (last, so the sweep's parser names a bad one)."""
    return [plan.python, "-m", "bench", "sweep", *plan.cell.sweep_args(), "--runs-dir", str(runs_dir), "--name",
            label, *target.side.flags]  # fmt: skip


def read_measurement(folder: Path | None, cell: Cell) -> dict[str, Any]:
    """The metric of the sweep run `folder` left (value, lo, hi, repeats, repeat values, validity, build id, the
    cell's median step); values None where it left no run or no cell."""
    empty = {"value": None, "lo": None, "hi": None, "repeats": None, "repeat_values": (), "valid": False,
             "build_id": None, "run": None, "step_ms": None}  # fmt: skip
    if folder is None:
        return empty
    from bench.errors import RunFolderError
    from bench.runs import open_run

    try:
        run = open_run(folder)
        cells = [c for c in run.cells() if c.input_tokens == cell.input_tokens and (c.batch or 1) == 1]
        samples = [s for s in run.samples() if s.kind == "timed" and s.input_tokens == cell.input_tokens]
    except RunFolderError:
        return {**empty, "run": folder.name}
    if not cells:
        return {**empty, "build_id": run.manifest.get("build_id"), "run": folder.name}
    row, field = cells[0], METRICS[cell.metric]
    values = tuple(v for v in (getattr(s, field) for s in sorted(samples, key=lambda s: s.repeat)) if v is not None)
    return {"value": getattr(row, f"{field}_median"), "lo": getattr(row, f"{field}_min"),
            "hi": getattr(row, f"{field}_max"), "repeats": row.repeats, "repeat_values": values,
            "valid": bool(row.valid), "build_id": run.manifest.get("build_id"), "run": folder.name,
            "step_ms": row.step_ms_median}  # fmt: skip


class ProcessMeasurer:
    """The measurements of a process-mode session (see the module docstring): `prepare` (the warm-ups), then
    `measure` one side for a pair; `rows` holds every measurement made, `injection` the test-only slowdown."""

    def __init__(self, plan: AbPlan, a: Target, b: Target, scratch: Path, progress: Callable[[str], None]):
        self.plan, self.targets, self.scratch, self.progress = plan, (a, b), scratch, progress
        self.rows: list[Measurement] = []
        self.injection: dict[str, Any] | None = None
        self.env: dict[str, dict[str, str]] = {a.side.name: {}, b.side.name: {}}
        self.argv: dict[str, list[str]] = {}

    def _run(self, target: Target, kind: str, pair: int | None) -> tuple[Measurement, Path]:
        index = len(self.rows)
        label = f"ab{index:03d}-{target.side.name.lower()}"
        argv = sweep_argv(self.plan, target, self.scratch, label)
        self.argv.setdefault(target.side.name, argv)
        log = self.scratch / f"{label}.log"
        started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        env = self.env[target.side.name]
        t0 = time.perf_counter()
        with open(log, "w", encoding="utf-8") as fh:
            code = subprocess.run(argv, cwd=target.checkout.root, env=environment(env), stdout=fh,
                                  stderr=subprocess.STDOUT, check=False).returncode  # fmt: skip
        found = sorted(self.scratch.glob(f"????-??-??-{label}-*"))
        got = read_measurement(found[-1] if found else None, self.plan.cell)
        wait = TEST_DELAY_ENV in env and float(env[TEST_DELAY_ENV][len("test-only:"):-2]) or None
        row = Measurement(index=index, kind=kind, pair=pair, side=target.side.name, exit_code=code,
                          seconds=time.perf_counter() - t0, started_at=started, delay_ms=wait, **got)  # fmt: skip
        self.rows.append(row)
        what = "warm-up" if kind == "warmup" else f"pair {pair + 1}/{self.plan.n_pairs}"
        self.progress(measured_line(row, what, self.plan.cell.metric) + f" (process, exit {code})")
        return row, log

    def prepare(self) -> dict[str, Any]:
        """One warm-up measurement per distinct side (B's after A's: its wait is a share of A's step); the first
        warm-up's sweep manifest. InputError quoting the side's last output lines when a warm-up fails."""
        from bench.runs import open_run

        a, b = self.targets
        share = self.plan.test_slowdown_b
        if share:
            self.env[a.side.name] = {TEST_DELAY_ENV: delay_value(A_WAIT_MS)}
        first, warmed = None, set()
        for t in (a, b):
            if t is b and share:
                cell, a_row = self.plan.cell, self.rows[0]
                cost, cost_from = ((a_row.step_ms, "the median decode step of A's warm-up sweep") if cell.metric ==
                                   "gauge" else (1000.0 / a_row.value, f"1000 / A's warm-up {cell.metric} rate"))  # fmt: skip
                wait = slowdown_wait_ms(cost, share, cell.metric, cell.max_new_tokens)
                self.env[b.side.name] = {TEST_DELAY_ENV: delay_value(wait)}
                self.injection = {**injection_record(share, cell.metric, cost, cost_from, wait, f"{TEST_DELAY_ENV} "
                                                     "of each process"), "variable": TEST_DELAY_ENV}  # fmt: skip
                self.progress(f"TEST-ONLY: side B's decode steps work {wait:.3f} ms more each, for {100 * share:g}% "
                              f"less {cell.metric} than A (A's cost {cost:.2f} ms per token: {cost_from}; A's steps "
                              f"{A_WAIT_MS:g} ms); recorded in the manifest")  # fmt: skip
            key = (str(t.checkout.root), t.side.flags, tuple(sorted(self.env[t.side.name].items())))
            if key in warmed:
                continue
            warmed.add(key)
            row, log = self._run(t, "warmup", None)
            if row.exit_code != 0 or row.value is None or (share and row.step_ms is None):
                raise InputError(f"side {t.side.describe()}: its warm-up measurement failed (exit {row.exit_code}"
                                 f"): {last_lines(log)}")  # fmt: skip
            first = first or (self.scratch / row.run)
        return open_run(first).manifest

    def measure(self, target: Target, pair: int) -> Measurement:
        """One measurement of `target` for pair `pair` (a failed process is a row without a value)."""
        return self._run(target, "pair", pair)[0]

    def command_line(self, target: Target) -> list[str]:
        """The command line of the side's measurements."""
        return self.argv[target.side.name]

    def environment(self, target: Target) -> dict[str, str]:
        """The environment variables the side's processes were given."""
        return dict(self.env[target.side.name])

    def close(self) -> None:
        """Nothing to stop: each process ended with its measurement."""
