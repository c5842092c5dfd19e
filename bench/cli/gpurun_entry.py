"""`python -m bench.cli.gpurun_entry`: the prepared GPU run's processes that are not `bench` commands.

- `ARGS...`: `bench gpu-run ARGS` (what `python -m bench.gpurun` hands over to once its package check passed), with
  an import error while the CLI starts or parses an option (typer's own dependencies: typer >= 0.22 imports
  pydantic to parse a value) as one line on stderr and exit code 2 instead of a traceback.
- `_probe`: the probe child (bench.gpurun.steps.probe): the device and policy lines, then one machine-read line.
- `_make_builtin PRESET`: the background checkpoint generator of the pilot + E2B plan, and the checkpoint step.
"""

from __future__ import annotations

import sys

import typer

from bench.gpurun import EXIT_USAGE, MISSING_MARK, PROBE_MARK, missing_message, probe_facts


def probe() -> int:
    """Print the device and the dtype policy line (the first lines of the run), then one `PROBE_MARK` line (JSON).

    First it runs `bench runs list` on an empty folder, which imports every `bench` command module and parses an
    option, as each step's `python -m bench` will: `REQUIRED` lists the direct needs, but a package's own
    dependencies only show up here, and a missing one is one `MISSING_MARK` line (exit code 2) instead of every
    step failing. Returns the exit code."""
    import contextlib
    import io
    import json
    import tempfile

    from bench.cli import main as bench_main

    try:
        with tempfile.TemporaryDirectory() as empty, contextlib.redirect_stdout(io.StringIO()):
            try:  # registers every command and parses an option: typer imports its parsing dependencies here
                bench_main(["runs", "list", "--runs-dir", empty])
            except SystemExit:
                pass
        facts = probe_facts()
    except ImportError as exc:
        typer.echo(MISSING_MARK + (exc.name or str(exc)))
        return EXIT_USAGE
    typer.echo(facts["device_line"])
    typer.echo(facts["policy_line"])
    typer.echo(PROBE_MARK + json.dumps(facts))
    return 0


def make_builtin(preset: str) -> int:
    """Create the built-in checkpoint `preset` in the cache (nothing when it is there already), printing progress
    and the path with the seconds it took. Returns the exit code (0; an error raises, so the step fails)."""
    import time

    from model.builtin import ensure_builtin

    t = time.monotonic()
    path = ensure_builtin(preset, log=typer.echo)
    typer.echo(f"checkpoint {preset} ready: {path} ({time.monotonic() - t:.1f} s)")
    return 0


def main(argv: list[str]) -> int:
    """Run `argv` (module docstring) and return its exit code; `bench gpu-run` exits by itself."""
    if argv[:1] == ["_probe"]:
        return probe()
    if argv[:1] == ["_make_builtin"] and len(argv) == 2:
        return make_builtin(argv[1])
    from bench.cli import main as bench_main

    try:
        bench_main(["gpu-run", *argv])
    except ImportError as exc:
        typer.echo(f"error: {missing_message([exc.name or str(exc)])}", err=True)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
