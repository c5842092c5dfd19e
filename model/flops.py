"""The prefill's work as arithmetic: its chunk size and the FLOPs it computes for a prompt.

Pure functions of a `ModelConfig` on Python ints: no jax and no numpy, so the report can put a prefill's achieved
FLOP/s beside the measured matrix-product rate on archived runs (measurement.md, "Rooflines": prefill is
compute-bound). `model.forward.prefill` takes its chunk from `prefill_chunk`, so both count the same program.

Key: D model width, N query heads, K kv heads, H head dim, F feed-forward width, P per-layer-input (PLE) width,
L layers, V vocab, W sliding window, C chunk positions, R ring slots, S cache slots.
"""

from __future__ import annotations

from model.config import ModelConfig

PREFILL_CHUNK = 256
"""Prompt positions per prefill chunk (`model.forward.prefill`), capped by the bucket and the sliding window."""


def prefill_chunk(cfg: ModelConfig, bucket: int, chunk: int = PREFILL_CHUNK) -> int:
    """Positions per chunk C = min(chunk, bucket, sliding window): C <= W keeps one chunk's ring slots distinct,
    C <= bucket keeps the padded prompt within one chunk of the bucket. Raises ValueError for chunk < 1."""
    if chunk < 1:
        raise ValueError(f"prefill chunk must be at least 1 position, got {chunk}")
    return min(chunk, bucket, cfg.sliding_window)


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


def prefill_flops(cfg: ModelConfig, n_tokens: int, chunk: int, *, cache_len: int | None = None) -> int:
    """Matrix-product FLOPs a chunked prefill of `n_tokens` real positions computes (multiply-add = 2 FLOPs).

    - projections of the cache layers (`cfg.cache_layers`) and the PLE input projection (2*D*L*P) for the
      n real positions (the padded tail of the last chunk, computed but useless, is not counted);
    - attention of the cache layers as the chunking computes it, for each real query position of chunk c
      (positions c*C .. c*C+C-1, C = `chunk`): 4*N*H per key, over R + C keys on a sliding layer (the whole
      ring, R = min(W, S), and the chunk's own keys) and (c + 1) * C keys on a full layer;
    - the KV-shared layers for the last position only: their projections and attention over their producer's
      buffer (R slots when sliding, S when full); then the logits, 2*D*V.
    Not counted: norms, RoPE, softmax, GELU and other elementwise work, the embedding gathers.
    `cache_len`: the cache's slots S (bucket + max_new_tokens; default n_tokens). Raises ValueError for
    n_tokens or chunk below 1.
    """
    if n_tokens < 1 or chunk < 1:
        raise ValueError(f"n_tokens and chunk must be at least 1, got n_tokens={n_tokens}, chunk={chunk}")
    s = n_tokens if cache_len is None else cache_len
    r = min(cfg.sliding_window, s)
    full_keys = sum(min(chunk, n_tokens - c0) * (c0 + chunk) for c0 in range(0, n_tokens, chunk))
    total = n_tokens * 2 * cfg.hidden_size * cfg.num_layers * cfg.ple_dim
    for i in cfg.cache_layers:
        keys = n_tokens * (r + chunk) if cfg.is_sliding(i) else full_keys
        total += n_tokens * _layer_matmul_flops(cfg, i) + keys * _attention_flops_per_key(cfg, i)
    for i in range(cfg.first_shared_layer, cfg.num_layers):
        slots = r if cfg.is_sliding(i) else s
        total += _layer_matmul_flops(cfg, i) + slots * _attention_flops_per_key(cfg, i)
    return total + 2 * cfg.hidden_size * cfg.vocab_size
