"""Hand-written kernels of the engine and their fit arithmetic.

- `model.kernels.fit`: the scratch memory a tiling needs at a projection's shape, the device limits, what a
  tiling must satisfy to tile a shape (`fits_kernel`), the tiling chosen per projection, the refusal (pure
  Python, no jax: `bench kernels fit` and the report use it).
- `model.kernels.choice`: the engine's choice between the kernel and XLA (`KernelPlan`, `with_tilings`); no
  Pallas, and no jax at import.
- `model.kernels.w4a16`: the fused W4A16 Pallas kernel. The only module here that imports Pallas, and nothing
  imports it but `model.quant`'s kernel path (and tests).
"""
