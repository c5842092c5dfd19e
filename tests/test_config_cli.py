"""A checkpoint whose config.json has a field of the wrong type: `bench generate` and `bench sweep` print the one
ConfigError line (field, value, expected type, file) and exit 2, before any weight is read."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REFERENCE, assert_one_line_error, run_cli_here


@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["sweep", "--inputs", "4", "--max-new-tokens", "2"]])
def test_string_layer_count_is_one_line_and_exit_2(command, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(REFERENCE / "tiny" / "model.safetensors", ckpt)
    config = json.loads((REFERENCE / "tiny" / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(dict(config, num_hidden_layers="6")))
    runs = ["--runs-dir", str(tmp_path / "runs")] if command[0] == "sweep" else []
    proc = run_cli_here([*command, "--checkpoint", str(ckpt), *runs], env={"JAX_PLATFORMS": "cpu"})
    assert_one_line_error(proc, f"{ckpt / 'config.json'}: field 'num_hidden_layers' is '6' (a string); expected an integer")
