"""The storage a quantized table is placed in (model/quantspec.py `WORD_TABLES`, issue 43): the value bytes of the
PLE table and of the int8 head copy held four to a uint32 word, so that neither the PLE row gather nor the head's
product hands XLA an 8-bit parameter (XLA:TPU copied each whole 8-bit table into another tiling in every decode
step). The word storage must change nothing but the layout: on the `default` preset (every E2B irregularity at
width 256, the PLE table [8192, 8960] as on E2B), the loaded tree decodes as the same tree with every table in
the byte storage it replaced (int8 / uint8): the same dequantized rows and greedy tokens, and the same logits: bit
for bit where only the PLE table changed storage (its rows unpack to the same values, the rest of the program is
the same), to float32 summation order where the head did (it is multiplied plane by plane, `model.quant
._words_form`, the sums in another order: the engine tests' tolerance, 2e-5 x max |logit| + 1e-6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.config import DEFAULT
from model.engine import Engine
from model.forward import forward_full
from model.params import init_params
from model.policy import decide_policy
from model.quant import QuantArray, dequantize, quantize_params, take_rows, with_words
from model.quantspec import WORD_TABLES, leaf_layout, parse_quant

OPTION_SETS = ["ple4", "ple8", "int8_lm_head", "ple4,int8_lm_head", "w4,ple4,int8_lm_head"]
PROMPT = (2, 17, 301, 4095, 8000, 5, 66, 1024, 7, 12, 900, 3)  # 12 ids < the default vocabulary (8192)
NEW = 6


def _is_q(x) -> bool:
    return isinstance(x, QuantArray)


def in_bytes(tree):
    """`tree` with every `QuantArray` in the byte storage (int8 / packed uint8), as before the word storage."""
    return jax.tree_util.tree_map(lambda x: with_words(x, False) if _is_q(x) else x, tree, is_leaf=_is_q)


@pytest.fixture(scope="module")
def default_params():
    return init_params(DEFAULT, seed=0)  # float32 numpy leaves


def test_the_layout_choice_is_one_fact():
    """`leaf_layout` gives the word storage to the tables of `WORD_TABLES` and to nothing else."""
    spec = parse_quant("w4,ple4,int8_lm_head")
    assert WORD_TABLES == {"ple_embed_VX", "lm_head_VD"}
    assert leaf_layout("ple_embed_VX", (8192, 8960), spec).words
    assert leaf_layout("ple_embed_VX", (8192, 8960), parse_quant("ple8")).words
    assert leaf_layout("lm_head_VD", (8192, 256), spec).words
    assert not leaf_layout("qkv_DX", (256, 3072), spec).words


@pytest.mark.slow  # about 30-60 s per option set on 2 cores (two engines compile)
@pytest.mark.parametrize("quant", OPTION_SETS)
def test_word_storage_decodes_as_byte_storage(default_params, quant):
    spec = parse_quant(quant)
    words = quantize_params(default_params, spec)
    old = in_bytes(words)
    table, old_table = words.ple_embed_VX, old.ple_embed_VX
    if spec.ple_bits is not None:  # the table as placed: uint32 words, 4 value bytes each, no padding at X = 8960
        assert table.words and table.values.dtype == jnp.uint32 and old_table.values.dtype != jnp.uint32
        assert table.values.shape == (8192, (8960 if spec.ple_bits == 8 else 4480) // 4)
        np.testing.assert_array_equal(dequantize(table, jnp.float32), dequantize(old_table, jnp.float32))
        ids = jnp.asarray([[0, 8191, 4095, 17]])
        np.testing.assert_array_equal(take_rows(table, ids, jnp.bfloat16), take_rows(old_table, ids, jnp.bfloat16))
    else:
        assert not _is_q(table)
    if spec.int8_lm_head:
        head = words.lm_head_VD
        assert head.words and head.values.shape == (8192, 64) and old.lm_head_VD.values.dtype == jnp.int8
        np.testing.assert_array_equal(dequantize(head, jnp.float32), dequantize(old.lm_head_VD, jnp.float32))

    def same(a, b) -> None:
        a, b = np.asarray(a), np.asarray(b)
        if spec.int8_lm_head:
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * float(np.max(np.abs(b))) + 1e-6)
        else:
            np.testing.assert_array_equal(a, b)

    # teacher-forced logits of every position (the prefill's gather of many rows)
    ids = jnp.asarray([PROMPT])
    full = jax.jit(forward_full, static_argnums=1)
    same(full(words, DEFAULT, ids), full(old, DEFAULT, ids))
    # the engine: next-token logits (prefill) and greedy tokens (the decode step's one-row gather, its head)
    got = []
    for tree in (words, old):
        engine = Engine(tree, DEFAULT, decide_policy("float32"), buckets=(16,), quant=spec)
        got.append((engine.generate(PROMPT, NEW).token_ids, engine.next_token_logits(PROMPT, NEW)))
    assert list(got[0][0]) == list(got[1][0]) and len(got[0][0]) == NEW
    same(got[0][1], got[1][1])
