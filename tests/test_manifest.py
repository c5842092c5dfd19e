"""The typed manifest: one build id for one payload from every command, readers of schema 1 and 2, no local paths."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from runfolders import make_measured_run

from bench.errors import InputError, RunFolderError
from bench.runs import (
    CheckpointFacts,
    EngineConfig,
    Manifest,
    Workload,
    checkpoint_id,
    checkpoint_source,
    list_runs,
    local_dir,
    open_run,
    payload_build_id,
    portable_dir,
    validate_run,
)
from bench.runs.schema import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[1]
# The schema-1 folders archived before schema 2, by name: runs a user (or a GPU task) adds to runs/ are schema 2.
ARCHIVED = tuple(REPO / "runs" / name for name in (
    "2026-08-28-first-serve-g6", "2026-08-28-full-run-cached-g5g", "2026-11-30-chunked-prefill-cpu",
    "2026-11-30-default-cpu", "2026-11-30-leak-one-cpu", "2026-11-30-window-blocks-cpu",
))  # fmt: skip


# ---- one payload, one build id --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def payloads(tiny_checkpoint):
    """The build ids and published facts of one payload (the tiny checkpoint, float32) from `bench serve`'s loader,
    `bench sweep`'s and `bench profile`'s manifests, a remote sweep of that server, and of a bfloat16 payload."""
    from types import SimpleNamespace

    from bench.cli.common import engine_manifest, open_engine
    from bench.cli.serve_cmds import load_served_model
    from bench.sweep.command import sweep_workload
    from bench.sweep.remote import Target, remote_manifest

    from model.engine_config import EngineConfig

    spec, f32 = str(tiny_checkpoint), EngineConfig.from_options(dtype="float32")
    served = load_served_model(spec, f32, "off")
    engine, report, _, cache = open_engine(spec, f32, "off")
    sweep_cfg = SimpleNamespace(inputs=(20, 41), max_new_tokens=8, repeats=2)
    sweep = engine_manifest("sweep", engine, report, spec, cache, sweep_workload(sweep_cfg))
    profile_cfg = SimpleNamespace(inputs=(41,), max_new_tokens=30, repeats=None)
    profile = engine_manifest("profile", engine, report, spec, cache, sweep_workload(profile_cfg, profile_steps=20))
    health = {"status_code": 200, "body": {"status": "ok", "build_id": served.build_id, "checkpoint": served.checkpoint,
                                           "buckets": list(engine.buckets)}}  # fmt: skip
    target = Target("http://127.0.0.1:1/v1", "http://127.0.0.1:1", "tiny", True, health, {"data": [{"id": "tiny"}]})
    remote = remote_manifest(target, sweep_cfg, spec)
    engine16, report16, _, cache16 = open_engine(spec, EngineConfig.from_options(dtype="bfloat16"), "off")
    bf16 = engine_manifest("sweep", engine16, report16, spec, cache16, sweep_workload(sweep_cfg))
    engine8, report8, _, cache8 = open_engine(spec, EngineConfig.from_options(dtype="float32", quant="ple4,w8"), "off")
    w8 = engine_manifest("sweep", engine8, report8, spec, cache8, sweep_workload(sweep_cfg))
    served8 = load_served_model(spec, EngineConfig.from_options(dtype="float32", quant="w8,ple4"), "off")
    return SimpleNamespace(served=served, sweep=sweep, profile=profile, remote=remote, bf16=bf16, w8=w8,
                           served8=served8, path=spec)  # fmt: skip


def test_a_sweep_against_a_server_records_the_kernels_its_health_names(payloads):
    from types import SimpleNamespace

    from bench.sweep.remote import Target, remote_manifest

    cfg = SimpleNamespace(inputs=(20,), max_new_tokens=8, repeats=2)
    for kernel, recorded in (("bf16=cpu", "bf16=cpu"), (None, None), (7, None)):  # a non-text value is not recorded
        body = {"status": "ok", "build_id": payloads.served.build_id, "checkpoint": payloads.served.checkpoint,
                "kernel": kernel}  # fmt: skip
        target = Target("http://127.0.0.1:1/v1", "http://127.0.0.1:1", "tiny", True,
                        {"status_code": 200, "body": body}, {"data": [{"id": "tiny"}]})  # fmt: skip
        assert remote_manifest(target, cfg, payloads.path).engine.kernel == recorded
    assert payloads.remote.engine.kernel is None  # a /health without the field (older servers)


def test_a_quantized_payload_is_another_build_with_the_dense_one_named(payloads):
    w8, dense = payloads.w8, payloads.sweep
    assert (w8.engine.quantization, w8.engine.scale_dtype) == ("ple4,w8", "bfloat16")
    assert (dense.engine.quantization, dense.engine.scale_dtype) == ("none", None)
    assert w8.build_id != dense.build_id and w8.checkpoint.content_hash == dense.checkpoint.content_hash
    assert w8.dense_build_id == dense.build_id == dense.dense_build_id
    assert w8.checkpoint.weight_bytes < dense.checkpoint.weight_bytes
    # bench serve of the same quantized payload: the same build id, and /health's facts say so
    assert payloads.served8.build_id == w8.build_id and payloads.served8.quantization == "ple4,w8"
    assert payloads.served8.scale_dtype == "bfloat16" and payloads.served.scale_dtype is None
    assert payloads.served8.checkpoint["weight_bytes"] == w8.checkpoint.weight_bytes
    again = Manifest.from_dict(json.loads(json.dumps({**w8.to_dict(), "name": "q", "started_at": "2026-12-03"})))
    assert again.engine == w8.engine and again.dense_build_id == w8.dense_build_id  # through manifest.json


def test_a_manifest_from_before_quant_reads_as_dense(payloads):
    d = {**payloads.sweep.to_dict(), "name": "old", "started_at": "2026-12-03"}
    d.pop("dense_build_id")
    d["engine_config"].pop("scale_dtype")
    old = Manifest.from_dict(d)
    assert old.engine.quantization == "none" and old.engine.scale_dtype is None
    assert old.dense_build_id == old.build_id  # a dense run is its own dense build
    d["engine_config"]["quantization"] = "w8"
    assert Manifest.from_dict(d).dense_build_id is None  # a quantized one without the key: unknown


def test_sweep_profile_serve_and_a_remote_sweep_of_that_server_give_one_build_id(payloads):
    ids = {payloads.served.build_id, payloads.sweep.build_id, payloads.profile.build_id, payloads.remote.build_id}
    assert len(ids) == 1 and len(payloads.sweep.build_id) == 12
    assert payloads.sweep.workload != payloads.profile.workload  # per-command settings differ, the build does not
    assert payloads.sweep.engine == payloads.profile.engine
    assert payloads.remote.command == "sweep --target" and payloads.remote.checkpoint.content_hash == (
        payloads.sweep.checkpoint.content_hash)


def test_another_dtype_is_another_build(payloads):
    assert payloads.bf16.engine.compute_dtype == "bfloat16"
    assert payloads.bf16.build_id != payloads.sweep.build_id
    assert payloads.bf16.checkpoint.content_hash == payloads.sweep.checkpoint.content_hash


def test_the_build_id_is_the_payload_alone():
    engine = EngineConfig(buckets=(32, 64), max_length=64, batch=1, quantization="none", weight_dtype="float32",
                          activation_dtype="float32", kv_cache_dtype="float32", compute_dtype="float32")  # fmt: skip
    first = payload_build_id(engine, "sha256:abc")
    assert payload_build_id(engine, "sha256:abc") == first
    for changed in (dict(buckets=(32, 128)), dict(max_length=128), dict(batch=2), dict(quantization="int8"),
                    dict(weight_dtype="bfloat16"), dict(kv_cache_dtype="bfloat16")):  # fmt: skip
        assert payload_build_id(dataclasses.replace(engine, **changed), "sha256:abc") != first, changed
    assert payload_build_id(engine, "sha256:abd") != first


def test_the_load_hash_is_the_checkpoint_hash(payloads, tiny_checkpoint):
    from model.checkpoint import content_hash

    assert payloads.sweep.checkpoint.content_hash == content_hash(tiny_checkpoint)
    assert payloads.served.checkpoint["content_hash"] == content_hash(tiny_checkpoint)


# ---- no local path is published -------------------------------------------------------------------------------------
def test_no_local_checkpoint_path_in_health_or_manifests(payloads, tiny_checkpoint):
    folder = str(Path(tiny_checkpoint).parent)
    assert "path" not in payloads.served.checkpoint and folder not in json.dumps(payloads.served.checkpoint)
    for m in (payloads.sweep, payloads.profile, payloads.remote):
        ck = m.to_dict()["checkpoint"]
        assert "path" not in ck and folder not in json.dumps(ck)
        assert ck["id"] == Path(tiny_checkpoint).name and ck["source"] is None  # a local folder: no way to re-get it
    assert payloads.sweep.compile_cache.dir is None  # off


def test_checkpoint_names_sources_and_cache_folders(tmp_path):
    snapshot = tmp_path / "hub" / "models--google--gemma-4-E2B-it" / "snapshots" / "0123abcd"
    assert checkpoint_id(snapshot) == "google/gemma-4-E2B-it"
    assert checkpoint_id(tmp_path / "default-bfloat16-seed0-v1") == "default-bfloat16-seed0-v1"
    assert checkpoint_source("builtin:tiny") == "builtin:tiny"
    assert checkpoint_source("google/gemma-4-E2B-it") == "google/gemma-4-E2B-it"
    assert checkpoint_source(str(tmp_path)) is None  # an existing local folder
    root = tmp_path / "cache"
    (root / "xla").mkdir(parents=True)
    assert portable_dir(root / "xla", root) == "<cache>/xla"
    assert local_dir("<cache>/xla", root) == str(root / "xla")
    assert portable_dir(tmp_path / "elsewhere", root) == str(tmp_path / "elsewhere")  # a folder chosen by flag
    assert portable_dir(None, root) is None and local_dir("/abs/x", root) == "/abs/x"


# ---- readers: schema 1 (the archived runs) and schema 2 ------------------------------------------------------------
@pytest.mark.parametrize("folder", ARCHIVED, ids=[p.name for p in ARCHIVED])
def test_archived_schema_1_runs_are_read_validated_and_listed(folder):
    run = open_run(folder)
    m = run.typed_manifest
    assert m.schema_version == 1 and validate_run(folder) == []
    if m.provenance.kind == "measured":
        assert m.checkpoint.content_hash.startswith("a9e448a5") and m.checkpoint.path  # schema 1 kept the path
        assert m.engine.buckets[0] == 32 and m.workload.max_new_tokens in (23, 64)
        assert "decode_bytes" in m.extra
    else:
        assert m.workload.notes["layout"] == "ple4 + int8_lm_head" and m.engine.buckets is None
    (summary,) = [s for s in list_runs(folder.parent) if s.name == folder.name]
    assert summary.ok and summary.build_id == m.build_id


def test_a_manifest_reads_back_as_it_was_written(payloads, tmp_path):
    from bench.runs import create_run

    run = create_run(tmp_path, "typed", "cpu", payloads.sweep, date="2026-12-01")
    again = open_run(run.path).typed_manifest
    assert again.schema_version == SCHEMA_VERSION == 2 and again.status == "running" and again.started_at
    assert (again.build_id, again.checkpoint, again.engine, again.workload) == (
        payloads.sweep.build_id, payloads.sweep.checkpoint, payloads.sweep.engine, payloads.sweep.workload)
    assert again.command == "sweep" and validate_run(run.path) == []
    assert Manifest.from_dict(again.to_dict()) == again


def test_a_schema_2_manifest_needs_a_checkpoint_source_and_a_schema_1_one_a_path(tmp_path):
    run = make_measured_run(tmp_path, "v2")
    m = json.loads((run.path / "manifest.json").read_text())
    del m["checkpoint"]["source"]
    (run.path / "manifest.json").write_text(json.dumps(m))
    assert any("checkpoint.source" in p for p in validate_run(run.path))
    m["schema_version"] = 1
    m["checkpoint"]["path"] = None
    (run.path / "manifest.json").write_text(json.dumps(m))
    assert validate_run(run.path) == []
    with pytest.raises(RunFolderError, match="schema_version 3 is not supported"):
        Manifest.from_dict({**m, "schema_version": 3})


# ---- resuming --------------------------------------------------------------------------------------------------------
def test_resuming_a_run_of_a_local_folder_asks_for_the_checkpoint(tmp_path):
    from bench.sweep.resume import SweepFlags, check_same_build, resume_options
    from model.engine_config import EngineConfig

    def _resumed_flags(run, checkpoint):  # (inputs, max_new_tokens, repeats, checkpoint) a resumed sweep takes
        f = resume_options(run, SweepFlags(checkpoint=checkpoint), EngineConfig())[0]
        return f.inputs, f.max_new_tokens, f.repeats, f.checkpoint

    run = make_measured_run(tmp_path, "local", status="incomplete")
    m = json.loads((run.path / "manifest.json").read_text())
    m["checkpoint"]["source"] = None
    m["engine_config"].update(inputs=[41, 521], max_new_tokens=8, repeats=2)
    (run.path / "manifest.json").write_text(json.dumps(m))
    run = open_run(run.path)
    with pytest.raises(InputError, match="local checkpoint folder .* pass --checkpoint FOLDER"):
        _resumed_flags(run, None)
    assert _resumed_flags(run, "/ckpt") == ("41,521", 8, 2, "/ckpt")
    old = open_run(ARCHIVED[-1])
    with pytest.raises(RunFolderError, match="older harness, schema 1"):
        check_same_build(old, Manifest(build_id="ffffffffffff"))
    check_same_build(old, Manifest(build_id=old.typed_manifest.build_id))  # same id: accepted


def test_the_builder_leaves_per_command_settings_out_of_the_build(monkeypatch):
    from bench.runs import CompileCacheFacts, build_manifest

    engine = EngineConfig(buckets=(32,), max_length=32, batch=1, quantization="none", compute_dtype="float32")
    ck = CheckpointFacts(id="x", content_hash="sha256:1")
    made = [build_manifest(cmd, checkpoint=ck, engine=engine, workload=Workload(inputs=ins, repeats=r), device={},
                           dtype_policy=None, compile_cache=CompileCacheFacts())
            for cmd, ins, r in (("sweep", (41,), 3), ("profile", (521,), None), ("serve", None, None))]  # fmt: skip
    assert len({m.build_id for m in made}) == 1 and made[0].build_id == payload_build_id(engine, "sha256:1")
