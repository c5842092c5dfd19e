"""`bench checkpoint inspect`: weight bytes by component from a preset's shapes or a checkpoint's headers, equal to
the bytes of the loaded and quantized parameters; bad input is one line and exit code 2."""

from __future__ import annotations

import json
import shutil
import types

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REFERENCE, assert_one_line_error, bench_captured
from safetensors.numpy import load_file, save_file

from model.accounting import COMPONENTS, weight_bytes
from model.checkpoint import load_params, read_checkpoint_shapes
from model.config import load_config
from model.quant import quantize_params, tree_bytes
from model.quantspec import parse_quant


def _inspect(args, capsys) -> tuple[int, str, str]:
    return bench_captured(["checkpoint", "inspect", *args], capsys)


def test_the_published_configuration_prints_its_weight_bytes(capsys):
    code, out, err = _inspect(["--preset", "e2b", "--quant", "ple4,int8_lm_head"], capsys)
    assert code == 0, err
    assert "6,155,450,950" in out and "4,628,569,379" in out  # the total bytes, and the parameters
    for name in COMPONENTS:
        assert name in out
    code, out, _ = _inspect(["--preset", "e2b"], capsys)
    assert code == 0 and "9,257,138,758" in out


@pytest.mark.parametrize("quant,expected", [("ple8", 6_926_678_598), ("ple4", 5_752_273_478)])
def test_json_of_a_preset(quant, expected, capsys):
    code, out, err = _inspect(["--preset", "e2b", "--quant", quant, "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["total"]["bytes"] == expected and data["quant"] == quant and data["dtype"] == "bfloat16"
    assert [c["name"] for c in data["components"]] == list(COMPONENTS)
    assert sum(c["bytes"] for c in data["components"]) == expected


@pytest.fixture()
def ckpt(tmp_path):
    """A writable copy of the transformers-made tiny checkpoint (float32)."""
    return shutil.copytree(REFERENCE / "tiny", tmp_path / "tiny")


@pytest.mark.parametrize("quant", ["none", "ple4,int8_lm_head,w8", "w4:16,ple8"])
def test_checkpoint_bytes_equal_the_loaded_quantized_parameters(ckpt, quant, capsys):
    code, out, err = _inspect([str(ckpt), "--quant", quant, "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["dtype"] == "float32" and data["stored_dtypes"] == ["float32"] and data["ignored_tensors"] == 0
    params, _ = load_params(ckpt)
    spec = parse_quant(quant)
    qp = quantize_params(params, spec, scale_dtype=jnp.bfloat16)  # the head copy, if any, is qp.lm_head_VD
    assert data["total"]["bytes"] == tree_bytes(qp)
    streamed, _ = load_params(ckpt, quant=spec, scale_dtype=jnp.bfloat16)  # quantized while loading
    assert data["total"]["bytes"] == tree_bytes(streamed)
    if quant == "none":  # dense: what the checkpoint stores
        assert data["total"]["bytes"] == data["stored_bytes"] == tree_bytes(params)


def test_dtype_and_scale_dtype_overrides(ckpt, capsys):
    cfg = load_config(ckpt)
    code, out, err = _inspect([str(ckpt), "--dtype", "bfloat16", "--scale-dtype", "float32", "--quant", "w8",
                               "--json"], capsys)  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["total"]["bytes"] == weight_bytes(cfg, 2, scale_itemsize=4, quant=parse_quant("w8"))
    code, out, err = _inspect([str(ckpt)], capsys)
    assert code == 0 and "stored in the checkpoint" in out and "float32" in out


def test_headers_only_give_the_same_checks_as_loading(ckpt):
    shapes = read_checkpoint_shapes(ckpt)
    assert shapes.config == load_config(ckpt) and shapes.stored_dtypes == ("F32",)
    _, report = load_params(ckpt)
    assert shapes.tensors == report["tensors"]
    assert shapes.stored_bytes == sum(a.nbytes for a in load_file(str(ckpt / "model.safetensors")).values())


def _rewrite(path, fn):
    tensors = load_file(str(path / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("args,needles", [
    (["--preset", "e9b"], ["--preset e9b", "tiny, default, e2b, e4b"]),
    (["--preset", "e2b", "--quant", "ple4,ple8"], ["ple4,ple8", "at most one"]),
    (["--preset", "e2b", "--quant", "int4"], ["unknown option 'int4'"]),
    (["--preset", "e2b", "--dtype", "int8"], ["--dtype int8"]),
    (["--preset", "e2b", "--scale-dtype", "float8"], ["--scale-dtype float8"]),
    ([], ["CHECKPOINT", "--preset"]),
    (["/no/such/ckpt-dir"], ["/no/such/ckpt-dir", "no such directory"]),
    (["CKPT", "--preset", "tiny"], ["one of them"]),
    (["INTCKPT"], ["stored as I32", "quantized checkpoints"]),
    (["MIXED"], ["several dtypes", "--dtype"]),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, needles, ckpt, capsys):
    if "INTCKPT" in args:
        _rewrite(ckpt, lambda t: t.__setitem__("model.norm.weight", np.ones(64, np.int32)))
    if "MIXED" in args:
        _rewrite(ckpt, lambda t: t.__setitem__("model.norm.weight", np.ones(64, np.float16)))
    args = [str(ckpt) if a in ("CKPT", "INTCKPT", "MIXED") else a for a in args]
    code, out, err = _inspect(args, capsys)
    assert_one_line_error(types.SimpleNamespace(returncode=code, stdout=out, stderr=err), *needles)

