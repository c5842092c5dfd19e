"""Decode slots: a fixed batch of rows that sequences join and leave between decode steps (continuous batching).

Key: B slots (`max_batch`), S positions per slot (`cache_len`), V vocab, T a prompt's bucket.

A `SlotDecoder` holds ONE batched KV cache [B rows, S positions] (`model.cache.KVCache` with one length per row)
and the current token of each row. A sequence enters a free row with `prefill(slot, prompt_ids, max_new_tokens,
sampling)`: its prompt runs through the single-sequence prefill program (`model.engine.Engine.prefill_row`, one row
at the prompt's bucket T and at the slots' cache length S, so every buffer, the sliding-window rings included, has
exactly the slot's shape and its rows are copied as they are), then a jitted insert writes that row into row
`slot` of the batched cache (per layer a dynamic_update_slice along the batch axis, its length and first token
beside it). The insert replaces the whole row, every slot of every layer, so nothing of a previous occupant
survives. `step()` is ONE jitted decode step of the occupied rows (`model.forward.decode_step` with lengths [B]:
each row at its own position, RoPE angle, cache slot and mask), and each row picks its next token with its own
sampling settings. `free(slot)` only marks the row free on the host; its next step resets it.

How many rows a step decodes: while the occupied rows fit in a row count k of `row_counts` (the powers of two up to
half the slots: 1, 2 and 4 of 8), the step decodes k rows, the occupied ones and the lowest free ones up to k
(`_slot_rows_step_program`: `decode_step` with `rows`, each attention reading those rows: in place through the CPU
attention kernel, else a gathered copy); the other rows are neither read nor written. Past that, every row
(`_slot_step_program`). A free row in a step is
carried along: it decodes its stale token at its own row's length (its old length in the first step after it was
freed, then 0: every step holds a free row's length at 0, so it never runs past the cache), and its token is
ignored. It costs its share of that step on the device (the weights are read once per step whatever the rows, but
its projections, attention over the positions it sees and logits are computed like an occupied row's).
Stepping only the occupied rows made a lone request's step 2.7-4.4x shorter on the default preset (one row against
all 8, 2-core Xeon, XLA's attention); the measurements, with XLA's attention and with the CPU attention kernel:
reports/2026-12-02-batch-serve-cpu/notes.md, "Decode slots, one process".

Tokens: greedy rows equal `Engine.generate` of the same prompt alone (the same prefill computation, then the same
per-row decode arithmetic as `Engine.generate_batch`, whose rows equal their prompts alone: tests/test_batch.py),
up to float summation order (the slots' cache length S differs from `generate`'s bucket + max_new_tokens, the
batch size from 1, and the rows a step decodes change as others join and leave); measured equal on the tiny preset
(tests/test_slots.py). A sampled row at position p draws with the key `generate` uses at p
(fold_in(PRNGKey(seed), p)), with its own temperature, top-k and top-p.

Compiled shapes (see the recompilation triggers of `model.engine`): the step per (B, S, rows decoded: each of
`row_counts` and B) and greedy-only vs any sampled row (the sampled step sorts the vocabulary for every row it
decodes); each prefill per (T, S) and greedy vs sampled
(the single-sequence prefill program at cache length S, not `generate`'s T + max_new_tokens); the insert per
(B, S). Slot indices, prompt lengths, positions and sampling values are traced: joining and leaving compile
nothing once these are compiled (`warmup`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from model.cache import KVCache, init_cache
from model.errors import EngineError
from model.forward import decode_step
from model.packed import as_params
from model.policy import DTYPES
from model.programs import CompileCounter, program
from model.sampling import GREEDY, Sampling, choose


def _choose_rows(logits_BV: jax.Array, position_B: jax.Array, rows: tuple[jax.Array, ...]) -> jax.Array:
    """Next token ids [B] (int32) from float32 logits [B,V], each row with its own settings: `rows` = (temperature
    [B] f32 (already >= 1e-6, as `Sampling.args`), top_k [B] i32, top_p [B] f32, seed [B] u32, greedy [B] bool).
    A sampled row b is `model.sampling.choose` of a single sequence at position_B[b] with its settings (vmapped),
    a greedy row its argmax."""
    temperature_B, top_k_B, top_p_B, seed_B, greedy_B = rows

    def one(z_V, p, t, k, tp, s):
        return choose(z_V[None], p, (t, k, tp, s), False)[0]

    sampled_B = jax.vmap(one)(logits_BV, position_B, temperature_B, top_k_B, top_p_B, seed_B)
    return jnp.where(greedy_B, jnp.argmax(logits_BV, axis=-1).astype(jnp.int32), sampled_B)


@program(static_argnames=("cfg", "act_dtype", "greedy"), donate_argnames=("cache", "token_B"))
def _slot_step_program(params, cache, token_B, active_B, rows, *, cfg, act_dtype, greedy):
    """One decode step of every row of the batched cache (lengths [B]): row b decodes token_B[b] at position
    cache.length[b]. Returns (next tokens [B] int32: a free row keeps its token; the cache with each occupied row's
    length + 1 and each free row's length 0). `greedy`: every occupied row is greedy (argmax only); else
    `_choose_rows` with `rows`. One program per (B, S, greedy)."""
    with jax.named_scope("decode_step"):
        position_B = cache.length
        logits_BV, cache = decode_step(as_params(params), cfg, token_B, cache, dtype=DTYPES[act_dtype])
        next_B = _next_tokens(logits_BV, position_B, token_B, active_B, rows, greedy)
        length_B = jnp.where(active_B, cache.length, 0)
        return next_B, KVCache(k=cache.k, v=cache.v, length=length_B)


def _next_tokens(logits_BV, position_B, token_B, active_B, rows, greedy: bool) -> jax.Array:
    """Each row's next token [B] (int32) from its float32 logits [B,V] at its positions [B]: argmax when `greedy`
    (every occupied row greedy), else `_choose_rows` with the rows' settings `rows`; a free row (`active_B` False)
    keeps its token."""
    next_B = choose(logits_BV, position_B, None, True) if greedy else _choose_rows(logits_BV, position_B, rows)
    return jnp.where(active_B, next_B, token_B)


@program(static_argnames=("cfg", "act_dtype", "greedy"), donate_argnames=("cache", "token_B"))
def _slot_rows_step_program(params, cache, token_B, active_B, rows, rows_k, *, cfg, act_dtype, greedy):
    """`_slot_step_program` for the rows `rows_k` (int32 [k], distinct: every occupied row, then free rows up to
    k) only (`model.forward.decode_step` with `rows`): those rows decode as in the full step, and the other rows'
    caches and tokens are untouched; every free row's length is 0 afterwards, as after the full step. One program
    per (B, S, k, greedy)."""
    with jax.named_scope("decode_step"):
        position_k, token_k = cache.length[rows_k], token_B[rows_k]
        logits_kV, cache = decode_step(as_params(params), cfg, token_k, cache, dtype=DTYPES[act_dtype], rows=rows_k)
        next_k = _next_tokens(logits_kV, position_k, token_k, active_B[rows_k], tuple(a[rows_k] for a in rows), greedy)
        token_B = token_B.at[rows_k].set(next_k, unique_indices=True)
        length_B = jnp.where(active_B, cache.length, 0)
        return token_B, KVCache(k=cache.k, v=cache.v, length=length_B)


@functools.partial(jax.jit, donate_argnames=("cache", "token_B"))
def _insert_program(cache, token_B, row, token_1, slot):
    """Row `slot` (int32 scalar) of the batched cache [B rows] and of token_B [B] replaced by a one-row cache
    `row` (same buffers, batch 1, scalar length) and its token [1]: per buffer a dynamic_update_slice along the
    batch axis (the whole row: every slot of every layer). One program per (B, S)."""
    k = tuple(jax.lax.dynamic_update_slice_in_dim(b, r, slot, axis=0) for b, r in zip(cache.k, row.k, strict=True))
    v = tuple(jax.lax.dynamic_update_slice_in_dim(b, r, slot, axis=0) for b, r in zip(cache.v, row.v, strict=True))
    length = jax.lax.dynamic_update_slice_in_dim(cache.length, jnp.reshape(row.length, (1,)), slot, axis=0)
    token_B = jax.lax.dynamic_update_slice_in_dim(token_B, token_1.astype(token_B.dtype), slot, axis=0)
    return KVCache(k=k, v=v, length=length), token_B


ROWS_STEP_SHARE = 2
"""A step decodes only its occupied rows (`row_counts`) while they fit in 1 / ROWS_STEP_SHARE of the slots: at
half of 8 slots a four-row step still took 0.74x-0.87x the time of the full one
(reports/2026-12-02-batch-serve-cpu/notes.md, "Decode slots, one process")."""


def row_counts(max_batch: int) -> tuple[int, ...]:
    """The row counts k < max_batch whose steps decode only k rows (`_slot_rows_step_program`): the powers of two
    up to max_batch / `ROWS_STEP_SHARE` (1, 2 and 4 of 8 slots; 1 of 2 or 3; none of 1)."""
    return tuple(1 << e for e in range(max_batch.bit_length()) if (1 << e) * ROWS_STEP_SHARE <= max_batch)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlotPrefill:
    """What `SlotDecoder.prefill` ran: the first generated token id, and the bucket (padded prompt length, tokens)
    the prompt's prefill ran at."""

    token_id: int
    bucket: int


class SlotDecoder:
    """`max_batch` decode slots over one batched KV cache of `cache_len` positions per slot (module docstring).

    `engine`: a `model.engine.Engine` (its params, config, policy and bucket ladder). Built by
    `Engine.slot_decoder`, which checked the memory first: the batched cache [max_batch, cache_len] is allocated
    here, once. Not thread-safe: one thread drives it. Raises EngineError as `Engine.check_slots`."""

    def __init__(self, engine, max_batch: int, cache_len: int):
        engine.check_slots(max_batch, cache_len)
        self.engine, self.max_batch, self.cache_len = engine, max_batch, cache_len
        self.row_counts = row_counts(max_batch)
        self.steps = 0  # decode steps run (each one jitted call)
        self.resets = -1  # times the batched cache was rebuilt after a failed program (`_reset`)
        self._reset()

    def _reset(self) -> None:
        """(Re)allocate the empty batched cache and free every slot. Runs once at construction, and again when a
        step or an insert raised: their input cache was donated to the failed call, so no occupied row can go on
        (`resets` tells a caller that its sequences were lost)."""
        cfg, policy, b = self.engine.cfg, self.engine.policy, self.max_batch
        self._cache = self._token_B = None  # drop the old buffers before the new ones are allocated
        # On a mesh the rows hold the mesh's KV heads, placed as the prefill's row cache is (`model.sharding`).
        empty = init_cache(cfg, self.cache_len, DTYPES[policy.kv_dtype], batch=b, layout=self.engine.layout)
        self._cache = KVCache(k=empty.k, v=empty.v, length=jnp.asarray(np.zeros(b, np.int32)))
        self._token_B = jnp.asarray(np.full(b, cfg.pad_token_id, np.int32))
        self._active = np.zeros(b, bool)
        self._temperature = np.ones(b, np.float32)
        self._top_k = np.zeros(b, np.int32)
        self._top_p = np.ones(b, np.float32)
        self._seed = np.zeros(b, np.uint32)
        self._greedy = np.ones(b, bool)
        self._left = np.zeros(b, np.int64)  # per row: the steps its prefill's max_new_tokens still allows
        self._rows = None  # the device copies of the per-row settings; rebuilt after a join or a leave
        self._rows_k: dict[int, jax.Array] = {}  # per row count k: the rows a step of k decodes, int32 [k]; as `_rows`
        self.resets += 1

    @property
    def active(self) -> tuple[int, ...]:
        """The occupied slots, in order."""
        return tuple(int(s) for s in np.flatnonzero(self._active))

    def prefill(self, slot: int, prompt_ids: Sequence[int], max_new_tokens: int,
                sampling: Sampling = GREEDY) -> SlotPrefill:  # fmt: skip
        """Start the sequence of `prompt_ids` in the free `slot` with room for `max_new_tokens` new tokens: its
        prefill (one row, its own bucket, at the slots' cache length), the row copied into the slot, and its first
        token. Raises EngineError for a slot out of range or occupied, a prompt the engine refuses
        (`Engine.check_request`), and a prompt + max_new_tokens above the slots' `cache_len` positions (or a
        bucket above it); the slot stays free. Whatever the device raised for the prefill (the slot stays free) or
        the insert (then every slot is free: `resets` + 1)."""
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.max_batch:
            raise EngineError(f"slot {slot!r}: expected 0..{self.max_batch - 1}")
        if self._active[slot]:
            raise EngineError(f"slot {slot} is occupied; free it first")
        n = len(prompt_ids)
        bucket = self.engine.check_request(n, max_new_tokens)
        if n + max_new_tokens > self.cache_len or bucket > self.cache_len:
            raise EngineError(f"{n} prompt tokens + {max_new_tokens} new tokens (bucket {bucket}) exceed the "
                              f"slots' {self.cache_len} positions (--max-length): lower max_tokens or raise "
                              "--max-length")  # fmt: skip
        ids = np.full((1, bucket), self.engine.cfg.pad_token_id, np.int32)
        ids[0, :n] = np.asarray(prompt_ids, np.int32)
        token_1, row = self.engine.prefill_row(ids, n, self.cache_len, sampling.args(), sampling.greedy)
        try:
            self._cache, self._token_B = _insert_program(self._cache, self._token_B, row, token_1, jnp.int32(slot))
        except Exception:
            self._reset()
            raise
        self._active[slot] = True
        self._temperature[slot] = max(sampling.temperature, 1e-6)  # as Sampling.args
        self._top_k[slot], self._top_p[slot], self._seed[slot] = sampling.top_k, sampling.top_p, sampling.seed
        self._greedy[slot] = sampling.greedy
        self._left[slot] = max_new_tokens - 1  # the prefill made the first of them
        self._rows = None
        return SlotPrefill(token_id=int(np.asarray(token_1)[0]), bucket=bucket)

    def step(self) -> np.ndarray:
        """One decode step (one jitted call) of every occupied row: of `step_rows` rows, the occupied ones and free
        ones up to that count, the others untouched. The next token of each row, int numpy [max_batch] (a free
        row's entry is meaningless). Raises EngineError, before anything runs and with every row kept, when no
        slot is occupied or an occupied row has made the max_new_tokens its `prefill` was given (its cache may
        hold no more: free it first); whatever the device raised for the step, after which every slot is free
        (`resets` + 1)."""
        if not self._active.any():
            raise EngineError("no occupied slot to step")
        spent = np.flatnonzero(self._active & (self._left <= 0))
        if spent.size:
            raise EngineError(f"slot {int(spent[0])} has made every new token its prefill's max_new_tokens allowed: "
                              "free it before the next step")  # fmt: skip
        tokens = self._step(greedy=bool(self._greedy[self._active].all()))
        self._left[self._active] -= 1
        return tokens

    def step_rows(self) -> int:
        """How many rows the next `step` decodes: the fewest of `row_counts` that hold every occupied row, else all
        `max_batch`."""
        occupied = int(self._active.sum())
        return next((k for k in self.row_counts if k >= occupied), self.max_batch)

    def _step(self, *, greedy: bool, k: int | None = None) -> np.ndarray:
        k = self.step_rows() if k is None else k
        if self._rows is None:
            self._rows = (jnp.asarray(self._active), tuple(jnp.asarray(a) for a in (
                self._temperature, self._top_k, self._top_p, self._seed, self._greedy)))  # fmt: skip
            self._rows_k = {}
        active_B, rows = self._rows
        engine = self.engine
        try:
            if k < self.max_batch:
                if k not in self._rows_k:  # the occupied rows, then the lowest free ones
                    order = np.concatenate([np.flatnonzero(self._active), np.flatnonzero(~self._active)])
                    self._rows_k[k] = jnp.asarray(order[:k].astype(np.int32))
                self._token_B, self._cache = _slot_rows_step_program(
                    engine.decode_params(k), self._cache, self._token_B, active_B, rows, self._rows_k[k],
                    cfg=engine.cfg, act_dtype=engine.policy.activation_dtype, greedy=greedy,
                    xla_options=engine.xla_options, backend=engine.backend,
                )  # fmt: skip
            else:
                self._token_B, self._cache = _slot_step_program(
                    engine.decode_params(self.max_batch), self._cache, self._token_B, active_B, rows, cfg=engine.cfg,
                    act_dtype=engine.policy.activation_dtype, greedy=greedy, xla_options=engine.xla_options,
                    backend=engine.backend,
                )  # fmt: skip
            tokens = np.asarray(self._token_B)
        except Exception:
            self._reset()
            raise
        self.steps += 1
        return tokens

    def free(self, slot: int) -> None:
        """Mark `slot` free (at once, on the host; its row is reset by the next step and replaced whole by the
        next prefill into it). Freeing a free slot does nothing."""
        if 0 <= slot < self.max_batch and self._active[slot]:
            self._active[slot] = False
            self._greedy[slot] = True
            self._rows = None

    def warmup(self, n_tokens: int, max_new_tokens: int = 1) -> int:
        """Compile (or load from the persistent cache) the programs a request of `n_tokens` prompt tokens runs:
        its greedy prefill at its bucket, the insert, and the steps of every row count (`row_counts` and all
        `max_batch` rows), greedy and with a sampled row (the steps do not depend on the prompt), then its sampled
        prefill. Runs a BOS prompt in the first free slot, steps once with each step program, frees the slot,
        prefills it again with a sampled request and frees it: meant for slots nobody occupies yet (a server's
        start), as an occupied row those steps decode loses their tokens. Returns the jit traces it took
        (`CompileCounter.traces`). Raises EngineError when no slot is free, or as `prefill`."""
        free = [s for s in range(self.max_batch) if not self._active[s]]
        if not free:
            raise EngineError("no free slot to warm up in")
        traces0 = CompileCounter.traces
        prompt = [self.engine.cfg.bos_token_id] * n_tokens
        self.prefill(free[0], prompt, max(max_new_tokens, 2))
        try:
            for k in (*self.row_counts, self.max_batch):
                self._step(greedy=True, k=k)
                self._step(greedy=False, k=k)
        finally:
            self.free(free[0])
        self.prefill(free[0], prompt, max(max_new_tokens, 2), Sampling(temperature=1.0))
        self.free(free[0])
        return CompileCounter.traces - traces0


__all__ = ["SlotDecoder", "SlotPrefill"]
