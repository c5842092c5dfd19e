"""Like with like: which runs a report may set side by side, and the sentence a table carries when its runs differ.

**Session** (docs/method.md, "Comparisons"): runs of one device (chip), one host (its description, else its CPU
model), one build and one comparison group but for quantization, whose start times follow each other by at most
`SESSION_GAP_HOURS`. The build is the run's dense build id (`bench.runs.Manifest.dense_build_id`: the build id of its
code, checkpoint and engine configuration without quantization, so a dense run and quantized runs of one checkout
share it); a run without one (a quantized run recorded before it existed) belongs to no session. Runs of one
session were measured back to back on one machine: their ratios are the quantization's, not the host's drift or
another build's. `sessions_of` finds them; the "quantization on <device>" view (bench/report/quantview.py) compares
only within one.

**Key notes** (`key_note`): a table of several runs whose host, build or date differ names the keys that differ
and their values, with why the side-by-side is still meaningful (`WHY`, per kind of table), so no cross-host
table is silent about it (`bench.report.build` adds the note to every such table).

Standard library only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from bench.report.rows import RunKeys

SESSION_GAP_HOURS = 2.0
"""The longest pause between two consecutive runs of one session. The archived quantization sessions ran their
sets 2-5 minutes apart (2026-12-02 on the EPYC host: seven sets in 18 minutes; 2026-12-07 on the TPU v5e: three
sets in 5 minutes), and a lent TPU machine is held at most 30 minutes; two hours keeps a slow CPU session of eight
sets at four input sizes whole while runs of another day, or another lease of a machine, fall apart. A stated
choice, not a measured constant."""

COMPARED_KEYS = (("host", "host"), ("build_id", "build"), ("date", "date"))
"""The run keys a key note names when they differ among a table's runs: (RunKeys field, word)."""

WHY = {
    "devices": "a device-by-device view sets each device's latest run side by side; a ratio between its columns is "
               "the device's, host's and build's together (compare one build on one host with `bench compare`)",
    "decode-loop": "each run's two loops were measured in one session on one host: compare loops within a run, "
                   "not across runs",
    "profile": "each profile's shares are of its own run's device time; compare shares, not times, across hosts",
    "profile-batches": "each profile's shares are of its own run's device time; compare shares, not times",
    "batch": "the latest run per batch size; the curve mixes the batch with these keys",
    "concurrency": "the latest run per concurrency level; the curve mixes the concurrency with these keys",
    "history": "a history follows one configuration over time on purpose; a change between two hosts or builds "
               "is not the build's alone (the plot draws one line per host)",
    "runs": "a list of the group's runs, not a comparison",
    "environment": "the facts of each run, listed, not compared",
    "load": "the latest run per level; a level's figures are its own run's",
    "speedup": "the ratio is the device's, host's and build's together, not the build's alone",
    "quant-session": "one session (the same dense build id: code, checkpoint and engine configuration equal but "
                     "for the quantization and the w4 kernel option, which enter the build id), so the builds differ "
                     "by the set alone",
}  # fmt: skip
"""Per table kind (`bench.report.views.Table.kind`), why its runs may stand side by side though their keys differ."""


def key_note(keys: Sequence[RunKeys], kind: str) -> str | None:
    """"runs differ in host (A; B), build (x; y): WHY[kind]." for the keys of `COMPARED_KEYS` that take more than
    one value among `keys` (an unrecorded value reads "not recorded"); None when they agree (one run, or runs of
    one host, build and date)."""
    parts = []
    for field, word in COMPARED_KEYS:
        values = list(dict.fromkeys(getattr(k, field) or "not recorded" for k in keys))
        if len(values) > 1:
            parts.append(f"{word} ({'; '.join(values)})")
    if not parts:
        return None
    why = WHY.get(kind, "shown side by side as recorded: not a single-variable comparison")
    return f"runs differ in {', '.join(parts)}: {why}."


@dataclasses.dataclass(frozen=True, kw_only=True)
class Session:
    """Runs measured back to back on one machine (the module docstring): `device`, `host` (None: not recorded),
    `build` (the dense build id), `group_key` (the comparison group's key without quantization), `views` (the
    runs, RunViews, by start time), `start` and `end` (the first and last start, ISO)."""

    device: str
    host: str | None
    build: str
    group_key: tuple[tuple[str, Any], ...]
    views: tuple[Any, ...]
    start: str
    end: str

    def describe(self) -> str:
        """"TPU v5 lite, host unknown, dense build 172288152f28, runs started 2026-12-07 13:59..14:03 UTC"."""
        day, first, last = self.start[:10], self.start[11:16], self.end[11:16]
        span = first if first == last else f"{first}..{last}" if self.end[:10] == day else f"{first}..{self.end[:16]}"
        return (f"{self.device}, host {self.host or 'not recorded'}, dense build {self.build}, runs started {day} "
                f"{span} UTC")  # fmt: skip


def _start(keys: RunKeys) -> dt.datetime | None:
    try:
        t = dt.datetime.fromisoformat(keys.started_at) if keys.started_at else None
    except ValueError:
        return None
    return t if t is None or t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def sessions_of(groups: Sequence[Any]) -> list[Session]:
    """The sessions among the runs of measured `groups` (bench.report.groups.Group: every run of its pool, which
    passed the selection's filters, so a session keeps its dense run when `--latest-per` hides it): runs keyed by
    (group key without quantization, device, host, dense build id), each key's runs split where two consecutive
    starts are more than `SESSION_GAP_HOURS` apart. Runs without a start time or a dense build id are left out.
    In order of their first start."""
    by_key: dict[Any, list[tuple[dt.datetime, Any, RunKeys]]] = {}
    for g in groups:
        if g.published:
            continue
        rest = tuple((k, v) for k, v in g.key if k != "quantization")
        for v in g.pool:
            k, start, build = g.keys[v.name], _start(g.keys[v.name]), v.run.typed_manifest.dense_build_id
            if start is not None and build:
                by_key.setdefault((rest, k.device, k.host, build), []).append((start, v, k))
    out = []
    for (rest, device, host, build), runs in by_key.items():
        runs.sort(key=lambda r: (r[0], r[1].name))
        chunk = [runs[0]]
        for prev, cur in zip(runs, runs[1:]):
            if (cur[0] - prev[0]).total_seconds() > SESSION_GAP_HOURS * 3600:
                out.append(_session(device, host, build, rest, chunk))
                chunk = []
            chunk.append(cur)
        out.append(_session(device, host, build, rest, chunk))
    return sorted(out, key=lambda s: (s.start, s.device))


def _session(device: str, host: str | None, build: str, rest: Any, runs: list[tuple[dt.datetime, Any, RunKeys]]
             ) -> Session:  # fmt: skip
    return Session(device=device, host=host, build=build, group_key=rest, views=tuple(v for _, v, _ in runs),
                   start=runs[0][2].started_at, end=runs[-1][2].started_at)  # fmt: skip
