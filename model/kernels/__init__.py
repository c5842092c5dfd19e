"""Hand-written kernels of the engine and their fit arithmetic.

- `model.kernels.fit`: the scratch memory a tiling needs at a projection's shape, the device limits, what a
  tiling must satisfy to tile a shape (`fits_kernel`), the tiling chosen per projection, the refusal (pure
  Python, no jax: `bench kernels fit` and the report use it).
- `model.kernels.choice`: the engine's choice between the kernel and XLA (`KernelPlan`, `with_tilings`); no
  Pallas, and no jax at import.
- `model.kernels.w4a16`: the fused W4A16 Pallas kernel for NVIDIA GPUs (Triton lowering).
- `model.kernels.fit_tpu`: the TPU kernel's VMEM fit check and tiling choice (pure Python, no jax).
- `model.kernels.tpu_layout`: the TPU layout of w4 projections (32-bit words), set at load on a TPU (jax, no
  Pallas).
- `model.kernels.w4a16_tpu`: the W4A16 Pallas kernel for TPUs (Mosaic TPU lowering).
The two kernel modules are the only ones here that import Pallas, and nothing imports them but `model.quant`'s
kernel path (and tests, and the TPU probe).
"""
