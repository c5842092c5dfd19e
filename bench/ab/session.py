"""A paired A/B session (`bench ab`; docs/commands/ab.md, docs/method.md "A/B runs"): two sides measured
alternately, each measurement its own `python -m bench sweep` process run in its side's checkout, archived as a
run folder of kind "ab".

The session, in order:
1. each side's checkout is located (`bench.ab.sides`; a git ref is checked out in a temporary worktree);
2. one warm-up measurement per distinct side (its checkout, flags and environment), so that every side's
   programs are in the persistent compilation cache before the pairs start; warm-ups are archived, never in a
   figure; a warm-up that fails stops the session (InputError: the side's flags or build are at fault);
3. `pairs` pairs, in the order ABBA: pair k runs A then B when k is even, B then A when k is odd, so that a
   steady drift of the host slows the first and the second measurement of a pair alike over the session;
4. per pair, the ratio B / A of the metric (the cell's median over its timed repeats, tok/s), and the verdict
   (`bench.ab.stats.ab_verdict`) over the pairs whose two measurements are valid.

Every measurement is one row of pairs.csv as soon as it ends, so a stopped session keeps what it measured (status
incomplete). The measurements' own run folders go to a temporary folder, removed at the end unless `keep_sweeps`
names a folder to move them into.

The test-only slowdown (`TEST_DELAY_ENV`): a side's processes get that variable only when the plan asks for it
(`AbPlan.test_delay_ms_b`, the hidden `--test-decode-delay-ms-b` option); it is removed from every other
measurement's environment, and recorded in the manifest (`ab.test_injection`) when set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ab.archive import AB_KIND, PAIRS, Measurement, paired_values, pairs_csv
from bench.ab.sides import Checkout, Side, checked_out
from bench.ab.stats import CONFIDENCE, MIN_EFFECT_PCT, RESAMPLES, SEED, ab_verdict, pair_ratios
from bench.errors import InputError
from model.switches import TEST_DELAY_ENV  # the engine's test-only decode delay: `test-only:<ms>ms`

METRICS = {"gauge": "gauge_tok_s", "e2e": "e2e_tok_s"}
"""The metrics a session can measure: the cell's host-loop decode gauge (default) or its end-to-end rate, tok/s."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    """What each measurement measures: one sweep cell of `input_tokens` exact input tokens generating
    `max_new_tokens` tokens, `repeats` timed repeats after the sweep's cold request and warm-up, host decode loop;
    `metric` ("gauge" or "e2e", `METRICS`), the median over the repeats, tok/s."""

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
                                 "--max-new-tokens 64 --repeats 3)")  # fmt: skip
        if self.metric not in METRICS:
            raise InputError(f"--metric {self.metric!r}: expected one of {', '.join(METRICS)}")

    def sweep_args(self) -> list[str]:
        """The sweep flags of the cell."""
        return ["--inputs", str(self.input_tokens), "--max-new-tokens", str(self.max_new_tokens), "--repeats",
                str(self.repeats), "--decode-loop", "host"]  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbPlan:
    """A session: the sides `a` and `b`, the `cell`, `pairs` pairs, the interval's `confidence`, the smallest
    change claimed (`min_effect_pct`), the bootstrap's `resamples` and `seed`; `python` (the interpreter of every
    measurement), `runs_dir` and `label` (the ab run folder), `keep_sweeps` (a folder for the measurements' own
    run folders, or None: removed), and `test_delay_ms_b` (test-only: a decode delay per step on side B, ms)."""

    a: Side
    b: Side
    cell: Cell = Cell()
    pairs: int = 8
    confidence: float = CONFIDENCE
    min_effect_pct: float = MIN_EFFECT_PCT
    resamples: int = RESAMPLES
    seed: int = SEED
    python: str = sys.executable
    runs_dir: Path = Path("runs")
    label: str | None = None
    keep_sweeps: Path | None = None
    test_delay_ms_b: float | None = None

    def check(self) -> None:
        """InputError (one line) for a value out of range, before anything runs."""
        self.cell.check()
        if isinstance(self.pairs, bool) or not isinstance(self.pairs, int) or not 3 <= self.pairs <= 1000:
            raise InputError(f"--pairs {self.pairs!r}: expected a whole number from 3 to 1000 (8 by default)")
        if not 0.5 <= self.confidence < 1.0:
            raise InputError(f"--confidence {100 * self.confidence:g}%: expected 50% to under 100% (95% by default)")
        if not 0.0 <= self.min_effect_pct < 100.0:
            raise InputError(f"--min-effect {self.min_effect_pct:g}%: expected 0% to under 100% (1% by default)")
        if self.resamples < 100:
            raise InputError(f"--resamples {self.resamples}: expected at least 100 ({RESAMPLES:,} by default)")
        if self.test_delay_ms_b is not None and not 0 < self.test_delay_ms_b <= 1000:
            raise InputError(f"--test-decode-delay-ms-b {self.test_delay_ms_b:g}: expected 0 < ms <= 1000")


@dataclasses.dataclass(frozen=True)
class _Target:
    """A side ready to measure: its `Side`, `Checkout` and the environment changes of its processes."""

    side: Side
    checkout: Checkout
    env: tuple[tuple[str, str], ...]

    @property
    def key(self) -> tuple:
        """What makes two targets the same program: checkout, flags, environment (one warm-up each)."""
        return (str(self.checkout.root), self.side.flags, self.env)


def _environment(extra: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """This process's environment without `TEST_DELAY_ENV`, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != TEST_DELAY_ENV}
    env.update(dict(extra))
    return env


def sweep_argv(plan: AbPlan, target: _Target, runs_dir: Path, label: str) -> list[str]:
    """The command line of one measurement: `python -m bench sweep` with the cell, the run folder and the side's
    flags (last, so the sweep's parser names a bad one)."""
    return [plan.python, "-m", "bench", "sweep", *plan.cell.sweep_args(), "--runs-dir", str(runs_dir), "--name",
            label, *target.side.flags]  # fmt: skip


def _read_measurement(folder: Path | None, cell: Cell) -> dict[str, Any]:
    """The metric of the sweep run `folder` left (value, lo, hi, repeats, repeat values, validity, build id);
    values None where it left no run or no cell."""
    empty = {"value": None, "lo": None, "hi": None, "repeats": None, "repeat_values": (), "valid": False,
             "build_id": None, "run": None}  # fmt: skip
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
            "valid": bool(row.valid), "build_id": run.manifest.get("build_id"), "run": folder.name}  # fmt: skip


def _last_lines(log: Path, n: int = 3) -> str:
    """The last `n` non-empty lines of a measurement's log, joined by " | " (what a failure message quotes)."""
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no output)"
    return " | ".join(lines[-n:]) or "(no output)"


class _Session:
    """The state of one session while it runs (see the module docstring)."""

    def __init__(self, plan: AbPlan, progress: Callable[[str], None], scratch: Path):
        self.plan = plan
        self.progress = progress
        self.scratch = scratch
        self.rows: list[Measurement] = []

    def measure(self, target: _Target, kind: str, pair: int | None) -> tuple[Measurement, Path, list[str]]:
        """Run one measurement of `target` (a sweep process in its checkout); returns its row, its log and argv."""
        index = len(self.rows)
        label = f"ab{index:03d}-{target.side.name.lower()}"
        argv = sweep_argv(self.plan, target, self.scratch, label)
        log = self.scratch / f"{label}.log"
        started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        t0 = time.perf_counter()
        with open(log, "w", encoding="utf-8") as fh:
            code = subprocess.run(argv, cwd=target.checkout.root, env=_environment(target.env), stdout=fh,
                                  stderr=subprocess.STDOUT, check=False).returncode  # fmt: skip
        seconds = time.perf_counter() - t0
        found = sorted(self.scratch.glob(f"????-??-??-{label}-*"))
        got = _read_measurement(found[-1] if found else None, self.plan.cell)
        row = Measurement(index=index, kind=kind, pair=pair, side=target.side.name, exit_code=code,
                          seconds=seconds, started_at=started, **got)  # fmt: skip
        self.rows.append(row)
        what = "warm-up" if kind == "warmup" else f"pair {pair + 1}/{self.plan.pairs}"
        shown = "no value" if row.value is None else f"{row.value:,.2f} tok/s" + ("" if row.valid else " (invalid)")
        self.progress(f"{what} {target.side.name}: {shown} ({self.plan.cell.metric}, median of {row.repeats or 0} "
                      f"repeats; {seconds:.1f} s, exit {code})")  # fmt: skip
        return row, log, argv


def _targets(plan: AbPlan, a: Checkout, b: Checkout) -> tuple[_Target, _Target]:
    delay = ((TEST_DELAY_ENV, f"test-only:{plan.test_delay_ms_b:g}ms"),) if plan.test_delay_ms_b else ()
    return _Target(plan.a, a, ()), _Target(plan.b, b, delay)


def _side_facts(target: _Target, argv: list[str], rows: list[Measurement]) -> dict[str, Any]:
    """The manifest's record of one side."""
    ids = sorted({r.build_id for r in rows if r.side == target.side.name and r.build_id})
    return {"text": target.side.text, "build": target.side.build, "flags": list(target.side.flags),
            "checkout": target.checkout.kind, "ref": target.checkout.ref, "commit": target.checkout.commit,
            "build_ids": ids, "environment": dict(target.env),
            "command_line": [Path(argv[0]).name, *argv[1:]]}  # fmt: skip


def _ab_manifest(plan: AbPlan, sweep_manifest: dict[str, Any]) -> dict[str, Any]:
    """The ab run's manifest at creation (schema 2 keys; facts of the machine from the first warm-up's sweep)."""
    from bench.runs.environment import git_state, host_facts, package_versions, python_command_line
    from bench.runs.manifest import REPO

    ckpt = sweep_manifest.get("checkpoint") or {}
    cell = dataclasses.asdict(plan.cell)
    return {
        "kind": AB_KIND, "command": "ab", "command_line": python_command_line(), "build_id": None,
        "git": git_state(REPO), "versions": package_versions(), "device": sweep_manifest.get("device") or {},
        "host": host_facts(), "dtype_policy": None,
        "checkpoint": {"id": ckpt.get("id"), "source": ckpt.get("source"), "content_hash": None, "weight_bytes": None},
        "engine_config": {"inputs": [plan.cell.input_tokens], "max_new_tokens": plan.cell.max_new_tokens,
                          "repeats": plan.cell.repeats},
        "compile_cache": {"dir": None, "hits": None, "misses": None},
        "ab": {"cell": cell, "metric": plan.cell.metric, "pairs": plan.pairs, "order": "ABBA",
               "statistics": {"ratio": "B / A of the metric, per pair", "statistic": "median of the ratios",
                              "interval": "percentile bootstrap, resampling pairs", "resamples": plan.resamples,
                              "seed": plan.seed, "confidence": plan.confidence,
                              "min_effect_pct": plan.min_effect_pct},
               **({"test_injection": {"side": "B", "variable": TEST_DELAY_ENV,
                                      "decode_delay_ms": plan.test_delay_ms_b}} if plan.test_delay_ms_b else {})},
    }  # fmt: skip


def _write_pairs(run, rows: list[Measurement]) -> None:
    """pairs.csv of `run`, rewritten whole through a temporary file and `os.replace` (a reader sees the old file or
    the new one)."""
    path = run.path / PAIRS
    tmp = path.with_name(f".{PAIRS}.{os.getpid()}.tmp")
    tmp.write_text(pairs_csv(rows), encoding="utf-8")
    os.replace(tmp, path)


def run_session(plan: AbPlan, *, here: Path, progress: Callable[[str], None] = lambda line: None):
    """Run the session of `plan` from the checkout `here` (where git refs are resolved); returns (the ab
    `RunFolder`, the `AbVerdict` or None when fewer than 2 pairs were valid). InputError for a side that cannot be
    located or checked out, or whose warm-up fails (the side's flags or build: its last output lines quoted);
    RunFolderError when the run folder cannot be written."""
    from bench.runs import create_run, free_label, open_run, writing_run

    plan.check()
    scratch = Path(tempfile.mkdtemp(prefix="bench-ab-sweeps-"))
    session = _Session(plan, progress, scratch)
    try:
        with contextlib.ExitStack() as stack:
            a = stack.enter_context(checked_out(plan.a, here, progress))
            b = stack.enter_context(checked_out(plan.b, here, progress))
            ta, tb = _targets(plan, a, b)
            for t in (ta, tb):
                progress(f"side {t.side.describe()} ({t.checkout.kind}: {t.checkout.root})")
            if plan.test_delay_ms_b:
                progress(f"TEST-ONLY: side B's decode steps are delayed by {plan.test_delay_ms_b:g} ms each "
                         f"({TEST_DELAY_ENV}); recorded in the manifest")  # fmt: skip
            argvs: dict[str, list[str]] = {}
            first_run = _warm_up(session, (ta, tb), argvs, scratch)
            manifest = _ab_manifest(plan, open_run(first_run).manifest)
            slug = (manifest["device"] or {}).get("slug") or "unknown"
            label = plan.label or free_label(plan.runs_dir, "ab", slug)
            with writing_run(lambda: create_run(plan.runs_dir, label, slug, manifest)) as run:
                progress(f"run folder: {run.path}")
                _write_pairs(run, session.rows)
                for k in range(plan.pairs):
                    for t in ((ta, tb) if k % 2 == 0 else (tb, ta)):
                        _, _, argv = session.measure(t, "pair", k)
                        argvs.setdefault(t.side.name, argv)
                        _write_pairs(run, session.rows)
                verdict = _verdict(plan, session.rows)
                ab = {**run.manifest["ab"], "sides": {t.side.name: _side_facts(t, argvs[t.side.name], session.rows)
                                                      for t in (ta, tb)}}  # fmt: skip
                ab["aa"] = _is_aa(ab["sides"], plan)
                ab["warnings"] = build_warnings(ab["sides"])
                for line in ab["warnings"]:
                    progress(f"warning: {line}")
                    run.log(f"warning: {line}")
                ab["verdict"] = verdict.to_json() if verdict is not None else None
                run.update_manifest(ab=ab)
                run.log(verdict.text if verdict is not None else "no verdict: fewer than 2 valid pairs")
        return run, verdict
    finally:
        if plan.keep_sweeps is not None:
            plan.keep_sweeps.mkdir(parents=True, exist_ok=True)
            for item in scratch.iterdir():
                shutil.move(str(item), plan.keep_sweeps / item.name)
        shutil.rmtree(scratch, ignore_errors=True)


def _warm_up(session, targets, argvs: dict[str, list[str]], scratch: Path) -> Path:  # noqa: ANN001
    """One warm-up measurement per distinct side of `targets` (its argv into `argvs`); the first warm-up's sweep
    folder. InputError quoting the side's last output lines when its warm-up fails."""
    first_run, warmed = None, set()
    for t in targets:
        if t.key in warmed:
            continue
        warmed.add(t.key)
        row, log, argv = session.measure(t, "warmup", None)
        argvs[t.side.name] = argv
        if row.exit_code != 0 or row.value is None:
            raise InputError(f"side {t.side.describe()}: its warm-up measurement failed (exit {row.exit_code}"
                             f"): {_last_lines(log)}")  # fmt: skip
        first_run = first_run or (scratch / row.run)
    return first_run


def _verdict(plan: AbPlan, rows: list[Measurement]):
    """`ab_verdict` of the valid pairs of `rows`, None with fewer than 2."""
    pairs = paired_values(rows)
    if len(pairs) < 2:
        return None
    ratios = pair_ratios([a for _, a, _ in pairs], [b for _, _, b in pairs])
    return ab_verdict(ratios, confidence=plan.confidence, min_effect_pct=plan.min_effect_pct,
                      resamples=plan.resamples, seed=plan.seed)  # fmt: skip


def build_warnings(sides: dict[str, Any]) -> list[str]:
    """One line per side whose measurements ran more than one build id (its code, checkpoint or configuration
    changed on disk during the session: e.g. this checkout edited meanwhile); [] when each side ran one build."""
    return [f"side {name} ran {len(facts['build_ids'])} builds during the session ({', '.join(facts['build_ids'])}): "
            "its checkout changed while it was measured, so its pairs mix builds; measure a git ref instead"
            for name, facts in sides.items() if len(facts["build_ids"]) > 1]  # fmt: skip


def _is_aa(sides: dict[str, Any], plan: AbPlan) -> bool:
    """True for an A/A session: both sides ran one and the same build id, with the same flags, and no test
    injection (what `bench compare` may take as a noise calibration)."""
    a, b = sides["A"], sides["B"]
    return (len(a["build_ids"]) == 1 and a["build_ids"] == b["build_ids"] and a["flags"] == b["flags"]
            and not plan.test_delay_ms_b)  # fmt: skip


__all__ = ["AbPlan", "Cell", "METRICS", "TEST_DELAY_ENV", "run_session", "sweep_argv"]
