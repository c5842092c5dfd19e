"""The storage a quantized table is placed in (model/quantspec.py `WORD_TABLES`, issue 43): the value bytes of the
PLE table (every platform) and of the int8 head copy (on a TPU) held four to a uint32 word, so that neither the
PLE row gather nor the head's product hands XLA:TPU an 8-bit parameter (it copied each whole 8-bit table into
another tiling in every decode step). The word storage must change nothing but the layout: on the `default`
preset (every E2B irregularity at width 256, the PLE table [8192, 8960] as on E2B), the tree quantized for the CPU
or for the TPU decodes on CPU exactly as the same tree with every table in the byte storage it replaced (int8 /
uint8): the same dequantized rows, the same logits bit for bit, the same greedy tokens. (Off a TPU a word
table's product reads the bytes the words hold, `model.quant._byte_view`; the TPU's plane form sums in another
order and is checked against the dense product in tests/test_quant.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.config import DEFAULT, TINY
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
    """`leaf_layout` gives the word storage to the tables of `WORD_TABLES` on their platforms, nothing else."""
    spec = parse_quant("w4,ple4,int8_lm_head")
    tpu = frozenset({"tpu"})
    assert WORD_TABLES == {"ple_embed_VX": None, "lm_head_VD": tpu, "experts_gate_up_EDX": tpu, "experts_down_EDF": tpu}
    for platform in ("cpu", "gpu", "tpu", None):
        assert leaf_layout("ple_embed_VX", (8192, 8960), spec, platform).words
        assert leaf_layout("ple_embed_VX", (8192, 8960), parse_quant("ple8"), platform).words
        assert leaf_layout("lm_head_VD", (8192, 256), spec, platform).words == (platform == "tpu")
        assert not leaf_layout("lm_head_VD", (8192, 255), spec, platform).words  # rows not whole words: bytes
        assert not leaf_layout("qkv_DX", (256, 3072), spec, platform).words
    assert quantize_params(init_params(TINY), spec).lm_head_VD.words == (jax.default_backend() == "tpu")


def _decode(tree, spec) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(teacher-forced logits of every prompt position, greedy tokens, the engine's next-token logits) of `tree`
    on CPU: the prefill's gather of many rows, the decode step's one-row gather and its head product."""
    full = jax.jit(forward_full, static_argnums=1)(tree, DEFAULT, jnp.asarray([PROMPT]))
    engine = Engine(tree, DEFAULT, decide_policy("float32"), buckets=(16,), quant=spec)
    return np.asarray(full), list(engine.generate(PROMPT, NEW).token_ids), engine.next_token_logits(PROMPT, NEW)


@pytest.mark.slow  # two or three engines compile per option set: 2-4 minutes each on 2 cores (w4: 4 min 20 s)
@pytest.mark.parametrize("quant", [q if q == "ple4,int8_lm_head" else pytest.param(q, marks=pytest.mark.heavy)
                                   for q in OPTION_SETS])  # the published set in `make test`; all in test-heavy
def test_word_storage_decodes_as_byte_storage(default_params, quant):
    """The trees quantized for the CPU and for a TPU (where the head is in words too), run here on CPU, against
    the byte storage: off a TPU the word tables' products read the same bytes, so every figure is bit for bit."""
    spec = parse_quant(quant)
    trees = {p: quantize_params(default_params, spec, platform=p) for p in ("cpu", "tpu")}
    old = in_bytes(trees["cpu"])
    want = _decode(old, spec)
    assert len(want[1]) == NEW
    for platform, tree in trees.items():
        if platform == "tpu" and not spec.int8_lm_head:
            continue  # the same storage as the CPU's
        table, old_table = tree.ple_embed_VX, old.ple_embed_VX
        if spec.ple_bits is not None:  # uint32 words, 4 value bytes each, no padding at X = 8960
            assert table.words and table.values.dtype == jnp.uint32 and old_table.values.dtype != jnp.uint32
            assert table.values.shape == (8192, (8960 if spec.ple_bits == 8 else 4480) // 4)
            np.testing.assert_array_equal(dequantize(table, jnp.float32), dequantize(old_table, jnp.float32))
            ids = jnp.asarray([[0, 8191, 4095, 17]])
            np.testing.assert_array_equal(take_rows(table, ids, jnp.bfloat16), take_rows(old_table, ids, jnp.bfloat16))
        else:
            assert not _is_q(table)
        if spec.int8_lm_head:
            head = tree.lm_head_VD
            assert head.words == (platform == "tpu") and old.lm_head_VD.values.dtype == jnp.int8
            assert head.values.shape == ((8192, 64) if head.words else (8192, 256))
            np.testing.assert_array_equal(dequantize(head, jnp.float32), dequantize(old.lm_head_VD, jnp.float32))
        got = _decode(tree, spec)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1] == want[1], (platform, got[1], want[1])
        np.testing.assert_array_equal(got[2], want[2])
