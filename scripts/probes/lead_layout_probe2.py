"""Lead's probe 2: placing 8-bit parameters in the layout the compiled program wants (jax's layout API)."""
import json, os, re, sys, time
import numpy as np
import jax, jax.numpy as jnp
import jax.experimental.layout as L

OUT = os.environ.get("OUT", "/tmp")
SMALL = "--small" in sys.argv
R = 4096 if SMALL else 262144
res = {"jax": jax.__version__, "layout_api": [n for n in dir(L) if not n.startswith("_")]}
print(res, flush=True)
Format, Layout = L.Format, L.Layout


def copies(hlo):
    return [l.strip()[:200] for l in hlo.splitlines() if re.search(r" copy\(", l) and "s32[1]" not in l]


def timeit(f, *args, n=30):
    for _ in range(2):
        jax.block_until_ready(f(*args))
    ts = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f(*args)); ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def run(name, fn, tbl, *rest):
    auto = jax.jit(fn, in_shardings=(Format(Layout.AUTO),) + (None,) * len(rest))
    comp = auto.lower(tbl, *rest).compile()
    fmt = comp.input_formats[0][0]
    placed = jax.device_put(tbl, fmt)
    d = {"format": str(fmt)[:300], "copies_auto": copies(comp.as_text()), "ms_auto": timeit(comp, placed, *rest)}
    plain = jax.jit(fn)
    d["copies_default"] = copies(plain.lower(tbl, *rest).compile().as_text())
    d["ms_default"] = timeit(plain, tbl, *rest)
    res[name] = d
    print(name, json.dumps(d), flush=True)


key = jax.random.PRNGKey(0)
ids = jnp.array([123], jnp.int32)
x = jnp.ones((1, 1536), jnp.bfloat16)
head = jax.random.randint(key, (R, 1536), -127, 128, jnp.int32).astype(jnp.int8)
sc = jnp.ones((R,), jnp.bfloat16)
try:
    run("head_s8_both", lambda q, s, x, i: ((x @ q.astype(jnp.bfloat16).T) * s,
                                           jnp.take(q, i, axis=0).astype(jnp.bfloat16)), head, sc, x, ids)
    run("head_s8_matmul", lambda q, s, x: (x @ q.astype(jnp.bfloat16).T) * s, head, sc, x)
except Exception as e:
    res["head_error"] = repr(e)[:1500]; print("head error", repr(e)[:1500])
del head
ple = jax.random.randint(key, (R, 4480), 0, 256, jnp.int32).astype(jnp.uint8)
try:
    run("ple_u8_take", lambda t, i: jnp.take(t, i, axis=0).astype(jnp.bfloat16), ple, ids)
except Exception as e:
    res["ple_error"] = repr(e)[:1500]; print("ple error", repr(e)[:1500])
# floor: an almost empty program
res["floor_ms"] = timeit(jax.jit(lambda i: i + 1), ids)
print("floor", res["floor_ms"])
with open(os.path.join(OUT, "lead_layout_probe2.json"), "w") as fh:
    json.dump(res, fh, indent=1)
