"""The prepared GPU run (`scripts/gpu-run.sh`, `bench gpu-run`): bandwidth, sweep and profile on one accelerator
within a budget.

Standard library only at import time (the package check runs before jax or any third-party module is imported).
- `run`, `Options`, `PilotPlan`, `Outcome`            (bench.gpurun.main: the plans and one run)
- `check_packages`, `missing_packages`, `missing_message`, `REQUIRED`  (bench.gpurun.main: the package check)
- `Context`, `Timing`, `Workload`, `StepResult`       (bench.gpurun.steps: one child process per step)
- `probe_facts`, `PROBE_MARK`, `MISSING_MARK`         (bench.gpurun.steps: what the probe child reports)
- `exit_code`, `summary_lines`, `pack`, `EXIT_*`      (bench.gpurun.summary)
`python -m bench.gpurun` (bench/gpurun/__main__.py) is the entry point scripts/gpu-run.sh runs.
"""

from bench.gpurun.main import (
    REQUIRED,
    Options,
    Outcome,
    PilotPlan,
    check_packages,
    missing_message,
    missing_packages,
    run,
)
from bench.gpurun.steps import MISSING_MARK, PROBE_MARK, Context, StepResult, Timing, Workload, probe_facts
from bench.gpurun.summary import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    exit_code,
    pack,
    summary_lines,
)

__all__ = [
    "REQUIRED", "Options", "Outcome", "PilotPlan", "check_packages", "missing_message", "missing_packages", "run",
    "MISSING_MARK", "PROBE_MARK", "Context", "StepResult", "Timing", "Workload", "probe_facts",
    "EXIT_BUDGET", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "exit_code", "pack", "summary_lines",
]  # fmt: skip
