"""TPU probe of the W4A16 kernel (model/kernels/w4a16_tpu.py) against XLA's w4 product, at E2B's w4 projection
shapes and 1 to 128 activation rows. Needs only jax and numpy (Python 3.11 + jax 0.10.2 on the lent TPU machine)
with the repository on PYTHONPATH.

For each (projection shape, rows): the kernel at the tiling the engine plans (`model.kernels.fit_tpu`), up to
--alternatives other tilings that fit the VMEM budget, at 8 rows or fewer its vector-unit variant ("vpu": no matrix
unit; `fit_tpu.VPU_ROWS` says from how many rows the engine uses it, 0 until this probe shows it faster), any
--tiling given, XLA's product as the engine runs it without the kernel (`model.quant.matmul` on the w4 layout,
"xla"), and XLA's product over the kernel's 32-bit words ("xla_words", `xla_words`): each checked against
dequantize-then-matmul on the device (float32, precision HIGHEST: max abs error, and that over max |reference|),
and timed.

Timing: a program that runs the product `reps` times in a loop, each iteration's activations depending on the last
one's output (so nothing is hoisted), against the same program with one iteration; per product = (median(reps) -
median(1)) / (reps - 1) over --iters calls each (block_until_ready after each call): the per-call floor (0.4-0.6 ms on
the lent v5e, issue 43's TPU notes) cancels. GB/s = packed weight bytes read (int4 values + bfloat16 scales, the bytes the
engine counts) / that time. `single_call_ms` is the plain median of one product per call, floor included.
Compile or run errors (a Mosaic error) are recorded per case and the probe goes on.

Run on the TPU (writes $OUT/w4a16_tpu.json, prints one line per case; about 2-4 minutes, --budget-s stops new
cases; --quick: 3 shapes x rows 1 and 128, kernel and XLA only, about a minute):
    PYTHONPATH=. python3 scripts/probes/w4a16_tpu.py --quick
    PYTHONPATH=. python3 scripts/probes/w4a16_tpu.py
    PYTHONPATH=. python3 scripts/probes/w4a16_tpu.py --rows 1,8 --tiling "tpu bm16 bn1024 bk1536" --alternatives 2
On CPU (interpret mode, small shapes: checks the probe itself):
    JAX_PLATFORMS=cpu PYTHONPATH=. python3 scripts/probes/w4a16_tpu.py --interpret --small --rows 1,3 --iters 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from model.kernels import fit, fit_tpu
from model.kernels.fit_tpu import TpuTiling
from model.kernels.tpu_layout import to_tpu
from model.kernels.w4a16_tpu import w4a16_tpu_matmul
from model.quant import dequantize, matmul, packed_bytes, quantize_channels

E2B_SHAPES = {  # field: (K, N, contraction axis of the stored leaf); model/config.py's e2b via fit.projections
    "qkv_DX": (1536, 2048, 0), "o_DX": (2048, 1536, 1), "gate_up_DX": (1536, 12288, 0),
    "down_DF": (6144, 1536, 1), "ple_gate_PD": (1536, 256, 1), "ple_proj_PD": (256, 1536, 0),
}  # fmt: skip
"""The default shapes: one of each projection kind (E2B: MLP width 6144, gate and up fused: N 12288)."""
SMALL_SHAPES = {"qkv_DX": (256, 1024, 0), "o_DX": (512, 256, 1), "ple_gate_PD": (256, 320, 1)}


def _all_e2b_shapes() -> dict[str, tuple[int, int, int]]:
    from model.config import PRESETS

    return {f"{p.field}_{p.k}x{p.n}": (p.k, p.n, p.axis) for p in fit.projections(PRESETS["e2b"], 128)}


def _copies(text: str, shape: str) -> list[str]:
    """Lines of compiled HLO that copy an array of `shape` (a relayout of the weight inside the program)."""
    return [ln.strip()[:200] for ln in text.splitlines() if shape in ln and re.search(r"\bcopy(-start)?\(", ln)]


def _median_s(f, args, iters: int) -> float:
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def _looped(product):
    """jit of: (reps, x, *w) -> the product `reps` times (a traced count: one program for every count), each
    iteration's x plus 0 x (the last output's first value), so no iteration can be hoisted or skipped."""

    def run(reps, x, *w):
        def body(_, carry):
            xi, _acc = carry
            y = product(xi, *w)
            return xi + (y[0, 0].astype(jnp.float32) * 0).astype(xi.dtype), y[0, 0].astype(jnp.float32)

        return jax.lax.fori_loop(0, reps, body, (x, jnp.float32(0)))[1]

    return jax.jit(run)


def _time(product, compiled, args, reps: int, iters: int) -> dict:
    """Per-product ms (floor cancelled: (median at `reps` - median at 1) / (reps - 1)) and the single call's."""
    loop = _looped(product)
    t1 = _median_s(loop, (jnp.int32(1), *args), iters)
    tr = _median_s(loop, (jnp.int32(reps), *args), iters)
    single = _median_s(compiled, args, iters)
    return {"ms": max(tr - t1, 0.0) / (reps - 1) * 1e3, "single_call_ms": single * 1e3, "loop1_ms": t1 * 1e3,
            f"loop{reps}_ms": tr * 1e3}  # fmt: skip


def xla_words(x: jax.Array, words: jax.Array, scales: jax.Array, *, k: int, n: int, group: int) -> jax.Array:
    """XLA's product (no Pallas) over the TPU layout's words (`model.kernels.tpu_layout`), for comparison: for each
    of the 8 nibbles p = j + 4h, the values masked out of the words [K / 8, N] (less the offset 8), times the group's
    scales (float32, rounded to x's dtype: dequantize-then-matmul's rounding), multiplied by the matching activations
    x[:, gi g + 2 (g / 8) j + 2 i + h] in one product of depth K / 8 with float32 results, the 8 summed. The lead's
    int8 head probe found this form (32-bit words, shift planes) free of the whole-table relayout (issue 43's TPU
    notes)."""
    r, g_, run = x.shape[0], k // group, group // 8
    x_p = x.reshape(r, g_, 4, run, 2)  # (r, G, j, i, h): K index 2 run j + 2 i + h
    w = words.reshape(g_, run, n)
    s = scales.astype(jnp.float32)[:, None, :]
    y = None
    for p in range(8):
        q = ((((w >> (4 * p)) & 15) - 8).astype(jnp.float32) * s).astype(x.dtype).reshape(g_ * run, n)
        d = jnp.dot(x_p[:, :, p % 4, :, p // 4].reshape(r, g_ * run), q, preferred_element_type=jnp.float32)
        y = d if y is None else y + d
    return y.astype(x.dtype)


def _tilings(k: int, n: int, rows: int, extra: list[TpuTiling], alternatives: int) -> list[tuple[str, TpuTiling]]:
    """(label, tiling): the planned one, up to `alternatives` other fitting candidates with another (bn, bk), the
    vector-unit variant where `rows` <= `fit_tpu.VPU_MAX_ROWS` (the first candidate whose need fits with
    vpu_rows = rows), the --tiling ones that tile the shape."""
    import dataclasses

    p = fit.Projection(field="probe", k=k, n=n, axis=0, group=128)
    limit = fit_tpu.budget(fit_tpu.vmem_capacity("v5e"))
    planned = fit_tpu.choose_tpu(p, limit).tiling
    if rows <= fit_tpu.VPU_MAX_ROWS:
        for t in fit_tpu.candidates_tpu(p):
            vpu = dataclasses.replace(t, vpu_rows=rows)
            if fit_tpu.need_tpu(vpu, group=128).total <= limit:
                extra = [vpu, *extra]
                break
    out = [("planned", planned)] if planned else []
    seen = {(planned.bn, planned.bk)} if planned else set()
    for t in fit_tpu.candidates_tpu(p):
        if len(out) > alternatives:
            break
        if (t.bn, t.bk) not in seen and fit_tpu.need_tpu(t, group=128).total <= limit:
            seen.add((t.bn, t.bk))
            out.append(("alternative", t))
    out += [("vpu" if t.vpu_rows else "given", t) for t in extra if fit_tpu.fits_tpu(k, n, 128, t)]
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,128,8,32", help="activation rows, comma-separated, in the order run "
                    "(default 1,128,8,32: decode and the largest batch first, should --budget-s stop the rest)")
    ap.add_argument("--shapes", default="default", help="default (one per projection kind), all (E2B's 12) or "
                    "K:N:AXIS[,K:N:AXIS]")  # fmt: skip
    ap.add_argument("--small", action="store_true", help="small shapes (CPU check)")
    ap.add_argument("--quick", action="store_true", help="the least that decides: gate_up, down and qkv shapes, rows "
                    "1 and 128, the planned tiling and XLA's product only, 20 timed calls, --budget-s 60")  # fmt: skip
    ap.add_argument("--tiling", action="append", default=[], help="a tiling to try too, e.g. 'tpu bm16 bn1024 "
                    "bk1536' (repeatable; used where it tiles the shape)")  # fmt: skip
    ap.add_argument("--alternatives", type=int, default=0, help="other fitting tilings tried per shape (default 0)")
    ap.add_argument("--reps", type=int, default=20, help="products per timed program (default 20)")
    ap.add_argument("--iters", type=int, default=50, help="timed calls per program (median; default 50)")
    ap.add_argument("--budget-s", type=float, default=180.0, help="no new case after this many seconds")
    ap.add_argument("--no-xla", action="store_true", help="skip XLA's product")
    ap.add_argument("--scale-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="the kernel's scales (the engine's default: bfloat16; float32 to see whether Mosaic "
                    "takes 8-row 16-bit scale tiles worse)")  # fmt: skip
    ap.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for w4a16_tpu.json (default $OUT)")
    a = ap.parse_args(argv)
    if a.quick:
        a.rows, a.iters, a.budget_s, a.alternatives = "1,128", 20, min(a.budget_s, 60.0), 0
    try:
        rows = [int(r) for r in a.rows.split(",")]
        extra = [fit_tpu.parse_tpu_tiling(t) for t in a.tiling]
        if a.small:
            shapes = SMALL_SHAPES
        elif a.quick:
            shapes = {f: E2B_SHAPES[f] for f in ("gate_up_DX", "down_DF", "qkv_DX")}
        elif a.shapes == "default":
            shapes = E2B_SHAPES
        elif a.shapes == "all":
            shapes = _all_e2b_shapes()
        else:
            shapes = {s: tuple(int(v) for v in s.split(":")) for s in a.shapes.split(",")}
            assert all(len(v) == 3 and v[2] in (0, 1) for v in shapes.values())
    except (ValueError, AssertionError) as exc:
        print(f"error: bad argument ({exc}); expected e.g. --rows 1,8 --shapes 1536:2048:0 --tiling "
              "'tpu bm16 bn1024 bk1536'", file=sys.stderr)  # fmt: skip
        return 2
    start = time.perf_counter()
    dev = jax.devices()[0]
    res = {"jax": jax.__version__, "platform": dev.platform, "device_kind": str(dev.device_kind),
           "interpret": a.interpret, "scale_dtype": a.scale_dtype, "reps": a.reps, "iters": a.iters,
           "budget_bytes": fit_tpu.budget(),
           "scoped_vmem_limit": fit_tpu.SCOPED_VMEM, "cases": [], "skipped": []}  # fmt: skip
    try:
        from jax.experimental.pallas import tpu as pltpu

        res["vmem_capacity_bytes"] = int(pltpu.get_tpu_info().vmem_capacity_bytes)
    except Exception as exc:  # noqa: BLE001 - not a TPU (CPU check), or an older jax
        res["vmem_capacity_bytes"] = f"unknown ({type(exc).__name__}: {str(exc)[:120]})"
    print(f"w4a16_tpu probe: jax {jax.__version__}, {dev.platform} {dev.device_kind!r}, VMEM "
          f"{res['vmem_capacity_bytes']}", flush=True)  # fmt: skip
    key = jax.random.PRNGKey(0)
    leaves = {}
    for name, (k, n, axis) in shapes.items():
        key, kw = jax.random.split(key)
        w = jax.random.normal(kw, (k, n) if axis == 0 else (n, k), jnp.float32) / np.sqrt(k)
        q = quantize_channels(w, 4, axis, 128)
        words, scales = to_tpu(q.values, q.scales, tuple(q.shape), axis, 128)
        scales = scales.astype(jnp.float32) if a.scale_dtype == "float32" else scales
        w_KN = dequantize(q, jnp.float32)
        leaves[name] = (k, n, axis, q, words, scales, w_KN if axis == 0 else w_KN.T)
    spec = {0: "RK,KN->RN", 1: "RK,NK->RN"}
    for r in rows:
        for name, (k, n, axis, q, words, scales, w_KN) in leaves.items():
            key, kx = jax.random.split(key)
            x = jax.random.normal(kx, (r, k), jnp.float32).astype(jnp.bfloat16)
            ref = jnp.dot(x.astype(jnp.float32), w_KN, precision=jax.lax.Precision.HIGHEST)
            max_ref = float(jnp.max(jnp.abs(ref)))
            nbytes = packed_bytes(q)
            variants = _tilings(k, n, r, extra, a.alternatives)
            if a.quick:
                variants = [v for v in variants if v[0] == "planned"]
            if not a.no_xla:
                variants += [("xla", None)] + ([] if a.quick else [("xla_words", None)])
            for label, t in variants:
                if time.perf_counter() - start > a.budget_s:
                    res["skipped"].append({"field": name, "rows": r, "variant": label})
                    continue
                case = {"field": name, "k": k, "n": n, "axis": axis, "rows": r, "variant": label,
                        "impl": "xla" if t is None else "pallas", "tiling": t.text if t else None,
                        "weight_bytes": nbytes,
                        "vmem_need": fit_tpu.need_tpu(t, group=128).total if t else None}  # fmt: skip
                try:
                    t0 = time.perf_counter()
                    if label == "xla_words":
                        product = lambda xx, ww, ss, k=k, n=n: xla_words(xx, ww, ss, k=k, n=n, group=128)  # noqa: E731
                        args = (x, words, scales)
                        wshape = f"s32[{k // 8},{n}]"
                    elif t is None:
                        product = lambda xx, qq: matmul(xx, qq, spec[axis])  # noqa: E731
                        args = (x, q)
                        wshape = f"u8[{','.join(str(d) for d in q.values.shape)}]"
                    else:
                        product = lambda xx, ww, ss, t=t, k=k, n=n: w4a16_tpu_matmul(  # noqa: E731
                            xx, ww, ss, k=k, n=n, group=128, tiling=t, interpret=a.interpret)
                        args = (x, words, scales)
                        wshape = f"s32[{k // 8},{n}]"
                    compiled = jax.jit(product).lower(*args).compile()
                    case["compile_s"] = time.perf_counter() - t0
                    case["weight_copies"] = _copies(compiled.as_text() or "", wshape)
                    y = compiled(*args)
                    err = float(jnp.max(jnp.abs(y.astype(jnp.float32) - ref)))
                    case.update(max_abs_err=err, max_abs_ref=max_ref, rel_err=err / max_ref if max_ref else None)
                    case.update(_time(product, compiled, args, a.reps, a.iters))
                    case["gbps"] = nbytes / (case["ms"] * 1e-3) / 1e9 if case["ms"] > 0 else None
                except Exception as exc:  # noqa: BLE001 - a Mosaic error is a finding: record it, go on
                    case["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
                res["cases"].append(case)
                shown = (f"error {case['error'][:300]}" if "error" in case else
                         f"{case['ms']:.4f} ms/product ({case['gbps'] or 0:.0f} GB/s), single call "
                         f"{case['single_call_ms']:.3f} ms, rel err {case['rel_err']:.2e}, compile "
                         f"{case['compile_s']:.1f} s, weight copies {len(case['weight_copies'])}")  # fmt: skip
                print(f"{name:>12} K={k:<5} N={n:<5} rows={r:<3} {label:>11} {case['tiling'] or 'xla':<30} {shown}",
                      flush=True)  # fmt: skip
    res["wall_s"] = time.perf_counter() - start
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "w4a16_tpu.json")
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"wrote {path} ({len(res['cases'])} cases, {len(res['skipped'])} skipped by --budget-s, "
          f"{res['wall_s']:.0f} s)", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
