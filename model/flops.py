"""The prefill's work as arithmetic: its chunk size and the FLOPs it computes for a prompt.

Pure functions of a `ModelConfig` on Python ints: no jax and no numpy, so the report can put a prefill's achieved
FLOP/s beside the measured matrix-product rate on archived runs (docs/method.md, "Rooflines": prefill is
compute-bound). `model.forward.prefill` takes its chunk from `prefill_chunk`, so both count the same program.

Key: D model width, N query heads, K kv heads, H head dim, F feed-forward width, P per-layer-input (PLE) width,
L layers, V vocab, W sliding window, C chunk positions, R ring slots, S cache slots.
"""

from __future__ import annotations

from model.config import ModelConfig

PREFILL_CHUNK = 128
"""Prompt positions per prefill chunk (`model.forward.prefill`), capped by the bucket and the sliding window.
128 because on the default preset (2-core CPU) it was as fast as 64 with half the loop trips, and faster than 256
and 512: a sliding layer's chunk reads R + C keys per query, so smaller chunks waste less; a GPU was not measured.
The measurements: docs/engine.md, "Prefill"."""


def prefill_chunk(cfg: ModelConfig, bucket: int, chunk: int = PREFILL_CHUNK) -> int:
    """Positions per chunk C = min(chunk, bucket, sliding window): C <= W keeps one chunk's ring slots distinct,
    C <= bucket keeps the padded prompt within one chunk of the bucket. Raises ValueError for chunk < 1."""
    if chunk < 1:
        raise ValueError(f"prefill chunk must be at least 1 position, got {chunk}")
    return min(chunk, bucket, cfg.sliding_window)


def prefill_tail(chunk: int) -> int | None:
    """Positions of the prefill's tail chunk for chunks of C = `chunk` positions: C // 4 when C >= 8 and 4 divides
    C (32 for C = 128), else None (no tail chunk).

    A prompt of n real positions whose last chunk would hold r = n mod C real positions, 0 < r <= C // 4, runs that
    chunk as a tail chunk of C // 4 positions instead of C (`prefill_chunks`): the same number of chunks, so the
    same reads of the weights, and 3C / 4 fewer positions computed. The sweep's sizes 41, 521, 2057 and 3593 are
    each 9 past a bucket edge: at 521 tokens (bucket 1024, C = 128) 4 x 128 + 32 = 544 positions are computed
    instead of 5 x 128 = 640. A tail of C // 4 starts at a multiple of C, so at a multiple of itself, and divides
    every ring C divides: the chunk attention's layout rules hold for it (`model.prefill`). One tail size only: each
    size is another copy of the cache layers in the compiled prefill."""
    return chunk // 4 if chunk >= 8 and chunk % 4 == 0 else None


def prefill_chunks(n_tokens: int, chunk: int, *, bucket: int | None = None) -> list[tuple[int, int]]:
    """(start, positions) of each chunk `model.forward.prefill` runs for `n_tokens` real positions in chunks of
    `chunk` (= C, `prefill_chunk` of the bucket): C-position chunks from 0, the last one a tail chunk of
    `prefill_tail(C)` positions when the real positions left for it fit one (at most C // 4); a bucket of one
    chunk (`bucket` <= C; default: n_tokens <= C) runs exactly one chunk of C. Raises ValueError for n_tokens or
    chunk below 1."""
    if n_tokens < 1 or chunk < 1:
        raise ValueError(f"n_tokens and chunk must be at least 1, got n_tokens={n_tokens}, chunk={chunk}")
    if (n_tokens if bucket is None else bucket) <= chunk:
        return [(0, chunk)]
    full, rest = divmod(n_tokens, chunk)
    tail = prefill_tail(chunk)
    plan = [(i * chunk, chunk) for i in range(full)]
    if rest and tail is not None and rest <= tail:
        plan.append((full * chunk, tail))
    elif rest:
        plan.append((full * chunk, chunk))
    return plan


def _layer_matmul_flops(cfg: ModelConfig, i: int) -> int:
    """FLOPs of layer i's projections for one position: 2 x (the weight scalars a position multiplies), i.e.
    q (D*N*H), k and v when the layer owns them (2*D*K*H), o (N*H*D), gate/up/down (3*D*F), PLE gate and
    projection (2*D*P)."""
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.kv_heads(i), cfg.layer_head_dim(i)
    f, p = cfg.ffw_dim(i), cfg.ple_dim
    kv = 0 if cfg.is_kv_shared(i) else 2 * d * k * h
    return 2 * (2 * d * n * h + kv + 3 * d * f + 2 * d * p)


def _attention_flops_per_key(cfg: ModelConfig, i: int) -> int:
    """FLOPs of one query position against one key in layer i: q.k and p.v, 2*H each, for N query heads."""
    return 4 * cfg.num_heads * cfg.layer_head_dim(i)


def prefill_flops(
    cfg: ModelConfig, n_tokens: int, chunk: int, *, cache_len: int | None = None, bucket: int | None = None
) -> int:
    """Matrix-product FLOPs a chunked prefill of `n_tokens` real positions computes (multiply-add = 2 FLOPs).

    - projections of the cache layers (`cfg.cache_layers`) and the PLE input projection (2*D*L*P) for the
      n real positions (the padded tail of the last chunk, computed but useless, is not counted);
    - attention of the cache layers as the chunking computes it (`prefill_chunks`: chunks of C = `chunk`
      positions, the last one possibly a tail chunk of C // 4), for each real query position of a chunk of U
      positions starting at s: 4*N*H per key, over R + U keys on a sliding layer (the whole ring, R = min(W, S),
      and the chunk's own keys; only U when the bucket is one chunk, as the program then reads no ring) and
      s + U keys on a full layer;
    - the KV-shared layers for the last position only: their projections and attention over their producer's
      buffer (R slots when sliding, S when full); then the logits, 2*D*V.
    Not counted: norms, RoPE, softmax, GELU and other elementwise work, the embedding gathers.
    `cache_len`: the cache's slots S (bucket + max_new_tokens; default n_tokens). `bucket`: the padded prompt
    length (default: one chunk exactly when n_tokens <= chunk, as on the default ladder). Raises ValueError for
    n_tokens or chunk below 1.
    """
    plan = prefill_chunks(n_tokens, chunk, bucket=bucket)  # ValueError for n_tokens or chunk below 1
    s = n_tokens if cache_len is None else cache_len
    only = (n_tokens if bucket is None else bucket) <= chunk  # `model.forward.prefill` then reads no ring
    r = 0 if only else min(cfg.sliding_window, s)
    real = [(c0, u, min(u, n_tokens - c0)) for c0, u in plan]  # (start, positions, real positions) per chunk
    full_keys = sum(q * (c0 + u) for c0, u, q in real)
    sliding_keys = sum(q * (r + u) for _, u, q in real)
    total = n_tokens * 2 * cfg.hidden_size * cfg.num_layers * cfg.ple_dim
    for i in cfg.cache_layers:
        keys = sliding_keys if cfg.is_sliding(i) else full_keys
        total += n_tokens * _layer_matmul_flops(cfg, i) + keys * _attention_flops_per_key(cfg, i)
    for i in range(cfg.first_shared_layer, cfg.num_layers):
        slots = min(cfg.sliding_window, s) if cfg.is_sliding(i) else s
        total += _layer_matmul_flops(cfg, i) + slots * _attention_flops_per_key(cfg, i)
    return total + 2 * cfg.hidden_size * cfg.vocab_size


def decode_flops(cfg: ModelConfig, cache_len: int, batch: int = 1) -> int:
    """Matrix-product FLOPs of one decode step of `batch` rows over caches of `cache_len` slots (bucket +
    max_new_tokens, or the positions a step sees where the CPU attention kernel reads only those:
    `model.engine.Engine.decode_positions`; multiply-add = 2 FLOPs), for the arithmetic intensity of a step
    (docs/method.md, "Batches").

    Per row: every layer's projections (as `prefill_flops` counts them), its attention over the whole buffer of
    its KV source as the step computes it (masked slots included, as `model.accounting.kv_read_elements` counts
    their bytes: R = min(W, S) slots on a sliding layer, S on a full one), the PLE input projection (2*D*L*P) and
    the logits (2*D*V); times `batch`. Not counted: norms, RoPE, softmax, GELU, the embedding gathers. Raises
    ValueError for cache_len or batch below 1.
    """
    if cache_len < 1 or batch < 1:
        raise ValueError(f"cache_len and batch must be at least 1, got cache_len={cache_len}, batch={batch}")
    row = 2 * cfg.hidden_size * cfg.num_layers * cfg.ple_dim + 2 * cfg.hidden_size * cfg.vocab_size
    for i in range(cfg.num_layers):
        src = cfg.kv_source(i)
        keys = min(cfg.sliding_window, cache_len) if cfg.is_sliding(src) else cache_len
        row += _layer_matmul_flops(cfg, i) + keys * _attention_flops_per_key(cfg, i)
    return batch * row
