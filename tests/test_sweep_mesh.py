"""`bench sweep --mesh tp=2` end to end through the CLI, in processes of their own with two forced host devices
(XLA_FLAGS=--xla_force_host_platform_device_count=2: jax reads it when it starts, so never in this process): its
greedy tokens equal one device's, and the run folder records the mesh, each device's bytes and collectives and the
per-device roofline (docs/method.md, "Several devices"). A mesh this machine or the model cannot take is one line
and exit 2 before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SUITE_XLA_CACHE, host_devices_env, run_cli

TWO_DEVICES = host_devices_env(2)
SWEEP = ["sweep", "--checkpoint", "builtin:tiny", "--inputs", "16", "--max-new-tokens", "4", "--repeats", "1",
         "--decode-loop", "host", "--dtype", "float32",
         "--compile-cache", str(SUITE_XLA_CACHE) if SUITE_XLA_CACHE else "off"]  # fmt: skip


def _samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One sweep of builtin:tiny on one device and one over tp=2, each in a fresh process with two host devices."""
    root = tmp_path_factory.mktemp("mesh-runs")
    out = {}
    for name, extra in (("one", []), ("tp2", ["--mesh", "tp=2"])):
        proc = run_cli([*SWEEP, *extra, "--runs-dir", str(root), "--name", name], env=TWO_DEVICES, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        (out[name],) = [p for p in root.iterdir() if p.name.endswith(f"-{name}-cpu")]
    return out


@pytest.mark.slow
def test_a_sweep_over_two_devices_gives_one_devices_tokens(runs) -> None:
    one, two = _samples(runs["one"]), _samples(runs["tp2"])
    assert [s["token_ids"] for s in one] == [s["token_ids"] for s in two]
    assert all(len(s["token_ids"]) == 4 for s in two)


@pytest.mark.slow
def test_the_run_folder_records_the_mesh_and_each_devices_bytes(runs) -> None:
    one = json.loads((runs["one"] / "manifest.json").read_text())
    two = json.loads((runs["tp2"] / "manifest.json").read_text())
    assert one["engine_options"]["mesh"] is None and "mesh" not in one  # one device: nothing new
    assert two["engine_options"]["mesh"] == "tp=2" and two["build_id"] != one["build_id"]
    assert two["decode_bytes"] == one["decode_bytes"]  # the whole model's bytes, as on one device
    mesh = two["mesh"]
    assert (mesh["mesh"], mesh["devices"]) == ("tp=2", 2)
    steps = mesh["steps"]["16"]
    assert sorted(s["device"] for s in steps) == [0, 1]
    whole = one["decode_bytes"]["16"]
    for s in steps:  # each device reads a share of the model: less than all of it, more than half (replicas)
        assert whole["weights"] / 2 <= s["weight_bytes"] < whole["weights"]
        assert s["total"] == s["weight_bytes"] + s["kv_bytes"]
        assert s["collectives"].get("all-reduce", 0) >= 1 and s["collective_bytes"]["all-reduce"] > 0
    assert mesh["roofline_bytes"]["16"] == max(s["total"] for s in steps)
    # the roofline is per device: the slowest device's bytes, where one device's run divides the whole model's
    cell_two = json.loads((runs["tp2"] / "cells.jsonl").read_text().splitlines()[0])
    cell_one = json.loads((runs["one"] / "cells.jsonl").read_text().splitlines()[0])
    assert cell_two["bytes_per_step"] == mesh["roofline_bytes"]["16"]
    assert cell_one["bytes_per_step"] == whole["total"]


@pytest.mark.slow
def test_the_report_and_compare_show_the_mesh(runs) -> None:
    proc = run_cli(["compare", str(runs["one"]), str(runs["tp2"])], env=TWO_DEVICES)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "tp=2" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_generate_takes_the_mesh_and_gives_one_devices_tokens() -> None:
    args = ["generate", "--checkpoint", "builtin:tiny", "--prompt", "Two devices", "--max-new-tokens", "6", "--json",
            "--dtype", "float32", "--compile-cache", str(SUITE_XLA_CACHE) if SUITE_XLA_CACHE else "off"]  # fmt: skip
    ids = []
    for extra in ([], ["--mesh", "tp=2"]):
        proc = run_cli([*args, *extra], env=TWO_DEVICES, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ids.append(json.loads(proc.stdout.strip().splitlines()[-1])["generated_ids"])
    assert ids[0] == ids[1] and len(ids[0]) >= 1


TINY = ["-c", "builtin:tiny"]


@pytest.mark.parametrize("devices, args, needles", [
    (2, [*SWEEP, "--mesh", "tp=4"], ["--mesh tp=4", "needs 4 devices", "jax sees 2 cpu device(s)",
                                     "XLA_FLAGS=--xla_force_host_platform_device_count=4"]),
    (4, [*SWEEP, "--mesh", "tp=3"], ["--mesh tp=3", "3 does not divide", "query heads (4)", "expected tp in 1, 2, 4"]),
    (2, [*SWEEP, "--mesh", "ep=2"], ["--mesh ep=2", "no experts"]),
    (2, [*SWEEP, "--mesh", "tp=two"], ["--mesh tp=two", "tp=N or ep=N"]),
    (2, ["sweep", "--target", "http://127.0.0.1:9/v1", "--inputs", "20", "--mesh", "tp=2"], ["--mesh tp=2", "--target"]),
    (1, ["profile", *TINY, "--mesh", "tp=2"], ["--mesh tp=2", "needs 2 devices", "jax sees 1 cpu device(s)"]),
    (1, ["generate", "-p", "hi", *TINY, "--mesh", "tp=2"], ["--mesh tp=2", "needs 2 devices"]),
    (1, ["serve", *TINY, "--port", "1", "--mesh", "tp=2"], ["--mesh tp=2", "needs 2 devices"]),
])  # fmt: skip
def test_a_mesh_this_machine_or_model_cannot_take_is_one_line_before_anything_loads(devices, args, needles,
                                                                                    tmp_path) -> None:  # fmt: skip
    env = host_devices_env(devices)
    runs = ["--runs-dir", str(tmp_path)] if args[0] in ("sweep", "profile") else []
    proc = run_cli([*args, *runs], env=env, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert all(n in lines[0] for n in needles), lines[0]
    assert "loaded" not in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # no run folder


def test_the_batch_memory_of_a_mesh_is_per_device_and_says_so() -> None:
    from bench.runs.devices import fit_line
    from model.accounting import BatchMemory

    own = BatchMemory(batch=8, cache_len=100, weight_bytes=10_000, kv_bytes_per_row=1_000, capacity=50_000,
                      where="of cpu memory (bytes_limit)", mesh="tp=2")  # fmt: skip
    assert (own.needed, own.largest_batch, own.fits) == (18_000, 35, True)  # each device its own memory
    shared = BatchMemory(batch=16, cache_len=100, weight_bytes=10_000, kv_bytes_per_row=1_000, capacity=50_000,
                         where="of host memory", mesh="tp=2", sharing=2)  # fmt: skip
    assert shared.needed == 2 * (10_000 + 16_000) and shared.largest_batch == 12  # 45,000 // 2 - 10,000 = 12,500
    line = shared.refusal()
    for needle in ("batch 16 does not fit on each device of tp=2", "of KV cache per device", "of weights per device",
                   "= 0.000 GB per device, x 2 devices sharing it", "at most 12 rows fit"):  # fmt: skip
        assert needle in line, (needle, line)
    assert "per device of tp=2, x 2 devices sharing it" in fit_line(shared)
    one = BatchMemory(batch=16, cache_len=100, weight_bytes=10_000, kv_bytes_per_row=1_000, capacity=50_000,
                      where="of host memory")  # fmt: skip
    assert "device" not in one.refusal() and "device" not in fit_line(one)  # one device: the line as it was


def test_the_sweeps_fit_before_loading_is_per_device_under_a_mesh() -> None:
    from bench.sweep.fit import sweep_memory
    from model.config import DEFAULT
    from model.placement import Mesh, device_share
    from model.quantspec import parse_quant

    kw = dict(weight_itemsize=4, kv_itemsize=4, scale_itemsize=2, quant=parse_quant(None), capacity=10**12,
              where="of host memory")  # fmt: skip
    one, _ = sweep_memory(DEFAULT, [(41, 4)], 16, **kw)
    two, _ = sweep_memory(DEFAULT, [(41, 4)], 16, mesh=Mesh(axis="tp", size=2), **kw)
    share = device_share(DEFAULT, Mesh(axis="tp", size=2), itemsize=4, context=two.cache_len, kv_itemsize=4)
    assert (two.weight_bytes, two.kv_bytes_per_row, two.sharing, two.mesh) == (share.weight_bytes,
                                                                              share.kv_bytes_per_row, 2, "tp=2")
    assert one.weight_bytes / 2 <= two.weight_bytes < one.weight_bytes and two.kv_bytes_per_row <= one.kv_bytes_per_row


@pytest.mark.slow
def test_a_profile_joined_to_a_mesh_run_takes_its_mesh_and_divides_per_device(runs) -> None:
    proc = run_cli(["profile", "--run", str(runs["tp2"]), "--steps", "2", "--input-tokens", "16", "--checkpoint",
                    "builtin:tiny", "--dtype", "float32", "--compile-cache",
                    str(SUITE_XLA_CACHE) if SUITE_XLA_CACHE else "off"], env=TWO_DEVICES, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((runs["tp2"] / "profile.json").read_text())
    mesh = json.loads((runs["tp2"] / "manifest.json").read_text())["mesh"]
    assert data["config"]["mesh"] == "tp=2"  # no --mesh given: the run's
    assert data["roofline"]["bytes_per_step"] == mesh["roofline_bytes"]["16"]  # the slowest device's bytes
