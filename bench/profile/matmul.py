"""Measured matrix-product rate of the live device: the denominator of the prefill's compute share (docs/method.md,
"Rooflines": prefill is compute-bound, so its achieved FLOP/s is reported against a measured matrix-product rate).

Method: one jitted [M, K] x [K, N] product in the compute dtype (float32 by default, the policy's compute dtype on
CPU), at jax's default matmul precision (the precision the engine's own products run at), on operands already on
the device. One untimed call compiles and warms up; then `repeats` timed calls, each synced with
`block_until_ready`. FLOP per call = 2 * M * N * K (a multiply-add is 2 FLOPs); the rate is FLOP / median time.
The operands are random (no zeros for the backend to skip) and the product's one element is checked against a
host dot product, so a product that was not computed is an error, not a fast rate.

Units: FLOP/s (`flop_s`), GFLOP/s (`gflop_s`, 10^9 FLOP/s); times in seconds. jax is imported only when a rate is
measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from bench.errors import InputError

DEFAULT_SIZE = {"cpu": 1536, "gpu": 8192, "cuda": 8192, "rocm": 8192, "tpu": 8192}
"""Default M = N = K per platform: a 1536^3 product is 7.2 GFLOP (about 0.25 s a call on this project's 2-core CPU
at about 30 GFLOP/s, so the whole measurement takes about 2 s there); 8192^3 (1.1 TFLOP, 768 MiB of float32
operands and result) keeps a GPU busy for milliseconds, far above dispatch time."""
DEFAULT_REPEATS = 5
_METHOD = "jit(a @ b), [M,K]x[K,N], default precision, block_until_ready; FLOP = 2*M*N*K per call"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatmulRateResult:
    """One matrix-product rate measurement.

    m, n, k: the product's shape ([m, k] x [k, n]); dtype: the operands' dtype name (e.g. "float32").
    flops: FLOP of one call, 2 * m * n * k. times_s: every timed call (s), after one untimed warm-up call.
    flop_s: flops / median(times_s) (FLOP/s); gflop_s: the same in GFLOP/s (10^9).
    platform / device_kind: the device measured; method: how.
    """

    platform: str
    device_kind: str
    m: int
    n: int
    k: int
    dtype: str
    flops: int
    repeats: int
    times_s: tuple[float, ...]
    median_s: float
    flop_s: float
    gflop_s: float
    method: str = _METHOD

    def to_json(self) -> dict:
        """A JSON-ready dict of every field (times in s, rates in FLOP/s and GFLOP/s)."""
        return {**dataclasses.asdict(self), "times_s": list(self.times_s)}


def default_size(platform: str) -> int:
    """The default M = N = K for a jax platform name ("cpu", "gpu", ...); 1536 (the CPU's) when unknown."""
    return DEFAULT_SIZE.get(platform, 1536)


def measure_matmul_rate(size: int | tuple[int, int, int] | None = None, repeats: int = DEFAULT_REPEATS, *,
                        dtype: str = "float32", device=None) -> MatmulRateResult:  # fmt: skip
    """Time `repeats` jitted [M, K] x [K, N] products in `dtype` on `device` (default: this process's first
    device, `jax.local_devices()[0]`).

    `size`: M = N = K, or (M, N, K); default `default_size(platform)`. Returns a `MatmulRateResult` (FLOP/s).
    Raises InputError for a dimension under 16, `repeats` under 1 or a dtype jax does not know; RuntimeError when
    the product's checked element is wrong (the product was not computed).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    device = device if device is not None else jax.local_devices()[0]
    m, n, k = _shape(size if size is not None else default_size(device.platform))
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"matmul repeats {repeats!r}: expected a whole number >= 1")
    try:
        np_dtype = jnp.dtype(dtype)
    except TypeError as exc:
        raise InputError(f"matmul dtype {dtype!r}: expected a jax dtype name such as float32 or bfloat16") from exc
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((m, k), dtype=np.float32)
    b_host = rng.standard_normal((k, n), dtype=np.float32)
    a_MK = jax.device_put(jnp.asarray(a_host, np_dtype), device)
    b_KN = jax.device_put(jnp.asarray(b_host, np_dtype), device)
    product = jax.jit(lambda a, b: a @ b)
    c_MN = jax.block_until_ready(product(a_MK, b_KN))  # warm-up: compiles
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        c_MN = jax.block_until_ready(product(a_MK, b_KN))
        times.append(time.perf_counter() - t0)
    _check_last_element(c_MN, a_MK, b_KN)
    flops = 2 * m * n * k
    median_s = statistics.median(times)
    return MatmulRateResult(platform=device.platform, device_kind=getattr(device, "device_kind", device.platform),
                            m=m, n=n, k=k, dtype=str(np_dtype), flops=flops, repeats=repeats, times_s=tuple(times),
                            median_s=median_s, flop_s=flops / median_s, gflop_s=flops / median_s / 1e9)  # fmt: skip


def _shape(size: int | tuple[int, int, int]) -> tuple[int, int, int]:
    """(M, N, K) from one int or three; InputError for a dimension under 16 or not a whole number."""
    dims = (size, size, size) if isinstance(size, int) else tuple(size)
    if len(dims) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 16 for d in dims):
        raise InputError(f"matmul size {size!r}: expected M = N = K or (M, N, K), whole numbers >= 16")
    return dims  # type: ignore[return-value]


def _check_last_element(c_MN, a_MK, b_KN) -> None:
    """RuntimeError unless the product's last element matches a float64 host dot product of the device operands'
    last row and column (tolerance 1e-2 of the sum of |terms|: 16-bit dtypes and TF32 round their inputs)."""
    import numpy as np

    i, j = c_MN.shape[0] - 1, c_MN.shape[1] - 1
    row, col = np.asarray(a_MK[i], np.float64), np.asarray(b_KN[:, j], np.float64)
    want, got, scale = float(row @ col), float(c_MN[i, j]), float(np.abs(row) @ np.abs(col))
    if abs(got - want) > 1e-2 * scale:
        raise RuntimeError(f"the matmul rate's product is wrong at [{i}, {j}]: {got} vs {want} (not computed?)")
