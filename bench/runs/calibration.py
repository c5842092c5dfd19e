"""Calibrations of a host's noise between runs, and the rules by which one is chosen for a run (docs/method.md,
"Rerun intervals" and "The compare verdicts").

A **calibration** is an archived measurement of how far two runs of one build move apart on one host when nothing
changed. Two kinds are read from a runs folder (`candidates`):

- an **A/A session** of `bench ab` in process mode (`bench.ab.archive.is_calibration`: every measurement a whole
  `bench sweep` process): its pairs' ratios B / A;
- a **sweep pair**: two complete in-process sweeps (not through a server or a peer, without a test-only slowdown)
  of one build id and engine configuration (cells, repeats, order) on one host (`HostKey`), e.g. two consecutive
  `make sweep`s: per cell both measured validly and per gauge of either loop both have, the ratio of the later run's
  median to the earlier's.

Its noise (`Calibration.noise_pct`) is `bench.ab.stats.aa_noise_pct` of those ratios: the half-width, in percent,
of the 95% band of one rerun's ratio (1.96 x the root mean square of ln(ratio) about 0). A sweep pair's ratios share
one pair of sessions: they are one draw of the host's drift between sessions, seen in several cells.

**Choice** (`choose`; every refusal is said, `Choice.line`):
1. the same host (`HostKey.match`): the same machine where both runs recorded a machine id (`host.machine_id`), else
   the same device kind, CPU model and logical CPU count (the same host model; said so);
2. refused, with the reason: a worker-mode A/A session (pairs requests seconds apart in warm processes: its noise is
   not the noise between runs); fewer than `MIN_RATIOS` ratios; a noise above `MAX_NOISE_PCT` (measured in a loaded
   period); more than `MAX_AGE_DAYS` from the run; later than the run where only earlier ones count (`before`);
3. of the rest, the nearest in time to the run (its `started_at`; a calibration's time is the start of its latest
   session), ties to the pair whose sessions are closer together, then by name.

Standard library only (the `bench.runs` wall: no jax, no engine).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

MAX_NOISE_PCT = 25.0
"""The largest calibration noise used (percent). A stated choice, not a measurement: `bench compare`'s default gate
is 2 x the noise, so a calibration above 25% would set a gate above 50%, one that cannot catch a regression short of
half the speed; such a session measured a loaded period (the 2-core host's A/A session of 2026-12-07 16:46: 155.6%),
not the host's ordinary drift."""
MAX_AGE_DAYS = 7.0
"""The largest distance in time between a run and its calibration (days). A stated choice: hosts are updated,
migrated and re-tenanted; a calibration older than a week describes another week's host."""
MIN_RATIOS = 3
"""The fewest ratios a calibration needs (as `bench compare --calibration` asks of an A/A session: 3 pairs)."""

GAUGE_FIELDS = (("gauge_tok_s_median", "gauge"), ("device_gauge_tok_s_median", "device-loop gauge"))
"""(CellRow field, name) of the figures a sweep pair's ratios are taken of: the median decode gauge of each loop."""


def _get(d: Any, *path: str) -> Any:
    for key in path:
        d = d.get(key) if isinstance(d, Mapping) else None
    return d


def parse_time(text: Any) -> datetime | None:
    """An ISO 8601 time of a manifest (`started_at`), None when absent or unparsable."""
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostKey:
    """What identifies a run's host: `machine_id` (`host.machine_id`: a hash of the machine's id, recorded since
    2026-12-07; None before, or where the machine has none), `device_kind`, `cpu_model`, `logical_cpus`."""

    machine_id: str | None
    device_kind: str | None
    cpu_model: str | None
    logical_cpus: int | None

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> HostKey:
        return cls(machine_id=_get(manifest, "host", "machine_id"),
                   device_kind=_get(manifest, "device", "device_kind"), cpu_model=_get(manifest, "host", "cpu_model"),
                   logical_cpus=_get(manifest, "host", "logical_cpus"))  # fmt: skip

    @property
    def model(self) -> str:
        """"AMD EPYC, 2 CPUs, device cpu"."""
        return f"{self.cpu_model or 'unknown CPU'}, {self.logical_cpus or '?'} CPUs, device {self.device_kind or '?'}"

    def match(self, other: HostKey) -> str | None:
        """How `other` is this host ("the same machine (machine id)", "the same host model (...)"), None when it is
        not: another device kind or host model, another machine id, or a model not recorded."""
        if self.device_kind != other.device_kind:
            return None
        if self.machine_id and other.machine_id:
            return "the same machine (machine id)" if self.machine_id == other.machine_id else None
        if None in (self.cpu_model, self.logical_cpus) or (self.cpu_model, self.logical_cpus) != (
                other.cpu_model, other.logical_cpus):  # fmt: skip
            return None
        return f"the same host model ({self.model}; machine id not recorded by both runs)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """One archived calibration: `kind` "A/A session" or "sweep pair", `runs` its run folder names (one, or the
    earlier and the later sweep), `ratios` (unitless, B / A or later / earlier), `noise_pct`
    (`bench.ab.stats.aa_noise_pct`, percent; None below 2 ratios), `at` (the start of its latest session), `gap_s`
    (seconds between a pair's two starts; 0 for a session), `host` (its `HostKey`) and `refusal` (why it can never
    be used whatever the run, e.g. worker mode; None when it can)."""

    kind: str
    runs: tuple[str, ...]
    ratios: tuple[float, ...]
    noise_pct: float | None
    at: datetime | None
    gap_s: float
    host: HostKey
    refusal: str | None = None

    @property
    def name(self) -> str:
        return " + ".join(self.runs)

    def describe(self) -> str:
        """"sweep pair A + B (8 ratios, +-18.1% for one rerun)"."""
        noise = "" if self.noise_pct is None else f", +-{self.noise_pct:.1f}% for one rerun"
        return f"{self.kind} {self.name} ({len(self.ratios)} ratio{'s' * (len(self.ratios) != 1)}{noise})"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "runs": list(self.runs), "ratios": list(self.ratios), "noise_pct": self.noise_pct,
                "at": self.at.isoformat() if self.at else None, "gap_s": self.gap_s}  # fmt: skip


def _noise(ratios: list[float]) -> float | None:
    from bench.ab.stats import aa_noise_pct

    return aa_noise_pct(ratios) if len(ratios) >= 2 and all(r > 0 for r in ratios) else None


def _is_sweep(manifest: Mapping[str, Any]) -> bool:
    """A complete, measured, in-process sweep (not an A/B session, not a published or remote record) without a
    test-only slowdown (`bench.runs.manifest.TEST_INJECTION_KEY`: a change made on purpose, not noise)."""
    from bench.runs.manifest import TEST_INJECTION_KEY

    return (manifest.get("status") == "complete" and manifest.get("command") == "sweep" and manifest.get("kind") != "ab"
            and _get(manifest, "provenance", "kind") in (None, "measured") and not remote(manifest)
            and manifest.get(TEST_INJECTION_KEY) is None)  # fmt: skip


def remote(manifest: Mapping[str, Any]) -> str | None:
    """Why a run's `host` is not the machine it measured ("a sweep through a server" (`target`), "a peer engine's
    run" (`peer`)), None for a run measured on its own host."""
    if manifest.get("target") is not None:
        return "a sweep through a server: its host is not the machine measured"
    if manifest.get("peer") is not None:
        return "a peer engine's run: its host is not the machine measured"
    return None


def session_calibration(path: Path, manifest: Mapping[str, Any]) -> Calibration | None:
    """The `Calibration` of an A/A session of `bench ab` (worker mode: with its refusal); None for any other run."""
    from bench.ab.archive import is_ab_run, paired_values, read_pairs, session_mode

    if not is_ab_run(manifest) or not _get(manifest, "ab", "aa") or manifest.get("status") != "complete":
        return None
    from bench.errors import RunFolderError

    try:
        ratios = [b / a for _, a, b in paired_values(read_pairs(path)) if a > 0 and b > 0]
    except RunFolderError:
        return None
    refusal = None
    if session_mode(manifest) != "processes":
        refusal = "worker mode: it pairs requests seconds apart in warm processes, not runs"
    return Calibration(kind="A/A session", runs=(str(manifest.get("name") or path.name),), ratios=tuple(ratios),
                       noise_pct=_noise(ratios), at=parse_time(manifest.get("started_at")), gap_s=0.0,
                       host=HostKey.of(manifest), refusal=refusal)  # fmt: skip


def pair_ratios(rows_a: Iterable[Any], rows_b: Iterable[Any]) -> list[float]:
    """B's median over A's per cell ((input tokens, batch)) measured validly in both and per gauge of `GAUGE_FIELDS`
    both have (`bench.runs.CellRow`s), in cell order."""
    from bench.runs.records import cell_key

    b_rows = {cell_key(r): r for r in rows_b if r.valid}
    out = []
    for a in sorted((r for r in rows_a if r.valid), key=cell_key):
        b = b_rows.get(cell_key(a))
        for field, _name in GAUGE_FIELDS if b is not None else ():
            x, y = getattr(a, field), getattr(b, field)
            if x and y and x > 0 and y > 0:
                out.append(y / x)
    return out


def candidates(runs_dir: str | Path) -> list[Calibration]:
    """Every calibration in `runs_dir` (module docstring): its A/A sessions and every pair of its complete sweeps of
    one build id on one host (`HostKey.match`), earlier run first. [] when the folder does not exist. Unreadable
    run folders are skipped."""
    from bench.errors import RunFolderError
    from bench.runs.listing import open_run, run_folders

    root = Path(runs_dir)
    if not root.is_dir():
        return []
    out: list[Calibration] = []
    sweeps: dict[tuple, list[tuple[datetime, Path, dict]]] = {}
    for path in run_folders(root):
        try:
            manifest = open_run(path).manifest
        except RunFolderError:
            continue
        if (session := session_calibration(path, manifest)) is not None:
            out.append(session)
        elif _is_sweep(manifest) and manifest.get("build_id") and (at := parse_time(manifest.get("started_at"))):
            host = HostKey.of(manifest)
            config = json.dumps(manifest.get("engine_config"), sort_keys=True)  # the same cells, repeats, order
            sweeps.setdefault((manifest["build_id"], config, host.device_kind, host.cpu_model, host.logical_cpus),
                              []).append((at, path, manifest))  # fmt: skip
    for group in sweeps.values():
        for (t0, p0, m0), (t1, p1, m1) in itertools.combinations(sorted(group, key=lambda g: (g[0], g[1].name)), 2):
            h0, h1 = HostKey.of(m0), HostKey.of(m1)
            if h0.match(h1) is None:
                continue
            try:
                ratios = pair_ratios(open_run(p0).cells(), open_run(p1).cells())
            except RunFolderError:
                continue
            out.append(Calibration(kind="sweep pair", runs=(p0.name, p1.name), ratios=tuple(ratios),
                                   noise_pct=_noise(ratios), at=t1, gap_s=(t1 - t0).total_seconds(),
                                   host=h1))  # fmt: skip
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """The calibration chosen for a run, and why (`choose`): `chosen` (None: none usable), `why` (how it matched
    the run's host, its distance in time, how many were usable), `refused` ((calibration name, why) of every
    calibration of this host that was not used, nearest first) and `others` (how many calibrations of other hosts
    were left out)."""

    chosen: Calibration | None
    why: str
    refused: tuple[tuple[str, str], ...] = ()
    others: int = 0

    @property
    def noise_pct(self) -> float | None:
        return self.chosen.noise_pct if self.chosen is not None else None

    def short(self) -> str:
        """One clause for a verdict line: "calibration sweep pair A + B (8 ratios, +-18.1% for one rerun): why", or
        "no calibration: why"."""
        if self.chosen is None:
            return f"no calibration: {self.why}"
        return f"calibration {self.chosen.describe()}: {self.why}"

    def line(self, limit: int = 6) -> str:
        """`short`, then the refused calibrations of this host with their reasons (the nearest `limit`, then a
        count)."""
        text = self.short()
        if self.refused:
            shown = "; ".join(f"{name} ({why})" for name, why in self.refused[:limit])
            more = f"; and {len(self.refused) - limit} more" if len(self.refused) > limit else ""
            text += f"; refused: {shown}{more}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"chosen": self.chosen.to_json() if self.chosen else None, "why": self.why,
                "refused": [{"calibration": n, "why": w} for n, w in self.refused], "other_hosts": self.others,
                "rules": {"max_noise_pct": MAX_NOISE_PCT, "max_age_days": MAX_AGE_DAYS,
                          "min_ratios": MIN_RATIOS}}  # fmt: skip


def _days(seconds: float) -> str:
    days = seconds / 86400.0
    return f"{days:.1f} days" if days >= 1.0 else f"{seconds / 3600.0:.1f} hours"


def choose(found: Iterable[Calibration], manifest: Mapping[str, Any], *, exclude: Iterable[str] = (),
           before: bool = False) -> Choice:  # fmt: skip
    """The calibration for the run of `manifest` among `found`, by the rules of the module docstring. `exclude`:
    run names whose calibrations are left out (e.g. the runs a calibration is to be tested on); `before`: only
    calibrations whose latest session started before the run did (what the run could have known at its end)."""
    host, at = HostKey.of(manifest), parse_time(manifest.get("started_at"))
    skip = set(exclude)
    usable: list[tuple[float, float, str, Calibration, str]] = []
    refused: list[tuple[float, str, str]] = []
    others = 0
    for cal in found:
        if skip & set(cal.runs):
            continue
        how = host.match(cal.host)
        if how is None:
            others += 1
            continue
        distance = abs((at - cal.at).total_seconds()) if at and cal.at else float("inf")
        if before and at and cal.at and cal.at >= at:
            continue  # not yet measured when the run began
        why = cal.refusal
        if why is None and len(cal.ratios) < MIN_RATIOS:
            why = f"{len(cal.ratios)} ratio(s): a calibration needs at least {MIN_RATIOS}"
        if why is None and cal.noise_pct is not None and cal.noise_pct > MAX_NOISE_PCT:
            why = f"its noise +-{cal.noise_pct:.1f}% is above {MAX_NOISE_PCT:g}%: a loaded period"
        if why is None and distance > MAX_AGE_DAYS * 86400.0:
            why = ("no time recorded" if distance == float("inf") else
                   f"{_days(distance)} from the run, more than {MAX_AGE_DAYS:g} days")  # fmt: skip
        if why is None and cal.noise_pct is None:
            why = "no noise computable"
        if why is not None:
            refused.append((distance, cal.name, why))
        else:
            usable.append((distance, cal.gap_s, cal.name, cal, how))
    refused_sorted = tuple((name, why) for _, name, why in sorted(refused))
    if not usable:
        why = "none of this host usable" if refused else f"none recorded for this host ({host.model})"
        return Choice(chosen=None, why=why, refused=refused_sorted, others=others)
    usable.sort(key=lambda u: u[:3])
    distance, _gap, _name, cal, how = usable[0]
    side = "before" if at and cal.at and cal.at <= at else "after"
    why = f"{how}, {_days(distance)} {side} the run, the nearest of {len(usable)} usable"
    return Choice(chosen=cal, why=why, refused=refused_sorted, others=others)


def find(runs_dir: str | Path, manifest: Mapping[str, Any], *, exclude: Iterable[str] = (),
         before: bool = False) -> Choice:  # fmt: skip
    """`choose` among the `candidates` of `runs_dir`."""
    return choose(candidates(runs_dir), manifest, exclude=exclude, before=before)
