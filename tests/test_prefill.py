"""Chunked prefill on tiny configs: the last-position logits equal one full forward and the cache equals the
invariant's (model/cache.py) at chunk edges, padding is never written, and the FLOP count matches a hand count."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.cache import init_cache, ring_positions
from model.config import TINY
from model.flops import prefill_chunk, prefill_flops
from model.forward import forward_full
from model.forward import prefill as _prefill
from model.layers import project_qkv, rms_norm, rope_tables
from model.params import init_params

WIDE = dataclasses.replace(TINY, sliding_window=24)  # a window larger than the chunks below
CONFIGS = {"tiny": TINY, "wide": WIDE}
prefill = jax.jit(_prefill, static_argnums=1, static_argnames=("chunk",))


@pytest.fixture(scope="module")
def params():
    return {name: jax.tree_util.tree_map(jnp.asarray, init_params(cfg, seed=0)) for name, cfg in CONFIGS.items()}


@pytest.fixture(scope="module")
def ids():
    return jnp.asarray(np.random.default_rng(3).integers(5, TINY.vocab_size, size=(1, 48)), jnp.int32)


@pytest.fixture(scope="module")
def reference(params, ids):
    """Per config: one uncached `forward_full` of all 48 ids, computed once for the module: (logits [48, V], and per
    cache layer (`cfg.cache_layers` order) its keys and values [K, 48, H] as `project_qkv` makes them from that
    layer's input residual). The pass is causal, so its rows at positions < n are the n-token forward's (the
    masked keys weigh exactly zero): a case slices them instead of running (and compiling, op by op) a forward
    at its own length."""
    out = {}
    for name, cfg in CONFIGS.items():
        p = params[name]
        logits_BTV, hidden = forward_full(p, cfg, ids, return_hidden=True)
        pos_BT = jnp.arange(ids.shape[1], dtype=jnp.int32)[None, :]
        rope = rope_tables(cfg, pos_BT, hidden.dtype)
        kv = []
        for i in cfg.cache_layers:
            lp = p.layers[i]
            _, k, v = project_qkv(lp, cfg, i, rms_norm(hidden[i], lp.attn_norm_D, cfg.rms_norm_eps), rope)
            kv.append((np.asarray(k), np.asarray(v)))
        out[name] = (np.asarray(logits_BTV[0]), kv)
    return out


def _expected_cache(reference, cfg, n, cache_len):
    """K/V of every cache layer as the invariant places them after n positions: full layers slot p = position
    p < n, zeros after; sliding layers slot s = `ring_positions(n, R)[s]`, zeros for an empty slot. From the
    module's one full forward (`reference`), its first n positions."""
    ks, vs = [], []
    for i, (k, v) in zip(cfg.cache_layers, reference, strict=True):
        slots = min(cfg.sliding_window, cache_len) if cfg.is_sliding(i) else cache_len
        pos_S = np.asarray(ring_positions(jnp.int32(n), slots)) if cfg.is_sliding(i) else np.arange(slots)
        held = (pos_S >= 0) & (pos_S < n)
        for x, out in ((k, ks), (v, vs)):
            gathered = x[:, :, np.clip(pos_S, 0, n - 1)]
            out.append(np.where(held[None, None, :, None], gathered, 0.0))
    return ks, vs


def _run(params, cfg, ids, n, bucket, chunk, extra=3, fill=0.0):
    """Prefill n real tokens of `ids` right-padded to `bucket` with the tokens after them (not the pad id),
    into a cache of bucket + extra slots that starts filled with `fill`."""
    padded = ids[:, :bucket]
    cache = init_cache(cfg, bucket + extra, jnp.float32)
    cache = jax.tree_util.tree_map(lambda x: jnp.full_like(x, fill), cache)
    return prefill(params, cfg, padded, jnp.int32(n), cache, chunk=chunk)


CASES = [
    # (config, chunk, n, bucket, extra); C = min(chunk, bucket, window)
    ("tiny", 256, 1, 8, 3),  # C = 8 (the window): one position
    ("tiny", 256, 7, 8, 3),  # C - 1
    ("tiny", 256, 8, 8, 3),  # C, the whole bucket
    ("tiny", 256, 9, 16, 3),  # C + 1: a second chunk of one real position
    ("tiny", 256, 16, 32, 3),  # exactly two chunks, padding after the boundary
    ("tiny", 256, 29, 32, 3),  # several chunks, the ring wraps
    ("tiny", 256, 32, 32, 3),  # the bucket itself
    ("tiny", 3, 20, 32, 3),  # chunks that do not divide the ring (scattered ring slots)
    ("wide", 5, 1, 40, 3),  # window 24 > C = 5
    ("wide", 5, 4, 40, 3),  # C - 1
    ("wide", 5, 5, 40, 3),  # C
    ("wide", 5, 6, 40, 3),  # C + 1
    ("wide", 5, 30, 40, 3),  # exactly six chunks: a chunk boundary
    ("wide", 5, 37, 40, 3),  # several chunks, the ring wraps
    ("wide", 5, 40, 40, 3),  # the bucket itself
    ("wide", 8, 33, 40, 3),  # C divides the ring of 24: ring blocks, the oldest masked whole for late queries
    ("wide", 5, 14, 16, 3),  # a ring of 19 < window 24 (never wraps) that C = 5 does not divide: ring blocks
    ("wide", 12, 40, 40, 3),  # C = 12 divides the ring of 24: two ring blocks per chunk once they are full
    ("wide", 5, 13, 13, 1),  # the last chunk runs past the cache's 14 slots (position 14 dropped)
    ("tiny", 8, 17, 32, 3),  # a tail chunk of 2 (C = 8: 16 + 2 positions, 1 real in the tail)
    ("tiny", 8, 26, 32, 3),  # a tail chunk of 2, both real; the ring of 8 wraps
    ("wide", 12, 26, 40, 3),  # a tail chunk of 3 after two chunks of 12: ring blocks of 3 slots
    ("wide", 12, 27, 40, 3),  # r = 3: the tail chunk exactly full
    ("wide", 12, 28, 40, 3),  # r = 4 > 3: a whole last chunk of 12, no tail
]


@pytest.mark.parametrize("name,chunk,n,bucket,extra", CASES)
def test_chunked_prefill_equals_full_forward_and_the_invariant_cache(params, ids, reference, name, chunk, n, bucket,
                                                                    extra):
    cfg, p = CONFIGS[name], params[name]
    out, cache = _run(p, cfg, ids, n, bucket, chunk, extra)
    full = reference[name][0][None, n - 1]  # [1, V]: the full forward's logits at the last real position
    np.testing.assert_allclose(out, full, rtol=0, atol=2e-5 * float(np.max(np.abs(full))))
    assert int(cache.length) == n
    ks, vs = _expected_cache(reference[name][1], cfg, n, bucket + extra)
    for got, want in zip(cache.k + cache.v, ks + vs, strict=True):
        assert got.shape == want.shape
        # float32 summation order of chunked prefill vs forward_full: wide-5-30-40-3 differed by 1.55e-5 at 1.33 on an
        # AVX-512 Xeon, with and without `model.backends.cpu.forms.split_form` (no one-row product in that case);
        # wide-5-37-40-3 by 1.17e-5 at 0.004 on a 2-core EPYC (XLA's attention and the CPU kernel alike): an error on
        # the scale of the cache's values, so the absolute tolerance follows that scale, as the logits' above
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))


@pytest.mark.parametrize("name,chunk,n", [("tiny", 256, 5), ("tiny", 3, 13), ("wide", 5, 13), ("wide", 5, 20)])
def test_padding_is_never_written_and_unwritten_slots_are_never_read(params, ids, reference, name, chunk, n):
    """A cache that starts full of 7.0: every slot without a real position keeps it (padding wrote nothing), and
    the logits still equal a full forward (nothing read it)."""
    cfg, p = CONFIGS[name], params[name]
    out, cache = _run(p, cfg, ids, n, 32, chunk, fill=7.0)
    full = reference[name][0][None, n - 1]
    np.testing.assert_allclose(out, full, rtol=0, atol=2e-5 * float(np.max(np.abs(full))))
    unheld = 0
    for j, i in enumerate(cfg.cache_layers):
        for buf in (np.asarray(cache.k[j]), np.asarray(cache.v[j])):
            slots = buf.shape[2]
            pos_S = np.asarray(ring_positions(jnp.int32(n), slots)) if cfg.is_sliding(i) else np.arange(slots)
            held = (pos_S >= 0) & (pos_S < n)
            assert np.all(buf[:, :, ~held] == 7.0) and not np.any(buf[:, :, held] == 7.0)
            unheld += int((~held).sum())
    assert unheld > 0  # the case has slots to check


def test_the_chunk_plan_ends_in_a_tail_chunk_when_the_rest_fits_one(monkeypatch):
    import model.flops
    from model.flops import prefill_chunks, prefill_tail

    assert (prefill_tail(128), prefill_tail(8), prefill_tail(12), prefill_tail(5), prefill_tail(4)) == (
        32, 2, 3, None, None)  # fmt: skip
    assert prefill_chunks(521, 128) == [(0, 128), (128, 128), (256, 128), (384, 128), (512, 32)]  # 544, not 640
    assert prefill_chunks(512 + 33, 128)[-1] == (512, 128)  # 33 left: more than a tail holds
    assert prefill_chunks(512, 128) == [(i * 128, 128) for i in range(4)]
    assert prefill_chunks(41, 64, bucket=64) == [(0, 64)]  # one chunk holds the bucket: no tail
    assert prefill_chunks(41, 128) == [(0, 128)]
    assert prefill_chunks(13, 5) == [(0, 5), (5, 5), (10, 5)]  # C = 5: no tail size
    # the FLOP count follows the plan: the tail's queries see R + 3 sliding and 24 + 3 full keys, not R + 12, 36
    tail_run = prefill_flops(WIDE, 26, 12, cache_len=43, bucket=40)
    whole = sum(q * (c0 + 12) for c0, q in [(0, 12), (12, 12), (24, 2)])
    tailed = sum(q * (c0 + u) for c0, u, q in [(0, 12, 12), (12, 12, 12), (24, 3, 2)])
    sliding = [i for i in WIDE.cache_layers if WIDE.is_sliding(i)]
    full = [i for i in WIDE.cache_layers if not WIDE.is_sliding(i)]
    from model.flops import _attention_flops_per_key

    fewer = sum(2 * 9 * _attention_flops_per_key(WIDE, i) for i in sliding)  # 2 tail queries x (12 - 3) keys
    fewer += sum((whole - tailed) * _attention_flops_per_key(WIDE, i) for i in full)
    assert fewer > 0
    monkeypatch.setattr(model.flops, "prefill_tail", lambda chunk: None)  # the plan without a tail chunk
    assert prefill_chunks(26, 12, bucket=40) == [(0, 12), (12, 12), (24, 12)]
    assert prefill_flops(WIDE, 26, 12, cache_len=43, bucket=40) - tail_run == fewer


def test_prefill_chunk_is_capped_by_bucket_and_window():
    assert prefill_chunk(TINY, 32) == 8 and prefill_chunk(TINY, 5) == 5 and prefill_chunk(WIDE, 40, 5) == 5
    assert prefill_chunk(WIDE, 40, 256) == 24
    with pytest.raises(ValueError, match="at least 1"):
        prefill_chunk(TINY, 32, 0)


def test_prefill_flops_equal_a_hand_count_on_tiny():
    """TINY (D 64, N 4, K 1, H 16/32, F 128/256, P 8, L 6, V 512, W 8), 10 tokens in chunks of 4, 16 slots."""
    per_position = (
        2 * 2 * (64 * 4 * 16 + 2 * 64 * 16 + 4 * 16 * 64 + 3 * 64 * 128 + 2 * 64 * 8)  # layers 0, 1 (sliding)
        + 2 * (64 * 4 * 32 + 2 * 64 * 32 + 4 * 32 * 64 + 3 * 64 * 128 + 2 * 64 * 8)  # layer 2 (full)
        + 2 * 64 * 6 * 8  # the PLE input projection
    )
    sliding_attention = 2 * 10 * (8 + 4) * 4 * 4 * 16  # 2 layers, 10 queries x (ring 8 + chunk 4) keys
    full_attention = (4 * 4 + 4 * 8 + 2 * 12) * 4 * 4 * 32  # chunks 0, 1, 2 (2 real queries) x their keys
    shared = (
        2 * (2 * (64 * 4 * 16 + 4 * 16 * 64 + 3 * 64 * 256 + 2 * 64 * 8) + 8 * 4 * 4 * 16)  # layers 3, 4: ring 8
        + 2 * (64 * 4 * 32 + 4 * 32 * 64 + 3 * 64 * 256 + 2 * 64 * 8) + 16 * 4 * 4 * 32  # layer 5: 16 slots
    )
    logits = 2 * 64 * 512
    want = 10 * per_position + sliding_attention + full_attention + shared + logits
    assert want == 2_959_360
    assert prefill_flops(TINY, 10, 4, cache_len=16) == want
    assert prefill_flops(TINY, 10, 4, cache_len=16) < prefill_flops(TINY, 11, 4, cache_len=16)
    # A bucket of one chunk reads no ring: 2 sliding layers x 3 queries x 8 ring keys fewer.
    one_chunk = prefill_flops(TINY, 3, 4, cache_len=8)
    assert prefill_flops(TINY, 3, 4, cache_len=8, bucket=8) - one_chunk == 2 * 3 * 8 * 4 * 4 * 16
    assert prefill_flops(TINY, 3, 4, cache_len=8, bucket=4) == one_chunk
    with pytest.raises(ValueError, match="at least 1"):
        prefill_flops(TINY, 0, 4)
