"""Prompt-length limits from config.json alone (model/limits.py): the ladder, the checks a request passes, and
`bench sweep --inputs` refused in one line before any weight loads (or a built-in checkpoint is created)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench_captured

from model.config import TINY
from model.errors import EngineError
from model.limits import DEFAULT_MAX_LENGTH, bucket_ladder, prompt_limits

POSITIONS = TINY.max_position_embeddings  # 256


def test_the_default_ladder_stops_at_the_models_positions_or_the_default_maximum() -> None:
    small = prompt_limits(POSITIONS)
    assert small.max_length == POSITIONS and small.buckets == (32, 64, 128, 256) and not small.explicit_buckets
    big = prompt_limits(131_072)
    assert big.max_length == DEFAULT_MAX_LENGTH and big.buckets[-1] == DEFAULT_MAX_LENGTH
    assert prompt_limits(POSITIONS, max_length=100).buckets == bucket_ladder(100) == (32, 64, 100)
    given = prompt_limits(POSITIONS, buckets=(16, 48))
    assert given.buckets == (16, 48) and given.max_length == 48 and given.explicit_buckets


def test_a_ladder_the_model_cannot_take_is_refused() -> None:
    with pytest.raises(EngineError, match="bucket 128 is above --max-length 64"):
        prompt_limits(POSITIONS, max_length=64, buckets=(32, 128))
    with pytest.raises(EngineError, match="largest bucket 512 exceeds the model's max_position_embeddings 256"):
        prompt_limits(POSITIONS, buckets=(64, 512))
    with pytest.raises(EngineError, match="largest bucket 300 exceeds"):
        prompt_limits(POSITIONS, max_length=300)


def test_each_request_gets_its_bucket_or_the_fix_that_can_work() -> None:
    limits = prompt_limits(POSITIONS, max_length=64)
    assert [limits.check_request(n, 4) for n in (1, 32, 33, 64)] == [32, 32, 64, 64]
    with pytest.raises(EngineError, match=r"prompt of 100 tokens exceeds the engine's largest bucket 64; raise it "
                                          r"with --max-length 100\.\.256"):  # fmt: skip
        limits.check_request(100, 4)
    with pytest.raises(EngineError, match=r"add a bucket of 100\.\.255 tokens to --buckets"):
        prompt_limits(POSITIONS, buckets=(16, 32)).check_request(100, 4)
    with pytest.raises(EngineError, match="neither --max-length nor --buckets can exceed"):
        limits.check_request(300, 4)
    with pytest.raises(EngineError, match="250 prompt tokens \\+ 10 new tokens exceed the model's 256 positions"):
        prompt_limits(POSITIONS).check_request(250, 10)
    with pytest.raises(EngineError, match="max_new_tokens must be >= 1"):
        limits.check_request(10, 0)
    with pytest.raises(EngineError, match="at least 1 token"):
        limits.bucket_for(0)


@pytest.fixture
def config_only(tmp_path: Path) -> Path:
    """A checkpoint folder of the tiny model with config.json and nothing else: loading it would fail on the
    missing weights, so a refusal that names the sizes proves it came before the load."""
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY.to_hf_dict()))
    return folder


@pytest.mark.parametrize(("args", "expected"), [
    (["--inputs", "41,300"], "error: --inputs 300: prompt of 300 tokens exceeds the engine's largest bucket 256; the "
                             "model has 256 positions"),
    (["--inputs", "250", "--max-new-tokens", "10"], "error: --inputs 250: 250 prompt tokens + 10 new tokens exceed "
                                                    "the model's 256 positions"),
    (["--inputs", "100", "--max-length", "64"], "error: --inputs 100: prompt of 100 tokens exceeds the engine's "
                                                "largest bucket 64; raise it with --max-length 100..256"),
    (["--inputs", "41", "--max-length", "300"], "error: --max-length 300: above the model's 256 positions"),
    (["--inputs", "41", "--buckets", "64,512"], "error: --buckets 64,512: largest bucket 512 exceeds the model's "
                                                "max_position_embeddings 256"),
    (["--inputs", "41", "--max-length", "-5"], "error: --max-length -5: must be a positive number of tokens"),
])  # fmt: skip
def test_sweep_sizes_beyond_the_config_are_refused_before_the_weights_load(
    config_only: Path, tmp_path: Path, capsys, args: list[str], expected: str
) -> None:
    runs = tmp_path / "runs"
    code, _, err = bench_captured(["sweep", "--checkpoint", str(config_only), "--runs-dir", str(runs), *args], capsys)
    assert code == 2 and err.startswith(expected), err
    assert len(err.strip().splitlines()) == 1 and "safetensors" not in err and "Traceback" not in err
    assert not runs.exists()


def test_a_builtin_preset_is_checked_before_it_is_created(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GEMMA4_BENCH_CACHE", str(tmp_path / "cache"))
    code, _, err = bench_captured(["sweep", "--checkpoint", "builtin:tiny", "--inputs", "999", "--runs-dir",
                                   str(tmp_path / "runs")], capsys)  # fmt: skip
    assert code == 2 and err.startswith("error: --inputs 999: prompt of 999 tokens exceeds"), err
    assert not any((tmp_path / "cache").glob("**/*.safetensors"))  # the preset was never written
