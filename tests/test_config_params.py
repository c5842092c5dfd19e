"""Config parsing (both published forms, the multimodal wrapper, unsupported features) and full-size shapes."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import model.params as params_mod
from model.accounting import (
    compute_layer_shapes,
    decode_reads,
    decode_weight_bytes,
    expert_params,
    layer_param_count,
    layer_shapes,
    param_counts,
)
from model.config import DEFAULT, E2B, E4B, PRESETS, TINY, config_from_dict, load_config
from model.errors import ConfigError
from model.params import abstract_params, count_params, fuse_layer, init_params


@pytest.mark.parametrize("cfg", list(PRESETS.values()), ids=list(PRESETS))
@pytest.mark.parametrize("form", ["global_head_dim", "per_layer_config"])
def test_both_config_forms_round_trip(cfg, form):
    assert config_from_dict(json.loads(json.dumps(cfg.to_hf_dict(form=form)))) == cfg


def test_multimodal_wrapper_reads_text_config():
    wrapped = {"model_type": "gemma4", "text_config": E2B.to_hf_dict(), "vision_config": {}}
    assert config_from_dict(wrapped) == E2B


def test_e2b_facts():
    assert E2B.cache_layers == tuple(range(15))
    assert [E2B.kv_source(i) for i in (15, 18, 19, 33, 34)] == [13, 13, 14, 13, 14]
    assert [i for i, t in enumerate(E2B.layer_types) if t == "full_attention"] == [4, 9, 14, 19, 24, 29, 34]
    assert E2B.ffw_dim(14) == 6144 and E2B.ffw_dim(15) == 12288
    assert E2B.layer_head_dim(3) == 256 and E2B.layer_head_dim(4) == 512
    assert E2B.rotary_pairs_global == 64


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("attention_k_eq_v", "yes", "attention_k_eq_v"),
        ("enable_moe_block", True, "enable_moe_block=True needs num_experts"),
        ("model_type", "llama", "model_type is 'llama'"),
        ("use_bidirectional_attention", "all", "use_bidirectional_attention"),
        ("hidden_activation", "silu", "hidden_activation"),
    ],
)
def test_unsupported_or_foreign_configs_name_the_field(field, value, match):
    raw = dict(TINY.to_hf_dict(), **{field: value})
    with pytest.raises(ConfigError, match=match):
        config_from_dict(raw)


def test_31b_and_26b_a4b_facts():
    # google-deepmind/gemma gm/nn/gemma4/_gemma4.py (Gemma4_31B, Gemma4_26B_A4B) and issue 45's table.
    g31, moe = PRESETS["31b"], PRESETS["26b-a4b"]
    for cfg, layers, width, heads, kv, kv_full in ((g31, 60, 5376, 32, 16, 4), (moe, 30, 2816, 16, 8, 2)):
        full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (layers, width, heads)
        assert (cfg.kv_heads(0), cfg.kv_heads(5)) == (kv, kv_full) and full == list(range(5, layers, 6))
        assert cfg.sliding_window == 1024 and cfg.ple_dim == 0 and cfg.num_kv_shared_layers == 0
        assert cfg.values_from_keys(5) and not cfg.values_from_keys(4)
    assert g31.intermediate_size == 21504 and not g31.has_experts
    assert (moe.intermediate_size, moe.num_experts, moe.top_k_experts, moe.moe_intermediate_size) == (2112, 128, 8, 704)


def test_31b_and_26b_a4b_parameter_counts():
    # Our arithmetic (model.accounting) at the presets' sizes: 30.7B for 31B; 25.2B for 26B-A4B, 3.8B of them active
    # per token (the experts' 22.8B counted at 8 of 128), the sizes the models' names and cards give.
    assert param_counts(PRESETS["31b"]).total == 30_697_345_340
    moe = PRESETS["26b-a4b"]
    experts = moe.num_layers * moe.num_experts * 3 * moe.hidden_size * moe.moe_intermediate_size
    assert param_counts(moe).total == 25_233_141_790 and experts == 22_837_985_280
    assert round((param_counts(moe).total - experts * (1 - 8 / 128)) / 1e9, 1) == 3.8


def test_global_kv_heads_apply_only_with_k_eq_v_as_in_transformers():
    # transformers 5.23 Gemma4TextConfig.__post_init__: num_global_key_value_heads overrides the full layers' KV
    # heads only when attention_k_eq_v is true.
    raw = dict(PRESETS["tiny-31b"].to_hf_dict(), num_global_key_value_heads=2)
    assert config_from_dict(raw).kv_heads(2) == 2
    assert config_from_dict(dict(raw, attention_k_eq_v=False)).kv_heads(2) == PRESETS["tiny-31b"].num_kv_heads


def test_expert_block_sizes_are_checked():
    raw = PRESETS["tiny-moe"].to_hf_dict()
    assert config_from_dict(dict(raw, enable_moe_block=False)).num_experts == 0
    with pytest.raises(ConfigError, match="top_k_experts <= num_experts"):
        config_from_dict(dict(raw, top_k_experts=9))
    with pytest.raises(ConfigError, match="'top_k_experts' is 2.5"):
        config_from_dict(dict(raw, top_k_experts=2.5))


def test_missing_field_and_bad_json(tmp_path):
    raw = TINY.to_hf_dict()
    del raw["hidden_size"]
    with pytest.raises(ConfigError, match="'hidden_size' is missing"):
        config_from_dict(raw)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)


def test_full_size_parameter_counts_without_memory():
    # E2B text decoder: 4,628,569,379 parameters (model card / architecture notes §3).
    assert count_params(abstract_params(E2B)) == 4_628_569_379
    shapes = jax.eval_shape(lambda: abstract_params(E4B, jnp.bfloat16))
    # The compute layout: q/k/v fused [D, (N + 2K) H] on layers that own K/V, q only [D, N H] on KV-shared ones.
    assert shapes.layers[0].qkv_DX.shape == (2560, (8 + 2 * 2) * 256)
    assert shapes.layers[5].qkv_DX.shape == (2560, (8 + 2 * 2) * 512)
    assert shapes.layers[-1].qkv_DX.shape == (2560, 8 * 512) and shapes.layers[-1].k_norm_H is None
    assert shapes.layers[0].o_DX.shape == (2560, 8 * 256) and shapes.layers[0].gate_up_DX.shape == (2560, 2 * 10240)
    assert shapes.ple_embed_VX.shape == (262_144, 42 * 256)


def test_default_preset_size_and_decode_bytes():
    n = count_params(abstract_params(DEFAULT))
    assert 165e6 < n < 180e6  # about 172M parameters
    per_step = decode_weight_bytes(DEFAULT, 4)
    assert 0.35e9 < per_step < 0.45e9  # about 0.40 GB read per float32 decode step
    # A step reads one row of each embedding table, not the tables: far less than all weight bytes at E2B size.
    assert decode_weight_bytes(E2B, 2) < 0.6 * count_params(abstract_params(E2B)) * 2


@pytest.mark.parametrize("cfg", list(PRESETS.values()), ids=list(PRESETS))
def test_jax_free_counts_equal_the_parameter_tree(cfg):
    tree = abstract_params(cfg)
    counts = param_counts(cfg)
    assert counts.total == count_params(tree)
    assert [layer_param_count(cfg, i) for i in range(cfg.num_layers)] == [count_params(l) for l in tree.layers]
    assert counts.embedding == count_params(tree.embed_VD)
    reads = decode_reads(cfg)
    every = expert_params(cfg)  # the body of `decode_reads` leaves out the experts; it reads top_k of each layer's
    assert reads.body + every == counts.body and reads.lm_head == counts.embedding
    assert reads.experts == (every // cfg.num_experts * cfg.top_k_experts if every else 0)
    assert reads.input_embedding_row == cfg.hidden_size and reads.ple_row == cfg.num_layers * cfg.ple_dim
    assert decode_weight_bytes(cfg, 2) == 2 * reads.total


def test_e2b_body_and_tables():
    counts = param_counts(E2B)  # gemma4-architecture.md §3: 4,628,569,379 text parameters
    assert (counts.body, counts.embedding, counts.ple_table) == (1_877_105_955, 262_144 * 1536, 262_144 * 35 * 256)


def test_init_is_deterministic_and_presets_are_hashable():
    a, b = init_params(TINY, 3), init_params(TINY, 3)
    assert all((x == y).all() for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
    assert len({hash(c) for c in PRESETS.values()}) == len(PRESETS)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_init_drawn_in_blocks_gives_the_same_bytes(monkeypatch, dtype):
    whole = init_params(TINY, 3, dtype=dtype)
    monkeypatch.setattr(params_mod, "INIT_BLOCK", 7)  # every linear weight now spans many blocks, with a ragged end
    blocked = init_params(TINY, 3, dtype=dtype)
    for x, y in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(blocked), strict=True):
        assert x.dtype == y.dtype == np.dtype(dtype) and x.tobytes() == y.tobytes()


def test_bfloat16_init_equals_float32_init_cast():
    """The checkpoint writer draws leaves directly in the stored dtype; that must equal drawing in float32 and
    casting, which is how every checkpoint created before (and its recorded hash) was made."""
    f32, bf16 = init_params(TINY, 5), init_params(TINY, 5, dtype=ml_dtypes.bfloat16)
    for x, y in zip(jax.tree_util.tree_leaves(f32), jax.tree_util.tree_leaves(bf16), strict=True):
        assert x.astype(ml_dtypes.bfloat16).tobytes() == y.tobytes()


# ---- field types (issue 12): every wrong JSON type is one ConfigError naming the file, field, value and type ----
def _config_error(raw, where="ckpt/config.json") -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, where=where)
    return str(info.value)


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("num_hidden_layers", "6", "expected an integer"),  # was silently coerced by int()
        ("num_hidden_layers", [6], "expected an integer"),  # was a TypeError naming no field
        ("num_hidden_layers", True, "expected an integer"),  # a boolean is not an integer (int(True) == 1)
        ("num_hidden_layers", 6.0, "expected an integer"),  # refused although integral: transformers keeps 6.0
        ("head_dim", 16.5, "expected an integer"),
        ("hidden_size", None, "expected an integer"),  # null in a required field
        ("rms_norm_eps", "1e-6", "expected a number"),
        ("use_double_wide_mlp", 1, "expected true or false"),
        ("tie_word_embeddings", None, "expected true or false"),  # not `bool | None` in transformers
        ("num_kv_shared_layers", None, "expected an integer"),  # was read as 0
        ("layer_types", "sliding_attention", "expected a list of strings"),
        ("rope_parameters", [], "expected an object"),
        ("eos_token_id", "1", "expected an integer or a non-empty list of integers"),
        ("eos_token_id", [], "expected an integer or a non-empty list of integers"),
        ("per_layer_config", [2, 5], "expected an object"),
    ],
)
def test_wrong_field_type_names_field_value_type_and_file(field, value, expected):
    raw = dict(TINY.to_hf_dict(form="per_layer_config"), **{field: value})
    message = _config_error(raw)
    assert message.startswith(f"ckpt/config.json: field '{field}' is {value!r} ") and message.endswith(expected)
    assert "\n" not in message


@pytest.mark.parametrize(
    "change,field,value,expected",
    [
        (lambda d: d["layer_types"].__setitem__(1, 3), "layer_types[1]", 3, "a string"),
        (lambda d: d.update(eos_token_id=[1, None]), "eos_token_id[1]", None, "an integer"),
        (lambda d: d["rope_parameters"]["full_attention"].update(rope_theta="1e6"),
         "rope_parameters.full_attention.rope_theta", "1e6", "a number"),
        (lambda d: d["per_layer_config"]["2"].update(head_dim="32"), "per_layer_config.2.head_dim", "32", "an integer"),
        (lambda d: d["per_layer_config"].update({"5": 32}), "per_layer_config.5", 32, "an object"),
    ],
)
def test_wrong_nested_or_element_type_names_its_path(change, field, value, expected):
    raw = TINY.to_hf_dict(form="per_layer_config")
    change(raw)
    assert _config_error(raw) == f"ckpt/config.json: field {field!r} is {value!r} ({_json_kind(value)}); expected {expected}"


def _json_kind(value) -> str:
    return {int: "an integer", str: "a string", type(None): "null"}[type(value)]


def test_wrapper_fields_are_named_with_their_path_and_the_file(tmp_path):
    text = dict(TINY.to_hf_dict(), num_hidden_layers="6")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text}))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'config.json'}: field 'text_config.num_hidden_layers' is '6' (a string); expected an integer"
    )


def test_a_long_value_is_cut_in_the_message():
    message = _config_error(dict(TINY.to_hf_dict(), vocab_size="9" * 10_000))
    assert "field 'vocab_size' is '999" in message and message.count("9") < 100 and "... (a string)" in message
    assert len(message) < 200 and message.endswith("(a string); expected an integer")


def test_per_layer_config_key_must_be_a_layer_index():
    raw = dict(TINY.to_hf_dict(form="per_layer_config"), per_layer_config={"full": {"head_dim": 32}})
    assert "field 'per_layer_config' has key 'full'; expected layer indices" in _config_error(raw)


def test_integers_are_numbers_and_null_is_read_where_transformers_allows_it():
    raw = TINY.to_hf_dict()
    raw.update(rms_norm_eps=1, final_logit_softcapping=None, pad_token_id=None, bos_token_id=None, eos_token_id=None,
               rope_parameters=None, use_bidirectional_attention=None)  # fmt: skip
    raw["rope_parameters"] = {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                 "rope_theta": 1_000_000}, "sliding_attention": None}  # fmt: skip
    cfg = config_from_dict(raw)
    assert cfg.rms_norm_eps == 1.0 and isinstance(cfg.rms_norm_eps, float) and cfg.final_logit_softcap is None
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_ids) == (0, 2, (1,))
    assert (cfg.rope_global_theta, cfg.rope_local_theta) == (1e6, 1e4)
    nulls = dict(TINY.to_hf_dict(), layer_types=None, global_head_dim=None, num_global_key_value_heads=None,
                 rope_parameters=None, num_hidden_layers=12, num_kv_shared_layers=0)  # fmt: skip
    cfg = config_from_dict(nulls)  # transformers' defaults: 5 sliding then 1 full, full head dim 512, default RoPE
    assert cfg.layer_types == (("sliding_attention",) * 5 + ("full_attention",)) * 2 and cfg.global_head_dim == 512


@pytest.mark.parametrize("cfg", list(PRESETS.values()), ids=list(PRESETS))
def test_compute_layout_shapes_are_the_fused_storage_leaves(cfg):
    # accounting.compute_layer_shapes (jax-free: the byte accounting and abstract_params use it) must be exactly
    # what fuse_layer builds from the checkpoint's storage leaves, layer by layer, with the same scalar count.
    for i in range(cfg.num_layers):
        storage = {name: None if s is None else jax.ShapeDtypeStruct(s, jnp.float32)
                   for name, s in layer_shapes(cfg, i).items()}  # fmt: skip
        fused = jax.eval_shape(fuse_layer, storage)
        want = compute_layer_shapes(cfg, i)
        got = {f.name: None if getattr(fused, f.name) is None else tuple(getattr(fused, f.name).shape)
               for f in dataclasses.fields(fused)}  # fmt: skip
        assert got == want, i
        assert sum(math.prod(s) for s in want.values() if s) == layer_param_count(cfg, i)
