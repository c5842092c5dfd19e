"""Which device-time category one op belongs to (docs/method.md, "Profiles"): from its HLO instruction when the
trace holds it, else from the kernel or event name alone; and whether a GPU kernel runs on tensor cores.

The categories and their order (first match wins) are documented in `bench.profile.analysis`, which applies these
functions to every event of a trace. Pure functions of names and HLO: no jax, no trace reading.
"""

from __future__ import annotations

import re

from bench.profile.xspace import HloInstruction, HloModule

_FP32 = {"f32", "f64", "c64", "c128"}
_NARROW_PREFIXES = ("bf16", "f16", "f8", "f4", "s8", "u8", "s4", "u4", "s2", "u2")
_MOVE = {
    "parameter", "constant", "bitcast", "bitcast-convert", "reshape", "broadcast", "copy", "copy-start", "copy-done",
    "transpose", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "reverse", "gather",
    "scatter", "iota", "tuple", "get-tuple-element", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
    "collective-permute", "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done",
    "collective-permute-start", "collective-permute-done", "send", "recv", "send-done", "recv-done",
}  # fmt: skip
_CONTROL_FLOW = {"while", "call", "conditional"}
COLLECTIVE_OPCODES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
"""HLO collectives (data exchanged between devices: `model.sharding`'s meshes), with their asynchronous -start and
-done halves: the "collective" category."""
_COLLECTIVE_NAME = re.compile(r"nccl|all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|"
                              r"collective[-_]?permute", re.IGNORECASE)  # fmt: skip
"""A kernel or event named for a collective: NCCL's kernels (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`) and XLA's
ops as traces name them (`all-reduce.3`, `all-gather-start.1`, `collective-permute-done`)."""


def is_collective(opcode: str) -> bool:
    """True for an HLO collective opcode (`COLLECTIVE_OPCODES`, or its -start / -done half)."""
    return opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVE_OPCODES
_W4A16_KERNEL = re.compile(r"w4a16_pallas", re.IGNORECASE)
"""The fused W4A16 kernel's name (`model.kernels.w4a16.KERNEL_NAME`, "w4a16_pallas_kernel"): the Triton kernel's
name on a GPU, and the named scope around its call (so an interpreted run's ops carry it in their op_name)."""


def is_w4a16_kernel(name: str) -> bool:
    """True when a kernel name or an op's scope names the fused W4A16 kernel."""
    return bool(_W4A16_KERNEL.search(name))
_MATMUL_TARGET = re.compile(r"gemm(?!a\d)|matmul|conv", re.IGNORECASE)  # not the gemma4_* kernels of model/backends/cpu
_CPU_WIDEN_TARGET = "gemma4_bf16_to_f32"
"""The engine's CPU kernel that widens a bfloat16 weight to float32 (`model.backends.cpu.kernels.to_float32`): a
dtype conversion, whose only operand is the bfloat16 weight."""
_CPU_MATVEC_TARGET = re.compile(r"^gemma4_bf16_matvec_")
"""The engine's CPU matrix-vector kernels (`model.backends.cpu.kernels.matvec`): float32 products of bfloat16 weights
widened in registers, so float32 matrix products."""
_CPU_ATTENTION_TARGET = re.compile(r"^gemma4_decode_attention")
"""The engine's CPU decode-attention kernels (`model.backends.cpu.kernels.decode_attention`, with or without rows):
attention, whatever scope the call carries."""


# ---- tensor cores ----------------------------------------------------------------------------------------------
_NOT_TENSOR_CORE = re.compile(r"gemv|simt|convert", re.IGNORECASE)
_TENSOR_CORE = re.compile(
    r"[hsi](884|1688|16816|16832)(gemm|cudnn)"  # cuBLAS/cuDNN/CUTLASS MMA shapes: volta_h884gemm, s16816gemm
    r"|hmma|imma|wgmma|tcgen05|tensorop"  # MMA instruction families; CUTLASS `*_tensorop_*`
    r"|nvjet"  # cuBLAS 12.x JIT GEMMs on Hopper/Blackwell
    r"|cutlass3x_sm(90|100|120)",  # CUTLASS 3 kernels for Hopper/Blackwell
    re.IGNORECASE,
)
_XMMA_MMA_TYPES = re.compile(r"tensor|tf32|bf16|f16|e4m3|e5m2|i8|int8", re.IGNORECASE)


def is_tensor_core_kernel(name: str) -> bool:
    """True when a GPU kernel's name says it runs on tensor cores (decided from the name alone).

    Tensor-core families (sources: cuBLAS/cuDNN/CUTLASS kernel names as profilers print them; CUTLASS's
    documented name scheme `cutlass3x_sm90_tensorop_gemm_<types>_<tile>...`):
    - MMA shapes in cuBLAS/cuDNN/CUTLASS names: `volta_h884gemm_*`, `volta_fp16_s884gemm_*`,
      `turing_fp16_s1688gemm_*`, `turing_fp16_s1688cudnn_*`, `ampere_bf16_s16816gemm_*`, `trt_ampere_h16816gemm_*`;
    - instruction families: `hmma`, `imma`, Hopper `wgmma` (e.g. cuDNN `..._sdpa_sm90_flash_fprop_wgmma_f16_...`),
      Blackwell `tcgen05`;
    - CUTLASS `cutlass_75_tensorop_*`, `cutlass_80_tensorop_*`, `cutlass3x_sm90_*`, `cutlass3x_sm100_*`;
    - cuBLAS(Lt) `sm80_xmma_*`, `sm90_xmma_*` when the name shows an MMA type (a `tensor16x8x16` tile, tf32, bf16,
      f16, fp8, int8): an xmma name with only f32 types and no tensor tile is not counted;
    - cuBLAS `nvjet_*` (its Hopper/Blackwell GEMMs, e.g. `nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT`).
    Never tensor cores, whatever else the name says: gemv kernels (`gemv2T_kernel_val<...>`, `gemvx::kernel<...>`),
    CUTLASS/cuBLAS `simt` kernels (`cutlass3x_sm100_simt_sgemm_*` included) and convert kernels. Not matched by
    any family, so not tensor cores either: plain `sgemm` (`volta_sgemm_*`, `ampere_sgemm_*`), cuBLAS
    `splitKreduce_kernel`, reductions, XLA's own fusions (`input_*_fusion`, `loop_*_fusion`).
    Limits: a Triton GEMM emitted by XLA (`gemm_fusion_dot_*`, `triton_gemm_*`) may use tensor cores but its name
    does not say so; it is not counted here (the analysis counts it as a matrix product by operand dtype).
    xprof's own `IsKernelUsingTensorCore` knows only Volta/Turing prefixes and so misses every kernel from Ampere on.
    """
    if _NOT_TENSOR_CORE.search(name):
        return False
    if _TENSOR_CORE.search(name):
        return True
    return "xmma" in name.lower() and bool(_XMMA_MMA_TYPES.search(name))


def _dtype_group(dtypes: tuple[str, ...]) -> str | None:
    operands = dtypes[:2]
    if any(d in _FP32 for d in operands):
        return "matmul_fp32"
    if operands and all(d.startswith(_NARROW_PREFIXES) for d in operands):
        return "matmul_16bit"
    return None


def _fused(instr: HloInstruction, module: HloModule) -> list[HloInstruction]:
    """Instructions of the computations `instr` calls, recursively (a fusion's fused instructions)."""
    out, todo, seen = [], list(instr.called), set()
    while todo:
        comp = module.computations.get(todo.pop())
        if comp is None or comp.name in seen:
            continue
        seen.add(comp.name)
        for inner in comp.instructions:
            out.append(inner)
            todo.extend(inner.called)
    return out


def _own_scope(instr: HloInstruction, module: HloModule) -> str:
    """The JAX op `instr` computes: its own op_name, else its fusion root's; "" when neither has one."""
    if instr.op_name:
        return instr.op_name
    if instr.opcode == "fusion" and instr.called:
        comp = module.computations.get(instr.called[0])
        if comp is not None and comp.root in module.instructions and module.instructions[comp.root].op_name:
            return module.instructions[comp.root].op_name
    return ""


def _scope(instr: HloInstruction, module: HloModule) -> str:
    """`_own_scope`, else the op_name of its first user that has one (the named scope an op ran under)."""
    own = _own_scope(instr, module)
    if own:
        return own
    for user in instr.users:  # XLA:CPU leaves dots without metadata; the reshape/fusion consuming them has it
        if user in module.instructions and module.instructions[user].op_name:
            return module.instructions[user].op_name
    return ""


def is_rewritten_product(instr: HloInstruction, work: list[str], op_name: str) -> bool:
    """True for a matrix product that XLA rewrote into an elementwise multiply and a reduce (no dot left): a
    fusion whose fused instructions multiply and reduce, and whose JAX op (`op_name`, e.g.
    `jit(_decode_program)/decode_step/layer_3/mlp/BTD,DX->BTX/dot_general`) is a `dot_general`.

    Where it is seen: XLA's TPU backend turns a decode step's one-row products (matrix x vector) into
    `multiply_reduce_fusion` ops that run on the vector units, not the matrix units (traces of this project's
    decode on a TPU v5e, 2026-12-05: 64% of a batch-1 step; at 128 rows the same products are `convolution`
    fusions). Counted as a matrix product by the fusion's operand dtypes, like a dot."""
    return instr.opcode == "fusion" and "multiply" in work and "reduce" in work and op_name.endswith("/dot_general")


def is_mxu_op(instr: HloInstruction, inner: list[HloInstruction]) -> bool:
    """True when a TPU op runs on the matrix units (MXU): it is, or fuses, an HLO `dot` or `convolution`.

    XLA's TPU backend computes every dot/convolution it keeps on the MXU (the TPU's counterpart of a GPU's tensor
    cores; a dot it rewrites into multiply + reduce runs on the vector units instead, `is_rewritten_product`). So
    on a TPU the `tensor_core` category holds these ops: the share of device time the matrix units are busy."""
    return any(i.opcode in ("dot", "convolution") for i in [instr, *inner])


def _in_attention(op_name: str) -> bool:
    return any("attention" in segment.lower() for segment in op_name.split("/")[:-1])


def classify_hlo(instr: HloInstruction, module: HloModule, kernel: str, platform: str) -> tuple[str, str]:
    """(category, detail) of an op whose HLO instruction is known; detail is "control_flow", "unknown_dtype" or ""."""
    if is_w4a16_kernel(kernel) or is_w4a16_kernel(_scope(instr, module)):
        return "w4a16_kernel", ""
    inner = _fused(instr, module) if instr.opcode == "fusion" else []
    if any(is_collective(i.opcode) for i in [instr, *inner]):  # devices exchanging data, whatever else it fuses
        return "collective", ""
    work = [i.opcode for i in inner if i.opcode not in ("parameter", "constant", "tuple", "get-tuple-element")]
    if instr.opcode == "convert" or ("convert" in work and all(op == "convert" or op in _MOVE for op in work)):
        return "dtype_conversion", ""
    if instr.opcode == "custom-call" and instr.custom_call_target == _CPU_WIDEN_TARGET:
        return "dtype_conversion", ""
    if instr.opcode == "custom-call" and _CPU_MATVEC_TARGET.search(instr.custom_call_target):
        return "matmul_fp32", ""
    if instr.opcode == "custom-call" and _CPU_ATTENTION_TARGET.search(instr.custom_call_target):
        return "attention", ""
    if platform == "gpu" and is_tensor_core_kernel(kernel):
        return "tensor_core", ""
    dots = [i for i in [instr, *inner] if i.opcode in ("dot", "convolution")]
    if instr.opcode == "custom-call" and _MATMUL_TARGET.search(instr.custom_call_target):
        dots.append(instr)
    if platform == "tpu" and is_mxu_op(instr, inner):
        return "tensor_core", ""
    scope = _scope(instr, module)
    if _in_attention(scope):
        return "attention", ""
    if dots:
        group = _dtype_group(dots[0].operand_dtypes) or _name_dtype_group(kernel)
        return (group, "") if group else ("other", "unknown_dtype")
    if is_rewritten_product(instr, work, _own_scope(instr, module)):  # its own JAX op, never its consumer's
        group = _dtype_group(instr.operand_dtypes)
        return (group, "") if group else ("other", "unknown_dtype")
    if instr.opcode in _MOVE or (instr.opcode == "fusion" and work and all(op in _MOVE for op in work)):
        return "copies_transfers", ""
    if instr.opcode == "fusion":
        return "other_fusions", ""
    return "other", "control_flow" if instr.opcode in _CONTROL_FLOW else ""


_NAME_16BIT = re.compile(r"__half|\bhalf\b|bfloat16|bf16|fp16|f16|hgemm|hgemv|e4m3|e5m2|int8|\bi8\b", re.I)
_NAME_FP32 = re.compile(r"\bfloat\b|sgemm|sgemv|f32|fp32|tf32", re.IGNORECASE)
_NAME_MATMUL = re.compile(r"gemm|gemv|matmul|xmma|nvjet|cublas|cutlass|(^|[_.])dot([_.]|$)", re.IGNORECASE)
_NAME_ATTENTION = re.compile(r"attention|fmha|flash|sdpa", re.IGNORECASE)
_NAME_TPU_MXU = re.compile(r"(^|_)(convolution|dot)([_.]|$)")  # a TPU fusion named after its ops: convolution_add_fusion
_NAME_COPY = re.compile(r"memcpy|memset|copy|transpose|dynamic.update.slice|concatenate|gather|scatter", re.I)


def _name_dtype_group(kernel: str) -> str | None:
    if _NAME_16BIT.search(kernel):
        return "matmul_16bit"
    if _NAME_FP32.search(kernel):
        return "matmul_fp32"
    return None


def classify_name(kernel: str, platform: str) -> tuple[str, str]:
    """(category, detail) from an event name alone, for ops whose HLO instruction the trace does not hold."""
    if is_w4a16_kernel(kernel):
        return "w4a16_kernel", ""
    if _COLLECTIVE_NAME.search(kernel):
        return "collective", ""
    if "convert" in kernel.lower():
        return "dtype_conversion", ""
    if platform == "gpu" and is_tensor_core_kernel(kernel):
        return "tensor_core", ""
    if platform == "tpu" and _NAME_TPU_MXU.search(kernel):
        return "tensor_core", ""
    if _NAME_ATTENTION.search(kernel):
        return "attention", ""
    if _NAME_MATMUL.search(kernel):
        group = _name_dtype_group(kernel)
        return (group, "") if group else ("other", "unknown_dtype")
    if _NAME_COPY.search(kernel):
        return "copies_transfers", ""
    if "fusion" in kernel.lower():
        return "other_fusions", ""
    return "other", ""
