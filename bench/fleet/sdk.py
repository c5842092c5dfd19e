"""The SkyPilot boundary: the one module of the project that imports `sky` (an import contract in pyproject.toml).

`sky` is imported inside the functions that need it, never at import time, so `bench` runs without the fleet extra;
without it those functions raise MissingModuleError with the one line that says how to install it (`SKY_MISSING`).
Calls used (SkyPilot 0.14.1, checked against the installed package):
- schema: `sky.utils.common_utils.validate_schema(obj, schema, prefix)` with `sky.utils.schemas.get_task_schema()`,
  `get_resources_schema()` (the task schema leaves `resources` unchecked: `acceleratorz:` passes it) and
  `get_storage_schema()` for each bucket mount (the task schema accepts any `mode:`), then
  `sky.Task.from_yaml_config` (SkyPilot's own parse). All offline, no credentials; accelerator names are not
  checked against the catalog (it is downloaded at its first use).
- launch: `sky.Task.from_yaml_config(config, secrets_overrides=[(NAME, VALUE)])` (a secret declared `NAME: null`
  gets its value here, never from a file), then `sky.jobs.launch(task, name=...)` (managed jobs) or
  `sky.launch(task, cluster_name=..., idle_minutes_to_autostop=..., down=False)`; each returns a request id that
  `sky.stream_and_get` waits on (streaming the request's log).
- status: `sky.jobs.queue(refresh=False, skip_finished=False)`, `sky.status(cluster_names=[...])`.
- down: `sky.jobs.cancel(name=...)`, `sky.down(cluster_name)`.
Any exception SkyPilot raises in a call becomes a FleetError of one line (`_call`).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.errors import FleetError, MissingModuleError

SKY_MISSING = ("bench fleet needs SkyPilot (the fleet extra), which {python} cannot import: "
               "run it from .venv-fleet (make fleet-venv; README \"On a fleet\")")  # fmt: skip
"""The one line when `sky` cannot be imported ({python}: this interpreter)."""

IDLE_MINUTES = 60
"""A plain cluster (no bucket) stops after this many idle minutes (its disk, with the results, is kept)."""


def import_sky():
    """The `sky` module; MissingModuleError (`SKY_MISSING`) when this Python cannot import it."""
    try:
        import sky
    except ImportError:
        raise MissingModuleError(SKY_MISSING.format(python=sys.executable)) from None
    return sky


def sky_version() -> str:
    """The installed SkyPilot's version (MissingModuleError without the fleet extra)."""
    return str(import_sky().__version__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _call(what: str, fn: Callable[[], Any]) -> Any:
    """`fn()`, with any exception SkyPilot raises as FleetError("WHAT: TYPE: its first line")."""
    try:
        return fn()
    except (FleetError, MissingModuleError):
        raise
    except Exception as exc:  # noqa: BLE001  (SkyPilot raises many types; each is one line for the user)
        raise FleetError(f"{what}: {type(exc).__name__}: {_first_line(exc)}") from None


def validate_task(config: Mapping[str, Any], where: str) -> None:
    """Check one task YAML (as a dict) against SkyPilot's own schemas and parse (module docstring). Raises
    FleetError naming `where` and SkyPilot's reason; MissingModuleError without the fleet extra."""
    sky = import_sky()
    from sky.utils import common_utils, schemas

    def check(obj: Any, schema: dict, part: str) -> None:
        try:
            common_utils.validate_schema(obj, schema, "")
        except ValueError as exc:
            raise FleetError(f"{where}: {part} breaks SkyPilot's schema: {_first_line(exc)}") from None

    if not isinstance(config, Mapping):
        raise FleetError(f"{where}: expected a task (a mapping), got {type(config).__name__}")
    check(dict(config), schemas.get_task_schema(), "the task")
    resources = config.get("resources")
    if isinstance(resources, Mapping):
        check(dict(resources), schemas.get_resources_schema(), "resources")
    for mount, spec in (config.get("file_mounts") or {}).items():
        if isinstance(spec, Mapping):
            check(dict(spec), schemas.get_storage_schema(), f"file_mounts {mount}")
    _call(f"{where}: SkyPilot refuses the task", lambda: sky.Task.from_yaml_config(copy.deepcopy(dict(config))))


@dataclass(frozen=True)
class JobState:
    """One managed job as `sky.jobs.queue` reports it: `name`, `job_id`, `status` (ManagedJobStatus's value, e.g.
    RUNNING, RECOVERING, SUCCEEDED, FAILED), `recoveries` (preemptions recovered from) and `detail` (SkyPilot's
    failure reason or details; "" when none)."""

    name: str
    job_id: int | None
    status: str
    recoveries: int
    detail: str


@dataclass(frozen=True)
class ClusterState:
    """One cluster as `sky.status` reports it: `name`, `status` (ClusterStatus's value: INIT, UP, STOPPED)."""

    name: str
    status: str


def _get(record: Any, key: str) -> Any:
    """A field of a SkyPilot response record (a pydantic model in 0.14; a dict in older clients)."""
    if isinstance(record, Mapping):
        return record.get(key)
    return getattr(record, key, None)


def _value(status: Any) -> str:
    """An enum's value ("RUNNING"), or the text of anything else."""
    return str(getattr(status, "value", status))


class SkySDK:
    """The calls `bench fleet` makes to SkyPilot (module docstring). Built only where the extra is installed
    (MissingModuleError otherwise). Each method waits for its request (`sky.stream_and_get`) and raises FleetError
    (one line) for anything SkyPilot raises."""

    def __init__(self) -> None:
        self.sky = import_sky()

    def validate(self, config: Mapping[str, Any], where: str) -> None:
        """`validate_task`."""
        validate_task(config, where)

    def _task(self, config: Mapping[str, Any], secrets: Mapping[str, str]):
        overrides = list(secrets.items()) or None
        return self.sky.Task.from_yaml_config(copy.deepcopy(dict(config)), secrets_overrides=overrides)

    def launch_job(self, config: Mapping[str, Any], name: str, secrets: Mapping[str, str]) -> Any:
        """Submit `config` as the managed job `name`, the `secrets` values given; returns SkyPilot's job id(s)."""
        sky = self.sky

        def go():
            result = sky.stream_and_get(sky.jobs.launch(self._task(config, secrets), name=name))
            ids = result[0] if isinstance(result, tuple) else result  # 0.14: ([job id, ...], handle)
            return ids[0] if isinstance(ids, list) and len(ids) == 1 else ids

        return _call(f"managed job {name}: launch failed", go)

    def launch_cluster(self, config: Mapping[str, Any], cluster_name: str, secrets: Mapping[str, str]) -> Any:
        """Launch `config` on the cluster `cluster_name` (kept after the run, stopped after `IDLE_MINUTES` idle);
        returns SkyPilot's job id on it."""
        sky = self.sky

        def go():
            request = sky.launch(self._task(config, secrets), cluster_name=cluster_name,
                                 idle_minutes_to_autostop=IDLE_MINUTES, down=False)  # fmt: skip
            result = sky.stream_and_get(request)
            return result[0] if isinstance(result, tuple) else result

        return _call(f"cluster {cluster_name}: launch failed", go)

    def jobs(self) -> list[JobState]:
        """Every managed job of this user that the controller knows (finished ones included)."""
        sky = self.sky
        records = _call("managed jobs: queue failed",
                        lambda: sky.stream_and_get(sky.jobs.queue(refresh=False, skip_finished=False)))  # fmt: skip
        if isinstance(records, tuple):  # version 2 of the queue call returns (records, total, ...)
            records = records[0]
        return [JobState(name=str(_get(r, "job_name") or ""), job_id=_get(r, "job_id"), status=_value(_get(r, "status")),
                         recoveries=int(_get(r, "recovery_count") or 0),
                         detail=str(_get(r, "failure_reason") or _get(r, "details") or ""))
                for r in records or []]  # fmt: skip

    def clusters(self, names: list[str]) -> list[ClusterState]:
        """The clusters of `names` that exist."""
        sky = self.sky
        records = _call("clusters: status failed", lambda: sky.stream_and_get(sky.status(cluster_names=list(names))))
        return [ClusterState(name=str(_get(r, "name")), status=_value(_get(r, "status"))) for r in records or []]

    def cancel_job(self, name: str) -> None:
        """Cancel the managed job(s) named `name`."""
        sky = self.sky
        _call(f"managed job {name}: cancel failed", lambda: sky.stream_and_get(sky.jobs.cancel(name=name)))

    def down_cluster(self, name: str) -> None:
        """Tear down the cluster `name` (its disk goes with it)."""
        sky = self.sky
        _call(f"cluster {name}: down failed", lambda: sky.stream_and_get(sky.down(name)))
