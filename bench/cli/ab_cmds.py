"""`bench ab`: two builds or two engine configurations measured alternately in one session, with a verdict
(docs/commands/ab.md). Parses flags and prints; the session is `bench.ab.session`.

Exit codes: 0 the session ran (its verdict resolved or not); 2 bad input (a flag, a side that cannot be located,
a warm-up that failed), one line; 130 interrupted (the run folder is kept, status incomplete).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.cli.common import CheckpointOpt, CompileCacheOpt, make_console, setup_logging
from bench.cli.engine_options import EngineFlags, engine_options
from bench.cli.root import app

SIDE_HELP = ("Side {X}: '[BUILD] [SWEEP FLAGS]'. BUILD: a git ref (branch, tag, commit; checked out in a temporary "
             "worktree) or a worktree folder; none: this checkout as it is. Flags: engine flags of `bench sweep`, "
             "e.g. \"--quant w8\".")  # fmt: skip


def _percent(text: str, flag: str) -> float:
    from bench.cli.report_cmds import parse_percent

    return parse_percent(text, flag)


@app.command("ab")
def ab_cmd(
    a: Annotated[str, typer.Option("--a", help=SIDE_HELP.format(X="A (the reference)"))] = "",
    b: Annotated[str, typer.Option("--b", help=SIDE_HELP.format(X="B (the change)"))] = "",
    mode: Annotated[str, typer.Option("--mode", help="workers (one long-lived process per side, pairs of requests "
                                      "seconds apart) or processes (each measurement a `bench sweep` process; the "
                                      "fallback for builds older than worker mode).")] = "workers",
    pairs: Annotated[int | None, typer.Option("--pairs", help="Pairs of measurements (ABBA order), at least 3. "
                                              "Default 24 in worker mode, 8 in process mode.")] = None,
    inputs: Annotated[int, typer.Option("--inputs", help="The cell's exact input tokens.")] = 41,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="The cell's generated tokens.")] = 64,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Process mode: timed repeats per measurement "
                                                "(their median is its value; default 3).")] = None,
    metric: Annotated[str, typer.Option("--metric", help="gauge (host-loop decode tok/s), e2e (end-to-end tok/s) "
                                        "or cpu (worker mode: tokens per CPU second of the side's worker, what "
                                        "other work on a shared CPU host disturbs least).")] = "gauge",
    confidence: Annotated[str, typer.Option("--confidence", help="The interval's coverage.")] = "95%",
    min_effect: Annotated[str, typer.Option("--min-effect", help="The smallest change claimed: resolved only when "
                                            "the whole interval lies beyond it.")] = "1%",
    resamples: Annotated[int, typer.Option("--resamples", help="Bootstrap resamples.")] = 10_000,
    seed: Annotated[int, typer.Option("--seed", help="The bootstrap's seed.")] = 0,
    python: Annotated[str | None, typer.Option("--python", help="Interpreter of the workers or measurements "
                                               "(default: this one).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Run label (default 'ab', made free).")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where the ab run folder is archived.")] = Path("runs"),
    keep_sweeps: Annotated[Path | None, typer.Option("--keep-sweeps", help="Keep the workers' logs (worker mode) or "
                                                     "each measurement's sweep run folder and log (process mode) in "
                                                     "this folder.")] = None,
    test_slowdown_b: Annotated[str | None, typer.Option("--test-slowdown-b", hidden=True)] = None,
) -> None:
    """Measure two sides alternately in one session (by default one worker process per side, alternated request
    by request), per pair the ratio B / A of the cell's rate, their median and bootstrap interval, and a verdict."""
    import sys

    from bench.ab.session import AbPlan, Cell, run_session
    from bench.ab.sides import parse_side
    from bench.errors import InputError

    if repeats is not None and mode == "workers":
        raise InputError(f"--repeats {repeats}: process mode only (--mode processes); in worker mode a measurement "
                         "is one request: more pairs (--pairs) narrow the interval")  # fmt: skip
    conf = _percent(confidence, "--confidence") / 100.0
    share = _percent(test_slowdown_b, "--test-slowdown-b") / 100.0 if test_slowdown_b is not None else None
    plan = AbPlan(a=parse_side("A", a), b=parse_side("B", b), mode=mode,
                  cell=Cell(input_tokens=inputs, max_new_tokens=max_new_tokens, repeats=repeats or 3, metric=metric),
                  pairs=pairs, confidence=conf, min_effect_pct=_percent(min_effect, "--min-effect"),
                  resamples=resamples, seed=seed, python=python or sys.executable, runs_dir=runs_dir, label=name,
                  keep_sweeps=keep_sweeps, test_slowdown_b=share)  # fmt: skip
    _check_before_running(plan, name, runs_dir)
    cell = plan.cell
    each = ("one request in each side's worker" if mode == "workers" else
            f"a `bench sweep` process of {cell.repeats} timed repeats (their median)")  # fmt: skip
    typer.echo(f"cell: {cell.input_tokens} input tokens, {cell.max_new_tokens} new tokens; metric: {cell.metric} "
               f"tok/s; {plan.n_pairs} pairs in ABBA order, each measurement {each}", err=True)  # fmt: skip
    run, verdict = run_session(plan, here=Path.cwd(), progress=lambda line: typer.echo(line, err=True))
    _print_summary(run, verdict)


def _check_before_running(plan, name: str | None, runs_dir: Path) -> None:  # noqa: ANN001
    """One line (InputError) before anything runs: a value of the plan out of range, a label that cannot name a
    folder, a runs folder that cannot be written, a build that is neither a worktree nor a git ref."""
    from bench.ab.sides import locate
    from bench.runs import check_writable, run_name

    plan.check()
    if name is not None:
        run_name(name, "device")
    check_writable(runs_dir)
    for side in (plan.a, plan.b):
        locate(side, Path.cwd())


def _print_summary(run, verdict) -> None:  # noqa: ANN001
    """The pairs table (A, B, ratio per pair) and the verdict line of a finished session, on stdout."""
    from rich.table import Table

    from bench.ab.archive import read_pairs, session_mode
    from bench.report.ab import injection_text

    rows = read_pairs(run.path)
    ab = run.manifest["ab"]
    table = Table(title=f"{run.name}: {ab['metric']} tok/s per measurement (ABBA, {session_mode(run.manifest)})")
    for col in ("pair", "order", "A", "B", "B / A"):
        table.add_column(col, justify="right")
    by_pair: dict[int, dict[str, object]] = {}
    for m in rows:
        if m.kind == "pair":
            by_pair.setdefault(m.pair, {"order": ""})
            by_pair[m.pair][m.side] = m
            by_pair[m.pair]["order"] += m.side

    def shown(m) -> str:  # noqa: ANN001
        return "—" if m is None or m.value is None else f"{m.value:,.2f}" + ("" if m.valid else " (invalid)")

    for k, p in sorted(by_pair.items()):
        ma, mb = p.get("A"), p.get("B")
        ratio = (f"{mb.value / ma.value:.4f}" if ma is not None and mb is not None and ma.value and mb.value
                 and ma.valid and mb.valid else "—")  # fmt: skip
        table.add_row(str(k + 1), str(p["order"]), shown(ma), shown(mb), ratio)
    console = make_console()
    console.print(table)
    for side in ("A", "B"):
        facts = ab["sides"][side]
        console.print(f"side {side}: {facts['text'] or '(this checkout)'}; build id {', '.join(facts['build_ids']) or '—'}"
                      f"; {facts['checkout']}" + (f" {facts['commit'][:12]}" if facts.get("commit") else ""),
                      markup=False, highlight=False)  # fmt: skip
    if ab.get("test_injection"):
        console.print(f"TEST-ONLY: {injection_text(ab['test_injection'])}", markup=False, highlight=False)
    for line in ab.get("warnings") or []:
        console.print(f"warning: {line}", markup=False, highlight=False)
    stats = ab["statistics"]
    console.print(f"method: median of the per-pair ratios B / A; {100 * stats['confidence']:g}% percentile bootstrap "
                  f"interval ({stats['resamples']:,} resamples of the pairs, seed {stats['seed']})",
                  markup=False, highlight=False)  # fmt: skip
    text = verdict.text if verdict is not None else "no verdict: fewer than 2 pairs with two valid measurements"
    console.print(f"verdict: {text}", markup=False, highlight=False)
    if (hint := scatter_hint(rows, ab, run.manifest.get("device") or {})) is not None:
        console.print(hint, markup=False, highlight=False)
    console.print(f"run folder: {run.path}", markup=False, highlight=False)


SCATTER_HINT = 0.10
"""The scatter of the pairs (standard deviation of ln(B / A)) above which a CPU session of a wall-clock metric
suggests `--metric cpu` (a stated choice: on the 2-core host under a load average of 9-14 from other work the
gauge's pairs scattered by 0.29-0.54, the CPU rate's by 0.04-0.21; docs/commands/ab.md)."""


def scatter_hint(rows, ab: dict, device: dict) -> str | None:  # noqa: ANN001
    """A note when a worker-mode session of a wall-clock metric on a CPU device has pairs that scatter by more than
    `SCATTER_HINT` (other work took the cores): `--metric cpu` measures what that does not disturb. None else."""
    import math
    import statistics

    from bench.ab.archive import paired_values

    if ab.get("mode") != "workers" or ab.get("metric") == "cpu" or device.get("platform") != "cpu":
        return None
    logs = [math.log(b / a) for _, a, b in paired_values(rows)]
    if len(logs) < 3 or (sd := statistics.pstdev(logs)) <= SCATTER_HINT:
        return None
    return (f"note: the pairs' ratios scatter by {100 * (math.exp(sd) - 1):.0f}% (one standard deviation): other "
            "work shares this CPU host's cores; --metric cpu (tokens per CPU second) is disturbed far less by it "
            "(docs/commands/ab.md, \"The metric on a busy CPU host\")")

@app.command("ab-worker", hidden=True)
@engine_options()
def ab_worker_cmd(
    inputs: Annotated[int, typer.Option("--inputs", help="The cell's exact input tokens.")] = 41,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="The cell's generated tokens.")] = 64,
    checkpoint: str | None = CheckpointOpt, compile_cache: str | None = CompileCacheOpt,
    engine_flags: EngineFlags = EngineFlags(),
    allow_test_delay: Annotated[bool, typer.Option("--allow-test-delay", hidden=True)] = False,
) -> None:
    """A worker of `bench ab`'s worker mode (started by `bench ab`, not by hand): loads the side's engine, then
    measures one request of the cell per request line on stdin and replies on stdout (bench/ab/protocol.py)."""
    from bench.ab.session import Cell
    from bench.ab.worker import run_worker

    Cell(input_tokens=inputs, max_new_tokens=max_new_tokens).check()
    config = engine_flags.config()  # one line for a bad value, before anything loads
    setup_logging()
    raise typer.Exit(run_worker(checkpoint, config, compile_cache, input_tokens=inputs,
                                max_new_tokens=max_new_tokens, allow_delay=allow_test_delay))
