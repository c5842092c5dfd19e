"""Loading streams: the peak resident memory of a load, dense and quantized, is bounded, and a load that quantizes
while it streams gives exactly the leaves `quantize_params` gives on the dense load.

The bound (`model.checkpoint.load_params`): peak RSS <= the process baseline (python + jax + the XLA runtime and
compiler, measured here in the same kind of subprocess, without the load) + the loaded result's bytes + the largest
tensor as stored + `MARGIN_BLOCKS` block buffers of `model.stream.BLOCK_BYTES`. Measured with the child's
`ru_maxrss` (KiB on Linux), so nothing else running on the machine counts. The child is started through `/bin/sh`
(which forks it): Linux carries the peak of the process image an `exec` replaces into `ru_maxrss`, and a child
that pytest spawns directly replaces (a vfork of) pytest itself, whose peak holds the generated checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from model.checkpoint import load_params, save_tensors, tensor_table, write_config_files
from model.config import TINY
from model.params import init_tensors
from model.quant import QuantArray, quantize_params
from model.quantspec import parse_quant

MARGIN_BLOCKS = 8
"""Block buffers the margin allows beyond the baseline: the stored block read, its converted copy, and the
quantizer's float32 work and compiles. Measured on `BIG` (2-core CPU): dense loads peaked 9-13 MiB above baseline +
result, `ple4,int8_lm_head,w8` 105 MiB (6.6 blocks); the load before streaming 765-1875 MiB above it."""

BIG = dataclasses.replace(TINY, vocab_size=65536, ple_vocab_size=65536, hidden_size=128, ple_dim=512,
                          max_position_embeddings=256)  # fmt: skip
"""The tables dominate: the PLE table [65536, 6 x 512] is 402 MB in bfloat16, the layers about 1 MB in all."""

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys
import jax, ml_dtypes, numpy as np
from model.checkpoint import load_params
from model.quant import quantize, tree_bytes
from model.quantspec import parse_quant
path, quant, dtype = sys.argv[1:4]
jax.block_until_ready(quantize(np.ones((4, 512), np.float32), 8, (1, 256)))  # jit and the compiler, in the baseline
result = 0
if path != "-":
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    params, _ = load_params(path, dtype=dt, device_put=jax.device_put, quant=parse_quant(quant))
    jax.block_until_ready(params)
    result = tree_bytes(params)
print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "result_bytes": result}))
"""


def _child(path: str, quant: str = "none", dtype: str = "bfloat16") -> dict:
    """Run one load (or, with path "-", only the imports and jax's start) in a fresh interpreter; its peak RSS in
    bytes and the loaded tree's bytes (`model.quant.tree_bytes`)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    launch = ["/bin/sh", "-c", '"$0" "$@"; exit $?']  # sh forks the child: its ru_maxrss starts from sh's, not ours
    proc = subprocess.run([*launch, sys.executable, "-c", _CHILD, path, quant, dtype], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"peak": out["maxrss_kib"] * 1024, "result": out["result_bytes"]}


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory) -> Path:
    """A generated bfloat16 checkpoint of `BIG` (about 420 MB), written once for this module."""
    out = tmp_path_factory.mktemp("big") / "ckpt"
    bf16 = ml_dtypes.bfloat16
    save_tensors(init_tensors(BIG, 0, dtype=bf16), BIG, out, dtype=bf16)
    write_config_files(BIG, out)
    return out


@pytest.fixture(scope="module")
def baseline() -> int:
    """Peak RSS (bytes) of the child without a load: python, numpy, jax, one small compiled quantize."""
    return _child("-")["peak"]


def _largest_stored(cfg) -> int:
    """Bytes of the largest tensor of `cfg` as stored in bfloat16."""
    return max(math.prod(spec.hf_shape) for spec in tensor_table(cfg).values()) * 2


@pytest.mark.slow
@pytest.mark.parametrize("quant, dtype", [("none", "bfloat16"), ("none", "float32"),
                                          ("ple4,int8_lm_head,w8", "bfloat16")])  # fmt: skip
def test_peak_memory_of_a_load_is_bounded(big_checkpoint, baseline, quant, dtype):
    from model.stream import BLOCK_BYTES

    got = _child(str(big_checkpoint), quant, dtype)
    largest = _largest_stored(BIG)
    bound = baseline + got["result"] + largest + MARGIN_BLOCKS * BLOCK_BYTES
    assert largest > 400e6 and got["result"] > 0
    mib = 2**20
    assert got["peak"] <= bound, (
        f"peak {got['peak'] / mib:.0f} MiB > bound {bound / mib:.0f} MiB = baseline {baseline / mib:.0f} + result "
        f"{got['result'] / mib:.0f} + largest tensor {largest / mib:.0f} + {MARGIN_BLOCKS} blocks "
        f"{MARGIN_BLOCKS * BLOCK_BYTES / mib:.0f}"
    )


# ---- streamed quantization equals quantizing the dense load -------------------------------------------------------
def _assert_same_tree(a, b) -> None:
    is_q = lambda x: isinstance(x, QuantArray)
    la, ta = jax.tree_util.tree_flatten(a, is_leaf=is_q)
    lb, tb = jax.tree_util.tree_flatten(b, is_leaf=is_q)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y)
        if is_q(x):
            assert (x.shape, x.bits, x.block, x.words) == (y.shape, y.bits, y.block, y.words)
            for u, v in ((x.values, y.values), (x.scales, y.scales)):
                assert np.asarray(u).dtype == np.asarray(v).dtype
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        else:
            assert np.asarray(x).dtype == np.asarray(y).dtype
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("quant", ["ple4,int8_lm_head,w8", "ple8,w4:16", "int8_lm_head,w4"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_streamed_quantization_equals_quantizing_the_dense_load(tiny_checkpoint, monkeypatch, quant, dtype):
    import model.stream

    spec = parse_quant(quant)
    dense, report = load_params(tiny_checkpoint, dtype=dtype)
    monkeypatch.setattr(model.stream, "BLOCK_BYTES", 4096)  # many blocks of rows, and a short last one
    streamed, streamed_report = load_params(tiny_checkpoint, dtype=dtype, quant=spec)
    assert streamed_report["content_hash"] == report["content_hash"]
    assert isinstance(streamed.ple_embed_VX, QuantArray) == (spec.ple_bits is not None)
    if spec.ple_bits is not None:  # stored in the layout its row gather reads (model.quantspec.WORD_TABLES)
        assert streamed.ple_embed_VX.words and np.asarray(streamed.ple_embed_VX.values).dtype == np.uint32
    assert isinstance(streamed.lm_head_VD, QuantArray) == spec.int8_lm_head
    assert not isinstance(streamed.embed_VD, QuantArray)
    _assert_same_tree(streamed, quantize_params(dense, spec))


def test_dense_blocks_equal_the_whole_tensor(tiny_checkpoint, monkeypatch):
    import model.stream

    whole, _ = load_params(tiny_checkpoint, dtype=ml_dtypes.bfloat16)
    monkeypatch.setattr(model.stream, "BLOCK_BYTES", 1000)
    blocks, _ = load_params(tiny_checkpoint, dtype=ml_dtypes.bfloat16)
    _assert_same_tree(blocks, whole)
    ref = np.asarray(whole.ple_embed_VX)
    assert ref.shape[0] * ref.shape[1] * 4 > 1000 and ref.dtype == np.dtype(ml_dtypes.bfloat16)
