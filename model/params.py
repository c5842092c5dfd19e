"""Parameter pytrees of the Gemma 4 text decoder, their abstract shapes, and random init.

Key: V vocab, D model width, L layers, N query heads, K kv heads, H head dim (per layer), F feed-forward width
(per layer), P per-layer-input (PLE) width.

Two layouts. The storage layout (`model.accounting.layer_shapes`: one leaf per checkpoint tensor, input-major,
e.g. `wq_DNH`, `gate_DF`) is what `init_tensors` draws and `model.checkpoint` reads and writes (it transposes the
Hugging Face [out, in] weights once). The compute layout (`LayerParams`) is what the forward pass reads: q/k/v and
gate/up fused, long axes minor; `fuse_layer` / `unfuse_layer` convert one layer, once, at load.
Leaves are stored in one weight dtype; layers convert a weight to the activation dtype in one place
(`model.layers.dense`), which is a no-op when the two match, and the visible dtype-conversion cost when they do not.
The leaves' shapes are `model.accounting.layer_shapes` / `global_shapes`; the parameter counts and the bytes a
decode step reads are there too (jax-free, so the report can use them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from model.accounting import compute_layer_shapes, global_shapes, layer_shapes
from model.config import ModelConfig
from model.quantspec import EXPERT_PROJECTIONS, LAYER_PROJECTIONS


def _pytree(cls):
    """Register a frozen dataclass as a jax pytree whose fields are all children (None fields have no leaves)."""
    fields = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(cls, data_fields=fields, meta_fields=[])


@_pytree
@dataclasses.dataclass(frozen=True)
class LayerParams:
    """One decoder layer in the compute layout: the projections that read the same activation are fused into one
    matrix, and every matrix keeps its longer axis minor (contiguous). KV-shared layers project queries only and
    have no k_norm (None). Built from the checkpoint's tensors by `fuse_layer`; `unfuse_layer` is its inverse.

    Why this layout (2-core CPU, float32, XLA jax 0.12, chains of matrix-vector products over 256 MiB of distinct
    matrices, so that none is served from the 32 MiB L3): [2048, 256] read as x[1,2048] @ W[2048,256] ran at
    8.5 GB/s, and the same product with W stored [256, 2048] (the checkpoint's [out, in]) at 13.6 GB/s; wide
    [256, 2048] matrices ran at 13.9 GB/s input-major and 7.9 GB/s output-major. Products of at least ~3M weights
    ([256, 3072]) ran on both cores (19-20 GB/s, process time twice the wall time); [256, 2560] and smaller on one.
    Fusing q/k/v and gate/up makes fewer, larger products (e.g. the default preset's full layers: q/k/v
    [256, 5120]); storing o_proj, down_proj and the PLE gate output-major reads them along their long axis.
    """

    attn_norm_D: jax.Array  # input_layernorm
    post_attn_norm_D: jax.Array  # post_attention_layernorm
    pre_ffw_norm_D: jax.Array  # pre_feedforward_layernorm
    post_ffw_norm_D: jax.Array  # post_feedforward_layernorm
    qkv_DX: jax.Array  # [D, (N + 2K) * H]: q_proj, k_proj, v_proj side by side (KV-shared layers: [D, N * H], q only)
    q_norm_H: jax.Array  # q_norm (RMSNorm over the layer's head dim)
    k_norm_H: jax.Array | None  # k_norm (v-norm has no weight)
    o_DX: jax.Array  # [D, N * H]: o_proj as the checkpoint stores it (output-major)
    gate_up_DX: jax.Array  # [D, 2F]: mlp.gate_proj then mlp.up_proj
    down_DF: jax.Array  # [D, F]: mlp.down_proj as stored (output-major)
    ple_gate_PD: jax.Array | None  # [P, D]: per_layer_input_gate as stored (output-major)
    ple_proj_PD: jax.Array | None  # [P, D]: per_layer_projection, input-major
    post_ple_norm_D: jax.Array | None  # post_per_layer_input_norm
    layer_scalar_1: jax.Array  # layer_scalar, shape [1]
    # The expert block (26B-A4B; None without experts): `model.accounting.expert_shapes`, `model.moe`.
    router_DE: jax.Array | None = None  # router.proj, input-major [D, E]
    router_scale_D: jax.Array | None = None  # router.scale
    expert_scale_E: jax.Array | None = None  # router.per_expert_scale
    experts_gate_up_EDX: Any = None  # [E, D, 2I]: experts.gate_up_proj (gate then up), input-major
    experts_down_EDF: Any = None  # [E, D, I]: experts.down_proj as stored (output-major)
    post_ffw1_norm_D: jax.Array | None = None  # post_feedforward_layernorm_1 (after the dense MLP)
    pre_ffw2_norm_D: jax.Array | None = None  # pre_feedforward_layernorm_2 (the experts' input)
    post_ffw2_norm_D: jax.Array | None = None  # post_feedforward_layernorm_2 (after the experts)


_NORMS = ("attn_norm_D", "post_attn_norm_D", "pre_ffw_norm_D", "post_ffw_norm_D", "q_norm_H", "k_norm_H",
          "post_ple_norm_D", "layer_scalar_1", "router_DE", "router_scale_D", "expert_scale_E", "experts_gate_up_EDX",
          "experts_down_EDF", "post_ffw1_norm_D", "pre_ffw2_norm_D", "post_ffw2_norm_D")  # fmt: skip
"""Fields that `fuse_layer` passes through unchanged (their storage and compute forms are the same; the expert
block's leaves among them)."""


def _xp(x):
    """The array module of `x`: numpy for numpy arrays (host-side fusion at load), jax.numpy otherwise."""
    return np if isinstance(x, np.ndarray) else jnp


def _t(x):
    """x transposed, contiguous (numpy copies; under jax the layout is XLA's)."""
    return np.ascontiguousarray(x.T) if isinstance(x, np.ndarray) else x.T


def fuse_layer(leaves: Mapping[str, Any]) -> LayerParams:
    """The compute layout of one layer from its storage leaves (`model.accounting.layer_shapes` names and shapes:
    wq_DNH [D,N,H], wk_DKH / wv_DKH [D,K,H] or None, wo_NHD [N,H,D], gate_DF / up_DF [D,F], down_FD [F,D],
    ple_gate_DP [D,P], ple_proj_PD [P,D], norms), numpy or jax arrays of one dtype. Values are copied, not changed:
    `unfuse_layer(cfg, i, fuse_layer(x))` returns x."""
    wq = leaves["wq_DNH"]
    xp = _xp(wq)
    d = wq.shape[0]
    parts = [wq.reshape(d, -1)] + [leaves[k].reshape(d, -1) for k in ("wk_DKH", "wv_DKH") if leaves[k] is not None]
    gate = leaves["ple_gate_DP"]
    return LayerParams(
        **{k: leaves[k] for k in _NORMS},
        qkv_DX=xp.concatenate(parts, axis=1),
        o_DX=_t(leaves["wo_NHD"].reshape(-1, d)),
        gate_up_DX=xp.concatenate([leaves["gate_DF"], leaves["up_DF"]], axis=1),
        down_DF=_t(leaves["down_FD"]),
        ple_gate_PD=None if gate is None else _t(gate),
        ple_proj_PD=leaves["ple_proj_PD"],
    )


def unfuse_layer(cfg: ModelConfig, i: int, lp: LayerParams) -> dict[str, Any]:
    """The storage leaves of layer i (`model.accounting.layer_shapes` names and shapes) from its compute layout:
    the inverse of `fuse_layer`, for writing a checkpoint."""
    s = layer_shapes(cfg, i)
    n, h = cfg.num_heads, cfg.layer_head_dim(i)
    kh = cfg.kv_heads(i) * h
    q, rest = lp.qkv_DX[:, : n * h], lp.qkv_DX[:, n * h :]
    f = lp.gate_up_DX.shape[1] // 2
    own_kv, own_v = s["wk_DKH"] is not None, s["wv_DKH"] is not None
    return {
        **{k: getattr(lp, k) for k in _NORMS},
        "wq_DNH": q.reshape(s["wq_DNH"]),
        "wk_DKH": rest[:, :kh].reshape(s["wk_DKH"]) if own_kv else None,
        "wv_DKH": rest[:, kh:].reshape(s["wv_DKH"]) if own_v else None,
        "wo_NHD": _t(lp.o_DX).reshape(s["wo_NHD"]),
        "gate_DF": lp.gate_up_DX[:, :f], "up_DF": lp.gate_up_DX[:, f:],
        "down_FD": _t(lp.down_DF),
        "ple_gate_DP": None if lp.ple_gate_PD is None else _t(lp.ple_gate_PD),
        "ple_proj_PD": lp.ple_proj_PD,
    }  # fmt: skip


@_pytree
@dataclasses.dataclass(frozen=True)
class Params:
    """The whole text decoder. The output projection is tied to `embed_VD` (Gemma 4 stores no lm_head): it reads
    `embed_VD` itself, or `lm_head_VD` when the load made a separate (quantized) copy of it (`--quant
    int8_lm_head`, `model.quant.quantize_params`). Any weight leaf may be a `model.quant.QuantArray`; the layers
    read them through `model.layers.dense` and `model.quant.take_rows`, which dispatch on the leaf."""

    embed_VD: jax.Array  # embed_tokens
    ple_embed_VX: jax.Array | None  # embed_tokens_per_layer, X = L * P, layer-major columns
    ple_proj_DX: jax.Array | None  # per_layer_model_projection (transposed)
    ple_norm_P: jax.Array | None  # per_layer_projection_norm
    final_norm_D: jax.Array  # norm
    layers: tuple[LayerParams, ...]
    lm_head_VD: Any = None  # [V, D] copy of embed_VD for the output projection (a QuantArray), or None: tied


def output_major_params(params: Params, *, release: bool = False) -> Params:
    """`params` with each dense input-major projection (every layer's `qkv_DX` and `gate_up_DX`, and `ple_proj_DX`)
    replaced by a transposed copy (`model.quant.OutputMajor`), for batched decode on CPU (`Engine.batch_params`):
    the same products, read weight-left (`model.backends.cpu.forms.weight_left_form`). Quantized leaves are kept as
    they are.
    The copy's bytes: `output_major_bytes`. With `release`, each original is deleted once its copy exists, so the
    peak is one leaf above the weights (`model.engine.load_engine`, which keeps only the transposed form for the
    CPU kernels); `params` must then not be used again."""
    from model.quant import output_major

    def transposed(w):
        copy = output_major(w)
        if release and copy is not w:
            jax.block_until_ready(copy)
            w.delete()
        return copy

    layers = tuple(dataclasses.replace(lp, qkv_DX=transposed(lp.qkv_DX), gate_up_DX=transposed(lp.gate_up_DX))
                   for lp in params.layers)  # fmt: skip
    return dataclasses.replace(params, layers=layers, ple_proj_DX=transposed(params.ple_proj_DX))


def output_major_bytes(params: Params) -> int:
    """Bytes `output_major_params` adds beside `params` (the dense leaves it copies; 0 when all are quantized or
    already held transposed, as `model.engine.load_engine` holds them for the CPU kernels)."""
    from model.quant import OutputMajor, QuantArray

    leaves = [lp.qkv_DX for lp in params.layers] + [lp.gate_up_DX for lp in params.layers] + [params.ple_proj_DX]
    return sum(int(w.nbytes) for w in leaves
               if w is not None and not isinstance(w, QuantArray | OutputMajor) and w.ndim == 2)  # fmt: skip


def abstract_params(cfg: ModelConfig, dtype=jnp.float32) -> Params:
    """The parameter tree as `jax.ShapeDtypeStruct` leaves: full-size E2B/E4B shapes without allocating memory."""

    def sds(shape):
        return None if shape is None else jax.ShapeDtypeStruct(shape, dtype)

    layers = tuple(
        LayerParams(**{name: sds(s) for name, s in compute_layer_shapes(cfg, i).items()})
        for i in range(cfg.num_layers)
    )
    return Params(**{name: sds(s) for name, s in global_shapes(cfg).items()}, layers=layers)


def count_params(params: Params) -> int:
    """Number of scalars in a (real or abstract) parameter tree."""
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))


def param_bytes(params: Params) -> int:
    """Bytes of a (real or abstract) parameter tree as stored: `model.quant.tree_bytes` (dense leaves at their
    dtype, quantized leaves at their packed values plus scales)."""
    from model.quant import tree_bytes

    return tree_bytes(params)


INIT_BLOCK = 1 << 24
"""Scalars drawn per block when `init_tensors` fills a large tensor: numpy's Generator gives the same stream drawn
in blocks as in one call, so blocks change no byte and keep float32 scratch at 64 MiB (the E2B PLE table alone is
2.35e9 scalars: 9.4 GB as float32)."""


@dataclasses.dataclass(frozen=True)
class InitRule:
    """How one random leaf is drawn (`init_rule`), in float32 before the cast to the stored dtype: kind "normal"
    is N(0, a^2); "gain" is a * (1 + b * N(0, 1)) (a norm weight near `a`); "uniform" is U[a, b)."""

    kind: str
    a: float
    b: float = 0.0


def fan_in(name: str, shape: tuple[int, ...]) -> int:
    """Inputs one output of linear weight `name` of `shape` sums over: the contraction axes of a compute-layout
    projection (`model.quantspec.LAYER_PROJECTIONS`, e.g. o_DX [D, N H] -> N H), N H for the storage layout's
    wo_NHD [N, H, D], else the first axis (the storage layout is input-major)."""
    if name == "wo_NHD":
        return shape[0] * shape[1]
    if name in LAYER_PROJECTIONS:
        return math.prod(shape[a] for a in LAYER_PROJECTIONS[name])
    if name in EXPERT_PROJECTIONS:
        return math.prod(shape[a] for a in EXPERT_PROJECTIONS[name])
    return shape[0]


def init_rule(cfg: ModelConfig, name: str, shape: tuple[int, ...], head_dim: int) -> InitRule:
    """The distribution of random leaf `name` (a storage-layout field of `model.accounting.layer_shapes` /
    `global_shapes`, or a compute-layout field of `compute_layer_shapes`: one leaf draws from one rule either way)
    of `shape` in a layer of head dim `head_dim`: the one statement of how random weights are scaled, which
    `init_tensors` (built-in checkpoints) and `model.random_weights` (dummy weights on the device) both follow.

    Follows ../shared/gemma4-architecture.md §7: q/k-norm gains near head_dim^-1/4 so attention logits have unit
    scale (with unit gains softmax is almost one-hot and rounding flips greedy tokens). The tied embedding table
    has std 0.1/sqrt(D), not 1/sqrt(D): the output projection is the input table, so the current token's own
    embedding, carried in the residual stream, biases its own logit by about 2.7 sigma at std 1/sqrt(D) and
    greedy decoding locks into "x x x x" loops (seen on the default preset: 64 identical tokens); at 0.1/sqrt(D)
    the bias is about 0.3 sigma and greedy output varies like text. The PLE table keeps std 1/sqrt(D). Linear
    weights with std 1/sqrt(`fan_in`); other norm weights 1 + 0.1 noise (so a norm applied with the wrong weight
    is noticed); layer_scalar uniform in [0.7, 1.3]. The expert block: the router's projection with std 1 (its
    input is RMS-normalised and scaled by D^-1/2, so the expert logits have unit scale and the top-k choice is
    not decided by rounding; with std 1/sqrt(D) they had std 1/sqrt(D) and near-ties everywhere), its two scales
    near 1 like a norm weight, the experts' weights std 1/sqrt(fan_in) (`model.quantspec.EXPERT_PROJECTIONS`).
    """
    if name in ("q_norm_H", "k_norm_H"):
        return InitRule("gain", head_dim**-0.25, 0.05)
    if name.endswith("norm_D") or name.endswith("norm_P") or name in ("router_scale_D", "expert_scale_E"):
        return InitRule("gain", 1.0, 0.1)
    if name == "router_DE":
        return InitRule("normal", 1.0)
    if name == "layer_scalar_1":
        return InitRule("uniform", 0.7, 1.3)
    if name == "embed_VD":
        return InitRule("normal", 0.1 * cfg.hidden_size**-0.5)
    if name == "ple_embed_VX":
        return InitRule("normal", cfg.hidden_size**-0.5)
    return InitRule("normal", fan_in(name, shape) ** -0.5)


def init_tensors(cfg: ModelConfig, seed: int = 0, dtype=np.float32) -> Iterator[tuple[int | None, str, np.ndarray]]:
    """Random parameters that behave like trained ones, one leaf at a time: yields (layer or None, field, array).

    The draw order is fixed (global leaves in `global_shapes` order, then each layer in `layer_shapes` order), so
    the same seed gives the same bytes on any machine, and a caller can write each leaf and drop it: host memory
    then holds one leaf plus a 64 MiB block, however large the model (see `model.builtin.create_checkpoint`).
    Each leaf's distribution is `init_rule`'s; values are computed in float32 (numpy's Generator) and then cast
    to `dtype` (a numpy or ml_dtypes dtype).
    """
    rng = np.random.default_rng(seed)

    def normal(shape, std):
        out = np.empty(shape, dtype)
        flat = out.reshape(-1)
        for start in range(0, flat.size, INIT_BLOCK):
            n = min(INIT_BLOCK, flat.size - start)
            flat[start : start + n] = (rng.standard_normal(n, dtype=np.float32) * np.float32(std)).astype(dtype)
        return out

    def make(name: str, shape: tuple[int, ...], head_dim: int) -> np.ndarray:
        rule = init_rule(cfg, name, shape, head_dim)
        if rule.kind == "gain":
            return (np.float32(rule.a) * (1 + rule.b * rng.standard_normal(shape, dtype=np.float32))).astype(dtype)
        if rule.kind == "uniform":
            return rng.uniform(rule.a, rule.b, size=shape).astype(np.float32).astype(dtype)
        return normal(shape, rule.a)

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
    return Params(**glob, layers=tuple(fuse_layer(fields) for fields in layers))
