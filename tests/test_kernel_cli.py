"""`--kernel w4a16=pallas|xla` on the commands that load an engine, the policy line, the manifest's record of the
kernel, `bench profile`'s w4a16_kernel category, and gpu-run's kernel on/off runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import assert_one_line_error, bench_captured, run_cli_here


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--quant", "w4", "--kernel", "w4a16=pallas"], ["--kernel w4a16=pallas: cannot run here", "CPU"]),
        (["--quant", "w4", "--kernel", "w4a16=triton"], ["--kernel w4a16=triton", "expected w4a16=pallas"]),
        (["--quant", "w8", "--kernel", "w4a16=xla"], ["--kernel w4a16=xla", "--quant w8 has none"]),
    ],
)
def test_a_kernel_that_cannot_run_is_one_line_exit_2(args, needles, tiny_checkpoint) -> None:
    proc = run_cli_here(["generate", "-p", "hi", "-n", "1", "--checkpoint", str(tiny_checkpoint), *args],
                        timeout=300)  # fmt: skip
    assert_one_line_error(proc, *needles)


def test_policy_line_and_manifest_record_the_w4_product(tiny_checkpoint, caplog) -> None:
    """On CPU: XLA's product, and why, on the policy line; the manifest's engine config records w4a16=xla (in the
    build id), a dense configuration none; `--kernel w4a16=xla` is the same payload as the CPU default."""
    import logging

    from bench.cli.common import engine_manifest, open_engine
    from bench.runs.manifest import Workload
    from model.engine_config import EngineConfig

    spec = str(tiny_checkpoint)
    with caplog.at_level(logging.INFO, logger="model.engine"):
        engine, report, _, cache = open_engine(spec, EngineConfig.from_options(dtype="float32", quant="w4:32"), "off")
    assert "w4a16_kernel=xla (CPU: Pallas would only interpret the kernel there" in caplog.text
    assert "w4a16 kernel: xla (CPU" in caplog.text
    m = engine_manifest("sweep", engine, report, spec, cache, Workload())
    cpu = engine.cpu_kernel  # the default backend, pure JAX: no CPU kernel after the w4 product
    assert cpu is None and engine.backend == "jax"
    w4 = f"w4a16=xla {cpu}" if cpu else "w4a16=xla"
    assert (m.engine.kernel, m.engine.kernel_tiles) == (w4, None)
    assert m.to_dict()["engine_config"]["kernel"] == w4 and m.dtype_policy["w4a16_kernel"] == "xla"
    assert m.engine.dense().kernel == cpu
    forced, report2, _, _ = open_engine(spec, EngineConfig.from_options(dtype="float32", quant="w4:32", kernel="w4a16=xla"), "off")
    assert engine_manifest("sweep", forced, report2, spec, cache, Workload()).build_id == m.build_id
    dense, report3, _, _ = open_engine(spec, EngineConfig.from_options(dtype="float32"), "off")
    assert engine_manifest("sweep", dense, report3, spec, cache, Workload()).engine.kernel == cpu


def test_kernel_tiles_enter_the_build_id() -> None:
    from bench.runs.manifest import EngineConfig, payload_build_id

    a = EngineConfig(quantization="w4:128", kernel="w4a16=pallas", kernel_tiles={"o_DX K=2048 N=1536": "bm16 bn256"})
    b = EngineConfig(quantization="w4:128", kernel="w4a16=pallas", kernel_tiles={"o_DX K=2048 N=1536": "bm16 bn128"})
    c = EngineConfig(quantization="w4:128", kernel="w4a16=xla")
    assert len({payload_build_id(x, "h") for x in (a, b, c)}) == 3
    assert a.dense() == c.dense() and a.dense().kernel_tiles is None


def test_the_kernel_is_its_own_profile_category() -> None:
    from bench.profile.analysis import CATEGORIES
    from bench.profile.classify import classify_hlo, classify_name
    from bench.profile.xspace import HloComputation, HloInstruction, HloModule

    assert "w4a16_kernel" in CATEGORIES
    assert classify_name("w4a16_pallas_kernel", "gpu") == ("w4a16_kernel", "")
    assert classify_name("w4a16_pallas_kernel_0d1d2d3d", "gpu")[0] == "w4a16_kernel"  # a Triton-mangled name
    assert classify_name("gemm_fusion_dot_42", "gpu")[0] != "w4a16_kernel"
    call = HloInstruction(name="custom-call.3", opcode="custom-call", dtype="f32", operand_dtypes=("bf16", "u8"),
                          op_name="jit(step)/decode_step/w4a16_pallas_kernel/pallas_call", fusion_kind="",
                          custom_call_target="__gpu$xla.gpu.triton", called=(), users=())  # fmt: skip
    module = HloModule(name="m", computations={"main": HloComputation("main", (call,), call.name)},
                       instructions={call.name: call})  # fmt: skip
    assert classify_hlo(call, module, "some_kernel_name", "gpu") == ("w4a16_kernel", "")
    loop = HloInstruction(name="while.1", opcode="while", dtype="f32", operand_dtypes=(),
                          op_name="jit(step)/w4a16_pallas_kernel/while", fusion_kind="", custom_call_target="",
                          called=(), users=())  # fmt: skip
    assert classify_hlo(loop, module, "while.1", "cpu") == ("w4a16_kernel", "")  # interpret mode on CPU


def test_gpu_run_runs_each_w4_set_with_the_kernel_on_and_off() -> None:
    from bench.gpurun.main import Options, quant_tag
    from bench.gpurun.steps import engine_argv
    from model.engine_config import EngineConfig

    o = Options(outdir=Path("x"), quant=("none", "w4"), kernel=("w4a16=pallas", "w4a16=xla"))
    assert o.quant_sets == (("none", None), ("w4", "w4a16=pallas"), ("w4", "w4a16=xla"))
    assert Options(outdir=Path("x")).quant_sets == ((None, None),)
    assert quant_tag("pilot", "w4", "w4a16=pallas") == "pilot-w4-128-pallas" and quant_tag("pilot", None) == "pilot"
    assert engine_argv(EngineConfig.from_options(quant="w4", kernel="w4a16=xla", mesh="tp=2")) == [
        "--quant", "w4:128", "--kernel", "w4a16=xla", "--mesh", "tp=2"]  # fmt: skip
    assert engine_argv(None) == [] and [e.to_args() for e in o.engines] == [
        ["--quant", "none"], ["--quant", "w4:128", "--kernel", "w4a16=pallas"],
        ["--quant", "w4:128", "--kernel", "w4a16=xla"]]  # fmt: skip


def test_gpu_run_refuses_a_bad_kernel(tmp_path, capsys) -> None:
    code, _, err = bench_captured(["gpu-run", str(tmp_path / "o"), "--kernel", "w4a16=cuda"], capsys)
    assert code == 2 and "--kernel w4a16=cuda" in err and "Traceback" not in err


def test_gpu_run_refuses_a_malformed_mesh_before_any_step() -> None:
    from bench.errors import InputError
    from bench.gpurun.main import Options, check_options

    with pytest.raises(InputError, match=r"^--mesh tp=0: expected tp=N or ep=N"):
        check_options(Options(outdir=Path("x"), mesh="tp=0"))
    check_options(Options(outdir=Path("x"), mesh="tp=2"))  # the devices are each step's question
