"""A paired A/B session (`bench ab`; docs/commands/ab.md, docs/method.md "A/B runs"): two sides measured
alternately, archived as a run folder of kind "ab".

The session, in order:
1. each side's checkout is located (`bench.ab.sides`; a git ref is checked out in a temporary worktree), and the
   mode chosen: "workers" (the default; `bench.ab.workers`: one long-lived worker process per side, each
   measurement one request) or "processes" (`bench.ab.processes`: each measurement a whole `bench sweep`
   process). A side whose checkout has no worker (a build older than worker mode), or a device other than the CPU
   (a TPU opens in one process at a time; a GPU's memory is preallocated per process), makes the session fall back
   to processes, said in one line;
2. the warm-ups (archived, never in a figure; one that fails stops the session: InputError, the side's flags or
   build are at fault), and the test-only slowdown's wait where one is asked for (`slowdown_wait_ms`);
3. `pairs` pairs in the order ABBA: pair k runs A then B when k is even, B then A when k is odd, so that a steady
   drift of the host slows the first and the second measurement of a pair alike;
4. per pair, the ratio B / A of the metric, and the verdict (`bench.ab.stats.ab_verdict`) over the pairs whose two
   measurements are valid.

Every measurement is one row of pairs.csv as soon as it ends, so a stopped session keeps what it measured (status
incomplete).

The test-only slowdown (`AbPlan.test_slowdown_b`, the hidden `--test-slowdown-b 10%`): side B's decode steps do
`slowdown_wait_ms` of CPU work each, computed from A's value of the metric in the warm-up so that B's metric is
lower by that share; side A's steps pass the same program with 1 us of work (`A_WAIT_MS`), so that the
mechanism's own cost (a host callback per step) is on both sides and only the work differs. Recorded in the
manifest (`ab.test_injection`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ab.archive import AB_KIND, PAIRS, Measurement, paired_values, pairs_csv
from bench.ab.plan import (  # noqa: F401 (the plan's names, re-exported: `bench.ab.session` is the entry point)
    A_WAIT_MS,
    DEFAULT_PAIRS,
    METRICS,
    MODES,
    AbPlan,
    Cell,
    Target,
    slowdown_wait_ms,
)
from bench.ab.protocol import has_worker
from bench.ab.sides import Checkout, checked_out
from bench.ab.stats import ab_verdict, pair_ratios
from bench.errors import InputError

def choose_mode(plan: AbPlan, checkouts: tuple[Checkout, Checkout], progress: Callable[[str], None]) -> str:
    """The session's mode: `plan.mode`, or "processes" when it is "workers" and a side's checkout has no worker
    entry point (a build older than worker mode), said in one line."""
    if plan.mode != "workers":
        return plan.mode
    old = [(side, c) for side, c in zip((plan.a, plan.b), checkouts) if not has_worker(c.root)]
    if not old:
        return "workers"
    side, c = old[0]
    progress(f"side {side.name} ({c.kind}{' ' + c.commit[:12] if c.commit else ''}) has no `bench ab` worker (a build "
             "older than worker mode): each measurement runs as its own `bench sweep` process (--mode processes)")  # fmt: skip
    return "processes"


def _in_mode(plan: AbPlan, mode: str, why: str | None = None) -> AbPlan:
    """`plan` in the mode the session runs in (its default pairs are the mode's). InputError (one line) when it
    falls back to processes with `--metric cpu`, which only a worker measures (`why`: the reason it falls back)."""
    if mode == plan.mode:
        return plan
    if plan.cell.metric == "cpu":
        raise InputError(f"--metric cpu: worker mode only, and this session falls back to process mode ({why or 'a '
                         'side has no worker'}); measure with --metric gauge")  # fmt: skip
    return dataclasses.replace(plan, mode=mode)


def _ab_manifest(plan: AbPlan, mode: str, sweep_manifest: dict[str, Any], injection: dict | None) -> dict[str, Any]:
    """The ab run's manifest at creation (schema 2 keys; facts of the machine from a side's sweep manifest)."""
    from bench.runs.environment import git_state, host_facts, package_versions, python_command_line
    from bench.runs.manifest import REPO

    ckpt = sweep_manifest.get("checkpoint") or {}
    cell = dataclasses.asdict(plan.cell)
    if mode == "workers":
        cell["repeats"] = 1  # a measurement is one request
    return {
        "kind": AB_KIND, "command": "ab", "command_line": python_command_line(), "build_id": None,
        "git": git_state(REPO), "versions": package_versions(), "device": sweep_manifest.get("device") or {},
        "host": host_facts(), "dtype_policy": None,
        "checkpoint": {"id": ckpt.get("id"), "source": ckpt.get("source"), "content_hash": None, "weight_bytes": None},
        "engine_config": {"inputs": [plan.cell.input_tokens], "max_new_tokens": plan.cell.max_new_tokens,
                          "repeats": cell["repeats"]},
        "compile_cache": {"dir": None, "hits": None, "misses": None},
        "ab": {"mode": mode, "cell": cell, "metric": plan.cell.metric, "pairs": plan.n_pairs, "order": "ABBA",
               "statistics": {"ratio": "B / A of the metric, per pair", "statistic": "median of the ratios",
                              "interval": "percentile bootstrap, resampling pairs", "resamples": plan.resamples,
                              "seed": plan.seed, "confidence": plan.confidence,
                              "min_effect_pct": plan.min_effect_pct},
               **({"test_injection": injection} if injection else {})},
    }  # fmt: skip


def _side_facts(target: Target, command_line: list[str], env: dict[str, str], rows: list[Measurement]) -> dict:
    """The manifest's record of one side."""
    ids = sorted({r.build_id for r in rows if r.side == target.side.name and r.build_id})
    return {"text": target.side.text, "build": target.side.build, "flags": list(target.side.flags),
            "checkout": target.checkout.kind, "ref": target.checkout.ref, "commit": target.checkout.commit,
            "build_ids": ids, "environment": env,
            "command_line": [Path(command_line[0]).name, *command_line[1:]]}  # fmt: skip


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
    `bench.ab.channel.WorkerError` when a worker ends during the pairs (the run is kept, failed); RunFolderError
    when the run folder cannot be written."""
    from bench.ab.processes import ProcessMeasurer
    from bench.ab.workers import NotOnThisDevice, WorkerMeasurer
    from bench.runs import create_run, free_label, writing_run

    plan.check()
    scratch = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    try:
        with contextlib.ExitStack() as stack:
            a = stack.enter_context(checked_out(plan.a, here, progress))
            b = stack.enter_context(checked_out(plan.b, here, progress))
            plan = _in_mode(plan, choose_mode(plan, (a, b), progress))
            ta, tb = Target(plan.a, a), Target(plan.b, b)
            for t in (ta, tb):
                progress(f"side {t.side.describe()} ({t.checkout.kind}: {t.checkout.root})")
            measurer = (WorkerMeasurer if plan.mode == "workers" else ProcessMeasurer)(plan, ta, tb, scratch, progress)
            stack.callback(measurer.close)
            try:
                sweep_manifest = measurer.prepare()
            except NotOnThisDevice as exc:  # an accelerator: one process at a time holds it
                measurer.close()
                plan = _in_mode(plan, "processes", str(exc))
                progress(str(exc))
                measurer = ProcessMeasurer(plan, ta, tb, scratch, progress)
                sweep_manifest = measurer.prepare()
            manifest = _ab_manifest(plan, plan.mode, sweep_manifest, measurer.injection)
            slug = (manifest["device"] or {}).get("slug") or "unknown"
            label = plan.label or free_label(plan.runs_dir, "ab", slug)
            with writing_run(lambda: create_run(plan.runs_dir, label, slug, manifest)) as run:
                progress(f"run folder: {run.path}")
                _write_pairs(run, measurer.rows)
                for k in range(plan.n_pairs):
                    for t in ((ta, tb) if k % 2 == 0 else (tb, ta)):
                        measurer.measure(t, k)
                        _write_pairs(run, measurer.rows)
                verdict = _verdict(plan, measurer.rows)
                ab = {**run.manifest["ab"], "sides": {t.side.name: _side_facts(t, measurer.command_line(t),
                                                                                measurer.environment(t), measurer.rows)
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
    injection."""
    a, b = sides["A"], sides["B"]
    return (len(a["build_ids"]) == 1 and a["build_ids"] == b["build_ids"] and a["flags"] == b["flags"]
            and not plan.test_slowdown_b)  # fmt: skip


__all__ = ["A_WAIT_MS", "AbPlan", "Cell", "DEFAULT_PAIRS", "METRICS", "MODES", "Target", "run_session",
           "slowdown_wait_ms"]  # fmt: skip
