"""`bench gpu-run`: the prepared GPU run (bench/gpurun), what `scripts/gpu-run.sh` runs on a GPU machine.

This module imports only typer and standard-library-only parts of `bench` at its top level: `bench gpu-run`
registers it alone (bench/cli/__init__.py), so the run's parent process imports no jax, engine or server module;
each step imports those in its own process.
"""

from __future__ import annotations

from pathlib import Path

import typer

from bench.cli.root import app

from bench.cli.engine_options import MESH_HELP  # the group's --mesh text: gpu-run passes it to every step


@app.command("gpu-run")
def gpu_run(
    outdir: Path = typer.Argument(..., help="Output folder: runs/, xla-cache/, logs/, summary.txt, gpu-run.log."),
    budget_s: float = typer.Option(420.0, "--budget-s", help="Wall-clock budget of the whole run (s)."),
    checkpoint: str | None = typer.Option(
        None, "--checkpoint", help="A checkpoint folder, builtin:NAME, or random:NAME / random:NAME@SEED (dummy weights made on "
        "the device, nothing written: no checkpoint step). Default: on a GPU the built-in 'default' "
        "pilot, then E2B generated meanwhile; without one the built-in tiny checkpoint.",
    ),  # fmt: skip
    tiny: bool = typer.Option(False, "--tiny", help="CPU mode: the built-in tiny checkpoint, small inputs."),
    pack: Path | None = typer.Option(None, "--pack", help="Also write the results as <= 8 flat files of <= 15 MiB "
                                     "into this folder (what the device tool brings back: its $OUT)."),
    inputs: str | None = typer.Option(None, "--inputs", help="Override the input sizes (comma-separated tokens)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Override the tokens per request."),
    repeats: int | None = typer.Option(None, "--repeats", help="Override the timed repeats per sweep cell."),
    steps: int | None = typer.Option(None, "--steps", help="Override the profiled decode steps."),
    decode_loop: str | None = typer.Option(None, "--decode-loop", help="Override the sweep's decode loop: host, "
                                           "device or both (default both: the host overhead per step)."),
    quant: list[str] | None = typer.Option(
        None, "--quant", help="One --quant option set (e.g. none, w8, ple4,int8_lm_head), repeatable: each set is "
        "swept and profiled as its own run per checkpoint, in the order given (--quant none --quant "
        "ple4,int8_lm_head: dense beside the published configuration). Default: one dense run, no --quant."),
    kernel: list[str] | None = typer.Option(
        None, "--kernel", help="w4a16=pallas or w4a16=xla, repeatable: each option set with w4 weights is swept and "
        "profiled once per value (--quant w4 --kernel w4a16=pallas --kernel w4a16=xla: the fused kernel on and "
        "off). Default: no --kernel (the engine decides)."),
    mesh: str | None = typer.Option(None, "--mesh", help=f"Passed to every sweep and profile. {MESH_HELP}"),
    batch: str | None = typer.Option(
        None, "--batch", help="Batch sizes passed to every sweep (bench sweep --batch), e.g. 1,8,32,128; the largest is "
        "also profiled, into its own run. Pair large batches with small --inputs (e.g. --inputs 41). Default: none."),
) -> None:
    """Bandwidth, sweep and profile into run folders under OUTDIR within a time budget; the summary is printed last.

    Exit code 0: every planned step ran to the end; 3: the budget stopped or skipped a step (the run folders are
    valid, possibly incomplete); 1: a step failed; 2: a usage error or a missing module (nothing was measured).
    SIGTERM or Ctrl-C stops the current step, keeps its work and goes on to the summary. GPU settings are never
    changed. Plans and budget rules: bench/gpurun/main.py's docstring.
    """
    from bench.gpurun import Options, check_packages, run

    check_packages()  # a module missing: one line, exit 2, before anything is written
    options = Options(outdir=outdir, budget_s=budget_s, checkpoint=checkpoint, tiny=tiny, pack=pack, inputs=inputs,
                      max_new_tokens=max_new_tokens, repeats=repeats, steps=steps,
                      decode_loop=decode_loop, quant=tuple(quant or ()), kernel=tuple(kernel or ()),
                      batch=batch, mesh=mesh)  # fmt: skip
    outcome = run(options, emit=typer.echo)
    if outcome.code:
        raise typer.Exit(outcome.code)
