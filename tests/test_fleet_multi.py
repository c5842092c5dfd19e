"""bench fleet with several devices per task (issue 46 part 5): accelerator counts, node counts and TPU slices; the
mesh each task passes to its benchmark and its check against the task's presets at plan time; multi-host tasks
(SkyPilot's num_nodes, a TPU slice of several hosts) whose run command starts jax.distributed from SkyPilot's
variables (`bench.fleet.distributed`), tested with fake variables, a stand-in interpreter, and one and two real jax
processes on this CPU. The YAMLs against SkyPilot's own schema where it is installed (the fleet venv). Nothing here
launches anything: that needs cloud credentials."""

from __future__ import annotations

import copy
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from conftest import bench_captured

from bench.errors import InputError
from bench.fleet import FleetOptions, build_plan, load_yaml, parse_accelerators, read_plan, write_plan
from bench.fleet import distributed as dist
from bench.fleet.accelerators import Request, parse_request
from bench.fleet.plan import GPU_RUN_PRESETS, bench_lines, sweep_args

REPO = Path(__file__).resolve().parents[1]
ENV = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.4\n10.0.0.5\n", "SKYPILOT_NUM_NODES": "2"}


def options(**kw) -> FleetOptions:
    base = dict(name="mesh", accelerators=("H100:8",), bucket="s3://bench-bucket", checkpoint="random:e2b",
                inputs="41", repeats=2)  # fmt: skip
    return FleetOptions(**{**base, **kw})


def plan_configs(**kw) -> dict:
    return build_plan(options(**kw), REPO)[1]


def refused(**kw) -> str:
    with pytest.raises(InputError) as err:
        build_plan(options(**kw), REPO)
    assert "\n" not in str(err.value)
    return str(err.value)


# ---- counts, nodes, TPU slices ------------------------------------------------------------------------------------
def test_requests_count_devices_and_hosts():
    assert parse_request("l4") == Request(name="L4")
    assert parse_request("H100:8") == Request(name="H100", count=8, devices=8)
    assert parse_request("h100:8x2") == Request(name="H100", count=8, nodes=2, devices=16, hosts=2)
    v5e8, v5e16 = parse_request("tpu-v5e-8"), parse_request("tpu-v5litepod-16")
    assert (v5e8.name, v5e8.devices, v5e8.hosts, v5e8.accelerators) == ("tpu-v5litepod-8", 8, 1, "tpu-v5litepod-8:1")
    assert (v5e16.devices, v5e16.hosts, v5e16.nodes, v5e16.multi_host) == (16, 4, 1, True)
    assert v5e16.tpu_runtime == "v2-alpha-tpuv5-lite" and parse_request("tpu-v6e-8").tpu_runtime == "v2-alpha-tpuv6e"
    assert parse_request("tpu-v6e-4").devices == 4 and not parse_request("tpu-v6e-4").multi_host
    assert [parse_request(t).slug for t in ("L4", "L4:2", "H100:8x2", "tpu-v5e-4")] == [
        "l4", "l4-x2", "h100-x8-n2", "tpu-v5litepod-4"]  # fmt: skip
    assert parse_accelerators("H100:8,tpu-v5e-8,h100:8x2") == ("H100:8", "tpu-v5litepod-8", "H100:8x2")


@pytest.mark.parametrize("text,needle", [
    ("T4g:4", "at most 2 T4g"), ("H100:16", "at most 8 H100"), ("H100:0", "at least 1"), ("H100:8x0", "at least 1"),
    ("H100:8x65", "at most 64"), ("tpu-v5e-12", "not 12"), ("tpu-v5e-8:2", "drop ':N'"), ("tpu-v3-8", "known"),
    ("H100:x2", "NAME[:COUNT[xNODES]]"), ("tpu-v5e-8,tpu-v5litepod-8", "given twice"),
])  # fmt: skip
def test_bad_requests_are_one_line(text, needle):
    with pytest.raises(InputError, match=needle.replace("[", r"\[").replace("]", r"\]")) as err:
        parse_accelerators(text)
    assert "\n" not in str(err.value)


# ---- the mesh each task passes ------------------------------------------------------------------------------------
def test_each_one_host_task_passes_its_mesh_to_gpu_run(tmp_path):
    configs = plan_configs(accelerators=("L4", "L4:2", "H100:8", "tpu-v5e-4"))
    assert sorted(configs) == ["h100-x8.yaml", "l4-x2.yaml", "l4.yaml", "tpu-v5litepod-4.yaml"]
    for name, accel, mesh in (("l4.yaml", "L4:1", None), ("l4-x2.yaml", "L4:2", "tp=2"),
                              ("h100-x8.yaml", "H100:8", "tp=8"), ("tpu-v5litepod-4.yaml", "tpu-v5litepod-4:1", "tp=4")):  # fmt: skip
        y = configs[name]
        assert y["resources"]["accelerators"] == accel and "num_nodes" not in y
        (line,) = [ln for ln in y["run"].splitlines() if "scripts/gpu-run.sh" in ln]
        words = shlex.split(line)
        assert words[words.index("--checkpoint") + 1] == "random:e2b"
        assert (words[words.index("--mesh") + 1] if "--mesh" in words else None) == mesh
    assert "'jax[tpu]'" in configs["tpu-v5litepod-4.yaml"]["setup"] and "cuda13" in configs["h100-x8.yaml"]["setup"]
    assert configs["tpu-v5litepod-4.yaml"]["resources"]["accelerator_args"] == {"runtime_version": "v2-alpha-tpuv5-lite"}
    assert "accelerator_args" not in configs["h100-x8.yaml"]["resources"]
    plan, _ = build_plan(options(accelerators=("L4", "H100:8")), REPO)
    assert [(t.devices, t.hosts, t.mesh) for t in plan.tasks] == [(1, 1, None), (8, 1, "tp=8")]
    write_plan(plan, plan_configs(accelerators=("L4", "H100:8")), tmp_path / "mesh")
    assert read_plan(tmp_path / "mesh").tasks[1].mesh == "tp=8"  # fleet.json keeps it


def test_a_mesh_the_model_cannot_use_is_refused_with_the_numbers():
    msg = refused(accelerators=("L4", "A100:16"), checkpoint="builtin:e2b")
    assert "A100:16" in msg and "--mesh tp=16" in msg and "query heads (8)" in msg and "tp in 1, 2, 4, 8" in msg
    assert "preset default" in refused(accelerators=("A100:16",), checkpoint=None)  # gpu-run's pilot + E2B plan
    assert "no experts" in refused(accelerators=("H100:8",), mesh_axis="ep")
    assert "--mesh-axis" in refused(mesh_axis="pp")
    configs = plan_configs(accelerators=("H100:8",), checkpoint="random:26b-a4b@3", mesh_axis="ep")
    assert "--mesh ep=8" in configs["h100-x8.yaml"]["run"]
    # a hub checkpoint's config is on the machine: the engine checks the mesh there
    assert "--mesh tp=16" in plan_configs(accelerators=("A100:16",), checkpoint="google/gemma-4-E2B-it")[
        "a100-x16.yaml"]["run"]  # fmt: skip


def test_gpu_run_plan_presets_are_gpu_runs():
    from bench.gpurun.main import BIG, PILOT

    assert GPU_RUN_PRESETS == (PILOT, BIG)


def _subcommand_params(name: str, args: list[str]) -> dict | None:
    """The click params `bench NAME ARGS` parses to, None when NAME has no --mesh yet (another branch adds it)."""
    from bench.cli import _register, app

    _register(["fleet"])
    group = typer.main.get_command(app)
    ctx = group.make_context("bench", [name, *args])
    cmd = group.get_command(ctx, name)
    if not any("--mesh" in p.opts for p in cmd.params):
        return None
    return cmd.make_context(name, args, parent=ctx).params


def test_the_mesh_lines_parse_with_the_commands_own_parsers(tmp_path):
    """gpu-run's line of a one-host task and the sweep line of a multi-host one, parsed by `bench gpu-run` and
    `bench sweep`'s own click commands; skipped until those commands take --mesh (another branch adds it)."""
    configs = plan_configs(accelerators=("H100:8", "H100:8x2"), checkpoint="random:31b")
    gpu = shlex.split(next(ln for ln in configs["h100-x8.yaml"]["run"].splitlines() if "gpu-run.sh" in ln))
    sweep = shlex.split(next(ln for ln in configs["h100-x8-n2.yaml"]["run"].splitlines() if ln.startswith("run_sweep ")))
    gpu_params = _subcommand_params("gpu-run", [str(tmp_path) if w == "$out" else w for w in gpu[2:]])
    sweep_params = _subcommand_params("sweep", [w.replace("$out", str(tmp_path)) for w in sweep[1:]])
    if gpu_params is None or sweep_params is None:
        pytest.skip("bench gpu-run / bench sweep take no --mesh yet (the mesh CLI branch adds it)")
    assert gpu_params["mesh"] == "tp=8" and sweep_params["mesh"] == "tp=16"
    from bench.gpurun.main import Options, check_options

    check_options(Options(**{**gpu_params, "quant": tuple(gpu_params["quant"] or ())}))  # gpu-run's own checks


# ---- several hosts ------------------------------------------------------------------------------------------------
def test_a_multi_node_gpu_task_sets_num_nodes_and_runs_its_sweeps_through_jax_distributed():
    opts = options(accelerators=("H100:8x2",), checkpoint="random:31b", quant=("none", "w4"), batch="1,8")
    y = build_plan(opts, REPO)[1]["h100-x8-n2.yaml"]
    assert y["num_nodes"] == 2 and y["resources"]["accelerators"] == "H100:8"
    run = y["run"]
    assert "python -m bench.fleet.distributed --devices 16 -- sweep" in run
    lines = [ln for ln in run.splitlines() if ln.startswith("run_sweep ")]
    assert lines == list(bench_lines(opts, parse_request("H100:8x2"))) and len(lines) == 2  # one sweep per --quant
    words = shlex.split(lines[1])
    assert words[1:] == list(sweep_args(opts, parse_request("H100:8x2"), "w4"))
    assert words[words.index("--mesh") + 1] == "tp=16" and words[-2:] == ["--quant", "w4"]
    assert "--runs-dir" in words and words[words.index("--batch") + 1] == "1,8"


def test_a_multi_host_tpu_slice_is_one_node_whose_hosts_each_run_the_sweep(tmp_path):
    plan, configs = build_plan(options(accelerators=("tpu-v5e-16",), checkpoint="random:31b", infra="gcp"), REPO)
    y = configs["tpu-v5litepod-16.yaml"]
    assert "num_nodes" not in y and y["resources"]["accelerators"] == "tpu-v5litepod-16:1"
    assert "--devices 16 -- sweep" in y["run"] and "--mesh tp=16" in y["run"]
    assert (plan.tasks[0].devices, plan.tasks[0].hosts) == (16, 4) and plan.tasks[0].command.startswith(
        ".venv/bin/python -m bench.fleet.distributed --devices 16 -- sweep --checkpoint random:31b --mesh tp=16")


@pytest.mark.parametrize("kw,needle", [
    (dict(accelerators=("H100:8x2",), checkpoint=None), "expected --checkpoint"),
    (dict(accelerators=("tpu-v5e-16",), steps=4), "--steps 4"),
    (dict(accelerators=("tpu-v5e-8",), infra="aws"), "sold on GCP"),
    (dict(accelerators=("H100:8x2",), checkpoint="random:e2b"), "query heads (8)"),
])  # fmt: skip
def test_what_a_multi_host_or_tpu_task_cannot_run_is_refused(kw, needle):
    assert needle in refused(**kw)


def _fake_workdir(tmp_path: Path) -> Path:
    """A workdir whose .venv/bin/python records each call (its arguments and SKYPILOT_NODE_RANK) in calls.txt and
    exits FAKE_RC (one code per call, comma-separated), sleeping FAKE_SLEEP seconds first."""
    work = tmp_path / "work"
    (work / ".venv" / "bin").mkdir(parents=True)
    fake = work / ".venv" / "bin" / "python"
    fake.write_text('#!/usr/bin/env bash\nn=$(wc -l < calls.txt 2>/dev/null || echo 0)\necho "$*" >> calls.txt\n'
                    'sleep "${FAKE_SLEEP:-0}"\nIFS=, read -ra codes <<< "$FAKE_RC"\nexit "${codes[$n]:-0}"\n')  # fmt: skip
    fake.chmod(0o755)
    return work


@pytest.mark.parametrize("rank,codes,task_rc,written", [("0", "0,0", 0, "0"), ("1", "0,3", 0, "3"),
                                                       ("0", "1,0", 1, "1"), ("0", "124,0", 0, "3")])  # fmt: skip
def test_the_multi_host_run_script_runs_each_sweep_and_keeps_the_first_failure(tmp_path, rank, codes, task_rc, written):
    """The task's `run` executed by bash with SkyPilot's variables for one node: rank 0 writes into OUT, rank R into
    OUT/node-R; each --quant set is one distributed sweep; a sweep the budget stopped (124) counts 3."""
    mount = tmp_path / "mount"
    y = plan_configs(accelerators=("H100:8x2",), checkpoint="random:31b", quant=("none", "w4"))["h100-x8-n2.yaml"]
    work = _fake_workdir(tmp_path)
    env = {**os.environ, **ENV, "SKYPILOT_NODE_RANK": rank, "FAKE_RC": codes}
    proc = subprocess.run(["bash", "-c", y["run"].replace("/g4b-fleet", str(mount))], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == task_rc, proc.stderr
    out = mount / "mesh" / "h100-x8-n2" / ("" if rank == "0" else f"node-{rank}")
    assert (out / "exit-code").read_text().strip() == written
    calls = (work / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and all(c.startswith("-m bench.fleet.distributed --devices 16 -- sweep ") for c in calls)
    assert f"--runs-dir {out / 'runs'}".replace("//", "/").rstrip("/") in calls[0].replace("//", "/")


def test_the_budget_bounds_every_sweep(tmp_path):
    """With a 1 s budget the first sweep (sleeping 3 s) is stopped by timeout and the second is skipped: both
    count 3 and the task still ends 0 (its folders are valid)."""
    y = plan_configs(accelerators=("H100:8x2",), checkpoint="random:31b", quant=("none", "w4"), budget_s=1,
                     bucket=None, spot=False)["h100-x8-n2.yaml"]  # fmt: skip
    work = _fake_workdir(tmp_path)
    env = {**os.environ, **ENV, "SKYPILOT_NODE_RANK": "0", "FAKE_RC": "0,0", "FAKE_SLEEP": "3"}
    proc = subprocess.run(["bash", "-c", y["run"]], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (work / "fleet-out" / "mesh" / "h100-x8-n2" / "exit-code").read_text().strip() == "3"
    assert len((work / "calls.txt").read_text().splitlines()) == 1 and "budget spent; skipped" in proc.stdout


# ---- bench.fleet.distributed ----------------------------------------------------------------------------------------
def test_the_cluster_is_read_from_skypilot_variables():
    c = dist.read_cluster(ENV)
    assert (c.rank, c.ips, c.processes, c.coordinator(8482)) == (1, ("10.0.0.4", "10.0.0.5"), 2, "10.0.0.4:8482")
    assert dist.read_cluster({**ENV, "SKYPILOT_NODE_IPS": "fd00::1\nfd00::2"}).coordinator(9) == "[fd00::1]:9"


@pytest.mark.parametrize("edit,needle", [
    (dict(SKYPILOT_NODE_RANK=""), "SKYPILOT_NODE_RANK not set"),
    (dict(SKYPILOT_NODE_IPS=" "), "SKYPILOT_NODE_IPS not set"),
    (dict(SKYPILOT_NODE_RANK="one"), "whole number"),
    (dict(SKYPILOT_NUM_NODES="3"), "lists 2 address(es)"),
    (dict(SKYPILOT_NODE_RANK="2"), "rank from 0 to 1"),
    (dict(SKYPILOT_NODE_IPS="10.0.0.4 10.0.0.5\n10.0.0.6"), "one address a line"),
])  # fmt: skip
def test_missing_or_inconsistent_variables_are_one_line(edit, needle):
    with pytest.raises(InputError) as err:
        dist.read_cluster({**ENV, **edit})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_main_initializes_then_hands_over_and_refuses_a_device_count_it_does_not_see(capsys):
    calls = []
    init = lambda addr, n, pid: calls.append(("init", addr, n, pid)) or 16  # noqa: E731
    over = lambda cmd: calls.append(("bench", cmd))  # noqa: E731
    argv = ["--devices", "16", "--port", "9000", "--", "sweep", "--mesh", "tp=16"]
    assert dist.main(argv, ENV, initialize=init, hand_over=over) == 0
    assert calls == [("init", "10.0.0.4:9000", 2, 1), ("bench", ["sweep", "--mesh", "tp=16"])]
    calls.clear()
    assert dist.main(["--devices", "8", "--", "sweep"], ENV, initialize=init, hand_over=over) == 2
    assert calls == [("init", "10.0.0.4:8482", 2, 1)] and "jax sees 16 device(s)" in capsys.readouterr().err
    calls.clear()
    for argv in (["sweep"], ["--devices", "0", "--", "sweep"], ["--cores", "2", "--", "x"], ["--port", "70000", "--", "x"],
                 ["--"]):  # fmt: skip
        assert dist.main(argv, ENV, initialize=init, hand_over=over) == 2 and not calls
        assert capsys.readouterr().err.count("\n") == 1

    def broken(addr, n, pid):
        raise RuntimeError("jax.distributed.initialize(10.0.0.4:8482, 2 processes, process 1) failed: timeout")

    assert dist.main(["--", "sweep"], ENV, initialize=broken, hand_over=over) == 1 and not calls
    assert capsys.readouterr().err.startswith("error: jax.distributed.initialize(")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, ips: str, port: int, *args: str) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": ips,
           "SKYPILOT_NUM_NODES": str(len(ips.split()))}  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "bench.fleet.distributed", "--port", str(port), *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_without_the_variables_the_entry_says_so_in_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYPILOT_")}
    proc = subprocess.run([sys.executable, "-m", "bench.fleet.distributed", "--", "runs", "list"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "SKYPILOT_NODE_RANK" in proc.stderr


@pytest.mark.slow
def test_two_processes_on_this_cpu_join_and_run_bench():
    """Two real jax processes (ranks 0 and 1, both at 127.0.0.1) join through jax.distributed: each sees the two
    CPU devices in all (--devices 2 holds) and then runs `bench runs --help` in-process."""
    port, ips = _free_port(), "127.0.0.1\n127.0.0.1"
    procs = [_entry(rank, ips, port, "--devices", "2", "--", "runs", "--help") for rank in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err
        assert f"process {rank} of 2" in out and "2 device(s) in all" in out and "Usage: bench runs" in out


def test_one_process_decides_alone_and_runs_no_collective():
    """bench/sweep/processes.py in one process (no jax.distributed): each decision is the process's own and the
    stop predicate is the one given, so a one-process sweep is unchanged."""
    from bench.sweep import processes

    stop = lambda: False  # noqa: E731
    assert processes.process_count() == 1 and processes.agreed_stop(stop) is stop
    assert [processes.first_process(d) for d in (True, False)] == [True, False]
    assert [processes.any_process(d) for d in (True, False)] == [True, False]


def _samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_sweep_over_two_processes_runs_to_the_end_with_one_devices_tokens(tmp_path):
    """`sweep --mesh tp=2` across two real jax processes (one CPU device each, gloo collectives), each writing its
    own run folder as a multi-host task's ranks do: both exit 0; rank 0's folder is valid and records the mesh and
    both processes' devices (bytes, collectives, which process holds each); every request's greedy tokens equal a
    one-process, one-device run's."""
    from bench.runs.schema import validate_run

    sweep = ["sweep", "--checkpoint", "random:tiny", "--inputs", "41", "--max-new-tokens", "8", "--repeats", "1"]
    port, ips = _free_port(), "127.0.0.1\n127.0.0.1"
    procs = [_entry(rank, ips, port, "--devices", "2", "--", *sweep, "--mesh", "tp=2", "--runs-dir",
                    str(tmp_path / f"rank{rank}")) for rank in (0, 1)]  # fmt: skip
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-4000:]
    one = subprocess.run([sys.executable, "-m", "bench", *sweep, "--runs-dir", str(tmp_path / "one")], cwd=REPO,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert one.returncode == 0, one.stderr[-4000:]
    (run0,), (run1,), (single,) = (list((tmp_path / d).iterdir()) for d in ("rank0", "rank1", "one"))
    assert validate_run(run0) == [] and validate_run(run1) == []
    manifest = json.loads((run0 / "manifest.json").read_text())
    mesh = manifest["mesh"]
    assert (mesh["mesh"], mesh["devices"], mesh["processes"]) == ("tp=2", 2, 2)
    steps = mesh["steps"]["41"]
    assert sorted(s["process"] for s in steps) == [0, 1] and len({s["device"] for s in steps}) == 2
    whole = json.loads((single / "manifest.json").read_text())["decode_bytes"]["41"]["weights"]
    for s in steps:  # each device reads its share (more than half: replicated leaves), and its collectives
        assert whole / 2 <= s["weight_bytes"] < whole and s["kv_bytes"] > 0
        assert s["collective_bytes"].get("all-reduce", 0) > 0
    assert json.loads((run1 / "manifest.json").read_text())["mesh"] == mesh  # rank 1 records the same devices
    cell = json.loads((run0 / "cells.jsonl").read_text().splitlines()[0])
    assert cell["valid"] and cell["bytes_per_step"] == mesh["roofline_bytes"]["41"]
    reference = [s["token_ids"] for s in _samples(single)]
    assert len(reference) >= 3 and all(len(t) == 8 for t in reference)
    assert [s["token_ids"] for s in _samples(run0)] == reference == [s["token_ids"] for s in _samples(run1)]


# ---- SkyPilot's own schema (the fleet venv) -------------------------------------------------------------------------
def test_count_node_and_tpu_tasks_are_valid_for_skypilot():
    sky = pytest.importorskip("sky")
    from bench.fleet import validate_task

    configs = plan_configs(accelerators=("L4:2", "H100:8x2", "tpu-v5e-8", "tpu-v5e-16"), checkpoint="random:31b",
                           infra="gcp")  # fmt: skip
    want = {"l4-x2.yaml": ({"L4": 2}, 1), "h100-x8-n2.yaml": ({"H100": 8}, 2),
            "tpu-v5litepod-8.yaml": ({"tpu-v5litepod-8": 1}, 1), "tpu-v5litepod-16.yaml": ({"tpu-v5litepod-16": 1}, 1)}  # fmt: skip
    for name, config in configs.items():
        validate_task(config, name)
        task = sky.Task.from_yaml_config(copy.deepcopy(config))
        (res,) = task.resources
        assert (res.accelerators, task.num_nodes) == want[name]
        if name.startswith("tpu-"):  # our runtime, not SkyPilot's v5p default
            assert res.accelerator_args["runtime_version"] == "v2-alpha-tpuv5-lite"


def test_plan_command_prints_devices_meshes_and_hosts(tmp_path, capsys):
    pytest.importorskip("sky")
    out = tmp_path / "fleet" / "mesh"
    code, stdout, err = bench_captured(["fleet", "plan", "--accelerators", "L4,H100:8,tpu-v5e-16", "--checkpoint",
                                        "random:31b", "--out", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    assert "L4 x1 (" in stdout and "H100:8 x8, --mesh tp=8" in stdout
    assert "tpu-v5litepod-16 x16 on 4 hosts, --mesh tp=16 (Cloud TPU on GCP)" in stdout
    assert "-m bench.fleet.distributed --devices 16 -- sweep" in stdout and "(on every host)" in stdout
    assert "tested with two jax processes on one CPU, not yet on real hosts" in stdout
    code, _, err = bench_captured(["fleet", "plan", "--accelerators", "A100:16", "--checkpoint", "builtin:e2b",
                                   "--out", str(tmp_path / "fleet" / "bad")], capsys)  # fmt: skip
    assert code == 2 and "query heads (8)" in err and err.strip().count("\n") == 0
