"""A cell's stated interval, its repeat spread, and the rule by which two runs agree in a cell (docs/method.md,
"Interleaving").

- **stated interval** of a cell's gauge (either loop's): [min, max] over its timed repeats, the `*_min` and `*_max`
  fields of `bench.runs.CellRow` (the "(min–max)" the sweep table prints beside the median). No model of the
  noise: the range of what was measured.
- **repeat spread** (`spread_pct`): (max - min) / median x 100, the interval's width as a share of the median,
  recorded on each row as `gauge_spread_pct` / `device_gauge_spread_pct` (`with_spreads`).
- **agreement** (`agreement`): two measurements of one cell agree in a gauge when their stated intervals overlap
  (the larger minimum is at most the smaller maximum). Two runs agree when every cell both measured validly
  agrees in every gauge both have.
- With nothing changed and every repeat an independent draw from one distribution, two ranges of n and m repeats
  are disjoint with probability 2 / C(n + m, n) (`disjoint_chance`: one of the C(n + m, n) equally likely
  interleavings of the two sets puts all of one below all of the other, and the same the other way): 10% for 3
  and 3 repeats, 2.9% for 4 and 4, 0.8% for 5 and 5. The rule is strict at the default 3 repeats: a run of
  several cells and two loops fails it by chance alone more often than a single cell does.

Standard library only (like the rest of `bench.runs`). `python -m bench.runs.agreement RUN_A RUN_B` prints the
comparison of two run folders, one line per cell and gauge, and exits 0 when they agree, 1 when a cell does not.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable, Sequence

from bench.runs.records import CellRow, cell_key

GAUGES = (("gauge_tok_s", "gauge"), ("device_gauge_tok_s", "device-loop gauge"))
"""(the CellRow field stem, its name) of each figure the agreement rule checks: the decode gauge of each loop."""


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
class CellAgreement:
    """One cell's gauge in two runs: `cell` ("41", "41x8"), `figure` (a name of `GAUGES`), `a` and `b` (each
    (median, min, max), tok/s) and `agree` (the stated intervals overlap)."""

    cell: str
    figure: str
    a: tuple[float, float, float]
    b: tuple[float, float, float]
    agree: bool

    @property
    def line(self) -> str:
        """"41 gauge: 62.10 (61.20–63.00) vs 61.50 (60.10–62.70): agree"."""
        def text(t: tuple[float, float, float]) -> str:
            return f"{t[0]:.2f} ({t[1]:.2f}–{t[2]:.2f})"

        return f"{self.cell} {self.figure}: {text(self.a)} vs {text(self.b)}: {'agree' if self.agree else 'DISAGREE'}"


def agreement(rows_a: Iterable[CellRow], rows_b: Iterable[CellRow]) -> list[CellAgreement]:
    """Per cell measured validly in both runs ((input tokens, batch)), in cell order, and per gauge of `GAUGES` that
    both rows have (median, min and max): whether the stated intervals overlap."""
    b_rows = {cell_key(r): r for r in rows_b if r.valid}
    out = []
    for a in sorted((r for r in rows_a if r.valid), key=cell_key):
        b = b_rows.get(cell_key(a))
        if b is None:
            continue
        for stem, name in GAUGES:
            ta, tb = (tuple(getattr(r, f"{stem}_{s}") for s in ("median", "min", "max")) for r in (a, b))
            if None in ta or None in tb:
                continue
            cell = str(a.input_tokens) if a.batch is None else f"{a.input_tokens}x{a.batch}"
            overlap = max(ta[1], tb[1]) <= min(ta[2], tb[2])
            out.append(CellAgreement(cell=cell, figure=name, a=ta, b=tb, agree=overlap))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.runs.agreement RUN_A RUN_B`: each cell's gauges in both runs and whether they agree; exit 0
    when every compared cell agrees, 1 when one does not, 2 for bad arguments or no cell in common."""
    from bench.errors import RunFolderError
    from bench.runs import open_run

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(f"expected two run folders, got {len(args)} argument(s); usage: python -m bench.runs.agreement RUN_A "
              "RUN_B")
        return 2
    try:
        found = agreement(open_run(args[0]).cells(), open_run(args[1]).cells())
    except RunFolderError as exc:
        print(f"error: {exc}")
        return 2
    if not found:
        print(f"no valid cell in common between {args[0]} and {args[1]}: nothing to compare")
        return 2
    for c in found:
        print(c.line)
    bad = [c for c in found if not c.agree]
    print(f"{len(found) - len(bad)} of {len(found)} agree (stated interval: min–max of the timed repeats; "
          "docs/method.md, Interleaving)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
