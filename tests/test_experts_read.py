"""Bytes that follow the routing (docs/method.md): the experts a measured decode step read, as its router chose
them, and the bytes per step that count them.

On CPU with the tiny-moe preset (8 experts, top 3, 4 layers): the counts the engine records equal the router's
choice computed here independently (numpy, from the same parameters and the residual stream of an uncached full
forward), one sequence and the union across the rows of a batch, either decode loop; the balanced routing gives
min(E, B x top_k) at every step and layer; a cell's figures are the medians, minima and maxima of its steps; the
bytes per step follow the counts (whole counts equal the accounting's, fractional ones interpolate); an
in-process sweep records all of it, says which routing, and a model without experts records nothing new.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.runs import Sample, summarize_cell
from model import moe
from model.accounting import decode_weight_bytes, expert_slice_bytes, routed_decode_weight_bytes
from model.config import PRESETS
from model.engine import Engine
from model.forward import forward_full
from model.params import init_params
from model.policy import decide_policy
from model.quantspec import parse_quant

CFG = PRESETS["tiny-moe"]
PROMPTS = [[2, 17, 33, 5, 9, 41], [2, 8, 3, 1, 77, 12], [2, 90, 91, 4, 6, 7]]  # one length: one position per step
NEW = 6


@pytest.fixture(scope="module")
def params():
    return jax.tree_util.tree_map(jnp.asarray, init_params(CFG, 0))


@pytest.fixture(scope="module")
def engine(params):
    return Engine(params, CFG, decide_policy("float32"), buckets=(16,))


def _router_choice(lp, h_ND: np.ndarray) -> np.ndarray:
    """The router's top_k expert ids [N, K] of residual rows h [N, D] (float32), written out in numpy from
    transformers' Gemma4TextRouter: RMS norm without weight, times scale and D^-1/2, projection, softmax, top k."""
    x = h_ND / np.sqrt(np.mean(h_ND * h_ND, axis=-1, keepdims=True) + CFG.rms_norm_eps)
    x = x * np.asarray(lp.router_scale_D, np.float32) * CFG.hidden_size**-0.5
    logits = x @ np.asarray(lp.router_DE, np.float32)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.argsort(-p, axis=-1, kind="stable")[:, : CFG.top_k_experts]


def _expected_counts(params, monkeypatch, prompts, generated) -> list[list[int]]:
    """Per decode step, per layer: distinct experts over the rows, from an uncached forward of each row's prompt
    and its tokens (step s reads the token generated before it, at position len(prompt) + s - 1)."""
    seen: dict[int, np.ndarray] = {}
    real = moe.expert_block

    def spy(lp, cfg, h_BTD, *, layer):
        seen[layer] = _router_choice(lp, np.asarray(h_BTD, np.float32).reshape(-1, cfg.hidden_size)).reshape(
            *h_BTD.shape[:2], cfg.top_k_experts)  # fmt: skip
        return real(lp, cfg, h_BTD, layer=layer)

    monkeypatch.setattr(moe, "expert_block", spy)
    ids = np.asarray([list(p) + list(g[:-1]) for p, g in zip(prompts, generated)], np.int32)
    forward_full(params, CFG, jnp.asarray(ids))  # eager: the spy sees each layer's residual as numbers
    monkeypatch.setattr(moe, "expert_block", real)
    n = len(prompts[0])
    return [[len(np.unique(seen[layer][:, n + s - 1])) for layer in range(CFG.num_layers)]
            for s in range(1, len(generated[0]))]  # fmt: skip


# ---- the counts the engine records --------------------------------------------------------------------------------
@pytest.mark.parametrize("loop", ["host", "device"])
def test_one_sequence_records_the_routers_choice_at_every_step(engine, params, monkeypatch, loop):
    gen = engine.generate(PROMPTS[0], NEW, decode_loop=loop)
    assert len(gen.experts_read) == NEW - 1 and all(len(step) == CFG.num_layers for step in gen.experts_read)
    assert gen.experts_read == _expected_counts(params, monkeypatch, PROMPTS[:1], [gen.token_ids])
    assert {c for step in gen.experts_read for c in step} == {CFG.top_k_experts}  # one token: its k distinct


@pytest.mark.parametrize("loop", ["host", "device"])
def test_a_batch_records_the_union_of_its_rows_choices(engine, params, monkeypatch, loop):
    gen = engine.generate_batch(PROMPTS, NEW, decode_loop=loop)
    expected = _expected_counts(params, monkeypatch, PROMPTS, gen.token_ids)
    assert gen.experts_read == expected
    counts = {c for step in expected for c in step}
    assert max(counts) > CFG.top_k_experts  # the rows chose differently: a union, not one row's k
    assert all(CFG.top_k_experts <= c <= min(CFG.num_experts, 3 * CFG.top_k_experts) for c in counts)


def test_the_profiled_steps_of_a_model_with_experts_give_the_tokens_of_generate(engine):
    state, step = engine.step_fn(PROMPTS[0], NEW)
    tokens = [int(state[0][0])]
    for _ in range(2):
        state = step(state)
        tokens.append(int(state[0][0]))
    assert tokens == engine.generate(PROMPTS[0], NEW).token_ids[:3]


def test_balanced_routing_reads_min_of_experts_and_b_times_k(params):
    balanced = Engine(params, dataclasses.replace(CFG, expert_routing="balanced"), decide_policy("float32"),
                      buckets=(16,))  # fmt: skip
    for b in (1, 2, 3):
        gen = balanced.generate_batch(PROMPTS[:b], 4)
        want = min(CFG.num_experts, b * CFG.top_k_experts)  # 3, 6, 8: assignment j goes to expert j mod E
        assert gen.experts_read == [[want] * CFG.num_layers] * 3


def test_a_model_without_experts_records_nothing():
    cfg = PRESETS["tiny"]
    plain = Engine(jax.tree_util.tree_map(jnp.asarray, init_params(cfg, 0)), cfg, decide_policy("float32"),
                   buckets=(16,))  # fmt: skip
    assert plain.generate([2, 5, 7], 3).experts_read is None
    assert plain.generate_batch([[2, 5, 7], [2, 9, 4]], 3, decode_loop="device").experts_read is None


# ---- a cell's figures and its bytes -------------------------------------------------------------------------------
def _sample(kind: str, repeat: int, experts_read) -> Sample:
    return Sample(input_tokens=6, kind=kind, repeat=repeat, ttft_ms=10.0, prefill_ms=5.0, decode_ms=40.0, e2e_ms=50.0,
                  gauge_tok_s=100.0, e2e_tok_s=80.0, tpot_ms=10.0, generated_tokens=5, compile_events=0,
                  degenerate=False, degenerate_reason=None, step_ms=[10.0] * 4, token_ids=[3, 4, 5, 6, 7],
                  experts_read=experts_read)  # fmt: skip


def test_a_cells_figures_pool_every_timed_step():
    steps = [[3, 4, 5, 6], [6, 6, 6, 6], [3, 3, 3, 3], [8, 7, 6, 5]]  # sums 18, 24, 12, 26
    warm = _sample("warmup", 0, [[8, 8, 8, 8]] * 4)  # a warm-up is not a measured step
    row = summarize_cell([warm, _sample("timed", 0, steps[:2]), _sample("timed", 1, steps[2:])], max_new_tokens=5)
    assert (row.experts_read_steps, row.experts_read_min, row.experts_read_max) == (4, 12, 26)
    assert row.experts_read_median == 21.0 and row.experts_per_layer_median == 21.0 / 4
    assert row.experts_read_layers_median == [4.5, 5.0, 5.5, 5.5]
    assert (row.experts_read_layers_min, row.experts_read_layers_max) == ([3, 3, 3, 3], [8, 7, 6, 6])
    plain = summarize_cell([_sample("timed", 0, None)], max_new_tokens=5)
    assert plain.experts_read_steps is None and "experts" not in str(plain.to_dict())  # rows without experts: as before


@pytest.mark.parametrize("quant", [None, "w8", "w4"])
def test_bytes_follow_the_count_of_experts(quant):
    spec = parse_quant(quant)
    for n in range(1, CFG.num_experts + 1):  # a whole count: the accounting's own figure
        assert routed_decode_weight_bytes(CFG, 4, experts=n, quant=spec) == decode_weight_bytes(CFG, 4, experts=n,
                                                                                                   quant=spec)
    one = expert_slice_bytes(CFG, 4, quant=spec)
    assert one > 0 and (decode_weight_bytes(CFG, 4, experts=5, quant=spec) - decode_weight_bytes(CFG, 4, experts=4,
                        quant=spec)) == CFG.num_layers * one  # fmt: skip
    half = routed_decode_weight_bytes(CFG, 4, experts=4.5, quant=spec)
    assert half == decode_weight_bytes(CFG, 4, experts=4, quant=spec) + round(CFG.num_layers * one / 2)
    for bad in (0.5, CFG.num_experts + 1, True):
        with pytest.raises(ValueError, match="experts read"):
            routed_decode_weight_bytes(CFG, 4, experts=bad, quant=spec)


def test_the_engines_step_bytes_count_the_measured_experts(engine):
    assumed = engine.decode_bytes(6, NEW, batch=3)
    measured = engine.decode_bytes(6, NEW, batch=3, experts=6.25)
    slice_bytes = expert_slice_bytes(CFG, 4)
    assert measured["kv_cache"] == assumed["kv_cache"]
    assert measured["weights"] - assumed["weights"] == round((6.25 - CFG.top_k_experts) * CFG.num_layers * slice_bytes)
    assert engine.decode_bytes(6, NEW, experts=float(CFG.top_k_experts)) == engine.decode_bytes(6, NEW)


# ---- an in-process sweep ------------------------------------------------------------------------------------------
def _rates():
    from bench.runs.ceiling import roofline_ceiling
    from bench.sweep.rates import DeviceRates

    ceiling = roofline_ceiling(10e9, "xla read", "cpu", copy_bytes_s=9e9)
    return DeviceRates(bandwidth_bytes_s=9e9, matmul_flop_s=1e11, measured={}, ceiling=ceiling,
                       read_bandwidth_bytes_s=10e9)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("routing", ["router", "balanced"])
def test_a_sweep_records_the_experts_read_and_its_bytes_follow_them(routing, monkeypatch, tmp_path):
    from runfolders import manifest

    from bench.runs import create_run, validate_run
    from bench.sweep.local import SweepConfig, run_sweep
    from model.engine import load_engine
    from model.random_weights import ROUTING_ENV

    monkeypatch.setenv("GEMMA4_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(ROUTING_ENV, routing)
    eng, _report = load_engine("random:tiny-moe", policy=decide_policy("float32"), max_length=64, log_policy=False)
    config = SweepConfig(inputs=(20,), max_new_tokens=5, repeats=1, batches=(1, 3))
    run = create_run(tmp_path, "moe", "cpu", manifest(), date="2026-12-07")
    rows = run_sweep(eng, config, run, rates=_rates())
    run.finish("complete")
    assert validate_run(run.path) == []
    for row in rows:
        timed = [s for s in run.samples() if s.kind == "timed" and (s.batch or 1) == row.batch]
        steps = [step for s in timed for step in s.experts_read]
        assert row.experts_read_steps == len(steps) == 4 and row.expert_routing == routing
        assert row.experts_read_median == float(np.median([sum(s) for s in steps]))
        assert row.bytes_per_step == eng.decode_bytes(20, 5, batch=row.batch, experts=row.experts_per_layer_median)["total"]
        if routing == "balanced":
            assert row.experts_per_layer_median == min(CFG.num_experts, row.batch * CFG.top_k_experts)
    assert rows[0].experts_per_layer_median == CFG.top_k_experts  # one row: its k experts
    assert "experts_per_layer_median" in (run.path / "cells.csv").read_text().splitlines()[0]


# ---- the report and the tables ----------------------------------------------------------------------------------------
def _moe_run(runs_dir, label: str, routing: str, batches=(1, 3)):
    """A synthetic measured `--batch` run of a model with experts: its samples' steps read k experts per layer at
    B = 1 and min(E, B k) at B > 1 (the balanced routing's counts), 4 layers."""
    from runfolders import MAX_NEW, cell_samples, manifest

    from bench.runs import create_run

    m = manifest(checkpoint_id=f"random-tiny-moe-float32-seed0{'-balanced' if routing == 'balanced' else ''}")
    m["workload"] = {"inputs": [41], "max_new_tokens": MAX_NEW, "repeats": 3, "notes": {"batches": list(batches)}}
    run = create_run(runs_dir, label, "cpu", m, date="2026-12-07")
    for b in batches:
        steps = [[min(CFG.num_experts, b * CFG.top_k_experts)] * 4] * (MAX_NEW - 1)
        samples = [dataclasses.replace(s, batch=b if b > 1 else None, experts_read=steps,
                                       row_token_ids=[s.token_ids] * b if b > 1 else None)
                   for s in cell_samples(41, gauge=20.0)]  # fmt: skip
        run.append_samples(samples)
        row = summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64, input_tokens=41, batch=b)
        run.append_cell(dataclasses.replace(row, expert_routing=routing, bytes_per_step=1000 * b, roofline_share_pct=1.0))
    run.finish("complete")
    return run


def test_the_report_shows_the_experts_read_and_says_when_routing_was_balanced(tmp_path):
    from bench.report import build_report
    from bench.runs.columns import EXPERTS_PER_LAYER, table_columns

    runs = tmp_path / "runs"
    run = _moe_run(runs, "moe", "balanced")
    report = build_report(None, tmp_path / "out", runs_dir=runs)
    md = report.markdown.read_text()
    assert "experts/layer" in md and "3.0 (balanced routing)" in md  # the rooflines table, B = 1
    assert "experts/layer: 41x1 3.0 (balanced routing), 41x3 8.0 (balanced routing)" in md  # the batch table's note
    assert "balanced routing: dummy weights" in md
    sweep_csv = (tmp_path / "out" / "sweep.csv").read_text().splitlines()[0]
    assert "-moe-cpu:experts_per_layer_median" in sweep_csv and "-moe-cpu:expert_routing" in sweep_csv
    assert "experts_per_layer_median" in (tmp_path / "out" / "batches.csv").read_text().splitlines()[0]
    assert "experts_per_layer_median" in (tmp_path / "out" / "rows.csv").read_text().splitlines()[0]
    rows = run.cells()
    assert EXPERTS_PER_LAYER in table_columns(rows) and EXPERTS_PER_LAYER.text(rows[1]) == "8.0 (balanced routing)"
    router = _moe_run(tmp_path / "other", "router", "router")
    assert EXPERTS_PER_LAYER.text(router.cells()[0]) == "3.0"  # the model's router: the figure alone


def test_runs_without_experts_print_no_expert_columns(tmp_path):
    from runfolders import make_measured_run

    from bench.report import build_report

    make_measured_run(tmp_path / "runs", "plain")
    report = build_report(None, tmp_path / "out", runs_dir=tmp_path / "runs")
    assert "experts" not in report.markdown.read_text()
    assert "experts" not in (tmp_path / "out" / "sweep.csv").read_text()


# ---- the preset names: one table ------------------------------------------------------------------------------------
def test_every_help_that_names_the_presets_lists_the_one_preset_table():
    from bench.cli.common import CHECKPOINT_HELP, PRESET_NAMES
    from bench.cli.kernel_cmds import kernels_fit
    from bench.cli.model_cmds import checkpoint_create, checkpoint_inspect

    assert PRESET_NAMES == ", ".join(PRESETS) and "26b-a4b" in PRESET_NAMES and "tiny-moe" in PRESET_NAMES
    options = (inspect.signature(fn).parameters["preset"].default for fn in (checkpoint_create, checkpoint_inspect,
                                                                             kernels_fit))  # fmt: skip
    helps = [CHECKPOINT_HELP, *(option.help for option in options)]
    assert all(PRESET_NAMES in text for text in helps), helps
