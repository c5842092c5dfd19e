"""`--quant` as an axis of every run: the flag on sweep, profile, generate and serve (bad values one line, exit 2;
refused with `sweep --target`), a dense and a w8 tiny sweep of one build (bytes per step, build ids, the manifest),
`bench compare` naming the quantization as the single variable, and the report's side-by-side view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, bench_captured, bench_in_process, run_cli_here

from bench.report import build_report
from bench.report.compare import compare_runs
from bench.runs import open_run
from model.engine import load_engine
from model.quantspec import parse_quant


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {"GEMMA4_BENCH_CACHE": str(tmp_path_factory.mktemp("cache")), "JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("args,needles", [
    (["sweep", "-c", "builtin:tiny", "--inputs", "20", "--quant", "w9"], ["--quant w9", "unknown option 'w9'"]),
    (["sweep", "--target", "http://127.0.0.1:9/v1", "--inputs", "20", "--quant", "w8"], ["--quant w8", "--target"]),
    (["profile", "-c", "builtin:tiny", "--quant", "w8,w4"], ["w8 and w4"]),
    (["generate", "-p", "hi", "-c", "builtin:tiny", "--quant", "ple8,ple4"], ["ple8 and ple4"]),
    (["generate", "-p", "hi", "-c", "builtin:tiny", "--quant", "w8", "--scale-dtype", "int8"], ["--scale-dtype int8"]),
    (["serve", "-c", "builtin:tiny", "--port", "1", "--quant", "w4:0"], ["w4:0", "group size"]),
])  # fmt: skip
def test_a_bad_quant_is_one_line_on_every_command(args, needles, env, tmp_path):
    proc = run_cli_here([*args, *(["--runs-dir", str(tmp_path)] if args[0] in ("sweep", "profile") else [])], env=env)
    assert_one_line_error(proc, *needles)
    assert not any(tmp_path.iterdir())  # nothing was created or measured


def test_generate_json_prints_the_quant_and_its_weight_bytes(tiny_checkpoint, capsys):
    args = ["generate", "-p", "hi", "-c", str(tiny_checkpoint), "-n", "3", "--json", "--compile-cache", "off"]
    dense = json.loads(bench_captured(args, capsys)[1])
    code, out, _ = bench_captured([*args, "--quant", "w8,int8_lm_head"], capsys)
    quant = json.loads(out)
    assert code == 0 and quant["quant"] == "int8_lm_head,w8" and quant["scale_dtype"] == "bfloat16"
    assert dense["quant"] == "none" and dense["scale_dtype"] is None
    engine, _ = load_engine(tiny_checkpoint, quant=parse_quant("w8,int8_lm_head"))
    assert quant["weight_bytes"] == engine.weight_bytes and len(quant["generated_ids"]) == 3
    assert dense["weight_bytes"] == load_engine(tiny_checkpoint)[0].weight_bytes != quant["weight_bytes"]


# ---- a dense and a w8 sweep of one build ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweeps(tiny_checkpoint, tmp_path_factory):
    """Two tiny sweeps of one build, dense and `--quant w8`, into one runs folder: {quant: run folder}."""
    runs = tmp_path_factory.mktemp("quant-runs")
    out = {}
    for label, extra in (("dense", []), ("w8", ["--quant", "w8"])):
        code = bench_in_process(["sweep", "--inputs", "20", "--max-new-tokens", "4", "--repeats", "1", "--decode-loop",
                                 "host", "--checkpoint", str(tiny_checkpoint), "--runs-dir", str(runs), "--name",
                                 label, "--compile-cache", "off", *extra])  # fmt: skip
        assert code == 0
        (out[label],) = [p for p in runs.iterdir() if f"-{label}-" in p.name]
    return runs, out


def test_a_w8_sweep_reads_fewer_bytes_per_step_and_is_another_build(sweeps, tiny_checkpoint):
    _, folders = sweeps
    dense, w8 = (open_run(folders[k]) for k in ("dense", "w8"))
    (cd,), (cq,) = dense.cells(), w8.cells()
    assert cq.bytes_per_step < cd.bytes_per_step
    engine, _ = load_engine(tiny_checkpoint, quant=parse_quant("w8"))
    assert cq.bytes_per_step == engine.decode_bytes(20, 4)["total"]  # the engine's quant-aware accounting
    md, mq = dense.typed_manifest, w8.typed_manifest
    assert (md.engine.quantization, md.engine.scale_dtype) == ("none", None)
    assert (mq.engine.quantization, mq.engine.scale_dtype) == ("w8", "bfloat16")
    assert mq.checkpoint.weight_bytes == engine.weight_bytes < md.checkpoint.weight_bytes
    assert mq.build_id != md.build_id  # never one build id for a w8 run and a dense run
    assert mq.dense_build_id == md.build_id == md.dense_build_id  # the same payload but for the quantization


def test_compare_names_the_quantization_as_the_single_variable(sweeps):
    _, folders = sweeps
    result = compare_runs(folders["dense"], folders["w8"], max_slowdown_pct=1000)
    assert result.single_variable is True and result.variable == "quantization none vs w8"
    fields = {d.field for d in result.differences if d.single_variable_key}
    assert "configuration.quantization" in fields and "build id" in fields


def test_compare_cli_prints_the_variable(sweeps, capsys):
    _, folders = sweeps
    code, out, _ = bench_captured(["compare", str(folders["dense"]), str(folders["w8"]), "--max-slowdown", "1000%"],
                                  capsys)  # fmt: skip
    assert code == 0 and "comparison: single-variable (quantization none vs w8)" in out


def test_the_report_shows_the_options_side_by_side(sweeps, tmp_path):
    runs, folders = sweeps
    report = build_report([folders["dense"], folders["w8"]], tmp_path / "report", runs_dir=runs)
    md = report.markdown.read_text()
    assert "## Quantization by session" in md and "### Quantization on CPU" in md
    (table,) = [t for t in report.tables if t.kind == "quant-session"]  # one session: one build, minutes apart
    rows = {r[0]: r for r in table.rows}
    assert list(rows) == ["none", "w8"]
    (dense_cell,), (w8_cell,) = open_run(folders["dense"]).cells(), open_run(folders["w8"]).cells()
    assert rows["none"][2] == f"{dense_cell.bytes_per_step:,}" and rows["w8"][2] == f"{w8_cell.bytes_per_step:,}"
    assert rows["none"][4] == "1.00x" and rows["w8"][4] == f"{w8_cell.gauge_tok_s_median / dense_cell.gauge_tok_s_median:.2f}x"
    assert rows["w8"][6].startswith(("none (4 of 4)", "step ")) and float(rows["w8"][7]) > 0  # logits recorded
    assert "steps (bound 0.038" in rows["w8"][8]  # both runs' per-step summaries recorded and compared
    env = (tmp_path / "report" / "environment.csv").read_text()
    assert "quantization,none,w8" in env.replace(" ", "")


def test_a_resumed_sweep_takes_the_runs_quantization_and_refuses_another():
    from types import SimpleNamespace

    from bench.errors import InputError
    from bench.runs import CheckpointFacts, EngineConfig, Manifest
    from bench.sweep.resume import SweepFlags, resume_options
    from model.engine_config import EngineConfig as Options

    def _resumed_quant(facts, quant, scale_dtype):  # (quantization, scale dtype) a resumed sweep runs with
        m = Manifest(engine=facts, checkpoint=CheckpointFacts(id="c", source="builtin:tiny"))
        run = SimpleNamespace(path=Path("runs/x"), typed_manifest=m)
        got = resume_options(run, SweepFlags(), Options.from_options(quant=quant, scale_dtype=scale_dtype))[1]
        return got.quant_spec.canonical, got.scale_dtype

    run = EngineConfig(quantization="int8_lm_head,ple4", scale_dtype="float16")
    assert _resumed_quant(run, None, None) == ("int8_lm_head,ple4", "float16")
    assert _resumed_quant(run, "ple4,int8_lm_head", None) == ("int8_lm_head,ple4", "float16")  # canonical
    with pytest.raises(InputError, match="--quant w8 differs from the resumed run's int8_lm_head,ple4"):
        _resumed_quant(run, "w8", None)
    with pytest.raises(InputError, match="--scale-dtype bfloat16 differs"):
        _resumed_quant(run, None, "bfloat16")
    assert _resumed_quant(EngineConfig(), None, None) == ("none", None)  # a run from before --quant is dense


def test_a_profile_joined_to_a_run_refuses_other_weights():
    from bench.profile.command import refuse_other_quant as _refuse_other_quant
    from bench.errors import InputError
    from bench.runs import EngineConfig

    ran = EngineConfig(quantization="int8_lm_head,ple4", scale_dtype="bfloat16")
    _refuse_other_quant(ran, "ple4,int8_lm_head", None)  # the same set, another order: fine
    with pytest.raises(InputError, match="--quant w8: the run was swept with quantization int8_lm_head,ple4"):
        _refuse_other_quant(ran, "w8", None)
    with pytest.raises(InputError, match="--scale-dtype float32: the run was swept with bfloat16 scales"):
        _refuse_other_quant(ran, "int8_lm_head,ple4", "float32")
    with pytest.raises(InputError, match="--quant w8: the run was swept with quantization none"):
        _refuse_other_quant(EngineConfig(), "w8", None)  # a run from before --quant is dense


def test_profile_run_with_another_quant_is_one_line_before_loading(sweeps, env):
    _, folders = sweeps
    proc = run_cli_here(["profile", "--run", str(folders["w8"]), "--quant", "none", "--steps", "2"], env=env)
    assert_one_line_error(proc, "--quant none", "swept with quantization w8")
    assert not (folders["w8"] / "profile.json").exists()
