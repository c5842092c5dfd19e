"""Lead's probe 3: int8 head/tied-embedding layouts that neither the product nor the row gather relayouts."""
import json, os, re, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax import lax

OUT = os.environ.get("OUT", "/tmp")
SMALL = "--small" in sys.argv
R = 4096 if SMALL else 262144
T0 = time.time()
res = {"jax": jax.__version__}


def copies(hlo):
    return [l.strip()[:160] for l in hlo.splitlines() if re.search(r" (copy|transpose)\(", l) and "s32[1]" not in l]


def timeit(f, *args, n=30):
    for _ in range(2):
        jax.block_until_ready(f(*args))
    ts = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f(*args)); ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def probe(name, fn, *args):
    jf = jax.jit(fn)
    d = {"copies": copies(jf.lower(*args).compile().as_text()), "ms": timeit(jf, *args), "t": time.time() - T0}
    res[name] = d
    print(name, json.dumps(d), flush=True)


res["floor_ms"] = timeit(jax.jit(lambda i: i + 1), jnp.ones((1,), jnp.int32))
print("floor", res["floor_ms"], time.time() - T0, flush=True)
ids = jnp.array([123], jnp.int32)
x = jnp.ones((1, 1536), jnp.bfloat16)
x8 = jnp.ones((8, 1536), jnp.bfloat16)
sc = jnp.ones((R,), jnp.bfloat16)
rng = np.random.default_rng(0)
qT = jax.device_put(rng.integers(-127, 128, (1536, R), dtype=np.int8))
print("made", time.time() - T0, flush=True)
probe("headT_matmul", lambda q, s, x: (x @ q.astype(jnp.bfloat16)) * s, qT, sc, x)
probe("headT_matmul_b8", lambda q, s, x: (x @ q.astype(jnp.bfloat16)) * s, qT, sc, x8)
probe("headT_take_col", lambda q, s, i: jnp.take(q, i, axis=1).T.astype(jnp.bfloat16) * s[i][:, None], qT, sc, ids)
probe("headT_both", lambda q, s, x, i: ((x @ q.astype(jnp.bfloat16)) * s,
                                        jnp.take(q, i, axis=1).T.astype(jnp.bfloat16)), qT, sc, x, ids)
del qT
w = jax.device_put(rng.integers(-2**31, 2**31 - 1, (R, 384), dtype=np.int64).astype(np.int32))


def planes(w, s, x):  # 4 int8 planes by arithmetic shifts: plane k holds columns 4j+k
    acc = 0
    for k in range(4):
        p = ((w << (24 - 8 * k)) >> 24).astype(jnp.bfloat16)
        acc = acc + lax.dot_general(x[:, k::4], p, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return acc * s


probe("head_s32_planes", planes, w, sc, x)
probe("head_s32_take", lambda w, i: ((jnp.take(w, i, axis=0)[..., None] << jnp.array([24, 16, 8, 0])) >> 24)
      .reshape(1, -1).astype(jnp.bfloat16), w, ids)
del w
qb = jax.device_put(rng.standard_normal((R, 1536), dtype=np.float32).astype(jnp.bfloat16))
probe("head_bf16_matmul", lambda w, x: x @ w.T, qb, x)
with open(os.path.join(OUT, "lead_layout_probe3.json"), "w") as fh:
    json.dump(res, fh, indent=1)
