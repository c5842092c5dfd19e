"""A device mesh for the engine: the same parameter and KV-cache pytrees placed over several devices with
`jax.sharding` (docs/engine.md, "Several devices").

Key: D model width, N query heads, K KV heads (per layer), H head dim (per layer), F feed-forward width (per layer),
V vocabulary, G = tp groups (one per device along the mesh's "tp" axis; under ep, one per device along "ep"), Kd
KV heads a group holds, E experts.

The collectives are GSPMD's: the parameters and the KV cache are placed with `NamedSharding`s, the engine's jitted
programs receive them as committed arguments (their input shardings), constrain the KV cache they return to its
sharding (`MeshLayout.constrain_cache`: the output shardings), and XLA's SPMD partitioner inserts the all-reduces
and gathers the placement implies. Not `shard_map`: the forward pass stays one program for one device and for a
mesh (the same `model.forward` functions, no per-device code to keep equal to them), and the only forward changes
are the grouped layouts of the two fused weights (tp) and of the expert leaves (ep) below. The price: what XLA communicates is read from the compiled
program (`collective_bytes`), not written down by us.

Tensor parallel (tp = G), Megatron's split: each device holds the query heads N/G of its group and the KV heads
they read, and the MLP width F/G; the products that read them need no communication, and the two products back
to the residual stream (`o_DX` by its input, the heads; `down_DF` by its input, F) sum partial products with one
all-reduce of [B, T, D] each per layer.
- The fused weights `qkv_DX` [D, (N + 2K) H] and `gate_up_DX` [D, 2F] hold their parts side by side: an even cut
  of their columns would not follow heads or pair gate with up. On a mesh they are held grouped, [D, G, X/G]
  (`group_layer`; `model.layers.project_qkv` and `layer_tail` read either form), group g holding its query heads,
  its KV heads, and gate_g | up_g; the G axis is sharded.
- KV heads: split when G divides K (each device K/G heads of the cache); copied when K divides G (each device the
  one KV head its query heads read: G/K copies of each, made at placement: the KV projection weights and the cache
  of that head are held G/K times over the mesh, every device computing only its own); refused otherwise
  (`check_mesh`; the rule is `model.placement.kv_heads_per_device`, the inspector's). E2B's one KV head at tp = 2
  is copied: each device holds the whole (one-head) cache.
- The tied embedding table (and the int8 head copy) is split by vocabulary rows: it is the largest leaf a decode
  step reads whole (the logits), so splitting it divides the step's largest read; the input lookup becomes a
  masked gather of one row per device and a small all-reduce of [B, T, D], and the greedy argmax a reduction over
  the vocabulary shards. The PLE table is split by rows for memory (E2B: 4.7 GB in bfloat16); a step reads one
  row of it (an all-reduce of [B, T, L P]).
- Replicated on every device: the norms, layer scalars, the PLE projection and gates (`ple_proj_DX`, per-layer
  `ple_gate_PD`, `ple_proj_PD`: 27.5M scalars on E2B, read every step; split, each layer would add a collective
  to save that little).
- Quantized leaves (`model.quant.QuantArray`) are split along the same logical axis as their dense form: the
  values (int4 packed two per byte along the last axis, which cuts at whole heads since H is even) and the scales
  where they vary along that axis and divide evenly; scales of one value along it (w8's per-output scales of a
  product split by its input) are replicated.
Under tp the expert leaves of 26B-A4B are replicated (every device reads the chosen experts whole; the inspector's
tp prediction splits their width, which this placement does not do yet).

Expert parallel (ep = G, a model with experts; not together with tp: `model.placement.parse_mesh` takes one axis):
- Each expert leaf (`experts_gate_up_EDX`, `experts_down_EDF`; a `QuantArray`'s values and scales alike, w8 and w4)
  is held grouped, [G, E/G, ...] (`group_layer`, `model.moe.group_expert_leaf`: experts dealt in turn, device g
  holding experts g, g + G, ...), its G axis sharded over "ep" (`EP_SPLIT`): each device holds E/G whole experts.
  Everything else is replicated: every device computes the router, the attention and the dense MLP itself.
- The expert block (`model.moe.grouped_expert_products`) walks each device's chosen experts, reading one slice of
  its own experts per trip (a gather batched over the sharded G axis: no weight moves), and sums the groups'
  partial outputs in float32 over G. XLA's partitioner turns that sum into the block's one collective: an
  all-reduce of the [N, D] float32 output per layer (the combine; `collective_bytes` reads it from the compiled
  step). Why an all-reduce and not an all-to-all of tokens: every device already holds every token (the rest is
  replicated), so only the partial sums must meet. The walk's trip count, the largest device's number of chosen
  experts, is computed from the replicated router output on every device (no collective for it).
- The KV cache and the tables are replicated (the cache sharding's "tp" axis has size 1).

The mesh's text, its checks against the model and the KV-head rule are `model.placement`'s (the inspector predicts
a mesh from the same facts); this module places arrays.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from model import placement
from model.accounting import EXPERT_LEAVES, has_v_projection
from model.config import ModelConfig
from model.errors import MeshError
from model.placement import Mesh, kv_heads_per_device

MESH_AXES = ("ep", "tp")
"""The `jax.sharding.Mesh`'s axis names, outermost first: expert parallel, tensor parallel (one of them of size 1:
`model.placement.Mesh` is one axis)."""


def parse_mesh(text: str) -> Mesh:
    """The `model.placement.Mesh` of a `--mesh` text ("tp=2", "ep=4": `model.placement.parse_mesh`, the one parser
    the inspector and the engine share). Raises MeshError (its one line) for anything else."""
    try:
        return placement.parse_mesh(text)
    except ValueError as exc:
        raise MeshError(str(exc)) from None


def check_mesh(cfg: ModelConfig, mesh: Mesh) -> None:
    """Raises MeshError (one line, with the numbers) for a mesh the engine cannot place `cfg` over: what
    `model.placement.check_mesh` refuses (tp must divide the query heads, the vocabulary, every MLP width and the
    experts' width, and each layer's KV heads must divide tp or be divided by it; ep needs experts it divides), a
    tp that does not divide the PLE vocabulary (its table is split by rows here). Before anything loads."""
    try:
        placement.check_mesh(cfg, mesh)
    except ValueError as exc:
        raise MeshError(str(exc)) from None
    if cfg.ple_dim and cfg.ple_vocab % mesh.tp:
        raise MeshError(f"--mesh {mesh.text}: {mesh.tp} does not divide the model's PLE vocabulary rows "
                        f"({cfg.ple_vocab})")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MeshLayout:
    """A `model.placement.Mesh` over real devices: the `jax.sharding.Mesh` (axes `MESH_AXES`, shape (ep, tp)).
    Hashable: the engine's programs take it as a static argument (None: one device, the programs as before)."""

    spec: Mesh
    mesh: jax.sharding.Mesh

    @property
    def tp(self) -> int:
        return self.spec.tp

    @property
    def ep(self) -> int:
        return self.spec.ep

    def cache_heads(self, cfg: ModelConfig, layer: int) -> int:
        """KV heads of `layer`'s cache buffer on the mesh: G x Kd (`model.placement.kv_heads_per_device`): K when tp
        divides K, else tp (one copy per device)."""
        return self.tp * kv_heads_per_device(cfg, layer, self.tp)

    def sharding(self, spec: P) -> NamedSharding:
        """`NamedSharding` of `spec` over this mesh."""
        return NamedSharding(self.mesh, spec)

    @property
    def cache_sharding(self) -> NamedSharding:
        """A cache buffer [B, K, S, H]: split by KV head along "tp"."""
        return self.sharding(P(None, "tp", None, None))

    def constrain_cache(self, cache):
        """`cache` (a `model.cache.KVCache`) constrained to its shardings inside a program: k and v by KV head, the
        length replicated."""
        rep = self.sharding(P())
        return dataclasses.replace(
            cache,
            k=tuple(jax.lax.with_sharding_constraint(x, self.cache_sharding) for x in cache.k),
            v=tuple(jax.lax.with_sharding_constraint(x, self.cache_sharding) for x in cache.v),
            length=jax.lax.with_sharding_constraint(cache.length, rep),
        )


def make_layout(spec: Mesh, devices: Sequence | None = None) -> MeshLayout:
    """The `MeshLayout` of `spec` (a `model.placement.Mesh`) over the first `spec.size` of `devices` (default
    `jax.devices()`). Raises MeshError (one line) when there are fewer devices than that."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < spec.size:
        platform = devices[0].platform if devices else "?"
        raise MeshError(f"--mesh {spec.text} needs {spec.size} devices, and {len(devices)} {platform} device(s) "
                        "are here (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N before jax starts "
                        "makes N)")  # fmt: skip
    grid = np.array(devices[: spec.size], dtype=object).reshape(spec.ep, spec.tp)
    return MeshLayout(spec=spec, mesh=jax.sharding.Mesh(grid, MESH_AXES))


def prepare_mesh(spec: Mesh, cfg: ModelConfig, backend: str, kernel: str | None) -> tuple[MeshLayout, str]:
    """(the `MeshLayout` of `spec`, the w4 kernel choice to load with: "xla") for `model.engine.load_engine`,
    before the weights load. A mesh runs the pure-JAX engine with XLA's products: raises MeshError (one line) for
    another backend (`backend`, `model.backends`: its kernels run on one device), for `kernel` "pallas" (the W4A16
    kernel is not partitioned over a mesh), and as `check_mesh` and `make_layout`."""
    if backend != "jax":
        raise MeshError(f"--mesh {spec.text}: the {backend!r} backend's kernels run on one device; a mesh runs the "
                        "pure-JAX engine (drop the option that chose that backend)")  # fmt: skip
    if kernel is not None and kernel.partition(":")[0] == "pallas":  # "pallas" or "pallas:POLICY"
        raise MeshError(f"--mesh {spec.text}: the W4A16 Pallas kernel is not partitioned over a mesh; use "
                        "--kernel w4a16=xla or drop --kernel")  # fmt: skip
    check_mesh(cfg, spec)
    return make_layout(spec), "xla"


# ---- the grouped layout of the fused weights -------------------------------------------------------------------
def qkv_columns(cfg: ModelConfig, layer: int, tp: int, own_kv: bool) -> np.ndarray:
    """Columns of `qkv_DX` [D, (N + 2K) H] (KV-shared: [D, N H]) each tp group holds, [G, X/G'] int: group g its
    query heads g N/G .. (g+1) N/G - 1, then the keys and values of its Kd KV heads
    (`model.placement.kv_heads_per_device`: heads g Kd .. when tp divides K, else head g // (G / K)); a K = V layer
    (`model.accounting.has_v_projection` False) holds no value columns."""
    n, h, k = cfg.num_heads, cfg.layer_head_dim(layer), cfg.kv_heads(layer)
    nq, kd = n // tp, kv_heads_per_device(cfg, layer, tp)
    k_eq_v = not has_v_projection(cfg, layer)
    groups = []
    for g in range(tp):
        cols = list(range(g * nq * h, (g + 1) * nq * h))
        if own_kv:
            heads = range(g * kd, (g + 1) * kd) if k % tp == 0 else [g // (tp // k)]
            for base in (n * h,) if k_eq_v else (n * h, (n + k) * h):  # keys, then values
                for j in heads:
                    cols.extend(range(base + j * h, base + (j + 1) * h))
        groups.append(cols)
    return np.asarray(groups, np.int64)


def gate_up_columns(f: int, tp: int) -> np.ndarray:
    """Columns of `gate_up_DX` [D, 2F] each tp group holds, [G, 2F/G]: its gate columns then the same up columns."""
    fg = f // tp
    return np.asarray([list(range(g * fg, (g + 1) * fg)) + list(range(f + g * fg, f + (g + 1) * fg))
                       for g in range(tp)], np.int64)  # fmt: skip


def _take_grouped(w, cols_GX: np.ndarray):
    """A 2-D weight [D, X] (dense, or a `model.quant.QuantArray` with one scale per column block of 1) as
    [D, G, X'] holding columns `cols_GX` [G, X']."""
    from model.quant import QuantArray

    g, x = cols_GX.shape
    flat = cols_GX.reshape(-1)
    if not isinstance(w, QuantArray):
        return jax.numpy.take(w, flat, axis=1).reshape(w.shape[0], g, x)
    if w.tiling is not None or w.words or w.block[1] != 1:
        raise MeshError(f"a quantized projection stored with tiling {w.tiling}, words {w.words}, block {w.block} "
                        "cannot be grouped for a mesh; use --kernel w4a16=xla")  # fmt: skip
    values = w.values
    if w.bits == 4:  # two columns per byte along the last axis: groups cut at whole heads (H even)
        assert not (flat[0::2] % 2).any() and (flat[1::2] == flat[0::2] + 1).all(), "columns not in byte pairs"
        values = jax.numpy.take(values, flat[0::2] // 2, axis=1).reshape(values.shape[0], g, x // 2)
    else:
        values = jax.numpy.take(values, flat, axis=1).reshape(values.shape[0], g, x)
    scales = w.scales
    if scales.shape[1] == 1:
        scales = jax.numpy.broadcast_to(scales, (scales.shape[0], len(flat)))
    scales = jax.numpy.take(scales, flat, axis=1).reshape(scales.shape[0], g, x)
    return QuantArray(values=values, scales=scales, shape=(w.shape[0], g, x), bits=w.bits,
                      block=(w.block[0], 1, 1))  # fmt: skip


def group_layer(lp, cfg: ModelConfig, layer: int, tp: int, ep: int = 1):
    """Layer `layer`'s `model.params.LayerParams` with `qkv_DX` and `gate_up_DX` grouped for `tp` devices
    ([D, G, X/G], `qkv_columns`, `gate_up_columns`) and, for `ep` > 1, the expert leaves grouped for `ep` devices
    ([ep, E/ep, ...], `model.moe.group_expert_leaf`: device g holds experts g, g + ep, ...); the other leaves as
    they are."""
    from model.moe import group_expert_leaf

    own_kv = lp.k_norm_H is not None
    qkv = _take_grouped(lp.qkv_DX, qkv_columns(cfg, layer, tp, own_kv))
    gate_up = _take_grouped(lp.gate_up_DX, gate_up_columns(lp.gate_up_DX.shape[-1] // 2, tp))
    experts = {}
    if ep > 1:
        experts = {f: group_expert_leaf(getattr(lp, f), ep) for f in EXPERT_LEAVES}
    return dataclasses.replace(lp, qkv_DX=qkv, gate_up_DX=gate_up, **experts)


# ---- placement ---------------------------------------------------------------------------------------------------
SPLIT_AXIS = {"embed_VD": 0, "lm_head_VD": 0, "ple_embed_VX": 0, "qkv_DX": 1, "gate_up_DX": 1, "o_DX": 1,
              "down_DF": 1}  # fmt: skip
"""The logical axis each split leaf is cut along over "tp" (the module docstring says why); every other leaf is
replicated."""
EP_SPLIT = dict.fromkeys(EXPERT_LEAVES, 0)
"""The axis each expert leaf, grouped ([ep, E/ep, ...], `group_layer`), is cut along over "ep": its group axis, so
each device holds E/ep whole experts (values and scales alike); everything else is replicated under ep."""


def _spec(shape: tuple[int, ...], axis: int | None, n: int, name: str = "tp") -> P:
    """`axis` of an array of `shape` over mesh axis `name` of `n` devices when it divides evenly (and is longer
    than 1), else replicated."""
    if axis is None or shape[axis] < 2 or shape[axis] % n:
        return P()
    return P(*([None] * axis + [name]))


def leaf_shardings(field: str, leaf, layout: MeshLayout):
    """The sharding(s) of one parameter leaf (`SPLIT_AXIS` over "tp", `EP_SPLIT` over "ep"): a `NamedSharding`,
    or for a `model.quant.QuantArray` the same leaf with a sharding in place of its values and of its scales (a
    pytree of the leaf's structure)."""
    from model.quant import QuantArray

    axis, n, name = SPLIT_AXIS.get(field), layout.tp, "tp"
    if layout.ep > 1:
        axis, n, name = EP_SPLIT.get(field), layout.ep, "ep"
    if isinstance(leaf, QuantArray):
        return dataclasses.replace(leaf, values=layout.sharding(_spec(leaf.values.shape, axis, n, name)),
                                   scales=layout.sharding(_spec(leaf.scales.shape, axis, n, name)))  # fmt: skip
    return layout.sharding(_spec(tuple(leaf.shape), axis, n, name))


def place_params(params, cfg: ModelConfig, layout: MeshLayout):
    """`params` (a `model.params.Params`) on the mesh: each layer grouped (`group_layer`), every leaf placed with
    its `leaf_shardings`, one leaf at a time. Returns the placed tree (the originals are left to the caller: the
    engine drops them, so the peak is the one-device tree plus the placed one)."""

    def put(field: str, leaf):
        if leaf is None:
            return None
        placed = jax.tree_util.tree_map(_put, leaf, leaf_shardings(field, leaf, layout))
        jax.block_until_ready(placed)
        return placed

    layers = tuple(
        dataclasses.replace(g, **{f.name: put(f.name, getattr(g, f.name)) for f in dataclasses.fields(g)})
        for g in (group_layer(lp, cfg, i, layout.tp, layout.ep) for i, lp in enumerate(params.layers))
    )
    top = {f.name: put(f.name, getattr(params, f.name)) for f in dataclasses.fields(params) if f.name != "layers"}
    return dataclasses.replace(params, layers=layers, **top)


def _put(x, sharding: NamedSharding):
    """Array `x` (this process's whole copy, on one of its devices) placed with `sharding`: `jax.device_put` where
    the sharding's devices are all this process's; under jax.distributed (a mesh over several processes' devices)
    each process makes the shards of its own devices from its copy (`jax.make_array_from_single_device_arrays`),
    every process holding the same `x` (the same checkpoint, or random weights of the same seed)."""
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    index = sharding.addressable_devices_indices_map(tuple(x.shape))
    shards = [jax.device_put(x[i], d) for d, i in index.items()]
    return jax.make_array_from_single_device_arrays(tuple(x.shape), sharding, shards)


# ---- what each device does -------------------------------------------------------------------------------------
def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


def _shard_bytes(x, device) -> tuple[int, int]:
    """(bytes, rows) of array `x`'s shard on `device` ((0, 0) where it holds none); a `model.quant.QuantArray`:
    values plus scales, rows of its values. Read from `x`'s sharding (`devices_indices_map`: the slice of `x` each
    device of the sharding holds), not from its buffers: under jax.distributed a process holds only its own
    devices' shards, and the sharding says every device's (on one process the same figures as its shards')."""
    from model.quant import QuantArray

    if isinstance(x, QuantArray):
        vb, rows = _shard_bytes(x.values, device)
        sb, _ = _shard_bytes(x.scales, device)
        return vb + sb, rows
    index = x.sharding.devices_indices_map(tuple(x.shape)).get(device)
    if index is None:
        return 0, 0
    shape = tuple(len(range(*part.indices(n))) for part, n in zip(index, x.shape, strict=True))
    return math.prod(shape) * _itemsize(x.dtype), (shape[0] if shape else 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceStep:
    """What one device does in one decode step (docs/method.md, "Several devices"): `device` (its jax id),
    `weight_bytes` (the parameter bytes it reads: the shard of every leaf read whole, one row of its shard of each
    gathered table), `kv_bytes` (its KV cache shard the attention reads: every layer's KV source buffer, masked
    slots included, as `model.accounting.kv_read_bytes`), `collective_bytes` ({op: bytes} of the step's
    collectives, `collective_bytes`), `collectives` ({op: count})."""

    device: int
    weight_bytes: int
    kv_bytes: int
    collective_bytes: dict[str, int]
    collectives: dict[str, int]

    @property
    def total(self) -> int:
        """Bytes the device reads: weights + KV cache."""
        return self.weight_bytes + self.kv_bytes


def _expert_read_bytes(x, device, experts: int) -> int:
    """Bytes of `experts` of the experts `device` holds of expert leaf `x` ([E, ...], or grouped for ep
    [G, E/G, ...]: its shard [1, E/G, ...]): its shard's bytes / the experts in it x `experts`."""
    held = x.values if _is_quant(x) else x
    index = held.sharding.devices_indices_map(tuple(held.shape)).get(device)  # as `_shard_bytes`: every process's
    if index is None:
        return 0
    axis = 1 if len(x.shape) == 4 else 0
    count = len(range(*index[axis].indices(held.shape[axis])))
    return _shard_bytes(x, device)[0] // count * min(experts, count)


def device_weight_bytes(params, device, experts: int | Sequence[int] | None = None) -> int:
    """Parameter bytes `device` reads in a decode step of one row: its shard of every leaf a step reads whole
    (the logits read the head, `lm_head_VD` when there is one, else the tied `embed_VD`), plus one row of its shard
    of each gathered table (the input embedding row, the PLE row), as `model.accounting.decode_reads` counts them
    for one device; of each expert leaf (`model.accounting.EXPERT_LEAVES`) `experts` of the experts it holds (per
    layer: one count, or one per layer; `model.placement.experts_on_slowest` says how many the engine reads; None:
    every expert it holds)."""
    total = 0
    for field in dataclasses.fields(params):
        leaf = getattr(params, field.name)
        if field.name == "layers":
            for i, lp in enumerate(leaf):
                n = experts if experts is None or isinstance(experts, int) else experts[i]
                for f in dataclasses.fields(lp):
                    x = getattr(lp, f.name)
                    if x is None:
                        continue
                    if f.name in EXPERT_LEAVES and n is not None:
                        total += _expert_read_bytes(x, device, n)
                    else:
                        parts = jax.tree_util.tree_leaves(x, is_leaf=_is_quant)
                        total += sum(_shard_bytes(y, device)[0] for y in parts)
        elif leaf is None:
            continue
        elif field.name in ("embed_VD", "ple_embed_VX"):
            b, rows = _shard_bytes(leaf, device)
            total += b // rows if rows else 0  # one row
            if field.name == "embed_VD" and params.lm_head_VD is None:
                total += b  # the tied table read whole by the logits
        else:
            total += _shard_bytes(leaf, device)[0]
    return total


def device_held_bytes(params, device) -> int:
    """Parameter bytes placed on `device`: its shard of every leaf (values plus scales of a quantized leaf), the
    memory its weights take (`device_weight_bytes` counts what a step reads, one row of the tables)."""
    leaves = jax.tree_util.tree_leaves(params, is_leaf=_is_quant)
    return sum(_shard_bytes(x, device)[0] for x in leaves if x is not None)


def device_kv_bytes_per_row(cfg: ModelConfig, tp: int, cache_len: int, itemsize: int) -> int:
    """Bytes of one row's KV cache on each device of a tp mesh, at `cache_len` positions of `itemsize` bytes: every
    layer that owns K/V, 2 x slots x its `kv_heads_per_device` x H (the buffers `model.cache.init_cache` makes
    with a layout, split by KV head; `model.accounting.kv_cache_bytes` at tp 1)."""
    from model.accounting import slots

    return sum(2 * slots(cfg, i, cache_len) * kv_heads_per_device(cfg, i, tp) * cfg.layer_head_dim(i) * itemsize
               for i in cfg.cache_layers)  # fmt: skip


def _is_quant(x) -> bool:
    from model.quant import QuantArray

    return isinstance(x, QuantArray)


_COLLECTIVE = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<start>-start)?\(")
_ARRAY = re.compile(r"(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64)\[([\d,]*)\]")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64,
         "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64}  # fmt: skip
COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
"""The HLO collectives counted (their asynchronous -start forms included, their -done forms not)."""


def collective_bytes(hlo_text: str) -> tuple[dict[str, int], dict[str, int]]:
    """({op: bytes}, {op: count}) of the collectives in a compiled (partitioned) HLO module's text, by op of
    `COLLECTIVE_OPS`: each collective's result as one device holds it (a tuple's arrays summed; an async -start's
    last array, its result), so all-reduce counts the reduced array, all-gather the gathered one. Each op counts
    once per appearance (a program with loops: once per loop body, not per trip; the decode step has none)."""
    sizes = dict.fromkeys(COLLECTIVE_OPS, 0)
    counts = dict.fromkeys(COLLECTIVE_OPS, 0)
    for line in hlo_text.splitlines():
        m = _COLLECTIVE.search(line)
        if m is None:
            continue
        arrays = [(t, [int(d) for d in dims.split(",") if d]) for t, dims in _ARRAY.findall(m.group("shape"))]
        if m.group("start"):
            arrays = arrays[-1:]
        sizes[m.group("op")] += sum(-(-math.prod(dims) * _BITS[t] // 8) for t, dims in arrays)
        counts[m.group("op")] += 1
    return sizes, counts


def decode_program_text(engine, n_tokens: int, max_new_tokens: int, batch: int = 1) -> str:
    """The compiled HLO text of `engine`'s greedy decode step at the compiled shape of `n_tokens` (bucket +
    max_new_tokens cache positions) and `batch` rows: lowered and compiled from abstract arguments (nothing runs;
    the compile is XLA's, cached as any; `model.engine.Engine.lower_decode`, so this module never imports the
    engine, which imports it)."""
    from model.accounting import slots
    from model.cache import KVCache
    from model.policy import DTYPES

    cfg, layout = engine.cfg, engine.layout
    cache_len = engine.bucket_for(n_tokens) + max_new_tokens
    kv_dtype = DTYPES[engine.policy.kv_dtype]
    cache_sharding = layout.cache_sharding if layout else None
    rep = layout.sharding(P()) if layout else None

    def buf(i):
        heads = layout.cache_heads(cfg, i) if layout else cfg.kv_heads(i)
        shape = (batch, heads, slots(cfg, i, cache_len), cfg.layer_head_dim(i))
        return jax.ShapeDtypeStruct(shape, kv_dtype, sharding=cache_sharding)

    cache = KVCache(k=tuple(buf(i) for i in cfg.cache_layers), v=tuple(buf(i) for i in cfg.cache_layers),
                    length=jax.ShapeDtypeStruct((), np.int32, sharding=rep))  # fmt: skip
    token = jax.ShapeDtypeStruct((batch,), np.int32, sharding=rep)
    return engine.lower_decode(cache, token, rows=batch).compile().as_text()


def routed_experts(cfg: ModelConfig, layout: MeshLayout | None, routed=None) -> tuple[int, ...]:
    """Experts per layer each device reads in a decode step of one row (`model.placement.experts_on_slowest`, one
    count per layer): from `routed` (per layer, the expert ids the step chose) when given; else for balanced routing
    (`cfg.expert_routing`, dummy weights) the ids it routes a decode step of one token to
    (`model.moe.balanced_experts`, the engine's own function); else (a trained router, whose choice this does not
    read back) top_k under the balanced assumption. () without experts."""
    if not cfg.num_experts:
        return ()
    spec = layout.spec if layout else placement.ONE_DEVICE
    if routed is None and cfg.expert_routing == "balanced":
        from model.moe import balanced_experts

        routed = [np.asarray(balanced_experts(1, cfg.top_k_experts, cfg.num_experts, i)).ravel().tolist()
                  for i in range(cfg.num_layers)]  # fmt: skip
    if routed is None:
        return (placement.experts_on_slowest(cfg, spec, cfg.top_k_experts),) * cfg.num_layers
    return tuple(placement.experts_on_slowest(cfg, spec, list(ids)) for ids in routed)


def device_steps(engine, n_tokens: int, max_new_tokens: int, routed=None) -> list[DeviceStep]:
    """One `DeviceStep` per device of `engine`'s mesh (one device without a mesh) for a greedy decode step of one
    row at the compiled shape of `n_tokens` prompt tokens and `max_new_tokens` new ones: weight bytes from the
    placed leaves' shards (`device_weight_bytes`; of the expert leaves, the experts each device reads:
    `routed_experts`, `routed` as it takes), KV bytes from the cache's sharding (each device its `Kd` heads
    of every layer's KV source buffer; a copied head counts on each device that reads it), collectives from the
    compiled decode program (`decode_program_text`, `collective_bytes`). Compiles the decode program if it was not
    compiled at that shape. Raises EngineError as `Engine.check_request`."""
    from model.accounting import slots
    from model.policy import DTYPES

    cfg, layout = engine.cfg, engine.layout
    engine.check_request(n_tokens, max_new_tokens)
    positions = engine.decode_positions(n_tokens, max_new_tokens)
    itemsize = _itemsize(DTYPES[engine.policy.kv_dtype])
    tp = layout.tp if layout else 1
    kv = 0
    for i in range(cfg.num_layers):
        src = cfg.kv_source(i)
        kd = kv_heads_per_device(cfg, src, tp) if layout else cfg.kv_heads(src)
        kv += 2 * slots(cfg, src, positions) * kd * cfg.layer_head_dim(src) * itemsize
    sizes, counts = collective_bytes(decode_program_text(engine, n_tokens, max_new_tokens)) if layout else ({}, {})
    devices = list(layout.mesh.devices.flat) if layout else [_device_of(engine.params)]
    experts = routed_experts(cfg, layout, routed) or None
    return [DeviceStep(device=d.id, weight_bytes=device_weight_bytes(engine.params, d, experts), kv_bytes=kv,
                       collective_bytes={k: v for k, v in sizes.items() if counts[k]},
                       collectives={k: v for k, v in counts.items() if v}) for d in devices]  # fmt: skip


def _device_of(params):
    """The device of a one-device parameter tree (its tied table's)."""
    return next(iter(params.embed_VD.devices()))


__all__ = ["COLLECTIVE_OPS", "DeviceStep", "EP_SPLIT", "MESH_AXES", "MeshLayout", "SPLIT_AXIS", "check_mesh",
           "collective_bytes", "decode_program_text", "device_held_bytes", "device_kv_bytes_per_row", "device_steps",
           "device_weight_bytes", "gate_up_columns", "group_layer", "leaf_shardings", "make_layout", "parse_mesh",
           "place_params", "prepare_mesh", "qkv_columns", "routed_experts"]  # fmt: skip
