"""The KV cache pytree and its invariant.

Key: B batch, K kv heads, S full-cache slots, R ring slots, H head dim. Layout [B,K,S,H], head-major: the batch
axes (B, K) outermost let the decode attention read the cache in place (see `model.layers.attend`).

Only the layers that own K/V have a cache (`ModelConfig.cache_layers`: 15 for E2B); KV-shared layers read their
producer's. Full-attention layers keep one slot per absolute position (slot p holds position p). Sliding layers
keep a ring of R = min(sliding_window, S) slots: position p lives in slot p mod R.

THE INVARIANT (enforced by `model.forward.prefill` and `model.forward.decode_step`, the only writers):
a slot holds exactly one absolute REAL position or nothing (zeros); padding never occupies a slot.
Positions are written in order 0, 1, 2, ... so the position a ring slot holds is derivable from the cache length
alone, and no slot-position table is stored (`ring_positions`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from model.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Per cache layer (in `cfg.cache_layers` order): k and v of shape [B, K, S or R, H] in the KV dtype.

    `length` (int32 scalar) is the number of real positions written so far.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    length: jax.Array


def ring_size(cfg: ModelConfig, max_len: int) -> int:
    """Slots of a sliding layer's ring: the window, or fewer when the whole sequence fits (no wrap then)."""
    return min(cfg.sliding_window, max_len)


def slots(cfg: ModelConfig, layer: int, max_len: int) -> int:
    """Slots of `layer`'s cache: `max_len` for full attention, the ring size for sliding attention."""
    return ring_size(cfg, max_len) if cfg.is_sliding(layer) else max_len


def init_cache(cfg: ModelConfig, max_len: int, dtype, batch: int = 1) -> KVCache:
    """An empty cache (zeros, length 0) able to hold `max_len` positions (prompt bucket + max_new_tokens)."""
    shapes = [(batch, cfg.kv_heads(i), slots(cfg, i, max_len), cfg.layer_head_dim(i)) for i in cfg.cache_layers]
    return KVCache(
        k=tuple(jnp.zeros(s, dtype) for s in shapes),
        v=tuple(jnp.zeros(s, dtype) for s in shapes),
        length=jnp.zeros((), jnp.int32),
    )


def kv_read_bytes(cfg: ModelConfig, max_len: int, itemsize: int) -> int:
    """Bytes of K and V that one decode step's attention reads: every layer reads the whole cache buffer of its KV
    source (its own, or its producer's for a KV-shared layer), masked slots included; a producer's cache is
    therefore read once per layer that uses it (E2B: layer 14's by layers 14, 19, 24, 29 and 34)."""
    total = 0
    for i in range(cfg.num_layers):
        src = cfg.kv_source(i)
        total += 2 * slots(cfg, src, max_len) * cfg.kv_heads(src) * cfg.layer_head_dim(src) * itemsize
    return total


def ring_positions(length: jax.Array, ring: int) -> jax.Array:
    """Absolute position held by each of the `ring` slots [R] (int32) once `length` positions are written;
    -1 for an empty slot. Slot s holds the latest p < length with p = s (mod R)."""
    last = length - 1
    s_R = jnp.arange(ring, dtype=jnp.int32)
    pos_R = last - jnp.mod(last - s_R, ring)
    return jnp.where(pos_R >= 0, pos_R, -1)
