"""Numerical parity with Hugging Face transformers 5.23 (fixtures made by scripts/make_reference_fixtures.py): E2B-shaped
tiny checkpoints, and the 31B shape (tiny-31b: K = V full layers, no PLE) and 26B-A4B shape (tiny-moe: experts).

Tolerance: float32 logits within max relative error 1e-5 of the reference (relative to the largest logit
magnitude), layer by layer too; greedy tokens identical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REFERENCE

from model.checkpoint import load_params
from model.config import load_config
from model.engine import Engine
from model.forward import forward_full, logits
from model.policy import decide_policy

NAMES = ["tiny", "tiny-gqa", "tiny-published", "tiny-31b", "tiny-moe"]


def _rel_err(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module", params=NAMES)
def reference(request):
    path = REFERENCE / request.param
    cfg = load_config(path)
    params, report = load_params(path, cfg, device_put=jnp.asarray)
    expected = dict(np.load(path / "expected.npz"))
    return request.param, cfg, params, report, expected


def test_full_forward_logits_match_transformers(reference):
    _, cfg, params, _, exp = reference
    got = forward_full(params, cfg, jnp.asarray(exp["input_ids"])[None])[0]
    assert got.shape == exp["logits"].shape
    assert _rel_err(got, exp["logits"]) <= 1e-5


def test_layer_by_layer_hidden_states_match(reference):
    _, cfg, params, _, exp = reference
    ids = jnp.asarray(exp["input_ids"])[None]
    _, hidden = forward_full(params, cfg, ids, return_hidden=True)
    want = exp["hidden_states"]  # [L+1, T, D]; index L is after the final norm
    for i in range(cfg.num_layers):  # embeddings, then outputs of layers 0..L-2
        assert _rel_err(hidden[i, 0], want[i]) <= 1e-5, f"hidden state {i}"
    # The last reference entry is after the final norm: recompute ours the same way via the logits path.
    from model.layers import rms_norm

    final = rms_norm(hidden[-1, 0], params.final_norm_D, cfg.rms_norm_eps)
    assert _rel_err(final, want[-1]) <= 1e-5
    assert _rel_err(logits(params, cfg, hidden[-1])[0], exp["logits"]) <= 1e-5


def test_cached_greedy_generation_matches_transformers(reference):
    _, cfg, params, _, exp = reference
    engine = Engine(params, cfg, decide_policy("float32"), max_length=64)
    gen = engine.generate(exp["input_ids"].tolist(), len(exp["greedy_ids"]))
    assert gen.token_ids == exp["greedy_ids"].tolist()


def test_published_layout_loads_knowingly_and_equals_text_layout():
    text_params, text_report = load_params(REFERENCE / "tiny")
    pub_params, pub_report = load_params(REFERENCE / "tiny-published")
    assert text_report["prefixes"] == ["model."]
    assert pub_report["prefixes"] == ["model.language_model."]
    ignored = pub_report["ignored"]
    assert any(k.startswith("model.vision_tower.") for k in ignored)
    assert "model.embed_vision.embedding_projection.weight" in ignored
    assert any(".layers.3.self_attn.k_proj.weight" in k for k in ignored)  # layers 3-5 are KV-shared in TINY
    for a, b in zip(jax.tree_util.tree_leaves(text_params), jax.tree_util.tree_leaves(pub_params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_both_config_forms_give_the_same_model():
    # tiny: transformers' per_layer_config form; tiny-published: the hub's global_head_dim form in text_config.
    assert "per_layer_config" in (REFERENCE / "tiny" / "config.json").read_text()
    assert "global_head_dim" in (REFERENCE / "tiny-published" / "config.json").read_text()
    assert load_config(REFERENCE / "tiny") == load_config(REFERENCE / "tiny-published")
