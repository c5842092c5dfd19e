"""Parameter pytrees of the Gemma 4 text decoder, their abstract shapes, and random init.

Key: V vocab, D model width, L layers, N query heads, K kv heads, H head dim (per layer), F feed-forward width
(per layer), P per-layer-input (PLE) width.

Layout: matrices are stored input-major, in the shape the einsums use (`wq_DNH`, `gate_DF`, ...); the Hugging Face
checkpoint stores linear weights [out, in], and `model.checkpoint` transposes them once at load.
Leaves are stored in one weight dtype; layers convert a weight to the activation dtype in one place
(`model.layers.dense`), which is a no-op when the two match, and the visible dtype-conversion cost when they do not.
The leaves' shapes are `model.accounting.layer_shapes` / `global_shapes`; the parameter counts and the bytes a
decode step reads are there too (jax-free, so the report can use them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from model.accounting import global_shapes, layer_shapes
from model.config import ModelConfig


def _pytree(cls):
    """Register a frozen dataclass as a jax pytree whose fields are all children (None fields have no leaves)."""
    fields = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(cls, data_fields=fields, meta_fields=[])


@_pytree
@dataclasses.dataclass(frozen=True)
class LayerParams:
    """One decoder layer. KV-shared layers have no K/V projection and no k_norm (those fields are None)."""

    attn_norm_D: jax.Array  # input_layernorm
    post_attn_norm_D: jax.Array  # post_attention_layernorm
    pre_ffw_norm_D: jax.Array  # pre_feedforward_layernorm
    post_ffw_norm_D: jax.Array  # post_feedforward_layernorm
    wq_DNH: jax.Array  # q_proj
    q_norm_H: jax.Array  # q_norm (RMSNorm over the layer's head dim)
    wk_DKH: jax.Array | None  # k_proj
    wv_DKH: jax.Array | None  # v_proj (v-norm has no weight)
    k_norm_H: jax.Array | None  # k_norm
    wo_NHD: jax.Array  # o_proj
    gate_DF: jax.Array  # mlp.gate_proj
    up_DF: jax.Array  # mlp.up_proj
    down_FD: jax.Array  # mlp.down_proj
    ple_gate_DP: jax.Array | None  # per_layer_input_gate
    ple_proj_PD: jax.Array | None  # per_layer_projection
    post_ple_norm_D: jax.Array | None  # post_per_layer_input_norm
    layer_scalar_1: jax.Array  # layer_scalar, shape [1]


@_pytree
@dataclasses.dataclass(frozen=True)
class Params:
    """The whole text decoder. The output projection is tied to `embed_VD` (Gemma 4 stores no lm_head)."""

    embed_VD: jax.Array  # embed_tokens
    ple_embed_VX: jax.Array | None  # embed_tokens_per_layer, X = L * P, layer-major columns
    ple_proj_DX: jax.Array | None  # per_layer_model_projection (transposed)
    ple_norm_P: jax.Array | None  # per_layer_projection_norm
    final_norm_D: jax.Array  # norm
    layers: tuple[LayerParams, ...]


def abstract_params(cfg: ModelConfig, dtype=jnp.float32) -> Params:
    """The parameter tree as `jax.ShapeDtypeStruct` leaves: full-size E2B/E4B shapes without allocating memory."""

    def sds(shape):
        return None if shape is None else jax.ShapeDtypeStruct(shape, dtype)

    layers = tuple(
        LayerParams(**{name: sds(s) for name, s in layer_shapes(cfg, i).items()}) for i in range(cfg.num_layers)
    )
    return Params(**{name: sds(s) for name, s in global_shapes(cfg).items()}, layers=layers)


def count_params(params: Params) -> int:
    """Number of scalars in a (real or abstract) parameter tree."""
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))


def param_bytes(params: Params) -> int:
    """Bytes of a (real or abstract) parameter tree at its stored dtypes."""
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(params))


INIT_BLOCK = 1 << 24
"""Scalars drawn per block when `init_tensors` fills a large tensor: numpy's Generator gives the same stream drawn
in blocks as in one call, so blocks change no byte and keep float32 scratch at 64 MiB (the E2B PLE table alone is
2.35e9 scalars: 9.4 GB as float32)."""


def init_tensors(cfg: ModelConfig, seed: int = 0, dtype=np.float32) -> Iterator[tuple[int | None, str, np.ndarray]]:
    """Random parameters that behave like trained ones, one leaf at a time: yields (layer or None, field, array).

    The draw order is fixed (global leaves in `global_shapes` order, then each layer in `layer_shapes` order), so
    the same seed gives the same bytes on any machine, and a caller can write each leaf and drop it: host memory
    then holds one leaf plus a 64 MiB block, however large the model (see `model.builtin.create_checkpoint`).

    Follows ../shared/gemma4-architecture.md §7: q/k-norm gains near head_dim^-1/4 so attention logits have unit
    scale (with unit gains softmax is almost one-hot and rounding flips greedy tokens). The tied embedding table
    has std 0.1/sqrt(D), not 1/sqrt(D): the output projection is the input table, so the current token's own
    embedding, carried in the residual stream, biases its own logit by about 2.7 sigma at std 1/sqrt(D) and
    greedy decoding locks into "x x x x" loops (seen on the default preset: 64 identical tokens); at 0.1/sqrt(D)
    the bias is about 0.3 sigma and greedy output varies like text. The PLE table keeps std 1/sqrt(D). Linear
    weights with std 1/sqrt(fan_in); other norm weights 1 + 0.1 noise (so a norm applied with the wrong weight is
    noticed); layer_scalar uniform in [0.7, 1.3]. Values are computed in float32 and then cast to `dtype` (a numpy
    or ml_dtypes dtype).
    """
    rng = np.random.default_rng(seed)

    def normal(shape, std):
        out = np.empty(shape, dtype)
        flat = out.reshape(-1)
        for start in range(0, flat.size, INIT_BLOCK):
            n = min(INIT_BLOCK, flat.size - start)
            flat[start : start + n] = (rng.standard_normal(n, dtype=np.float32) * np.float32(std)).astype(dtype)
        return out

    def norm_w(shape, center=1.0, noise=0.1):
        return (np.float32(center) * (1 + noise * rng.standard_normal(shape, dtype=np.float32))).astype(dtype)

    def make(name: str, shape: tuple[int, ...], head_dim: int) -> np.ndarray:
        if name in ("q_norm_H", "k_norm_H"):
            return norm_w(shape, center=head_dim**-0.25, noise=0.05)
        if name.endswith("norm_D") or name.endswith("norm_P"):
            return norm_w(shape)
        if name == "layer_scalar_1":
            return rng.uniform(0.7, 1.3, size=shape).astype(np.float32).astype(dtype)
        if name == "embed_VD":
            return normal(shape, 0.1 * cfg.hidden_size**-0.5)
        if name == "ple_embed_VX":
            return normal(shape, cfg.hidden_size**-0.5)
        fan_in = shape[0] if name != "wo_NHD" else shape[0] * shape[1]
        return normal(shape, fan_in**-0.5)

    for name, shape in global_shapes(cfg).items():
        if shape is not None:
            yield None, name, make(name, shape, 0)
    for i in range(cfg.num_layers):
        h = cfg.layer_head_dim(i)
        for name, shape in layer_shapes(cfg, i).items():
            if shape is not None:
                yield i, name, make(name, shape, h)


def init_params(cfg: ModelConfig, seed: int = 0, dtype=np.float32) -> Params:
    """The whole random parameter tree (numpy leaves of `dtype`) from `init_tensors`: same seed, same bytes."""
    glob: dict[str, np.ndarray | None] = {name: None for name in global_shapes(cfg)}
    layers: list[dict[str, np.ndarray | None]] = [dict.fromkeys(layer_shapes(cfg, i)) for i in range(cfg.num_layers)]
    for layer, name, value in init_tensors(cfg, seed, dtype):
        (glob if layer is None else layers[layer])[name] = value
    return Params(**glob, layers=tuple(LayerParams(**fields) for fields in layers))
