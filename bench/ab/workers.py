"""Worker mode of `bench ab` (the default; docs/commands/ab.md, "Worker mode"): one long-lived worker process per
side (`bench.ab.channel`, `bench.ab.worker`), started once in its side's checkout with its engine loaded and warm,
and the session alternating them request by request, so that the two measurements of a pair are seconds apart
instead of minutes.

- **start**: A's worker, then B's (each loads its engine, then says "ready" with the manifest `bench sweep` would
  write for it: build id, device, checkpoint); a device other than the CPU (`WORKER_PLATFORMS`) ends worker mode
  (`NotOnThisDevice`: the session falls back to process mode).
- **warm-ups**: `WARMUP_ROUNDS` rounds of one request of A then one of B (the first compiles, or reads the
  persistent compilation cache); archived, never in a figure.
- **the test-only slowdown** (`AbPlan.test_slowdown_b`): A's cost per token is taken from its warm-ups after the
  first (`a_cost`); B's work per step is `slowdown_wait_ms` of it; one more warm-up of B at that work compiles its
  program. Every request of A works `A_WAIT_MS` per step (the mechanism's own cost on both sides).
- **a measurement**: one timed request of the cell in the side's worker; its value the request's metric (tok/s).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ab.archive import Measurement
from bench.ab.channel import Worker
from bench.ab.protocol import WORKER_COMMAND
from bench.ab.plan import A_COST, A_WAIT_MS, METRICS, AbPlan, Target, a_cost, environment, injection_record, \
    measured_line, slowdown_wait_ms  # fmt: skip
from bench.errors import BenchError, InputError

WORKER_PLATFORMS = ("cpu",)
"""The devices two workers can hold at once. A TPU opens in one process at a time (the second worker could not
start), and JAX preallocates most of a GPU's memory in each process: there a session runs in process mode."""
WARMUP_ROUNDS = 3
"""Warm-up rounds (one request of A, then one of B) before the pairs: the first compiles, the others run warm and
give A's value for the test-only slowdown (a stated choice)."""


def worker_argv(plan: AbPlan, target: Target) -> list[str]:
    """The command line of a side's worker: `python -m bench ab-worker` with the cell, `--allow-test-delay` when
    the session injects a slowdown, and the side's flags (last, so the worker's parser names a bad one)."""
    allow = ["--allow-test-delay"] if plan.test_slowdown_b else []
    return [plan.python, "-m", "bench", WORKER_COMMAND, *plan.cell.worker_args(), *allow, *target.side.flags]


class NotOnThisDevice(BenchError):
    """The first worker runs on a device two workers cannot share (`WORKER_PLATFORMS`); its message is the line
    the session says before it falls back to process mode."""


class WorkerMeasurer:
    """The measurements of a worker-mode session (see the module docstring): `prepare` (start, warm-ups, the
    slowdown's wait), then `measure` one side for a pair, and `close`; `rows` holds every measurement made,
    `injection` the test-only slowdown."""

    def __init__(self, plan: AbPlan, a: Target, b: Target, scratch: Path, progress: Callable[[str], None]):
        self.plan, self.targets, self.progress = plan, (a, b), progress
        self.rows: list[Measurement] = []
        self.injection: dict[str, Any] | None = None
        self.wait: dict[str, float | None] = {a.side.name: None, b.side.name: None}
        self.build_id: dict[str, str | None] = {}
        self.steps: dict[int, list[float]] = {}  # each request's decode steps (ms), by its index
        self.workers = {t.side.name: Worker(t.side.name, worker_argv(plan, t), t.checkout.root, environment(),
                                            scratch / f"worker-{t.side.name.lower()}.log") for t in (a, b)}  # fmt: skip

    def _request(self, target: Target, kind: str, pair: int | None) -> Measurement:
        name, index = target.side.name, len(self.rows)
        reply = self.workers[name].measure("warmup" if kind == "warmup" else "timed", index, self.wait[name])
        value = reply.get(METRICS[self.plan.cell.metric])
        self.steps[index] = list(reply.get("step_times_ms") or [])
        row = Measurement(index=index, kind=kind, pair=pair, side=name, value=value, lo=value, hi=value, repeats=1,
                          repeat_values=(value,) if value is not None else (), valid=bool(reply["valid"]) and value
                          is not None, build_id=self.build_id[name], run=None, exit_code=None,
                          seconds=reply["seconds"], started_at=reply["started_at"], step_ms=reply["step_ms"],
                          delay_ms=reply["delay_ms"])  # fmt: skip
        self.rows.append(row)
        what = "warm-up" if kind == "warmup" else f"pair {pair + 1}/{self.plan.n_pairs}"
        why = "" if row.valid or kind == "warmup" else f" [{reply.get('invalid_reason')}]"
        self.progress(measured_line(row, what, self.plan.cell.metric) + why)
        return row

    def prepare(self) -> dict[str, Any]:
        """Start the workers, A's first, each ready before the next, run the warm-ups and set the test-only waits;
        A's sweep manifest. InputError (the side's last log lines) for a worker that ends before it is ready or
        whose first warm-up measures nothing; NotOnThisDevice when a worker's device is not one two workers share."""
        a, b = self.targets
        manifests = {}
        for t in (a, b):  # A first: its device says whether B's worker can hold it too
            self.workers[t.side.name].start()
            msg = self.workers[t.side.name].ready()
            platform = (msg["manifest"].get("device") or {}).get("platform")
            if platform not in WORKER_PLATFORMS:
                raise NotOnThisDevice(f"side {t.side.name}'s worker runs on {platform}, which one process at a time "
                                      "can hold (a TPU) or whose memory each process preallocates (a GPU): each "
                                      "measurement runs as its own `bench sweep` process (--mode processes)")  # fmt: skip
            manifests[t.side.name] = msg["manifest"]
            self.build_id[t.side.name] = msg["manifest"].get("build_id")
            self.progress(f"side {t.side.name}'s worker is ready: build id {self.build_id[t.side.name]}, engine "
                          f"loaded in {msg.get('load_s') or 0:.1f} s")  # fmt: skip
        share = self.plan.test_slowdown_b
        if share:
            self.wait[a.side.name] = self.wait[b.side.name] = A_WAIT_MS
        for _ in range(WARMUP_ROUNDS):
            for t in (a, b):
                row = self._request(t, "warmup", None)
                if row.value is None:
                    raise InputError(f"side {t.side.describe()}: its warm-up request measured nothing")
        if share:
            cell, warm = self.plan.cell, [r for r in self.rows if r.side == a.side.name][1:]
            cost = a_cost(cell.metric, [r.value for r in warm], [x for r in warm for x in self.steps[r.index]])
            wait = slowdown_wait_ms(cost, share, cell.metric, cell.max_new_tokens)
            self.wait[b.side.name] = wait
            self.injection = injection_record(share, cell.metric, cost, A_COST[cell.metric], wait, "CPU work per "
                                              "decode step in the side's worker, on the device's stream "
                                              "(model/engine.py, _delayed_step)")  # fmt: skip
            self.progress(f"TEST-ONLY: side B's decode steps work {wait:.3f} ms more each, for {100 * share:g}% "
                          f"less {cell.metric} than A (A's cost {cost:.2f} ms per token: {A_COST[cell.metric]}; A's "
                          f"steps {A_WAIT_MS:g} ms); recorded in the manifest")  # fmt: skip
            self._request(b, "warmup", None)  # compiles B's waiting program at its wait, outside any figure
        return manifests[a.side.name]

    def measure(self, target: Target, pair: int) -> Measurement:
        """One timed request of `target` for pair `pair`. WorkerError when its worker has ended."""
        return self._request(target, "pair", pair)

    def command_line(self, target: Target) -> list[str]:
        """The command line of the side's worker."""
        return self.workers[target.side.name].argv

    def environment(self, target: Target) -> dict[str, str]:
        """The environment variables set for the side's worker: none (the waits are per request)."""
        return {}

    def close(self) -> None:
        """Stop both workers (quit, then terminate or kill)."""
        for w in self.workers.values():
            w.close()
