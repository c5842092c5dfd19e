"""Launch, status and down of a fleet plan, through a SkyPilot boundary object (`bench.fleet.sdk.SkySDK`, or a fake
with the same methods in the tests: `validate`, `launch_job`, `launch_cluster`, `jobs`, `clusters`, `cancel_job`,
`down_cluster`). Nothing here imports SkyPilot.

A plan with a bucket runs as managed jobs (spot preemptions recovered by SkyPilot), one per accelerator, named by
the task (g4b-NAME-SLUG); one without runs as clusters of those names. The task YAMLs are read from the plan folder
as they are now and validated again before anything is launched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.errors import FleetError
from bench.fleet.plan import HF_TOKEN, FleetPlan, read_plan, task_configs

TERMINAL = ("SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE", "FAILED_CONTROLLER",
            "CANCELLED")  # fmt: skip
"""Managed-job statuses after which nothing more runs (sky.jobs.ManagedJobStatus, 0.14)."""


class Boundary(Protocol):
    """The SkyPilot calls a fleet makes (`bench.fleet.sdk.SkySDK`)."""

    def validate(self, config: Mapping[str, Any], where: str) -> None: ...
    def launch_job(self, config: Mapping[str, Any], name: str, secrets: Mapping[str, str]) -> Any: ...
    def launch_cluster(self, config: Mapping[str, Any], cluster_name: str, secrets: Mapping[str, str]) -> Any: ...
    def jobs(self) -> list[Any]: ...
    def clusters(self, names: list[str]) -> list[Any]: ...
    def cancel_job(self, name: str) -> None: ...
    def down_cluster(self, name: str) -> None: ...


@dataclass(frozen=True)
class TaskState:
    """One task of a fleet as the cloud sees it: `accelerator`, `task_name`, `kind` ("managed job" or "cluster"),
    `status` (SkyPilot's, or "not launched" when it knows no such job or cluster), `job_id` (managed jobs; None
    otherwise), `recoveries` (preemptions recovered from) and `detail` (SkyPilot's reason; "" when none)."""

    accelerator: str
    task_name: str
    kind: str
    status: str
    job_id: int | None = None
    recoveries: int = 0
    detail: str = ""


def _secrets(plan: FleetPlan, env: Mapping[str, str]) -> dict[str, str]:
    """The secret values the tasks declare (by name only), from `env`. FleetError when one is not set."""
    if not plan.hf_token:
        return {}
    value = env.get(HF_TOKEN)
    if not value:
        raise FleetError(f"fleet {plan.name}: its checkpoint {plan.options.get('checkpoint')} is downloaded on each "
                         f"machine with the {HF_TOKEN} secret, and {HF_TOKEN} is not set here; export {HF_TOKEN}=... "
                         "and launch again")  # fmt: skip
    return {HF_TOKEN: value}


def launch_fleet(folder: Path, sdk: Boundary, env: Mapping[str, str]) -> list[tuple[str, str, Any]]:
    """Validate every task YAML of the plan in `folder`, then launch each (module docstring). `env` supplies the
    declared secrets' values. Returns (accelerator, task name, SkyPilot's job id) per task, in the plan's order.
    Raises FleetError before anything is launched when a YAML or a secret is missing or a YAML is refused, and
    when a launch fails (the tasks launched before it keep running: `bench fleet status` shows them)."""
    plan = read_plan(folder)
    configs = task_configs(folder, plan)
    for task in plan.tasks:
        sdk.validate(configs[task.task_name], str(Path(folder) / task.yaml_file))
    secrets = _secrets(plan, env)
    out = []
    for task in plan.tasks:
        config = configs[task.task_name]
        if plan.managed:
            job = sdk.launch_job(config, task.task_name, secrets)
        else:
            job = sdk.launch_cluster(config, task.task_name, secrets)
        out.append((task.accelerator, task.task_name, job))
    return out


def fleet_status(folder: Path, sdk: Boundary) -> list[TaskState]:
    """Each task's state (`TaskState`), in the plan's order: a managed job's latest submission of that name, or the
    cluster of that name."""
    plan = read_plan(folder)
    names = [t.task_name for t in plan.tasks]
    states = []
    if plan.managed:
        latest: dict[str, Any] = {}
        for job in sdk.jobs():
            if job.name in names and (job.name not in latest or (job.job_id or 0) > (latest[job.name].job_id or 0)):
                latest[job.name] = job
        for t in plan.tasks:
            j = latest.get(t.task_name)
            states.append(TaskState(t.accelerator, t.task_name, "managed job", j.status if j else "not launched",
                                    j.job_id if j else None, j.recoveries if j else 0, j.detail if j else ""))  # fmt: skip
    else:
        found = {c.name: c for c in sdk.clusters(names)}
        for t in plan.tasks:
            c = found.get(t.task_name)
            states.append(TaskState(t.accelerator, t.task_name, "cluster", c.status if c else "not launched"))
    return states


def down_fleet(folder: Path, sdk: Boundary) -> list[tuple[str, str]]:
    """Stop what the fleet runs: cancel each managed job that has not finished, or tear down each cluster that
    exists. Returns (task name, what was done) per task, in the plan's order."""
    done = []
    for state in fleet_status(folder, sdk):
        if state.status == "not launched":
            done.append((state.task_name, "nothing to stop (not launched)"))
        elif state.kind == "managed job" and state.status in TERMINAL:
            done.append((state.task_name, f"nothing to stop ({state.status})"))
        elif state.kind == "managed job":
            sdk.cancel_job(state.task_name)
            done.append((state.task_name, f"cancelled (was {state.status})"))
        else:
            sdk.down_cluster(state.task_name)
            done.append((state.task_name, f"torn down (was {state.status})"))
    return done
