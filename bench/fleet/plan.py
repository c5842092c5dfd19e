"""A fleet plan: one SkyPilot task per accelerator, each running the prepared GPU run (`scripts/gpu-run.sh`), written
as task YAML files plus `fleet.json` into the plan folder (`bench fleet plan ... --out fleet/NAME/`).

What one task does (its YAML, `task_config`):
- `resources`: the accelerator of its `--accelerators` entry (`bench.fleet.accelerators.Request`:
  `accelerators: NAME:COUNT`, a TPU slice `tpu-v5litepod-N:1` with its `accelerator_args.runtime_version`),
  `use_spot`, `disk_size` (GB), `infra` when given, and with a bucket `job_recovery` (managed jobs: a preempted
  spot machine is replaced and the run command starts again; `max_restarts_on_errors: 0`, so a failing run is not
  retried). `NAME:COUNTxNODES` sets `num_nodes`.
- `workdir`: the repository root (SkyPilot uploads it, leaving out what .gitignore lists); `setup` makes `.venv`
  there with a Python >= 3.12 (`scripts/find-python.sh`, else one `uv` installs) and installs the project from
  `constraints.txt` with the `cuda13` extra on a GPU, with `jax[tpu]` on a TPU slice.
- One host (`run_script`): `run` runs `scripts/gpu-run.sh OUT` with the sweep and profile flags the plan was given
  (`gpu_run_args`: only flags gpu-run.sh accepts) and, with more than one device, `--mesh tp=N` (N the task's
  devices; `--mesh-axis ep` makes it ep=N), checked at plan time against the presets the task runs
  (`check_task_mesh`: `model.placement.check_mesh`, one line with the numbers when N does not divide the model).
- Several hosts (`NAME:COUNTxNODES`, or a TPU slice larger than one host; `multi_host_script`): SkyPilot runs
  `run` on every host with SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS and SKYPILOT_NUM_NODES set; each runs
  `python -m bench.fleet.distributed --devices N -- sweep ...` (one `bench sweep` per --quant set, all within the
  budget), which starts `jax.distributed` from those variables and then runs the sweep over the global mesh. Rank 0
  writes into OUT (collected); rank R into OUT/node-R (kept, not collected). gpu-run's plans (its profile, its
  background checkpoint) are one host's and are not run there, so such a task needs --checkpoint and takes no
  --steps.
- With `--bucket URI`: the bucket is mounted at `MOUNT` (`mode: MOUNT_CACHED`: writes land on the local disk first
  and are uploaded in the background, so the run folders' appends and atomic renames work as on a disk). OUT is
  `MOUNT/NAME/SLUG` (run folders in `OUT/runs`, logs, summary.txt, the exit code in `OUT/exit-code`); the
  accelerator kind's compilation cache `MOUNT/xla-cache/SLUG` is copied into `OUT/xla-cache` before the run and
  the new entries copied back after it (gpu-run.sh records hits and misses in each manifest), so a later fleet on
  the same bucket compiles nothing it compiled before. Launched as managed jobs.
  Without a bucket: OUT is `fleet-out/NAME/SLUG` under the cluster's workdir and its cache starts empty; launched
  as clusters that `bench fleet collect` copies from with rsync and `bench fleet down` deletes (no spot: a spot
  machine cannot be stopped and keeps nothing once preempted).
- A checkpoint that is a hub repo id (owner/name) is downloaded on the machine first (huggingface_hub, reading the
  token from the environment); the task then declares `secrets: {HF_TOKEN: null}`, a secret by name only whose
  value `bench fleet launch` passes from its own environment. No file the plan writes holds a token.

gpu-run.sh exit codes 0 (every step ran) and 3 (the budget stopped a step; the folders are valid) end the task
with 0; 1 and 2 end it with that code (a multi-host task: the sweeps' codes, a sweep the budget stopped counting
3). Standard library, PyYAML and `model.placement` (no jax) only; nothing here imports SkyPilot (schema validation
is `bench.fleet.sdk.validate_task`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import FleetError, InputError
from bench.fleet.accelerators import Request, parse_request
from model.placement import AXES, Mesh, check_mesh

PLAN_FILE = "fleet.json"
"""The plan folder's record of the plan (what launch, status, collect and down read)."""
PLAN_VERSION = 1
MOUNT = "/g4b-fleet"
"""Where each machine mounts the bucket."""
WORKDIR_OUT = "fleet-out"
"""Without a bucket: the folder under the cluster's workdir (~/sky_workdir) that the run writes into."""
REMOTE_WORKDIR = "~/sky_workdir"
"""SkyPilot's workdir on a cluster (sky.skylet.constants.SKY_REMOTE_WORKDIR, 0.14)."""
HF_TOKEN = "HF_TOKEN"
"""The secret's name (the environment variable huggingface_hub reads)."""
DEFAULT_BUDGET_S = 1800.0
"""gpu-run.sh's --budget-s on a fleet machine (s): room for the pilot + E2B plan with its E2B checkpoint generated."""
DEFAULT_DISK_GB = 100
"""Disk per machine (GB): the CUDA wheels (a few GB), the E2B checkpoint (9.3 GB) or a hub copy, the caches."""
RECOVERY = {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0}
"""Managed-job recovery (SkyPilot 0.14's default strategy; a run that fails is not restarted, a preemption is)."""
BUCKET_SCHEMES = ("s3", "gs", "r2", "cos", "oci", "nebius", "cw")
"""Bucket URI schemes SkyPilot's storage takes as a `source` (sky/data/storage.py, 0.14); Azure is https://..."""
GPU_RUN_PRESETS = ("default", "e2b")
"""The presets gpu-run's own plan runs (no --checkpoint: the pilot + E2B plan, bench.gpurun.main's PILOT and BIG; a
test keeps the two equal, since this package imports nothing of bench.gpurun)."""
DISTRIBUTED = "bench.fleet.distributed"
"""The module a multi-host task runs each sweep through (`python -m DISTRIBUTED --devices N -- sweep ...`)."""
_NAME = re.compile(r"[a-z][a-z0-9-]{0,23}")
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True, kw_only=True)
class FleetOptions:
    """What `bench fleet plan` was asked for.

    `name`: the fleet's name (the plan folder's name; lower-case letters, digits, hyphens, <= 24 characters: it is
    part of each job and cluster name); `accelerators`: SkyPilot catalog names, one task each
    (`bench.fleet.accelerators.parse_accelerators`); `spot`: spot instances (needs `bucket`); `bucket`: a bucket URI
    (s3://NAME, gs://NAME, ...) or None (clusters, results fetched by rsync); `checkpoint`: builtin:PRESET or a hub
    repo id (None: gpu-run's own plan, pilot + E2B); the gpu-run overrides `inputs` (comma-separated tokens),
    `max_new_tokens`, `repeats`, `steps`, `decode_loop`, `quant` (one option set per entry), `batch` (batch sizes,
    comma-separated: gpu-run's --batch) and `budget_s` (s);
    `infra` (SkyPilot's `resources.infra`, e.g. aws or aws/us-east-1; None: any); `disk_size` (GB); `mesh_axis`
    ("tp" or "ep": the axis a task of several devices splits the model along, `--mesh AXIS=DEVICES`)."""

    name: str
    accelerators: tuple[str, ...]
    spot: bool = False
    bucket: str | None = None
    checkpoint: str | None = None
    inputs: str | None = None
    max_new_tokens: int | None = None
    repeats: int | None = None
    steps: int | None = None
    decode_loop: str | None = None
    quant: tuple[str, ...] = ()
    batch: str | None = None
    budget_s: float = DEFAULT_BUDGET_S
    infra: str | None = None
    disk_size: int = DEFAULT_DISK_GB
    mesh_axis: str = "tp"


@dataclass(frozen=True, kw_only=True)
class FleetTask:
    """One accelerator's task: `accelerator` (catalog name), `slug` (its folder name), `task_name` (the managed
    job's or cluster's name: g4b-NAME-SLUG), `yaml_file` (file name in the plan folder), `out` (the run's OUTDIR on
    the machine, as the run script spells it; rank 0's on several hosts), `devices` (jax devices in all), `hosts`
    (machines, one jax process each), `mesh` (the `--mesh` the benchmark gets, None on one device) and `command`
    (the benchmark line as the run script runs it, the first of several on several hosts)."""

    accelerator: str
    slug: str
    task_name: str
    yaml_file: str
    out: str
    devices: int = 1
    hosts: int = 1
    mesh: str | None = None
    command: str = ""


@dataclass(frozen=True, kw_only=True)
class FleetPlan:
    """A fleet plan as `fleet.json` records it: `name`, `bucket` (None: clusters and rsync), `spot`, `hf_token`
    (whether the tasks declare the HF_TOKEN secret), `gpu_run_args` (the flags after OUTDIR, the same for every
    task; "$ckpt" stands for the downloaded hub checkpoint), `tasks`, `created_at` (ISO 8601, UTC) and `options`
    (the FleetOptions, for the record)."""

    name: str
    bucket: str | None
    spot: bool
    hf_token: bool
    gpu_run_args: tuple[str, ...]
    tasks: tuple[FleetTask, ...]
    created_at: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        """True when the tasks run as managed jobs (a bucket holds the results), False for plain clusters."""
        return self.bucket is not None

    def to_json(self) -> str:
        """fleet.json's text."""
        data = {"plan_version": PLAN_VERSION, **asdict(self)}
        return json.dumps(data, indent=2) + "\n"

    @staticmethod
    def from_json(text: str, where: str) -> FleetPlan:
        """The plan in fleet.json's `text`; FleetError naming `where` when it is not a plan of this version."""
        try:
            data = json.loads(text)
            if data.pop("plan_version", None) != PLAN_VERSION:
                raise ValueError(f"plan_version is not {PLAN_VERSION}")
            tasks = tuple(FleetTask(**t) for t in data.pop("tasks"))
            return FleetPlan(tasks=tasks, gpu_run_args=tuple(data.pop("gpu_run_args")), **data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise FleetError(f"{where}: not a fleet plan ({exc}); make one with `bench fleet plan`") from None


# ---- checks ------------------------------------------------------------------------------------------------------
def fleet_name(out: Path) -> str:
    """The fleet's name: the plan folder's name (`--out fleet/NAME/`). InputError unless it is lower-case letters,
    digits and hyphens, starting with a letter, at most 24 characters (it goes into job and cluster names)."""
    name = Path(out).name
    if not _NAME.fullmatch(name):
        raise InputError(f"--out {out}: the folder's name {name!r} names the fleet; expected lower-case letters, "
                         "digits and hyphens, starting with a letter, at most 24 characters (e.g. fleet/l4-vs-t4g)")
    return name


def check_bucket(uri: str) -> str:
    """`--bucket URI` without a trailing slash: SCHEME://NAME[/PATH] with a scheme of `BUCKET_SCHEMES`, or an Azure
    https://ACCOUNT.blob.core.windows.net/CONTAINER. InputError (one line) otherwise."""
    text = uri.rstrip("/")
    m = re.fullmatch(r"([a-z0-9]+)://([^/\s]+)(/[^\s]*)?", text)
    azure = m is not None and m.group(1) == "https" and m.group(2).endswith(".blob.core.windows.net") and m.group(3)
    if m is None or not (m.group(1) in BUCKET_SCHEMES or azure):
        raise InputError(f"--bucket {uri!r}: expected a bucket URI such as s3://my-bucket or gs://my-bucket "
                         f"(schemes: {', '.join(BUCKET_SCHEMES)}, or https://ACCOUNT.blob.core.windows.net/CONTAINER)")
    return text


def is_hub_id(spec: str) -> bool:
    """Whether a --checkpoint is a hub repo id (owner/name), as opposed to builtin:PRESET."""
    return not spec.startswith(("builtin:", "random:")) and _HUB_ID.fullmatch(spec) is not None


def check_checkpoint(spec: str | None) -> None:
    """--checkpoint on a fleet: builtin:PRESET (a preset of `model.config.PRESETS`), random:PRESET[@SEED] (dummy
    weights made on the machine's device, `model.random_spec`) or a hub repo id. A local folder is refused (it is
    not on the cloud machine). InputError (one line)."""
    if spec is None:
        return
    if spec.startswith("random:"):
        from model.errors import CheckpointError
        from model.random_spec import parse_random  # standard library only (no jax)

        try:
            parse_random(spec)
        except CheckpointError as exc:
            raise InputError(f"--checkpoint {exc}") from None
        return
    if spec.startswith("builtin:"):
        from model.config import PRESETS  # no jax (wall 5)

        if spec.split(":", 1)[1] not in PRESETS:
            raise InputError(f"--checkpoint {spec}: unknown built-in preset; expected builtin:{{{','.join(PRESETS)}}}")
        return
    if not is_hub_id(spec):
        raise InputError(f"--checkpoint {spec}: on a fleet expected builtin:PRESET, random:PRESET or a hub repo id "
                         "(owner/name); a local folder is not on the cloud machine")


def check_options(options: FleetOptions) -> None:
    """Refuse what no task could run, before anything is written: no accelerator, spot without a bucket, a bad
    bucket URI, checkpoint or disk size. Raises InputError (one line). The gpu-run flags are gpu-run's to check:
    `bench fleet plan` runs `bench.gpurun.main.check_options` on them (`gpu_run_check_fields`) before this, so that
    this package imports nothing of bench.gpurun (whose steps import jax)."""
    if not options.accelerators:
        raise InputError("--accelerators: expected at least one catalog name, e.g. T4g,L4")
    if options.spot and options.bucket is None:
        raise InputError("--spot needs --bucket URI: a preempted spot machine keeps nothing, so its run folders and "
                         "compilation cache must be written to a bucket (managed jobs recover onto a new machine)")
    if options.bucket is not None:
        check_bucket(options.bucket)
    check_checkpoint(options.checkpoint)
    if options.disk_size < 1:
        raise InputError(f"--disk-size {options.disk_size}: expected a positive number of GB")
    if options.mesh_axis not in AXES:
        raise InputError(f"--mesh-axis {options.mesh_axis}: expected one of {', '.join(AXES)} (tensor or expert "
                         "parallel: the axis a task of several devices splits the model along)")  # fmt: skip
    for text in options.accelerators:
        check_request(options, parse_request(text))


def check_request(options: FleetOptions, req: Request) -> None:
    """Refuse (InputError, one line) a task that cannot run as asked: a TPU slice on an --infra other than GCP or
    Kubernetes; a task over several hosts without --checkpoint (gpu-run's pilot + E2B plan is one host's) or with
    --steps (gpu-run's profile, not run there); a mesh the task's presets cannot use (`check_task_mesh`)."""
    cloud = (options.infra or "gcp").split("/")[0].lower()
    if req.tpu and cloud not in ("gcp", "kubernetes", "k8s"):
        raise InputError(f"--infra {options.infra}: {req.text} is a Cloud TPU slice, sold on GCP (and GKE); "
                         "expected --infra gcp[/REGION], kubernetes, or no --infra")  # fmt: skip
    if req.multi_host and options.checkpoint is None:
        raise InputError(f"--accelerators {req.text}: spans {req.hosts} hosts, which run one `bench sweep` together "
                         "(jax.distributed), not gpu-run's one-host pilot + E2B plan; expected --checkpoint "
                         "builtin:PRESET, random:PRESET or a hub repo id")  # fmt: skip
    if req.multi_host and options.steps is not None:
        raise InputError(f"--steps {options.steps}: sets gpu-run's profile, which a task over {req.hosts} hosts "
                         f"({req.text}) does not run (it sweeps only); drop --steps or that accelerator")  # fmt: skip
    check_task_mesh(options, req)


def mesh_presets(checkpoint: str | None) -> tuple[str, ...]:
    """The presets a task runs, which its mesh must divide: builtin:PRESET and random:PRESET[@SEED] name one; no
    checkpoint is gpu-run's pilot + E2B plan (`GPU_RUN_PRESETS`); a hub repo id none here (its config.json is
    read on the machine, where the engine checks the mesh before it loads anything)."""
    if checkpoint is None:
        return GPU_RUN_PRESETS
    if checkpoint.startswith("builtin:"):
        return (checkpoint.split(":", 1)[1],)
    if checkpoint.startswith("random:"):
        from model.random_spec import parse_random  # standard library only (no jax)

        return (parse_random(checkpoint).preset,)
    return ()


def task_mesh(options: FleetOptions, req: Request) -> Mesh | None:
    """The mesh a task's benchmark gets: `options.mesh_axis` over all its devices; None on one device."""
    return None if req.devices == 1 else Mesh(axis=options.mesh_axis, size=req.devices)


def check_task_mesh(options: FleetOptions, req: Request) -> None:
    """InputError (one line with the numbers) when the task's mesh does not divide a preset it runs
    (`model.placement.check_mesh`: tp the query heads, vocabulary and widths, and the KV heads; ep the experts)."""
    mesh = task_mesh(options, req)
    if mesh is None:
        return
    from model.config import PRESETS  # no jax (wall 5)

    for preset in mesh_presets(options.checkpoint):
        try:
            check_mesh(PRESETS[preset], mesh)
        except ValueError as exc:
            reason = str(exc).partition(": ")[2]
            raise InputError(f"--accelerators {req.text}: its {req.devices} devices make --mesh {mesh.text}, which "
                             f"preset {preset} cannot use: {reason}; ask for a count that gives such a size") from None


def gpu_run_check_fields(options: FleetOptions) -> dict[str, Any]:
    """The fields of `bench.gpurun.main.Options` that the plan's gpu-run flags set (a builtin checkpoint included;
    a hub checkpoint is a folder only on the machine), for gpu-run's own `check_options`."""
    spec = options.checkpoint if (options.checkpoint or "").startswith(("builtin:", "random:")) else None
    return {"budget_s": options.budget_s, "inputs": options.inputs, "max_new_tokens": options.max_new_tokens,
            "repeats": options.repeats, "steps": options.steps, "decode_loop": options.decode_loop,
            "quant": options.quant, "batch": options.batch, "checkpoint": spec}  # fmt: skip


# ---- the tasks ---------------------------------------------------------------------------------------------------
def gpu_run_args(options: FleetOptions) -> tuple[str, ...]:
    """The flags after OUTDIR on each task's gpu-run.sh line: --budget-s always, then each override given, in
    gpu-run.sh's own spelling (`bench gpu-run --help`); a hub checkpoint is "$ckpt" (the folder the run script
    downloads it to). Every flag here is one gpu-run.sh accepts (its --batch included)."""
    args = ["--budget-s", f"{options.budget_s:g}"]
    if options.checkpoint is not None:
        args += ["--checkpoint", "$ckpt" if is_hub_id(options.checkpoint) else options.checkpoint]
    for flag, value in (("--inputs", options.inputs), ("--max-new-tokens", options.max_new_tokens),
                        ("--repeats", options.repeats), ("--steps", options.steps),
                        ("--decode-loop", options.decode_loop), ("--batch", options.batch)):  # fmt: skip
        if value is not None:
            args += [flag, str(value)]
    for q in options.quant:
        args += ["--quant", q]
    return tuple(args)


def task_args(options: FleetOptions, req: Request) -> tuple[str, ...]:
    """One host's gpu-run.sh flags after OUTDIR: `gpu_run_args`, then `--mesh AXIS=N` when the task has N > 1
    devices (`bench gpu-run --mesh`, passed on to its sweeps and profiles)."""
    mesh = task_mesh(options, req)
    return gpu_run_args(options) + (() if mesh is None else ("--mesh", mesh.text))


def sweep_args(options: FleetOptions, req: Request, quant: str | None) -> tuple[str, ...]:
    """The `bench sweep` flags of one sweep of a multi-host task: the checkpoint ("$ckpt" for a hub one), the mesh
    over all its devices, the run folders and compilation cache under "$out", the sweep overrides given, and the
    --quant set `quant` (None: none given)."""
    mesh = task_mesh(options, req)
    assert mesh is not None and options.checkpoint is not None  # check_request: several hosts, a checkpoint
    args = ["--checkpoint", "$ckpt" if is_hub_id(options.checkpoint) else options.checkpoint, "--mesh", mesh.text,
            "--runs-dir", "$out/runs", "--compile-cache", "$out/xla-cache"]  # fmt: skip
    for flag, value in (("--inputs", options.inputs), ("--max-new-tokens", options.max_new_tokens),
                        ("--repeats", options.repeats), ("--decode-loop", options.decode_loop),
                        ("--batch", options.batch)):  # fmt: skip
        if value is not None:
            args += [flag, str(value)]
    return tuple(args) + (() if quant is None else ("--quant", quant))


def _sh(token: str) -> str:
    """One shell word: the run script's variables ("$out", "$ckpt", "$out/...") in double quotes, anything else
    quoted as needed."""
    return f'"{token}"' if token in ("$out", "$ckpt") or token.startswith("$out/") else shlex.quote(token)


def gpu_run_line(args: tuple[str, ...]) -> str:
    """The run script's gpu-run.sh line: the workdir's .venv Python, OUT ("$out"), then `args`."""
    return "PYTHON=.venv/bin/python scripts/gpu-run.sh " + " ".join(_sh(t) for t in ("$out", *args))


def bench_lines(options: FleetOptions, req: Request) -> tuple[str, ...]:
    """The benchmark command lines of a task, as its run script runs them: one host, `scripts/gpu-run.sh "$out"
    ...` (`task_args`); several hosts, one `run_sweep ...` per --quant set (`sweep_args`; `multi_host_script`
    defines run_sweep: `python -m bench.fleet.distributed --devices N -- sweep ...` within the budget)."""
    if not req.multi_host:
        return (gpu_run_line(task_args(options, req)),)
    sets = options.quant or (None,)
    return tuple("run_sweep " + " ".join(_sh(t) for t in sweep_args(options, req, q)) for q in sets)


def shown_command(req: Request, line: str) -> str:
    """A benchmark line as people read it: a multi-host task's `run_sweep ARGS` spelled out as the command each
    host runs (`.venv/bin/python -m bench.fleet.distributed --devices N -- sweep ARGS`)."""
    head = "run_sweep "
    if req.multi_host and line.startswith(head):
        return f".venv/bin/python -m {DISTRIBUTED} --devices {req.devices} -- sweep {line[len(head):]}"
    return line


_SETUP = """\
set -euo pipefail
if [ ! -x .venv/bin/python ]; then
  py=$(scripts/find-python.sh 2>/dev/null) || {{
    python3 -m pip install --user --quiet uv
    python3 -m uv python install 3.12
    py=$(python3 -m uv python find 3.12)
  }}
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt {install}
"""
SETUP = _SETUP.format(install="-e '.[cuda13]'")
"""The setup of a GPU task (run in the workdir): `.venv` with Python >= 3.12, the project with the cuda13 extra."""
TPU_SETUP = _SETUP.format(install="-e . 'jax[tpu]'")
"""The setup of a TPU task: the same `.venv`, the project and jax's tpu extra (libtpu) at constraints.txt's jax."""

_DOWNLOAD = ('import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1], '
             'allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja", "*.txt"]))')  # fmt: skip
"""The hub download on the machine (huggingface_hub reads HF_TOKEN from the environment): prints the folder."""


def _prologue(task_slug: str, bucket: bool, hub_checkpoint: str | None) -> list[str]:
    """The run script's lines after `out=...`: the cache folder, the cache restored (with a bucket), the hub
    checkpoint downloaded into "$ckpt" (one line and exit 2 when it cannot be)."""
    lines = ['mkdir -p "$out/xla-cache"']
    if bucket:
        lines += [f"cache={MOUNT}/xla-cache/{task_slug}",
                  'mkdir -p "$cache"',
                  'cp -R "$cache/." "$out/xla-cache/" 2>/dev/null || true  # restore this accelerator kind\'s cache']  # fmt: skip
    if hub_checkpoint is not None:
        lines += [f"ckpt=$(.venv/bin/python -c {shlex.quote(_DOWNLOAD)} {shlex.quote(hub_checkpoint)}) || "
                  f"{{ echo 'error: could not download {hub_checkpoint} (is the {HF_TOKEN} secret set?)' >&2; exit 2; }}"]  # fmt: skip
    return lines


def _epilogue(plan_name: str, task_slug: str, bucket: bool, what: str) -> list[str]:
    """The run script's last lines: the cache's new entries saved (with a bucket), "$rc" written to OUT/exit-code
    and echoed as `what`'s exit code, and the task's exit: 0 for 0 and 3 (the folders are valid), else "$rc"."""
    lines = ['cp -R -n "$out/xla-cache/." "$cache/" 2>/dev/null || true  # save its new entries'] if bucket else []
    return lines + ['echo "$rc" > "$out/exit-code"',
                    f'echo "fleet {plan_name} {task_slug}: {what} exit code $rc"',
                    'if [ "$rc" = 0 ] || [ "$rc" = 3 ]; then exit 0; fi',
                    'exit "$rc"']  # fmt: skip


def run_script(plan_name: str, task_slug: str, out: str, args: tuple[str, ...], *, bucket: bool,
               hub_checkpoint: str | None) -> str:  # fmt: skip
    """The `run` of a one-host task (bash, run in the workdir): restore the accelerator kind's compilation cache
    (with a bucket), download a hub checkpoint, run gpu-run.sh into `out` with `args`, save the cache's new
    entries, write gpu-run's exit code to OUT/exit-code, and exit 0 for its 0 and 3 (the folders are valid), else
    its code."""
    lines = ["set -uo pipefail", f"out={out}", *_prologue(task_slug, bucket, hub_checkpoint)]
    lines += [gpu_run_line(args), "rc=$?"]
    return "\n".join(lines + _epilogue(plan_name, task_slug, bucket, "gpu-run")) + "\n"


def multi_host_script(plan_name: str, task_slug: str, out: str, sweeps: tuple[str, ...], *, devices: int,
                      budget_s: float, bucket: bool, hub_checkpoint: str | None) -> str:  # fmt: skip
    """The `run` of a task over several hosts, which SkyPilot runs on every host (module docstring): OUT is `out`
    on rank 0 and `out`/node-R on rank R; after the cache and checkpoint lines (`_prologue`) each line of `sweeps`
    (`bench_lines`) calls run_sweep, which runs `python -m bench.fleet.distributed --devices DEVICES -- sweep ...`
    under `timeout` with what is left of `budget_s` (s): a sweep the budget stopped (timeout's 124) or could not
    start counts 3, like gpu-run's; the first code other than 0 and 3 is the task's, else 3 if any, else 0."""
    budget = math.ceil(budget_s)
    lines = ["set -uo pipefail", f"out={out}",
             'if [ "${SKYPILOT_NODE_RANK:-0}" != 0 ]; then out="$out/node-$SKYPILOT_NODE_RANK"; fi',
             *_prologue(task_slug, bucket, hub_checkpoint),
             f"deadline=$((SECONDS + {budget}))", "rc=0",
             "run_sweep() {",
             "  left=$((deadline - SECONDS))",
             f'  if [ "$left" -le 0 ]; then echo "fleet {plan_name} {task_slug}: budget spent; skipped: sweep $*"; one=3',
             f'  else timeout -s TERM -k 60 "$left" .venv/bin/python -m {DISTRIBUTED} --devices {devices} -- sweep "$@"',
             '    one=$?; if [ "$one" = 124 ]; then one=3; fi',
             "  fi",
             '  if [ "$rc" = 0 ] || { [ "$rc" = 3 ] && [ "$one" != 0 ]; }; then rc=$one; fi',
             "}",
             *sweeps]  # fmt: skip
    return "\n".join(lines + _epilogue(plan_name, task_slug, bucket, "sweeps'")) + "\n"


def task_out(name: str, task_slug: str, bucket: bool) -> str:
    """The run's OUTDIR on the machine: MOUNT/NAME/SLUG in the bucket, else fleet-out/NAME/SLUG in the workdir."""
    return f"{MOUNT}/{name}/{task_slug}" if bucket else f"{WORKDIR_OUT}/{name}/{task_slug}"


def _hub(options: FleetOptions) -> str | None:
    """The hub repo id of --checkpoint, None for builtin:PRESET or no checkpoint."""
    return options.checkpoint if options.checkpoint and is_hub_id(options.checkpoint) else None


def task_config(options: FleetOptions, accelerator: str, workdir: Path) -> dict[str, Any]:
    """The SkyPilot task YAML of the `--accelerators` entry `accelerator` (module docstring), as the dict that is
    written."""
    req = parse_request(accelerator)
    s, bucket, hub = req.slug, options.bucket is not None, _hub(options)
    out = task_out(options.name, s, bucket)
    resources: dict[str, Any] = {"accelerators": req.accelerators, "use_spot": options.spot,
                                 "disk_size": options.disk_size}  # fmt: skip
    if req.tpu_runtime is not None and not (options.infra or "").lower().startswith(("kubernetes", "k8s")):
        resources["accelerator_args"] = {"runtime_version": req.tpu_runtime}  # a TPU VM's image (not on GKE)
    if options.infra:
        resources["infra"] = options.infra
    if bucket:
        resources["job_recovery"] = dict(RECOVERY)
    config: dict[str, Any] = {"name": f"g4b-{options.name}-{s}", "workdir": str(workdir)}
    if req.nodes > 1:
        config["num_nodes"] = req.nodes
    config["resources"] = resources
    if hub is not None:
        config["secrets"] = {HF_TOKEN: None}
    if bucket:
        config["file_mounts"] = {MOUNT: {"source": options.bucket.rstrip("/"), "mode": "MOUNT_CACHED"}}
    config["setup"] = TPU_SETUP if req.tpu else SETUP
    if req.multi_host:
        config["run"] = multi_host_script(options.name, s, out, bench_lines(options, req), devices=req.devices,
                                          budget_s=options.budget_s, bucket=bucket, hub_checkpoint=hub)  # fmt: skip
    else:
        config["run"] = run_script(options.name, s, out, task_args(options, req), bucket=bucket, hub_checkpoint=hub)
    return config


def build_plan(options: FleetOptions, workdir: Path) -> tuple[FleetPlan, dict[str, dict[str, Any]]]:
    """The plan of `options` (checked first: `check_options`) and each task's YAML content by file name. `workdir`
    is the repository root the tasks upload. Raises InputError (one line) for options no task could run."""
    check_options(options)
    configs: dict[str, dict[str, Any]] = {}
    tasks = []
    for acc in options.accelerators:
        req = parse_request(acc)
        s, mesh = req.slug, task_mesh(options, req)
        config = task_config(options, acc, workdir)
        configs[f"{s}.yaml"] = config
        tasks.append(FleetTask(accelerator=req.text, slug=s, task_name=config["name"], yaml_file=f"{s}.yaml",
                               out=task_out(options.name, s, options.bucket is not None), devices=req.devices,
                               hosts=req.hosts, mesh=None if mesh is None else mesh.text,
                               command=shown_command(req, bench_lines(options, req)[0])))  # fmt: skip
    opts = asdict(options)
    plan = FleetPlan(name=options.name, bucket=options.bucket.rstrip("/") if options.bucket else None,
                     spot=options.spot, hf_token=_hub(options) is not None,
                     gpu_run_args=gpu_run_args(options), tasks=tuple(tasks),
                     created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), options=opts)  # fmt: skip
    return plan, configs


# ---- files -------------------------------------------------------------------------------------------------------
def dump_yaml(config: dict[str, Any]) -> str:
    """The task YAML text of `config`: keys in the order given, multi-line scripts as literal blocks (|)."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(config, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=200)


def load_yaml(path: Path) -> dict[str, Any]:
    """A task YAML file as a dict; FleetError naming the file when it is missing or not a YAML mapping."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FleetError(f"{path}: missing; make the plan again with `bench fleet plan`") from None
    except (OSError, yaml.YAMLError) as exc:
        raise FleetError(f"{path}: not a readable task YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise FleetError(f"{path}: expected a task YAML (a mapping), got {type(data).__name__}")
    return data


def write_plan(plan: FleetPlan, configs: dict[str, dict[str, Any]], folder: Path, *, replace: bool = False) -> list[Path]:
    """Write each task YAML and fleet.json into `folder` (created); returns the files written, fleet.json last.
    FleetError when `folder` already holds a plan and `replace` is False, or cannot be written."""
    folder = Path(folder)
    if (folder / PLAN_FILE).exists() and not replace:
        raise FleetError(f"{folder} already holds a fleet plan; pass --replace to write over it, or another --out")
    written = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, config in configs.items():
            (folder / name).write_text(dump_yaml(config), encoding="utf-8")
            written.append(folder / name)
        (folder / PLAN_FILE).write_text(plan.to_json(), encoding="utf-8")
    except OSError as exc:
        raise FleetError(f"{folder}: cannot write the plan ({exc.strerror or exc}); pass another --out") from None
    written.append(folder / PLAN_FILE)
    return written


def read_plan(folder: Path) -> FleetPlan:
    """The plan in `folder` (its fleet.json). FleetError when there is none or it is not a plan."""
    path = Path(folder) / PLAN_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FleetError(f"{folder}: no fleet plan there ({PLAN_FILE} missing); make one with "
                         f"`bench fleet plan --accelerators ... --out {folder}`") from None  # fmt: skip
    except OSError as exc:
        raise FleetError(f"{path}: unreadable ({exc.strerror or exc})") from None
    return FleetPlan.from_json(text, str(path))


def task_configs(folder: Path, plan: FleetPlan) -> dict[str, dict[str, Any]]:
    """Each task's YAML as it is in the plan folder now (edits included), by task name."""
    return {t.task_name: load_yaml(Path(folder) / t.yaml_file) for t in plan.tasks}
