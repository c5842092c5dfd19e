"""The storage a quantized table is placed in (model/quantspec.py `WORD_TABLES`, issue 43): the value bytes of the
PLE table (every platform) and of the int8 head copy (on a TPU) held four to a uint32 word, so that neither the
PLE row gather nor the head's product hands XLA:TPU an 8-bit parameter (it copied each whole 8-bit table into
another tiling in every decode step). The word storage must change nothing but the layout: on the `default`
preset (every E2B irregularity at width 256, the PLE table [8192, 8960] as on E2B), the tree quantized for the CPU
or for the TPU decodes on CPU exactly as the same tree with every table in the byte storage it replaced (int8 /
uint8): the same dequantized rows, the same logits bit for bit, the same greedy tokens. (Off a TPU a word
table's product reads the bytes the words hold, `model.quant._byte_view`; the TPU's plane form sums in another
order and is checked against the dense product in tests/test_quant.py.) `make test` runs the published set on the
`tiny` preset (the same layouts at a small width); `make test-heavy` runs every set on `default`."""

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
TINY_PROMPT = (2, 17, 301, 511, 400, 5, 66, 102, 7, 12, 90, 3)  # 12 ids < tiny's (512), its last row among them
NEW = 6


def _is_q(x) -> bool:
    return isinstance(x, QuantArray)


def in_bytes(tree):
    """`tree` with every `QuantArray` in the byte storage (int8 / packed uint8), as before the word storage."""
    return jax.tree_util.tree_map(lambda x: with_words(x, False) if _is_q(x) else x, tree, is_leaf=_is_q)


PRESETS = {"default": DEFAULT, "tiny": TINY}


@pytest.fixture(scope="module")
def preset_params():
    """Float32 numpy leaves (seed 0) of each preset of PRESETS, made when a test first asks for one."""
    made: dict[str, object] = {}

    def get(name: str):
        if name not in made:
            made[name] = init_params(PRESETS[name], seed=0)
        return made[name]

    return get


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


def _decode(tree, cfg, spec) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(teacher-forced logits of every prompt position, greedy tokens, the engine's next-token logits) of `tree`
    on CPU: the prefill's gather of many rows, the decode step's one-row gather and its head product."""
    prompt = list(PROMPT if cfg.vocab_size > max(PROMPT) else TINY_PROMPT)
    full = jax.jit(forward_full, static_argnums=1)(tree, cfg, jnp.asarray([prompt]))
    engine = Engine(tree, cfg, decide_policy("float32"), buckets=(16,), quant=spec)
    return np.asarray(full), list(engine.generate(prompt, NEW).token_ids), engine.next_token_logits(prompt, NEW)


# On `tiny` (the same word and byte layouts at PLE width 6 x 8 and a head of 512 x 64) the published set runs in
# `make test`; on `default` (E2B's PLE table shape; two or three engines compile per option set, 2-4 minutes each
# on 2 cores, w4 4 min 20 s) every set runs in `make test-heavy`.
@pytest.mark.slow
@pytest.mark.parametrize("preset,quant", [
    ("tiny", "ple4,int8_lm_head"),
    *(pytest.param("default", q, marks=pytest.mark.heavy) for q in OPTION_SETS),
])  # fmt: skip
def test_word_storage_decodes_as_byte_storage(preset_params, preset, quant):
    """The trees quantized for the CPU and for a TPU (where the head is in words too), run here on CPU, against
    the byte storage: off a TPU the word tables' products read the same bytes, so every figure is bit for bit."""
    cfg, spec = PRESETS[preset], parse_quant(quant)
    trees = {p: quantize_params(preset_params(preset), spec, platform=p) for p in ("cpu", "tpu")}
    old = in_bytes(trees["cpu"])
    want = _decode(old, cfg, spec)
    assert len(want[1]) == NEW
    for platform, tree in trees.items():
        if platform == "tpu" and not spec.int8_lm_head:
            continue  # the same storage as the CPU's
        table, old_table = tree.ple_embed_VX, old.ple_embed_VX
        x = cfg.num_layers * cfg.ple_dim  # the PLE table's width: 8960 on default, 48 on tiny
        if spec.ple_bits is not None:  # uint32 words, 4 value bytes each, no padding (X = 8960 or 48)
            assert table.words and table.values.dtype == jnp.uint32 and old_table.values.dtype != jnp.uint32
            assert table.values.shape == (cfg.ple_vocab, (x if spec.ple_bits == 8 else x // 2) // 4)
            np.testing.assert_array_equal(dequantize(table, jnp.float32), dequantize(old_table, jnp.float32))
            ids = jnp.asarray([[0, cfg.ple_vocab - 1, cfg.ple_vocab // 2 - 1, 17]])
            np.testing.assert_array_equal(take_rows(table, ids, jnp.bfloat16), take_rows(old_table, ids, jnp.bfloat16))
        else:
            assert not _is_q(table)
        if spec.int8_lm_head:
            head = tree.lm_head_VD
            assert head.words == (platform == "tpu") and old.lm_head_VD.values.dtype == jnp.int8
            v, d = cfg.vocab_size, cfg.hidden_size
            assert head.values.shape == ((v, d // 4) if head.words else (v, d))
            np.testing.assert_array_equal(dequantize(head, jnp.float32), dequantize(old.lm_head_VD, jnp.float32))
        got = _decode(tree, cfg, spec)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1] == want[1], (platform, got[1], want[1])
        np.testing.assert_array_equal(got[2], want[2])
