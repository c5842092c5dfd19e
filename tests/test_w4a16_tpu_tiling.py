"""The TPU kernel's tiling policies (issue 43, part 2; `model.kernels.fit_tpu.TILING_POLICIES`): "fewest" and
"steps" (the default: at least MIN_STEPS grid steps of blocks of at least MIN_BLOCK_BYTES, along N first), chosen
per engine with `--kernel w4a16=pallas:POLICY` and printed by `bench kernels fit --tiling-policy`. On CPU: each E2B
projection's tiling under both policies equals dequantize-then-matmul in interpret mode (the tiling's K loop whole,
N cut to at most two blocks) and lowers for the TPU with jax.export; the option parses, records and refuses as the
other kernel options do."""

from __future__ import annotations

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli_here

from model.config import PRESETS
from model.engine_config import EngineConfig
from model.errors import KernelError, OptionError
from model.kernels import fit, fit_tpu
from model.kernels.choice import decide_mode, plan_kernel
from model.kernels.fit_tpu import TpuTiling
from model.kernels.tpu_layout import to_tpu
from model.kernels.w4a16_tpu import KERNEL_NAME, w4a16_tpu_matmul
from model.quant import dequantize, quantize_channels
from model.quantspec import parse_quant

LIMIT = fit_tpu.budget(fit_tpu.vmem_capacity("v5e"))
E2B = fit.projections(PRESETS["e2b"], 128)


def _chosen() -> list[tuple[str, str, int, int, TpuTiling]]:
    """(policy, field, K, N, tiling) of every E2B projection under each policy, each (K, N, tiling) once."""
    out, seen = [], set()
    for policy in fit_tpu.TILING_POLICIES:
        for f in fit_tpu.plan_tpu(E2B, LIMIT, policy=policy):  # the grid's tiling: mlp and resident aside
            key = (f.projection.k, f.projection.n, dataclasses.replace(f.tiling, mlp=0, resident=False))
            if key not in seen:
                seen.add(key)
                out.append((policy, f.projection.field, *key))
    return out


CHOSEN = _chosen()


def test_the_steps_policy_splits_the_one_step_products_along_n() -> None:
    fewest = {(f.projection.k, f.projection.n): f.tiling for f in fit_tpu.plan_tpu(E2B, LIMIT, policy="fewest")}
    steps = {(f.projection.k, f.projection.n): f.tiling for f in fit_tpu.plan_tpu(E2B, LIMIT, policy="steps")}
    assert steps == {(f.projection.k, f.projection.n): f.tiling for f in fit_tpu.plan_tpu(E2B, LIMIT)}
    assert fit_tpu.DEFAULT_POLICY == "steps"  # measured faster end to end on the v5e (fit.DEFAULT_POLICY)
    assert fewest[(1536, 2560)] == TpuTiling(bm=128, bn=2560, bk=1536)  # one grid step
    assert steps[(1536, 2560)] == TpuTiling(bm=128, bn=640, bk=1536)  # four, along N, 480 KiB blocks
    assert steps[(2048, 1536)] == TpuTiling(bm=128, bn=384, bk=2048)  # four of exactly 384 KiB
    assert steps[(6144, 1536)] == TpuTiling(bm=128, bn=768, bk=2048)  # 3 K steps x 2 N blocks
    assert steps[(1536, 12288)] == fewest[(1536, 12288)]  # six steps already
    for kn in ((1536, 256), (256, 1536)):  # the PLE projections: 192 KiB in all, no 4 blocks of 384 KiB
        assert steps[kn] == fewest[kn] and fit_tpu.grid_steps(*kn, steps[kn]) == 1
    for (k, n), t in steps.items():
        assert fit_tpu.fits_tpu(k, n, 128, t) and fit_tpu.need_tpu(t, group=128).total <= LIMIT
        ok = fit_tpu.grid_steps(k, n, t) >= fit_tpu.MIN_STEPS and t.bk * t.bn // 2 >= fit_tpu.MIN_BLOCK_BYTES
        assert ok or k * n // 2 < fit_tpu.MIN_STEPS * fit_tpu.MIN_BLOCK_BYTES, (k, n, t)
    with pytest.raises(ValueError, match="expected one of fewest, steps"):
        fit_tpu.candidates_tpu(E2B[0], "most")


@pytest.mark.slow
@pytest.mark.parametrize("policy,field,k,n,t", CHOSEN, ids=[f"{c[0]}-{c[1]}-{c[2]}x{c[3]}" for c in CHOSEN])
def test_each_chosen_tiling_equals_dequantize_then_matmul(policy: str, field: str, k: int, n: int,
                                                          t: TpuTiling) -> None:  # fmt: skip
    """Interpret mode at two rows: K whole (every K step of the tiling), N cut to at most two of its blocks."""
    n_small = n if n // t.bn <= 2 else 2 * t.bn
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((k, n_small)).astype(np.float32) / np.sqrt(k)
    q = quantize_channels(w, 4, 0, 128)
    words, scales = to_tpu(q.values, q.scales, tuple(q.shape), 0, 128)
    x = jnp.asarray(rng.standard_normal((2, k)), jnp.float32)
    y = np.asarray(w4a16_tpu_matmul(x, words, scales, k=k, n=n_small, group=128, tiling=t, interpret=True), np.float64)
    w_kn = np.asarray(dequantize(q, jnp.float32), np.float64)
    x64 = np.asarray(x, np.float64)
    assert np.all(np.abs(y - x64 @ w_kn) <= 1e-5 * (np.abs(x64) @ np.abs(w_kn)))


@pytest.mark.parametrize("policy,field,k,n,t", CHOSEN, ids=[f"{c[0]}-{c[1]}-{c[2]}x{c[3]}" for c in CHOSEN])
def test_each_chosen_tiling_lowers_for_the_tpu(policy: str, field: str, k: int, n: int, t: TpuTiling) -> None:
    """The full E2B shape at one row, exported for the TPU (the Pallas TPU lowering and its block rules run here;
    Mosaic's own compile needs a TPU)."""
    f = jax.jit(lambda x, w, s: w4a16_tpu_matmul(x, w, s, k=k, n=n, group=128, tiling=t))
    args = (jax.ShapeDtypeStruct((1, k), jnp.bfloat16), jax.ShapeDtypeStruct((k // 8, n), jnp.int32),
            jax.ShapeDtypeStruct((k // 128, n), jnp.bfloat16))  # fmt: skip
    text = jax.export.export(f, platforms=["tpu"])(*args).mlir_module()
    assert "tpu_custom_call" in text and KERNEL_NAME in text


# ---- the option ------------------------------------------------------------------------------------------------
def test_the_kernel_option_names_a_policy() -> None:
    assert fit.parse_kernel("w4a16=pallas:fewest") == "pallas:fewest"
    assert fit.parse_kernel("w4a16=pallas:steps") == "pallas"  # the default: the same configuration
    assert fit.split_kernel("pallas:steps") == ("pallas", "steps") and fit.split_kernel("xla") == ("xla", None)
    for bad in ("w4a16=xla:steps", "w4a16=pallas:most", "w4a16=pallas:"):
        with pytest.raises(ValueError, match="pallas:POLICY"):
            fit.parse_kernel(bad)
    config = EngineConfig.from_options(quant="w4", kernel="w4a16=pallas:fewest")
    assert config.kernel == "pallas:fewest" and config.to_manifest()["kernel"] == "w4a16=pallas:fewest"
    assert EngineConfig.from_manifest(config.to_manifest()) == config
    assert config.to_args() == ["--quant", "w4:128", "--kernel", "w4a16=pallas:fewest"]
    assert EngineConfig.from_options(quant="w4", kernel="w4a16=pallas:steps") == EngineConfig.from_options(
        quant="w4", kernel="w4a16=pallas")  # fmt: skip
    with pytest.raises(OptionError, match="--kernel w4a16=pallas:most"):
        EngineConfig.from_options(quant="w4", kernel="w4a16=pallas:most")


def test_the_plan_follows_the_policy_and_records_it() -> None:
    device = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
    impl, why = decide_mode("tpu", None, True, "pallas:fewest")
    assert impl == "pallas"

    def plan(policy):
        return plan_kernel(PRESETS["e2b"], parse_quant("w4"), impl=impl, reason=why, act_bytes=2, scale_bytes=2,
                           device=device, forced=True, policy=policy)  # fmt: skip

    steps, fewest, default = plan("steps"), plan("fewest"), plan(None)
    assert fewest.option == "w4a16=pallas:fewest" and steps.option == default.option == "w4a16=pallas"
    assert steps == default  # naming the default is the default (same manifest, same build id)
    assert default.tiles["qkv_DX K=1536 N=2560"] == "tpu bm128 bn640 bk1536" != fewest.tiles["qkv_DX K=1536 N=2560"]
    assert "tiling policy fewest" in fewest.lines()[0] and "tiling policy steps" in default.lines()[0]
    assert any("4 grid steps" in line for line in default.lines())
    with pytest.raises(KernelError, match="tiling policy chooses the TPU kernel's tiling"):
        decide_mode("gpu", "8.0", True, "pallas:steps")
    gpu = plan_kernel(PRESETS["e2b"], parse_quant("w4"), impl="xla", reason="--kernel w4a16=xla", act_bytes=2,
                      scale_bytes=2, policy="steps")  # fmt: skip
    assert gpu.option == "w4a16=xla"
    assert dataclasses.replace(steps, impl="xla").option == "w4a16=xla"


def test_bench_kernels_fit_prints_each_policy() -> None:
    out = {}
    for policy in fit_tpu.TILING_POLICIES:
        proc = run_cli_here(["kernels", "fit", "--device-capability", "tpu", "--tiling-policy", policy, "--json"],
                            timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        out[policy] = json.loads(proc.stdout)
    rows = {p: {(r["k"], r["n"]): r for r in out[p]["rows"]} for p in out}
    assert rows["fewest"][(1536, 2560)]["grid_steps"] == 1 and rows["steps"][(1536, 2560)]["grid_steps"] == 4
    assert rows["steps"][(1536, 2560)]["block_bytes"] == 1536 * 640 // 2
    assert out["steps"]["policy"] == "steps" and "policy steps" in out["steps"]["tiling"]
    assert rows["fused"][(1536, 12288)]["tiling"].endswith(" mlp2048")  # as the engine plans it (plan_tpu)
    assert rows["resident"][(1536, 2560)]["tiling"].endswith(" resident")
    assert not rows["resident"][(1536, 12288)]["tiling"].endswith(" resident")


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--device-capability", "tpu", "--tiling-policy", "most"], ["--tiling-policy most", "fewest, steps"]),
        (["--device-capability", "8.0", "--tiling-policy", "steps"], ["--tiling-policy steps", "not a TPU"]),
    ],
)
def test_bench_kernels_fit_bad_policy_is_one_line_exit_2(args, needles) -> None:
    assert_one_line_error(run_cli_here(["kernels", "fit", *args], timeout=120), *needles)


# ---- the next TPU session's recipe (scripts/tpu-quant-archive.sh), checked here without a device ------------------
def _archive(*args: str, tmp_path):
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(repo / "scripts" / "tpu-quant-archive.sh"), *args, "--runs",
                           str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)  # fmt: skip


def test_the_archive_script_parses_and_its_dry_run_lists_the_calls(tmp_path) -> None:
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "tpu-quant-archive.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    proc = _archive("w4", "policy", "tiling", "--loops", "host", "--budget-s", "570", "--dry-run", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweeps = [line for line in proc.stdout.splitlines() if line.startswith("+ timeout") and "bench sweep" in line]
    assert len(sweeps) == 5 and "--quant w4 --inputs 41 --decode-loop host" in sweeps[0]
    assert "--kernel" not in sweeps[0] and "--no-step-logits" not in sweeps[0]  # w4 alone keeps its accuracy record
    kernels = [line.split("--kernel ")[1].split()[0] for line in sweeps[1:]]
    assert kernels == ["w4a16=pallas:fewest", "w4a16=pallas:steps"] * 2  # alternating, twice
    assert all("--no-step-logits" in line and "--decode-loop host" in line for line in sweeps[1:])
    assert any("scripts/probes/w4_tiling_tpu.py --budget-s 200" in line for line in proc.stdout.splitlines())
    assert "dry run: nothing packed" in proc.stdout
    for text in kernels:  # each kernel value the script passes is one bench accepts
        assert EngineConfig.from_options(quant="w4", kernel=text).kernel in ("pallas", "pallas:fewest")


def test_the_archive_family_step_runs_26b_a4b_with_a_set_that_fits_the_v5e(tmp_path) -> None:
    """Step `family`: 26B-A4B on dummy weights at 41 tokens, host loop, with a --quant set the sweep's fit check takes
    on the v5e (weights as a TPU places them), then E4B none and w8."""
    from bench.runs.devices import device_named
    from bench.sweep.fit import check_sweep_fits
    from model.config import PRESETS

    proc = _archive("family", "--budget-s", "570", "--dry-run", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweeps = [line.split() for line in proc.stdout.splitlines() if line.startswith("+ timeout") and "bench sweep" in line]
    got = [(a[a.index("--checkpoint") + 1], a[a.index("--quant") + 1], a[a.index("--inputs") + 1],
            a[a.index("--decode-loop") + 1], a[a.index("--repeats") + 1]) for a in sweeps]  # fmt: skip
    assert got == [("random:26b-a4b", "w4", "41", "host", "3"), ("random:e4b", "none", "41", "host", "3"),
                   ("random:e4b", "w8", "41", "host", "3")]  # fmt: skip
    v5e = (device_named("tpu-v5e").capacity, "of tpu memory")
    max_new = int(sweeps[0][sweeps[0].index("--max-new-tokens") + 1])
    for ckpt, quant, inputs, _, _ in got:
        cfg = PRESETS[ckpt.removeprefix("random:")]
        assert check_sweep_fits(cfg, [(int(inputs), 1)], max_new, dtype="bfloat16", quant=quant, capacity=v5e,
                                platform="tpu").fits  # fmt: skip


@pytest.mark.parametrize("args,needle", [(["W4!"], "bad step 'W4!'"), (["w4", "--budget-s", "soon"], "--budget-s soon"),
                                         (["w4", "--loops", "both2"], "--loops both2"), (["w4", "--fast"], "--fast"),
                                         ([], "usage")])  # fmt: skip
def test_the_archive_script_refuses_bad_arguments_before_any_work(args, needle, tmp_path) -> None:
    proc = _archive(*args, "--dry-run", tmp_path=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr and not proc.stdout, (proc.stdout, proc.stderr)


@pytest.mark.slow
def test_the_tiling_probe_runs_on_cpu(tmp_path) -> None:
    """scripts/probes/w4_tiling_tpu.py in interpret mode at its small shape: each case checked against
    dequantize-then-matmul and named with the policies that choose it; an unknown shape is one line, exit 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(repo)}
    probe = [sys.executable, str(repo / "scripts" / "probes" / "w4_tiling_tpu.py"), "--out", str(tmp_path)]
    proc = subprocess.run([*probe, "--interpret", "--small", "--resident"], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cases = json.loads((tmp_path / "w4_tiling_tpu_rows1.json").read_text())["cases"]
    assert cases and all(c["rel_err"] < 2**-7 for c in cases)  # bfloat16 activations against float32
    assert sorted(p for c in cases for p in c["policies"]) == sorted(fit_tpu.TILING_POLICIES)
    assert [c["tiling"] for c in cases][0] == "resident" and cases[0]["steps"] == 1  # first: kept if cut short
    bad = subprocess.run([*probe, "--shapes", "qkv,nope"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "nope" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
