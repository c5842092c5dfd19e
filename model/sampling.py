"""Choosing the next token: the decoding settings (`Sampling`, `GREEDY`) and the choice from logits (`choose`).

Key: B rows, V vocab.

Shared by the engine's programs (`model.engine`: one sequence or a batch of rows) and the decode slots'
(`model.slots`: each row with its own settings); `Sampling` is part of the public API (`model.Sampling`). A
sampled token at position p is drawn with the key fold_in(PRNGKey(seed), p), the same in every program, so a row
of a batch or a slot draws exactly what the same sequence alone draws.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from model.errors import EngineError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
    """Decoding settings. temperature 0 is greedy (argmax); otherwise temperature / top-k (0 = off) / top-p
    sampling, deterministic for a seed (the key of each position is fold_in(PRNGKey(seed), position))."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise EngineError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise EngineError(f"top_p must be in (0, 1] and top_k >= 0, got top_p={self.top_p}, top_k={self.top_k}")
        if not 0 <= self.seed < 2**32:
            raise EngineError(f"seed must be in [0, 2^32), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def args(self) -> tuple[jax.Array, ...]:
        return (jnp.float32(max(self.temperature, 1e-6)), jnp.int32(self.top_k), jnp.float32(self.top_p),
                jnp.uint32(self.seed))  # fmt: skip


GREEDY = Sampling()


def choose(logits_BV: jax.Array, position: jax.Array, args, greedy: bool) -> jax.Array:
    """Next token ids [B] (int32) from float32 logits [B,V]. `position` (the position decoded, for the sampling
    key): an int32 scalar for every row, or [B] per row, row b then drawn with row b's own key exactly as a
    single sequence at that position is."""
    if greedy:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    temperature, top_k, top_p, seed = args
    z_BV = logits_BV / temperature
    sorted_BV = jnp.sort(z_BV, axis=-1)[:, ::-1]
    v = z_BV.shape[-1]
    kth_B1 = jnp.take_along_axis(sorted_BV, jnp.clip(top_k - 1, 0, v - 1)[None, None], axis=-1)
    z_BV = jnp.where((top_k > 0) & (z_BV < kth_B1), -jnp.inf, z_BV)
    probs_BV = jax.nn.softmax(jnp.sort(z_BV, axis=-1)[:, ::-1], axis=-1)
    keep_BV = (jnp.cumsum(probs_BV, axis=-1) - probs_BV) < top_p  # smallest prefix reaching top_p
    cut_B1 = jnp.min(jnp.where(keep_BV, jnp.sort(z_BV, axis=-1)[:, ::-1], jnp.inf), axis=-1, keepdims=True)
    z_BV = jnp.where(z_BV < cut_B1, -jnp.inf, z_BV)
    if jnp.ndim(position):  # per row: row b's draw is a single sequence's [1, V] draw with its key
        base = jax.random.PRNGKey(seed)

        def row(p, z_V):
            return jax.random.categorical(jax.random.fold_in(base, p), z_V[None], axis=-1)[0]

        return jax.vmap(row)(position, z_BV).astype(jnp.int32)
    key = jax.random.fold_in(jax.random.PRNGKey(seed), position)
    return jax.random.categorical(key, z_BV, axis=-1).astype(jnp.int32)


__all__ = ["GREEDY", "Sampling", "choose"]
