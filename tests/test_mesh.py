"""The device mesh (`model.sharding`, docs/engine.md, "Several devices"): its text, its refusals (one line, with
the numbers) before anything loads, the grouped columns of the fused weights, and, in a pytest process of its own
with 8 forced host devices (tests/mesh_cases.py), greedy tokens at tp = 2, 4 (and 8) and at ep = 2 (and 4) equal
one device's."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import host_devices_env

from model.config import E2B, E4B, TINY
from model.errors import MeshError
from model.placement import Mesh
from model.sharding import (
    SPLIT_AXIS,
    check_mesh,
    collective_bytes,
    gate_up_columns,
    make_layout,
    parse_mesh,
    qkv_columns,
)

CASES = Path(__file__).with_name("mesh_cases.py")


@pytest.mark.parametrize("text, tp, ep", [("tp=2", 2, 1), (" ep=4 ", 1, 4), ("tp=1", 1, 1)])
def test_mesh_text_reads_and_writes_back(text, tp, ep):
    spec = parse_mesh(text)  # model.placement's parser, the inspector's: one text, one Mesh
    assert (spec.tp, spec.ep, spec.size) == (tp, ep, tp * ep)
    assert parse_mesh(spec.text) == spec


@pytest.mark.parametrize("text", ["tp=0", "tp2", "tp=2,ep=2", "dp=2", "", "tp=-1", "tp=1.5"])
def test_bad_mesh_text_is_one_line(text):
    with pytest.raises(MeshError) as err:
        parse_mesh(text)
    line = str(err.value)
    assert "\n" not in line and f"--mesh {text}:" in line and "tp=N" in line


@pytest.mark.parametrize("cfg, text, numbers", [
    (TINY, "tp=3", ("tp=3", "query heads (4)")),
    (dataclasses.replace(TINY, num_heads=12, num_kv_heads=3, num_global_kv_heads=None), "tp=2",
     ("tp=2", "KV heads (3)")),
    (dataclasses.replace(TINY, num_heads=8, intermediate_size=100), "tp=8", ("tp=8", "MLP width (100)")),
    (dataclasses.replace(TINY, vocab_size=510, ple_vocab_size=512), "tp=4", ("tp=4", "vocabulary rows (510)")),
    (dataclasses.replace(TINY, ple_vocab_size=510), "tp=4", ("tp=4", "PLE vocabulary rows (510)")),
    (TINY, "ep=2", ("ep=2", "no experts")),
    (dataclasses.replace(TINY, num_experts=4, top_k_experts=2, moe_intermediate_size=16), "ep=3",
     ("ep=3", "does not divide the model's 4 experts", "expected ep in 1, 2, 4")),
])  # fmt: skip
def test_a_mesh_the_model_cannot_split_is_refused_with_the_numbers(cfg, text, numbers):
    with pytest.raises(MeshError) as err:
        check_mesh(cfg, parse_mesh(text))
    assert "\n" not in str(err.value) and all(n in str(err.value) for n in numbers), str(err.value)


@pytest.mark.parametrize("cfg, tp", [(E2B, 2), (E2B, 8), (E4B, 2), (E4B, 4), (TINY, 4)])
def test_published_shapes_split(cfg, tp):
    check_mesh(cfg, Mesh(axis="tp", size=tp))  # E2B's one KV head copied, E4B's two split at 2 and copied at 4


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_expert_parallel_splits_the_moe_preset(ep):
    from model.config import PRESETS

    check_mesh(PRESETS["tiny-moe"], Mesh(axis="ep", size=ep))  # 8 experts: ep divides them, the engine places them


def test_tensor_and_expert_parallel_together_is_refused_in_one_line():
    with pytest.raises(MeshError, match="expected one axis, tp=N or ep=N"):
        parse_mesh("tp=2,ep=2")


def test_more_devices_than_there_are_is_refused_in_one_line():
    import jax

    n = jax.device_count()
    with pytest.raises(MeshError) as err:
        make_layout(Mesh(axis="tp", size=n + 1))
    assert f"needs {n + 1} devices" in str(err.value) and "xla_force_host_platform_device_count" in str(err.value)


def test_groups_hold_their_query_heads_and_the_kv_heads_those_read():
    cfg = dataclasses.replace(TINY, num_heads=8, num_kv_heads=4, num_global_kv_heads=2)
    h = cfg.head_dim  # layer 0 is sliding: N 8, K 4, H 16; columns q 0..127, k 128..191, v 192..255
    cols = qkv_columns(cfg, 0, 2, own_kv=True)
    head = lambda base, j: list(range(base + j * h, base + (j + 1) * h))  # noqa: E731
    assert cols[1].tolist() == sum([head(0, j) for j in range(4, 8)] + [head(128, 2), head(128, 3),
                                                                          head(192, 2), head(192, 3)], [])
    # tp 8 over 4 KV heads: group g reads KV head g // 2, as one device's query head g does (g // (N / K))
    cols8 = qkv_columns(cfg, 0, 8, own_kv=True)
    assert [int(c[h]) for c in cols8] == [128 + (g // 2) * h for g in range(8)]
    assert qkv_columns(cfg, 0, 2, own_kv=False).tolist() == np.arange(128).reshape(2, 64).tolist()
    assert gate_up_columns(4, 2).tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    k_eq_v = dataclasses.replace(cfg, attention_k_eq_v=True)  # layer 2 is full: keys only, no value columns
    h2 = cfg.global_head_dim  # N 8, K 2: q 0..8*H-1, k 8H..10H-1
    assert qkv_columns(k_eq_v, 2, 2, own_kv=True)[0].tolist() == list(range(4 * h2)) + list(range(8 * h2, 9 * h2))


def test_split_leaves_are_fields_of_the_parameter_tree():
    from model.params import LayerParams, Params

    fields = {f.name for f in dataclasses.fields(Params)} | {f.name for f in dataclasses.fields(LayerParams)}
    assert set(SPLIT_AXIS) <= fields  # a renamed field would otherwise be replicated without a word


def test_collectives_are_read_from_compiled_hlo_text():
    text = "\n".join([
        "  %all-reduce.1 = f32[1,1,256]{2,1,0} all-reduce(f32[1,1,256]{2,1,0} %x), replica_groups={{0,1}}",
        "  %ag = (bf16[4,8]{1,0}, bf16[8,8]{1,0}) all-gather-start(bf16[4,8]{1,0} %y), dimensions={0}",
        "  %agd = bf16[8,8]{1,0} all-gather-done((bf16[4,8]{1,0}, bf16[8,8]{1,0}) %ag)",
        "  %t = (f32[2]{0}, s32[2]{0}) all-reduce(f32[2]{0} %a, s32[2]{0} %b), to_apply=%add",
        "  %cp = u8[3]{0} collective-permute(u8[3]{0} %z), source_target_pairs={{0,1}}",
        "  %add.2 = f32[8]{0} add(f32[8]{0} %p, f32[8]{0} %q)",
    ])  # fmt: skip
    sizes, counts = collective_bytes(text)
    assert sizes["all-reduce"] == 1024 + 16 and counts["all-reduce"] == 2
    assert sizes["all-gather"] == 128 and counts["all-gather"] == 1
    assert sizes["collective-permute"] == 3 and sizes["all-to-all"] == counts["reduce-scatter"] == 0


def _run_cases(marks: str) -> None:
    env = dict(os.environ, **host_devices_env(8))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marks, str(CASES)],
                          capture_output=True, text=True, env=env, cwd=CASES.parent.parent, timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_forced_host_devices_give_one_devices_tokens():
    """tests/mesh_cases.py (not heavy) with 8 forced host devices, in a process of its own (the flag must be set
    before jax starts, and this process's jax has one CPU device)."""
    _run_cases("not heavy")


@pytest.mark.heavy
def test_forced_host_devices_default_preset():
    """The heavy cases of tests/mesh_cases.py (the default preset at tp = 2 and 4) with 8 forced host devices."""
    _run_cases("heavy")
