"""Hand-written kernels of the engine and their fit arithmetic.

- `model.kernels.fit`: the scratch memory a tiling needs at a projection's shape, the device limits, the tiling
  chosen per projection, the refusal (pure Python, no jax: `bench kernels fit` and the report use it).
- `model.kernels.w4a16`: the fused W4A16 Pallas kernel, the engine's choice between it and XLA (`KernelPlan`).
"""
