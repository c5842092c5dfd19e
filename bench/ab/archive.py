"""The run folder of an A/B session (kind "ab"; docs/run-folder.md, docs/commands/ab.md): its measurements file
`pairs.csv` and the manifest's `ab` object, written by `bench.ab.session` and read by the report and
`bench compare`. Standard library only.

`pairs.csv` holds one row per measurement (a worker's request, or a `python -m bench sweep` process), in the order
they ran, warm-ups first: `Measurement`'s fields, `repeat_values` as JSON text (sessions archived before worker mode
lack the last two columns, `step_ms` and `delay_ms`; they read as None). The manifest's top-level `kind` is "ab"
and its `ab` object holds the mode ("workers" or "processes"; absent before worker mode: processes), the sides (text, build,
flags, checkout, commit, build ids, the command line of a measurement or of the worker), the cell, the metric, the
order of the pairs, the statistics' settings, the verdict (`bench.ab.stats.AbVerdict`), and `test_injection` where
a test-only slowdown was set.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from bench.errors import RunFolderError
from bench.runs.schema import AB_PAIRS

AB_KIND = "ab"
"""The manifest's `kind` of an A/B session's run folder."""
PAIRS = AB_PAIRS
"""The measurements file of an A/B run folder (`bench.runs.schema.AB_PAIRS`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measurement:
    """One measurement of an A/B session: in worker mode one request of a side's worker, in process mode one
    `python -m bench sweep` process.

    `index`: its place in the session (0-based, warm-ups first); `kind`: "warmup" (not in any figure) or "pair";
    `pair`: the pair's number (0-based; None for a warm-up); `side`: "A" or "B"; `value`: the metric (tok/s: the
    request's, or the median over the process's timed repeats), None when nothing valid was measured;
    `lo`, `hi`: the min and max over its repeats (tok/s; a request's own value in worker mode); `repeats`: timed
    repeats (1 in worker mode); `repeat_values`: each repeat's metric (tok/s); `valid`: the request's or the cell's
    validity (docs/method.md, "Per cell"); `build_id`: the side's; `run`: the sweep's run folder name (None in worker
    mode); `exit_code`: the process's (None in worker mode: the worker lives on); `seconds`: its wall time (s);
    `started_at`: ISO 8601; `step_ms`: the request's median decode step (ms; None in process mode); `delay_ms`: the
    test-only wait per decode step it ran with (ms; None without: `bench ab --test-slowdown-b`)."""

    index: int
    kind: str
    pair: int | None
    side: str
    value: float | None
    lo: float | None
    hi: float | None
    repeats: int | None
    repeat_values: tuple[float, ...]
    valid: bool
    build_id: str | None
    run: str | None
    exit_code: int | None
    seconds: float
    started_at: str
    step_ms: float | None = None
    delay_ms: float | None = None


FIELDS = tuple(f.name for f in dataclasses.fields(Measurement))


def pairs_csv(rows: list[Measurement]) -> str:
    """The text of pairs.csv: a header of `FIELDS`, then one line per measurement (empty for None, JSON for the
    repeat values, numbers unrounded)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for m in rows:
        d = dataclasses.asdict(m)
        d["repeat_values"] = json.dumps(list(m.repeat_values))
        writer.writerow(["" if d[k] is None else d[k] for k in FIELDS])
    return out.getvalue()


def _opt(text: str, cast):  # noqa: ANN001, ANN202
    return None if text == "" else cast(text)


def read_pairs(path: str | Path) -> list[Measurement]:
    """The measurements of an A/B run folder's pairs.csv. RunFolderError naming the file and line when it is
    missing or a row does not parse."""
    p = Path(path) / PAIRS
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RunFolderError(f"{p}: unreadable ({exc.strerror or exc})") from None
    out = []
    for line, row in enumerate(csv.DictReader(io.StringIO(text)), 2):
        try:
            out.append(Measurement(
                index=int(row["index"]), kind=row["kind"], pair=_opt(row["pair"], int), side=row["side"],
                value=_opt(row["value"], float), lo=_opt(row["lo"], float), hi=_opt(row["hi"], float),
                repeats=_opt(row["repeats"], int), repeat_values=tuple(json.loads(row["repeat_values"] or "[]")),
                valid=row["valid"] == "True", build_id=row["build_id"] or None, run=row["run"] or None,
                exit_code=_opt(row["exit_code"], int), seconds=float(row["seconds"]), started_at=row["started_at"],
                step_ms=_opt(row.get("step_ms") or "", float), delay_ms=_opt(row.get("delay_ms") or "", float),
            ))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise RunFolderError(f"{p} line {line}: not a measurement row ({exc})") from None
    return out


def is_ab_run(manifest: Any) -> bool:
    """True when a parsed manifest is an A/B session's (top-level `kind` "ab")."""
    return isinstance(manifest, dict) and manifest.get("kind") == AB_KIND


def paired_values(rows: list[Measurement]) -> list[tuple[int, float, float]]:
    """(pair, A's value, B's value) of every pair both of whose measurements have a value, in pair order."""
    by_pair: dict[int, dict[str, float]] = {}
    for m in rows:
        if m.kind == "pair" and m.pair is not None and m.value is not None and m.valid:
            by_pair.setdefault(m.pair, {})[m.side] = m.value
    return [(k, v["A"], v["B"]) for k, v in sorted(by_pair.items()) if "A" in v and "B" in v]


def session_mode(manifest: Any) -> str:
    """The mode of an A/B session's manifest: "workers" or "processes" (a session archived before worker mode)."""
    return ((manifest or {}).get("ab") or {}).get("mode") or "processes"


def is_calibration(manifest: Any) -> bool:
    """True when an A/B session can calibrate `bench compare` (docs/method.md, "The compare verdicts"): an A/A
    session (`ab.aa`) of the process mode, whose pairs are whole runs apart as two compared runs are. A worker-mode
    A/A pairs requests seconds apart in warm processes: its noise is not the noise between two runs."""
    return is_ab_run(manifest) and bool((manifest.get("ab") or {}).get("aa")) and session_mode(manifest) == "processes"
