"""Compare two archived runs: speed per cell with an interval that knows the noise, token agreement, payload
differences, a verdict.

Reads run folders only (no jax, no `model/`), so it works on archived runs of machines that are gone, and it can
gate a deployment: `Comparison.exit_code` is 0 PASS, 1 FAIL (a threshold crossed), 3 UNRESOLVED (`EXIT_CODES`).

The speed verdict (docs/method.md, "The compare verdicts"): per cell both runs have, for the gauge and the
end-to-end rate, an interval of the ratio candidate / baseline from the two runs' timed repeats
(`bench.ab.stats.ratio_interval`; the min-max spreads without raw samples), widened by a calibration of the host
where one is given or chosen (`calibration_noise`: an A/A session of `bench ab`; `find_calibration`: the nearest
usable A/A session or sweep pair of the candidate's host, `bench.runs.calibration`); the gate is `max_slowdown_pct`
when given, else NOISE_FACTOR x the noise (`Noise`); a cell and metric is PASS, FAIL or UNRESOLVED as its interval
lies above, below or across 1 - gate (`CellDelta.verdicts`).

Thresholds (each a reason in `Comparison.failures`; an unresolved cell is a line of `Comparison.unresolved`):
- a candidate's median gauge or end-to-end tok/s whose interval lies wholly more than the gate below the baseline's;
- a candidate cell that is invalid or failed, or missing where the baseline has one;
- with `require_same_tokens`, generated ids that differ at a cell, or that cannot be checked (no raw samples);
- at a load level both runs have (a sweep under load, `LevelDelta`): a candidate's output throughput more than
  the gate below the baseline's (a level has no repeats: its point alone), or a candidate level that is invalid. Levels of one run only are named
  in the notes, not compared.

Token agreement compares the first timed repeat's generated ids (greedy decoding makes every repeat equal; a run
whose own repeats disagree gets a note): the host loop's, or the device loop's in a run that timed only that.
`TokenAgreement` gives the index of the first differing token and the share of the compared positions (all
`max_new_tokens` of them, 64 by default) whose ids are equal, position by position.

Accuracy (a quantized run against a dense one, docs/method.md "Quantized weights"): where both runs recorded the
next-token logits of a cell (`bench.runs.logits`: float32 [V], the prefill's logits at the prompt's last position,
softcap applied), `LogitAgreement` gives max_v |a_v - b_v| and mean_v |a_v - b_v| in logit units over the V
vocabulary entries, and whether their argmax (the first greedy token) agrees. Over the sweep's prompts means one
figure per cell (input size); nothing is pooled. A run without logits says "no logits recorded", never fails; these
figures are shown, never a threshold.

Where both runs measured their host's copy bandwidth (in-process sweeps, `bench.runs.copy_bandwidths_of`), a note
gives each one's before its first cell and after its last, and the candidate's start against the baseline's: how
much of a speed difference the host alone may account for. Shown, never a threshold.

The device decode loop's figures (`--decode-loop device|both`) are compared where both runs have them
(`CellDelta.device_gauge_delta_pct`, each side's host overhead per step): shown, never a threshold, so a run
without them compares as it always did.

A cell is (input tokens, batch) (`bench.runs.cell_key`): `--batch` sweeps are matched batch by batch (a run without
--batch has B = 1 cells only); greedy ids and logits are compared at B = 1 (each batch cell's rows are compared with
B = 1 inside its own run, `CellRow.rows_differ`).

Partial cells (fewer timed repeats than planned: a stopped sweep, or `--max-duration`) are compared and count toward
the verdict like any cell: their medians are of the repeats they have, which is a real but thinner measurement.
They are never silent: `Comparison.partial` names each one (side, run, input size, k of N repeats, what stopped
it) and `Comparison.verdict` reads "PASS with partial cells: ..." (or FAIL). A single-variable comparison needs equal build id, checkpoint hash,
configuration and weight bytes (docs/method.md, "Comparisons"); `manifest_differences` says which differ. Two runs
that differ only in quantization (`quant_variable`: the quantization and what it changes by itself, with equal
dense build ids) are a single-variable comparison in it (`Comparison.variable`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bench.errors import RunFolderError
from bench.runs import (
    CellRow,
    CheckpointFacts,
    LoadRow,
    Manifest,
    RunFolder,
    Sample,
    cell_key,
    copy_bandwidths_of,
    drift_pct,
    open_complete_run,
)
from bench.runs.calibration import Choice
from bench.runs.logits import read_logits

SINGLE_VARIABLE_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("build id", ("build_id",)),
    ("checkpoint hash", ("checkpoint", "content_hash")),
    ("configuration", ("engine_config",)),
    ("weight bytes", ("checkpoint", "weight_bytes")),
)
"""The four manifest values that must be equal (and known) for a single-variable comparison."""

_CONTEXT_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("device", ("device", "device_kind")),
    ("compute capability", ("device", "compute_capability")),
    ("host architecture", ("host", "arch")),
    ("host", ("host", "description")),
    ("cpu model", ("host", "cpu_model")),
    ("compute dtype", ("dtype_policy", "compute_dtype")),
    ("checkpoint id", ("checkpoint", "id")),
    ("mesh", ("engine_options", "mesh")),
    ("git commit", ("git", "commit")),
)


@dataclasses.dataclass(frozen=True)
class Difference:
    """One manifest value that differs, or is unknown on one side (`unknown`: a null that cannot be compared)."""

    field: str
    baseline: Any
    candidate: Any
    single_variable_key: bool

    @property
    def unknown(self) -> bool:
        return self.baseline is None or self.candidate is None

    def describe(self) -> str:
        shown = ("—" if v is None else f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else v
                 for v in (self.baseline, self.candidate))  # fmt: skip
        both = self.baseline is None and self.candidate is None
        note = " (not recorded)" if both else " (not recorded on one side)" if self.unknown else ""
        return f"{self.field}: {' vs '.join(map(str, shown))}{note}"


def _get(manifest: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = manifest
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _context_value(manifest: dict[str, Any], path: tuple[str, ...]) -> Any:
    """`_get`, except the checkpoint id, which reads as the report names it (`CheckpointFacts.label`: "(dummy
    weights)" after the id of weights made on the device), and the mesh, "one device" where none is recorded (every
    run before meshes ran on one)."""
    if path == ("engine_options", "mesh"):
        return _get(manifest, path) or "one device"
    checkpoint = manifest.get("checkpoint")
    if path == ("checkpoint", "id") and isinstance(checkpoint, dict):
        return CheckpointFacts(id=checkpoint.get("id"), dummy=checkpoint.get("dummy")).label
    return _get(manifest, path)


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(f"{prefix}.{k}", v))
        return out
    return {prefix: value}


def manifest_differences(base: dict[str, Any], cand: dict[str, Any]) -> list[Difference]:
    """Differences between two manifests: the single-variable keys first (the configuration key by key), then
    device, host, dtype, checkpoint id, commit, and every package version. Equal values are left out; a value
    known on one side only is a difference marked unknown."""
    out: list[Difference] = []
    for label, path in SINGLE_VARIABLE_KEYS:
        a, b = _get(base, path), _get(cand, path)
        if path == ("engine_config",):
            fa, fb = _flat("configuration", a or {}), _flat("configuration", b or {})
            keys = sorted(set(fa) | set(fb))
            out += [Difference(k, fa.get(k), fb.get(k), True) for k in keys if fa.get(k) != fb.get(k)]
        elif a != b or a is None:
            out.append(Difference(label, a, b, True))
    for label, path in _CONTEXT_KEYS:
        a, b = _context_value(base, path), _context_value(cand, path)
        if a != b:
            out.append(Difference(label, a, b, False))
    va, vb = base.get("versions") or {}, cand.get("versions") or {}
    keys = sorted(set(va) | set(vb))
    out += [Difference(f"version {k}", va.get(k), vb.get(k), False) for k in keys if va.get(k) != vb.get(k)]
    return out


def describe_differences(diffs: list[Difference]) -> str:
    """One line: every difference known on both sides in full; fields recorded by neither run by name; fields
    recorded on one side only in full when there are at most 4, else by name (nested configuration keys folded
    to their first two levels), so a long one-sided list stays readable."""
    def names(which: list[Difference]) -> str:
        return ", ".join(dict.fromkeys(".".join(d.field.split(".")[:2]) for d in which))

    parts = [d.describe() for d in diffs if not d.unknown]
    neither = [d for d in diffs if d.baseline is None and d.candidate is None]
    one_sided = [d for d in diffs if d.unknown and d not in neither]
    if neither:
        parts.append(f"not recorded by either run: {names(neither)}")
    if len(one_sided) <= 4:  # a few: with their values
        parts += [d.describe() for d in one_sided]
    else:
        parts.append(f"recorded on one side only: {names(one_sided)}")
    return "; ".join(parts)


QUANT_CONSEQUENCES = ("build id", "weight bytes", "configuration.quantization", "configuration.scale_dtype",
                      "configuration.kernel", "configuration.kernel_tiles")  # fmt: skip
"""The single-variable keys a change of `--quant` changes by itself: its build, weight bytes, the two fields, and
the w4 kernel fields (recorded with w4 weights only)."""


def quant_variable(base: Manifest, cand: Manifest) -> str | None:
    """"quantization A vs B" when two runs differ in their quantization (option set or scale dtype) and in nothing
    else a single-variable comparison needs equal: every other differing single-variable key is one of
    `QUANT_CONSEQUENCES`, and their dense build ids (`Manifest.dense_build_id`: the same code, checkpoint and
    engine configuration without quantization) are equal and known. None otherwise."""
    qa, qb = ((m.engine.quantization or "none", m.engine.scale_dtype) for m in (base, cand))
    if qa == qb or base.dense_build_id is None or base.dense_build_id != cand.dense_build_id:
        return None
    diffs = [d for d in manifest_differences(base.to_dict(), cand.to_dict()) if d.single_variable_key]
    if any(d.field not in QUANT_CONSEQUENCES and not d.field.startswith("configuration.kernel_tiles.") for d in diffs):
        return None
    shown = (q + (f" ({s} scales)" if s not in (None, "bfloat16") else "") for q, s in (qa, qb))
    return "quantization " + " vs ".join(shown)


def single_variable(base: dict[str, Any], cand: dict[str, Any]) -> tuple[bool | None, list[Difference]]:
    """(True, []) when build id, checkpoint hash, configuration and weight bytes are equal and known;
    (False, diffs) when a known value differs; (None, diffs) when nothing known differs but some are unknown."""
    diffs = [d for d in manifest_differences(base, cand) if d.single_variable_key]
    if not diffs:
        return True, []
    return (None if all(d.unknown for d in diffs) else False), diffs


EXIT_CODES = {"PASS": 0, "FAIL": 1, "UNRESOLVED": 3}
"""`bench compare`'s exit code per verdict (2 is a user error: a missing run, a bad flag)."""
NOISE_FACTOR = 2.0
"""The default gate is NOISE_FACTOR x the comparison's noise (`Noise`): an unchanged candidate's interval, at most
one noise below its point, then stays above 1 - gate while its point is within one noise of 1, and a candidate slower
by more than the gate plus one noise fails (a stated choice, docs/method.md "Comparisons")."""
GATE_FLOOR_PCT = 1.0
"""The least default gate (percent): runs whose repeats agree exactly do not gate at 0%."""
FALLBACK_GATE_PCT = 5.0
"""The gate when no noise is known (neither run has repeats, no A/A calibration): the fixed gate of old."""
METRICS = ("gauge", "e2e")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Noise:
    """How a comparison's gate was set (docs/method.md, "Comparisons").

    `repeats_pct`: the median over cells and metrics of the half-width of each cell's repeat interval (percent of
    its ratio; None when no cell has repeats on both sides); `calibration`: the A/A session used (a run folder
    name) and `calibration_pct` its noise (`bench.ab.stats.aa_noise_pct`), `calibration_pairs` its valid pairs;
    `noise_pct` = the larger of the two (None when neither is known); `gate_pct` the gate in force and `gate_from`
    how it was set: "--max-slowdown" (given), "noise" (NOISE_FACTOR x noise, at least GATE_FLOOR_PCT) or "fixed"
    (FALLBACK_GATE_PCT: no noise known). `calibration_kind`: "A/A session" or "sweep pair"
    (`bench.runs.calibration`; `calibration_pairs` then counts its ratios); `calibration_choice`: which calibration
    was used or refused and why (`bench.runs.calibration.Choice.line`, or how it was given), for the verdict line."""

    repeats_pct: float | None
    calibration: str | None
    calibration_pct: float | None
    calibration_pairs: int | None
    noise_pct: float | None
    gate_pct: float
    gate_from: str
    calibration_kind: str = "A/A session"
    calibration_choice: str | None = None

    def describe(self) -> str:
        """One line: the gate and where it came from."""
        parts = []
        if self.repeats_pct is not None:
            parts.append(f"the runs' repeats +-{self.repeats_pct:.1f}% (median half-width of the cells' intervals)")
        if self.calibration is not None and self.calibration_kind == "A/A session":
            parts.append(f"the A/A session {self.calibration} +-{self.calibration_pct:.1f}% for one pair of runs "
                         f"({self.calibration_pairs} pairs)")  # fmt: skip
        elif self.calibration is not None:
            parts.append(f"the {self.calibration_kind} {self.calibration} +-{self.calibration_pct:.1f}% for one "
                         f"rerun ({self.calibration_pairs} ratios)")  # fmt: skip
        noise = "; ".join(parts) or "no repeats on both sides and no A/A calibration"
        how = {"--max-slowdown": "as given", "fixed": f"fixed {FALLBACK_GATE_PCT:g}%: no noise known",
               "noise": f"{NOISE_FACTOR:g} x the noise, at least {GATE_FLOOR_PCT:g}%"}[self.gate_from]  # fmt: skip
        return f"gate {self.gate_pct:.1f}% ({how}); noise: {noise}"


def _repeat_values(samples: list[Sample]) -> dict[tuple[int, int], dict[str, list[float]]]:
    """Per cell (input tokens, batch), per metric, the timed repeats' rates (tok/s) of the host loop."""
    out: dict[tuple[int, int], dict[str, list[float]]] = {}
    for s in samples:
        if s.kind != "timed":
            continue
        per = out.setdefault(cell_key(s), {m: [] for m in METRICS})
        for m in METRICS:
            value = getattr(s, f"{m}_tok_s")
            if value is not None and value > 0:
                per[m].append(value)
    return out


def _point_interval(b: CellRow, c: CellRow, metric: str, reps_b: list[float], reps_c: list[float]):
    """(ratio of the medians, its repeat interval or None): `bench.ab.stats.ratio_interval` where both sides have 2
    or more repeats, else the ratio over the two min-max spreads where both have them, else None."""
    from bench.ab.stats import ratio_interval

    mb, mc = getattr(b, f"{metric}_tok_s_median"), getattr(c, f"{metric}_tok_s_median")
    if not mb or not mc:
        return None, None
    r = mc / mb
    if len(reps_b) >= 2 and len(reps_c) >= 2:
        return r, ratio_interval(reps_b, reps_c)
    lo_b, hi_b = getattr(b, f"{metric}_tok_s_min"), getattr(b, f"{metric}_tok_s_max")
    lo_c, hi_c = getattr(c, f"{metric}_tok_s_min"), getattr(c, f"{metric}_tok_s_max")
    if None in (lo_b, hi_b, lo_c, hi_c) or not lo_b or not hi_b:
        return r, None
    return r, (lo_c / hi_b, hi_c / lo_b)


def calibration_noise(run: str | Path | RunFolder) -> tuple[str, float, int]:
    """(name, noise %, pairs) of an A/A session of process mode (`bench ab` with one build on both sides, `ab.aa`
    true; `bench.ab.archive.is_calibration`):
    `bench.ab.stats.aa_noise_pct` of its valid pairs' ratios. RunFolderError for a run that is not a complete
    A/A session with at least 3 valid pairs."""
    from bench.ab.archive import is_calibration, paired_values, read_pairs
    from bench.ab.stats import aa_noise_pct, pair_ratios

    folder = run if isinstance(run, RunFolder) else open_complete_run(run)
    if not is_calibration(folder.manifest):
        raise RunFolderError(f"{folder.path}: not an A/A session of `bench ab` in process mode (one build, the same "
                             "flags on both sides, each measurement a run: a worker-mode session pairs requests "
                             "seconds apart, not runs); pass one as --calibration, or --calibration none")  # fmt: skip
    pairs = paired_values(read_pairs(folder.path))
    if len(pairs) < 3:
        raise RunFolderError(f"{folder.path}: {len(pairs)} valid pair(s); a calibration needs at least 3")
    ratios = pair_ratios([a for _, a, _ in pairs], [b for _, _, b in pairs])
    return folder.name, aa_noise_pct(ratios), len(pairs)


def find_calibration(runs_dir: str | Path, manifest: dict[str, Any], exclude: tuple[str, ...] = ()) -> Choice:
    """The calibration `bench compare --calibration auto` uses for a candidate run of `manifest`: the nearest usable
    one of the candidate's host in `runs_dir`, earlier or later, never one that holds a run of `exclude` (the two
    compared runs), with why it was chosen and why others of this host were refused (`bench.runs.calibration`:
    A/A sessions in process mode and sweep pairs; same machine, else same host model; not loaded, not stale)."""
    from bench.runs.calibration import find

    return find(runs_dir, manifest, exclude=exclude)


def _cell_verdict(interval: tuple[float, float], gate_pct: float) -> str:
    """"PASS" when the whole interval of the ratio is at or above 1 - gate, "FAIL" when it is below, else
    "UNRESOLVED"."""
    floor = 1.0 - gate_pct / 100.0
    return "PASS" if interval[0] >= floor else "FAIL" if interval[1] < floor else "UNRESOLVED"


@dataclasses.dataclass(frozen=True)
class CellDelta:
    """One input size in both runs. Deltas in % of the baseline median ((candidate - baseline) / baseline).
    Spreads are (min, max) in tok/s, None where a run has no raw samples (published figures)."""

    input_tokens: int
    baseline: CellRow | None
    candidate: CellRow | None
    gauge_delta_pct: float | None
    e2e_delta_pct: float | None
    device_gauge_delta_pct: float | None = None  # the device loop's gauge, where both runs timed it
    batch: int = 1  # rows decoded together (`--batch` sweeps; a cell is (input_tokens, batch))
    intervals: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """Per metric ("gauge", "e2e"), the interval of the ratio candidate / baseline (`Noise`, docs/method.md
    "Comparisons"); absent where a side has no figure."""
    verdicts: dict[str, str] = dataclasses.field(default_factory=dict)
    """Per metric, "PASS", "FAIL" or "UNRESOLVED": the interval above, below, or across 1 - gate."""

    @property
    def name(self) -> str:
        """How lines name the cell: "41 input tokens", with "x 16 rows" for a batch cell."""
        return f"{self.input_tokens} input tokens" + (f" x {self.batch} rows" if self.batch != 1 else "")

    @property
    def has_device_loop(self) -> bool:
        """True when either side's cell holds device-loop figures."""
        return any(r is not None and r.device_repeats is not None for r in (self.baseline, self.candidate))

    @staticmethod
    def spread(row: CellRow | None, metric: str) -> tuple[float, float] | None:
        if row is None:
            return None
        lo, hi = getattr(row, f"{metric}_tok_s_min"), getattr(row, f"{metric}_tok_s_max")
        return None if lo is None or hi is None else (lo, hi)

    def within_noise(self, metric: str) -> bool | None:
        """True when the two runs' min-max ranges overlap (the change is inside the noise); None if unknown."""
        a, b = self.spread(self.baseline, metric), self.spread(self.candidate, metric)
        return None if a is None or b is None else a[0] <= b[1] and b[0] <= a[1]


@dataclasses.dataclass(frozen=True)
class TokenAgreement:
    """Greedy ids at one input size: status "identical", "differ" (first_divergence = index of the first
    differing generated token) or "unknown" (no raw samples on a side); `note` says more where needed."""

    input_tokens: int
    status: str
    first_divergence: int | None
    compared_tokens: int
    note: str | None = None
    equal_tokens: int = 0
    """Positions i < compared_tokens whose ids are equal in both runs (after a divergence too)."""

    @property
    def equal_share(self) -> float | None:
        """equal_tokens / compared_tokens, in [0, 1]; None when nothing was compared."""
        return self.equal_tokens / self.compared_tokens if self.compared_tokens else None


@dataclasses.dataclass(frozen=True)
class LogitAgreement:
    """The next-token logits of one input size in both runs (see the module docstring): `max_abs` and `mean_abs`
    of |candidate - baseline| in logit units over the `vocab` entries, `argmax_equal` whether both pick the same
    first greedy token; all None with a `note` ("no logits recorded ...", or vocabularies that differ)."""

    input_tokens: int
    max_abs: float | None
    mean_abs: float | None
    argmax_equal: bool | None
    vocab: int | None
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class LevelDelta:
    """One load level both runs have (`bench.runs.LoadRow`, same input size, concurrency and request rate):
    each side's row and the candidate's change against the baseline (%): output throughput (tok/s; negative is
    slower) and p99 inter-token latency (ms; positive is slower)."""

    key: tuple[int, int, float | None]
    baseline: LoadRow
    candidate: LoadRow
    output_delta_pct: float | None
    itl_p99_delta_pct: float | None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The outcome of `compare_runs`. `failures` are thresholds crossed; `notes` are facts that do not fail."""

    baseline: str
    candidate: str
    max_slowdown_pct: float  # the gate in force (given, or set from the noise: `Noise`)
    cells: list[CellDelta]
    tokens: list[TokenAgreement]
    differences: list[Difference]
    single_variable: bool | None
    failures: list[str]
    notes: list[str]
    partial: list[str] = dataclasses.field(default_factory=list)
    """Each partial cell of either run, as "candidate RUN, N input tokens: k of M repeats (stopped_by)"."""
    variable: str | None = None
    """The single variable when it is the quantization (`quant_variable`, e.g. "quantization none vs w8"), else
    None; `single_variable` is then True."""
    logits: list[LogitAgreement] = dataclasses.field(default_factory=list)
    """Per input size both runs have, the next-token logit error (`LogitAgreement`)."""
    levels: list[LevelDelta] = dataclasses.field(default_factory=list)
    """The load levels (a sweep under load) both runs have, in order (`LevelDelta`)."""
    unresolved: list[str] = dataclasses.field(default_factory=list)
    """Each cell and metric whose interval reaches across 1 - gate: the change cannot be told from the noise."""
    noise: Noise | None = None
    """How the gate and the intervals were set (`Noise`)."""

    @property
    def word(self) -> str:
        """"FAIL" when a threshold was crossed, else "UNRESOLVED" when a cell's interval reaches across the gate,
        else "PASS"."""
        return "FAIL" if self.failures else "UNRESOLVED" if self.unresolved else "PASS"

    @property
    def passed(self) -> bool:
        return self.word == "PASS"

    @property
    def verdict(self) -> str:
        """`word`, followed by "with partial cells: ..." (the input sizes and sides) where any cell of either run
        is partial: partial cells count toward the verdict (see the module docstring)."""
        if not self.partial:
            return self.word
        return f"{self.word} with partial cells: " + "; ".join(self.partial)

    @property
    def exit_code(self) -> int:
        """What `bench compare` exits with: 0 PASS, 1 FAIL, 3 UNRESOLVED (`EXIT_CODES`)."""
        return EXIT_CODES[self.word]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position, within the shorter list, where two id lists differ; None when they agree
    there (a run that generated fewer tokens has not diverged: the caller notes the different lengths)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def _timed_ids(samples: list[Sample]) -> dict[int, list[list[int]]]:
    """Per input size, the generated ids of its timed repeats of one sequence (B = 1; a batch cell's rows are
    compared with B = 1 in their own run: `CellRow.rows_differ`): the host loop's, else the device loop's."""
    by_kind: dict[str, dict[int, list[list[int]]]] = {"timed": {}, "timed-device": {}}
    for s in sorted(samples, key=lambda s: (s.input_tokens, s.repeat)):
        if s.kind in by_kind and (s.batch or 1) == 1:
            by_kind[s.kind].setdefault(s.input_tokens, []).append(s.token_ids)
    return {**by_kind["timed-device"], **by_kind["timed"]}


def _token_agreement(base: RunFolder, cand: RunFolder, sizes: list[int]) -> tuple[list[TokenAgreement], list[str]]:
    notes = []
    ids = {}
    for side, run in (("baseline", base), ("candidate", cand)):
        ids[side] = _timed_ids(run.samples())
        for size, repeats in ids[side].items():
            if any(r != repeats[0] for r in repeats):
                notes.append(f"{side} {run.name}: its own timed repeats at {size} input tokens generated different ids")
    out = []
    for size in sizes:
        a, b = ids["baseline"].get(size), ids["candidate"].get(size)
        if not a or not b:
            missing = " and ".join(n for n, x in (("baseline", a), ("candidate", b)) if not x)
            out.append(TokenAgreement(size, "unknown", None, 0, f"no raw samples in the {missing}"))
            continue
        div = first_divergence(a[0], b[0])
        status = "identical" if div is None else "differ"
        n = min(len(a[0]), len(b[0]))
        note = None if len(a[0]) == len(b[0]) else (
            f"compared the first {n} tokens: the runs generated {len(a[0])} and {len(b[0])}")  # fmt: skip
        equal = sum(x == y for x, y in zip(a[0], b[0]))
        out.append(TokenAgreement(size, status, div, n, note, equal))
    return out, notes


def logit_error(a, b) -> tuple[float, float]:
    """(max_v |a_v - b_v|, mean_v |a_v - b_v|) of two equal-length float sequences [V] (logit units). Raises
    ValueError when the lengths differ or are 0."""
    if len(a) != len(b) or not len(a):
        raise ValueError(f"logit_error: expected two vectors of one length >= 1, got {len(a)} and {len(b)}")
    diffs = [abs(x - y) for x, y in zip(a, b)]
    return max(diffs), sum(diffs) / len(diffs)


def _argmax(values) -> int:
    return max(range(len(values)), key=values.__getitem__)


def _logit_agreement(base: RunFolder, cand: RunFolder, sizes: list[int]) -> list[LogitAgreement]:
    """`LogitAgreement` per input size of `sizes` from the runs' recorded logits (`bench.runs.logits`)."""
    a_all, b_all = read_logits(base.path), read_logits(cand.path)
    out = []
    for size in sizes:
        a, b = a_all.get(size), b_all.get(size)
        if a is None or b is None:
            missing = " and ".join(n for n, x in (("baseline", a), ("candidate", b)) if x is None)
            out.append(LogitAgreement(size, None, None, None, None, f"no logits recorded in the {missing}"))
        elif len(a) != len(b):
            out.append(LogitAgreement(size, None, None, None, None,
                                      f"vocabularies differ: {len(a):,} and {len(b):,} logits"))  # fmt: skip
        else:
            worst, mean = logit_error(a, b)
            out.append(LogitAgreement(size, worst, mean, _argmax(a) == _argmax(b), len(a)))
    return out


def _rows(batch: int | None) -> str:
    """" x B rows" for a batch cell (B > 1), else ""."""
    return f" x {batch} rows" if (batch or 1) != 1 else ""


def _delta(base: float | None, cand: float | None) -> float | None:
    return None if base in (None, 0) or cand is None else 100.0 * (cand - base) / base


def compare_runs(
    baseline: str | Path | RunFolder,
    candidate: str | Path | RunFolder,
    max_slowdown_pct: float | None = None,
    require_same_tokens: bool = False,
    calibration: str | Path | RunFolder | Choice | None = None,
) -> Comparison:
    """Compare `candidate` against `baseline` (run folders or their paths; both must be complete).

    `max_slowdown_pct` is the gate (None: set from the noise, `Noise`); `calibration` an A/A session of
    `bench ab` whose noise widens every cell's interval (`calibration_noise`), or the choice `find_calibration`
    made (`bench.runs.calibration.Choice`: its calibration, if any, with the reasons said in the verdict). Raises
    RunFolderError for a run that is missing, incomplete, corrupt, of another schema version or an A/B session, or
    a calibration that is not an A/A session, and ValueError for a negative `max_slowdown_pct`. See the module
    docstring for the thresholds and docs/method.md, "Comparisons", for the intervals and verdicts.
    """
    if max_slowdown_pct is not None and max_slowdown_pct < 0:
        raise ValueError(f"max_slowdown_pct must be >= 0, got {max_slowdown_pct}")
    base, cand = _opened(baseline), _opened(candidate)
    cal, said = _calibration(calibration)
    base_cells = {cell_key(c): c for c in base.cells()}  # a cell is (input tokens, batch): `--batch` sweeps
    cand_cells = {cell_key(c): c for c in cand.cells()}
    keys = sorted(set(base_cells) | set(cand_cells))
    points = _points(keys, base_cells, cand_cells, _repeat_values(base.samples()), _repeat_values(cand.samples()))
    noise = _noise(points, cal, max_slowdown_pct, said)
    deltas, failures, unresolved, notes = _cell_deltas(keys, base_cells, cand_cells, points, noise)
    partial = [f"{side} {run.name}, {c.input_tokens:,} input tokens{_rows(c.batch)}: {c.repeats} of "
               f"{c.repeats_planned} repeats ({c.stopped_by})"
               for side, run, cells in (("baseline", base, base_cells), ("candidate", cand, cand_cells))
               for c in cells.values() if c.partial]  # fmt: skip
    shared = [k[0] for k in keys if k in base_cells and k in cand_cells and k[1] == 1]
    tokens, token_notes = _token_agreement(base, cand, shared)
    notes += token_notes
    if require_same_tokens:
        for t in tokens:
            if t.status == "differ":
                failures.append(f"{t.input_tokens} input tokens: generated ids differ from token {t.first_divergence}")
            elif t.status == "unknown":
                failures.append(f"{t.input_tokens} input tokens: token agreement cannot be checked ({t.note})")
    levels = _level_deltas(base, cand, noise.gate_pct, failures, notes)
    if (host := _bandwidth_note(base.manifest, cand.manifest)) is not None:
        notes.append(host)
    same, _ = single_variable(base.manifest, cand.manifest)
    variable = quant_variable(base.typed_manifest, cand.typed_manifest)
    return Comparison(
        baseline=base.name, candidate=cand.name, max_slowdown_pct=noise.gate_pct, cells=deltas, tokens=tokens,
        differences=manifest_differences(base.manifest, cand.manifest), single_variable=same or variable is not None,
        failures=failures, notes=notes, partial=partial, variable=variable, logits=_logit_agreement(base, cand, shared),
        levels=levels, unresolved=unresolved, noise=noise,
    )  # fmt: skip


def _calibration(given: str | Path | RunFolder | Choice | None,
                 ) -> tuple[tuple[str, float, int, str] | None, str | None]:  # fmt: skip
    """((name, noise %, pairs or ratios, kind) of the calibration used, or None; what the verdict says of it, or
    None when nothing was asked) of the `calibration` given to `compare_runs`."""
    if given is None:
        return None, None
    if isinstance(given, Choice):
        c = given.chosen
        used = (c.name, c.noise_pct, len(c.ratios), c.kind) if c is not None and c.noise_pct is not None else None
        return used, given.line()
    name, pct, pairs = calibration_noise(given)
    return (name, pct, pairs, "A/A session"), f"calibration the A/A session {name}: given by --calibration"


def _opened(run: str | Path | RunFolder) -> RunFolder:
    """The complete run folder `run` names; RunFolderError for one that is not, or for an A/B session of `bench ab`
    (ratios, not cells)."""
    from bench.ab.archive import is_ab_run

    opened = run if isinstance(run, RunFolder) else open_complete_run(run)
    if is_ab_run(opened.manifest):
        raise RunFolderError(f"{opened.path}: an A/B session of `bench ab`, which holds ratios, not cells; compare two "
                             "sweep runs, or read the session's verdict (its run.log, `bench report`)")  # fmt: skip
    return opened


def _points(keys, base_cells, cand_cells, reps_b, reps_c) -> dict[tuple[int, int], dict[str, tuple]]:
    """Per cell both runs hold, per metric of `METRICS`: (candidate / baseline ratio, its interval from the repeats
    or None); `reps_b`/`reps_c` the runs' repeat values per cell and metric (`_repeat_values`)."""
    points: dict[tuple[int, int], dict[str, tuple[float, tuple[float, float] | None]]] = {}
    for key in keys:
        b, c = base_cells.get(key), cand_cells.get(key)
        if b is None or c is None:
            continue
        for metric in METRICS:
            r, interval = _point_interval(b, c, metric, reps_b.get(key, {}).get(metric, []),
                                          reps_c.get(key, {}).get(metric, []))  # fmt: skip
            if r is not None:
                points.setdefault(key, {})[metric] = (r, interval)
    return points


def _cell_deltas(keys, base_cells, cand_cells, points, noise: Noise):
    """(the `CellDelta` of every cell, failures, unresolved lines, notes): each cell's ratios widened by the noise
    (`_widened`) and judged against its gate (`_cell_verdict`); a cell the candidate lacks or holds invalid fails."""
    failures: list[str] = []
    unresolved: list[str] = []
    notes: list[str] = []
    deltas = []
    for key in keys:
        b, c = base_cells.get(key), cand_cells.get(key)
        intervals = {m: _widened(r, iv, noise) for m, (r, iv) in points.get(key, {}).items()}
        delta = CellDelta(
            key[0], b, c,
            _delta(b and b.gauge_tok_s_median, c and c.gauge_tok_s_median),
            _delta(b and b.e2e_tok_s_median, c and c.e2e_tok_s_median),
            _delta(b and b.device_gauge_tok_s_median, c and c.device_gauge_tok_s_median), batch=key[1],
            intervals=intervals, verdicts={m: _cell_verdict(iv, noise.gate_pct) for m, iv in intervals.items()},
        )  # fmt: skip
        deltas.append(delta)
        where = delta.name
        if c is None:
            failures.append(f"{where}: the candidate has no cell (the baseline has one)")
            continue
        if not c.valid:
            failures.append(f"{where}: candidate cell invalid ({c.invalid_reason or c.error})")
        if b is None:
            notes.append(f"{where}: only the candidate has this cell")
            continue
        if not b.valid:
            notes.append(f"{where}: baseline cell invalid ({b.invalid_reason or b.error})")
        for metric, value in (("gauge", delta.gauge_delta_pct), ("e2e", delta.e2e_delta_pct)):
            if metric not in delta.verdicts or value is None:
                continue
            lo, hi = intervals[metric]
            said = (f"{where}: {'gauge' if metric == 'gauge' else 'end-to-end'} tok/s {value:+.1f}% vs baseline "
                    f"(limit -{noise.gate_pct:.3g}%; interval {100 * (lo - 1):+.1f}%..{100 * (hi - 1):+.1f}%)")  # fmt: skip
            if delta.verdicts[metric] == "FAIL":
                failures.append(said)
            elif delta.verdicts[metric] == "UNRESOLVED":
                unresolved.append(said)
    return deltas, failures, unresolved, notes


def _noise(points: dict, cal: tuple[str, float, int, str] | None, given: float | None,
           said: str | None = None) -> Noise:  # fmt: skip
    """The comparison's `Noise` from the cells' repeat intervals (`points`: per cell, per metric, (ratio,
    interval or None)), the calibration (name, noise %, pairs or ratios, kind), the gate given (None: set from the
    noise) and what the verdict says of the calibration (`_calibration`)."""
    from bench.ab.stats import median

    widths = [100.0 * max(iv[1] / r - 1.0, 1.0 - iv[0] / r)
              for per in points.values() for r, iv in per.values() if iv is not None]  # fmt: skip
    repeats = median(widths) if widths else None
    cal_pct = cal[1] if cal is not None else None
    known = [x for x in (repeats, cal_pct) if x is not None]
    noise = max(known) if known else None
    if given is not None:
        gate, source = given, "--max-slowdown"
    elif noise is not None:
        gate, source = max(GATE_FLOOR_PCT, NOISE_FACTOR * noise), "noise"
    else:
        gate, source = FALLBACK_GATE_PCT, "fixed"
    return Noise(repeats_pct=repeats, calibration=cal[0] if cal else None, calibration_pct=cal_pct,
                 calibration_pairs=cal[2] if cal else None, noise_pct=noise, gate_pct=gate, gate_from=source,
                 calibration_kind=cal[3] if cal else "A/A session", calibration_choice=said)  # fmt: skip


def _widened(r: float, interval: tuple[float, float] | None, noise: Noise) -> tuple[float, float]:
    """A cell's interval of the ratio `r`: the hull of its repeat interval (None: the point) and, with a
    calibration, r / (1 + c) .. r x (1 + c), c its noise as a fraction."""
    lo, hi = interval if interval is not None else (r, r)
    if noise.calibration_pct is not None:
        c = 1.0 + noise.calibration_pct / 100.0
        lo, hi = min(lo, r / c), max(hi, r * c)
    return lo, hi


def _bandwidth_note(base: dict, cand: dict) -> str | None:
    """The note on the two devices' memory: each run's copy bandwidth (GiB/s) before its first cell and, where it
    was measured, after its last (`bench.runs.manifest.copy_bandwidths_of`), and the candidate's start against the
    baseline's in percent. "device" as the sweep's own lines say it: the CPU's memory on a CPU run, the chip's on a
    TPU or GPU. None unless both runs measured a start (in-process sweeps). A fact, never a threshold: it says how
    much of a speed difference the machine alone may account for (docs/method.md, Comparisons)."""
    (b0, b1), (c0, c1) = copy_bandwidths_of(base), copy_bandwidths_of(cand)
    if b0 is None or c0 is None:
        return None

    def span(start: float, end: float | None) -> str:
        return f"{start / 2**30:,.2f}" + ("" if end is None else f" -> {end / 2**30:,.2f}")

    return (f"device copy bandwidth (GiB/s, before the first cell -> after the last): baseline {span(b0, b1)}, "
            f"candidate {span(c0, c1)}; the candidate's start is {drift_pct(b0, c0):+.1f}% against the "
            "baseline's")  # fmt: skip


def _level_deltas(base: RunFolder, cand: RunFolder, max_slowdown_pct: float, failures: list[str],
                  notes: list[str]) -> list[LevelDelta]:  # fmt: skip
    """The load levels both runs have (others are named in `notes`); a candidate level that is invalid, or whose
    output throughput fell by more than `max_slowdown_pct`, is added to `failures`."""
    b_rows, c_rows = ({r.key: r for r in run.load_rows()} for run in (base, cand))
    out = []
    for key in sorted(set(b_rows) & set(c_rows), key=lambda k: (k[0], k[2] or 0.0, k[1])):
        b, c = b_rows[key], c_rows[key]
        where = f"load {key[0]} tokens, concurrency {key[1]}" + (f", {key[2]:g} req/s" if key[2] else "")
        delta = LevelDelta(key, b, c, _delta(b.output_tok_s, c.output_tok_s), _delta(b.itl_ms_p99, c.itl_ms_p99))
        out.append(delta)
        if not c.valid:
            failures.append(f"{where}: candidate level invalid ({c.invalid_reason or c.error})")
        if not b.valid:
            notes.append(f"{where}: baseline level invalid ({b.invalid_reason or b.error})")
        if delta.output_delta_pct is not None and delta.output_delta_pct < -max_slowdown_pct:
            failures.append(f"{where}: output tok/s {delta.output_delta_pct:+.1f}% vs baseline "
                            f"(limit -{max_slowdown_pct:g}%)")  # fmt: skip
    only = sorted(set(b_rows) ^ set(c_rows), key=lambda k: (k[0], k[2] or 0.0, k[1]))
    if only:
        notes.append(f"load levels (input tokens, concurrency, rate) in one run only, not compared: {only}")
    return out
