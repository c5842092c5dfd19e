"""Collecting a fleet's run folders into the archive (`bench fleet collect`).

A source is a local folder laid out like the bucket: `SOURCE/NAME/SLUG/runs/RUN/` (a run folder gpu-run.sh wrote
on the machine of accelerator SLUG in fleet NAME), beside `SOURCE/NAME/SLUG/exit-code` (gpu-run's exit code, when
the run command got that far), `summary.txt`, `gpu-run.log` and `logs/`. A bucket URI or the clusters of a plan
without one are first copied into such a folder with the cloud's own tools (`download_argv`, `rsync_argv`:
`aws s3 sync` for s3://, `gcloud storage rsync` for gs://, `rsync` over the ssh names SkyPilot gives its clusters;
the compilation cache is left out), then collected from it.

Each run folder is checked with `bench.runs.validate_run` and then:
- a folder that fails it (a corrupt manifest, a corrupt cells line, ...) is reported with the first problem, and
  not copied;
- a folder whose name is already in the runs folder is reported and left alone: nothing archived is overwritten
  (collecting twice is safe; to replace an archived run, delete it first);
- any other is copied (its writer's `.lock` left out) into a hidden temporary folder of the runs folder, checked
  again, and renamed into place. A run that still says "running" (its machine was preempted or stopped, or the
  job still runs) is archived with status "incomplete" and a run.log line saying so: its finished cells are valid
  and `bench sweep --resume NAME` on a machine with that accelerator continues it. Complete, incomplete and failed
  runs keep their status.
Standard library only (and `bench.runs`); no SkyPilot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import FleetError, RunFolderError
from bench.fleet.plan import FleetPlan

EXIT_CODE = "exit-code"
"""The file the run script writes gpu-run's exit code into (OUT/exit-code)."""
GPU_RUN_EXITS = {0: "every step ran", 1: "a step failed", 2: "usage error or missing module: nothing ran",
                 3: "the budget stopped or skipped a step"}  # fmt: skip
"""gpu-run.sh's exit codes (bench/gpurun/main.py)."""
KEEP = ("summary.txt", "gpu-run.log", EXIT_CODE)
"""The files of each accelerator's OUTDIR kept beside the plan (`bench fleet collect` copies them to PLAN/SLUG/)."""


@dataclass(frozen=True)
class Collected:
    """What happened to one run folder of the source: `slug` (its accelerator's folder), `run` (its name),
    `outcome` ("archived", "exists" or "corrupt"), `status` (the archived copy's status; None unless archived) and
    `note` (the validation problem, the clash, or the status change; "" when there is nothing to say)."""

    slug: str
    run: str
    outcome: str
    status: str | None = None
    note: str = ""


@dataclass(frozen=True)
class CollectReport:
    """`runs`: every run folder found, in order (slug, then name); `exit_codes`: per accelerator folder, gpu-run's
    exit code as its OUT/exit-code says (None: the run command did not get that far, or the file is unreadable)."""

    runs: tuple[Collected, ...]
    exit_codes: dict[str, int | None] = field(default_factory=dict)


def _exit_code(folder: Path) -> int | None:
    try:
        return int((folder / EXIT_CODE).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def _problem_text(problems: list[str]) -> str:
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def _archive(src: Path, runs_dir: Path, origin: str) -> Collected | str:
    """Copy the valid run `src` into `runs_dir` (module docstring); returns its Collected, or the reason it could not
    be archived (a string)."""
    from bench.runs import open_run, validate_run, writer_state

    tmp = runs_dir / f".collect-{src.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(".lock"))
        note = ""
        run = open_run(tmp)
        if run.status == "running":
            w = writer_state(src)
            who = f"writer pid {w.pid} on {w.host}" if w.pid is not None else "its writer"
            note = (f"was 'running' in {origin} ({who}: its machine was preempted or stopped, or it still runs); "
                    f"archived as incomplete, resumable with bench sweep --resume {src.name} on that accelerator")
            run.update_manifest(status="incomplete")
            run.log(f"bench fleet collect: {note}")
        problems = validate_run(tmp)
        if problems:
            shutil.rmtree(tmp, ignore_errors=True)
            return _problem_text(problems)
        dest = runs_dir / src.name
        if dest.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return "exists"
        os.rename(tmp, dest)
        return Collected(src.parent.parent.name, src.name, "archived", run.status, note)
    except (OSError, RunFolderError, ValueError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"could not be copied ({exc})"


def collect_runs(source: Path, fleet: str, runs_dir: Path, slugs: Sequence[str] | None = None) -> CollectReport:
    """Archive the run folders of fleet `fleet` found in the local folder `source` (laid out like the bucket,
    module docstring) into `runs_dir` (created when missing). `slugs` limits it to those accelerators' folders (the
    plan's); None takes every folder under SOURCE/FLEET. Never overwrites anything in `runs_dir`.
    Raises FleetError when SOURCE/FLEET is not a folder or `runs_dir` cannot be created."""
    from bench.runs import validate_run

    root = Path(source) / fleet
    if not root.is_dir():
        raise FleetError(f"{source}: no folder {fleet}/ there; expected the bucket's layout SOURCE/{fleet}/SLUG/runs/RUN/")
    try:
        Path(runs_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FleetError(f"runs folder {runs_dir}: cannot create it ({exc.strerror or exc}); pass --runs-dir") from None
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if slugs is None else list(slugs)
    out: list[Collected] = []
    codes: dict[str, int | None] = {}
    for s in names:
        acc = root / s
        codes[s] = _exit_code(acc)
        runs = acc / "runs"
        if not runs.is_dir():
            continue
        for src in sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")):
            problems = validate_run(src)
            if problems:
                out.append(Collected(s, src.name, "corrupt", None, _problem_text(problems)))
                continue
            if (Path(runs_dir) / src.name).exists():
                out.append(Collected(s, src.name, "exists", None, f"{Path(runs_dir) / src.name} is archived "
                                     "already; left as it is (delete it first to collect this one)"))  # fmt: skip
                continue
            result = _archive(src, Path(runs_dir), str(source))
            if isinstance(result, Collected):
                out.append(result)
            elif result == "exists":
                out.append(Collected(s, src.name, "exists", None, f"{Path(runs_dir) / src.name} appeared meanwhile"))
            else:
                out.append(Collected(s, src.name, "corrupt", None, result))
    return CollectReport(tuple(out), codes)


def keep_outputs(source: Path, plan: FleetPlan, plan_dir: Path) -> list[Path]:
    """Copy each accelerator's summary.txt, gpu-run.log and exit-code from SOURCE/NAME/SLUG/ into PLAN_DIR/SLUG/
    (replacing earlier copies: these are not run folders). Returns the files copied."""
    copied = []
    for task in plan.tasks:
        src = Path(source) / plan.name / task.slug
        for name in KEEP:
            if (src / name).is_file():
                (Path(plan_dir) / task.slug).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / name, Path(plan_dir) / task.slug / name)
                copied.append(Path(plan_dir) / task.slug / name)
    return copied


# ---- downloads ---------------------------------------------------------------------------------------------------
def download_argv(bucket: str, fleet: str, dest: Path) -> list[str]:
    """The command that copies BUCKET/FLEET/ into DEST/FLEET/, the compilation cache left out: `aws s3 sync` for
    s3://, `gcloud storage rsync` for gs://. FleetError for another scheme (download it with that cloud's tool and
    pass the folder with --from)."""
    src, to = f"{bucket.rstrip('/')}/{fleet}", str(Path(dest) / fleet)
    if bucket.startswith("s3://"):
        return ["aws", "s3", "sync", src, to, "--only-show-errors", "--exclude", "*/xla-cache/*"]
    if bucket.startswith("gs://"):
        return ["gcloud", "storage", "rsync", "--recursive", "--exclude", r".*/xla-cache/.*", src, to]
    raise FleetError(f"bucket {bucket}: bench fleet collect downloads s3:// and gs:// buckets itself; copy "
                     f"{bucket}/{fleet}/ into FOLDER/{fleet}/ with that cloud's tool and pass --from FOLDER")


def rsync_argv(cluster: str, out: str, dest: Path) -> list[str]:
    """The command that copies the cluster's OUT (under its workdir) into DEST (rsync over the ssh host name
    SkyPilot gives each cluster; the compilation cache left out)."""
    return ["rsync", "-a", "--exclude", "xla-cache/", "--exclude", "site/", f"{cluster}:sky_workdir/{out}/",
            f"{dest}/"]  # fmt: skip


def fetch(plan: FleetPlan, dest: Path, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Path:
    """Copy the plan's results into the local folder DEST, laid out like the bucket (DEST/NAME/SLUG/...): from its
    bucket, or from each of its clusters. Returns DEST. FleetError (one line) when the tool is missing or fails."""
    commands = ([download_argv(plan.bucket, plan.name, dest)] if plan.bucket else
                [rsync_argv(t.task_name, t.out, Path(dest) / plan.name / t.slug) for t in plan.tasks])  # fmt: skip
    for argv in commands:
        Path(argv[-1]).mkdir(parents=True, exist_ok=True)
        try:
            done = run(argv, check=False)
        except FileNotFoundError:
            raise FleetError(f"{argv[0]} not found: bench fleet collect runs `{' '.join(argv[:3])} ...` to download; "
                             "install it, or copy the results yourself and pass --from FOLDER") from None  # fmt: skip
        if done.returncode != 0:
            raise FleetError(f"`{' '.join(argv)}` failed (exit code {done.returncode}; its output is above)")
    return Path(dest)
