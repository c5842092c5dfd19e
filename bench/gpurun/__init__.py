"""The prepared GPU run (`scripts/gpu-run.sh`): bandwidth, sweep and profile on one accelerator within a budget.

Standard library only at import time (the package check runs before jax or any third-party module is imported).
- `main`, `missing_packages`, `REQUIRED`               (bench.gpurun.main: the plans and the entry point)
- `Context`, `Timing`, `Workload`, `StepResult`       (bench.gpurun.steps: one child process per step)
- `exit_code`, `summary_lines`, `pack`, `EXIT_*`      (bench.gpurun.summary)
"""

from bench.gpurun.main import REQUIRED, main, missing_packages
from bench.gpurun.steps import Context, StepResult, Timing, Workload
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
    "REQUIRED", "main", "missing_packages", "Context", "StepResult", "Timing", "Workload",
    "EXIT_BUDGET", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "exit_code", "pack", "summary_lines",
]  # fmt: skip
