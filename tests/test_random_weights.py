"""Dummy weights (`--checkpoint random:PRESET[@SEED]`, model/random_weights.py): made on the device in their final
layout, deterministic per seed, the same pytree as a checkpoint's load, recorded as dummy weights, refused in one
line for a bad preset and before anything is drawn when they do not fit."""

from __future__ import annotations

import zlib

import jax
import numpy as np
import pytest

from model.config import PRESETS
from model.errors import CheckpointError, EngineError
from model.random_spec import DUMMY_NOTE, RandomSpec, parse_random
from tests.conftest import bench_captured


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory):
    """Dummy folders (config and tokenizer) in a cache of this module's own, shared by its tests (module scope:
    set before the module's engines load)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GEMMA4_BENCH_CACHE", str(tmp_path_factory.mktemp("random-weights-cache")))
        yield


def _load(spec: str, quant: str | None = None):
    from model.engine import load_engine
    from model.policy import decide_policy
    from model.quantspec import parse_quant

    return load_engine(spec, policy=decide_policy("float32"), log_policy=False, quant=parse_quant(quant))


@pytest.fixture(scope="module")
def tiny0():
    return _load("random:tiny")


def _leaves(params):
    from model.quant import QuantArray

    return jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, QuantArray))


# ---- the text ---------------------------------------------------------------------------------------------------------
def test_random_text_parses_to_a_preset_and_a_seed():
    assert parse_random("random:tiny") == RandomSpec("tiny", 0)
    assert parse_random("random:e2b@7") == RandomSpec("e2b", 7)
    assert parse_random("random:e2b@7").text == "random:e2b@7" and RandomSpec("tiny").text == "random:tiny"
    for bad, needle in (("random:nosuch", "unknown preset 'nosuch'"), ("random:tiny@x", "seed 'x'"),
                        ("random:tiny@", "no seed"), ("random:tiny@4294967296", "seed '4294967296'"),
                        ("random:tiny@-1", "seed '-1'"), ("builtin:tiny", "not a random-weights")):  # fmt: skip
        with pytest.raises(CheckpointError, match=needle) as info:
            parse_random(bad)
        assert "\n" not in str(info.value) and bad in str(info.value)


def test_a_bad_preset_is_one_line_listing_the_presets_and_exit_2(capsys):
    code, out, err = bench_captured(["generate", "-p", "hi", "--checkpoint", "random:nosuch"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "random:nosuch" in lines[0] and all(name in lines[0] for name in PRESETS)
    assert "Traceback" not in err and out == ""


# ---- loading and generating ---------------------------------------------------------------------------------------------
def _check_loads_and_generates(preset: str, engine, report) -> None:
    """`engine` (random:PRESET, float32) has the preset's config and leaf shapes, its dense weight bytes, and
    generates ids in the vocabulary, the first one the argmax of its next-token logits."""
    from model.params import abstract_params

    cfg = PRESETS[preset]
    assert engine.cfg == cfg and report["dummy"]["preset"] == preset and report["stored_dtypes"] == []
    want = {tuple(x.shape) for x in jax.tree_util.tree_leaves(abstract_params(cfg))}
    got = {tuple(x.shape) for x in _leaves(engine.params)}
    assert got <= want | {tuple(reversed(s)) for s in want}  # the CPU kernels hold some projections transposed
    assert engine.weight_bytes == sum(int(np.prod(s.shape)) * 4 for s in jax.tree_util.tree_leaves(abstract_params(cfg)))
    prompt = engine.tokenizer.chat_ids("The weights are random.")
    gen = engine.generate(prompt, max_new_tokens=4)
    assert len(gen.token_ids) == 4 and all(0 <= t < cfg.vocab_size for t in gen.token_ids)
    logits = engine.next_token_logits(prompt, 4)
    assert logits.shape == (cfg.vocab_size,) and np.isfinite(logits).all() and int(np.argmax(logits)) == gen.token_ids[0]


def test_random_tiny_loads_with_the_presets_shapes_and_generates(tiny0):
    _check_loads_and_generates("tiny", *tiny0)


@pytest.mark.heavy
def test_random_default_loads_with_the_presets_shapes_and_generates():
    _check_loads_and_generates("default", *_load("random:default"))


def test_the_same_seed_gives_the_same_logits_and_another_seed_others(tiny0):
    engine, report = tiny0
    prompt = engine.tokenizer.chat_ids("same seed, same logits")
    again, again_report = _load("random:tiny")
    other, other_report = _load("random:tiny@1")
    first = engine.next_token_logits(prompt, 4)
    np.testing.assert_array_equal(first, again.next_token_logits(prompt, 4))
    assert report["content_hash"] == again_report["content_hash"] != other_report["content_hash"]
    assert np.abs(first - other.next_token_logits(prompt, 4)).max() > 1e-3


def test_the_values_follow_the_builtin_rules_not_its_bytes(tiny0):
    """Same distribution family and scale as `init_tensors` (built-in checkpoints), leaf by leaf; not the same
    values (another generator)."""
    from model.params import init_params

    engine, _ = tiny0
    ref = init_params(PRESETS["tiny"], 0)  # a projection held transposed for the CPU kernels has the same statistics
    pairs = [(np.asarray(a, np.float32), np.asarray(b, np.float32))
             for a, b in zip(_leaves(engine.params), _leaves(ref), strict=True)]  # fmt: skip
    for got, want in pairs:
        if got.size < 4096:  # too few values for a test that does not fail by chance
            continue
        assert got.size == want.size
        assert abs(got.mean() - want.mean()) < 6 * want.std() * (2 / got.size) ** 0.5 + 0.02 * abs(want.mean())
        assert 0.85 < got.std() / want.std() < 1.15
    assert any(not np.array_equal(np.sort(g.ravel()), np.sort(w.ravel())) for g, w in pairs)


@pytest.mark.parametrize("quant", ["w8", "w4", "ple4,int8_lm_head", "ple8,w4:32"])
def test_quantized_dummy_weights_have_a_checkpoints_layout(quant, tiny_checkpoint):
    """Same pytree (QuantArray layouts included), leaf dtypes, shapes and packed bytes as the same preset loaded
    from a checkpoint file with that --quant."""
    from model.quant import QuantArray, packed_bytes

    random_engine, report = _load("random:tiny", quant)
    file_engine, _ = _load(str(tiny_checkpoint), quant)
    is_q = lambda x: isinstance(x, QuantArray)  # noqa: E731
    assert (jax.tree_util.tree_structure(random_engine.params, is_leaf=is_q)
            == jax.tree_util.tree_structure(file_engine.params, is_leaf=is_q))  # fmt: skip
    for got, want in zip(_leaves(random_engine.params), _leaves(file_engine.params), strict=True):
        assert type(got) is type(want)
        assert packed_bytes(got) == packed_bytes(want)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)
    assert random_engine.weight_bytes == file_engine.weight_bytes
    assert report["content_hash"] == _load("random:tiny")[1]["content_hash"]  # the draw does not depend on --quant


def test_a_quantized_table_holds_the_dense_tables_values_quantized():
    """ple4,int8_lm_head quantizes the very values the dense load holds (drawn block by block either way)."""
    from model.quant import dequantize

    dense, _ = _load("random:tiny@2")
    quant, _ = _load("random:tiny@2", "ple4,int8_lm_head")
    table = np.asarray(dense.params.ple_embed_VX)
    q = quant.params.ple_embed_VX
    step = np.repeat(np.asarray(q.scales, np.float32), q.block[-1], axis=-1)[:, : table.shape[1]]
    assert np.all(np.abs(np.asarray(dequantize(q, np.float32)) - table) <= step / 2 + 1e-6)
    np.testing.assert_array_equal(np.asarray(quant.params.embed_VD), np.asarray(dense.params.embed_VD))
    head = np.asarray(dequantize(quant.params.lm_head_VD, np.float32))
    assert np.abs(head - np.asarray(dense.params.embed_VD)).max() <= np.abs(head).max() / 127 + 1e-6


# ---- the record ---------------------------------------------------------------------------------------------------------
def test_the_manifest_says_dummy_weights_and_keys_the_build_on_preset_seed_and_dtype(tiny0):
    from bench.cli.common import engine_manifest
    from bench.runs import Manifest, Workload

    engine, report = tiny0
    m = engine_manifest("generate", engine, report, "random:tiny", None, Workload())
    ck = m.to_dict()["checkpoint"]
    assert ck["id"] == "random-tiny-float32-seed0" and ck["source"] == "random:tiny"
    assert ck["dummy"]["kind"] == "random" and ck["dummy"]["note"] == DUMMY_NOTE
    assert (ck["dummy"]["preset"], ck["dummy"]["seed"], ck["dummy"]["weight_dtype"]) == ("tiny", 0, "float32")
    assert ck["dummy"]["prng"] == "threefry2x32"
    assert ck["content_hash"] == report["content_hash"] and ck["weight_bytes"] == engine.weight_bytes
    back = Manifest.from_dict({**m.to_dict(), "name": "dummy", "started_at": "2026-12-07"})
    assert back.checkpoint.dummy["note"] == DUMMY_NOTE and back.checkpoint.label == "random-tiny-float32-seed0 (dummy weights)"
    other = engine_manifest("generate", *_load("random:tiny@1"), "random:tiny@1", None, Workload())
    assert other.build_id != m.build_id and other.to_dict()["checkpoint"]["source"] == "random:tiny@1"


def test_compare_and_the_report_name_dummy_weights():
    from bench.report.compare import manifest_differences
    from bench.report.tables import _checkpoint_text

    dummy = {"id": "random-tiny-float32-seed0", "dummy": {"note": DUMMY_NOTE}}
    assert _checkpoint_text(dummy) == "random-tiny-float32-seed0 (dummy weights)"
    assert _checkpoint_text({"id": "tiny-float32-seed0-v1"}) == "tiny-float32-seed0-v1"
    diffs = manifest_differences({"checkpoint": dummy}, {"checkpoint": {"id": "tiny-float32-seed0-v1"}})
    assert any(d.field == "checkpoint id" and d.baseline == "random-tiny-float32-seed0 (dummy weights)"
               and d.candidate == "tiny-float32-seed0-v1" for d in diffs)  # fmt: skip


# ---- bounds and keys ------------------------------------------------------------------------------------------------------
def test_weights_that_do_not_fit_are_refused_before_anything_is_drawn(monkeypatch):
    import model.random_weights as rw

    monkeypatch.setattr(rw, "memory_capacity", lambda weight_bytes, device=None: (10**6, "of test memory"))

    def never(*args, **kwargs):
        raise AssertionError("drew weights although they do not fit")

    monkeypatch.setattr(rw, "random_params", never)
    with pytest.raises(EngineError) as info:
        _load("random:default", "w8")
    text = str(info.value)
    assert "random:default (quant w8) does not fit" in text and "GB of weights as placed" in text
    assert "0.001 GB of test memory" in text and "\n" not in text


def test_every_leaf_of_every_preset_has_its_own_key():
    from model.accounting import compute_layer_shapes, global_shapes

    for cfg in PRESETS.values():
        names = list(global_shapes(cfg)) + [f"layers.{i}.{n}" for i in range(cfg.num_layers)
                                             for n in compute_layer_shapes(cfg, i)]  # fmt: skip
        assert len({zlib.crc32(n.encode()) for n in names}) == len(names)


def test_every_command_refuses_a_bad_preset_in_one_line_before_loading(tmp_path):
    from bench.cli.serve_cmds import _check_options
    from bench.errors import InputError
    from bench.gpurun.main import Options, check_options

    from bench.fleet.plan import check_checkpoint, is_hub_id

    check_options(Options(outdir=tmp_path, checkpoint="random:e2b@3"))  # accepted: nothing to create first
    check_checkpoint("random:e2b@3")
    assert not is_hub_id("random:e2b")
    for check in (lambda: check_options(Options(outdir=tmp_path, checkpoint="random:nosuch")),
                  lambda: _check_options("random:nosuch", 8000, 1024, None),
                  lambda: check_checkpoint("random:nosuch")):  # fmt: skip
        with pytest.raises(InputError, match="--checkpoint random:nosuch: unknown preset 'nosuch'") as info:
            check()
        assert all(name in str(info.value) for name in PRESETS) and "\n" not in str(info.value)


@pytest.mark.parametrize("args", [["sweep", "--inputs", "8", "--max-new-tokens", "2", "--repeats", "1"],
                                  ["profile", "--steps", "2"]])  # fmt: skip
def test_sweep_and_profile_refuse_a_bad_preset_in_one_line(args, capsys, tmp_path):
    code, _, err = bench_captured([*args, "--checkpoint", "random:tiny@x", "--runs-dir", str(tmp_path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "seed 'x'" in err, err


def test_the_generator_is_chosen_recorded_and_hashed(monkeypatch):
    import model.random_weights as rw

    spec, folder = RandomSpec("tiny"), rw.ensure_random(RandomSpec("tiny"), log=lambda line: None)
    assert rw.dummy_content_hash(folder, spec, "float32", "rbg") != rw.dummy_content_hash(folder, spec, "float32")
    cfg = PRESETS["tiny"]
    a, _ = rw.random_params(cfg, 0, dtype=np.float32, prng="rbg")
    b, _ = rw.random_params(cfg, 0, dtype=np.float32, prng="rbg")
    c, _ = rw.random_params(cfg, 0, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(a.embed_VD), np.asarray(b.embed_VD))
    assert not np.array_equal(np.asarray(a.embed_VD), np.asarray(c.embed_VD))
    monkeypatch.setenv(rw.PRNG_ENV, "philox")
    with pytest.raises(EngineError, match="GEMMA4_BENCH_RANDOM_PRNG='philox': expected one of threefry2x32, rbg"):
        _load("random:tiny")


def test_on_a_tpu_the_tables_would_be_stored_as_the_checkpoint_path_stores_them():
    """The storage `leaf_layout` gives each table per platform (the int8 head in uint32 words on a TPU only, the
    PLE table everywhere) is the dummy weights' too: the same pytree as `quantize_params` of the same preset for
    that platform, leaf dtypes and shapes included."""
    from model.params import init_params
    from model.quant import QuantArray, quantize_params
    from model.quantspec import parse_quant
    from model.random_weights import random_params

    cfg, spec, is_q = PRESETS["tiny"], parse_quant("ple4,int8_lm_head,w8"), (lambda x: isinstance(x, QuantArray))
    for platform in ("tpu", "cpu"):
        got, _ = random_params(cfg, 0, dtype=np.float32, quant=spec, platform=platform)
        want = quantize_params(init_params(cfg, 0), spec, platform=platform)
        assert jax.tree_util.tree_structure(got, is_leaf=is_q) == jax.tree_util.tree_structure(want, is_leaf=is_q)
        assert ([(tuple(a.shape), np.dtype(a.dtype)) for a in jax.tree_util.tree_leaves(got)]
                == [(tuple(b.shape), np.dtype(b.dtype)) for b in jax.tree_util.tree_leaves(want)])  # fmt: skip
        assert got.lm_head_VD.words == (platform == "tpu") and got.ple_embed_VX.words
