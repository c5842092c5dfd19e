"""Engine invariants on tiny configs: cached decode equals one full forward, padding never changes tokens,
the sliding ring wraps correctly, positions are absolute, prefill's chunks and blocked attention are exact,
compiles are counted."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.cache import init_cache, ring_positions
from model.config import TINY
from model.engine import CompileCounter, Engine, Sampling
from model.forward import decode_step as _decode_step
from model.forward import forward_full
from model.forward import prefill as _prefill
from model.params import init_params
from model.policy import decide_policy

CFG = TINY  # sliding window 8, layers [S,S,F,S,S,F], 3 KV-shared layers
prefill = jax.jit(_prefill, static_argnums=1)
decode_step = jax.jit(_decode_step, static_argnums=1)
CACHE = 72  # every cache below outside an engine: >= 32 + 40, so one decode program and one prefill per bucket


@pytest.fixture(scope="module")
def params():
    return jax.tree_util.tree_map(jnp.asarray, init_params(CFG, seed=0))


@pytest.fixture(scope="module")
def ids():
    return jnp.asarray(np.random.default_rng(7).integers(5, CFG.vocab_size, size=(1, 40)), jnp.int32)


@pytest.fixture(scope="module")
def full(params, ids):
    """The logits [40, V] of one causal pass over `ids` (`forward_full`, compiled once for the module)."""
    return jax.jit(forward_full, static_argnums=1)(params, CFG, ids)[0]


def _cached_logits(params, ids, n_prompt, bucket):
    """Prefill n_prompt real tokens padded to `bucket`, then decode the rest one by one; logits per position. The
    cache has CACHE slots (more than the positions need: the full layers' extra slots stay empty and unread), so
    every case runs the same decode program."""
    t = ids.shape[1]
    cache = init_cache(CFG, CACHE, jnp.float32)
    padded = jnp.zeros((1, bucket), jnp.int32).at[:, :n_prompt].set(ids[:, :n_prompt])
    out, cache = prefill(params, CFG, padded, jnp.int32(n_prompt), cache)
    rows = [out]
    for p in range(n_prompt, t):
        out, cache = decode_step(params, CFG, ids[:, p], cache)
        rows.append(out)
    return jnp.stack(rows, axis=1)[0], cache  # logits at positions n_prompt-1 .. t-1


@pytest.mark.parametrize(
    "n_prompt,bucket",
    [
        (5, 8),  # prompt shorter than the window, decode wraps the ring many times
        (5, 32),  # bucket padding (27) exceeds the window (8)
        (20, 32),  # prompt longer than the window; windowed prefill attention (32 > 8)
        (13, 16),  # prompt longer than the window, padding 3
    ],
)
def test_cached_decode_equals_one_full_forward(params, ids, full, n_prompt, bucket):
    cached, cache = _cached_logits(params, ids, n_prompt, bucket)
    np.testing.assert_allclose(cached, full[n_prompt - 1 :], rtol=0, atol=2e-5 * float(jnp.max(jnp.abs(full))))
    assert int(cache.length) == ids.shape[1]


def test_padding_beyond_the_window_decodes_the_same_tokens(params):
    engine_small = Engine(params, CFG, decide_policy("float32"), buckets=(8, 64))
    engine_big = Engine(params, CFG, decide_policy("float32"), buckets=(64,))
    prompt = [2, 17, 33, 90, 4]  # 5 tokens: bucket 8 (padding 3) vs bucket 64 (padding 59 > window 8)
    a = engine_small.generate(prompt, 24)
    b = engine_big.generate(prompt, 24)
    assert (a.bucket, b.bucket) == (8, 64)
    assert a.token_ids == b.token_ids


def test_ring_holds_exactly_the_last_real_positions(params, ids):
    n_prompt, bucket = 13, 16
    _, cache = _cached_logits(params, ids[:, :20], n_prompt, bucket)
    ring = cache.k[0].shape[2]  # [B, K, R, H]
    pos = np.asarray(ring_positions(cache.length, ring))
    assert sorted(pos.tolist()) == list(range(20 - ring, 20))  # the last R absolute positions, one per slot
    assert all(p % ring == s for s, p in enumerate(pos))
    # The ring slot of position 19 holds exactly that position's key: recompute it from a prefill of all 20
    # (padded to the bucket of 32, whose prefill test_cached_decode_equals_one_full_forward[20-32] checks).
    cache20 = init_cache(CFG, CACHE, jnp.float32)
    padded = jnp.zeros((1, 32), jnp.int32).at[:, :20].set(ids[:, :20])
    _, cache20 = prefill(params, CFG, padded, jnp.int32(20), cache20)
    np.testing.assert_allclose(cache.k[0][0, :, 19 % ring], cache20.k[0][0, :, 19 % ring], atol=1e-5)


def test_padding_never_occupies_a_slot(params, ids):
    cache = init_cache(CFG, CACHE, jnp.float32)
    padded = jnp.zeros((1, 32), jnp.int32).at[:, :5].set(ids[:, :5])
    _, cache = prefill(params, CFG, padded, jnp.int32(5), cache)
    full_layer = CFG.layer_types.index("full_attention")
    assert np.all(np.asarray(cache.k[full_layer][0, :, 5:]) == 0)  # full cache: nothing past the real length
    sliding = np.asarray(cache.k[0][0, 0])
    assert np.all(sliding[5:] == 0) and np.all(np.abs(sliding[:5]).sum(-1) > 0)


def test_positions_are_absolute_not_bucket_relative(params, ids):
    # Same prompt at two buckets: identical caches where real positions live (RoPE of absolute positions).
    caches = []
    for bucket in (16, 32):
        cache = init_cache(CFG, CACHE, jnp.float32)
        padded = jnp.zeros((1, bucket), jnp.int32).at[:, :12].set(ids[:, :12])
        caches.append(prefill(params, CFG, padded, jnp.int32(12), cache)[1])
    for a, b in zip(caches[0].k, caches[1].k, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def _assert_prefills_agree(params, ids, variants: list[dict]) -> None:
    """Prefill of 20 real tokens at bucket 32 under each keyword set of `variants`: logits and caches equal the
    first variant's."""
    cache = init_cache(CFG, CACHE, jnp.float32)
    padded = jnp.zeros((1, 32), jnp.int32).at[:, :20].set(ids[:, :20])
    runs = [jax.jit(lambda p, i, c, kw=kw: _prefill(p, CFG, i, jnp.int32(20), c, **kw))(params, padded, cache)
            for kw in variants]  # fmt: skip
    for out, filled in runs[1:]:
        np.testing.assert_allclose(out, runs[0][0], rtol=0, atol=2e-5 * float(jnp.max(jnp.abs(runs[0][0]))))
        for a, b in zip(filled.k + filled.v, runs[0][1].k + runs[0][1].v, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_prefill_in_smaller_chunks_equals_one_window_chunk(params, ids):
    """TINY (window 8): chunks of 2, 3 (not dividing the ring) and 5 against chunks of the window."""
    _assert_prefills_agree(params, ids, [{"chunk": c} for c in (8, 2, 3, 5)])


def test_no_compile_after_warmup_and_sampling_is_deterministic(params):
    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16, 32))
    engine.warmup(10, 12)
    before = CompileCounter.traces
    engine.generate([2, 5, 6, 7, 8, 9, 10, 11, 12], 12)  # another length, same bucket: no compile
    assert CompileCounter.traces == before
    s = Sampling(temperature=0.8, top_k=40, top_p=0.9, seed=11)
    assert engine.generate([2, 5, 6], 12, s).token_ids == engine.generate([2, 5, 6], 12, s).token_ids
    other = engine.generate([2, 5, 6], 12, dataclasses.replace(s, seed=12)).token_ids
    assert other != engine.generate([2, 5, 6], 12, s).token_ids


def test_generation_is_exactly_max_new_tokens_and_timed(params):
    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16,))
    gen = engine.generate([2, 3, 4], 12)  # bucket 16, 12 tokens: the programs the warm-up test above compiled
    assert len(gen.token_ids) == 12 and len(gen.step_ms) == 11
    assert gen.prefill_ms > 0 and all(s > 0 for s in gen.step_ms)


def test_the_host_loop_dispatches_steps_ahead_before_it_reads_a_token(params, monkeypatch):
    import model.engine as engine_module

    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16,))
    plain = engine.generate([2, 3, 4], 12).token_ids  # the programs of the tests above
    events, real = [], engine_module._decode_program

    def counted(*args, **kwargs):
        events.append("dispatch")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "_decode_program", counted)
    ahead = engine_module.HOST_LOOP_AHEAD
    assert ahead == 2
    gen = engine.generate([2, 3, 4], 12, on_token=lambda t: events.append("token") and None)
    assert gen.token_ids == plain and len(gen.step_ms) == 11
    # prefill gives token 1; steps 2 .. 1 + ahead are dispatched before token 2 is read, step n + ahead before
    # token n, none past 12
    assert events == ["token", *["dispatch"] * ahead, *["dispatch", "token"] * (11 - ahead), *["token"] * ahead]
    events.clear()
    stopped = engine.generate([2, 3, 4], 12, on_token=lambda t: (events.append("token"), events.count("token") == 4)[1])
    assert stopped.token_ids == plain[:4]
    assert events.count("dispatch") == 3 + ahead  # 3 steps gave tokens 2-4; `ahead` more were dispatched, not read


class _Token:
    """A stand-in for a step's token array: records when its copy to the host was begun."""

    def __init__(self, n: int, log: list):
        self.n, self.log = n, log

    def copy_to_host_async(self) -> None:
        self.log.append(("copy", self.n))


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("ahead", [1, 2, 3])
def test_dispatched_ahead_keeps_that_many_steps_in_flight_and_begins_each_copy_at_dispatch(monkeypatch, steps, ahead):
    import model.engine as engine_module

    monkeypatch.setattr(engine_module, "HOST_LOOP_AHEAD", ahead)
    log: list = []

    def step(cache, token):
        n = cache + 1  # the "cache" counts the steps run; each step's input is the previous step's token
        assert token.n == cache
        log.append(("dispatch", n))
        return _Token(n, log), n

    read = []
    for token in engine_module._dispatched_ahead(step, 0, _Token(0, log), steps):
        dispatched = [n for what, n in log if what == "dispatch"]
        assert ("copy", token.n) in log and log.index(("copy", token.n)) == log.index(("dispatch", token.n)) + 1
        assert len(dispatched) == min(token.n + ahead, steps)  # `ahead` past the one read, never past the last
        read.append(token.n)
    assert read == list(range(1, steps + 1))
    assert [n for what, n in log if what == "dispatch"] == list(range(1, steps + 1))


def test_prompt_longer_than_the_largest_bucket_is_a_clear_error(params):
    from model.errors import EngineError

    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16, 32))
    with pytest.raises(EngineError, match="largest bucket 32.*--buckets"):
        engine.generate(list(range(2, 40)), 4)


def test_a_prompt_too_long_is_told_only_a_fix_that_can_work(params):
    """Beyond the model's positions no flag helps: the message names the real limit, not --max-length to raise
    (which is refused above it); below them it names the flag and its range."""
    from model.errors import EngineError

    engine = Engine(params, CFG, decide_policy("float32"))  # default ladder: up to the model's 256 positions
    with pytest.raises(EngineError) as info:
        engine.check_request(34_513, 4)
    assert "256 positions (max_position_embeddings)" in str(info.value) and "raise it" not in str(info.value)
    assert "fewer than 256 tokens" in str(info.value)
    small = Engine(params, CFG, decide_policy("float32"), max_length=64)
    with pytest.raises(EngineError, match=r"raise it with --max-length 100\.\.256"):
        small.check_request(100, 4)
    with pytest.raises(EngineError, match=r"add a bucket of 100\.\.255 tokens to --buckets"):
        Engine(params, CFG, decide_policy("float32"), buckets=(16, 32)).check_request(100, 4)


def test_the_engine_checks_prompts_against_the_limits_the_command_line_checks_first(params):
    """The engine's ladder and checks are model/limits.py's, built from the config alone: what `bench sweep`
    checks its --inputs against before loading is what the engine will enforce."""
    from model.limits import prompt_limits

    for kwargs in ({}, {"max_length": 64}, {"buckets": (16, 32)}):
        engine = Engine(params, CFG, decide_policy("float32"), **kwargs)
        assert engine.limits == prompt_limits(CFG.max_position_embeddings, **kwargs)
        assert (engine.buckets, engine.max_length) == (engine.limits.buckets, engine.limits.max_length)


def test_decode_bytes_count_each_layers_kv_read(params):
    from model.accounting import decode_weight_bytes, kv_read_bytes

    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16, 32))
    got = engine.decode_bytes(20, 12)  # bucket 32 + 12 -> 44 cache positions
    assert got["weights"] == decode_weight_bytes(CFG, 4) and got["total"] == got["weights"] + got["kv_cache"]
    # TINY: layers 0,1 (ring 8) and 2 (full, 44) own caches; shared layers 3,4 read layer 1's ring, 5 reads layer 2's.
    ring, full = 2 * 8 * 1 * 16 * 4, 2 * 44 * 1 * 32 * 4
    assert kv_read_bytes(CFG, 44, 4) == 4 * ring + 2 * full == got["kv_cache"]


def test_compile_counter_sees_a_new_shape(params):
    # Validity rests on this counter: prove it counts (a new bucket compiles), not only that it stays still.
    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16, 24))
    engine.warmup(10, 12)
    before = CompileCounter.traces
    gen = engine.generate(list(range(2, 22)), 12)  # 20 tokens: bucket 24, a shape no test of this module compiles
    assert gen.compile_traces >= 1 and CompileCounter.traces > before


# ---- the device decode loop ------------------------------------------------------------------------------------
DEFAULT_LIKE = dataclasses.replace(
    TINY, num_layers=10, layer_types=tuple("full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                                           for i in range(10)), num_kv_shared_layers=4, num_heads=8,
)  # fmt: skip
"""The default preset's shape at test size: 4:1 sliding/full, 8 query heads on 1 KV head, the last 4 layers
KV-shared, both head dims, double-wide MLP, PLE (window 8, so decode wraps the ring)."""


@pytest.fixture(scope="module")
def default_like_params():
    return jax.tree_util.tree_map(jnp.asarray, init_params(DEFAULT_LIKE, seed=3))


@pytest.mark.parametrize("block", [None, 1, 7, 30])  # one loop; every token; a last shorter block (7, 4); above n - 1
def test_device_loop_gives_the_host_loops_greedy_tokens(params, block):
    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16, 32))
    prompt = [2, 17, 33, 90, 4]
    host = engine.generate(prompt, 12)  # bucket 16, 12 tokens: the host loop's programs of the tests above
    device = engine.generate(prompt, 12, decode_loop="device", block=block)
    assert device.token_ids == host.token_ids and len(device.token_ids) == 12
    steps = min(block or 11, 11)
    assert device.arrived == [0, *range(steps, 11, steps), 11]  # the first token, then each block's last
    assert len(device.t_token_ns) == len(device.arrived) and device.step_ms == []
    assert device.decode_ms == pytest.approx((device.t_token_ns[-1] - device.t_token_ns[0]) / 1e6)
    assert device.ms_per_step == pytest.approx(device.decode_ms / 11)
    assert (device.decode_loop, host.decode_loop, host.arrived) == ("device", "host", None)


def test_device_loop_on_a_default_like_config_gives_the_same_tokens(default_like_params):
    engine = Engine(default_like_params, DEFAULT_LIKE, decide_policy("float32"), buckets=(16, 32))
    prompt = [2, 40, 41, 300, 7, 9, 11, 13, 15, 17, 19, 21]  # 12 tokens: longer than the window of 8
    host = engine.generate(prompt, 24)
    for block in (None, 5):
        assert engine.generate(prompt, 24, decode_loop="device", block=block).token_ids == host.token_ids


def test_device_loop_samples_the_host_loops_tokens_for_a_seed(params):
    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16,))
    s = Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=5)
    host = engine.generate([2, 5, 6], 12, s).token_ids  # the sampled host programs of the warm-up test above
    assert engine.generate([2, 5, 6], 12, s, decode_loop="device").token_ids == host
    assert engine.generate([2, 5, 6], 12, s, decode_loop="device", block=6).token_ids == host
    other = dataclasses.replace(s, seed=6)
    assert engine.generate([2, 5, 6], 12, other, decode_loop="device").token_ids != host  # the seed is honoured


def test_device_loop_compiles_one_program_per_block_size_and_nothing_after_warmup(params):
    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16,))
    engine.warmup(10, 12, decode_loop="device", block=4)  # 11 steps: blocks of 4, 4, 3 (the same program)
    before = CompileCounter.traces
    gen = engine.generate([2, 5, 6, 7], 12, decode_loop="device", block=4)
    assert gen.compile_traces == 0 and CompileCounter.traces == before and gen.arrived == [0, 4, 8, 11]
    gen = engine.generate([2, 5, 6, 7], 12, decode_loop="device", block=9)  # another block size: a new program
    assert gen.compile_traces >= 1 and gen.arrived == [0, 9, 11]  # (blocks 1, 4, 7, 11 ran in the tests above)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"decode_loop": "device", "stop_at_eos": True}, "stop_at_eos"),
        ({"decode_loop": "device", "on_token": lambda _t: None}, "on_token"),
        ({"decode_loop": "gpu"}, "expected one of host, device"),
        ({"decode_loop": "host", "block": 4}, "pass decode_loop='device'"),
        ({"decode_loop": "device", "block": 0}, "steps >= 1"),
    ],
)
def test_a_decode_loop_the_engine_cannot_run_is_a_clear_error(params, kwargs, needle):
    from model.errors import EngineError

    engine = Engine(params, CFG, decide_policy("float32"), buckets=(16,))
    with pytest.raises(EngineError, match=needle):
        engine.generate([2, 5, 6], 8, **kwargs)
