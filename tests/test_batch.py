"""Batched prefill and decode on the tiny config (float32 CPU): a row of a batch decodes the tokens of its prompt
alone, each row's cache keeps the invariant (model/cache.py) at its own length, the memory arithmetic refuses a
batch that does not fit before anything is allocated, and the batch size is a compiled shape (nothing else)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model.engine as engine_module
from model.accounting import BatchMemory, kv_cache_bytes, kv_cache_elements
from model.cache import init_cache, ring_positions
from model.config import TINY
from model.engine import BatchGeneration, CompileCounter, Engine, Sampling, memory_capacity
from model.errors import EngineError
from model.flops import decode_flops
from model.forward import forward_full
from model.forward import prefill as _prefill
from model.params import init_params
from model.policy import decide_policy
from model.quant import quantize_params
from model.quantspec import parse_quant

CFG = TINY  # sliding window 8, layers [S,S,F,S,S,F], 3 KV-shared layers
MAX_NEW = 12  # every row below wraps its ring of 8 while decoding (length + 12 > 8)
# Rows in the order the batches take them: a row padded far beyond the window (3 tokens in the bucket of 32: 29 pad
# positions > 8), a row longer than the window (its ring wraps during prefill), and two more lengths. One bucket
# (32), so B = 1 compiles one shape (padding beyond the window at B = 1 across buckets: tests/test_engine.py).
LENGTHS = (3, 20, 13, 9)


@pytest.fixture(scope="module")
def params():
    return jax.tree_util.tree_map(jnp.asarray, init_params(CFG, seed=0))


@pytest.fixture(scope="module")
def engine(params):
    return Engine(params, CFG, decide_policy("float32"), buckets=(32,))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(5, CFG.vocab_size, size=n).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def alone(engine, prompts):
    """Each prompt's greedy tokens at B = 1 (`generate`, its own bucket)."""
    return [engine.generate(p, MAX_NEW).token_ids for p in prompts]


HEAVY = pytest.mark.heavy


# B = 3 in `make test` (a row padded beyond the window, one whose ring wraps in prefill, a third length); 2 and 4
# repeat its path at other compiled batch sizes, in `make test-heavy`.
@pytest.mark.parametrize("batch", [pytest.param(2, marks=HEAVY), 3, pytest.param(4, marks=HEAVY)])
def test_each_row_of_a_batch_decodes_the_greedy_tokens_of_its_prompt_alone(engine, prompts, alone, batch):
    gen = engine.generate_batch(prompts[:batch], MAX_NEW)
    assert gen.batch == batch and gen.bucket == 32
    assert all(len(row) == MAX_NEW for row in gen.token_ids)
    differ = [b for b in range(batch) if gen.token_ids[b] != alone[b]]
    assert differ == [], f"rows {differ} differ from their prompts alone"
    assert len(set(map(tuple, gen.token_ids))) == batch  # different prompts, different streams: rows are not mixed


@pytest.mark.slow
def test_the_device_loop_and_sampling_give_each_row_its_single_sequence_tokens(engine, prompts):
    rows = prompts[:3]
    host = engine.generate_batch(rows, MAX_NEW)
    device = engine.generate_batch(rows, MAX_NEW, decode_loop="device", block=5)
    assert device.token_ids == host.token_ids and device.arrived == [0, 5, 10, 11]
    sampling = Sampling(temperature=0.9, top_k=40, top_p=0.9, seed=5)
    sampled = engine.generate_batch(rows, MAX_NEW, sampling)
    assert sampled.token_ids == [engine.generate(p, MAX_NEW, sampling).token_ids for p in rows]
    assert sampled.token_ids != host.token_ids


@pytest.mark.parametrize("bucket,lengths", [pytest.param(8, (3, 8, 1), marks=pytest.mark.slow), (32, (3, 20, 13, 32))])
def test_a_batch_prefill_gives_each_row_the_logits_of_its_prompt_in_one_full_forward(params, bucket, lengths):
    """Bucket 8 is one chunk (no loop, no ring read); bucket 32 is 4 chunks of 8, rows ending in different chunks
    (the 3-token row's last position in chunk 0, read back after 3 more chunks ran)."""
    rng = np.random.default_rng(5)
    ids = np.zeros((len(lengths), bucket), np.int32)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(5, CFG.vocab_size, size=n)
    cache = init_cache(CFG, bucket + 2, jnp.float32, batch=len(lengths))
    out_BV, cache = jax.jit(_prefill, static_argnums=1)(params, CFG, jnp.asarray(ids), jnp.asarray(lengths), cache)
    assert np.asarray(cache.length).tolist() == list(lengths)
    full_BTV = jax.jit(forward_full, static_argnums=1)(params, CFG, jnp.asarray(ids))  # causal: padding comes after
    for b, n in enumerate(lengths):
        full = full_BTV[b, n - 1]
        np.testing.assert_allclose(out_BV[b], full, rtol=0, atol=2e-5 * float(jnp.max(jnp.abs(full))))


# w4,ple4,int8_lm_head in `make test` (the published set: 4-bit products, the PLE table and the head in 8 bits);
# w8 repeats its path at 8 bits in `make test-heavy` (8-bit products in both forms against the dequantized weight:
# tests/test_qreduce.py at 1, 3, 8 and 9 rows).
@pytest.mark.slow
@pytest.mark.parametrize("quant", [pytest.param("w8", marks=pytest.mark.heavy), "w4,ple4,int8_lm_head"])
def test_quantized_rows_decode_their_tokens_alone_in_both_product_forms(params, quant):
    """On CPU a quantized product takes the multiply-and-sum form up to `MATVEC_ROWS` (8) activation rows and the
    dot form above: B = 3 decodes in the first, B = 10 in the second, B = 1 always in the first."""
    spec = parse_quant(quant)
    engine = Engine(quantize_params(params, spec, scale_dtype=jnp.float32), CFG, decide_policy("float32"),
                    buckets=(32,), quant=spec, scale_dtype="float32")  # fmt: skip
    rng = np.random.default_rng(2)
    rows = [rng.integers(5, CFG.vocab_size, size=n).tolist() for n in (3, 20, 13, 9, 1, 32, 7, 16, 25, 11)]
    alone = [engine.generate(p, MAX_NEW).token_ids for p in rows]
    for batch in (3, 10):
        gen = engine.generate_batch(rows[:batch], MAX_NEW)
        assert [b for b in range(batch) if gen.token_ids[b] != alone[b]] == [], batch


def _held(cfg, layer: int, length: int, slots: int) -> np.ndarray:
    """[S] bool: the slots the invariant fills after `length` positions of one row."""
    pos_S = np.asarray(ring_positions(jnp.int32(length), slots)) if cfg.is_sliding(layer) else np.arange(slots)
    return (pos_S >= 0) & (pos_S < length)


def test_each_rows_cache_keeps_the_invariant_at_its_own_length(engine, prompts):
    """A batch prefill (lengths 3, 20, 13 in a bucket of 32) then 4 decode steps, by the engine's programs
    (`step_fn_batch`): each row's length is its own, its held slots equal the same prompt's B = 1 cache
    (`step_fn`), and its other slots are still the empty cache's zeros (padding wrote nothing, and neither did
    another row's longer prompt). Row 0 (3 + 4 positions) leaves a ring slot and the full layer's tail empty."""
    steps = 4
    rows = prompts[:3]
    lengths = [len(p) for p in rows]
    (token_B, cache), step = engine.step_fn_batch(rows, MAX_NEW)
    for _ in range(steps):
        token_B, cache = step((token_B, cache))
    assert np.asarray(cache.length).tolist() == [n + steps for n in lengths]
    empty = 0
    for b, n in enumerate(lengths):
        ref, one_step = engine.step_fn(rows[b], MAX_NEW)
        for _ in range(steps):
            ref = one_step(ref)
        ref_cache = ref[1]
        assert int(ref_cache.length) == n + steps
        for j, i in enumerate(CFG.cache_layers):
            for got, want in ((cache.k[j], ref_cache.k[j]), (cache.v[j], ref_cache.v[j])):
                row = np.asarray(got)[b]  # [K, S, H]
                held = _held(CFG, i, n + steps, row.shape[1])
                assert np.all(row[:, ~held] == 0.0) and np.all(np.any(row[:, held] != 0.0, axis=-1)), (b, i)
                np.testing.assert_allclose(row[:, held], np.asarray(want)[0][:, held], rtol=0, atol=1e-5)
                empty += int((~held).sum())
    assert empty > 0  # the case has empty slots to check


def test_kv_cache_bytes_equal_a_hand_count_and_the_allocated_buffers():
    # TINY cache layers 0, 1 (sliding, K 1, H 16: a ring of 8 slots) and 2 (full, H 32: 40 slots), K and V.
    assert kv_cache_elements(CFG, 40) == 2 * (2 * 8 * 16) + 2 * 40 * 32 == 3072
    assert kv_cache_bytes(CFG, 40, 4, batch=3) == 3 * 3072 * 4
    cache = init_cache(CFG, 40, jnp.float32, batch=3)
    assert sum(x.nbytes for x in cache.k + cache.v) == kv_cache_bytes(CFG, 40, 4, batch=3)


def test_the_memory_arithmetic_and_its_refusal():
    mem = BatchMemory(batch=64, cache_len=100, weight_bytes=10_000, kv_bytes_per_row=1_000, capacity=50_000,
                      where="of test memory")  # fmt: skip
    assert (mem.kv_bytes, mem.needed, mem.usable) == (64_000, 74_000, 45_000)
    assert not mem.fits and mem.largest_batch == 35  # (45,000 - 10,000) // 1,000
    line = mem.refusal()
    assert "\n" not in line
    for needle in ("batch 64 does not fit", "100 positions per row", "at most 35 rows fit", "--batch"):
        assert needle in line, (needle, line)
    assert BatchMemory(batch=35, cache_len=100, weight_bytes=10_000, kv_bytes_per_row=1_000, capacity=50_000,
                       where="x").fits  # fmt: skip
    none = BatchMemory(batch=1, cache_len=100, weight_bytes=48_000, kv_bytes_per_row=1_000, capacity=50_000, where="x")
    assert none.largest_batch == 0 and "not even one row fits" in none.refusal()
    assert "copy" not in line and "copy" not in none.refusal()


def test_a_refusal_names_the_batch_copy_inside_the_weights():
    mem = BatchMemory(batch=8, cache_len=100, weight_bytes=3_000_000_000, kv_bytes_per_row=1_000_000_000,
                      capacity=10_000_000_000, where="x", copy_bytes=1_000_000_000)  # fmt: skip
    for line in (mem.refusal(), mem.slots_refusal()):
        assert "3.000 GB of weights (of which 1.000 GB is the transposed copy batched steps read on CPU)" in line, line


def test_a_batch_that_does_not_fit_is_refused_before_anything_compiles(engine, prompts, monkeypatch):
    per_row = kv_cache_bytes(CFG, 32 + MAX_NEW, 4)
    capacity = (engine.weight_bytes + engine.batch_copy_bytes + 2 * per_row) / 0.9 + 1  # two rows fit, three not
    monkeypatch.setattr(engine_module, "memory_capacity", lambda weights, device=None: (int(capacity), "of test"))
    assert engine.check_batch(2, 20, MAX_NEW).largest_batch == 2
    traces = CompileCounter.traces
    with pytest.raises(EngineError, match="batch 3 does not fit.*at most 2 rows fit"):
        engine.generate_batch(prompts[:3], MAX_NEW)
    assert CompileCounter.traces == traces


def test_the_memory_capacity_of_this_host_counts_the_loaded_weights():
    capacity, where = memory_capacity(10**9)
    assert capacity > 10**9 and "host" in where


@pytest.mark.parametrize("batch", [0, -1, 2.0, True])
def test_a_batch_size_that_is_not_a_whole_number_above_zero_is_a_clear_error(engine, batch):
    with pytest.raises(EngineError, match="expected a whole number of rows >= 1"):
        engine.check_batch(batch, 5, MAX_NEW)


def test_a_bad_batch_request_is_a_clear_error(engine):
    with pytest.raises(EngineError, match="at least 1 prompt"):
        engine.generate_batch([], MAX_NEW)
    with pytest.raises(EngineError, match="exceeds the engine's largest bucket 32"):
        engine.generate_batch([[5] * 4, [5] * 33], MAX_NEW)
    with pytest.raises(EngineError, match="stop_at_eos|decode block"):
        engine.generate_batch([[5] * 4], MAX_NEW, block=3)


def test_the_batch_size_is_a_compiled_shape_and_lengths_are_not(engine, prompts):
    """A second batch at the same (B, bucket, max_new_tokens) compiles nothing, other row lengths in that bucket
    neither; another B compiles its programs (here max_new_tokens 1: the prefill alone)."""
    engine.generate_batch(prompts[:3], MAX_NEW)
    again = engine.generate_batch([[10, 11], [12] * 30, [13] * 17], MAX_NEW)
    assert again.bucket == 32 and again.compile_traces == 0
    other = engine.generate_batch([[5, 6, 7]] * 5, 1)  # B = 5: no other test compiles it
    assert other.compile_traces > 0 and len(other.token_ids) == 5 and other.decode_ms is None


def test_the_batch_timings_are_per_sequence_and_aggregate():
    ms = 1_000_000
    gen = BatchGeneration(prompt_ids=[[1]] * 4, token_ids=[[2] * 5] * 4, bucket=8, max_new_tokens=5,
                          t_prefill_start_ns=0, t_token_ns=[10 * ms, 30 * ms, 50 * ms, 70 * ms, 90 * ms],
                          compile_traces=0)  # fmt: skip
    assert gen.prefill_ms == 10 and gen.decode_ms == 80 and gen.step_ms == [20, 20, 20, 20]
    assert gen.sequence_tok_s == pytest.approx(50.0)  # 4 tokens after the first in 80 ms
    assert gen.aggregate_tok_s == pytest.approx(200.0)  # 4 rows
    assert gen.row(2).token_ids == [2] * 5 and gen.row(2).prefill_ms == 10


def test_decode_bytes_read_the_weights_once_and_every_rows_cache(engine):
    one, four = engine.decode_bytes(20, MAX_NEW), engine.decode_bytes(20, MAX_NEW, batch=4)
    assert four["weights"] == one["weights"] and four["kv_cache"] == 4 * one["kv_cache"]
    assert four["total"] == four["weights"] + four["kv_cache"]


def test_decode_flops_equal_a_hand_count_on_tiny():
    """TINY (D 64, N 4, K 1, H 16/32, F 128/256, P 8, L 6, V 512, W 8), a cache of 16 slots."""
    own_sliding = 2 * (64 * 4 * 16 + 2 * 64 * 16 + 4 * 16 * 64 + 3 * 64 * 128 + 2 * 64 * 8) + 8 * 4 * 4 * 16
    own_full = 2 * (64 * 4 * 32 + 2 * 64 * 32 + 4 * 32 * 64 + 3 * 64 * 128 + 2 * 64 * 8) + 16 * 4 * 4 * 32
    shared_sliding = 2 * (64 * 4 * 16 + 4 * 16 * 64 + 3 * 64 * 256 + 2 * 64 * 8) + 8 * 4 * 4 * 16
    shared_full = 2 * (64 * 4 * 32 + 4 * 32 * 64 + 3 * 64 * 256 + 2 * 64 * 8) + 16 * 4 * 4 * 32
    row = 2 * own_sliding + own_full + 2 * shared_sliding + shared_full + 2 * 64 * 6 * 8 + 2 * 64 * 512
    assert decode_flops(CFG, 16) == row == 698_368
    assert decode_flops(CFG, 16, batch=3) == 3 * row
    with pytest.raises(ValueError, match="at least 1"):
        decode_flops(CFG, 16, batch=0)
