"""Shared test fixtures: the reference checkpoints made with transformers, and built-in tiny checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "reference"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A built-in 'tiny' checkpoint (float32, seed 0) with a trained tokenizer, made once per test session."""
    from model.builtin import create_checkpoint

    return create_checkpoint("tiny", tmp_path_factory.mktemp("ckpt") / "tiny", dtype="float32")
