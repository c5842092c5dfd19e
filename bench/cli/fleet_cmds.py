"""`bench fleet plan|launch|status|collect|down`: the prepared GPU run on a fleet of accelerator types (SkyPilot).

SkyPilot (the fleet extra) is imported only by `bench.fleet.sdk`, inside the calls that need it: `plan` (schema
validation), `launch`, `status` and `down` say in one line how to install it when it is missing (exit 2);
`collect` needs it not. Exit codes: 0 done; 1 `collect` found a corrupt run folder (reported, not archived);
2 a user error (bad flag, no plan, a missing secret or module, a refused task), one line from `bench.cli.main`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from bench.cli.root import app

fleet_app = typer.Typer(help="Sweeps across a fleet of GPU types on SkyPilot: plan, launch, status, collect, down.",
                        no_args_is_help=True)  # fmt: skip
app.add_typer(fleet_app, name="fleet")

PlanDir = Annotated[Path, typer.Argument(help="The plan folder (fleet/NAME) that `bench fleet plan` wrote.")]


@fleet_app.command("plan")
def plan_cmd(
    accelerators: str = typer.Option(..., "--accelerators", help="SkyPilot catalog names, one task each, with a "
                                     "count (NAME:COUNT), machines (NAME:COUNTxNODES) or a TPU slice, e.g. "
                                     "T4g,L4:2,H100:8,H100:8x2,tpu-v5litepod-8 (tpu-v5e-N reads as tpu-v5litepod-N). "
                                     "A task of N > 1 devices runs with --mesh tp=N."),
    out: Path = typer.Option(..., "--out", help="The plan folder, fleet/NAME/: its name names the fleet "
                             "(lower-case letters, digits, hyphens)."),
    spot: bool = typer.Option(False, "--spot", help="Spot instances, recovered from preemption as managed jobs "
                              "(needs --bucket)."),
    bucket: str | None = typer.Option(None, "--bucket", help="A bucket URI (s3://NAME, gs://NAME, ...) for the run "
                                      "folders and the compilation cache; the tasks run as managed jobs. Without "
                                      "it: clusters, results copied back with rsync."),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help="builtin:PRESET or a hub repo id (downloaded "
                                          "on each machine with the HF_TOKEN secret). Default: gpu-run's pilot + "
                                          "E2B plan."),
    inputs: str | None = typer.Option(None, "--inputs", help="The sweep's input sizes (tokens, comma-separated)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Tokens per request."),
    repeats: int | None = typer.Option(None, "--repeats", help="Timed repeats per sweep cell."),
    steps: int | None = typer.Option(None, "--steps", help="Profiled decode steps."),
    decode_loop: str | None = typer.Option(None, "--decode-loop", help="host, device or both (gpu-run's default: "
                                           "both)."),
    quant: list[str] | None = typer.Option(None, "--quant", help="One --quant option set per flag, repeatable "
                                           "(gpu-run.sh's --quant)."),
    batch: str | None = typer.Option(None, "--batch", help="Batch sizes, comma-separated, e.g. 1,8,32,128 (gpu-run.sh's "
                                     "--batch: every sweep at each; the largest also profiled)."),
    budget_s: float = typer.Option(1800.0, "--budget-s", help="gpu-run.sh's budget on each machine (s)."),
    infra: str | None = typer.Option(None, "--infra", help="SkyPilot's resources.infra, e.g. aws or aws/us-east-1 "
                                     "(default: any cloud the credentials allow)."),
    disk_size: int = typer.Option(100, "--disk-size", help="Disk per machine (GB)."),
    mesh_axis: str = typer.Option("tp", "--mesh-axis", help="The mesh axis of a task of several devices: tp (heads "
                                  "and widths split) or ep (experts split)."),
    replace: bool = typer.Option(False, "--replace", help="Write over a plan already in --out."),
) -> None:
    """Write one SkyPilot task YAML per accelerator and fleet.json into --out, each validated against SkyPilot's
    schema (offline: no cloud access, no credentials). The HF token is a secret named in the YAML, never written."""
    from bench.fleet import FleetOptions, build_plan, fleet_name, parse_accelerators, validate_task, write_plan
    from bench.gpurun.main import REPO

    names = parse_accelerators(accelerators)
    options = FleetOptions(name=fleet_name(out), accelerators=names, spot=spot, bucket=bucket, checkpoint=checkpoint,
                           inputs=inputs, max_new_tokens=max_new_tokens, repeats=repeats, steps=steps,
                           decode_loop=decode_loop, quant=tuple(quant or ()), batch=batch, budget_s=budget_s,
                           infra=infra, disk_size=disk_size, mesh_axis=mesh_axis)  # fmt: skip
    from bench.fleet.plan import gpu_run_check_fields
    from bench.gpurun.main import Options as GpuRunOptions
    from bench.gpurun.main import check_options as check_gpu_run  # gpu-run.sh's own checks, on the same values

    check_gpu_run(GpuRunOptions(outdir=Path("."), **gpu_run_check_fields(options)))
    plan, configs = build_plan(options, REPO)
    for file_name, config in configs.items():
        validate_task(config, str(out / file_name))
    written = write_plan(plan, configs, out, replace=replace)
    _print_plan(plan, out, written, len(configs))


def _print_plan(plan, out: Path, written: list, tasks: int) -> None:
    """What `bench fleet plan` wrote: one line per task and the command it runs, where results go, the secret, and
    the file list's last entry with the next step."""
    from bench.fleet import KNOWN, is_known
    from bench.fleet.plan import is_hub_id
    from bench.fleet.sdk import sky_version

    market = "spot" if plan.spot else "on-demand"
    runs_as = "managed job" if plan.managed else "cluster"
    for task in plan.tasks:
        base = task.accelerator.split(":", 1)[0]
        where = (KNOWN[base.lower()].families if base.lower() in KNOWN else "Cloud TPU on GCP") if is_known(
            task.accelerator) else "not in the project's list: SkyPilot's catalog decides at launch"  # fmt: skip
        spans = f"x{task.devices}" + (f" on {task.hosts} hosts" if task.hosts > 1 else "")
        mesh = f", --mesh {task.mesh}" if task.mesh else ""
        typer.echo(f"wrote {out / task.yaml_file}: {task.accelerator} {spans}{mesh} ({where}), {market}, {runs_as} "
                   f"{task.task_name}")  # fmt: skip
        typer.echo(f"  runs: {task.command}" + (" (on every host)" if task.hosts > 1 else ""))
    if any(t.hosts > 1 for t in plan.tasks):
        typer.echo("several hosts: planned and checked offline; the sweep across processes is tested with two jax "
                   "processes on one CPU, not yet on real hosts (docs/devices/fleet.md, \"Several hosts\")")  # fmt: skip
    checkpoint = plan.options.get("checkpoint")
    if checkpoint and is_hub_id(checkpoint) and any(t.mesh for t in plan.tasks):
        typer.echo(f"mesh: {checkpoint}'s config is read on the machine, where the engine checks the mesh "
                   "(not checked here, offline)")  # fmt: skip
    if plan.bucket:
        typer.echo(f"results: {plan.bucket}/{plan.name}/SLUG/runs/; compilation cache: {plan.bucket}/xla-cache/SLUG/ "
                   "(restored before each run, new entries saved after it)")  # fmt: skip
    else:
        typer.echo(f"results: fleet-out/{plan.name}/SLUG/ in each cluster's workdir (bench fleet collect copies them "
                   "with rsync; the compilation cache starts empty on each cluster)")  # fmt: skip
    if plan.hf_token:
        typer.echo("secret: HF_TOKEN by name only; `bench fleet launch` passes its value from your environment")
    typer.echo(f"wrote {written[-1]}; {tasks} task(s) valid against SkyPilot {sky_version()}'s schema "
               f"(offline: a launch needs cloud credentials). Next: bench fleet launch {out}")  # fmt: skip


@fleet_app.command("launch")
def launch_cmd(plan_dir: PlanDir) -> None:
    """Launch every task of the plan: managed jobs (with a bucket; spot preemptions recovered) or clusters. Needs
    SkyPilot's cloud credentials; the HF_TOKEN secret's value comes from this environment."""
    from bench.fleet import SkySDK, launch_fleet, read_plan

    plan = read_plan(plan_dir)
    for acc, name, job in launch_fleet(plan_dir, SkySDK(), os.environ):
        typer.echo(f"launched {acc}: {'managed job' if plan.managed else 'cluster'} {name} (job id {job})")
    typer.echo(f"follow with: bench fleet status {plan_dir}; when every task has ended: bench fleet collect "
               f"{plan_dir}; stop them all: bench fleet down {plan_dir}")  # fmt: skip


@fleet_app.command("status")
def status_cmd(plan_dir: PlanDir) -> None:
    """Each task's state as SkyPilot reports it (managed job or cluster)."""
    from rich.table import Table

    from bench.cli.common import make_console
    from bench.fleet import SkySDK, fleet_status

    table = Table(title=f"fleet {plan_dir.name}")
    for col in ("accelerator", "task", "kind", "status", "job id", "recoveries", "detail"):
        table.add_column(col)
    for s in fleet_status(plan_dir, SkySDK()):
        table.add_row(s.accelerator, s.task_name, s.kind, s.status, "—" if s.job_id is None else str(s.job_id),
                      str(s.recoveries), s.detail)  # fmt: skip
    make_console().print(table)


@fleet_app.command("collect")
def collect_cmd(
    plan_dir: PlanDir,
    source: Path | None = typer.Option(None, "--from", help="A local folder laid out like the bucket "
                                       "(FOLDER/NAME/SLUG/runs/RUN/). Default: download the plan's bucket (aws or "
                                       "gcloud CLI) or rsync its clusters into PLAN/download/ first."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="The archive to copy the run folders into."),
) -> None:
    """Copy every valid run folder of the fleet into --runs-dir: a complete one as it is, a preempted or cut one as
    incomplete (resumable); a corrupt one is reported with the reason; nothing archived is overwritten."""
    from bench.fleet import collect_runs, fetch, keep_outputs, read_plan
    from bench.fleet.collect import GPU_RUN_EXITS

    plan = read_plan(plan_dir)
    if source is None:
        source = fetch(plan, plan_dir / "download")
        typer.echo(f"downloaded {plan.bucket or 'the clusters'} into {source}")
    report = collect_runs(source, plan.name, runs_dir, [t.slug for t in plan.tasks])
    keep_outputs(source, plan, plan_dir)
    for slug, code in report.exit_codes.items():
        text = "no exit code (the run did not finish: preempted, stopped or still running)" if code is None else (
            f"gpu-run exit code {code} ({GPU_RUN_EXITS.get(code, 'unknown')})")  # fmt: skip
        typer.echo(f"{slug}: {text}")
    for c in report.runs:
        what = {"archived": f"archived ({c.status})", "exists": "skipped, already archived", "corrupt": "corrupt"}
        typer.echo(f"  {c.slug}/{c.run}: {what[c.outcome]}{': ' + c.note if c.note else ''}")
    counts = {k: sum(c.outcome == k for c in report.runs) for k in ("archived", "exists", "corrupt")}
    typer.echo(f"{counts['archived']} archived into {runs_dir}/, {counts['exists']} already there, "
               f"{counts['corrupt']} corrupt; compare them: make report")  # fmt: skip
    if counts["corrupt"]:
        raise typer.Exit(1)


@fleet_app.command("down")
def down_cmd(plan_dir: PlanDir) -> None:
    """Cancel the fleet's managed jobs that have not ended, or tear down its clusters (their disks go with them)."""
    from bench.fleet import SkySDK, down_fleet

    for name, what in down_fleet(plan_dir, SkySDK()):
        typer.echo(f"{name}: {what}")
