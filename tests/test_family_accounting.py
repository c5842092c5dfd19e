"""Byte accounting of the K = V and expert shapes (31B, 26B-A4B; issue 45): parameter counts and the bytes a decode
step reads, against numbers counted by hand on a small config, and the published totals of the two models."""

from __future__ import annotations

import dataclasses

import pytest

from model.accounting import (
    EXPERTS,
    components_of,
    compute_layer_shapes,
    decode_reads,
    decode_weight_bytes,
    expert_params,
    layer_shapes,
    param_counts,
    weight_bytes_by_component,
)
from model.config import E2B, FULL, G26B_A4B, G31B, SLIDING, TINY
from model.errors import ConfigError
from model.quantspec import parse_quant

# vocab 64, D 8, one sliding layer (head 4) and one full K = V layer (head 8), 2 query heads on 1 KV head, MLP 16,
# 4 experts of width 6, 2 per token, no PLE, no KV sharing
SMALL = dataclasses.replace(
    TINY, vocab_size=64, ple_vocab_size=64, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
    global_head_dim=8, intermediate_size=16, use_double_wide_mlp=False, sliding_window=4,
    layer_types=(SLIDING, FULL), num_kv_shared_layers=0, ple_dim=0, attention_k_eq_v=True, num_experts=4,
    top_k_experts=2, moe_intermediate_size=6,
)  # fmt: skip
# by hand: layer 0 = 4 norms 32 + q 64 + q_norm 4 + k 32 + v 32 + k_norm 4 + o 64 + MLP 3 x 128 + scalar 1 = 617;
# layer 1 (no v) = 32 + 128 + 8 + 64 + 8 + 128 + 384 + 1 = 753; the expert block per layer = router 32 + its scale 8
# + per-expert scale 4 + gate_up 4 x 8 x 12 = 384 + down 4 x 8 x 6 = 192 + 3 norms 24 = 644; embedding 512, final norm 8
HAND_TOTAL = 617 + 753 + 2 * 644 + 512 + 8
HAND_EXPERTS = 2 * (384 + 192)


def test_small_config_counts_equal_the_hand_count():
    assert param_counts(SMALL).total == HAND_TOTAL == 3178
    assert expert_params(SMALL) == HAND_EXPERTS == 1152
    assert layer_shapes(SMALL, 1)["wv_DKH"] is None and layer_shapes(SMALL, 0)["wv_DKH"] == (8, 1, 4)
    assert compute_layer_shapes(SMALL, 1)["qkv_DX"] == (8, (2 + 1) * 8)  # q and k only on the K = V layer
    assert compute_layer_shapes(SMALL, 0)["qkv_DX"] == (8, (2 + 2) * 4)


def test_a_decode_step_reads_the_routed_experts_only():
    reads = decode_reads(SMALL)  # default: top_k = 2 of the 4 experts per layer
    assert reads.body == HAND_TOTAL - 512 - HAND_EXPERTS == 1514
    assert reads.experts == 2 * 2 * (96 + 48) == 576  # 2 experts x 2 layers x (gate_up 96 + down 48)
    assert reads.total == 1514 + 8 + 512 + 576
    assert decode_reads(SMALL, experts=4).experts == HAND_EXPERTS  # a batch whose rows chose every expert
    assert decode_weight_bytes(SMALL, 2) == 2 * 2610
    assert decode_weight_bytes(SMALL, 2, experts=1) == 2 * (2610 - 288)
    with pytest.raises(ValueError, match="1..4"):
        decode_reads(SMALL, experts=5)
    with pytest.raises(ValueError, match="no experts"):
        decode_reads(E2B, experts=2)


def test_quantized_experts_by_hand():
    wb = weight_bytes_by_component(SMALL, 2, quant=parse_quant("w8"))
    assert [c.name for c in wb.components] == list(components_of(SMALL)) and EXPERTS in components_of(SMALL)
    experts = next(c for c in wb.components if c.name == EXPERTS)
    # gate_up [4, 8, 12]: 384 int8 values + one scale per (expert, output) 48 x 2 bytes; down [4, 8, 6]: 192 + 32 x 2
    assert experts.bytes == 2 * (384 + 96 + 192 + 64) == 1472
    assert experts.decode_bytes == 1472 // 2  # 2 of 4 experts: scale blocks never span two experts
    assert experts.scales == 2 * (48 + 32)
    dense = weight_bytes_by_component(SMALL, 2)
    assert dense.bytes == 2 * HAND_TOTAL and dense.decode_bytes == decode_weight_bytes(SMALL, 2)


def test_published_totals_of_the_two_shapes():
    # the model cards: 26B-A4B 25.2B parameters, 3.8B active; 31B 30.7B
    total = param_counts(G26B_A4B)
    reads = decode_reads(G26B_A4B)
    active = reads.body + reads.experts + total.embedding  # the tied table counts once
    assert total.total == 25_233_141_790 and round(total.total / 1e9, 1) == 25.2
    assert active == 3_822_530_590 and round(active / 1e9, 1) == 3.8
    assert param_counts(G31B).total == 30_697_345_340 and round(param_counts(G31B).total / 1e9, 1) == 30.7
    assert components_of(G31B) == components_of(E2B)  # no experts: the components of today


def test_e2b_is_unchanged():
    assert param_counts(E2B).total == 4_628_569_379 and decode_reads(E2B).experts == 0
    assert weight_bytes_by_component(E2B, 2).bytes == 9_257_138_758


@pytest.mark.parametrize("fields", [
    {"num_experts": 4}, {"num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 2}, {"top_k_experts": 1},
])  # fmt: skip
def test_expert_fields_are_checked_together(fields):
    with pytest.raises(ConfigError, match="num_experts"):
        dataclasses.replace(TINY, **fields)


# ---- the bytes as placed on a TPU (the expert kernel's layout pads K to whole groups) ------------------------------
def test_a_tpu_places_26b_a4b_w4_experts_with_their_padding():
    from model.accounting import NATURAL, TPU_LAYOUT, placed_shape, placement_layout

    w4 = parse_quant("w4")
    natural = weight_bytes_by_component(G26B_A4B, 2, quant=w4)
    tpu = weight_bytes_by_component(G26B_A4B, 2, quant=w4, layout=TPU_LAYOUT)
    # down [E, D, I] contracts I = 704 = 5.5 groups of 128: 768 in the kernel's layout, 64 more int4 values per row
    pad = 30 * 128 * 2816 * (768 - 704) // 2
    # the MLP's down [D, F] contracts F = 2112 = 16.5 groups: 2176 in the kernel's layout
    mlp_pad = 30 * 2816 * (2176 - 2112) // 2
    assert pad == 346_030_080 and mlp_pad == 2_703_360 and tpu.scales == natural.scales
    assert tpu.bytes - natural.bytes == pad + mlp_pad
    assert (natural.bytes, tpu.bytes) == (14_134_589_500, 14_483_322_940)
    changed = {c.name for c, d in zip(natural.components, tpu.components, strict=True) if c.bytes != d.bytes}
    assert EXPERTS in changed and len(changed) == 2, changed
    assert tpu.decode_bytes - natural.decode_bytes == 30 * 8 * 2816 * 64 // 2 + mlp_pad  # 8 experts and every MLP
    assert placed_shape("experts_down_EDF", (128, 2816, 704), w4, TPU_LAYOUT) == (128, 2816, 768)
    assert placed_shape("experts_gate_up_EDX", (128, 2816, 1408), w4, TPU_LAYOUT) == (128, 2816, 1408)  # 22 groups
    assert "K 704 padded to 768" in next(c.note for c in tpu.components if c.name == EXPERTS)
    # only w4 on a TPU through the Pallas kernel takes that layout
    assert placement_layout("tpu", w4) == placement_layout("tpu", w4, "pallas:fewest") == TPU_LAYOUT
    assert placement_layout("tpu", w4, "xla") == placement_layout("gpu", w4) == NATURAL
    assert placement_layout("tpu", parse_quant("w8")) == placement_layout("tpu", parse_quant(None)) == NATURAL
    for quant in ("w8", "none", "int8_lm_head"):  # no padding where the experts are not w4
        q = parse_quant(quant)
        assert weight_bytes_by_component(G26B_A4B, 2, quant=q, layout=TPU_LAYOUT).bytes == \
            weight_bytes_by_component(G26B_A4B, 2, quant=q).bytes
    with pytest.raises(ValueError, match="placement layout 'gpu'"):
        weight_bytes_by_component(G26B_A4B, 2, quant=w4, layout="gpu")
