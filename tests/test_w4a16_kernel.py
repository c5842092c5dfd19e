"""The fused W4A16 kernel (model/kernels/w4a16.py) in interpret mode against dequantize-then-matmul, its dispatch
through `model.quant.matmul`, its Triton lowering (on CPU, for an abstract GPU), and the engine's choice.

Tolerances (max |kernel - reference| per output, reference = float64 product of the activations and the
dequantized weight): float32 activations 1e-5 x sum_k |x_k w_kn| (float32 rounding of a K-term sum, with room);
bfloat16 activations additionally 2^-7 x |reference| (the output is rounded to bfloat16, half an ulp is 2^-9, and
the per-group float32 partial sums add their own rounding)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.errors import KernelError
from model.kernels import fit
from model.kernels.fit import Tiling
from model.kernels.choice import decide_mode
from model.kernels.w4a16 import KERNEL_NAME, w4a16_matmul
from model.quant import dequantize, matmul, quantize_channels

E2B_CONTRACTIONS = [(1536, 0), (1536, 1), (2048, 1), (4096, 1), (6144, 1), (12288, 1)]
"""E2B's contraction sizes with the weight layouts they come in (axis 0: [K, N] q/k/v and gate/up; axis 1: [N, K]
o_proj, down_proj, the PLE gate)."""
N = 128


def _weight(k: int, axis: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, N) if axis == 0 else (N, k)).astype(np.float32) / np.sqrt(k)
    return quantize_channels(w, 4, axis, 128)


def _reference(x: np.ndarray, q, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(x @ W in float64, sum_k |x_k W_kn|) with W the dequantized weight as [K, N]."""
    w = np.asarray(dequantize(q, jnp.float32), np.float64)
    w_KN = w if axis == 0 else w.T
    x64 = np.asarray(x, np.float64)
    return x64 @ w_KN, np.abs(x64) @ np.abs(w_KN)


def _tiling(k: int) -> Tiling:
    """Two groups per step (the unrolled group loop), two K splits (each program loops over K / 512 >= 3 steps),
    two output blocks: 4 programs, so interpret mode stays fast."""
    return Tiling(bm=16, bn=64, bk=256, stages=2, splits=2)


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("k,axis", E2B_CONTRACTIONS)
def test_kernel_equals_dequantize_then_matmul(k: int, axis: int, rows: int) -> None:
    q = _weight(k, axis)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    y = w4a16_matmul(jnp.asarray(x), q.values, q.scales, k=k, n=N, group=128, axis=axis, tiling=_tiling(k),
                     interpret=True)  # fmt: skip
    ref, mag = _reference(x, q, axis)
    assert y.shape == (rows, N) and y.dtype == jnp.float32
    assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= 1e-5 * mag)


@pytest.mark.parametrize("axis", [0, 1])
def test_bfloat16_activations_and_row_blocks(axis: int) -> None:
    """bfloat16 in, bfloat16 out; 37 rows: three row blocks, the last padded."""
    k = 1536
    q = _weight(k, axis, seed=3)
    x = jnp.asarray(np.random.default_rng(5).standard_normal((37, k)), jnp.bfloat16)
    t = Tiling(bm=16, bn=128, bk=128, stages=3, splits=3)
    y = w4a16_matmul(x, q.values, q.scales, k=k, n=N, group=128, axis=axis, tiling=t, interpret=True)
    ref, mag = _reference(np.asarray(x.astype(jnp.float32)), q, axis)
    assert y.dtype == jnp.bfloat16
    assert np.all(np.abs(np.asarray(y.astype(jnp.float32), np.float64) - ref) <= 2**-7 * np.abs(ref) + 1e-5 * mag)


@pytest.mark.parametrize(
    "k,tiling,why",
    [
        (1536, Tiling(bm=16, bn=96, bk=256, stages=2), "bn 96 is not a power"),
        (2048, Tiling(bm=16, bn=64, bk=384, stages=2), "bk 384 does not divide K=2048"),
        (1536, Tiling(bm=16, bn=256, bk=128, stages=2), "bn 256 does not divide N=128"),
        (1536, Tiling(bm=8, bn=64, bk=128, stages=2), "bm 8 is not a power"),
    ],
)
def test_a_tiling_that_does_not_tile_the_shape_is_refused(k: int, tiling: Tiling, why: str) -> None:
    q = _weight(k, 0)
    with pytest.raises(ValueError, match=f"does not tile K={k} N={N} group 128: {why}"):
        w4a16_matmul(jnp.zeros((1, k)), q.values, q.scales, k=k, n=N, group=128, axis=0, tiling=tiling,
                     interpret=True)  # fmt: skip


@pytest.mark.parametrize("spec,axis", [("BTD,DX->BTX", 0), ("BTX,DX->BTD", 1)])
def test_matmul_dispatches_a_tiled_leaf_to_the_kernel(spec: str, axis: int) -> None:
    """The one quantized matmul: a leaf with a tiling goes through the kernel (a pallas_call named for it in the
    program), with the same result as the leaf without one (XLA's product)."""
    q = _weight(512, axis)
    tiled = dataclasses.replace(q, tiling=Tiling(bm=16, bn=64, bk=128, stages=2, splits=2))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 2, 512)), jnp.float32)
    program = str(jax.make_jaxpr(lambda a, w: matmul(a, w, spec))(x, tiled))
    assert "pallas_call" in program and KERNEL_NAME in program
    assert "pallas_call" not in str(jax.make_jaxpr(lambda a, w: matmul(a, w, spec))(x, q))
    np.testing.assert_allclose(np.asarray(matmul(x, tiled, spec)), np.asarray(matmul(x, q, spec)), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("spec,axis", [("BTD,DX->BTX", 0), ("BTX,DX->BTD", 1)])
@pytest.mark.parametrize(
    "tiling",
    [
        Tiling(bm=16, bn=64, bk=384, stages=2),  # bk does not divide K = 512
        Tiling(bm=16, bn=256, bk=128, stages=2),  # bn does not divide N = 128
        Tiling(bm=16, bn=64, bk=128, stages=2, splits=3),  # 4 steps, 3 splits
        Tiling(bm=8, bn=64, bk=128, stages=2),  # bm below the matrix unit's 16
    ],
)
def test_a_leaf_whose_tiling_does_not_tile_it_never_runs_the_kernel(spec: str, axis: int, tiling: Tiling) -> None:
    """The dispatch checks the tiling against the leaf's shape (`fit.fits_kernel`, the kernel's own check): a leaf
    carrying a tiling the kernel cannot run takes XLA's product (no pallas_call in the program), with its result."""
    q = _weight(512, axis)
    assert not fit.fits_kernel(512, N, 128, tiling)
    tiled = dataclasses.replace(q, tiling=tiling)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 2, 512)), jnp.float32)
    assert "pallas_call" not in str(jax.make_jaxpr(lambda a, w: matmul(a, w, spec))(x, tiled))
    np.testing.assert_array_equal(np.asarray(matmul(x, tiled, spec)), np.asarray(matmul(x, q, spec)))


@dataclasses.dataclass(frozen=True)
class _Layer:
    o_DX: object


@dataclasses.dataclass(frozen=True)
class _Tree:
    layers: tuple


def one_layer_tree(leaf) -> _Tree:
    """The smallest weight tree `with_tilings` walks: one layer whose `o_DX` is `leaf` (tests/test_w4a16_tpu_kernel.py
    uses it too)."""
    return _Tree(layers=(_Layer(o_DX=leaf),))


def test_with_tilings_refuses_a_plan_tiling_that_does_not_tile_its_leaf() -> None:
    """A plan is built from `fit.choose`, whose tilings always tile their shapes; one that does not (a program
    error) is refused at load rather than left to the dispatch to drop silently."""
    from model.kernels.choice import KernelPlan, with_tilings

    q = _weight(2048, 1)  # [N, K] = [128, 2048]
    p = fit.Projection(field="o_DX", k=2048, n=N, axis=1, group=128)

    def plan(t: Tiling) -> KernelPlan:
        f = fit.Fit(projection=p, tiling=t, need=None, limit=fit.limit_for("9.0"), tried=t)
        return KernelPlan(impl="pallas", reason="test", limit=f.limit, limit_source="test", fits=(f,))

    good = Tiling(bm=16, bn=64, bk=256, stages=2, splits=2)
    assert with_tilings(one_layer_tree(q), plan(good)).layers[0].o_DX.tiling == good
    with pytest.raises(ValueError, match="o_DX .*bk 384 does not divide K=2048"):
        with_tilings(one_layer_tree(q), plan(Tiling(bm=16, bn=64, bk=384, stages=2)))


def test_importing_the_engine_loads_no_pallas() -> None:
    """A fresh interpreter: the engine, the kernel choice and the CLI's engine helpers import no Pallas, nor does
    a quantized product without a tiling; the first product of a tiled leaf imports it (the kernel's path)."""
    code = "\n".join([
        "import sys",
        "import model.engine, model.kernels.choice, bench.cli.common",
        "pallas = lambda: sorted(m for m in sys.modules if 'pallas' in m)",
        "assert 'jax.experimental.pallas' not in sys.modules and not pallas(), pallas()",
        "import dataclasses, jax.numpy as jnp",
        "from model.kernels.fit import Tiling",
        "from model.quant import matmul, quantize_channels",
        "q = quantize_channels(jnp.ones((256, 64)), 4, 0, 128)",
        "x = jnp.ones((1, 256))",
        "matmul(x, q, 'BD,DX->BX')",
        "assert not pallas(), pallas()",
        "matmul(x, dataclasses.replace(q, tiling=Tiling(bm=16, bn=64, bk=128, stages=1)), 'BD,DX->BX')",
        "assert 'jax.experimental.pallas' in sys.modules",
        "print('imports ok')",
    ])  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))  # fmt: skip
    assert proc.returncode == 0 and "imports ok" in proc.stdout, proc.stderr[-3000:]


def test_more_rows_than_the_kernel_takes_use_xla() -> None:
    q = dataclasses.replace(_weight(256, 0), tiling=Tiling(bm=16, bn=64, bk=128, stages=2))
    x = jnp.zeros((1, 65, 256), jnp.float32)
    assert "pallas_call" not in str(jax.make_jaxpr(lambda a, w: matmul(a, w, "BTD,DX->BTX"))(x, q))


@pytest.mark.parametrize("k,n,axis", [(1536, 2560, 0), (12288, 1536, 1)])
def test_the_kernel_lowers_through_triton_for_a_gpu(k: int, n: int, axis: int) -> None:
    """On CPU, lowered for an abstract H200: the Pallas Triton lowering accepts the kernel (a Triton custom call
    named for it), at the tiling the fit check picks for compute capability 9.0. Compiling the Triton IR needs a GPU."""
    p = fit.Projection(field="x", k=k, n=n, axis=axis, group=128)
    t = fit.choose(p, fit.limit_for("9.0")).tiling
    values = jax.ShapeDtypeStruct((k, n // 2) if axis == 0 else (n, k // 2), jnp.uint8)
    scales = jax.ShapeDtypeStruct((k // 128, n) if axis == 0 else (n, k // 128), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((1, k), jnp.bfloat16)
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    f = jax.jit(lambda a, v, s: w4a16_matmul(a, v, s, k=k, n=n, group=128, axis=axis, tiling=t))
    with jax.sharding.use_abstract_mesh(mesh), pytest.warns(DeprecationWarning, match="Triton"):
        text = f.trace(x, values, scales).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in text and f'name = "{KERNEL_NAME}"' in text
    assert f"num_stages = {t.stages}" in text and f"num_warps = {t.warps}" in text


# ---- the engine's choice -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "platform,cc,w4,requested,impl,why",
    [
        ("gpu", "9.0", True, None, "pallas", ">= 8.0"),
        ("gpu", "8.9", True, None, "pallas", ">= 8.0"),
        ("gpu", "8.0", True, "pallas", "pallas", "--kernel"),
        ("gpu", "9.0", True, "xla", "xla", "--kernel w4a16=xla"),
        ("gpu", "7.5", True, None, "xla", "compute capability 7.5 < 8.0"),
        ("cpu", None, True, None, "xla", "interpret"),
        ("tpu", None, True, None, "pallas", "Mosaic TPU"),
        ("tpu", None, True, "pallas", "pallas", "--kernel w4a16=pallas"),
        ("tpu", None, True, "xla", "xla", "--kernel w4a16=xla"),
        ("gpu", "9.0", False, None, "xla", "no w4 weights"),
    ],
)
def test_decide_mode(platform, cc, w4, requested, impl, why) -> None:
    got, reason = decide_mode(platform, cc, w4, requested)
    assert got == impl and why in reason


@pytest.mark.parametrize("platform,cc,w4,fix", [("cpu", None, True, "CPU"), ("gpu", "7.5", True, "7.5 < 8.0"),
                                                 ("gpu", "9.0", False, "--quant w4")])  # fmt: skip
def test_forced_pallas_where_it_cannot_run_is_one_clear_refusal(platform, cc, w4, fix) -> None:
    with pytest.raises(KernelError, match="--kernel w4a16=pallas") as err:
        decide_mode(platform, cc, w4, "pallas")
    assert fix in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # ~50 s on 2 cores: the decode and prefill programs compiled with the interpreted kernel
def test_the_engine_with_the_kernel_matches_xla(tiny_checkpoint) -> None:
    """A tiny w4 engine (group 32: the tiny shapes' contractions are 64 to 256) whose tiled leaves run the kernel
    in interpret mode decodes the same tokens as the same engine on XLA's product, with close logits.

    Run in a fresh interpreter: once, late in a whole-suite process, XLA aborted the process while compiling the
    engine's prefill with the interpreted kernel (SIGABRT, no message kept), which took every later test with it;
    alone, and with the persistent compilation cache on, it passes. A fresh process keeps a crash to this test."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_w4a16_kernel as t; "
            "t.engine_with_kernel_matches_xla(sys.argv[2]); print('engine check ok')")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(tiny_checkpoint)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))  # fmt: skip
    assert proc.returncode == 0 and "engine check ok" in proc.stdout, (proc.returncode, proc.stderr[-3000:])


def engine_with_kernel_matches_xla(tiny_checkpoint) -> None:
    """The check of `test_the_engine_with_the_kernel_matches_xla`, in the process that calls it."""
    from model.engine import Engine, load_engine
    from model.kernels.choice import KernelPlan, with_tilings
    from model.quantspec import parse_quant

    engine, _ = load_engine(Path(tiny_checkpoint), quant=parse_quant("w4:32"), log_policy=False)
    assert engine.kernel.impl == "xla" and "CPU" in engine.kernel.reason  # the CPU default
    fits = fit.plan(fit.projections(engine.cfg, 32), fit.limit_for("9.0"), act_bytes=4)
    plan = KernelPlan(impl="pallas", reason="test", limit=fit.limit_for("9.0"), limit_source="test", fits=fits)
    assert sum(f.fits for f in fits) >= 4  # the tiny shapes the kernel takes (others keep XLA's product)
    tiled = Engine(with_tilings(engine.params, plan), engine.cfg, engine.policy, quant=engine.quant, kernel=plan,
                   max_length=64)  # fmt: skip
    assert any(leaf.tiling is not None for leaf in jax.tree_util.tree_leaves(
        tiled.params, is_leaf=lambda v: hasattr(v, "tiling")) if hasattr(leaf, "tiling"))  # fmt: skip
    prompt = [engine.cfg.bos_token_id, 5, 9, 11]
    a = engine.generate(prompt, 4).token_ids
    b = tiled.generate(prompt, 4).token_ids
    assert a == b
    np.testing.assert_allclose(tiled.next_token_logits(prompt, 4), engine.next_token_logits(prompt, 4), atol=1e-4)
