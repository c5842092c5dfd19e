"""The KV cache pytree and its invariant.

Key: B batch, K kv heads, S full-cache slots, R ring slots, H head dim. Layout [B,K,S,H], head-major: the batch
axes (B, K) outermost let the decode attention read the cache in place (see `model.layers.attend`).

Only the layers that own K/V have a cache (`ModelConfig.cache_layers`: 15 for E2B); KV-shared layers read their
producer's. Full-attention layers keep one slot per absolute position (slot p holds position p). Sliding layers
keep a ring of R = min(sliding_window, S) slots: position p lives in slot p mod R. The slot counts, and the bytes
a decode step reads from this cache, are `model.accounting.slots` / `kv_read_bytes` (jax-free).

THE INVARIANT (enforced by `model.forward.prefill` and `model.forward.decode_step`, the only writers), per row:
a slot of row b holds exactly one absolute REAL position of row b or nothing (zeros); padding never occupies a
slot. Positions are written in order 0, 1, 2, ... so the position a ring slot holds is derivable from the row's
length alone, and no slot-position table is stored (`ring_positions`).

One length or one per row: the single-sequence engine (`model.engine.Engine.generate`) keeps one scalar `length`
for all rows; a batch of prompts of different lengths (`Engine.generate_batch`) keeps `length` [B], each row its
own count of real positions, its own ring (row b's position p in slot p mod R of row b) and its own next slot.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from model.accounting import slots
from model.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Per cache layer (in `cfg.cache_layers` order): k and v of shape [B, K, S or R, H] in the KV dtype.

    `length` (int32) is the number of real positions written so far: a scalar shared by every row (the
    single-sequence engine), or [B], one count per row (a batch of prompts of different lengths). The two are
    different compiled shapes.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    length: jax.Array


def init_cache(cfg: ModelConfig, max_len: int, dtype, batch: int = 1, layout=None) -> KVCache:
    """An empty cache of `batch` rows (zeros, scalar length 0) able to hold `max_len` positions per row (prompt
    bucket + max_new_tokens); its bytes are `model.accounting.kv_cache_bytes`. Prefill replaces the length
    with the one it is given (scalar or per row). `layout` (a `model.sharding.MeshLayout`, inside a program): the
    buffers hold the mesh's KV heads (`MeshLayout.cache_heads`: a copied KV head once per device) and are
    constrained to its cache sharding; None: one device, as before."""
    heads = cfg.kv_heads if layout is None else (lambda i: layout.cache_heads(cfg, i))
    shapes = [(batch, heads(i), slots(cfg, i, max_len), cfg.layer_head_dim(i)) for i in cfg.cache_layers]
    cache = KVCache(
        k=tuple(jnp.zeros(s, dtype) for s in shapes),
        v=tuple(jnp.zeros(s, dtype) for s in shapes),
        length=jnp.zeros((), jnp.int32),
    )
    return cache if layout is None else layout.constrain_cache(cache)


def ring_positions(length: jax.Array, ring: int) -> jax.Array:
    """Absolute position held by each of the `ring` slots once `length` positions are written: [R] (int32) for a
    scalar length, [B,R] for per-row lengths [B]; -1 for an empty slot. Slot s holds the latest p < length with
    p = s (mod R)."""
    last = length - 1
    if jnp.ndim(last):  # per row: each row's last position against every slot
        last = last[..., None]
    s_R = jnp.arange(ring, dtype=jnp.int32)
    pos_R = last - jnp.mod(last - s_R, ring)
    return jnp.where(pos_R >= 0, pos_R, -1)
