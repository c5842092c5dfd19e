"""The engine over a device mesh (`model.sharding`) on CPU with forced host devices: greedy tokens at tp = 2 and 4
and ep = 2 and 4 equal one device's, and what each device reads and communicates (docs/engine.md, "Several devices").

Not collected by the suite itself (the file name): jax must start with several host devices, which the flag
XLA_FLAGS=--xla_force_host_platform_device_count=8 does only before jax initialises, so tests/test_mesh.py runs
this file in a pytest process of its own with that flag (its cases not marked heavy in `make test`, the heavy ones
in `make test-heavy`). Run by hand: XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest
tests/mesh_cases.py. Float32 throughout, few tokens, small presets.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from jax.sharding import PartitionSpec as P

from model.config import DEFAULT, PRESETS, TINY, ModelConfig
from model.engine import Engine, load_engine
from model.params import init_params
from model.policy import decide_policy
from model.quant import quantize_params
from model.placement import kv_heads_per_device
from model.quantspec import parse_quant
from model.sharding import (
    SPLIT_AXIS,
    device_steps,
    device_weight_bytes,
    group_layer,
    make_layout,
    parse_mesh,
    place_params,
    routed_experts,
)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices: run through tests/test_mesh.py "
                                "(XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax starts)")  # fmt: skip

NEW = 5
PROMPTS = ([2, 17, 33, 99, 5, 7, 11], [2, 250, 3, 41, 41, 8, 19, 140, 77, 23, 61])
HEAVY = pytest.mark.heavy  # minutes on a busy 2-core host: `make test-heavy` (tests/test_mesh.py runs them there)

GQA = dataclasses.replace(TINY, num_heads=8, num_kv_heads=4, num_global_kv_heads=2)
"""E4B/31B-like attention at tiny size: 8 query heads on 4 KV heads (sliding) and 2 (full), so tp = 2 splits every
layer's KV heads, tp = 4 splits the sliding layers' and copies the full layers' (4 % 2 == 0), tp = 8 copies both."""

DENSE_31B = dataclasses.replace(TINY, num_heads=8, num_kv_heads=4, num_global_kv_heads=2, num_kv_shared_layers=0,
                                ple_dim=0, use_double_wide_mlp=False)  # fmt: skip
"""31B's dense shape at tiny size as far as the engine on main has it: no PLE, no KV sharing, separate full-layer
KV heads (K = V on full layers, `attention_k_eq_v`, is not on main yet: see test_31b_and_moe_presets)."""


def _engine(cfg: ModelConfig, mesh: str | None, quant: str = "none") -> Engine:
    """An engine of `cfg`'s random parameters (seed 0, float32), quantized as `quant` says, on one device or
    placed over the mesh `mesh`."""
    params = jax.tree_util.tree_map(jnp.asarray, init_params(cfg, seed=0))
    spec = parse_quant(quant)
    if spec.canonical != "none":
        params = quantize_params(params, spec, scale_dtype=jnp.float32)
    layout = None
    if mesh is not None:
        layout = make_layout(parse_mesh(mesh))
        params = place_params(params, cfg, layout)
    return Engine(params, cfg, decide_policy("float32"), buckets=(16,), quant=spec, scale_dtype="float32",
                  layout=layout)  # fmt: skip


def _tokens(engine: Engine) -> list[list[int]]:
    return [engine.generate(p, NEW).token_ids for p in PROMPTS]


@functools.cache
def _alone(cfg: ModelConfig, quant: str = "none") -> list[list[int]]:
    """One device's greedy tokens of `cfg` (quantized as `quant` says), computed once per process."""
    return _tokens(_engine(cfg, None, quant))


@pytest.fixture(scope="module")
def tiny_checkpoint_f32(tmp_path_factory):
    from model.builtin import create_checkpoint

    return create_checkpoint("tiny", tmp_path_factory.mktemp("ckpt") / "tiny", dtype="float32")


@pytest.fixture(scope="module")
def tiny_alone(tiny_checkpoint_f32):
    engine, _ = load_engine(tiny_checkpoint_f32, policy=decide_policy("float32"), log_policy=False)
    return engine, _tokens(engine)


@pytest.mark.parametrize("tp", [2, pytest.param(4, marks=HEAVY)])
def test_tiny_checkpoint_greedy_tokens_at_tp_equal_one_devices(tiny_checkpoint_f32, tiny_alone, tp):
    engine, _ = load_engine(tiny_checkpoint_f32, policy=decide_policy("float32"), log_policy=False,
                            mesh=parse_mesh(f"tp={tp}"))  # fmt: skip
    assert engine.layout.mesh.devices.size == tp
    assert _tokens(engine) == tiny_alone[1]
    qkv = engine.params.layers[0].qkv_DX  # grouped, split by group: each device holds its heads' columns
    assert qkv.ndim == 3 and qkv.sharding.shard_shape(qkv.shape) == (TINY.hidden_size, 1, qkv.shape[2])


@HEAVY
def test_tiny_batch_and_device_loop_at_tp_2_equal_one_devices(tiny_checkpoint_f32, tiny_alone):
    engine, _ = load_engine(tiny_checkpoint_f32, policy=decide_policy("float32"), log_policy=False,
                            mesh=parse_mesh("tp=2"))  # fmt: skip
    alone = tiny_alone[1]
    assert engine.generate_batch(list(PROMPTS), NEW).token_ids == alone
    assert engine.generate(PROMPTS[1], NEW, decode_loop="device", block=2).token_ids == alone[1]


@pytest.mark.parametrize("tp", [pytest.param(2, marks=HEAVY), 4, pytest.param(8, marks=HEAVY)])
def test_gqa_split_and_copied_kv_heads_give_one_devices_tokens(tp):
    engine = _engine(GQA, f"tp={tp}")
    assert _tokens(engine) == _alone(GQA)
    # the cache a prefill returns: each device its KV heads (split or one copy), every layer
    _, cache = engine.step_fn(PROMPTS[0], NEW)[0]
    for i, k in zip(GQA.cache_layers, cache.k, strict=True):
        kd = kv_heads_per_device(GQA, i, tp)
        assert k.shape[1] == tp * kd and k.sharding.shard_shape(k.shape)[1] == kd


@HEAVY
@pytest.mark.parametrize("tp", [2, 4])
def test_31b_shaped_dense_layers_at_tp_give_one_devices_tokens(tp):
    assert _tokens(_engine(DENSE_31B, f"tp={tp}")) == _alone(DENSE_31B)


@HEAVY
@pytest.mark.parametrize("quant, field", [("w8", "o_DX"), ("w4:16", "o_DX"), ("ple4,int8_lm_head", "lm_head_VD")])
def test_quantized_leaves_split_with_their_scales_give_one_devices_tokens(quant, field):
    engine = _engine(TINY, "tp=2", quant)
    assert _tokens(engine) == _alone(TINY, quant)
    owner = engine.params if field == "lm_head_VD" else engine.params.layers[0]
    leaf, axis = getattr(owner, field), SPLIT_AXIS[field]  # values cut along the leaf's split axis
    assert leaf.values.sharding.shard_shape(leaf.values.shape)[axis] == leaf.values.shape[axis] // 2


def _expected_weight_bytes(cfg: ModelConfig, tp: int, itemsize: int = 4) -> int:
    """Parameter bytes one device reads in a decode step at tp (dense, float32), from the config alone: the split
    leaves' share, copied KV heads whole, the replicated leaves, one row of each gathered table."""
    d, p, total = cfg.hidden_size, cfg.ple_dim, 0
    for i in range(cfg.num_layers):
        n, h, f = cfg.num_heads, cfg.layer_head_dim(i), cfg.ffw_dim(i)
        own = not cfg.is_kv_shared(i)
        kd = kv_heads_per_device(cfg, i, tp) if own else 0
        total += d * (n // tp + 2 * kd) * h + d * n * h // tp + d * 2 * f // tp + d * f // tp  # qkv, o, gate_up, down
        total += 4 * d + h + (h if own else 0) + 1 + (2 * p * d + d if p else 0)  # norms, q/k norm, scalar, PLE
    total += cfg.vocab_size // tp * d + d + cfg.num_layers * p + (d * cfg.num_layers * p + p if p else 0) + d
    return total * itemsize


@pytest.mark.parametrize("tp", [pytest.param(1, marks=HEAVY), 2, pytest.param(4, marks=HEAVY)])
def test_each_device_reads_its_share_of_the_weights_and_communicates_activations_only(tp):
    engine = _engine(TINY, f"tp={tp}")
    steps = device_steps(engine, len(PROMPTS[0]), NEW)
    assert [s.device for s in steps] == list(range(tp))
    assert {s.weight_bytes for s in steps} == {_expected_weight_bytes(TINY, tp)}
    alone = _engine(TINY, None)
    assert _expected_weight_bytes(TINY, 1) == alone.decode_bytes(len(PROMPTS[0]), NEW)["weights"]
    assert steps[0].kv_bytes == alone.decode_bytes(len(PROMPTS[0]), NEW)["kv_cache"]  # one KV head: copied
    if tp == 1:
        assert steps[0].collectives == {}
        return
    # two all-reduces of [1, 1, D] float32 per layer at least (attention output, MLP down), none of a weight's size
    assert steps[0].collective_bytes["all-reduce"] >= 2 * TINY.num_layers * TINY.hidden_size * 4
    smallest_split = TINY.hidden_size * TINY.intermediate_size * 4 // tp
    assert sum(steps[0].collective_bytes.values()) < smallest_split


@HEAVY
@pytest.mark.parametrize("tp", [2, 4])
def test_default_preset_at_tp_gives_one_devices_tokens(tp):
    assert _tokens(_engine(DEFAULT, f"tp={tp}")) == _alone(DEFAULT)


@pytest.mark.parametrize("preset, tp", [("tiny-31b", 2), pytest.param("tiny-31b", 4, marks=HEAVY),
                                        ("tiny-moe", 2), pytest.param("tiny-moe", 4, marks=HEAVY)])
def test_31b_and_moe_shaped_presets_at_tp_give_one_devices_tokens(preset, tp):
    """31B- (K = V full layers) and 26B-A4B-shaped (experts) small presets, from the family issue (45): tensor
    parallel splits their attention and dense MLP; the experts are replicated (expert parallel, ep, is refused
    until it is placed). The presets are in `model.config.PRESETS` since the moe merge."""
    from model.config import PRESETS

    cfg = PRESETS[preset]
    assert _tokens(_engine(cfg, f"tp={tp}")) == _alone(cfg)


@pytest.mark.parametrize("cfg, tp", [(TINY, 2), pytest.param(GQA, 4, marks=HEAVY)])
def test_the_batch_memory_check_is_per_device(cfg, tp, monkeypatch):
    """`Engine.check_batch` on a mesh counts each device's share (bench/issue 46): the largest device's weights as
    placed and its KV heads' part of each row's cache (what a prefill's cache shard holds), against one device's
    memory, which forced host devices share (`sharing`); the refusal says so, with the arithmetic."""
    import model.engine as engine_module
    from model.sharding import device_held_bytes

    engine = _engine(cfg, f"tp={tp}")
    devices = list(engine.layout.mesh.devices.flat)
    held = max(device_held_bytes(engine.params, d) for d in devices)
    assert held < engine.weight_bytes  # a share, not the whole model
    mem = engine.check_batch(1, len(PROMPTS[0]), NEW)
    _, cache = engine.step_fn(PROMPTS[0], NEW)[0]  # one row's cache as placed: its shard on the first device
    shard = sum(x.addressable_shards[0].data.nbytes for x in cache.k + cache.v)
    assert (mem.weight_bytes, mem.kv_bytes_per_row, mem.mesh) == (held, shard, f"tp={tp}")
    assert mem.sharing == tp and "host" in mem.where  # forced host devices share the host's memory
    rows = 3  # a capacity where two rows fit on each of the devices sharing it, and three do not
    copy = -(-engine.batch_copy_bytes // tp)  # batched steps on CPU read a transposed copy: its share per device
    capacity = int(tp * (held + copy + 2 * shard) / 0.9) + tp
    monkeypatch.setattr(engine_module, "memory_capacity", lambda weights, device=None: (capacity, "of host memory"))
    with pytest.raises(Exception) as err:
        engine.check_batch(rows, len(PROMPTS[0]), NEW)
    line = str(err.value)
    assert f"does not fit on each device of tp={tp}" in line and f"x {tp} devices sharing it" in line, line
    assert "at most 2 rows fit" in line, line


# ---- expert parallel (ep): 26B-A4B's experts split by expert ------------------------------------------------------
MOE = PRESETS["tiny-moe"]
BALANCED_MOE = dataclasses.replace(MOE, expert_routing="balanced")
"""tiny-moe with the dummy weights' balanced routing (`model.moe.ROUTINGS`): the routing the ep prediction assumes,
so the bytes each device reads can be checked against it."""


@pytest.mark.parametrize("ep", [2, pytest.param(4, marks=HEAVY)])
def test_moe_at_ep_gives_one_devices_tokens(ep):
    """The router's own choice (random weights: uneven over the devices, some devices none) walked per device."""
    engine = _engine(MOE, f"ep={ep}")
    w = engine.params.layers[0].experts_gate_up_EDX  # grouped [ep, E/ep, D, X], each device its E/ep experts
    assert w.shape[:2] == (ep, MOE.num_experts // ep) and w.sharding.shard_shape(w.shape)[:2] == (1, w.shape[1])
    assert _tokens(engine) == _alone(MOE)


@HEAVY
@pytest.mark.parametrize("quant", ["w4:16", "w8"])
def test_quantized_experts_at_ep_2_give_one_devices_tokens(quant):
    engine = _engine(MOE, "ep=2", quant)
    leaf = engine.params.layers[0].experts_down_EDF  # values and scales both split by expert
    for a in (leaf.values, leaf.scales):
        assert a.sharding.shard_shape(a.shape)[:2] == (1, MOE.num_experts // 2)
    assert _tokens(engine) == _alone(MOE, quant)


def test_grouped_experts_read_the_chosen_experts_only():
    """`model.moe.expert_products` on experts placed at ep=4 equals one device's, with the experts nobody chose
    NaN (a product, gather or sum of an unchosen expert would turn the output NaN), at decode and prefill sizes."""
    import numpy as np

    from model import moe

    layout = make_layout(parse_mesh("ep=4"))
    lp = jax.tree_util.tree_map(jnp.asarray, init_params(MOE, seed=0)).layers[0]
    rng = np.random.default_rng(0)
    products = jax.jit(moe.expert_products, static_argnums=4)
    for n_tok in (1, 2, 9):
        x = jnp.asarray(rng.standard_normal((n_tok, MOE.hidden_size)), jnp.float32)
        idx, w = moe.route(lp, MOE, x)
        chosen = np.zeros(MOE.num_experts, bool)
        chosen[np.asarray(idx).ravel()] = True
        poisoned = dataclasses.replace(lp, **{f: jnp.where(jnp.asarray(chosen)[:, None, None], getattr(lp, f), jnp.nan)
                                              for f in moe_fields()})  # fmt: skip
        grouped = group_layer(poisoned, MOE, 0, 1, 4)
        placed = dataclasses.replace(grouped, **{f: jax.device_put(getattr(grouped, f), layout.sharding(P("ep")))
                                                 for f in moe_fields()})  # fmt: skip
        got = np.asarray(products(placed, x, idx, w, MOE.num_experts))
        want = np.asarray(products(lp, x, idx, w, MOE.num_experts))
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("quant", ["w4:16", "w8"])
def test_grouped_quantized_experts_equal_one_devices_products(quant):
    """The same at ep=2 with quantized experts (`make test`'s quick form of the heavy token test above): values and
    scales split by expert, the product equal to one device's."""
    import numpy as np

    from model import moe
    from model.sharding import leaf_shardings

    layout = make_layout(parse_mesh("ep=2"))
    params = jax.tree_util.tree_map(jnp.asarray, init_params(MOE, seed=0))
    lp = quantize_params(params, parse_quant(quant), scale_dtype=jnp.float32).layers[1]
    grouped = group_layer(lp, MOE, 1, 1, 2)
    placed = dataclasses.replace(grouped, **{f: jax.device_put(getattr(grouped, f),
                                                               leaf_shardings(f, getattr(grouped, f), layout))
                                             for f in moe_fields()})  # fmt: skip
    for f in moe_fields():
        for a in (getattr(placed, f).values, getattr(placed, f).scales):
            assert a.sharding.shard_shape(a.shape)[:2] == (1, MOE.num_experts // 2)
    products = jax.jit(moe.expert_products, static_argnums=4)
    rng = np.random.default_rng(1)
    for n_tok in (1, 9):
        x = jnp.asarray(rng.standard_normal((n_tok, MOE.hidden_size)), jnp.float32)
        idx, w = moe.route(lp, MOE, x, layer=1)
        np.testing.assert_allclose(np.asarray(products(placed, x, idx, w, MOE.num_experts)),
                                   np.asarray(products(lp, x, idx, w, MOE.num_experts)), rtol=1e-6, atol=1e-6)


def moe_fields() -> tuple[str, ...]:
    from model.accounting import EXPERT_LEAVES

    return EXPERT_LEAVES


def test_each_device_reads_its_experts_and_the_prediction_counts_the_same_bytes(monkeypatch, tmp_path):
    """Dummy tiny-moe weights with balanced routing loaded at ep=2 (`load_engine`, as `--checkpoint random:tiny-moe
    --mesh ep=2` with GEMMA4_BENCH_EXPERT_ROUTING=balanced): each device reads ceil(3 / 2) = 2 experts per layer
    of its own (the placed shards, `device_steps`), what `model.placement.device_share` predicts, byte for byte,
    and the step's only collectives are the per-layer all-reduce of the [1, D] float32 combine it counts."""
    from model.placement import ONE_DEVICE, device_share
    from model.random_weights import ROUTING_ENV

    monkeypatch.setenv("GEMMA4_BENCH_CACHE", str(tmp_path))
    monkeypatch.setenv(ROUTING_ENV, "balanced")
    engine, _ = load_engine("random:tiny-moe", policy=decide_policy("float32"), max_length=64, log_policy=False,
                            mesh=parse_mesh("ep=2"))  # fmt: skip
    assert engine.cfg == BALANCED_MOE and engine.layout.ep == 2
    share = device_share(BALANCED_MOE, parse_mesh("ep=2"), itemsize=4, context=16, scale_itemsize=4)
    assert share.experts_read == 2 and share.experts_worst == 3
    steps = device_steps(engine, len(PROMPTS[0]), NEW)
    assert [s.weight_bytes for s in steps] == [share.decode_weight_bytes] * 2
    alone = device_share(BALANCED_MOE, ONE_DEVICE, itemsize=4, context=16)
    assert share.decode_weight_bytes == alone.decode_weight_bytes - MOE.num_layers * share.expert_slice_bytes
    one = jax.tree_util.tree_map(jnp.asarray, init_params(MOE, seed=0))  # one device: top_k = 3 experts per layer
    reads = device_weight_bytes(one, jax.devices()[0], routed_experts(BALANCED_MOE, None))
    assert reads == alone.decode_weight_bytes
    (combine,) = share.collectives
    assert steps[0].collective_bytes == {"all-reduce": combine.count * combine.payload}
    assert steps[0].collectives == {"all-reduce": MOE.num_layers}


def _slot_tokens(engine: Engine) -> list[list[int]]:
    """Greedy tokens of decode slots (`model.slots.SlotDecoder`, 4 slots): the first prompt joins, steps twice, the
    second joins another row, three steps, the first leaves, two more; each step's tokens of every row."""
    from model.sampling import Sampling

    slots = engine.slot_decoder(4, 32)
    slots.prefill(0, PROMPTS[0], 10, Sampling())
    out = [slots.step() for _ in range(2)]
    slots.prefill(2, PROMPTS[1], 10, Sampling())
    out += [slots.step() for _ in range(3)]
    slots.free(0)
    out += [slots.step() for _ in range(2)]
    return [[int(t) for t in row] for row in out]


def test_decode_slots_over_a_mesh_give_one_devices_tokens():
    """`bench serve --max-batch` over `--mesh tp=2`: the slots' batched cache holds the mesh's KV heads, placed as
    the prefill's row cache (rows joining and leaving, the row-subset step and the whole-batch step)."""
    assert _slot_tokens(_engine(TINY, "tp=2")) == _slot_tokens(_engine(TINY, None))
