"""Accuracy of each quantization option against the dense model, asserted with stated bounds (issue 14, "Accuracy,
measured"): float32 activations, the sweep's own exact-length prompts (`bench.measure.prompts`), 64 greedy tokens.

What is compared, per option and prompt (n tokens): the dense engine's greedy tokens g_0..g_63 fix one sequence;
one causal `forward_full` of prompt + g_0..g_62 gives, at positions n - 1 + t, the logits of decision t for the
dense model, the quantized one and the dense model on the DEQUANTIZED weights (teacher forcing: every model sees
the same context). Decision 0 is the prompt's next-token distribution, the figure a sweep records per cell. The
quantized engine's own greedy tokens (free running) give the token agreement.

The bounds, and why each is what it is:
(a) quantized == dense on the dequantized weights, to float32 rounding: the dequantized value int x scale is exact
    in float32 (8-bit integer x 8-bit bfloat16 mantissa), so the two models differ only in where the scale
    multiplies (after the product, per output channel or group, vs inside it) and in w4's group-wise summation
    order. Each reordering moves a product of length K by at most K u sum|x w| (u = 2^-24); through the layers
    the effect measured at the logits is below 1e-6. Asserted: <= 2e-5 x max|logit| + 1e-6 (the engine tests'
    own float32 tolerance) AND <= 1% of the option's quantization error, so a dispatch that misplaced a scale
    (an error the size of the quantization itself) fails.
(b) the int8 head, exactly: the hidden state h (final norm applied) is the dense model's (only the output
    projection changes), each head weight is within s_v / 2 of its dense value (s_v: row v's stored scale) and
    the softcap is 1-Lipschitz, so |dz_v| <= s_v / 2 sum_d |h_d|, plus the float32 rounding of both dot products
    (2 D u sum_d |h_d| (|E_vd| + s_v / 2)). Asserted for every vocabulary row at every decision.
    The options deep in the network (ple8/ple4/w8/w4) pass their error through every later layer, its norms and
    the attention, whose Lipschitz constants on this random model are far larger than the error they bound (an
    RMSNorm's is 1 / rms of its input), so an analytic bound would be orders of magnitude loose. Instead:
    - first order, the logit error is linear in the weight error, which is the step size times a rounding residual,
      so 4 bits against 8 bits scales the error by the ratio of steps: exactly 127 / 7 = 18.1 per PLE group
      (same groups), and for the layer weights the RMS ratio of their steps (w4 group scales vs w8 channel scales,
      computed from the weights). Asserted: the ratio of mean errors within [1/2, 2] x that step ratio.
    - an empirical ceiling per preset: measured figure x a stated margin (`MAX_ERROR`), so a change that makes an
      option's error grow is seen. The margin (1.5x the largest decision-0 error measured over the prompts) is
      wide against float32 noise (1e-6) and narrow against a coarser layout (per-tensor scales, a lost group).
(c) greedy agreement over 64 tokens: while both models see the same context, the quantized argmax equals the
    dense one wherever the dense top-2 margin m_t exceeds 2 (e_t + eps) (e_t: max |dz| at decision t, eps: the
    engine's float32 distance from `forward_full`, checked at decision 0). So the first divergence of the two
    engines' free-running tokens is at or after G, the first decision where m_t <= 2 (e_t + eps): asserted, and
    the equal share is at least G / 64.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.measure.prompts import exact_prompt
from bench.report.accuracy import LOGIT_ERROR_BOUNDS
from model.config import ModelConfig
from model.engine import Engine
from model.forward import forward_full
from model.layers import rms_norm
from model.policy import decide_policy
from model.quant import QuantArray, dequantize, quantize_params
from model.quantspec import LAYER_PROJECTIONS, LM_HEAD, parse_quant

OPTIONS = ("ple8", "ple4", "int8_lm_head", "w8", "w4")
NEW = 64
U = 2.0**-24  # float32 unit roundoff

# max |dlogit| of decision 0 over the prompts: 1.5 x the largest measured (module docstring (b)), kept in
# bench.report.accuracy.LOGIT_ERROR_BOUNDS (the report's tie rule reads the same bounds):
# tiny, measured here over its prompts (20, 41, 120 tokens): 0.00158, 0.0181, 0.00194, 0.0253, 0.272
# default: 1.5 x the lead's maxima over all 40 positions of a 40-token prompt (0.0035, 0.058, 0.0038, 0.020,
# 0.29), each above every decision-0 figure measured over the sweep's prompts (README, `bench compare`)
MAX_ERROR = LOGIT_ERROR_BOUNDS


def _is_quant(x) -> bool:
    return isinstance(x, QuantArray)


def dequantized(tree):
    """The parameter tree with every `QuantArray` replaced by its float32 dequantized array (a dense model)."""
    return jax.tree_util.tree_map(lambda x: dequantize(x, jnp.float32) if _is_quant(x) else x, tree, is_leaf=_is_quant)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _decisions(params, ids_BT, at_BN, *, cfg: ModelConfig):
    """Logits [B, N, V] and final-normed hidden states [B, N, D] (float32) at positions `at_BN` of one causal
    pass over right-padded `ids_BT` (causal: the padding after a position never reaches it)."""
    z_BTV, hidden = forward_full(params, cfg, ids_BT, return_hidden=True)
    h_BTD = rms_norm(hidden[-1], params.final_norm_D, cfg.rms_norm_eps)
    take = lambda a: jnp.take_along_axis(a, at_BN[..., None], axis=1)
    return take(z_BTV), take(h_BTD)


@dataclasses.dataclass(frozen=True)
class Model:
    """One model's figures on the prompts: teacher-forced logits z [B, 64, V] and hidden h [B, 64, D] on the
    dense sequence; its own engine's greedy tokens [B, 64] (None: not run) and next-token logits [B, V]."""

    z: np.ndarray
    h: np.ndarray
    tokens: np.ndarray | None
    next_logits: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class Setup:
    """The prompts of one preset and the machinery to measure a parameter tree on them."""

    cfg: ModelConfig
    prompts: tuple[tuple[int, ...], ...]
    bucket: int

    def engine_run(self, params) -> tuple[np.ndarray, np.ndarray]:
        """(greedy tokens [B, 64], next-token logits [B, V]) of `params` in the engine (float32, one bucket)."""
        engine = Engine(params, self.cfg, decide_policy("float32"), buckets=(self.bucket,))
        tokens = [engine.generate(p, NEW).token_ids for p in self.prompts]
        return np.asarray(tokens), np.stack([engine.next_token_logits(p, NEW) for p in self.prompts])

    def forced(self, params, dense_tokens: np.ndarray, *, engine: bool = True) -> Model:
        """`params` teacher-forced on prompt + the dense greedy tokens (and, with `engine`, run free)."""
        rows = [list(p) + list(map(int, t[:-1])) for p, t in zip(self.prompts, dense_tokens, strict=True)]
        ids = np.full((len(rows), max(map(len, rows))), self.cfg.pad_token_id, np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        at = np.asarray([[len(p) - 1 + t for t in range(NEW)] for p in self.prompts], np.int32)
        z, h = _decisions(params, jnp.asarray(ids), jnp.asarray(at), cfg=self.cfg)
        tokens, nxt = self.engine_run(params) if engine else (None, None)
        return Model(np.asarray(z), np.asarray(h), tokens, nxt)


def measure(setup: Setup, dense_params, options=OPTIONS) -> tuple[Model, dict[str, tuple[Model, Model, object]]]:
    """The dense model, then per option (quantized model, dense-on-dequantized model, quantized tree)."""
    dense_tokens, dense_next = setup.engine_run(dense_params)
    dense = dataclasses.replace(setup.forced(dense_params, dense_tokens, engine=False), tokens=dense_tokens,
                                next_logits=dense_next)  # fmt: skip
    out = {}
    for opt in options:
        tree = quantize_params(dense_params, parse_quant(opt))
        out[opt] = (setup.forced(tree, dense_tokens), setup.forced(dequantized(tree), dense_tokens, engine=False), tree)
    return dense, out


# ---- the checks, shared by both presets ----------------------------------------------------------------------------
def engine_eps(z0: np.ndarray) -> float:
    """The engine's float32 distance from `forward_full` allowed at the logits (the engine tests' tolerance)."""
    return 2e-5 * float(np.max(np.abs(z0))) + 1e-6


def check_dispatch(quant: Model, deq: Model, dense: Model) -> float:
    """(a): quantized logits == dense-on-dequantized logits to float32 rounding; returns the max difference."""
    gap = float(np.max(np.abs(quant.z - deq.z)))
    error = float(np.max(np.abs(quant.z - dense.z)))
    assert error > 0, "the option changed nothing"
    assert gap <= engine_eps(dense.z) and gap <= 0.01 * error, (gap, error)
    return gap


def check_head_bound(quant: Model, dense: Model, tree) -> float:
    """(b), int8 head: |dz_tv| <= s_v / 2 sum_d |h_td| + float32 rounding, every row v, every decision t.
    Returns the largest error / bound."""
    head = getattr(tree, LM_HEAD)
    s_V = np.asarray(head.scales, np.float32)[:, 0]
    e_VD = np.asarray(tree.embed_VD, np.float32)
    habs = np.abs(dense.h)  # [B, N, D]: the int8-head model's hidden state is the dense one's
    d = habs.shape[-1]
    bound = habs.sum(-1)[..., None] * s_V / 2 + 2 * d * U * (habs @ (np.abs(e_VD) + s_V[:, None] / 2).T)
    err = np.abs(quant.z - dense.z)
    assert np.all(err <= bound), float(np.max(err - bound))
    return float(np.max(err / bound))


def step_ratio_layers(w8_tree, w4_tree) -> float:
    """RMS step of w4 / RMS step of w8 over every layer projection element (module docstring (b), first order)."""
    sums = {}
    for name, tree in (("w8", w8_tree), ("w4", w4_tree)):
        total, count = 0.0, 0
        for lp in tree.layers:
            for field in LAYER_PROJECTIONS:
                q = getattr(lp, field)
                if _is_quant(q):
                    s = np.asarray(q.scales, np.float32).astype(np.float64)
                    per = math.prod(q.shape) / s.size  # values per scale (a short last group counts as whole)
                    total, count = total + float((s**2).sum()) * per, count + s.size * per
        sums[name] = math.sqrt(total / count)
    return sums["w4"] / sums["w8"]


def check_greedy(quant: Model, dense: Model) -> list[tuple[int, int | None, int]]:
    """(c): per prompt (G, first divergence or None, equal tokens); asserts divergence >= G and equal >= G."""
    eps = engine_eps(dense.z)
    assert np.max(np.abs(dense.next_logits - dense.z[:, 0])) <= eps  # the engine's eps, checked at decision 0
    assert np.max(np.abs(quant.next_logits - quant.z[:, 0])) <= eps
    top2 = np.sort(dense.z, axis=-1)[..., -2:]
    margin = top2[..., 1] - top2[..., 0]  # [B, N]
    e = np.max(np.abs(quant.z - dense.z), axis=-1)
    out = []
    for b in range(dense.z.shape[0]):
        unsafe = np.nonzero(margin[b] <= 2 * (e[b] + eps))[0]
        g = int(unsafe[0]) if unsafe.size else NEW
        safe = margin[b] > 2 * eps
        assert np.array_equal(dense.tokens[b][safe], np.argmax(dense.z[b], -1)[safe])  # the sequence forced on
        diff = np.nonzero(quant.tokens[b] != dense.tokens[b])[0]
        first = int(diff[0]) if diff.size else None
        equal = int(np.sum(quant.tokens[b] == dense.tokens[b]))
        assert (first is None or first >= g) and equal >= g, (b, g, first)
        out.append((g, first, equal))
    return out


def decision0(quant: Model, dense: Model) -> tuple[float, float, float]:
    """(max |dz|, mean |dz|, share of prompts with the same argmax) of the next-token logits over the prompts."""
    d = np.abs(quant.z[:, 0] - dense.z[:, 0])
    same = np.mean(np.argmax(quant.z[:, 0], -1) == np.argmax(dense.z[:, 0], -1))
    return float(d.max()), float(d.mean()), float(same)


def check_all(setup: Setup, dense_params, preset: str) -> list[str]:
    """Every check of the module docstring on `setup`'s prompts; returns one printable line per option."""
    dense, models = measure(setup, dense_params)
    lines, means = [], {}
    for opt, (quant, deq, tree) in models.items():
        gap = check_dispatch(quant, deq, dense)
        worst, mean, same = decision0(quant, dense)
        means[opt] = float(np.mean(np.abs(quant.z - dense.z)))
        tight = f", error / bound <= {check_head_bound(quant, dense, tree):.3f}" if opt == "int8_lm_head" else ""
        assert worst <= MAX_ERROR[preset][opt], (opt, worst)
        greedy = check_greedy(quant, dense)
        lines.append(f"{preset} {opt}: next-token max |dlogit| {worst:.4g}, mean {mean:.4g}, same argmax "
                     f"{100 * same:.0f}%; quantized vs dequantized {gap:.2g}{tight}; greedy (G, first divergence, "
                     f"equal of 64) {greedy}")  # fmt: skip
    assert 127 / 7 / 2 <= means["ple4"] / means["ple8"] <= 127 / 7 * 2, means
    r = step_ratio_layers(models["w8"][2], models["w4"][2])
    assert r / 2 <= means["w4"] / means["w8"] <= 2 * r, (means, r)
    lines.append(f"{preset}: mean-error ratios ple4/ple8 {means['ple4'] / means['ple8']:.1f} (steps 18.1), "
                 f"w4/w8 {means['w4'] / means['w8']:.1f} (steps {r:.1f}); logit std {float(np.std(dense.z)):.3f}")
    return lines


# ---- the presets -----------------------------------------------------------------------------------------------------
def _setup_and_params(checkpoint, sizes: tuple[int, ...], bucket: int):
    from model.checkpoint import load_params
    from model.config import load_config
    from model.tokenizer import GemmaTokenizer

    cfg = load_config(checkpoint)
    params, _ = load_params(checkpoint, cfg, dtype=np.float32, device_put=jax.device_put)
    tokenizer = GemmaTokenizer.from_dir(checkpoint)
    prompts = tuple(exact_prompt(tokenizer, n).ids for n in sizes)
    return Setup(cfg=cfg, prompts=prompts, bucket=bucket), params


def test_every_option_on_the_tiny_preset(tiny_checkpoint, capsys) -> None:
    """The sweep's prompts at sizes the tiny preset's 256 positions hold (its sweep cannot run 521 and up)."""
    setup, params = _setup_and_params(tiny_checkpoint, (20, 41, 120), bucket=128)
    lines = check_all(setup, params, "tiny")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.heavy  # about 8 minutes on 2 idle cores: `make test-heavy`
def test_every_option_on_the_default_preset(capsys) -> None:
    """The default preset (the built-in checkpoint every sweep runs) on the sweep's two shorter prompts, 41 and
    521 tokens (the longer two, 2057 and 3593, would add minutes of prefill; the README has ple8 at all four)."""
    from model.builtin import ensure_builtin

    setup, params = _setup_and_params(ensure_builtin("default"), (41, 521), bucket=640)
    lines = check_all(setup, params, "default")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
