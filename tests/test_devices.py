"""Where a model fits and what a mesh predicts (`bench checkpoint inspect`, issue 45 part 5 and issue 46 part 4):
the device table, the per-device bytes of tp and ep against hand counts on a small config, the refusals (one line,
exit 2), and the sweep refused before loading when its largest cell does not fit."""

from __future__ import annotations

import json
import types

import pytest
from conftest import FIXTURES, assert_one_line_error, bench_captured
from test_family_accounting import SMALL

from bench.runs.devices import DEVICES, device_named, fit_on, predict
from bench.sweep.fit import check_sweep_fits, sweep_memory
from model.accounting import kv_cache_bytes, weight_bytes, weight_bytes_by_component
from model.config import E2B, G26B_A4B, G31B, TINY
from model.errors import EngineError
from model.placement import ONE_DEVICE, check_mesh, device_share, parse_mesh
from model.quantspec import NO_QUANT, parse_quant


def test_every_device_has_its_figures_and_sources():
    assert len({d.name for d in DEVICES}) == len(DEVICES)
    for d in DEVICES:
        assert d.bandwidth > 0 and d.memory_bytes > 0 and d.link.bytes_per_s > 0
        assert "datasheet" in d.memory_source or "documentation" in d.memory_source
        assert d.link.source and d.datasheet.source
    assert device_named("TPU-V5E").memory_bytes == 16 * 10**9 and device_named("tpu-v5e").bandwidth == 819e9
    assert device_named("tpu-v5e").capacity == 16_909_336_064  # the bytes_limit a run here recorded
    assert device_named("h100").capacity == 80 * 10**9  # none ran here: the datasheet, decimal units
    assert device_named("h100").link.bytes_per_s == 450e9 and device_named("nope") is None


def test_fit_arithmetic_by_hand():
    # SMALL in bfloat16: 3178 parameters x 2 bytes; KV of 4 positions: (sliding 4 x 2 x 1 x 4 + full 4 x 2 x 1 x 8) x 2
    assert weight_bytes(SMALL, 2) == 6356 and kv_cache_bytes(SMALL, 4, 2) == 192
    mem = fit_on(device_named("t4"), weight_bytes=6356, kv_bytes_per_row=192, batch=3, context=4)
    assert mem.needed == 6356 + 3 * 192 and mem.usable == 14_495_514_624 and mem.fits  # floor(0.9 x 16,106,127,360)
    big = fit_on(device_named("a100-40gb"), weight_bytes=35_500_000_000, kv_bytes_per_row=100_000_000, batch=6,
                 context=4)  # fmt: skip
    assert not big.fits and big.largest_batch == 5  # (36e9 - 35.5e9) // 1e8


def test_one_device_share_is_the_accounting():
    for cfg in (E2B, G31B, G26B_A4B, SMALL):
        for quant in (NO_QUANT, parse_quant("w4,int8_lm_head"), parse_quant("w8")):
            share = device_share(cfg, ONE_DEVICE, itemsize=2, context=64, quant=quant)
            wb = weight_bytes_by_component(cfg, 2, quant=quant)
            assert (share.weight_bytes, share.decode_weight_bytes) == (wb.bytes, wb.decode_bytes)
            assert share.kv_bytes_per_row == kv_cache_bytes(cfg, 64, 2) and share.collectives == ()


def test_tensor_parallel_by_hand():
    share = device_share(SMALL, parse_mesh("tp=2"), itemsize=2, context=4)
    # per device (scalars): layer 0: qkv [8, 1 x 4 + 2 x 1 x 4] 96, o [8, 4] 32, gate_up [8, 16] 128, down [8, 8] 64,
    # experts [4, 8, 6] 192 + [4, 8, 3] 96, replicated norms/scalar 41 and router block 68 = 717; layer 1 (K = V, head
    # 8): qkv [8, 8 + 8] 128, o 64, MLP 192, experts 288, replicated 49 + 68 = 789; embedding [32, 8] 256, norm 8
    assert share.weight_bytes == 2 * (717 + 789 + 256 + 8)
    assert share.replicated_bytes == 2 * (41 + 68 + 49 + 68 + 8)
    # a step: all but the table (one row, 8) and half the experts (2 of 4: 144 per layer), plus the head's 32 rows
    assert share.decode_weight_bytes == 2 * (1770 - 256 + 8 + 256 - 2 * 144)
    assert share.kv_bytes_per_row == 192  # one KV head: each device holds it (tp 2 a multiple of 1)
    # 2 layers x (attention, MLP, experts) + the input row: 7 all-reduces of [1, 8] bf16, 16 bytes, 16 sent each;
    # the greedy argmax: 2 all-gathers of [1, 2] 4-byte values, 8 bytes, 4 sent each
    assert [c.count for c in share.collectives] == [2, 2, 2, 1, 2]
    assert share.collective_bytes == 7 * 16 + 2 * 4
    guess = predict(device_named("tpu-v5e"), share)
    assert guess.memory_s == (2980 + 192) / 819e9 and guess.link_s == 120 / 200e9
    assert guess.tok_s == 1 / (guess.memory_s + guess.link_s)


def test_tensor_parallel_bytes_equal_the_placed_engine():
    """The tiny preset in float32, a step's weight bytes per device as the mesh branch measured them from the leaves
    it placed on forced host devices (docs/engine.md, "Several devices": 1,356,792 B on one device, 717,816 at
    tp = 2, 398,328 at tp = 4)."""
    got = [device_share(TINY, parse_mesh(m), itemsize=4, context=16).decode_weight_bytes
           for m in ("tp=1", "tp=2", "tp=4")]  # fmt: skip
    assert got == [1_356_792, 717_816, 398_328]


def test_expert_parallel_by_hand():
    share = device_share(SMALL, parse_mesh("ep=2"), itemsize=2, context=4, batch=2)
    # 2 of the 4 experts per device (288 of 576 scalars per layer, 2 layers); everything else whole
    assert share.weight_bytes == 2 * (3178 - 1152 + 2 * 288)
    assert share.experts_read == 1  # ceil(2 routed / 2 devices), balanced
    whole = weight_bytes_by_component(SMALL, 2).decode_bytes  # reads 2 experts per layer
    assert share.decode_weight_bytes == whole - 2 * 2 * 144  # 1 expert of 144 scalars per layer fewer, 2 bytes
    assert share.step_read_bytes == share.decode_weight_bytes + 2 * 192
    (ar,) = share.collectives  # one all-reduce of [2, 8] per layer, float32 (the engine's combine), not bf16
    assert (ar.count, ar.payload, ar.sent) == (2, 64, 64)
    # worst case: both routed experts on one device (min(2, 4 / 2) = 2): it reads what one device reads
    assert (share.experts_worst, share.expert_slice_bytes) == (2, 144 * 2)
    assert share.worst_decode_weight_bytes == whole


@pytest.mark.parametrize("cfg,mesh,needle", [
    (SMALL, "tp=3", "3 does not divide the model's query heads (2); expected tp in 1, 2"),
    (SMALL, "ep=3", "does not divide the model's 4 experts; expected ep in 1, 2, 4"),
    (E2B, "ep=2", "no experts"),
    (G31B, "tp=64", "does not divide the model's query heads (32)"),
    (G31B, "tp=3", "expected tp in 1, 2, 4, 8, 16, 32"),
])  # fmt: skip
def test_a_mesh_that_does_not_divide_is_refused(cfg, mesh, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_mesh(cfg, parse_mesh(mesh))


def _inspect(args, capsys):
    code, out, err = bench_captured(["checkpoint", "inspect", *args], capsys)
    return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)


def test_the_31b_prediction_on_four_v5e(capsys):
    r = _inspect(["--preset", "31b", "--quant", "w4", "--mesh", "tp=4", "--device", "tpu-v5e"], capsys)
    assert r.returncode == 0, r.stderr
    assert "predicted step" in r.stdout and "60 all-reduce of attention output" in r.stdout
    r = _inspect(["--preset", "31b", "--quant", "w4", "--mesh", "tp=4", "--device", "tpu-v5e", "--json"], capsys)
    data = json.loads(r.stdout)
    share = device_share(G31B, parse_mesh("tp=4"), itemsize=2, context=8192, quant=parse_quant("w4"))
    assert data["per_device"]["weight_bytes"] == share.weight_bytes and data["mesh"] == "tp=4"
    (fit,) = data["fit"]
    assert fit["fits"] and fit["prediction"]["tok_s"] == predict(device_named("tpu-v5e"), share).tok_s


def test_the_26b_a4b_expert_parallel_prediction_states_its_routing(capsys):
    r = _inspect(["--preset", "26b-a4b", "--quant", "w4", "--mesh", "ep=4", "--device", "tpu-v5e"], capsys)
    assert r.returncode == 0, r.stderr
    on_tpu = dict(itemsize=2, context=8192, quant=parse_quant("w4"), layout="tpu")  # a TPU's w4 experts, padded
    share = device_share(G26B_A4B, parse_mesh("ep=4"), **on_tpu)
    one = device_share(G26B_A4B, ONE_DEVICE, **on_tpu)
    # balanced: 2 of the 8 routed experts per device; worst case all 8 on one device: one device's weight reads
    assert (share.experts_read, share.experts_worst) == (2, 8)
    assert share.worst_decode_weight_bytes == one.decode_weight_bytes
    assert share.decode_weight_bytes == one.decode_weight_bytes - 6 * 30 * share.expert_slice_bytes
    assert "balanced routing, ceil(top_k / ep)" in r.stdout and f"{one.decode_weight_bytes:,} bytes" in r.stdout
    assert "30 all-reduce of experts' output [B, D] (float32)" in r.stdout


def test_a_run_s_measured_read_rate_replaces_the_datasheet(capsys):
    run = "runs/2026-12-07-tpu-e2b-w4-tpuv5e"  # archived: read 749,641,730,115 bytes/s (the Pallas stream probe)
    r = _inspect(["--preset", "31b", "--quant", "w4", "--mesh", "tp=4", "--device", "tpu-v5e", "--read-rate", run,
                  "--json"], capsys)  # fmt: skip
    (fit,) = json.loads(r.stdout)["fit"]
    assert fit["prediction"]["read_rate"] == 749641730115.0594 and "measured" in fit["prediction"]["read_source"]
    share = device_share(G31B, parse_mesh("tp=4"), itemsize=2, context=8192, quant=parse_quant("w4"))
    assert fit["prediction"]["memory_s"] == share.step_read_bytes / 749641730115.0594


def test_one_chip_answers_for_each_shape(capsys):
    r = _inspect(["--preset", "31b", "--quant", "w4", "--json"], capsys)
    fits = {f["device"]: f["fits"] for f in json.loads(r.stdout)["fit"]}
    assert not fits["tpu-v5e"] and fits["h100"]  # 17.9 GB of w4 weights: not one 16 GB chip
    r = _inspect(["--preset", "e2b", "--json"], capsys)
    data = json.loads(r.stdout)
    assert data["total"]["bytes"] == 9_257_138_758 and data["context"] == 8192 and data["mesh"] == "tp=1"


@pytest.mark.parametrize("args,needles", [
    (["--preset", "31b", "--mesh", "tp=3"], ["--mesh tp=3", "query heads (32)", "expected tp in"]),
    (["--preset", "e2b", "--mesh", "ep=2"], ["--mesh ep=2", "no experts"]),
    (["--preset", "31b", "--mesh", "pp=2"], ["--mesh pp=2", "tp=N or ep=N"]),
    (["--preset", "31b", "--device", "tpu-v9"], ["--device tpu-v9", "tpu-v5e"]),
    (["--preset", "26b-a4b", "--experts", "129"], ["--experts", "1..128"]),
    (["--preset", "e2b", "--context", "0"], ["--context 0", "1..131072"]),
    (["--preset", "e2b", "--batch", "0"], ["--batch 0"]),
    (["--preset", "31b", "--read-rate", "700"], ["--read-rate 700", "--device"]),
    (["--preset", "31b", "--device", "h100", "--read-rate", "0"], ["--read-rate 0", "GB/s > 0"]),
    (["--preset", "31b", "--device", "h100", "--read-rate", "no-such-run"], ["--read-rate no-such-run", "not found"]),
    (["--preset", "31b", "--device", "h100", "--read-rate", "runs/2026-12-07-tpu-e2b-w4-tpuv5e"],
     ["measured on TPU v5 lite", "not a NVIDIA H100"]),
])  # fmt: skip
def test_bad_plan_flags_are_one_line_and_exit_2(args, needles, capsys):
    assert_one_line_error(_inspect(args, capsys), *needles)


def test_a_sweep_that_does_not_fit_is_refused_before_loading():
    cells = [(41, 1), (41, 8)]
    mem, n = sweep_memory(SMALL, cells, 8, weight_itemsize=4, kv_itemsize=4, scale_itemsize=2, quant=NO_QUANT,
                          capacity=10_000, where="test")  # fmt: skip
    # batch 8 of (bucket 64 + 8) positions: KV per row = (sliding 4 x 2 x 4 + full 72 x 2 x 8) x 4 bytes
    assert (n, mem.batch, mem.cache_len) == (41, 8, 72) and mem.kv_bytes_per_row == (32 + 1152) * 4
    assert mem.needed == 4 * 3178 + 8 * 4736 and not mem.fits
    with pytest.raises(EngineError, match=r"largest cell \(41 input tokens, batch 8.*does not fit.*at most 4 rows fit"):
        # usable 36,000: (36,000 - 12,712) // 4,736 = 4 rows
        check_sweep_fits(SMALL, cells, 8, dtype="float32", capacity=(40_000, "of test memory"))
    with pytest.raises(EngineError, match="not even one row fits"):
        check_sweep_fits(SMALL, cells, 8, dtype="float32", capacity=(10_000, "of test memory"))
    assert check_sweep_fits(SMALL, [(41, 1)], 8, dtype="float32", capacity=(10**9, "of test memory")).fits
    assert check_sweep_fits(None, cells, 8) is None  # a repo id: the engine checks after loading


def test_on_a_tpu_the_sweep_and_the_inspector_count_the_experts_padding(capsys):
    """26B-A4B `w4,int8_lm_head` on the v5e: 14.873 GB of weights in the natural layout fit beside 41 tokens' cache,
    15.222 GB as the TPU kernel places them (the experts' down K 704 padded to 768, the MLP's 2112 to 2176) do not
    fit at all; both checks say so."""
    v5e = (device_named("tpu-v5e").capacity, "of tpu memory (bytes_limit)")
    kw = dict(capacity=v5e, quant="w4,int8_lm_head", dtype="bfloat16")
    assert check_sweep_fits(G26B_A4B, [(41, 1)], 64, platform="cpu", **kw).fits
    assert check_sweep_fits(G26B_A4B, [(41, 1)], 64, platform="tpu", kernel="xla", **kw).fits  # natural layout
    with pytest.raises(EngineError, match=r"w4 projections in the TPU kernel's layout\) needs 15\.222 GB weights .*"
                                          r"not even one row fits"):
        check_sweep_fits(G26B_A4B, [(41, 1)], 64, platform="tpu", **kw)
    r = _inspect(["--preset", "26b-a4b", "--quant", "w4,int8_lm_head", "--device", "tpu-v5e", "--json"], capsys)
    data = json.loads(r.stdout)
    (fit,) = data["fit"]
    assert data["layout"] == fit["layout"] == "tpu" and data["total"]["bytes"] == fit["weight_bytes"] == 15_222_044_732
    assert not fit["fits"] and fit["largest_batch"] == 0
    r = _inspect(["--preset", "26b-a4b", "--quant", "w4", "--json"], capsys)
    fits = {f["device"]: f for f in json.loads(r.stdout)["fit"]}
    assert fits["tpu-v5e"]["weight_bytes"] - fits["h100"]["weight_bytes"] == 346_030_080 + 2_703_360
    r = _inspect(["--preset", "26b-a4b", "--quant", "w4"], capsys)
    assert "weight bytes as placed on tpu-v5e, tpu-v6e, tpu-v5p: 14,483,322,940 (+348,733,440" in r.stdout


@pytest.mark.parametrize("run,quant", [("2026-12-07-tpu-e2b-dense-tpuv5e", "none"),
                                       ("2026-12-07-tpu-e2b-w4-tpuv5e", "w4")])  # fmt: skip
def test_one_device_bytes_equal_the_archived_tpu_runs(run, quant):
    """The prediction's bytes on one device against what the TPU v5e runs recorded per step (E2B, 41 tokens: a
    bucket of 64 + 64 new tokens = 128 positions, bfloat16)."""
    cells = (FIXTURES.parent.parent / "runs" / run / "cells.jsonl").read_text().splitlines()
    (cell,) = [json.loads(line) for line in cells]
    share = device_share(E2B, ONE_DEVICE, itemsize=2, context=128, quant=parse_quant(quant))
    assert share.step_read_bytes == cell["bytes_per_step"]
