"""Profiles on CPU: capture exactly N decode-like steps, see the dtype leak, categories that add up, bad inputs.

The "decode step" here is a jitted chain of matrix-vector products over weights passed as arguments (as an engine
passes its parameters): stored in bfloat16 and computed in float32 it is the published report's "leak one" (the
weights are converted every step); stored in float32 it converts nothing.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.errors import InputError, TraceError
from bench.profile.analysis import (
    CATEGORIES,
    analyze_trace,
    analyze_xspace,
    attach_roofline,
    format_profile_table,
)
from bench.profile.classify import is_tensor_core_kernel
from bench.profile.capture import (
    apply_gpu_profile_flags,
    capture_steps,
    gpu_profile_flags,
    merge_xla_flags,
)

N_STEPS = 5
D = 256  # model width of the toy decode step


def _matvec_chain(x_BD, weights):
    for i, w_DD in enumerate(weights):
        with jax.named_scope("attention" if i == 0 else "mlp"):
            x_BD = jnp.tanh(x_BD @ w_DD.astype(jnp.float32))
    return x_BD


def _capture(tmp_path_factory, weight_dtype, name):
    rng = np.random.default_rng(0)
    weights = [jnp.asarray(rng.standard_normal((D, D), np.float32) / np.sqrt(D)).astype(weight_dtype) for _ in range(4)]
    step = jax.jit(_matvec_chain)
    out = tmp_path_factory.mktemp(name)
    result = capture_steps(lambda x: step(x, weights), jnp.ones((1, D), jnp.float32), N_STEPS, out / "trace")
    return result, analyze_xspace(result.xplane_path.read_bytes(), source=str(result.xplane_path))


@pytest.fixture(scope="module")
def leak(tmp_path_factory):
    """bfloat16 weights, float32 compute: converted every step."""
    return _capture(tmp_path_factory, jnp.bfloat16, "leak")


@pytest.fixture(scope="module")
def matched(tmp_path_factory):
    """float32 weights, float32 compute: nothing to convert."""
    return _capture(tmp_path_factory, jnp.float32, "matched")


def _pct(analysis, name):
    return analysis.categories[name][0]


# ---- what the profile sees -------------------------------------------------------------------------------------
def test_leak_one_shows_dtype_conversion_and_matched_dtypes_show_none(leak, matched):
    assert _pct(leak[1], "dtype_conversion") > 20.0
    assert _pct(matched[1], "dtype_conversion") < 3.0
    # The products themselves run in float32 either way.
    assert _pct(leak[1], "matmul_fp32") > 0.0 and _pct(matched[1], "matmul_fp32") > 0.0
    assert _pct(matched[1], "matmul_16bit") == 0.0


def test_exactly_n_steps_captured_and_found(leak):
    capture, analysis = leak
    assert capture.n_steps == N_STEPS and len(capture.step_wall_ms) == N_STEPS
    assert analysis.steps == N_STEPS and analysis.totals["steps"] == N_STEPS
    # Every op of the step ran once per traced step: the warm-up steps were not counted.
    assert {row.count for row in analysis.ops} == {N_STEPS}
    assert capture.xplane_path.is_file() and capture.xplane_bytes == capture.xplane_path.stat().st_size
    assert capture.profile_options["python_tracer_level"] == 0


def test_categories_sum_to_100_and_tensor_core_is_absent_on_cpu(leak, matched):
    for _, analysis in (leak, matched):
        assert set(analysis.categories) == set(CATEGORIES)
        assert analysis.categories["tensor_core"] == (None, None)
        pcts = [pct for pct, _ in analysis.categories.values() if pct is not None]
        assert sum(pcts) == pytest.approx(100.0, abs=1e-6)
        ms = [m for _, m in analysis.categories.values() if m is not None]
        assert sum(ms) == pytest.approx(analysis.totals["device_ms"], rel=1e-9)
        assert sum(row.total_ms for row in analysis.ops) == pytest.approx(analysis.totals["device_ms"], rel=1e-9)
        assert analysis.totals["hlo_matched_pct"] == pytest.approx(100.0)
        assert analysis.totals["tok_s"] == pytest.approx(1000.0 / analysis.totals["ms_per_step"])
        assert analysis.device["platform"] == "cpu"


def test_named_scope_attention_is_attributed(matched):
    # The first product of the chain runs under jax.named_scope("attention"); XLA:CPU drops a dot's own metadata,
    # so this also checks the fallback to the op consuming it.
    _, analysis = matched
    assert _pct(analysis, "attention") > 0.0
    assert any(row.category == "attention" and row.hlo_op.startswith("dot") for row in analysis.ops)


def test_saved_trace_reread_from_disk_equals_capture_time_analysis(leak, tmp_path):
    capture, at_capture = leak
    run = tmp_path / "2026-11-30-toy-cpu"
    (run / "profile").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    shutil.copy(capture.xplane_path, run / "profile" / capture.xplane_path.name)
    for path in (capture.xplane_path, capture.xplane_path.parent.parent, run):  # file, folder, run folder
        assert analyze_trace(path) == at_capture


def test_profile_json_is_json_and_fits_the_run_folder_schema(leak):
    from bench.runs import profile_problems

    doc = json.loads(json.dumps(leak[1].to_json()))
    assert doc["schema_version"] == 1 and doc["steps"] == N_STEPS
    assert doc["categories"]["tensor_core"] == {"pct": None, "ms": None}
    assert profile_problems(doc) == []
    assert doc["ops"][0]["total_ms"] >= doc["ops"][-1]["total_ms"]


def test_table_in_the_published_shape_with_roofline(leak):
    analysis = attach_roofline(leak[1], bytes_per_step=4 * D * D * 2, bandwidth_bytes_s=20e9, gauge_tok_s=100.0)
    assert analysis.roofline.share_pct == pytest.approx(100.0 * 4 * D * D * 2 * 100.0 / 20e9)
    rows = format_profile_table(analysis)
    assert [label for label, _ in rows] == [
        "dtype conversion", "fp32 gemv", "tensor core", "total kernel time", "distinct kernels",
        "decode gauge (sweep)", "device-time rate", "bandwidth", "roofline share",
    ]  # fmt: skip
    values = dict(rows)
    assert values["tensor core"] == "absent" and values["decode gauge (sweep)"] == "100.0 tok/s"
    # the profile's own rate is named for what it is, beside the sweep's gauge, never called a gauge
    rate = 1000.0 / analysis.totals["ms_per_step"]
    assert values["device-time rate"] == f"{rate:.1f} tok/s (1000 / device ms per step)"
    unjoined = dict(format_profile_table(leak[1]))
    assert "decode gauge (sweep)" not in unjoined and "gauge" not in unjoined["device-time rate"]
    assert rows == format_profile_table(json.loads(json.dumps(analysis.to_json())))
    assert dict(format_profile_table(leak[1]))["roofline share"] == "not measured"


def test_ops_inside_a_scan_are_reported_as_opaque_control_flow(tmp_path):
    weights = jnp.ones((3, D, D), jnp.float32) / D

    @jax.jit
    def step(x_BD, w_LDD):
        return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x_BD, w_LDD)[0]

    capture = capture_steps(lambda x: step(x, weights), jnp.ones((1, D)), 3, tmp_path, warmup=1)
    analysis = analyze_trace(capture.xplane_path)
    assert analysis.steps == 3
    assert analysis.totals["opaque_control_flow_ms"] > 0.0
    assert any("while/call/conditional" in note for note in analysis.notes)


# ---- a GPU-shaped trace (synthetic, names only) ----------------------------------------------------------------
def _gpu_trace_text() -> str:
    kernels = [  # (name, microseconds per step)
        ("loop_convert_fusion", 50),
        ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, "
         "true, false, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>>", 30),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT", 10),
        ("MemcpyD2D", 5),
        ("input_reduce_fusion", 5),
    ]  # fmt: skip
    meta = "".join(f'event_metadata {{ key: {i + 2} value {{ id: {i + 2} name: "{n}" }} }}\n'
                   for i, (n, _) in enumerate(kernels))  # fmt: skip
    events, steps, t = [], [], 0
    for step in range(3):
        steps.append(f"events {{ metadata_id: 1 offset_ps: {t * 1000000} duration_ps: 200000000 "
                     f"stats {{ metadata_id: 1 int64_value: {step} }} }}")  # fmt: skip
        k = t + 10
        for i, (_, us) in enumerate(kernels):
            events.append(f"events {{ metadata_id: {i + 2} offset_ps: {k * 1000000} duration_ps: {us * 1000000} }}")
            k += us + 1
        t += 300
    outside = f"events {{ metadata_id: 2 offset_ps: {t * 1000000} duration_ps: 999000000 }}"
    return (
        'planes { id: 1 name: "/host:CPU" lines { id: 1 name: "python" timestamp_ns: 1000000 ' + " ".join(steps)
        + ' } event_metadata { key: 1 value { id: 1 name: "decode" } } '
        'stat_metadata { key: 1 value { id: 1 name: "step_num" } } }\n'
        'planes { id: 2 name: "/device:GPU:0" '
        'lines { id: 7 name: "Stream #7(Kernel,MemcpyD2D)" timestamp_ns: 1000000 ' + " ".join(events + [outside])
        + ' } lines { id: 8 name: "XLA Ops" timestamp_ns: 1000000 ' + " ".join(events) + " }\n" + meta + "}\n"
    )  # fmt: skip


def test_gpu_shaped_trace_categories_from_kernel_names():
    from jax.profiler import ProfileData

    if not hasattr(ProfileData, "text_proto_to_serialized_xspace"):
        pytest.skip("this jaxlib cannot build an XSpace from text")
    analysis = analyze_xspace(ProfileData.text_proto_to_serialized_xspace(_gpu_trace_text()))
    assert analysis.device["platform"] == "gpu" and analysis.steps == 3
    assert analysis.totals["device_ms"] == pytest.approx(3 * 100e-3)  # the "XLA Ops" copy is not counted twice
    expected = {"dtype_conversion": 50, "matmul_fp32": 30, "tensor_core": 10, "copies_transfers": 5,
                "other_fusions": 5, "attention": 0, "matmul_16bit": 0, "other": 0, "w4a16_kernel": 0,
                "collective": 0}  # fmt: skip
    assert {name: pytest.approx(pct) for name, (pct, _) in analysis.categories.items()} == expected
    assert analysis.totals["distinct_ops"] == 5
    assert any("no HLO" in note for note in analysis.notes)
    values = dict(format_profile_table(analysis))
    assert (values["dtype conversion"], values["fp32 gemv"], values["tensor core"]) == ("50.0%", "30.0%", "10.0%")


# ---- a TPU-shaped trace (synthetic: the core plane's "XLA Modules" and "XLA Ops" lines) ---------------------------
def _tpu_trace_text() -> str:
    ops = [  # (the event name: the HLO instruction's text, as a TPU trace writes it; microseconds per step)
        ("%convert.3 = f32[8]{0:T(256)} convert(bf16[8]{0:T(256)} %param.1)", 40),
        ("%copy.7 = bf16[8,128]{1,0} copy(bf16[8,128]{1,0} %convert_element_type.2)", 20),
        ("%add_fusion.2 = f32[8]{0} fusion(f32[8]{0} %convert.3), kind=kLoop, calls=%fused_computation.2", 10),
        ("%convolution_bitcast_fusion.4 = bf16[8,256]{1,0} fusion(bf16[8,128]{1,0} %copy.7, bf16[128,256]{1,0} "
         "%params_w.1), kind=kOutput, calls=%fused_computation.4", 30),
    ]  # fmt: skip
    meta = "".join(f'event_metadata {{ key: {i + 3} value {{ id: {i + 3} name: "{n}" }} }}\n'
                   for i, (n, _) in enumerate(ops))  # fmt: skip
    steps, modules, op_events, t = [], [], [], 0
    for step in range(3):
        steps.append(f"events {{ metadata_id: 1 offset_ps: {t * 1000000} duration_ps: 200000000 "
                     f"stats {{ metadata_id: 1 int64_value: {step} }} }}")  # fmt: skip
        modules.append(f"events {{ metadata_id: 2 offset_ps: {(t + 5) * 1000000} duration_ps: 150000000 }}")
        k = t + 10
        for i, (_, us) in enumerate(ops):
            op_events.append(f"events {{ metadata_id: {i + 3} offset_ps: {k * 1000000} duration_ps: {us * 1000000} }}")
            k += us + 1
        t += 300
    return (
        'planes { id: 1 name: "/host:CPU" lines { id: 1 name: "python" timestamp_ns: 1000000 ' + " ".join(steps)
        + ' } event_metadata { key: 1 value { id: 1 name: "decode" } } '
        'stat_metadata { key: 1 value { id: 1 name: "step_num" } } }\n'
        'planes { id: 2 name: "/device:TPU:0" '
        'lines { id: 1 name: "XLA Modules" timestamp_ns: 1000000 ' + " ".join(modules)
        + ' } lines { id: 2 name: "XLA Ops" timestamp_ns: 1000000 ' + " ".join(op_events)
        + ' } lines { id: 3 name: "Steps" timestamp_ns: 1000000 ' + " ".join(modules) + " }\n"
        + 'event_metadata { key: 2 value { id: 2 name: "jit__decode_program(42)" } }\n' + meta + "}\n"
        'planes { id: 3 name: "/device:TPU:0 SparseCore 0" lines { id: 2 name: "XLA Ops" timestamp_ns: 1000000 '
        + " ".join(op_events) + " }\n" + meta + "}\n"
    )  # fmt: skip


def test_tpu_shaped_trace_reads_the_core_planes_xla_ops_line():
    from jax.profiler import ProfileData

    if not hasattr(ProfileData, "text_proto_to_serialized_xspace"):
        pytest.skip("this jaxlib cannot build an XSpace from text")
    analysis = analyze_xspace(ProfileData.text_proto_to_serialized_xspace(_tpu_trace_text()))
    assert analysis.device["platform"] == "tpu" and analysis.device["planes"] == ["/device:TPU:0"]
    assert analysis.steps == 3
    # only the core plane's "XLA Ops" line counts: not its "XLA Modules"/"Steps" lines, not the SparseCore plane
    assert analysis.totals["device_ms"] == pytest.approx(3 * 100e-3)
    # an event's name is its instruction's HLO text: the op is named by the instruction name alone
    assert {(r.name, r.hlo_op, r.hlo_module) for r in analysis.ops} == {
        ("convert.3", "convert.3", "jit__decode_program"), ("copy.7", "copy.7", "jit__decode_program"),
        ("add_fusion.2", "add_fusion.2", "jit__decode_program"),
        ("convolution_bitcast_fusion.4", "convolution_bitcast_fusion.4", "jit__decode_program")}  # fmt: skip
    # the operands' names (convert_element_type.2, convert.3) no longer make a fusion a dtype conversion
    assert analysis.categories["dtype_conversion"][0] == pytest.approx(100 * 40 / 100)
    assert analysis.categories["copies_transfers"][0] == pytest.approx(100 * 20 / 100)
    assert analysis.categories["other_fusions"][0] == pytest.approx(100 * 10 / 100)
    assert analysis.categories["tensor_core"][0] == pytest.approx(100 * 30 / 100)  # the MXU, from the op's name
    assert dict(format_profile_table(analysis))["tensor core (MXU)"] == "30.0%"


def test_tpu_op_name_is_the_instruction_name_of_the_hlo_text():
    from bench.profile.analysis import tpu_op_name

    text = ("%multiply_reduce_fusion.40 = bf16[1536]{0:T(1024)(128)(2,1)S(1)} fusion(bf16[1536,12288]{1,0:T(8,128)"
            "(2,1)} %params_layers_30__down_DF.1, bf16[12288]{0} %fusion.304), kind=kLoop, calls=%fused_computation")
    assert tpu_op_name(text) == "multiply_reduce_fusion.40"
    assert tpu_op_name("%copy-done = bf16[1536]{0} copy-done((bf16[1536]{0}, u32[]) %copy-start)") == "copy-done"
    assert tpu_op_name("fusion.7") == "fusion.7"  # not HLO text: kept as it is


def _instr(name, opcode, *, operand_dtypes=("bf16", "bf16"), op_name="", called=()):
    from bench.profile.xspace import HloInstruction

    return HloInstruction(name=name, opcode=opcode, dtype="bf16", operand_dtypes=operand_dtypes, op_name=op_name,
                          fusion_kind="kOutput" if opcode == "fusion" else "", custom_call_target="", called=called,
                          users=())  # fmt: skip


def _module(*computations):
    from bench.profile.xspace import HloComputation, HloModule

    comps = {name: HloComputation(name, tuple(instrs), instrs[-1].name) for name, instrs in computations}
    return HloModule("jit__decode_program", comps, {i.name: i for _, instrs in computations for i in instrs})


@pytest.mark.parametrize("platform", ["tpu", "gpu", "cpu"])
def test_a_fused_convolution_is_the_mxu_on_a_tpu_and_a_product_elsewhere(platform):
    from bench.profile.classify import classify_hlo

    conv = _instr("convolution.1", "convolution")
    inner = _instr("fusion.9", "fusion", called=("nested",))  # the convolution sits one fusion deeper
    top = _instr("convolution_bitcast_fusion.6", "fusion", called=("outer",),
                 op_name="jit(_decode_program)/decode_step/layer_3/attention/BKSH,BKGH->BKSG/dot_general")
    module = _module(("nested", [_instr("p0", "parameter"), conv]), ("outer", [_instr("p1", "parameter"), inner]),
                     ("main", [top]))  # fmt: skip
    expected = {"tpu": ("tensor_core", ""), "gpu": ("attention", ""), "cpu": ("attention", "")}[platform]
    assert classify_hlo(top, module, top.name, platform) == expected  # on a TPU the MXU wins over the scope


@pytest.mark.parametrize("platform", ["tpu", "cpu"])
def test_a_dot_rewritten_into_multiply_reduce_is_a_matrix_product(platform):
    from bench.profile.classify import classify_hlo

    body = [_instr("p0", "parameter"), _instr("multiply.1", "multiply"), _instr("reduce.2", "reduce")]
    product = _instr("multiply_reduce_fusion.40", "fusion", called=("fused",),
                     op_name="jit(_decode_program)/decode_step/layer_30/mlp/BTF,DF->BTD/dot_general")
    f32 = dataclasses.replace(product, name="multiply_reduce_fusion.41", operand_dtypes=("f32", "f32"))
    norm = dataclasses.replace(product, name="fusion.7", op_name="jit(_decode_program)/decode_step/reduce_sum")
    module = _module(("fused", body), ("main", [product, f32, norm]))
    assert classify_hlo(product, module, product.name, platform) == ("matmul_16bit", "")  # vector units, bf16
    assert classify_hlo(f32, module, f32.name, platform) == ("matmul_fp32", "")
    assert classify_hlo(norm, module, norm.name, platform) == ("other_fusions", "")  # a reduce that is no product


def test_a_multiply_reduce_fusion_is_no_product_because_its_consumer_is_one():
    from bench.profile.classify import classify_hlo

    # XLA:CPU leaves some fusions without metadata (their root has none); their scope is then their consumer's,
    # which names the consumer's JAX op, not theirs: a norm feeding a product is still no product
    body = [_instr("p0", "parameter", operand_dtypes=("f32",)), _instr("multiply.1", "multiply"),
            _instr("reduce.2", "reduce")]  # fmt: skip
    norm = dataclasses.replace(_instr("fusion.3", "fusion", called=("fused",), operand_dtypes=("f32", "f32")),
                               users=("reshape.4",))  # fmt: skip
    consumer = _instr("reshape.4", "reshape", op_name="jit(_decode_program)/decode_step/mlp/BTD,DX->BTX/dot_general")
    module = _module(("fused", body), ("main", [norm, consumer]))
    assert classify_hlo(norm, module, norm.name, "cpu") == ("other_fusions", "")


# ---- tensor-core kernels: real names -------------------------------------------------------------------------
# (name as a profiler printed it, uses tensor cores?, why / where the name was seen)
REAL_KERNEL_NAMES = [
    ("volta_h884gemm_64x64_ldg8_nn", True, "Volta HMMA 8x8x4; xprof kernel_stats_utils.cc examples"),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", True, "Volta HMMA, fp32 accumulate; xprof examples"),
    ("turing_fp16_s1688cudnn_fp16", True, "Turing cuDNN HMMA 16x8x8; xprof examples"),
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", True, "Turing cuBLAS HMMA; vLLM NCU notes"),
    ("turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_stages_32x1_tn", True, "Turing cuBLAS; PyTorch profiler table"),
    ("ampere_bf16_s1688gemm_bf16_128x128_ldg8_f2f_stages_32x1_nn", True, "RTX 4090 bf16; pytorch/pytorch#181718"),
    ("cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>", True,
     "CUTLASS tensorop; pytorch/pytorch#181718"),
    ("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_nn_align8>", True,
     "CUTLASS Ampere tensorop; pytorch/pytorch#181718"),
    ("trt_ampere_h16816gemm_128x64_ldg8_nn_v1", True, "TensorRT Ampere HMMA 16x8x16; Nsight trace"),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize96x64x32_stage3_warpsize2x2x1_tensor16x8x16_kernel", True,
     "cuBLAS Ampere xmma; its SASS shows HMMA.16816"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", True, "cuBLAS Hopper bf16 (warpgroup = wgmma); nsys on H100"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", True, "cuBLAS Hopper float32 inputs on TF32 tensor cores"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT", True, "cuBLAS Hopper nvjet; NVIDIA/Fuser#3563 on H200"),
    ("nvjet_hsh_192x192_64x3_2x1_v_bz_coopB_NTN", True, "cuBLAS Hopper nvjet; NVIDIA/Fuser#3137"),
    ("cutlass3x_sm90_tensorop_gemm_f16_f16_f32_f16_f16_128x256x64_1x2x1_0_tnn_align8_warpspecialized_pingpong_epi_tma",
     True, "CUTLASS 3 Hopper; cutlass_profiler name"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x256_4x1x1_kernel0_0", True,
     "cuDNN flash attention on Hopper wgmma; Megatron op table"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __half, __half, __half, float, false, "
     "true, true, false, 7, false, cu", False, "cuBLAS gemv (CUDA cores), fp16; nsys table, truncated as printed"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, "
     "false, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>", False,
     "cuBLAS gemv, fp32: the report's 'fp32 gemvx'"),
    ("void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 2, 2, false, false, cublasGemvParams<"
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >", False,
     "cuBLAS gemv, fp32; TensorFlow profile"),
    ("void gemv2T_kernel_val<int, int, __half, float, float, float, ", False, "cuBLAS gemv, fp16 in; vLLM NCU table"),
    ("cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>", False,
     "CUTLASS SIMT sgemm; NVIDIA/CUDALibrarySamples#309"),
    ("cutlass3x_sm100_simt_sgemm_f32_f32_f32_f32_f32_64x32x16_1x1x1_3_nnn_align1_bias_f32_relu", False,
     "Blackwell-era name but a SIMT kernel; NVIDIA/CUDALibrarySamples#309"),
    ("nvjet_sm100_tst_64x8_64x16", True, "cuBLAS Blackwell nvjet; a kernel-family table"),
    ("volta_sgemm_128x64_nn", False, "cuBLAS SIMT sgemm (CUDA cores)"),
    ("ampere_sgemm_128x64_tn", False, "cuBLAS SIMT sgemm on Ampere; a kernel-category test"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, __half, __half, float, __half, f", False,
     "cuBLASLt split-K reduction after a GEMM; vLLM profile table"),
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedBat", False,
     "cuBLAS small-N SIMT gemm"),
    ("loop_convert_fusion", False, "XLA GPU convert kernel"),
    ("loop_convert_fusion_4", False, "XLA GPU convert kernel (PTX dump)"),
    ("input_pad_reduce_fusion", False, "XLA GPU reduction"),
    ("input_reduce_fusion", False, "XLA GPU reduction"),
    ("loop_transpose_fusion.1", False, "XLA GPU transpose"),
    ("loop_add_fusion", False, "XLA GPU elementwise"),
    ("gemm_fusion_dot_general_1", False, "XLA Triton GEMM: the name cannot tell (documented limit)"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", False,
     "PyTorch elementwise"),
]


@pytest.mark.parametrize(("name", "uses_tensor_cores", "why"), REAL_KERNEL_NAMES,
                         ids=[name[:40] for name, _, _ in REAL_KERNEL_NAMES])  # fmt: skip
def test_tensor_core_classifier_on_real_kernel_names(name, uses_tensor_cores, why):
    assert is_tensor_core_kernel(name) is uses_tensor_cores, why


# ---- capture options -------------------------------------------------------------------------------------------
def test_gpu_profile_flags_turn_command_buffers_off_and_merge():
    assert gpu_profile_flags() == ("--xla_gpu_enable_command_buffer=",)
    merged = merge_xla_flags("--xla_gpu_enable_command_buffer=FUSION,CUBLAS --foo=1", gpu_profile_flags())
    assert merged == "--foo=1 --xla_gpu_enable_command_buffer="
    env = {}
    assert apply_gpu_profile_flags(env) == "--xla_gpu_enable_command_buffer=" == env["XLA_FLAGS"]


@pytest.mark.parametrize("steps", [0, -1])
def test_capture_rejects_no_steps(steps, tmp_path):
    with pytest.raises(InputError, match="--steps"):
        capture_steps(lambda s: s, jnp.zeros(()), steps, tmp_path)


# ---- bad inputs ------------------------------------------------------------------------------------------------
def test_missing_path_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        analyze_trace(tmp_path / "nope.xplane.pb")


def test_a_file_that_is_not_a_trace_is_a_trace_error(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a trace")
    with pytest.raises(TraceError, match="not an xprof trace"):
        analyze_trace(text)
    fake = tmp_path / "host.xplane.pb"
    fake.write_bytes(b"\xff\xff\xff not protobuf")
    with pytest.raises(TraceError, match="could not be read"):
        analyze_trace(fake)


def test_a_folder_without_a_trace_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="holds no"):
        analyze_trace(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    with pytest.raises(TraceError, match="has no profile"):
        analyze_trace(run)


def test_a_trace_without_step_annotations_is_a_trace_error(tmp_path):
    f = jax.jit(lambda x: x * 2)
    f(jnp.ones(4)).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        f(jnp.ones(4)).block_until_ready()
    with pytest.raises(TraceError, match="no 'decode' step annotations"):
        analyze_trace(tmp_path)


@pytest.mark.parametrize("target, category", [
    ("gemma4_bf16_to_f32", "dtype_conversion"),  # the engine's CPU kernel widening a weight (backends/cpu/kernels.py)
    ("gemma4_bf16_matvec_nk", "matmul_fp32"),  # float32 sums of bfloat16 weights widened in registers
    ("gemma4_bf16_matvec_kn", "matmul_fp32"),
    ("gemma4_decode_attention", "attention"),  # decode attention over a float32 cache, with no scope on the call
    ("gemma4_decode_attention_rows", "attention"),
    ("__cublas$gemm", "matmul_16bit"),  # a library GEMM still counts as a product of its operands' dtype
])  # fmt: skip
def test_the_engines_cpu_kernels_are_classified_by_what_they_do_not_by_the_gemm_in_gemma(target, category):
    import dataclasses

    from bench.profile.classify import classify_hlo

    call = dataclasses.replace(_instr("ffi_call.7", "custom-call", operand_dtypes=("bf16",) if "to_f32" in target
                                      else ("f32", "bf16")), custom_call_target=target)  # fmt: skip
    if target.startswith("__cublas"):
        call = dataclasses.replace(call, operand_dtypes=("bf16", "bf16"))
    module = _module(("main", [_instr("p0", "parameter"), call]))
    assert classify_hlo(call, module, "ffi_call.7", "cpu")[0] == category


def test_leak_one_is_named_as_a_conversion_of_each_weight_and_matched_dtypes_name_none(leak, matched):
    # bench.profile.findings: the published report's dtype-conversion tax, found here without reading the table
    named = [f for f in leak[1].to_json()["findings"] if "parameter rewrite" in f["rules"]]
    assert len(named) == 4 and {f["rewrite"]["kind"] for f in named} == {"dtype conversion"}
    assert all(f["rewrite"]["parameter_shape"].startswith(f"bf16[{D},{D}]") for f in named)
    assert not [f for f in matched[1].to_json()["findings"] if "parameter rewrite" in f["rules"]]


@pytest.mark.parametrize("opcode", ["all-reduce", "all-gather-start", "all-gather-done", "reduce-scatter", "all-to-all",
                                    "collective-permute", "collective-permute-start"])
def test_collectives_are_their_own_category(opcode):
    from bench.profile.classify import classify_hlo

    op = _instr(f"{opcode}.3", opcode, op_name="jit(_decode_program)/decode_step/layer_1/attention/reduce_sum")
    fused = _instr("fusion.4", "fusion", called=("with",), op_name="jit(_decode_program)/decode_step/mlp/add")
    copy = _instr("copy.5", "copy")
    module = _module(("with", [_instr("p0", "parameter"), _instr("c", "convert"), op]), ("main", [op, fused, copy]))
    assert classify_hlo(op, module, op.name, "tpu") == ("collective", "")  # before the attention scope
    assert classify_hlo(fused, module, fused.name, "gpu") == ("collective", "")  # before dtype conversion
    assert classify_hlo(copy, module, copy.name, "cpu") == ("copies_transfers", "")


@pytest.mark.parametrize("name, category", [
    ("all-reduce.12", "collective"), ("all-gather-start.1", "collective"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"), ("collective-permute-done", "collective"),
    ("memcpy32_post", "copies_transfers"),
])  # fmt: skip
def test_collective_names_without_hlo(name, category):
    from bench.profile.classify import classify_name

    assert classify_name(name, "gpu") == (category, "")
