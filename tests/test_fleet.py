"""bench fleet without SkyPilot: the plan's task YAMLs (what they ask for, the run line gpu-run's own parser accepts,
no token written), collect from a folder laid out like the bucket, and launch / status / down against a fake of
the SkyPilot SDK's call boundary (the `sky` module: what is sent to it). The schema tests, which need SkyPilot
itself, are in tests/test_fleet_schema.py."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import types
from pathlib import Path

import pytest
import typer
from conftest import bench_captured
from runfolders import make_measured_run

from bench.errors import FleetError, InputError
from bench.fleet import (
    HF_TOKEN,
    FleetOptions,
    build_plan,
    collect_runs,
    down_fleet,
    fleet_status,
    launch_fleet,
    load_yaml,
    parse_accelerators,
    read_plan,
    write_plan,
)
from bench.fleet.collect import download_argv, rsync_argv
from bench.fleet.plan import check_bucket, gpu_run_args, gpu_run_check_fields
from bench.fleet.sdk import SkySDK

REPO = Path(__file__).resolve().parents[1]
TOKEN = "hf_fleet_test_token_value_7f3a9c"


def options(**kw) -> FleetOptions:
    base = dict(name="cmp", accelerators=("T4g", "L4"), bucket="s3://bench-bucket", spot=True,
                checkpoint="google/gemma-4-E2B-it", inputs="41,521", repeats=2, quant=("none", "ple4,int8_lm_head"))  # fmt: skip
    return FleetOptions(**{**base, **kw})


def make_plan(folder: Path, **kw) -> Path:
    plan, configs = build_plan(options(**kw), REPO)
    write_plan(plan, configs, folder)
    return folder


# ---- the plan ----------------------------------------------------------------------------------------------------
def test_accelerators_are_catalog_names_with_counts():
    assert parse_accelerators("t4g, L4,h100") == ("T4g", "L4", "H100")
    assert parse_accelerators("RTX4090") == ("RTX4090",)  # not in our list: SkyPilot decides at launch
    assert parse_accelerators("L4:1,L4:2") == ("L4", "L4:2")  # a count of 1 is the plain name; other counts differ
    for bad in ("", "L4,,T4g", "L4:0", "L4,l4", "L4:1,l4", "l 4"):
        with pytest.raises(InputError):
            parse_accelerators(bad)


def test_each_task_asks_for_its_accelerator_spot_bucket_and_the_secret_by_name(tmp_path):
    folder = make_plan(tmp_path / "cmp")
    plan = read_plan(folder)
    assert [t.task_name for t in plan.tasks] == ["g4b-cmp-t4g", "g4b-cmp-l4"] and plan.managed and plan.hf_token
    for task, acc in zip(plan.tasks, ("T4g", "L4"), strict=True):
        y = load_yaml(folder / task.yaml_file)
        assert y["name"] == task.task_name and y["workdir"] == str(REPO)
        assert y["resources"]["accelerators"] == f"{acc}:1" and y["resources"]["use_spot"] is True
        assert y["resources"]["job_recovery"]["max_restarts_on_errors"] == 0
        assert y["secrets"] == {HF_TOKEN: None}  # by name only
        assert y["file_mounts"] == {"/g4b-fleet": {"source": "s3://bench-bucket", "mode": "MOUNT_CACHED"}}
        assert "-c constraints.txt -e '.[cuda13]'" in y["setup"]
        run = y["run"]
        slug = task.slug
        assert f"out=/g4b-fleet/cmp/{slug}" in run and f"cache=/g4b-fleet/xla-cache/{slug}" in run
        restore, gpu, save = (run.index(s) for s in ('"$cache/." "$out/xla-cache/"', "scripts/gpu-run.sh",
                                                       '"$out/xla-cache/." "$cache/"'))  # fmt: skip
        assert restore < gpu < save  # the cache is restored before the run and saved after it
        line = next(ln for ln in run.splitlines() if "scripts/gpu-run.sh" in ln)
        assert shlex.split(line)[2:] == ["$out", "--budget-s", "1800", "--checkpoint", "$ckpt", "--inputs", "41,521",
                                         "--repeats", "2", "--quant", "none", "--quant", "ple4,int8_lm_head"]  # fmt: skip


def test_on_demand_without_a_bucket_runs_clusters_and_writes_into_the_workdir(tmp_path):
    folder = make_plan(tmp_path / "od", name="od", spot=False, bucket=None, checkpoint="builtin:default", quant=())
    plan = read_plan(folder)
    assert not plan.managed and not plan.hf_token
    y = load_yaml(folder / "l4.yaml")
    assert y["resources"]["use_spot"] is False and "job_recovery" not in y["resources"]
    assert "secrets" not in y and "file_mounts" not in y and "cache=" not in y["run"]
    assert "out=fleet-out/od/l4" in y["run"] and "--checkpoint builtin:default" in y["run"]


@pytest.mark.parametrize("kw,needle", [
    (dict(bucket=None), "--spot needs --bucket"),
    (dict(bucket="my-bucket"), "--bucket"),
    (dict(bucket="ftp://x"), "--bucket"),
    (dict(checkpoint="/some/local/folder"), "not on the cloud machine"),
    (dict(checkpoint="builtin:nope"), "unknown built-in preset"),
    (dict(accelerators=()), "--accelerators"),
])  # fmt: skip
def test_options_no_task_could_run_are_refused(kw, needle):
    with pytest.raises(InputError, match=needle.replace("-", r"\-")):
        build_plan(options(**kw), REPO)


def test_bucket_uris():
    assert check_bucket("gs://b/") == "gs://b"
    assert check_bucket("https://acct.blob.core.windows.net/c") == "https://acct.blob.core.windows.net/c"
    with pytest.raises(InputError):
        check_bucket("https://example.com/c")


def test_the_run_line_is_accepted_by_gpu_run_own_parser_and_checks(tmp_path):
    """The exact gpu-run.sh arguments of a task, parsed by `bench gpu-run`'s own click command (what gpu-run.sh
    runs after taking --wheels), then checked by bench.gpurun's check_options: nothing gpu-run lacks; --batch goes
    through as given."""
    from bench.cli import _register, app
    from bench.gpurun.main import Options, check_options

    folder = make_plan(tmp_path / "cmp", steps=5, max_new_tokens=32, decode_loop="host", batch="1,8,32")
    run = load_yaml(folder / "t4g.yaml")["run"]
    words = shlex.split(next(ln for ln in run.splitlines() if "scripts/gpu-run.sh" in ln))
    assert words[:2] == ["PYTHON=.venv/bin/python", "scripts/gpu-run.sh"] and "--wheels" not in words
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    args = [{"$out": str(tmp_path / "out"), "$ckpt": str(ckpt)}.get(w, w) for w in words[2:]]
    _register(["fleet"])
    group = typer.main.get_command(app)
    ctx = group.make_context("bench", ["gpu-run", *args])
    params = group.get_command(ctx, "gpu-run").make_context("gpu-run", args, parent=ctx).params
    assert params["quant"] == ["none", "ple4,int8_lm_head"] and params["steps"] == 5 and params["repeats"] == 2
    assert params["batch"] == "1,8,32" and words.count("--batch") == 1
    check_options(Options(**{**params, "quant": tuple(params["quant"])}))
    with pytest.raises(Exception, match="--sideways"):  # the parser refuses what gpu-run does not take
        group.get_command(ctx, "gpu-run").make_context("gpu-run", [*args, "--sideways", "2"], parent=ctx)


@pytest.mark.parametrize("batch", ["0", "x", "4,4", "1,,2"])
def test_a_bad_batch_is_refused_by_gpu_run_checks_before_a_plan_is_written(batch):
    from bench.gpurun.main import Options, check_options

    with pytest.raises(InputError, match="--batch"):
        check_options(Options(outdir=Path("."), **gpu_run_check_fields(options(batch=batch))))
    assert "--batch" not in gpu_run_args(options())  # without it, no flag: the run is as before


def test_gpu_run_refusals_reach_the_plan_command(capsys):
    from bench.gpurun.main import Options, check_options

    with pytest.raises(InputError, match="--decode-loop"):
        check_options(Options(outdir=Path("."), **gpu_run_check_fields(options(decode_loop="sideways"))))
    code, _out, err = bench_captured(["fleet", "plan", "--accelerators", "L4", "--repeats", "0", "--out",
                                      "/tmp/never-written-fleet"], capsys)  # fmt: skip
    assert code == 2 and "--repeats 0" in err and len(err.strip().splitlines()) == 1
    assert not Path("/tmp/never-written-fleet").exists()


def test_the_token_is_never_written_even_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv(HF_TOKEN, TOKEN)
    folder = make_plan(tmp_path / "cmp")
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert len(files) == 3  # t4g.yaml, l4.yaml, fleet.json
    for p in files:
        assert TOKEN not in p.read_text(encoding="utf-8"), p


def test_a_plan_is_not_written_over_unless_asked(tmp_path):
    folder = make_plan(tmp_path / "cmp")
    plan, configs = build_plan(options(), REPO)
    with pytest.raises(FleetError, match="--replace"):
        write_plan(plan, configs, folder)
    write_plan(plan, configs, folder, replace=True)


# ---- collect -----------------------------------------------------------------------------------------------------
def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


@pytest.fixture
def bucket(tmp_path) -> Path:
    """A local folder laid out like the bucket: fleet cmp, one complete run (l4), one preempted run (t4g: still
    'running', its writer on a cloud host), one corrupt run (h100: a cut manifest)."""
    root = tmp_path / "bucket"
    make_measured_run(root / "cmp" / "l4" / "runs", "gpurun-pilot", slug="l4")
    (root / "cmp" / "l4" / "exit-code").write_text("3\n")
    (root / "cmp" / "l4" / "summary.txt").write_text("summary\n")
    cut = make_measured_run(root / "cmp" / "t4g" / "runs", "gpurun-pilot", slug="t4g", status="running")
    cut.unlock()
    (cut.path / ".lock").write_text("pid 4242 on ip-10-0-0-7\n")
    bad = make_measured_run(root / "cmp" / "h100" / "runs", "gpurun-pilot", slug="h100")
    (bad.path / "manifest.json").write_text('{"schema_version": 2, "name": ')
    return root


def test_collect_archives_complete_and_incomplete_reports_corrupt_overwrites_nothing(bucket, tmp_path):
    runs = tmp_path / "runs"
    archived = make_measured_run(runs, "earlier", slug="cpu")
    before = _tree(runs)
    report = collect_runs(bucket, "cmp", runs)
    by = {c.slug: c for c in report.runs}
    assert by["l4"].outcome == "archived" and by["l4"].status == "complete"
    assert by["t4g"].outcome == "archived" and by["t4g"].status == "incomplete"
    assert "pid 4242 on ip-10-0-0-7" in by["t4g"].note and "--resume" in by["t4g"].note
    assert by["h100"].outcome == "corrupt" and by["h100"].note.startswith("manifest.json: corrupt JSON")
    assert not (runs / "2026-11-30-gpurun-pilot-h100").exists()
    assert report.exit_codes == {"h100": None, "l4": 3, "t4g": None}
    from bench.runs import open_run, run_note, validate_run

    for name in ("2026-11-30-gpurun-pilot-l4", "2026-11-30-gpurun-pilot-t4g"):
        assert validate_run(runs / name) == []
        assert not (runs / name / ".lock").exists()
    t4g = open_run(runs / "2026-11-30-gpurun-pilot-t4g")
    assert t4g.status == "incomplete" and run_note(t4g) is None and len(t4g.cells()) == 2
    assert "bench fleet collect" in (t4g.path / "run.log").read_text()
    assert all(_tree(runs)[k] == v for k, v in before.items())  # the archived run is untouched
    assert not [p for p in runs.iterdir() if p.name.startswith(".")]  # no temporary folder left
    # Collecting again changes nothing: each archived run is a clash, reported and left alone.
    after = _tree(runs)
    again = collect_runs(bucket, "cmp", runs)
    assert [c.outcome for c in again.runs] == ["corrupt", "exists", "exists"]
    assert _tree(runs) == after
    assert archived.path.exists()


def test_collect_command_prints_each_run_and_exits_1_on_a_corrupt_one(bucket, tmp_path, capsys):
    folder = make_plan(tmp_path / "cmp", accelerators=("T4g", "L4", "H100"))
    code, out, _err = bench_captured(["fleet", "collect", str(folder), "--from", str(bucket), "--runs-dir",
                                      str(tmp_path / "runs")], capsys)  # fmt: skip
    assert code == 1
    assert "l4: gpu-run exit code 3 (the budget stopped or skipped a step)" in out
    assert "t4g/2026-11-30-gpurun-pilot-t4g: archived (incomplete)" in out
    assert "h100/2026-11-30-gpurun-pilot-h100: corrupt: manifest.json: corrupt JSON" in out
    assert "2 archived" in out and "1 corrupt" in out
    assert (folder / "l4" / "summary.txt").read_text() == "summary\n"


def test_collect_from_a_missing_fleet_folder_is_one_line(tmp_path):
    with pytest.raises(FleetError, match="no folder cmp/"):
        collect_runs(tmp_path, "cmp", tmp_path / "runs")


def test_download_commands():
    assert download_argv("s3://b/", "cmp", Path("/d"))[:5] == ["aws", "s3", "sync", "s3://b/cmp", "/d/cmp"]
    assert download_argv("gs://b", "cmp", Path("/d"))[-2:] == ["gs://b/cmp", "/d/cmp"]
    with pytest.raises(FleetError, match="--from"):
        download_argv("r2://b", "cmp", Path("/d"))
    assert rsync_argv("g4b-x-l4", "fleet-out/x/l4", Path("/d"))[-2:] == ["g4b-x-l4:sky_workdir/fleet-out/x/l4/", "/d/"]


# ---- launch, status, down against a fake `sky` ----------------------------------------------------------------------
class FakeSky(types.ModuleType):
    """The `sky` module as far as bench.fleet.sdk calls it; records every call (name, arguments)."""

    def __init__(self, jobs=(), clusters=()):
        super().__init__("sky")
        self.__version__ = "0.0-fake"
        self.calls: list[tuple] = []
        self.requests: dict[str, str] = {}
        self._jobs, self._clusters = list(jobs), list(clusters)
        fake = self

        class Task:
            @staticmethod
            def from_yaml_config(config, env_overrides=None, secrets_overrides=None):
                fake.calls.append(("Task.from_yaml_config", config, secrets_overrides))
                return {"task": config["name"]}

        self.Task = Task
        self.jobs = types.SimpleNamespace(
            launch=lambda task, name=None: self._req("jobs.launch", task, name=name),
            queue=lambda refresh, skip_finished=False: self._req("jobs.queue", refresh=refresh,
                                                                 skip_finished=skip_finished),
            cancel=lambda name=None: self._req("jobs.cancel", name=name),
        )  # fmt: skip
        self.utils = types.SimpleNamespace(
            common_utils=types.SimpleNamespace(validate_schema=lambda obj, schema, prefix: None),
            schemas=types.SimpleNamespace(get_task_schema=dict, get_resources_schema=dict, get_storage_schema=dict),
        )  # fmt: skip

    def _req(self, what, *args, **kw):
        self.calls.append((what, args, kw))
        request_id = f"request-{len(self.calls)}"
        self.requests[request_id] = what
        return request_id

    def launch(self, task, cluster_name=None, idle_minutes_to_autostop=None, down=False):
        return self._req("launch", task, cluster_name=cluster_name, idle_minutes_to_autostop=idle_minutes_to_autostop,
                         down=down)  # fmt: skip

    def status(self, cluster_names=None):
        return self._req("status", cluster_names=cluster_names)

    def down(self, cluster_name):
        return self._req("down", cluster_name)

    def stream_and_get(self, request_id):
        what = self.requests[request_id]
        self.calls.append(("stream_and_get", request_id))
        return {"jobs.launch": ([7], None), "launch": (1, None), "jobs.queue": self._jobs,
                "status": self._clusters}.get(what)  # fmt: skip


class Status:  # an enum member as SkyPilot's records carry it
    def __init__(self, value):
        self.value = value


@pytest.fixture
def fake_sky(monkeypatch):
    def install(**kw) -> FakeSky:
        fake = FakeSky(**kw)
        monkeypatch.setitem(sys.modules, "sky", fake)
        monkeypatch.setitem(sys.modules, "sky.utils", fake.utils)
        return fake

    return install


def test_launch_sends_each_task_as_a_managed_job_with_the_secret_value(tmp_path, fake_sky, monkeypatch):
    folder = make_plan(tmp_path / "cmp")
    fake = fake_sky()
    launched = launch_fleet(folder, SkySDK(), {HF_TOKEN: TOKEN})
    assert launched == [("T4g", "g4b-cmp-t4g", 7), ("L4", "g4b-cmp-l4", 7)]
    tasks = [c for c in fake.calls if c[0] == "Task.from_yaml_config"]
    # Each YAML is parsed by SkyPilot's Task twice: validated (no secret), then launched (with the secret's value).
    assert [c[1]["name"] for c in tasks] == ["g4b-cmp-t4g", "g4b-cmp-l4", "g4b-cmp-t4g", "g4b-cmp-l4"]
    sent = [c for c in tasks if c[2] is not None]  # the launches (validation parses without secrets)
    assert [c[2] for c in sent] == [[(HF_TOKEN, TOKEN)]] * 2
    assert sent[0][1] == load_yaml(folder / "t4g.yaml")  # the YAML as written, nothing added
    launches = [c for c in fake.calls if c[0] == "jobs.launch"]
    assert [c[2]["name"] for c in launches] == ["g4b-cmp-t4g", "g4b-cmp-l4"]
    assert sum(c[0] == "stream_and_get" for c in fake.calls) == 2
    assert not any(c[0] == "launch" for c in fake.calls)


def test_launch_without_the_token_sends_nothing(tmp_path, fake_sky):
    folder = make_plan(tmp_path / "cmp")
    fake = fake_sky()
    with pytest.raises(FleetError, match="HF_TOKEN is not set"):
        launch_fleet(folder, SkySDK(), {})
    assert not any(c[0] in ("jobs.launch", "launch") for c in fake.calls)


def test_launch_without_a_bucket_sends_clusters_that_stay_for_rsync(tmp_path, fake_sky):
    folder = make_plan(tmp_path / "od", name="od", spot=False, bucket=None, checkpoint="builtin:default")
    fake = fake_sky()
    launch_fleet(folder, SkySDK(), {})
    sent = [c for c in fake.calls if c[0] == "launch"]
    assert [c[2] for c in sent] == [{"cluster_name": "g4b-od-t4g", "idle_minutes_to_autostop": 60, "down": False},
                                    {"cluster_name": "g4b-od-l4", "idle_minutes_to_autostop": 60, "down": False}]  # fmt: skip
    assert all(c[2] is None for c in fake.calls if c[0] == "Task.from_yaml_config")  # no secret declared


def test_status_reads_the_latest_job_of_each_task_and_down_cancels_the_live_ones(tmp_path, fake_sky, capsys):
    folder = make_plan(tmp_path / "cmp", accelerators=("T4g", "L4", "H100"))
    jobs = [{"job_name": "g4b-cmp-t4g", "job_id": 3, "status": Status("FAILED"), "recovery_count": 0},
            {"job_name": "g4b-cmp-t4g", "job_id": 5, "status": Status("RECOVERING"), "recovery_count": 1},
            {"job_name": "g4b-cmp-l4", "job_id": 4, "status": Status("SUCCEEDED"), "recovery_count": 0},
            {"job_name": "someone-else", "job_id": 9, "status": Status("RUNNING")}]  # fmt: skip
    fake = fake_sky(jobs=jobs)
    states = fleet_status(folder, SkySDK())
    assert [(s.task_name, s.status, s.job_id, s.recoveries) for s in states] == [
        ("g4b-cmp-t4g", "RECOVERING", 5, 1), ("g4b-cmp-l4", "SUCCEEDED", 4, 0), ("g4b-cmp-h100", "not launched", None, 0)]
    assert ("jobs.queue", (), {"refresh": False, "skip_finished": False}) in fake.calls
    done = dict(down_fleet(folder, SkySDK()))
    assert done["g4b-cmp-t4g"].startswith("cancelled") and "nothing to stop" in done["g4b-cmp-l4"]
    assert [c[2]["name"] for c in fake.calls if c[0] == "jobs.cancel"] == ["g4b-cmp-t4g"]
    code, out, _ = bench_captured(["fleet", "status", str(folder)], capsys)
    assert code == 0 and "RECOVERING" in out and "not launched" in out


def test_a_sky_error_is_one_line(tmp_path, fake_sky, capsys):
    folder = make_plan(tmp_path / "cmp", checkpoint="builtin:default")
    fake = fake_sky()

    def refuse(task, name=None):
        raise RuntimeError("No cloud access.\nRun `sky check` to see why.")

    fake.jobs.launch = refuse
    code, _out, err = bench_captured(["fleet", "launch", str(folder)], capsys)
    assert code == 2 and err.strip() == "error: managed job g4b-cmp-t4g: launch failed: RuntimeError: No cloud access."


@pytest.mark.parametrize("cmd", [["plan", "--accelerators", "L4", "--out", "{tmp}/x"], ["launch", "{plan}"],
                                 ["status", "{plan}"], ["down", "{plan}"]])  # fmt: skip
def test_without_skypilot_each_command_names_the_fleet_venv(cmd, tmp_path, monkeypatch, capsys):
    folder = make_plan(tmp_path / "cmp", spot=False, bucket=None, checkpoint=None)
    monkeypatch.setitem(sys.modules, "sky", None)  # `import sky` raises ImportError
    args = [a.format(tmp=tmp_path, plan=folder) for a in cmd]
    code, out, err = bench_captured(["fleet", *args], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "make fleet-venv" in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "x").exists()


def test_the_plan_record_roundtrips(tmp_path):
    folder = make_plan(tmp_path / "cmp")
    data = json.loads((folder / "fleet.json").read_text())
    assert data["plan_version"] == 1 and data["bucket"] == "s3://bench-bucket"
    assert read_plan(folder).tasks[1].out == "/g4b-fleet/cmp/l4"
    (folder / "fleet.json").write_text("{}")
    with pytest.raises(FleetError, match="not a fleet plan"):
        read_plan(folder)


def test_importing_the_fleet_imports_neither_skypilot_nor_jax():
    import subprocess

    code = ("import sys, bench.fleet, bench.cli.fleet_cmds; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('sky', 'jax', 'jaxlib')]; assert not bad, bad")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("gpu_rc,task_rc", [(0, 0), (3, 0), (1, 1)])
def test_the_run_script_restores_the_cache_before_and_saves_it_after(tmp_path, gpu_rc, task_rc):
    """The task's `run`, executed by bash in a stand-in workdir whose scripts/gpu-run.sh is a fake (it checks the
    restored cache entry, adds one, writes a run folder and exits `gpu_rc`); the bucket mount is a local folder."""
    import subprocess

    mount = tmp_path / "mount"
    folder = make_plan(tmp_path / "cmp", checkpoint="builtin:default")
    run = load_yaml(folder / "l4.yaml")["run"].replace("/g4b-fleet", str(mount))
    work = tmp_path / "work"
    (work / "scripts").mkdir(parents=True)
    (work / "scripts" / "gpu-run.sh").write_text(
        '#!/usr/bin/env bash\nout=$1\n[ -f "$out/xla-cache/old-entry" ] || exit 9\n'
        f'echo new > "$out/xla-cache/new-entry"; mkdir -p "$out/runs/r1"; echo "$*" > "$out/args"; exit {gpu_rc}\n')
    (work / "scripts" / "gpu-run.sh").chmod(0o755)
    (mount / "xla-cache" / "l4").mkdir(parents=True)
    (mount / "xla-cache" / "l4" / "old-entry").write_text("old")
    proc = subprocess.run(["bash", "-c", run], cwd=work, capture_output=True, text=True, timeout=60)
    out = mount / "cmp" / "l4"
    assert proc.returncode == task_rc, proc.stderr
    assert (out / "exit-code").read_text().strip() == str(gpu_rc)
    assert (mount / "xla-cache" / "l4" / "new-entry").read_text() == "new\n"  # saved for the next fleet
    assert (out / "args").read_text().split()[1:] == ["--budget-s", "1800", "--checkpoint", "builtin:default",
                                                      "--inputs", "41,521", "--repeats", "2", "--quant", "none",
                                                      "--quant", "ple4,int8_lm_head"]  # fmt: skip
    assert f"gpu-run exit code {gpu_rc}" in proc.stdout
