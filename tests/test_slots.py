"""Decode slots (model/slots.py) and `BatchedSlots` (bench/serve/slots.py) on the tiny config (float32 CPU):
sequences joining a batched cache at different steps, with different prompt lengths, decode the tokens of their
prompts alone; a slot freed mid-generation and reused by a shorter prompt leaks nothing of its previous occupant;
every step is one jitted call of the occupied rows (fewer than all while they fit in a smaller row count, the
other rows untouched); joining and leaving compile nothing once warm; a sampled slot draws
what `generate` draws with its seed; the slots' memory is checked before anything is allocated."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model.slots as slots_module
from model.accounting import BatchMemory
from model.config import TINY
from model.engine import CompileCounter, Engine, Sampling
from model.errors import EngineError
from model.params import init_params
from model.policy import decide_policy

CFG = TINY  # sliding window 8, layers [S,S,F,S,S,F], 3 KV-shared layers
MAX_NEW = 12  # every sequence wraps its ring of 8 while decoding
SLOTS, CACHE_LEN = 3, 48  # one compiled shape for the whole module
LENGTHS = (20, 3, 13, 9)  # a long prompt (its ring wraps in prefill), one far shorter than the window, two more


@pytest.fixture(scope="module")
def engine():
    params = jax.tree_util.tree_map(jnp.asarray, init_params(CFG, seed=0))
    return Engine(params, CFG, decide_policy("float32"), buckets=(32,))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(5, CFG.vocab_size, size=n).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def alone(engine, prompts):
    """Each prompt's greedy tokens alone (`generate`, B = 1, its cache of bucket + MAX_NEW positions)."""
    return [engine.generate(p, MAX_NEW).token_ids for p in prompts]


@pytest.fixture
def decoder(engine):
    dec = engine.slot_decoder(SLOTS, CACHE_LEN)
    dec.warmup(20)  # the bucket of every prompt here (32), the insert and every step (1 row and 3, both kinds)
    return dec


class _Schedule:
    """Drives a decoder like the scheduler: `join(slot, k)` prefills prompt k; `step()` steps every slot once,
    collects each occupied slot's token and frees a slot whose sequence has MAX_NEW tokens."""

    def __init__(self, decoder, prompts):
        self.dec, self.prompts = decoder, prompts
        self.running: dict[int, int] = {}  # slot -> prompt index
        self.tokens: dict[int, list[int]] = {}

    def join(self, slot: int, k: int, sampling: Sampling | None = None) -> None:
        first = self.dec.prefill(slot, self.prompts[k], MAX_NEW, *([sampling] if sampling else []))
        self.running[slot], self.tokens[k] = k, [first.token_id]

    def step(self) -> None:
        ids = self.dec.step()
        for slot, k in list(self.running.items()):
            self.tokens[k].append(int(ids[slot]))
            if len(self.tokens[k]) == MAX_NEW:
                self.dec.free(slot)
                del self.running[slot]

    def drain(self, slot: int | None = None) -> None:
        """Step until `slot` is free (None: every slot)."""
        while (slot in self.running) if slot is not None else self.running:
            self.step()


def test_sequences_joining_at_different_steps_get_their_tokens_alone(decoder, prompts, alone):
    run = _Schedule(decoder, prompts)
    run.join(0, 0)  # 20 tokens
    run.step()
    run.step()
    run.join(2, 1)  # 3 tokens, two steps later, in another slot
    for _ in range(3):
        run.step()
    run.join(1, 2)  # 13 tokens, while the others are mid-generation
    run.drain(0)
    run.join(0, 3)  # 9 tokens, into the slot the 20-token prompt just left
    run.drain()
    assert run.tokens == dict(enumerate(alone))
    assert decoder.active == ()


def test_a_reused_slot_keeps_nothing_of_its_previous_occupant(engine, decoder, prompts, alone):
    run = _Schedule(decoder, prompts)
    run.join(1, 0)  # the 20-token prompt fills many slots of the full-attention layer and wraps the rings
    for _ in range(5):
        run.step()
    decoder.free(1)  # left mid-generation (a client gone)
    del run.running[1]
    run.step() if run.running else None
    run.join(1, 1)  # a 3-token prompt into the same row
    full = [j for j, i in enumerate(CFG.cache_layers) if not CFG.is_sliding(i)]
    for j in full:  # the row holds the new prompt's 3 positions and zeros: nothing of the 20 + 5 before
        row = np.asarray(decoder._cache.k[j][1])
        assert np.all(row[:, 3:] == 0) and np.any(row[:, :3] != 0)
    assert int(np.asarray(decoder._cache.length)[1]) == 3
    run.drain()
    assert run.tokens[1] == alone[1]


def test_every_step_is_one_jitted_call_of_the_occupied_rows_and_joining_or_leaving_compiles_nothing(
        decoder, prompts, alone, monkeypatch):  # fmt: skip
    calls = []  # (rows the call decoded, occupied rows among them)
    real_all, real_rows = slots_module._slot_step_program, slots_module._slot_rows_step_program

    def counted_all(*args, **kwargs):
        calls.append((SLOTS, int(np.sum(np.asarray(args[3])))))
        return real_all(*args, **kwargs)

    def counted_rows(*args, **kwargs):
        rows_k = np.asarray(args[5])
        calls.append((len(rows_k), int(np.sum(np.asarray(args[3])[rows_k]))))
        return real_rows(*args, **kwargs)

    monkeypatch.setattr(slots_module, "_slot_step_program", counted_all)
    monkeypatch.setattr(slots_module, "_slot_rows_step_program", counted_rows)
    traces0 = CompileCounter.traces
    run = _Schedule(decoder, prompts)
    run.join(2, 3)
    run.step()
    run.join(0, 2)
    run.step()
    run.join(1, 1)  # all three slots now
    run.drain()
    assert CompileCounter.traces == traces0  # three slots, three bucket-32 lengths, joins and leaves: no compile
    assert decoder.row_counts == (1,)  # of 3 slots, a lone row steps alone
    assert len(calls) == decoder.steps - 4  # warm-up ran 4 steps (1 row and all 3, greedy and sampled)
    assert (1, 1) in calls and (SLOTS, 3) in calls and (SLOTS, 2) in calls  # one row alone; all rows past that
    assert all(k == SLOTS or occupied == k == 1 for k, occupied in calls)
    assert [run.tokens[k] for k in (1, 2, 3)] == alone[1:]


def test_a_step_of_fewer_rows_decodes_them_alone_and_leaves_every_other_row_untouched(engine, prompts, alone):
    dec = engine.slot_decoder(4, CACHE_LEN)  # row counts 1 and 2 of 4 slots
    dec.warmup(20)
    assert dec.row_counts == (1, 2)
    run = _Schedule(dec, prompts)
    run.join(3, 0)
    seen = []
    for joins in ([], [(1, 2)], [], [(0, 1)], [(2, 3)]):
        for slot, k in joins:
            run.join(slot, k)
        occupied = dec.active
        rows = dec.step_rows()
        stepped = [*occupied, *(s for s in range(4) if s not in occupied)][:rows]  # then the lowest free rows
        before = [(np.asarray(k).copy(), np.asarray(v).copy()) for k, v in zip(dec._cache.k, dec._cache.v)]
        token0 = np.asarray(dec._token_B).copy()
        run.step()
        seen.append(rows)
        outside = set(range(4)) - set(stepped)  # free rows, all of them
        for (k0, v0), k, v in zip(before, dec._cache.k, dec._cache.v, strict=True):
            for r in outside:  # every slot of every layer as it was
                np.testing.assert_array_equal(np.asarray(k)[r], k0[r])
                np.testing.assert_array_equal(np.asarray(v)[r], v0[r])
        for r in outside:  # its token as it was; its length held at 0 like every free row's
            assert int(np.asarray(dec._token_B)[r]) == token0[r] and int(np.asarray(dec._cache.length)[r]) == 0
    run.drain()
    assert seen == [1, 2, 2, 4, 4]
    assert run.tokens == dict(enumerate(alone))
    assert dec.active == ()


SAMPLING = Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=7)


def test_a_sampled_slot_draws_the_same_beside_greedy_slots_as_alone(decoder, prompts, alone):
    run = _Schedule(decoder, prompts)
    run.join(2, 2, SAMPLING)
    run.drain()
    by_itself = run.tokens[2]
    run.join(0, 1)  # greedy, beside the sampled one: the step with a sampled row keeps its argmax
    run.join(1, 2, SAMPLING)
    run.join(2, 0, Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=8))
    run.drain()
    assert run.tokens[2] == by_itself and run.tokens[1] == alone[1]
    assert by_itself != alone[2] and run.tokens[0] != by_itself  # the sampling changed something; seeds differ


@pytest.mark.slow
def test_a_sampled_slot_draws_what_generate_draws_with_its_seed(engine, decoder, prompts):
    expected = engine.generate(prompts[2], MAX_NEW, SAMPLING).token_ids
    run = _Schedule(decoder, prompts)
    run.join(0, 1)
    run.join(1, 2, SAMPLING)
    run.drain()
    assert run.tokens[2] == expected


def test_refusals_leave_the_slot_free(decoder, prompts):
    decoder.prefill(0, prompts[1], MAX_NEW)
    with pytest.raises(EngineError, match="slot 0 is occupied"):
        decoder.prefill(0, prompts[1], MAX_NEW)
    with pytest.raises(EngineError, match="slot 3: expected 0..2"):
        decoder.prefill(3, prompts[1], MAX_NEW)
    with pytest.raises(EngineError, match=r"20 prompt tokens \+ 29 new tokens .* exceed the slots' 48 positions"):
        decoder.prefill(1, prompts[0], 29)
    with pytest.raises(EngineError, match="largest bucket 32"):
        decoder.prefill(1, [5] * 33, 2)
    assert decoder.active == (0,)
    decoder.free(0)
    decoder.free(0)  # freeing a free slot does nothing
    with pytest.raises(EngineError, match="no occupied slot"):
        decoder.step()


def test_a_row_that_made_its_max_new_tokens_is_refused_another_step_and_every_row_is_kept(decoder, prompts):
    decoder.prefill(0, prompts[1], 3)  # the prefill's token, then room for two steps
    decoder.prefill(2, prompts[2], MAX_NEW)
    decoder.step()
    decoder.step()
    lengths, token_B = np.asarray(decoder._cache.length).copy(), np.asarray(decoder._token_B).copy()
    steps = decoder.steps
    with pytest.raises(EngineError, match="slot 0 has made every new token its prefill's max_new_tokens allowed"):
        decoder.step()
    assert decoder.active == (0, 2) and decoder.resets == 0 and decoder.steps == steps  # nothing ran, nothing lost
    np.testing.assert_array_equal(np.asarray(decoder._cache.length), lengths)
    np.testing.assert_array_equal(np.asarray(decoder._token_B), token_B)
    decoder.free(0)
    decoder.step()  # the other row goes on
    assert int(np.asarray(decoder._cache.length)[2]) == lengths[2] + 1
    decoder.free(2)


def test_a_sampled_request_after_warm_up_compiles_nothing(engine, prompts):
    dec = engine.slot_decoder(SLOTS, CACHE_LEN - 1)  # a cache length no other test compiles: warm-up's programs only
    dec.warmup(20)
    traces0 = CompileCounter.traces
    dec.prefill(1, prompts[3], MAX_NEW, SAMPLING)  # warm-up prefilled sampled at this bucket too
    dec.step()
    dec.free(1)
    assert CompileCounter.traces == traces0


def test_the_slots_memory_is_checked_before_anything_is_allocated(engine):
    with pytest.raises(EngineError) as err:
        engine.slot_decoder(10**9, CACHE_LEN)
    line = str(err.value)
    assert line.startswith("--max-batch 1000000000 does not fit: (1000000000 slots + 1 prefill row)")
    assert "48 positions per slot, --max-length" in line and "lower --max-batch or --max-length" in line
    assert "\n" not in line
    with pytest.raises(EngineError, match=r"expected 2\.\.256"):
        engine.slot_decoder(2, 257)
    mem = engine.check_slots(SLOTS, CACHE_LEN)
    assert mem.spare_rows == 1 and mem.kv_bytes == (SLOTS + 1) * mem.kv_bytes_per_row


def test_the_spare_prefill_row_counts_in_the_arithmetic():
    mem = BatchMemory(batch=40, cache_len=100, weight_bytes=10_000, kv_bytes_per_row=1_000, capacity=50_000,
                      where="x", spare_rows=1)  # fmt: skip
    assert mem.needed == 10_000 + 41 * 1_000 and not mem.fits and mem.largest_batch == 34  # 35 rows, 1 spare
    assert "at most 34 slots fit" in mem.slots_refusal()
    none = BatchMemory(batch=1, cache_len=100, weight_bytes=44_000, kv_bytes_per_row=1_000, capacity=50_000,
                       where="x", spare_rows=1)  # fmt: skip
    assert none.largest_batch == 0 and "not even one slot fits" in none.slots_refusal()


def test_a_failed_step_frees_every_slot_and_the_slots_serve_on(engine, decoder, prompts, alone, monkeypatch):
    from bench.serve.slots import BatchedSlots

    slots = BatchedSlots(engine, SLOTS, CACHE_LEN)  # the module's compiled shape (warmed up by `decoder`)
    decoder = slots.decoder
    slots.prefill_into(0, prompts[1], MAX_NEW, None, stop_at_eos=False)
    slots.prefill_into(1, prompts[2], MAX_NEW, None, stop_at_eos=False)
    real = slots_module._slot_step_program

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(slots_module, "_slot_step_program", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        slots.step([0, 1])
    assert decoder.active == () and decoder.resets == 1  # the cache was donated to the failed call: rebuilt
    monkeypatch.setattr(slots_module, "_slot_step_program", real)
    assert all(isinstance(v, RuntimeError) and "lost" in str(v) for v in slots.step([0, 1]).values())
    assert slots.release(0).bucket == 32 and slots.release(1).bucket == 32
    tokens = [slots.prefill_into(2, prompts[3], MAX_NEW, None, stop_at_eos=False).token_id]
    while len(tokens) < MAX_NEW:
        tokens.append(slots.step([2])[2].token_id)
    assert tokens == alone[3]
