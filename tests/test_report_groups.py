"""Comparison groups and selection: runs are compared only within groups of equal identity keys (the report says
which key splits two groups; published runs are their own group), and `bench report` selects runs by key, date and
latest-per, with one clear line and exit 2 for a bad selection."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import bench_captured
from runfolders import REFERENCE_RUNS, make_measured_run

from bench.errors import InputError
from bench.report import build_report
from bench.report.groups import Selection, group_key, parse_latest_per, parse_since, parse_where
from bench.report.rows import run_keys
from bench.report.tables import load_runs

T4G, L4 = REFERENCE_RUNS



def _day(d: str) -> dict:
    return {"date": d, "started_at": f"{d}T12:00:00+00:00"}


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for ref in REFERENCE_RUNS:
        shutil.copytree(ref, root / ref.name)
    make_measured_run(root, "old", gauge=18.0, build_id="aaaaaaaaaaaa", **_day("2026-11-01"))
    make_measured_run(root, "new", gauge=20.0, build_id="bbbbbbbbbbbb", **_day("2026-11-20"))
    make_measured_run(root, "l4", gauge=60.0, device_kind="NVIDIA L4", slug="l4", dtype="bfloat16",
                      **_day("2026-11-21"))  # fmt: skip
    make_measured_run(root, "l4b", gauge=62.0, device_kind="NVIDIA L4", slug="l4", dtype="bfloat16",
                      **_day("2026-11-22"))  # fmt: skip
    make_measured_run(root, "h200", gauge=90.0, device_kind="NVIDIA H200", slug="h200", dtype="bfloat16",
                      **_day("2026-11-22"))  # fmt: skip
    make_measured_run(root, "other", gauge=30.0, content_hash="sha256:beef", checkpoint_id="e4b",
                      **_day("2026-11-23"))  # fmt: skip
    return root


def test_groups_split_by_identity_keys_and_say_which(runs: Path, tmp_path: Path) -> None:
    views, _ = load_runs(None, runs)
    keys = {v.name: run_keys(v) for v in views}
    assert group_key(keys[T4G.name]) == group_key(keys[L4.name])  # the published pair: one group
    assert group_key(keys["2026-11-01-old-cpu"]) == group_key(keys["2026-11-20-new-cpu"])  # another build: same group
    report = build_report([], tmp_path / "out", runs_dir=runs)
    md = report.markdown.read_text()
    assert "## G1: published: google/gemma-4-E2B-it (dense reference)" in md
    # float32 CPU, bfloat16 GPUs and the other checkpoint are three groups, each split from its nearest by its key
    splits = [line for line in md.splitlines() if " is split from " in line]
    assert len(splits) == 3
    assert any(line.endswith(("by dtypes: float32/float32/float32 vs bfloat16/bfloat16/bfloat16.",
                              "by dtypes: bfloat16/bfloat16/bfloat16 vs float32/float32/float32.")) for line in splits)
    assert any(line.endswith("by checkpoint: sha256:feed vs sha256:beef.") for line in splits)
    assert "by provenance: published vs measured" in md
    g1 = md.split("## G1: ")[1].split("## G2: ")[0]
    assert all(name not in g1 for name in ("-l4-l4", "h200", "-other-", "-new-cpu"))  # never on the published axes
    text = "\n".join(report.findings)
    assert "no speedup is computed, they ran different models" not in text  # other models are never compared


def test_selection_where_since_and_latest_per(runs: Path, tmp_path: Path) -> None:
    def names(selection: Selection) -> list[str]:
        return sorted(build_report([], tmp_path / "o", runs_dir=runs, selection=selection).runs)

    assert names(Selection(where={"device": "l4"})) == sorted([L4.name, "2026-11-21-l4-l4", "2026-11-22-l4b-l4"])
    assert names(Selection(where={"device": "l4", "provenance": "measured"}, latest_per=("device",))) == [
        "2026-11-22-l4b-l4"]  # fmt: skip
    assert names(Selection(since="2026-11-21")) == sorted(["2026-11-21-l4-l4", "2026-11-22-l4b-l4",
                                                           "2026-11-22-h200-h200", "2026-11-23-other-cpu"])  # fmt: skip
    default = names(Selection(latest_per=("device",)))  # the default view: latest per device and configuration
    assert default == sorted([T4G.name, L4.name, "2026-11-20-new-cpu", "2026-11-22-l4b-l4", "2026-11-22-h200-h200",
                              "2026-11-23-other-cpu"])  # fmt: skip
    assert names(Selection(where={"checkpoint": "sha256:be"})) == ["2026-11-23-other-cpu"]  # a hash prefix


def test_the_history_view_uses_the_runs_the_latest_per_view_leaves_out(runs: Path, tmp_path: Path) -> None:
    report = build_report([], tmp_path / "o", runs_dir=runs, selection=Selection(latest_per=("device",)))
    md = report.markdown.read_text()
    assert "history: CPU, batch 1, concurrency 1" in md
    history = md.split("history: CPU, batch 1, concurrency 1")[1].split("\n\n")[1].splitlines()
    assert [line.split(" | ")[0] for line in history[2:]] == ["| 2026-11-01", "| 2026-11-20"]
    assert "(" in history[2] and "–" in history[2]  # each point's spread
    assert "History of CPU, batch 1, concurrency 1: 2 runs; the latest (2026-11-20, build bbbbbbbbbbbb)" in md
    assert (tmp_path / "o" / "history_G2.png").exists() or (tmp_path / "o" / "history_G3.png").exists()
    assert history[0].startswith("| date | build | host | 41 gauge |") and " | Test CPU | " in history[2]
    (finding,) = [f for f in report.findings if f.startswith("History of CPU")]
    assert "hosts" not in finding  # one host: nothing to say


def test_the_history_names_each_runs_host_and_a_finding_says_when_they_differ(runs: Path, tmp_path: Path) -> None:
    newer = runs / "2026-11-20-new-cpu" / "manifest.json"
    m = json.loads(newer.read_text())
    newer.write_text(json.dumps({**m, "host": {**m["host"], "description": "AMD EPYC (4 vCPU)"}}))
    report = build_report([], tmp_path / "o", runs_dir=runs, selection=Selection(latest_per=("device",)))
    md = report.markdown.read_text()
    history = md.split("history: CPU, batch 1, concurrency 1")[1].split("\n\n")[1].splitlines()
    assert [line.split(" | ")[2] for line in history[2:]] == ["Test CPU", "AMD EPYC (4 vCPU)"]
    (finding,) = [f for f in report.findings if f.startswith("History of CPU")]
    assert finding.endswith(" Its runs were measured on 2 hosts (Test CPU; AMD EPYC (4 vCPU)); the latest two on "
                            "different hosts (Test CPU, then AMD EPYC (4 vCPU)): their change is not the build's "
                            "alone.")  # fmt: skip


def test_a_named_baseline_is_the_baseline_of_its_group(runs: Path, tmp_path: Path) -> None:
    report = build_report([], tmp_path / "o", baseline="2026-11-22-h200-h200", runs_dir=runs)
    assert report.baseline == "2026-11-22-h200-h200"
    text = "\n".join(report.findings)
    assert "Speedup of L4 2026-11-22-l4b-l4 over H200" in text or "over H200: decode gauge" in text


@pytest.mark.parametrize(("call", "message"), [
    (lambda: parse_where("device"), "--where 'device': expected KEY=VALUE terms"),
    (lambda: parse_where("colour=red"), "--where key 'colour': expected one of device, host"),
    (lambda: parse_latest_per("device,size"), "--latest-per key 'size': expected one of"),
    (lambda: parse_since("last week"), "--since 'last week': expected a date YYYY-MM-DD"),
])  # fmt: skip
def test_bad_selections_are_input_errors(call, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        call()


@pytest.mark.parametrize(("flags", "needle"), [
    (["--where", "device=h100"], "error: no run matches where device=h100"),
    (["--where", "size=3"], "error: --where key 'size'"),
    (["--since", "2026-13-01"], "error: --since '2026-13-01'"),
    (["--all", "--latest-per", "device"], "error: --all and --latest-per"),
    (["--where", "device=l4,device=t4g"], "error: --where 'device=l4,device=t4g': key 'device' given twice"),
    (["--where", ","], "error: --where ',': an empty term"),
    (["--where", ""], "error: --where '': an empty term"),
    (["--latest-per", ""], "error: --latest-per '': an empty key"),
    (["--latest-per", "device,"], "error: --latest-per 'device,': an empty key"),
    (["--latest-per", "device,DEVICE"], "error: --latest-per 'device,DEVICE': key 'device' given twice"),
])  # fmt: skip
def test_cli_bad_selection_is_one_line_exit_2(runs: Path, tmp_path: Path, capsys, flags, needle: str) -> None:
    code, _, err = bench_captured(["report", "--runs-dir", str(runs), "--out", str(tmp_path / "o"), *flags], capsys)
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(needle), err


def test_cli_default_view_and_all(runs: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = bench_captured(["report", "--runs-dir", str(runs), "--out", str(tmp_path / "d")], capsys)
    assert code == 0 and "from 6 run(s)" in out
    code, out, _ = bench_captured(["report", "--all", "--runs-dir", str(runs), "--out", str(tmp_path / "a")], capsys)
    assert code == 0 and "from 8 run(s)" in out


def test_a_remote_target_run_is_its_own_group_split_by_method(tmp_path: Path) -> None:
    import json

    local = make_measured_run(tmp_path, "local", gauge=20.0, **_day("2026-11-20"))
    remote = make_measured_run(tmp_path, "remote", gauge=10.0, **_day("2026-11-21"))
    m = json.loads((remote.path / "manifest.json").read_text())
    m["target"] = {"url": "http://127.0.0.1:8000", "model": "gemma4", "kind": "bench-serve"}
    (remote.path / "manifest.json").write_text(json.dumps(m))
    views, _ = load_runs(None, tmp_path)
    keys = {v.name: run_keys(v) for v in views}
    assert (keys[local.name].method, keys[remote.name].method) == ("in-process", "remote target")
    assert group_key(keys[local.name]) != group_key(keys[remote.name])
    report = build_report([], tmp_path / "out", runs_dir=tmp_path)
    md = report.markdown.read_text()
    assert "by method: in-process vs remote target." in md or "by method: remote target vs in-process." in md
    assert "| group | runs | method | devices |" in md  # the groups table names the method
    assert not any("Speedup of" in f for f in report.findings)  # never compared with each other


def test_the_method_is_read_from_the_typed_manifest() -> None:
    from bench.report.rows import method_of
    from bench.runs.manifest import Manifest, Provenance

    assert method_of(Manifest(command="sweep")) == "in-process"
    assert method_of(Manifest(command="sweep --target")) == "remote target"  # what bench/sweep/remote.py records
    assert method_of(Manifest(extra={"target": {"url": "http://x"}})) == "remote target"  # a version-1 manifest
    assert method_of(Manifest(provenance=Provenance(kind="published"))) == "as published"


def test_a_profile_only_run_made_after_a_sweep_does_not_hide_the_sweep(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_measured_run(runs, "sweep", inputs=(41,), gauge=31.5, started_at="2026-12-02T08:00:00+00:00")
    profiled = make_measured_run(runs, "profile-only", inputs=(), started_at="2026-12-02T09:00:00+00:00",
                                 config={"buckets": [64, 512, 2048, 4096], "max_length": 4160, "max_new_tokens": 8})  # fmt: skip
    profiled.write_json("profile.json", {  # the shape `bench profile` writes, as in test_report.py
        "schema_version": 1, "steps": 20, "categories": {"matmul_fp32": {"pct": 100.0, "ms": 200.0}},
        "totals": {"device_ms": 200.0, "steps": 20, "ms_per_step": 10.0, "tok_s": 100.0, "distinct_ops": 42}})  # fmt: skip
    md = build_report([], tmp_path / "o", runs_dir=runs).markdown.read_text()
    table = md.split("device by device")[1].split("\n\n")[1]
    assert "31.5" in table, table


def _archived(names: list[str], tmp_path: Path) -> tuple[Path, dict]:
    """Copies of the archived run folders `names` (runs/ of this repository, without traces) under tmp_path/runs,
    and their run keys by name."""
    archive = Path(__file__).resolve().parents[1] / "runs"
    root = tmp_path / "runs"
    for name in names:
        shutil.copytree(archive / name, root / name, ignore=shutil.ignore_patterns("profile"))
    return root, {v.name: run_keys(v) for v in load_runs(None, runs_dir=root)[0]}


TPU_BATCH_RUNS = ["2026-12-05-gpurun-e2b-120939-tpuv5e", "2026-12-05-tpu-e2b-profile-b8-tpuv5e",
                  "2026-12-05-tpu-e2b-profile-b32-tpuv5e", "2026-12-05-tpu-e2b-profile-b128-tpuv5e"]  # fmt: skip


def test_the_default_view_keeps_one_profile_per_batch(tmp_path: Path) -> None:
    # the archived TPU v5e runs: a --batch sweep (with its B = 1 profile) and `bench profile --batch B` runs
    root, keys = _archived(TPU_BATCH_RUNS, tmp_path)
    assert [keys[n].profile_batch for n in TPU_BATCH_RUNS] == [None, 8, 32, 128]
    report = build_report(None, tmp_path / "out", runs_dir=root, selection=Selection(latest_per=("device",)))
    assert sorted(report.runs) == sorted(TPU_BATCH_RUNS)  # the latest profile (B = 8) hides neither 32 nor 128
    md = report.markdown.read_text()
    (header,) = [line for line in md.splitlines() if line.startswith("| category | B = 1 ")]
    assert [f"B = {b} " in header for b in (8, 32, 128)] == [True, True, True]
    assert "| tensor core | 0.5% | 68.4% | 68.6% | 64.3% |" in md.splitlines()  # the MXU share per batch


CPU_PROFILE_RUNS = ["2026-12-02-batch-41-profile-b1-cpu", "2026-12-02-batch-41-profile-b4-cpu",
                    "2026-12-02-roofline-split-cpu"]  # fmt: skip


def test_a_profile_only_run_at_one_row_is_its_own_configuration(tmp_path: Path) -> None:
    # archived: `bench profile` at B = 1 and B = 4, then a sweep of the same group 9 hours later
    root, keys = _archived(CPU_PROFILE_RUNS, tmp_path)
    assert len({group_key(keys[n]) for n in CPU_PROFILE_RUNS}) == 1
    assert [keys[n].profile_batch for n in CPU_PROFILE_RUNS] == [1, 4, None]  # a profile-only run's rows, even 1
    report = build_report(None, tmp_path / "out", runs_dir=root, selection=Selection(latest_per=("device",)))
    assert sorted(report.runs) == sorted(CPU_PROFILE_RUNS)  # the later sweep hides neither profile


def test_the_runs_tables_show_the_rows_each_run_decoded_per_step(tmp_path: Path) -> None:
    # the engine records batch 1 for a --batch sweep and for `bench profile --batch B` alike; the tables must not
    root, keys = _archived(TPU_BATCH_RUNS + CPU_PROFILE_RUNS, tmp_path)
    assert [keys[n].batch for n in TPU_BATCH_RUNS] == [1, 1, 1, 1]
    assert [keys[n].rows_per_step for n in TPU_BATCH_RUNS] == [(1, 8, 32, 128), (8,), (32,), (128,)]
    assert [keys[n].rows_per_step for n in CPU_PROFILE_RUNS] == [(1,), (4,), (1,)]
    md = build_report(None, tmp_path / "out", runs_dir=root, selection=Selection()).markdown.read_text()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in md.splitlines() if line.startswith("| ")]
    runs_rows = {c[7]: c[4] for c in cells if len(c) == 8 and c[7] in keys}  # device, date, build, backend, batch, ..., run
    assert runs_rows["2026-12-05-tpu-e2b-profile-b32-tpuv5e"] == "32"
    assert runs_rows["2026-12-05-gpurun-e2b-120939-tpuv5e"] == "1, 8, 32, 128"
    assert runs_rows["2026-12-02-batch-41-profile-b4-cpu"] == "4"
