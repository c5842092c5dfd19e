"""The backend registry (model/backends): pure JAX by default on every platform, another backend only when the
engine configuration names it, one line where it cannot run, and which engine ran recorded in the policy line, the
manifest and the build id (a manifest from before reads as written). Needs no C++ compiler: the kernels' own tests
are tests/test_cpu_kernels.py and tests/test_cpu_attention.py."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from model import backends
from model.errors import EngineError
from model.policy import decide_policy, with_backend

ROOT = Path(__file__).resolve().parent.parent


def test_the_default_is_pure_jax_and_only_named_backends_are_taken() -> None:
    policy = decide_policy("float32")
    assert policy.backend == backends.DEFAULT_BACKEND == "jax" and policy.line().endswith(" backend=jax")
    assert with_backend(policy, None).backend == "jax"
    assert with_backend(policy, "cpu-kernels").line().endswith(" backend=cpu-kernels")
    with pytest.raises(EngineError, match="^backend 'xla': expected one of jax, cpu-kernels"):
        with_backend(policy, "xla")
    assert backends.active() == "jax"  # outside any program's trace
    with backends.using("cpu-kernels"):
        assert backends.active() == "cpu-kernels"
    assert backends.active() == "jax"


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_the_cpu_kernels_asked_for_off_cpu_are_one_line(platform: str) -> None:
    backends.check_runs("jax", platform)  # the default runs everywhere
    with pytest.raises(EngineError) as raised:
        backends.check_runs("cpu-kernels", platform)
    assert str(raised.value) == (f"--backend cpu-kernels: the engine's CPU kernels run on the CPU platform only, and "
                                 f"this device is {platform}; drop --backend (the default, jax, runs "
                                 "everywhere)")  # fmt: skip


def test_the_pure_jax_plan_runs_nothing_but_xla() -> None:
    for platform in ("cpu", "gpu", "tpu"):
        plan = backends.plan_backend("jax", platform, weight_dtype="float32", activation_dtype="float32",
                                     kv_dtype="float32")  # fmt: skip
        assert plan == backends.BackendPlan() and plan.kernel is None and plan.xla_options is None
    assert backends.decode_attention(None, None, None, None) is None  # the default: the core's two products
    assert backends.batch_copy("cpu") and not backends.batch_copy("tpu")


def test_the_kernel_source_ships_with_the_package() -> None:
    """pyproject's package-data names the C++ source where the loader looks for it (`SOURCE`), in a package."""
    from model.backends.cpu.kernels import SOURCE

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = ".".join(SOURCE.parent.relative_to(ROOT).parts)
    assert package in data and any(SOURCE.match(glob) for glob in data[package])
    assert SOURCE.is_file() and (SOURCE.parent / "__init__.py").is_file()


def test_the_manifest_records_the_backend_and_an_old_manifest_reads_as_written() -> None:
    from bench.runs.manifest import EngineConfig, engine_config_of, payload_build_id, policy_facts

    old = EngineConfig(buckets=(64,), kernel="bf16=cpu attention=cpu")  # before the backend was recorded
    assert old.backend is None and "backend" not in old.to_dict()
    new = EngineConfig(buckets=(64,), backend="jax")
    assert new.to_dict()["backend"] == "jax" and payload_build_id(new, "h") != payload_build_id(old, "h")
    assert payload_build_id(new, "h") != payload_build_id(EngineConfig(buckets=(64,), backend="cpu-kernels"), "h")
    engine = SimpleNamespace(buckets=(64,), max_length=64, policy=decide_policy("float32"), quant=None, kernel=None,
                             cpu_kernel=None, backend="jax")  # fmt: skip
    assert engine_config_of(engine).backend == "jax" and engine_config_of(engine).dense().backend == "jax"
    assert policy_facts(decide_policy("float32"))["backend"] == "jax"


def test_a_resumed_sweep_takes_the_runs_backend_and_refuses_another() -> None:
    from bench.errors import InputError
    from bench.runs import CheckpointFacts, EngineConfig, Manifest
    from bench.sweep.resume import SweepFlags, resume_options
    from model.engine_config import EngineConfig as Options

    def resumed(ran, backend):  # the backend a resumed sweep runs (bench/sweep/resume.py)
        m = Manifest(engine=EngineConfig(backend=ran), checkpoint=CheckpointFacts(id="c", source="builtin:tiny"))
        run = SimpleNamespace(path=Path("runs/x"), typed_manifest=m)
        return resume_options(run, SweepFlags(), Options.from_options(backend=backend))[1].backend

    assert resumed("cpu-kernels", None) == "cpu-kernels"
    assert resumed("jax", "jax") == "jax"
    with pytest.raises(InputError, match="^--backend jax differs from the resumed run's cpu-kernels; drop the flag"):
        resumed("cpu-kernels", "jax")
    assert resumed(None, None) is None  # a run from before: the default (its build id says the rest)


def test_a_profile_joined_to_a_run_of_another_backend_says_it_differs() -> None:
    from bench.profile.command import run_mismatches as _run_mismatches
    from bench.runs import EngineConfig

    def run(backend):
        manifest = SimpleNamespace(checkpoint=SimpleNamespace(content_hash=None, id="x"), dtype_policy={},
                                   engine=EngineConfig(quantization="none", backend=backend))  # fmt: skip
        return SimpleNamespace(typed_manifest=manifest)

    engine = SimpleNamespace(policy=decide_policy("float32"), quant=SimpleNamespace(canonical="none"), kernel=None,
                             cpu_kernel=None, backend="jax")  # fmt: skip
    setup = SimpleNamespace(engine=engine, content_hash=None, ckpt="x")
    assert _run_mismatches(run("cpu-kernels"), setup) == ["backend cpu-kernels (run) vs jax (profile)"]
    assert _run_mismatches(run("jax"), setup) == [] and _run_mismatches(run(None), setup) == []


def test_a_bad_backend_is_one_line_and_exit_2_before_anything_loads(tmp_path, capsys) -> None:
    from conftest import bench_captured

    for args in (["generate", "-p", "hi", "-c", "builtin:tiny"], ["profile", "-c", "builtin:tiny", "--runs-dir",
                                                                   str(tmp_path / "runs")]):  # fmt: skip
        code, _, err = bench_captured([*args, "--backend", "pallas"], capsys)
        assert code == 2 and err.strip() == ("error: --backend pallas: expected one of jax, cpu-kernels (default jax, "
                                             "the pure-JAX engine)")  # fmt: skip
    assert not (tmp_path / "runs").exists()
