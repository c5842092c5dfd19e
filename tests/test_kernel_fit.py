"""The fit check of the W4A16 kernel (model/kernels/fit.py) and `bench kernels fit`: the bytes per tiling, the limit
per compute capability, the tiles chosen (always within the limit), the refusal where nothing fits, the published
refusal, and the engine's plan."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from model.config import PRESETS
from model.errors import KernelError
from model.kernels import fit
from runfolders import REPO

E2B = fit.projections(PRESETS["e2b"], 128)


def test_the_need_formula_term_by_term() -> None:
    t = fit.Tiling(bm=16, bn=128, bk=256, stages=3)
    n = fit.need(t, group=128, act_bytes=2, scale_bytes=2)
    assert [b for _, b in n.terms] == [3 * 16 * 256 * 2, 3 * 256 * 128 // 2, 3 * 2 * 128 * 2, 256 * 128 * 2,
                                       16 * 128 * 4, 16 * 128 * 4]  # fmt: skip
    assert n.total == 24_576 + 49_152 + 1_536 + 65_536 + 8_192 + 8_192 == 157_184
    assert n.dominant == ("dequantized tile (256x128 x 2 B)", 65_536)


@pytest.mark.parametrize("cc,kib", [("7.5", 64), ("8.0", 163), ("8.7", 163), ("8.6", 99), ("8.9", 99), ("12.0", 99),
                                    ("9.0", 227), ("10.0", 227), ("9", 227)])  # fmt: skip
def test_limits_by_compute_capability(cc: str, kib: int) -> None:
    assert fit.limit_for(cc) == kib * 1024
    assert fit.limit_for("tpu") == 16 * 2**20 and fit.limit_for("6.1") is None


def test_e2b_projections() -> None:
    shapes = {(p.field, p.k, p.n, p.axis) for p in E2B}
    assert {p.k for p in E2B} == {256, 1536, 2048, 4096, 6144, 12288}
    assert ("down_DF", 12288, 1536, 1) in shapes and ("gate_up_DX", 1536, 24576, 0) in shapes
    assert sum(p.layers for p in E2B if p.field == "qkv_DX") == 35


@pytest.mark.parametrize("cc,tile", [("7.5", "bm16 bn64 bk128 stages4"), ("8.9", "bm16 bn128 bk128 stages4"),
                                     ("8.0", "bm16 bn256 bk128 stages3"), ("9.0", "bm16 bn256 bk128 stages4")])  # fmt: skip
def test_the_chosen_tiles_fit_and_are_the_largest(cc: str, tile: str) -> None:
    limit = fit.limit_for(cc)
    for f in fit.plan(E2B, limit):
        assert f.fits and f.need.total <= limit and f.tiling.text.startswith(tile), (cc, f.projection.label)
        bigger = [t for t in fit.candidates(f.projection)
                  if (t.stages >= 2, t.bn * t.bk, t.stages, t.bn) > (f.tiling.stages >= 2, f.tiling.bn * f.tiling.bk,
                                                                     f.tiling.stages, f.tiling.bn)]  # fmt: skip
        assert all(fit.need(t, group=128).total > limit for t in bigger)
        p = f.projection
        assert p.k % (f.tiling.bk * f.tiling.splits) == 0 and p.n % f.tiling.bn == 0


def test_splits_fill_the_grid() -> None:
    f = fit.choose(next(p for p in E2B if p.field == "o_DX" and p.k == 2048), fit.limit_for("9.0"))
    assert f.tiling.splits == 16 and (1536 // f.tiling.bn) * f.tiling.splits >= 96


def test_nothing_fits_a_tiny_limit_and_the_refusal_has_the_arithmetic() -> None:
    p = E2B[0]
    f = fit.choose(p, 16 * 1024)
    assert not f.fits and f.problem == "over the limit" and f.need.total > 16 * 1024
    line = fit.refusal(f, "a 16 KiB device")
    assert "\n" not in line and f"{f.need.total:,} B" in line and "16,384 B" in line
    assert "largest term is the dequantized tile" in line and "no tiling of this kernel fits" in line


def test_the_published_tiles_are_refused_on_turing_and_ada() -> None:
    """The reconstructed TPU-sized tiles (bk = K, bn 128, bm 8, 2 stages) need 638 KiB (K = 1536) to 5,048 KiB
    (K = 12288) at E2B's shapes: over 64 KiB (7.5) and 99 KiB (8.9) at every projection."""
    needs = {p.k: fit.need(fit.published_tiling(p), group=p.group).total for p in E2B}
    assert needs[1536] == 653_312 and needs[2048] == 868_352 and needs[12288] == 5_169_152
    for cc in ("7.5", "8.9"):
        limit = fit.limit_for(cc)
        fits = [fit.choose(p, limit, tiling=fit.published_tiling(p)) for p in E2B]
        assert not any(f.fits for f in fits)
        line = fit.refusal(fits[0], f"compute capability {cc}")
        assert "bm8 bn128 bk1536 stages2" in line and "653,312 B" in line and "would fit" in line


def test_a_shape_the_kernel_cannot_tile() -> None:
    tiny = fit.projections(PRESETS["tiny"], 128)
    f = fit.choose(next(p for p in tiny if p.field == "ple_proj_PD"), fit.limit_for("9.0"))
    assert not f.fits and "group 8" in f.problem


@pytest.mark.parametrize(
    "field,k,tiling,problem",
    [
        ("o_DX", 2048, "bm16 bn128 bk384 stages3", "bk 384 does not divide K=2048"),
        ("ple_proj_PD", 256, "bm16 bn128 bk384 stages3", "bk 384 does not divide K=256"),
        ("qkv_DX", 1536, "bm16 bn1024 bk128 stages2", "bn 1024 does not divide N=2560"),
        ("qkv_DX", 1536, "bm16 bn128 bk192 stages2", "bk 192 is not a multiple of the group 128"),
        ("qkv_DX", 1536, "bm16 bn128 bk128 stages2 splits5", "splits 5 does not divide the 12 steps"),
    ],
)  # fmt: skip
def test_a_given_tiling_that_does_not_tile_a_projection_does_not_fit(field, k, tiling, problem) -> None:
    """Whatever the memory (the TPU's 16 MiB): a tiling the kernel could not run at a shape is not reported as
    fitting it; no need is given, the problem is named, and the dispatch's own check agrees."""
    p = next(p for p in E2B if p.field == field and p.k == k)
    t = fit.parse_tiling(tiling)
    f = fit.choose(p, fit.limit_for("tpu"), tiling=t)
    assert not f.fits and f.need is None and f.tried == t and problem in f.problem
    assert not fit.fits_kernel(p.k, p.n, p.group, t)
    assert problem in fit.refusal(f, "a TPU") and "does not tile it" in fit.refusal(f, "a TPU")


def test_a_given_tiling_that_tiles_a_projection_is_checked_for_memory() -> None:
    p = next(p for p in E2B if p.field == "qkv_DX" and p.k == 1536)
    t = fit.parse_tiling("bm16 bn128 bk384 stages3")
    assert fit.fits_kernel(p.k, p.n, p.group, t)
    assert fit.choose(p, fit.limit_for("9.0"), tiling=t).fits  # 227,584 B of 232,448
    f = fit.choose(p, fit.limit_for("8.9"), tiling=t)
    assert not f.fits and f.problem == "over the limit" and f.need.total == 227_584


@pytest.mark.parametrize("text,problem", [("bm8 bn128 bk128 stages2", "bm 8 is not a power of two >= 16"),
                                          ("bm24 bn128 bk128 stages2", "bm 24"),
                                          ("bm16 bn96 bk128 stages2", "bn 96 is not a power of two >= 32"),
                                          ("bm16 bn16 bk128 stages2", "bn 16"),
                                          ("bm16 bn128 bk128 stages2 warps3", "warps 3")])  # fmt: skip
def test_parse_tiling_refuses_blocks_the_kernel_cannot_run(text: str, problem: str) -> None:
    """Triton's loads take power-of-two sizes and its matrix product at least 16 per axis (model/kernels/w4a16.py)."""
    with pytest.raises(ValueError, match=problem):
        fit.parse_tiling(text)
    assert not fit.fits_kernel(1536, 2560, 128, fit.Tiling(**_fields(text)))


def _fields(text: str) -> dict[str, int]:
    return {part.rstrip("0123456789"): int(part[len(part.rstrip("0123456789")):]) for part in text.split()}


@pytest.mark.parametrize("preset,group", [("e2b", 128), ("e2b", 32), ("e4b", 64), ("tiny", 32), ("tiny", 128)])
def test_every_candidate_tiles_its_projection(preset: str, group: int) -> None:
    """The chooser proposes only tilings the kernel's own check accepts (so the plan never hands the dispatch a
    tiling it would drop); a projection with a shape problem has none."""
    for p in fit.projections(PRESETS[preset], group):
        cands = fit.candidates(p)
        assert all(fit.fits_kernel(p.k, p.n, p.group, t) for t in cands), p.label
        assert bool(cands) == (fit.shape_problem(p) is None), p.label


def test_parse_tiling_and_kernel_option() -> None:
    assert fit.parse_tiling("bm16 bn128 bk256 stages3") == fit.Tiling(bm=16, bn=128, bk=256, stages=3)
    with pytest.raises(ValueError, match="expected e.g."):
        fit.parse_tiling("bm16 bq3")
    assert fit.parse_kernel("w4a16=pallas") == "pallas" and fit.parse_kernel(None) is None
    with pytest.raises(ValueError, match="w4a16=pallas"):
        fit.parse_kernel("w4a16=triton")


def test_the_engine_plan_refuses_when_forced_and_falls_back_otherwise() -> None:
    from model.kernels.choice import plan_kernel
    from model.quantspec import parse_quant

    class Small:  # a device exposing a tiny shared-memory limit
        platform, compute_capability, shared_memory_per_block_optin = "gpu", "9.0", 8 * 1024

    quant = parse_quant("w4")
    args = dict(impl="pallas", reason="test", act_bytes=2, scale_bytes=2, device=Small())
    with pytest.raises(KernelError, match="over the limit of 8,192 B"):
        plan_kernel(PRESETS["e2b"], quant, forced=True, **args)
    plan = plan_kernel(PRESETS["e2b"], quant, **args)
    assert plan.impl == "xla" and "8,192 B" in plan.reason and plan.tiles is None

    class H200:
        platform, compute_capability = "gpu", "9.0"

    plan = plan_kernel(PRESETS["e2b"], quant, **{**args, "device": H200()})
    assert plan.impl == "pallas" and plan.limit == 227 * 1024 and "table" in plan.limit_source
    assert plan.tiles["down_DF K=12288 N=1536"].startswith("bm16 bn256 bk128 stages4")
    assert plan.tiling_of("down_DF", (1536, 12288)).splits == 32 and plan.tiling_of("down_DF", (1, 1)) is None
    assert len(plan.lines()) == 1 + len(E2B)


def test_bench_kernels_fit_prints_without_jax() -> None:
    code = ("import sys; from bench.cli import main\n"
            "try:\n main(['kernels', 'fit', '--device-capability', '7.5', '--tiling', 'published', '--json'])\n"
            "except SystemExit as e:\n assert not e.code, e.code\n"
            "assert 'jax' not in sys.modules, 'jax imported'")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["limit"] == 65_536 and not any(r["fits"] for r in data["rows"])
    assert len(data["refusals"]) == len(E2B) and "653,312 B" in data["refusals"][0]


def test_bench_kernels_fit_tables(capsys) -> None:
    from conftest import bench_in_process

    assert bench_in_process(["kernels", "fit", "--device-capability", "8.9", "--preset", "e2b"]) == 0
    out = capsys.readouterr().out
    assert "limit 101,376 B (99 KiB)" in out and "down_DF" in out and "bm16 bn128 bk128 stages4" in out
    assert "0 of 12 projections over the limit" in out
    assert bench_in_process(["kernels", "fit", "--device-capability", "6.1"]) == 2
    assert "--device-capability 6.1: no shared-memory or VMEM limit" in capsys.readouterr().err


def test_bench_kernels_fit_a_tiling_that_does_not_divide(capsys) -> None:
    """--tiling with bk 384: the projections whose K it does not divide (2048, 4096, 256) say so and do not fit;
    the others are checked for memory (within 9.0's 227 KiB)."""
    from conftest import bench_captured

    code, out, _ = bench_captured(["kernels", "fit", "--device-capability", "9.0", "--tiling",
                                   "bm16 bn128 bk384 stages3", "--json"], capsys)  # fmt: skip
    assert code == 0
    rows = json.loads(out)["rows"]
    bad = [r for r in rows if r["k"] in (256, 2048, 4096)]
    assert bad and all(not r["fits"] and r["need"] is None for r in bad)
    assert all(r["problem"] == f"bk 384 does not divide K={r['k']}" for r in bad)
    assert all(r["fits"] and r["need"] == 227_584 for r in rows if r not in bad)
    code, out, _ = bench_captured(["kernels", "fit", "--device-capability", "9.0", "--tiling",
                                   "bm16 bn128 bk384 stages3"], capsys)  # fmt: skip
    assert code == 0 and "no: bk 384 does not divide K=2048" in out and "3 not tiled at all" in out


@pytest.mark.parametrize(
    "tiling,needles",
    [
        ("bm16 bn128 bk4096 stages1 splits2",
         ["tiles none of preset e2b's w4 projections", "bk 4096 does not divide K=1536"]),
        ("bm16 bn128 bk128 stages1 splits7", ["tiles none", "splits 7 does not divide"]),
        ("bm8 bn128 bk128 stages2", ["bm 8 is not a power of two >= 16"]),
    ],
)  # fmt: skip
def test_bench_kernels_fit_a_tiling_that_tiles_nothing_is_one_line_exit_2(tiling, needles) -> None:
    from conftest import assert_one_line_error

    proc = subprocess.run([sys.executable, "-m", "bench", "kernels", "fit", "--tiling", tiling], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert_one_line_error(proc, f"--tiling '{tiling}'", *needles)
