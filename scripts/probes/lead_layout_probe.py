"""Lead's quick TPU probe (2026-12-07): do row gathers from 8-bit tables relayout the whole table on a TPU, and does
a 32-bit container avoid it? Plus an XLA read-only reduction and a simple Pallas streaming read. Writes JSON to $OUT."""
import json, os, re, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax import lax

OUT = os.environ.get("OUT", "/tmp")
SMALL = "--small" in sys.argv
R = 4096 if SMALL else 262144
res = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind)}


def copies(hlo):
    out = []
    for line in hlo.splitlines():
        s = line.strip()
        if re.search(r"= \S+ (copy|transpose|copy-start|bitcast-convert)\(", s) or " copy(" in s:
            out.append(s[:240])
    return out


def timeit(f, *args, n=30):
    r = f(*args); jax.block_until_ready(r)
    r = f(*args); jax.block_until_ready(r)
    ts = []
    for _ in range(n):
        t = time.perf_counter(); r = f(*args); jax.block_until_ready(r); ts.append(time.perf_counter() - t)
    return float(np.median(ts)), float(np.min(ts))


def probe(name, f, *args, nbytes=None):
    jf = jax.jit(f)
    hlo = jf.lower(*args).compile().as_text()
    med, mn = timeit(jf, *args)
    d = {"copies": copies(hlo), "median_ms": med * 1e3, "min_ms": mn * 1e3}
    if nbytes:
        d["GBps_median"] = nbytes / med / 1e9
    res[name] = d
    print(name, json.dumps(d)[:1500], flush=True)


def unpack_u8(row_u8):  # [..., n] u8 -> [..., 2n] bf16 (low nibble first, two's complement)
    lo = (row_u8 & 0xF).astype(jnp.int8); hi = (row_u8 >> 4).astype(jnp.int8)
    lo = jnp.where(lo > 7, lo - 16, lo); hi = jnp.where(hi > 7, hi - 16, hi)
    return jnp.stack([lo, hi], -1).reshape(row_u8.shape[:-1] + (-1,)).astype(jnp.bfloat16)


key = jax.random.PRNGKey(0)
ids = jnp.array([12345 % R], jnp.int32)
# 1. packed PLE table, u8 [R, 4480] vs u32 [R, 1120]
ple_u8 = jax.random.randint(key, (R, 4480), 0, 256, jnp.int32).astype(jnp.uint8)
probe("ple_u8_take", lambda t, i: unpack_u8(jnp.take(t, i, axis=0)), ple_u8, ids)
probe("ple_u8_dynslice", lambda t, i: unpack_u8(lax.dynamic_slice_in_dim(t, i[0], 1, 0)), ple_u8, ids)
ple_u32 = lax.bitcast_convert_type(ple_u8.reshape(R, 1120, 4), jnp.uint32)
del ple_u8
probe("ple_u32_take", lambda t, i: unpack_u8(lax.bitcast_convert_type(jnp.take(t, i, axis=0), jnp.uint8).reshape(1, -1)), ple_u32, ids)
def shifts(t, i):
    w = jnp.take(t, i, axis=0)  # [1, 1120] u32
    nib = jnp.stack([(w >> (4 * k)) & 0xF for k in range(8)], -1).astype(jnp.int32)
    nib = jnp.where(nib > 7, nib - 16, nib)
    return nib.reshape(1, -1).astype(jnp.bfloat16)
probe("ple_u32_shifts", shifts, ple_u32, ids)
del ple_u32
# 2. int8 head / tied embedding: s8 [R, 1536]
head = jax.random.randint(key, (R, 1536), -127, 128, jnp.int32).astype(jnp.int8)
sc = jnp.ones((R,), jnp.bfloat16)
x = jnp.ones((1, 1536), jnp.bfloat16)
hb = R * 1536
probe("head_s8_matmul", lambda q, s, x: (x @ q.astype(jnp.bfloat16).T) * s, head, sc, x, nbytes=hb)
probe("head_s8_take", lambda q, s, i: jnp.take(q, i, axis=0).astype(jnp.bfloat16) * jnp.take(s, i)[:, None], head, sc, ids)
probe("head_s8_both", lambda q, s, x, i: ((x @ q.astype(jnp.bfloat16).T) * s, jnp.take(q, i, axis=0).astype(jnp.bfloat16)), head, sc, x, ids, nbytes=hb)
probe("head_s8_dot_general_f32acc", lambda q, s, x: lax.dot_general(x, q.astype(jnp.bfloat16), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * s, head, sc, x, nbytes=hb)
head32 = lax.bitcast_convert_type(head.reshape(R, 384, 4), jnp.int32)
del head
probe("head_s32_take", lambda q, i: lax.bitcast_convert_type(jnp.take(q, i, axis=0), jnp.int8).reshape(1, -1).astype(jnp.bfloat16), head32, ids)
probe("head_s32_matmul", lambda q, s, x: (x @ lax.bitcast_convert_type(q, jnp.int8).reshape(R, 1536).astype(jnp.bfloat16).T) * s, head32, sc, x, nbytes=hb)
del head32
# 3. dense bf16 head for reference
hbf = jax.random.normal(key, (R, 1536), jnp.bfloat16)
probe("head_bf16_matmul", lambda w, x: x @ w.T, hbf, x, nbytes=hb * 2)
del hbf
# 4. read-only streaming: XLA reduction and a Pallas kernel
n = (1 << 20) if SMALL else (1 << 30)  # bf16 elements: 2 GiB
big = jnp.ones((n // 1024, 1024), jnp.bfloat16)
probe("xla_sum_bf16", lambda a: jnp.sum(a, dtype=jnp.float32), big, nbytes=n * 2)
try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    for bm in (512, 2048, 4096):
        def kern(x_ref, o_ref):
            @pl.when(pl.program_id(0) == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)
            o_ref[...] += jnp.sum(x_ref[...].astype(jnp.float32).reshape(bm // 8, 8, 1024), axis=0)
        rows = n // 1024
        f = pl.pallas_call(kern, grid=(rows // bm,), in_specs=[pl.BlockSpec((bm, 1024), lambda i: (i, 0))],
                           out_specs=pl.BlockSpec((8, 1024), lambda i: (0, 0)),
                           out_shape=jax.ShapeDtypeStruct((8, 1024), jnp.float32),
                           interpret=SMALL)
        probe(f"pallas_stream_bm{bm}", f, big, nbytes=n * 2)
except Exception as e:  # noqa
    res["pallas_error"] = repr(e)[:2000]
    print("pallas error", repr(e)[:2000])
with open(os.path.join(OUT, "lead_layout_probe.json"), "w") as fh:
    json.dump(res, fh, indent=1)
