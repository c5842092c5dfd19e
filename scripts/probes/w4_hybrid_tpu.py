"""TPU probe: the W4A16 kernel (`model.kernels.w4a16_tpu`) at decode's few rows with part of each output block on
the vector unit (`TpuTiling.vpu_cols`, the hybrid form) against the matrix unit alone (vpu_cols 0).

Why: issue 43's profile of `w4` decode on the lent v5e (2026-12-07) put the kernel at 437 GB/s of packed weights
(527 GB/s on the largest product), bound by the matrix unit's loading of weight tiles at one activation row
(about 1.0e12 weights/s), not by HBM (a streaming read: 698 GiB/s). The vector unit can multiply other columns at
the same time.

Timing: one jitted program multiplies x by L distinct weights of the shape (about 200 MB together, passed as
arguments, so every product streams its own weight from HBM), `reps` times in a loop whose x depends on the last
result; per product = (median at reps - median at 1) / ((reps - 1) L) over --iters calls. GB/s = packed bytes
(K N / 2 + 2 K N / g of bfloat16 scales) / that. Each variant's result is checked against dequantize-then-matmul
(float32) on the device.

    PYTHONPATH=$PYTHONPATH:. python3 scripts/probes/w4_hybrid_tpu.py          # on the TPU, about a minute
    JAX_PLATFORMS=cpu PYTHONPATH=. python3 scripts/probes/w4_hybrid_tpu.py --interpret --small
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from model.kernels.fit_tpu import TpuTiling
from model.kernels.tpu_layout import pack_words
from model.kernels.w4a16_tpu import w4a16_tpu_matmul

G = 128
SHAPES = {"gate_up": (1536, 12288, 2048), "down": (6144, 1536, 1536), "qkv": (1536, 2048, 2048), "o": (2048, 1536, 1536)}
SMALL = {"small": (256, 512, 512)}


def _median(f, args, iters):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def _per_product_ms(product, x, ws, ss, reps, iters):
    def run(n_reps, x, ws, ss):
        def body(_, carry):
            xi, tot = carry
            for w, s in zip(ws, ss):
                tot = tot + product(xi, w, s)[0, 0].astype(jnp.float32)
            return xi + (tot * 0).astype(xi.dtype), tot

        return jax.lax.fori_loop(0, n_reps, body, (x, jnp.float32(0)))[1]

    f = jax.jit(run)
    t1 = _median(f, (jnp.int32(1), x, ws, ss), iters)
    tr = _median(f, (jnp.int32(reps), x, ws, ss), iters)
    return max(tr - t1, 0.0) / ((reps - 1) * len(ws)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--rows", default="1")
    ap.add_argument("--cols", default="0,512,768,1024", help="vpu_cols values (multiples of 128 below bn)")
    ap.add_argument("--total-mb", type=float, default=200.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=120.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    t0 = time.time()
    rng = np.random.default_rng(0)
    res = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind), "cases": []}
    print(f"w4_hybrid_tpu: jax {jax.__version__}, {res['device']}", flush=True)
    for name, (k, n, bn) in (SMALL if a.small else SHAPES).items():
        nbytes = k * n // 2 + 2 * k * n // G
        count = 1 if a.interpret else max(2, int(a.total_mb * 1e6 // nbytes))
        q = rng.integers(-8, 8, size=(k, n)).astype(np.int8)
        s = (rng.random((k // G, n)) * 0.02 + 0.001).astype(np.float32)
        w0, s0 = pack_words(jnp.asarray(q), G), jnp.asarray(s, jnp.bfloat16)
        ws = [w0 + jnp.int32(0) * i for i in range(count)]  # distinct device buffers, same values
        ss = [s0 + jnp.bfloat16(0) * i for i in range(count)]
        deq = q.astype(np.float32) * np.repeat(np.asarray(s0, np.float32), G, axis=0)
        for rows in [int(r) for r in a.rows.split(",")]:
            x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
            ref = np.asarray(x, np.float32) @ deq
            bk = k if k <= 2048 else 2048
            for vc in [int(c) for c in a.cols.split(",")]:
                if time.time() - t0 > a.budget_s:
                    print("budget reached", flush=True)
                    break
                if vc >= bn:
                    continue
                t = TpuTiling(bm=128, bn=bn, bk=bk, vpu_cols=vc)
                case = {"shape": name, "k": k, "n": n, "rows": rows, "tiling": t.text, "products": count}
                prod = functools.partial(w4a16_tpu_matmul, k=k, n=n, group=G, tiling=t, interpret=a.interpret)
                try:
                    got = np.asarray(prod(x, ws[0], ss[0]), np.float32)
                    case["rel_err"] = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
                    if not a.interpret:
                        ms = _per_product_ms(prod, x, ws, ss, a.reps, a.iters)
                        case.update(ms=ms, gb_s=nbytes / (ms * 1e-3) / 1e9 if ms > 0 else None)
                except Exception as e:  # noqa: BLE001 - a probe records and goes on
                    case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                res["cases"].append(case)
                print(f"{name:8s} K={k:5d} N={n:5d} rows={rows:3d} {t.text:34s} {case.get('ms', 0):.4f} ms/product "
                      f"{case.get('gb_s') or 0:7.1f} GB/s rel_err {case.get('rel_err', float('nan')):.2e} "
                      f"{case.get('error', '')}", flush=True)
    with open(os.path.join(a.out, "w4_hybrid_tpu.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
