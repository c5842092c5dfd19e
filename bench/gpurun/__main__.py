"""`python -m bench.gpurun ARGS`: what `scripts/gpu-run.sh` runs. The package check, then `bench gpu-run ARGS`.

The check (`REQUIRED`, `check_packages`) needs only the standard library, so on a machine that lacks a module it
is one line on stderr and exit code 2 (EXIT_USAGE), before typer or anything else third-party is imported and
before anything is written. Then this process replaces itself (`os.execv`: the same process id, so the device
tool's SIGTERM still reaches the run) with `python -m bench.cli.gpurun_entry ARGS`, which is `bench gpu-run ARGS`
with the import errors of typer's own dependencies as one line too (typer >= 0.22 imports pydantic when it parses
an option; the GPU image has no pydantic unless it is carried). A hand-over, not a call: this package never
imports `bench.cli`. Like `bench/__main__.py` this is an entry point, so it prints and exits; the rest of the
package only returns and raises.
"""

from __future__ import annotations

import os
import sys

from bench.errors import MissingModuleError
from bench.gpurun.main import check_packages
from bench.gpurun.summary import EXIT_USAGE

CLI_ENTRY = "bench.cli.gpurun_entry"
"""The module that runs `bench gpu-run` once the check has passed (`python -m CLI_ENTRY ARGS`)."""


def main(argv: list[str]) -> int:
    """Check the packages, then become `python -m bench.cli.gpurun_entry ARGV` (never returns then); returns
    EXIT_USAGE after the one error line when a package is missing."""
    try:
        check_packages()
    except MissingModuleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", CLI_ENTRY, *argv])
    return EXIT_USAGE  # not reached: execv replaces this process or raises OSError


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
