"""Decode attention through the engine's CPU kernel (`model.backends.cpu.kernels.decode_attention`, cpu_bf16.cc):
the same function as XLA's products in `model.layers.attend_one` (every G it is compiled for, prefix and scattered
masks, head sizes with tails), only visible positions read, `attend_one` taking it where the "cpu-kernels" backend
is asked for and it applies and not elsewhere (never under the default, pure-JAX backend), and an engine that uses
it: its manifest name, its bytes per step, and the greedy tokens of the pure-JAX engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import backends
from model.backends.cpu import kernels as cpu
from model.layers import attend, attend_one

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU kernels")


def _case(seed: int, b: int, k: int, g: int, s: int, h: int, mask: str):
    """q [B,K,G,H], k/v [B,K,S,H] float32 random normal, mask [B,S]: "prefix" (row b sees slots 0..p_b, as a full
    layer), "scattered" (a random subset with slot 0, as a sliding layer's ring), or "all"."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, k, g, h)), jnp.float32)
    kc = jnp.asarray(rng.standard_normal((b, k, s, h)), jnp.float32)
    vc = jnp.asarray(rng.standard_normal((b, k, s, h)), jnp.float32)
    if mask == "prefix":
        m = np.arange(s)[None, :] <= rng.integers(0, s, size=b)[:, None]
    elif mask == "scattered":
        m = rng.random((b, s)) < 0.6
        m[:, 0] = True
    else:
        m = np.ones((b, s), bool)
    return q, kc, vc, jnp.asarray(m)


def _xla(q_BKGH, k_BKSH, v_BKSH, mask_BS):
    """The reference: `attend` (query-major, XLA's products, no kernel) on the same operands, [B,K,G,H]."""
    b, k, g, h = q_BKGH.shape
    q_B1NH = q_BKGH.reshape(b, 1, k * g, h)
    return attend(q_B1NH, k_BKSH, v_BKSH, mask_BS[:, None, :]).reshape(b, k, g, h)


@pytest.mark.parametrize(("b", "k", "g", "s", "h", "mask"), [
    (1, 1, 8, 4160, 512, "prefix"),  # the default preset's full layer at 3593 tokens: 17 chunks of 256
    (1, 1, 8, 512, 256, "scattered"),  # a sliding layer's ring
    (3, 1, 8, 300, 256, "prefix"),  # rows of their own lengths (batches, decode slots)
    (2, 2, 4, 257, 48, "scattered"),  # a chunk of one position; H with a 16-lane tail past the 32-lane blocks
    (1, 4, 2, 40, 20, "all"),  # H below one 32-lane block
    (2, 1, 1, 600, 64, "prefix"),
])  # fmt: skip
def test_the_kernel_computes_what_xlas_products_compute(cpu_kernels_built, b, k, g, s, h, mask):
    q, kc, vc, m = _case(b * 1000 + s, b, k, g, s, h, mask)
    got = jax.jit(cpu.decode_attention)(q, kc, vc, m)
    want = _xla(q, kc, vc, m)
    assert got.shape == (b, k, g, h) and got.dtype == jnp.float32
    # float32 sums in another order, over scores of size ~sqrt(H), as tests/test_decode_forms.py allows
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


def test_masked_positions_are_never_read_and_a_row_with_none_visible_is_zero(cpu_kernels_built):
    q, kc, vc, m = _case(7, 2, 1, 8, 700, 64, "prefix")
    m = m.at[1].set(False)  # row 1 sees nothing
    hidden = ~np.asarray(m)[:, None, :, None]
    poisoned = [jnp.where(hidden, jnp.nan, c) for c in (kc, vc)]  # NaN wherever the mask hides a position
    got = np.asarray(jax.jit(cpu.decode_attention)(q, *poisoned, m))
    assert np.isfinite(got).all() and not got[1].any()
    np.testing.assert_array_equal(got[0], np.asarray(jax.jit(cpu.decode_attention)(q, kc, vc, m))[0])


def test_nan_and_infinite_scores_give_nan_as_xlas_softmax_does_and_spare_the_other_heads(cpu_kernels_built):
    q, kc, vc, m = _case(9, 1, 1, 2, 600, 32, "all")  # 3 chunks
    run = jax.jit(cpu.decode_attention)
    kc = jnp.abs(kc) + 0.1  # positive keys: a query of -inf scores -inf everywhere
    for bad in (jnp.nan, -jnp.inf):
        q_bad = q.at[0, 0, 0].set(bad)  # head 0's query only
        got, want = np.asarray(run(q_bad, kc, vc, m)), np.asarray(_xla(q_bad, kc, vc, m))
        assert np.isnan(want[0, 0, 0]).all() and np.isnan(got[0, 0, 0]).all()
        np.testing.assert_allclose(got[0, 0, 1], want[0, 0, 1], rtol=1e-4, atol=1e-4)  # the other head as XLA's
    assert np.isnan(np.asarray(run(q, kc.at[0, 0, 256:512].set(jnp.nan), vc, m))).all()  # a whole chunk of NaN keys
    only = jnp.asarray(np.arange(600)[None, :] == 300)  # the one visible position's key is NaN
    assert np.isnan(np.asarray(run(q, kc.at[0, 0, 300].set(jnp.nan), vc, only))).all()


def test_with_rows_each_query_reads_its_cache_row_in_place(cpu_kernels_built):
    q, kc, vc, m = _case(5, 3, 1, 8, 520, 64, "prefix")
    cache_k, cache_v = [jnp.concatenate([c, -c], axis=0) for c in (kc, vc)]  # 6 cache rows, 3 of them decoded
    rows = jnp.asarray([4, 0, 2], jnp.int32)
    got = jax.jit(cpu.decode_attention)(q, cache_k, cache_v, m, rows)
    want = _xla(q, jnp.take(cache_k, rows, axis=0), jnp.take(cache_v, rows, axis=0), m)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    q_B1NH = q.reshape(3, 1, 8, 64)  # attend_one with rows: the kernel reads in place, XLA's products a gathered copy
    with backends.using(backends.CPU_KERNELS):
        assert "gemma4_decode_attention_rows" in _targets(q_B1NH, cache_k, cache_v, m, rows)
    assert "gemma4_decode_attention" not in _targets(q_B1NH, cache_k, cache_v, m, rows)  # the default: pure JAX
    with pytest.raises(Exception, match="a row index outside the cache's rows"):
        jax.block_until_ready(jax.jit(cpu.decode_attention)(q, cache_k, cache_v, m, jnp.asarray([4, 6, 0], jnp.int32)))


def _targets(*args) -> str:
    return jax.jit(lambda *a: attend_one(*a)).lower(*args).as_text()  # a new function: a new trace


def test_attend_one_takes_the_kernel_where_it_applies_and_xlas_products_elsewhere(cpu_kernels_built, monkeypatch):
    q, kc, vc, m = _case(1, 1, 1, 8, 64, 32, "prefix")
    q_B1NH = q.reshape(1, 1, 8, 32)
    assert "gemma4_decode_attention" not in _targets(q_B1NH, kc, vc, m)  # the default: pure JAX
    with backends.using(backends.CPU_KERNELS):
        assert "gemma4_decode_attention" in _targets(q_B1NH, kc, vc, m)
        got = jax.jit(lambda *a: attend_one(*a))(q_B1NH, kc, vc, m)
        np.testing.assert_allclose(np.asarray(got).reshape(q.shape), np.asarray(_xla(q, kc, vc, m)), rtol=1e-4,
                                   atol=1e-4)  # fmt: skip
        bf16 = [a.astype(jnp.bfloat16) for a in (q_B1NH, kc, vc)]  # a bfloat16 cache: XLA's products
        assert "gemma4_decode_attention" not in _targets(*bf16, m)
        q3 = jnp.ones((1, 1, 3, 32), jnp.float32)  # G = 3: not compiled for it
        assert "gemma4_decode_attention" not in _targets(q3, kc, vc, m)
        monkeypatch.setenv(cpu.ATTENTION_SWITCH, "off")
        assert "gemma4_decode_attention" not in _targets(q_B1NH, kc, vc, m)
        rows = jnp.asarray([0], jnp.int32)  # XLA's products of a gathered copy of the rows
        got = jax.jit(lambda *a: attend_one(*a))(q_B1NH, kc, vc, m, rows)
    np.testing.assert_allclose(np.asarray(got).reshape(q.shape), np.asarray(_xla(q, kc, vc, m)), rtol=1e-4, atol=1e-4)
    plan = cpu.plan(weight_dtype="float32", activation_dtype="float32", kv_dtype="float32")
    assert not plan.attention and plan.kernel is None
    off_line = f"decode attention: XLA's products over the whole KV cache ({cpu.ATTENTION_SWITCH} off)"
    assert ("info", off_line) in plan.lines
    monkeypatch.setenv(cpu.ATTENTION_SWITCH, "of")
    with pytest.raises(Exception, match=f"{cpu.ATTENTION_SWITCH}='of': expected 1/true/on/yes or 0/false/off/no"):
        cpu.check_switches()


def test_the_attention_plan_applies_to_float32_caches_on_cpu_only(cpu_kernels_built):
    on = cpu.plan(weight_dtype="float32", activation_dtype="float32", kv_dtype="float32")
    assert on.attention and on.kernel == cpu.ATTENTION_KERNEL
    assert any("reading the visible positions only" in line for _, line in on.lines)
    off = cpu.plan(weight_dtype="bfloat16", activation_dtype="bfloat16", kv_dtype="bfloat16")
    assert not off.attention and not off.bf16 and off.kernel is None
    assert off.lines[-1][0] == "warning" and "no kernel applies" in off.lines[-1][1]
    with pytest.raises(Exception, match="--backend cpu-kernels: the engine's CPU kernels run on the CPU platform only"):
        backends.plan_backend(backends.CPU_KERNELS, "gpu", weight_dtype="float32", activation_dtype="float32",
                              kv_dtype="float32")  # fmt: skip
    assert backends.plan_backend("jax", "cpu", weight_dtype="float32", activation_dtype="float32",
                                 kv_dtype="float32") == backends.BackendPlan()  # fmt: skip


_TOKENS = """
import json, sys
from model.builtin import ensure_builtin
from model.engine import load_engine
from model.policy import decide_policy, with_backend
engine, _ = load_engine(ensure_builtin("tiny"), policy=with_backend(decide_policy(), sys.argv[1]))
prompt = [2, 17, 99, 5, 300, 41, 7, 8, 250, 3] * 5
print(json.dumps({"kernel": engine.cpu_kernel, "host": engine.generate(prompt, 24).token_ids,
                  "device": engine.generate(prompt, 24, decode_loop="device").token_ids,
                  "batch": engine.generate_batch([prompt, prompt[:17]], 8).token_ids,
                  "bytes": engine.decode_bytes(len(prompt), 24)}))
"""


def _engine_facts(backend: str) -> dict:
    """What the tiny preset's float32 engine of `backend` says and decodes in a fresh process."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop(cpu.ATTENTION_SWITCH, None)
    out = subprocess.run([sys.executable, "-c", _TOKENS, backend], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_engine_with_the_kernel_decodes_the_tokens_of_the_engine_without_it_and_counts_what_it_reads(
        cpu_kernels_built):  # fmt: skip
    from model.accounting import kv_read_bytes
    from model.config import TINY
    on, off = _engine_facts(backends.CPU_KERNELS), _engine_facts("jax")
    assert on["kernel"] == cpu.ATTENTION_KERNEL and off["kernel"] is None
    assert (on["host"], on["device"], on["batch"]) == (off["host"], off["device"], off["batch"])
    assert on["host"] == on["device"]
    # bytes per step: the kernel reads the positions a step sees (50 + 24 // 2 on average), XLA the whole buffer
    assert on["bytes"]["weights"] == off["bytes"]["weights"]
    assert on["bytes"]["kv_cache"] == kv_read_bytes(TINY, 50 + 12, 4) < off["bytes"]["kv_cache"]
