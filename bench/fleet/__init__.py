"""Sweeps across a fleet of GPU and TPU types on SkyPilot (`bench fleet`): one task per accelerator (one or several
devices, one or several hosts) running the prepared GPU run, its run folders collected into the archive.

Nothing here imports jax or the engine but `bench.fleet.distributed` (run on a multi-host task's hosts, imported by
nothing: `python -m bench.fleet.distributed -- BENCH ARGS` starts jax.distributed, then runs bench); only
`bench.fleet.sdk` imports SkyPilot, and only inside its functions (import contracts in pyproject.toml), so `bench`
works without the fleet extra.
- `FleetOptions`, `FleetPlan`, `FleetTask`, `build_plan`, `write_plan`, `read_plan`, `task_configs`, `gpu_run_args`,
  `dump_yaml`, `load_yaml`, `PLAN_FILE`, `MOUNT`, `HF_TOKEN`     (bench.fleet.plan: the plan and its task YAMLs)
- `parse_accelerators`, `parse_request`, `Request`, `slug`, `is_known`, `KNOWN`, `TPUS`
                                                                   (bench.fleet.accelerators: counts, nodes, TPUs)
- `launch_fleet`, `fleet_status`, `down_fleet`, `TaskState`       (bench.fleet.ops: through a SkyPilot boundary)
- `collect_runs`, `keep_outputs`, `fetch`, `download_argv`, `rsync_argv`, `CollectReport`, `Collected`
                                                                   (bench.fleet.collect)
- `SkySDK`, `validate_task`, `import_sky`, `SKY_MISSING`         (bench.fleet.sdk: the SkyPilot boundary)
"""

from bench.fleet.accelerators import KNOWN, TPUS, Request, is_known, parse_accelerators, parse_request, slug
from bench.fleet.collect import (
    CollectReport,
    Collected,
    collect_runs,
    download_argv,
    fetch,
    keep_outputs,
    rsync_argv,
)
from bench.fleet.ops import TaskState, down_fleet, fleet_status, launch_fleet
from bench.fleet.plan import (
    HF_TOKEN,
    MOUNT,
    PLAN_FILE,
    FleetOptions,
    FleetPlan,
    FleetTask,
    build_plan,
    dump_yaml,
    fleet_name,
    gpu_run_args,
    load_yaml,
    read_plan,
    task_configs,
    write_plan,
)
from bench.fleet.sdk import SKY_MISSING, SkySDK, import_sky, validate_task

__all__ = [
    "KNOWN", "TPUS", "Request", "is_known", "parse_accelerators", "parse_request", "slug",
    "CollectReport", "Collected", "collect_runs", "download_argv", "fetch", "keep_outputs", "rsync_argv",
    "TaskState", "down_fleet", "fleet_status", "launch_fleet",
    "HF_TOKEN", "MOUNT", "PLAN_FILE", "FleetOptions", "FleetPlan", "FleetTask", "build_plan", "dump_yaml",
    "fleet_name", "gpu_run_args", "load_yaml", "read_plan", "task_configs", "write_plan",
    "SKY_MISSING", "SkySDK", "import_sky", "validate_task",
]  # fmt: skip
