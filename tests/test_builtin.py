"""Built-in checkpoints: exact Hugging Face format, deterministic bytes, the same hash on every machine."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, run_cli, run_cli_here

from model.builtin import create_checkpoint, ensure_builtin
from model.checkpoint import content_hash, load_params, save_tensors
from model.config import TINY, load_config
from model.errors import CheckpointError
from model.params import init_tensors
from model.tokenizer import GemmaTokenizer

# sha256 of the 'tiny' preset, float32, seed 0 (config.json, tokenizer.json, model.safetensors). If this changes on
# another machine, checkpoint generation is not deterministic there; if the generator changed on purpose, bump
# model.builtin.BUILTIN_VERSION and update this value.
TINY_FLOAT32_SEED0_SHA256 = "cd4f2539de0c5b59783f3ef42cfa8e607290866de599df566db819f175cb7778"


def test_files_and_format(tiny_checkpoint):
    names = sorted(p.name for p in tiny_checkpoint.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]  # fmt: skip
    assert load_config(tiny_checkpoint) == TINY
    modes = {p.name: p.stat().st_mode & 0o777 for p in tiny_checkpoint.iterdir()}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as the config (safetensors made it 0600)
    assert json.loads((tiny_checkpoint / "config.json").read_text())["model_type"] == "gemma4_text"
    _, report = load_params(tiny_checkpoint)
    assert report["prefixes"] == ["model."] and report["tensors"] == 98
    tok = GemmaTokenizer.from_dir(tiny_checkpoint)
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)


def test_generation_is_deterministic(tiny_checkpoint, tmp_path):
    again = create_checkpoint("tiny", tmp_path / "again", dtype="float32")
    assert content_hash(again) == content_hash(tiny_checkpoint)
    assert content_hash(again) == TINY_FLOAT32_SEED0_SHA256
    other_seed = create_checkpoint("tiny", tmp_path / "seed1", dtype="float32", seed=1)
    assert content_hash(other_seed) != content_hash(tiny_checkpoint)


def test_published_layout_checkpoint_loads(tmp_path):
    path = create_checkpoint("tiny", tmp_path / "pub", dtype="float32", layout="published")
    assert json.loads((path / "config.json").read_text())["model_type"] == "gemma4"
    _, report = load_params(path)
    assert report["prefixes"] == ["model.language_model."]


def test_ensure_builtin_caches_and_says_where(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_BENCH_CACHE", str(tmp_path))
    lines = []
    first = ensure_builtin("tiny", dtype="float32", log=lines.append)
    assert first.parent.parent == tmp_path and str(first) in lines[0]
    assert ensure_builtin("tiny", dtype="float32", log=lines.append) == first and len(lines) == 1


def test_bad_presets_and_targets(tmp_path):
    with pytest.raises(CheckpointError, match="unknown preset 'huge'"):
        create_checkpoint("huge", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(CheckpointError, match="not an empty directory"):
        create_checkpoint("tiny", tmp_path / "full")
    proc = run_cli_here(["checkpoint", "create", str(tmp_path / "y"), "--preset", "huge"])
    assert_one_line_error(proc, "unknown preset 'huge'")


def test_generate_prints_json_ids(tiny_checkpoint):
    proc = run_cli(["generate", "--prompt", "How do tides work?", "--checkpoint", str(tiny_checkpoint), "-n", "5",
                    "--json", "--compile-cache", "off"], env={"JAX_PLATFORMS": "cpu"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["prompt_ids"][:2] == [2, 105] and 1 <= len(out["generated_ids"]) <= 5
    assert proc.stderr.splitlines()[0].startswith("device policy: platform=cpu")


def test_writer_refuses_a_missing_or_foreign_leaf(tmp_path):
    leaves = list(init_tensors(TINY, 0))
    with pytest.raises(CheckpointError, match="tensors were not given"):
        save_tensors(leaves[:-1], TINY, tmp_path / "short")
    with pytest.raises(CheckpointError, match="no checkpoint name"):
        save_tensors([*leaves, (99, "wq_DNH", leaves[0][2])], TINY, tmp_path / "foreign")
    with pytest.raises(CheckpointError, match="given twice"):
        save_tensors([*leaves, leaves[3]], TINY, tmp_path / "twice")
    wq = next(leaf for leaf in leaves if leaf[1] == "wq_DNH")
    with pytest.raises(CheckpointError, match="shape"):  # caught before the reshape into the HF layout
        save_tensors([(wq[0], wq[1], wq[2][:-1, :, :-1]) if leaf is wq else leaf for leaf in leaves], TINY,
                     tmp_path / "bad-wq")  # fmt: skip
    layer, field, value = next(leaf for leaf in leaves if leaf[1] == "gate_DF")
    with pytest.raises(CheckpointError, match="shape"):
        save_tensors([(layer, field, value[:, :-1]) if leaf[1:2] == (field,) and leaf[0] == layer else leaf
                      for leaf in leaves], TINY, tmp_path / "misshaped")  # fmt: skip
