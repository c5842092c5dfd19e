"""The model's parameter shapes, by leaf name: pure functions of a `ModelConfig` on Python ints (no jax, no numpy).

The lowest layer of the model's arithmetic: `model.accounting` (counts and bytes) and the kernels' fit checks
(`model.kernels.fit`, `model.kernels.fit_tpu`, which `model.accounting` asks where a TPU pads a leaf) both read the
shapes here, so neither imports the other's module for them. `model.accounting` re-exports every name.
"""

from __future__ import annotations

from model.config import ModelConfig

Shape = tuple[int, ...]

EMBEDDING_TABLES = ("embed_VD", "ple_embed_VX")
"""The two gathered tables (`global_shapes` names): a decode step reads one row of each, not the table."""


# ---- parameter shapes --------------------------------------------------------------------------------------------
def layer_shapes(cfg: ModelConfig, i: int) -> dict[str, Shape | None]:
    """Shapes of layer i's leaves by `model.params.LayerParams` field name (None for a leaf the layer lacks:
    K/V projections and k_norm on KV-shared layers, the V projection on a K = V layer (`has_v_projection`), the
    PLE leaves when P = 0). Input-major layout. The expert block of a layer with experts: `expert_shapes`
    (`layer_leaves` joins the two)."""
    d, n, k, h, f, p = cfg.hidden_size, cfg.num_heads, cfg.kv_heads(i), cfg.layer_head_dim(i), cfg.ffw_dim(i), cfg.ple_dim
    own_kv = not cfg.is_kv_shared(i)
    own_v = own_kv and has_v_projection(cfg, i)
    return {
        "attn_norm_D": (d,), "post_attn_norm_D": (d,), "pre_ffw_norm_D": (d,), "post_ffw_norm_D": (d,),
        "wq_DNH": (d, n, h), "q_norm_H": (h,),
        "wk_DKH": (d, k, h) if own_kv else None, "wv_DKH": (d, k, h) if own_v else None,
        "k_norm_H": (h,) if own_kv else None,
        "wo_NHD": (n, h, d), "gate_DF": (d, f), "up_DF": (d, f), "down_FD": (f, d),
        "ple_gate_DP": (d, p) if p else None, "ple_proj_PD": (p, d) if p else None,
        "post_ple_norm_D": (d,) if p else None, "layer_scalar_1": (1,),
        **expert_shapes(cfg),
    }  # fmt: skip


def expert_shapes(cfg: ModelConfig) -> dict[str, Shape | None]:
    """Shapes of a layer's expert-block leaves (all None without experts), the same in the storage and compute
    layouts: router_DE [D, E] (router.proj, input-major), router_scale_D [D] (router.scale), expert_scale_E [E]
    (router.per_expert_scale), experts_gate_up_EDX [E, D, 2I] (experts.gate_up_proj, gate then up, input-major),
    experts_down_EDF [E, D, I] (experts.down_proj as stored, output-major), and the three extra norms
    (post_feedforward_layernorm_1 / pre_feedforward_layernorm_2 / post_feedforward_layernorm_2). Names from
    transformers' models/gemma4/modeling_gemma4.py (`Gemma4TextRouter`, `Gemma4TextExperts`)."""
    d, e, m = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    on = cfg.has_experts
    return {
        "router_DE": (d, e) if on else None, "router_scale_D": (d,) if on else None,
        "expert_scale_E": (e,) if on else None,
        "experts_gate_up_EDX": (e, d, 2 * m) if on else None, "experts_down_EDF": (e, d, m) if on else None,
        "post_ffw1_norm_D": (d,) if on else None, "pre_ffw2_norm_D": (d,) if on else None,
        "post_ffw2_norm_D": (d,) if on else None,
    }  # fmt: skip


def has_v_projection(cfg: ModelConfig, i: int) -> bool:
    """False on a full-attention layer of a K = V model (`attention_k_eq_v`: 31B, 26B-A4B): its values are the key
    projection's output (before the key norm and RoPE, through the value norm), so it stores no V projection. The
    cache still holds K and V (they differ after the norms and RoPE). Source: transformers' `Gemma4TextAttention`
    (v_proj is None where `use_alternative_attention`)."""
    return not (cfg.attention_k_eq_v and not cfg.is_sliding(i))


def compute_layer_shapes(cfg: ModelConfig, i: int) -> dict[str, Shape | None]:
    """Shapes of layer i's leaves in the compute layout (`model.params.LayerParams`, built by `fuse_layer` from the
    `layer_shapes` leaves): qkv_DX [D, (N + 2K) H] (KV-shared layers: [D, N H]; a K = V layer: [D, (N + K) H]),
    o_DX [D, N H], gate_up_DX
    [D, 2F], down_DF [D, F], ple_gate_PD / ple_proj_PD [P, D], the norms as in `layer_shapes`. Same scalar
    count as `layer_shapes`, layer by layer."""
    s = layer_shapes(cfg, i)
    d, n, h, f = cfg.hidden_size, cfg.num_heads, cfg.layer_head_dim(i), cfg.ffw_dim(i)
    kv = ((s["wk_DKH"] is not None) + (s["wv_DKH"] is not None)) * cfg.kv_heads(i) * h
    p = cfg.ple_dim
    return {
        "attn_norm_D": s["attn_norm_D"], "post_attn_norm_D": s["post_attn_norm_D"],
        "pre_ffw_norm_D": s["pre_ffw_norm_D"], "post_ffw_norm_D": s["post_ffw_norm_D"],
        "qkv_DX": (d, n * h + kv), "q_norm_H": s["q_norm_H"], "k_norm_H": s["k_norm_H"],
        "o_DX": (d, n * h), "gate_up_DX": (d, 2 * f), "down_DF": (d, f),
        "ple_gate_PD": (p, d) if p else None, "ple_proj_PD": (p, d) if p else None,
        "post_ple_norm_D": s["post_ple_norm_D"], "layer_scalar_1": s["layer_scalar_1"],
        **expert_shapes(cfg),
    }  # fmt: skip


def global_shapes(cfg: ModelConfig) -> dict[str, Shape | None]:
    """Shapes of the non-layer leaves by `model.params.Params` field name (None for the PLE leaves when P = 0):
    embed_VD [V, D], ple_embed_VX [V_ple, X], ple_proj_DX [D, X], ple_norm_P [P], final_norm_D [D]."""
    x = cfg.num_layers * cfg.ple_dim
    return {
        "embed_VD": (cfg.vocab_size, cfg.hidden_size),
        "ple_embed_VX": (cfg.ple_vocab, x) if cfg.ple_dim else None,
        "ple_proj_DX": (cfg.hidden_size, x) if cfg.ple_dim else None,
        "ple_norm_P": (cfg.ple_dim,) if cfg.ple_dim else None,
        "final_norm_D": (cfg.hidden_size,),
    }
