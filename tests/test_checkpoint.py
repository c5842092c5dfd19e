"""Checkpoint loading: layouts, sharding, hub resolution offline, and every bad input as one clear line."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import REFERENCE, assert_one_line_error, run_cli_here
from safetensors.numpy import load_file, save_file

from model.checkpoint import content_hash, load_params, resolve_checkpoint
from model.errors import CheckpointError, ConfigError


@pytest.fixture()
def ckpt(tmp_path):
    """A writable copy of the transformers-made tiny checkpoint."""
    return shutil.copytree(REFERENCE / "tiny", tmp_path / "tiny")


def _rewrite(path, fn):
    tensors = load_file(str(path / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_sharded_checkpoint_with_index_loads_the_same(ckpt, tmp_path):
    tensors = load_file(str(ckpt / "model.safetensors"))
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2 :]}  # fmt: skip
    out = tmp_path / "sharded"
    out.mkdir()
    for name, ks in shards.items():
        save_file({k: tensors[k] for k in ks}, str(out / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(ckpt / "config.json", out / "config.json")
    a, _ = load_params(ckpt)
    b, _ = load_params(out)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_wrong_shape_names_tensor_and_both_shapes(ckpt):
    _rewrite(ckpt, lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight", np.zeros((127, 64), np.float32)))
    with pytest.raises(CheckpointError, match=r"model.layers.0.mlp.up_proj.weight.*\[127, 64\].*\[128, 64\]"):
        load_params(ckpt)


def test_missing_and_unexpected_tensors_are_errors(ckpt):
    _rewrite(ckpt, lambda t: t.pop("model.norm.weight"))
    with pytest.raises(CheckpointError, match="'norm.weight' is missing"):
        load_params(ckpt)
    _rewrite(ckpt, lambda t: t.update({"model.norm.weight": np.ones(64, np.float32),
                                       "model.layers.0.mlp.extra.weight": np.ones(3, np.float32)}))  # fmt: skip
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        load_params(ckpt)


def test_bfloat16_storage_loads_and_converts(ckpt):
    import ml_dtypes

    _rewrite(ckpt, lambda t: t.update({k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()}))
    params, _ = load_params(ckpt, dtype=np.float32)
    assert params.embed_VD.dtype == np.float32


def test_content_hash_is_stable_and_sensitive(ckpt):
    h = content_hash(ckpt)
    assert h == content_hash(ckpt) and len(h) == 64
    _rewrite(ckpt, lambda t: t.__setitem__("model.norm.weight", t["model.norm.weight"] * 2))
    assert content_hash(ckpt) != h


def test_hub_repo_not_cached_offline_names_the_repo(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(CheckpointError, match="google/gemma-4-E2B-it: not in the local Hugging Face cache"):
        resolve_checkpoint("google/gemma-4-E2B-it")


def test_config_of_another_model_is_a_config_error(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(dict(cfg, model_type="llama")))
    with pytest.raises(ConfigError, match="model_type is 'llama'"):
        load_params(ckpt)


# ---- the same bad inputs through the CLI: one line, exit code 2, no traceback --------------------------------
@pytest.mark.parametrize("case", ["missing", "no-safetensors", "other-model", "truncated", "wrong-shape"])
def test_bad_checkpoints_on_the_command_line(case, ckpt, tmp_path):
    needles = {"missing": ["no such checkpoint directory"], "no-safetensors": ["no *.safetensors"],
               "other-model": ["model_type is 'llama'"], "truncated": ["not a readable safetensors file"],
               "wrong-shape": ["up_proj", "[127, 64]", "[128, 64]"]}[case]  # fmt: skip
    path = ckpt
    if case == "missing":
        path = tmp_path / "nope"
    elif case == "no-safetensors":
        (ckpt / "model.safetensors").unlink()
    elif case == "other-model":
        cfg = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps(dict(cfg, model_type="llama")))
    elif case == "truncated":
        data = (ckpt / "model.safetensors").read_bytes()
        (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "wrong-shape":
        _rewrite(ckpt, lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight", np.zeros((127, 64), np.float32)))
    proc = run_cli_here(["generate", "--prompt", "hi", "--checkpoint", str(path), "--compile-cache", "off"],
                   env={"JAX_PLATFORMS": "cpu"})  # fmt: skip
    assert_one_line_error(proc, *needles)


def test_integer_weights_are_refused(ckpt):
    _rewrite(ckpt, lambda t: t.__setitem__("model.norm.weight", np.ones(64, np.int32)))
    with pytest.raises(CheckpointError, match="'model.norm.weight' is stored as I32, expected a float dtype"):
        load_params(ckpt)


@pytest.mark.parametrize("nested", [False, True])
def test_a_config_that_declares_quantization_is_refused(ckpt, nested):
    cfg = json.loads((ckpt / "config.json").read_text())
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    if nested:
        cfg.setdefault("text_config", {})["quantization_config"] = qc
    else:
        cfg["quantization_config"] = qc
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="quantization_config \\(quant_method bitsandbytes\\).*already quantized"):
        load_params(ckpt)


def test_the_hash_computed_while_loading_is_the_content_hash(ckpt, tmp_path):
    import ml_dtypes

    _, report = load_params(ckpt)
    assert report["content_hash"] == content_hash(ckpt)
    _rewrite(ckpt, lambda t: t.update({k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()}))  # other bytes
    _, report16 = load_params(ckpt)
    assert report16["content_hash"] == content_hash(ckpt) != report["content_hash"]
    tensors = load_file(str(ckpt / "model.safetensors"))
    keys = sorted(tensors)
    out = tmp_path / "sharded"  # two weight files, in the index's order
    out.mkdir()
    shards = {"a.safetensors": keys[::2], "b.safetensors": keys[1::2]}
    for name, ks in shards.items():
        save_file({k: tensors[k] for k in ks}, str(out / name), metadata={"format": "pt"})
    weight_map = {k: name for name, ks in shards.items() for k in ks}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(ckpt / "config.json", out / "config.json")
    _, sharded = load_params(out)
    assert sharded["content_hash"] == content_hash(out)


def test_a_truncated_weight_file_is_named(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file .*truncated"):
        load_params(ckpt)
