"""The CPU platform's implementations behind the backend boundary (`model.backends` is the only importer).

- `model.backends.cpu.forms`: the dense product forms written for XLA:CPU (jax.numpy; both backends on CPU), and
  the dispatch to the bfloat16 kernels under "cpu-kernels".
- `model.backends.cpu.qreduce`: the multiply-and-sum form of a quantized decode product (jax.numpy; both backends).
- `model.backends.cpu.kernels` with `cpu_bf16.cc`: the hand-written C++ kernels (XLA FFI), "cpu-kernels" only.
- `model.backends.cpu.xla`: the XLA:CPU pass option of the decode programs, "cpu-kernels" only.
"""
