"""The `--quant` option set and the weight-bytes accounting under it (model/quantspec.py, model/accounting.py):
the published E2B table to the byte, and shape-derived bytes equal to the bytes of actually quantized arrays."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from model.accounting import (
    COMPONENTS,
    decode_reads,
    decode_weight_bytes,
    param_counts,
    weight_bytes,
    weight_bytes_by_component,
)
from model.config import DEFAULT, E2B, E4B, TINY
from model.errors import QuantError
from model.params import abstract_params, init_params
from model.quant import QuantArray, packed_bytes, quantize_params, tree_bytes
from model.quantspec import NO_QUANT, WORD_BYTES, parse_quant


# ---- the option set -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,canonical", [
    (None, "none"), ("", "none"), ("none", "none"), ("ple4,int8_lm_head", "int8_lm_head,ple4"),
    (" ple8 , w8 ", "ple8,w8"), ("w4", "w4:128"), ("w4:64,ple4", "ple4,w4:64"),
])  # fmt: skip
def test_parse_quant_and_its_canonical_form(text, canonical):
    spec = parse_quant(text)
    assert spec.canonical == canonical
    assert parse_quant(spec.canonical) == spec  # the canonical form reads back as the same set


@pytest.mark.parametrize("text,needle", [
    ("ple9", "unknown option 'ple9'"), ("PLE4", "unknown option 'PLE4'"), ("ple4,ple4", "given twice"),
    ("ple4,ple8", "ple8 and ple4"), ("w8,w4:32", "w8 and w4"), ("w8:64", "expected one only on w4"),
    ("w4:0", "group size '0'"), ("w4:abc", "group size 'abc'"), ("w4:", "group size ''"),
    ("ple4,,w8", "empty entry"), ("none,ple4", "'none' cannot be combined"),
])  # fmt: skip
def test_bad_option_sets_are_one_clear_line(text, needle):
    with pytest.raises(QuantError) as info:
        parse_quant(text)
    message = str(info.value)
    assert needle in message and text in message and "\n" not in message
    assert "expected" in message or "pass" in message or "drop" in message


def test_spec_properties():
    spec = parse_quant("w4:32,ple8,int8_lm_head")
    assert (spec.ple_bits, spec.layer_bits, spec.w4_group, spec.int8_lm_head) == (8, 4, 32, True)
    assert (NO_QUANT.ple_bits, NO_QUANT.layer_bits, NO_QUANT.int8_lm_head) == (None, None, False)


# ---- the published E2B table ------------------------------------------------------------------------------------
@pytest.mark.parametrize("quant,expected", [
    ("none", 9_257_138_758), ("ple8", 6_926_678_598), ("ple4", 5_752_273_478),
    ("ple4,int8_lm_head", 6_155_450_950),
])  # fmt: skip
def test_e2b_weight_bytes_reproduce_the_published_table(quant, expected):
    # bfloat16 body, 16-bit scales: the PLE table 262144 x 8960 at 1 (ple8) or 1/2 (ple4) byte per value plus one
    # 2-byte scale per 256 values; int8_lm_head adds 262144 x 1536 int8 values plus a 2-byte scale per row.
    assert weight_bytes(E2B, 2, scale_itemsize=2, quant=parse_quant(quant)) == expected


def test_e2b_components_and_decode_reads_with_the_published_options():
    wb = weight_bytes_by_component(E2B, 2, quant=parse_quant("ple4,int8_lm_head"))
    parts = {c.name: c for c in wb.components}
    assert tuple(parts) == COMPONENTS and wb.params == 4_628_569_379
    assert parts["PLE table"].bytes == 262_144 * 8960 // 2 + 262_144 * 35 * 2
    assert parts["LM head"].bytes == 262_144 * 1536 + 262_144 * 2 and parts["LM head"].params == 0
    assert parts["input embedding"].bytes == 262_144 * 1536 * 2  # keeps its dtype for the input lookup
    # a step reads one input row, one packed PLE row with its 35 scales, the int8 head whole, the rest whole
    assert parts["input embedding"].decode_bytes == 1536 * 2
    assert parts["PLE table"].decode_bytes == 8960 // 2 + 35 * 2
    assert parts["LM head"].decode_bytes == parts["LM head"].bytes
    assert wb.decode_bytes == 4_157_397_004  # the published runs' bytes per step (bench/profile/roofline.py)


@pytest.mark.parametrize("cfg", [TINY, DEFAULT, E2B, E4B], ids=["tiny", "default", "e2b", "e4b"])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_without_quantization_the_old_figures_hold(cfg, itemsize):
    assert weight_bytes(cfg, itemsize) == param_counts(cfg).total * itemsize
    assert decode_weight_bytes(cfg, itemsize) == decode_reads(cfg).total * itemsize
    wb = weight_bytes_by_component(cfg, itemsize)
    assert wb.decode_bytes == decode_reads(cfg).total * itemsize and wb.scales == 0


def test_quantized_decode_reads_fewer_bytes():
    dense = decode_weight_bytes(E2B, 2)
    w8 = decode_weight_bytes(E2B, 2, quant=parse_quant("w8"))
    w4 = decode_weight_bytes(E2B, 2, quant=parse_quant("w4"))
    assert w4 < w8 < dense
    assert decode_weight_bytes(E2B, 2, quant=parse_quant("int8_lm_head")) == dense - 262_144 * 1536 + 262_144 * 2


# ---- shape-derived bytes equal the bytes of the quantized arrays ----------------------------------------------------
OPTION_SETS = ["none", "ple8", "ple4", "int8_lm_head", "ple4,int8_lm_head", "w8", "w4", "w4:16,ple8,int8_lm_head",
               "w4:5,ple4"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_params():
    return init_params(TINY, seed=0)  # float32 leaves


@pytest.mark.parametrize("scale_dtype,scale_itemsize", [(jnp.bfloat16, 2), (jnp.float32, 4)])
@pytest.mark.parametrize("quant", OPTION_SETS)
def test_accounting_equals_the_quantized_tiny_tree(tiny_params, quant, scale_dtype, scale_itemsize):
    spec = parse_quant(quant)
    qp = quantize_params(tiny_params, spec, scale_dtype=scale_dtype)
    head = qp.lm_head_VD
    parts = {c.name: c for c in weight_bytes_by_component(TINY, 4, scale_itemsize=scale_itemsize, quant=spec).components}
    assert parts["input embedding"].bytes == packed_bytes(qp.embed_VD) == qp.embed_VD.nbytes  # stays dense
    assert parts["PLE table"].bytes == packed_bytes(qp.ple_embed_VX)
    assert parts["layers"].bytes == tree_bytes(qp.layers)
    assert parts["LM head"].bytes == packed_bytes(head)
    assert sum(c.bytes for c in parts.values()) == tree_bytes(qp)  # the head copy is a leaf of the tree
    table = qp.ple_embed_VX
    if isinstance(table, QuantArray):  # one row as a decode step reads it: its packed values and its scales
        assert parts["PLE table"].decode_bytes == packed_bytes(table.values[:1]) + packed_bytes(table.scales[:1])
    assert isinstance(head, QuantArray) == spec.int8_lm_head
    projections_quantized = isinstance(qp.layers[0].o_DX, QuantArray)
    assert projections_quantized == (spec.layer_bits is not None) and not isinstance(qp.layers[0].attn_norm_D, QuantArray)


@pytest.mark.parametrize("quant", ["ple4,int8_lm_head", "w4,ple8"])
def test_accounting_equals_abstract_quantization_at_full_e2b_size(quant):
    spec = parse_quant(quant)
    qp = jax.eval_shape(lambda p: quantize_params(p, spec), abstract_params(E2B, jnp.bfloat16))
    assert tree_bytes(qp) == weight_bytes(E2B, 2, quant=spec)


# ---- the PLE table in uint32 words (model.quantspec.WORD_TABLES): padding counted, and only there ------------------
ODD_PLE = dataclasses.replace(TINY, ple_dim=3)  # X = 6 x 3 = 18 values: 9 bytes at 4 bits, 18 at 8: not whole words


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
@pytest.mark.parametrize("quant", ["ple4", "ple8,int8_lm_head", "w4:5,ple4"])
@pytest.mark.parametrize("cfg", [TINY, ODD_PLE], ids=["tiny", "odd-ple-row"])
def test_word_storage_counts_its_row_padding_and_nothing_else(cfg, quant, platform):
    """The accounting knows no platform: the bytes of either platform's storage are its figures exactly."""
    spec = parse_quant(quant)
    qp = quantize_params(init_params(cfg, seed=1), spec, platform=platform)
    table = qp.ple_embed_VX
    assert table.words and table.values.dtype == jnp.uint32
    head = qp.lm_head_VD  # in words on a TPU only: [V, D] int8 -> [V, D / 4] uint32 (D = 64: whole words)
    if head is not None:
        assert head.words == (platform == "tpu")
        assert head.values.shape == ((cfg.vocab_size, cfg.hidden_size // WORD_BYTES) if head.words
                                     else (cfg.vocab_size, cfg.hidden_size))  # fmt: skip
    x = cfg.num_layers * cfg.ple_dim
    row = x if spec.ple_bits == 8 else -(-x // 2)
    pad = -row % WORD_BYTES  # zero bytes that round a row up to whole words
    assert table.values.shape == (cfg.ple_vocab, (row + pad) // WORD_BYTES)
    assert pad == (0 if cfg is TINY else 3 if spec.ple_bits == 4 else 2)
    parts = {c.name: c for c in weight_bytes_by_component(cfg, 4, quant=spec).components}
    scales = packed_bytes(table.scales)
    assert parts["PLE table"].bytes == packed_bytes(table) == cfg.ple_vocab * (row + pad) + scales
    assert parts["PLE table"].decode_bytes == row + pad + packed_bytes(table.scales[:1])
    assert weight_bytes(cfg, 4, quant=spec) == tree_bytes(qp)
