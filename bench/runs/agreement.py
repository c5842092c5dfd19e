"""A cell's two stated intervals, its repeat spread, and the rules by which two runs agree in a cell (docs/method.md,
"Interleaving" and "Rerun intervals").

- **within-sweep interval** of a cell's gauge (either loop's): [min, max] over its timed repeats, the `*_min` and
  `*_max` fields of `bench.runs.CellRow` (the "(min–max)" the sweep table prints beside the median). No model of the
  noise: the range of what was measured in this sweep, of repeats minutes apart.
- **repeat spread** (`spread_pct`): (max - min) / median x 100, the within-sweep interval's width as a share of the
  median, recorded on each row as `gauge_spread_pct` / `device_gauge_spread_pct` (`with_spreads`).
- **rerun interval** (`Widening.interval`): where a rerun of the same build on this host is stated to put the
  cell's median: the hull of the within-sweep interval and of every measured widening the run has, each named by
  its source (`Widening.sources`):
  - the sweep's own drift (`Drift`, from its rate probes between rounds: `sweep_drift`): median x [lowest probe /
    the probes' median, highest probe / the probes' median] of the read probe (the decode gauge's roofline
    denominator; the copy probe where a run has no read probe): the cell's median were the whole sweep run at the
    slowest or fastest state of the host its probes saw. Proportional to the probe: an upper bound where a step is
    memory-bound in part;
  - a calibration of this host (`bench.runs.calibration`: an earlier sweep pair or process-mode A/A session of the
    same host, chosen by its rules): median / (1 + c) .. median x (1 + c), c its noise (the 95% band of one rerun's
    ratio).
  With neither, the rerun interval is the within-sweep interval and says "within-sweep only: no calibration for this
  host".
- **agreement** (`agreement`): two measurements of one cell agree in a gauge
  - by their within-sweep intervals when those overlap (the larger minimum is at most the smaller maximum);
  - by their rerun intervals when each run's median lies inside the other's rerun interval: a rerun interval states
    where a rerun's median lands, so the check is whether each run landed where the other said (overlap of two rerun
    intervals would allow twice the stated drift).
  Two runs agree when every cell both measured validly agrees in every gauge both have.
- With nothing changed and every repeat an independent draw from one distribution, two ranges of n and m repeats
  are disjoint with probability 2 / C(n + m, n) (`disjoint_chance`: one of the C(n + m, n) equally likely
  interleavings of the two sets puts all of one below all of the other, and the same the other way): 10% for 3
  and 3 repeats, 2.9% for 4 and 4, 0.8% for 5 and 5. The within-sweep rule is strict at the default 3 repeats, and
  it assumes no drift between the sweeps: a host that drifts more between sessions than within one breaks it.

Standard library only (like the rest of `bench.runs`). `python -m bench.runs.agreement RUN_A RUN_B` prints the
comparison of two run folders, one line per cell and gauge under both kinds of interval, and exits 0 when they agree
by their rerun intervals, 1 when a cell does not.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.runs.calibration import Choice
from bench.runs.records import CellRow, cell_key

GAUGES = (("gauge_tok_s", "gauge"), ("device_gauge_tok_s", "device-loop gauge"))
"""(the CellRow field stem, its name) of each figure the agreement rule checks: the decode gauge of each loop."""
RERUN_KEY = "rerun_intervals"
"""The run manifest's key of the rerun intervals an in-process sweep stated at its end (`stated`;
docs/run-folder.md)."""
WITHIN_ONLY = "within-sweep only: no calibration for this host"
"""What a rerun interval says when no widening was measured: it is the within-sweep interval."""


def spread_pct(median: float | None, lo: float | None, hi: float | None) -> float | None:
    """(hi - lo) / median x 100: a stated interval's width as a share of its median (%); None where any is
    unknown or the median is not positive."""
    if median is None or lo is None or hi is None or not median > 0:
        return None
    return 100.0 * (hi - lo) / median


def with_spreads(row: CellRow) -> CellRow:
    """`row` with `gauge_spread_pct` and `device_gauge_spread_pct` (`spread_pct` of each gauge's median, min and
    max), each None where the gauge has no repeats."""
    spreads = {f"{stem}_spread_pct".replace("_tok_s", ""): spread_pct(*(getattr(row, f"{stem}_{s}")
                                                                         for s in ("median", "min", "max")))
               for stem, _name in GAUGES}  # fmt: skip
    return dataclasses.replace(row, **spreads)


def disjoint_chance(n: int, m: int) -> float:
    """The probability that the ranges of n and m independent draws from one continuous distribution do not
    overlap: 2 / C(n + m, n) (module docstring). ValueError for n or m below 1."""
    if n < 1 or m < 1:
        raise ValueError(f"disjoint_chance: expected at least 1 draw each, got {n} and {m}")
    return 2.0 / math.comb(n + m, n)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Drift:
    """How far a sweep's host moved by its own rate probes between rounds: `probe` ("read" or "copy"), `probes`
    (how many), `low` and `high` (the lowest and highest probe over the probes' median; unitless)."""

    probe: str
    probes: int
    low: float
    high: float

    def describe(self) -> str:
        """"the sweep's read probe -27.0%..+5.4% around its median (4 probes)"."""
        return (f"the sweep's {self.probe} probe {100 * (self.low - 1):+.1f}%..{100 * (self.high - 1):+.1f}% around "
                f"its median ({self.probes} probes)")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sweep_drift(manifest: Mapping[str, Any]) -> Drift | None:
    """The `Drift` of a run's probes between rounds (`rates.probes`, `bench.sweep.rates.RoundProbes`): of the read
    probe where at least 2 probes have it, else of the copy probe; None with fewer than 2 (a sequential sweep, a
    remote one, a run from before interleaving)."""
    probes = ((manifest.get("rates") or {}).get("probes") or []) if isinstance(manifest, Mapping) else []
    for key, name in (("read_bytes_s", "read"), ("copy_bytes_s", "copy")):
        xs = [float(p[key]) for p in probes if isinstance(p, Mapping) and "error" not in p and p.get(key)]
        if len(xs) >= 2:
            mid = statistics.median(xs)
            return Drift(probe=name, probes=len(xs), low=min(xs) / mid, high=max(xs) / mid)
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Widening:
    """A run's measured widenings of its cells' within-sweep intervals into rerun intervals (module docstring):
    `drift` (None: no probes) and `calibration` (`bench.runs.calibration.Choice`; None or a choice without one: no
    calibration)."""

    drift: Drift | None
    calibration: Choice | None = None

    @property
    def calibration_pct(self) -> float | None:
        return self.calibration.noise_pct if self.calibration is not None else None

    def interval(self, median: float, lo: float, hi: float) -> tuple[float, float]:
        """The rerun interval (tok/s) of a cell's gauge of `median` and within-sweep interval [lo, hi] (tok/s)."""
        if self.drift is not None:
            lo, hi = min(lo, median * self.drift.low), max(hi, median * self.drift.high)
        if (c := self.calibration_pct) is not None:
            lo, hi = min(lo, median / (1 + c / 100)), max(hi, median * (1 + c / 100))
        return lo, hi

    def sources(self) -> str:
        """Every widening with its measured source, or `WITHIN_ONLY`."""
        parts = []
        if self.drift is not None:
            parts.append(self.drift.describe())
        if not parts and (self.calibration is None or self.calibration.chosen is None):
            return WITHIN_ONLY + (f" ({self.calibration.why})" if self.calibration else "")
        parts.append(self.calibration.short() if self.calibration else "no calibration for this host")
        return "; ".join(parts)

    def without_calibration(self) -> Widening:
        return Widening(drift=self.drift)


def _triple(row: CellRow, stem: str) -> tuple[float, float, float] | None:
    t = tuple(getattr(row, f"{stem}_{s}") for s in ("median", "min", "max"))
    return None if None in t else t  # type: ignore[return-value]


def _cell(row: CellRow) -> str:
    return str(row.input_tokens) if row.batch is None else f"{row.input_tokens}x{row.batch}"


def stated(rows: Iterable[CellRow], widening: Widening) -> dict[str, Any]:
    """What an in-process sweep records under `RERUN_KEY` at its end (docs/run-folder.md): the definition, the
    widenings with their sources (`drift`, `calibration`: `Choice.to_json`, `sources`: one line) and per valid cell
    and gauge its median, within-sweep interval and rerun interval (tok/s)."""
    cells = []
    for row in sorted((r for r in rows if r.valid), key=cell_key):
        for stem, name in GAUGES:
            if (t := _triple(row, stem)) is not None:
                cells.append({"cell": _cell(row), "input_tokens": row.input_tokens, "batch": row.batch,
                              "figure": name, "median": t[0], "within": [t[1], t[2]],
                              "rerun": list(widening.interval(*t))})  # fmt: skip
    return {"definition": "docs/method.md, Rerun intervals", "sources": widening.sources(),
            "drift": widening.drift.to_json() if widening.drift else None,
            "calibration": widening.calibration.to_json() if widening.calibration else None,
            "cells": cells}  # fmt: skip


def stated_lines(record: Mapping[str, Any]) -> list[str]:
    """The sweep's end lines for its `stated` record: the sources, then one line per cell and gauge."""
    out = [f"rerun intervals (where a rerun of this build on this host is stated to land; docs/method.md, Rerun "
           f"intervals): {record['sources']}"]  # fmt: skip
    for c in record["cells"]:
        out.append(f"  {c['cell']} {c['figure']}: {c['median']:.2f} tok/s, within-sweep {c['within'][0]:.2f}–"
                   f"{c['within'][1]:.2f}, rerun {c['rerun'][0]:.2f}–{c['rerun'][1]:.2f}")  # fmt: skip
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellAgreement:
    """One cell's gauge in two runs: `cell` ("41", "41x8"), `figure` (a name of `GAUGES`), `a` and `b` (each
    (median, min, max), tok/s), `agree` (the within-sweep intervals overlap), `rerun_a` and `rerun_b` (each run's
    rerun interval, tok/s), `rerun_agree` (each median inside the other's rerun interval) and `drift_agree` (the
    same with the sweeps' own drift alone, no calibration: what a host without one would say)."""

    cell: str
    figure: str
    a: tuple[float, float, float]
    b: tuple[float, float, float]
    agree: bool
    rerun_a: tuple[float, float] | None = None
    rerun_b: tuple[float, float] | None = None
    rerun_agree: bool | None = None
    drift_agree: bool | None = None

    @property
    def line(self) -> str:
        """"41 gauge: 62.10 (within-sweep 61.20–63.00, rerun 55.1–66.3) vs 61.50 (...): within-sweep agree, rerun
        agree"."""
        def word(ok: bool | None) -> str:
            return "—" if ok is None else "agree" if ok else "DISAGREE"

        def text(t: tuple[float, float, float], r: tuple[float, float] | None) -> str:
            rerun = "" if r is None else f", rerun {r[0]:.2f}–{r[1]:.2f}"
            return f"{t[0]:.2f} (within-sweep {t[1]:.2f}–{t[2]:.2f}{rerun})"

        verdict = f"within-sweep {word(self.agree)}"
        if self.rerun_agree is not None:
            verdict += f", rerun {word(self.rerun_agree)} (probes alone: {word(self.drift_agree)})"
        return f"{self.cell} {self.figure}: {text(self.a, self.rerun_a)} vs {text(self.b, self.rerun_b)}: {verdict}"


def _inside(x: float, iv: tuple[float, float]) -> bool:
    return iv[0] <= x <= iv[1]


def agreement(rows_a: Iterable[CellRow], rows_b: Iterable[CellRow], widen_a: Widening | None = None,
              widen_b: Widening | None = None) -> list[CellAgreement]:  # fmt: skip
    """Per cell measured validly in both runs ((input tokens, batch)), in cell order, and per gauge of `GAUGES` that
    both rows have (median, min and max): whether the within-sweep intervals overlap and, given both runs'
    widenings, whether each median lies inside the other's rerun interval (with and without calibration)."""
    b_rows = {cell_key(r): r for r in rows_b if r.valid}
    out = []
    for a in sorted((r for r in rows_a if r.valid), key=cell_key):
        b = b_rows.get(cell_key(a))
        if b is None:
            continue
        for stem, name in GAUGES:
            ta, tb = _triple(a, stem), _triple(b, stem)
            if ta is None or tb is None:
                continue
            overlap = max(ta[1], tb[1]) <= min(ta[2], tb[2])
            extra: dict[str, Any] = {}
            if widen_a is not None and widen_b is not None:
                ra, rb = widen_a.interval(*ta), widen_b.interval(*tb)
                da, db = widen_a.without_calibration().interval(*ta), widen_b.without_calibration().interval(*tb)
                extra = {"rerun_a": ra, "rerun_b": rb, "rerun_agree": _inside(tb[0], ra) and _inside(ta[0], rb),
                         "drift_agree": _inside(tb[0], da) and _inside(ta[0], db)}  # fmt: skip
            out.append(CellAgreement(cell=_cell(a), figure=name, a=ta, b=tb, agree=overlap, **extra))
    return out


def widening_of(run: Any, runs_dir: Any = None, exclude: Iterable[str] = ()) -> Widening:
    """A run folder's `Widening`: its probes' drift and the calibration it stated at its end (`RERUN_KEY`), or,
    for a run that stated none, the calibration `bench.runs.calibration.find` chooses now in `runs_dir` (default:
    the run's own folder's parent) among those measured before the run began, leaving out `exclude` (run names)."""
    from bench.runs.calibration import Calibration, HostKey, find, parse_time

    m = run.manifest
    drift = sweep_drift(m)
    record = m.get(RERUN_KEY)
    if isinstance(record, Mapping) and isinstance(record.get("calibration"), Mapping):
        cal = record["calibration"]
        chosen = cal.get("chosen")
        picked = None if not chosen else Calibration(
            kind=chosen["kind"], runs=tuple(chosen["runs"]), ratios=tuple(chosen["ratios"]),
            noise_pct=chosen["noise_pct"], at=parse_time(chosen.get("at")), gap_s=chosen.get("gap_s", 0.0),
            host=HostKey.of(m))  # fmt: skip
        refused = tuple((r["calibration"], r["why"]) for r in cal.get("refused") or [])
        return Widening(drift=drift, calibration=Choice(chosen=picked, why=cal.get("why", ""), refused=refused,
                                                        others=cal.get("other_hosts", 0)))  # fmt: skip
    return Widening(drift=drift, calibration=find(runs_dir or run.path.parent, m, exclude=exclude, before=True))


def state(run: Any) -> list[str]:
    """At the end of an in-process sweep of `run` (a writable `bench.runs.RunFolder`): its `Widening` (its probes'
    drift; the calibration `bench.runs.calibration.find` chooses in the run's parent folder among those measured
    before it began), recorded in its manifest under `RERUN_KEY` (`stated`); returns the end lines (`stated_lines`)."""
    from bench.runs.calibration import find, remote

    elsewhere = remote(run.manifest)
    calibration = (Choice(chosen=None, why=elsewhere) if elsewhere else
                   find(run.path.parent, run.manifest, exclude=(run.name,), before=True))  # fmt: skip
    widening = Widening(drift=sweep_drift(run.manifest), calibration=calibration)
    record = stated(run.cells(), widening)
    run.update_manifest(**{RERUN_KEY: record})
    return stated_lines(record)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.runs.agreement RUN_A RUN_B [--runs-dir DIR]`: each cell's gauges in both runs and whether
    they agree by their within-sweep and by their rerun intervals; exit 0 when every compared cell agrees by its
    rerun intervals, 1 when one does not, 2 for bad arguments or no cell in common. A run that stated no rerun
    intervals (archived before they existed) gets its calibration chosen now from DIR (default: the run's parent
    folder), never one that holds either run."""
    from bench.errors import RunFolderError
    from bench.runs import open_run

    args = list(sys.argv[1:] if argv is None else argv)
    runs_dir = None
    if "--runs-dir" in args:
        i = args.index("--runs-dir")
        if i + 1 >= len(args):
            print("--runs-dir needs a folder; usage: python -m bench.runs.agreement RUN_A RUN_B [--runs-dir DIR]")
            return 2
        runs_dir = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        print(f"expected two run folders, got {len(args)} argument(s); usage: python -m bench.runs.agreement RUN_A "
              "RUN_B [--runs-dir DIR]")
        return 2
    try:
        run_a, run_b = open_run(args[0]), open_run(args[1])
        names = (run_a.name, run_b.name)
        widen = [widening_of(r, runs_dir, exclude=names) for r in (run_a, run_b)]
        found = agreement(run_a.cells(), run_b.cells(), *widen)
    except RunFolderError as exc:
        print(f"error: {exc}")
        return 2
    if not found:
        print(f"no valid cell in common between {args[0]} and {args[1]}: nothing to compare")
        return 2
    for run, w in zip((run_a, run_b), widen):
        stated_by = "stated by the run" if RERUN_KEY in run.manifest else "chosen now: the run stated none"
        print(f"{run.name} rerun interval ({stated_by}): {w.sources()}")
        if w.calibration is not None and w.calibration.refused:
            print(f"  refused: " + "; ".join(f"{n} ({why})" for n, why in w.calibration.refused))
    for c in found:
        print(c.line)
    n = len(found)
    print(f"within-sweep intervals (min–max of the timed repeats, agree = overlap): {sum(c.agree for c in found)} of "
          f"{n} agree")  # fmt: skip
    print(f"rerun intervals, the sweeps' probes alone (agree = each median inside the other's): "
          f"{sum(bool(c.drift_agree) for c in found)} of {n} agree")  # fmt: skip
    print(f"rerun intervals, probes and calibration (agree = each median inside the other's): "
          f"{sum(bool(c.rerun_agree) for c in found)} of {n} agree (docs/method.md, Rerun intervals)")  # fmt: skip
    return 0 if all(c.rerun_agree for c in found) else 1


if __name__ == "__main__":
    raise SystemExit(main())
