"""The bytes each device of a mesh holds and reads in a decode step, and the collectives between them, as
arithmetic on the model's shapes (`model.accounting`): no jax, so the inspector can predict a mesh no machine here
has (docs/method.md, "Predicting a mesh").

A mesh is one axis (`Mesh`): tensor parallel `tp=N` or expert parallel `ep=N`. The placement it assumes:

- **tp=N**: query heads split N ways (the qkv and output projections by head); each layer's KV heads split when
  N divides them, else each device holds the one KV head its query heads read (N a multiple of the KV heads, the
  KV heads replicated N / K times); the MLP's width split (gate/up by output, down by input), and the experts' width
  likewise; the tied table (and its int8 copy, and the PLE table) split by vocabulary rows. Replicated on every
  device: the norms, the layer scalars, the router, the PLE projections. Per layer, the output projection and the
  MLP's down projection each end in an all-reduce of the [B, D] activations (a layer with experts: one more, for
  the experts' output, which is normalised apart from the MLP's); the input lookup of a vocabulary-split table is
  one all-reduce of its [B, D] (and [B, X] for the PLE table) rows; the greedy token is an argmax across the
  vocabulary shards: two all-gathers of [B, N] 4-byte values (each shard's best logit and its index). Sampling
  (temperature > 0) would gather more; the sweep decodes greedily.
- **ep=N** (a model with experts): the experts split N ways by expert, dealt in turn (device g holds experts g,
  g + N, g + 2N, ...: `model.moe.group_expert_leaf`); everything else replicated, every device computing the same
  router, attention and MLP. Per layer one all-reduce of the [B, D] expert output in float32 (each device's share
  of the chosen experts' sum; the engine combines in float32, `model.moe.grouped_expert_products`). What a device
  reads depends on the routing: the engine walks every device's chosen experts in the same number of trips, the
  largest device's count (`experts_on_slowest`), so each device reads that many experts per layer. The prediction
  assumes balanced routing (`ROUTING_ASSUMED`): ceil(n / N) of the n experts a step is routed to (what
  `--checkpoint random:` runs force: their n consecutive experts are dealt evenly); the worst case, a trained
  router sending all n to one device's experts, is min(n, E / N) (`DeviceShare.experts_worst`).

Collective bytes per device: a ring all-reduce of S bytes over N devices sends 2 (N - 1) / N x S per device, an
all-gather of S bytes in total (N - 1) / N x S (the textbook ring algorithms; XLA may pick others).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from model.accounting import (
    EXPERT_LEAVES,
    NATURAL,
    check_experts_read,
    compute_layer_shapes,
    global_shapes,
    has_v_projection,
    layer_leaves,
    leaf_bytes,
    slots,
)
from model.config import ModelConfig
from model.quantspec import LM_HEAD, NO_QUANT, QuantSpec

Shape = tuple[int, ...]
AXES = ("tp", "ep")
"""The mesh axes `parse_mesh` accepts: tensor parallel and expert parallel."""
ARGMAX_ITEMSIZE = 4
"""Bytes of each value the greedy argmax gathers across vocabulary shards: a float32 logit, an int32 index."""
COMBINE_ITEMSIZE = 4
"""Bytes of each value of the ep combine's all-reduce: the experts' partial outputs are summed in float32
(`model.moe.grouped_expert_products`), whatever the activations' dtype."""
ROUTING_ASSUMED = ("balanced routing, ceil(top_k / ep): dummy weights route so; a trained router's choice varies "
                   "per step")  # fmt: skip
"""The routing the ep prediction assumes, in words (the inspector prints it)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mesh:
    """One mesh axis: `axis` ("tp" or "ep") of `size` devices (size 1: one device, nothing split)."""

    axis: str = "tp"
    size: int = 1

    @property
    def text(self) -> str:
        """"tp=4"."""
        return f"{self.axis}={self.size}"

    @property
    def tp(self) -> int:
        """Devices the heads and widths are split over (1 under ep)."""
        return self.size if self.axis == "tp" else 1

    @property
    def ep(self) -> int:
        """Devices the experts are split over (1 under tp)."""
        return self.size if self.axis == "ep" else 1


ONE_DEVICE = Mesh()


def parse_mesh(text: str | None) -> Mesh:
    """`--mesh` text -> `Mesh`: "tp=4", "ep=8"; None -> one device. Raises ValueError (one line: what was received,
    what is expected) for another axis, a size below 1 or not a whole number, or two axes."""
    if text is None:
        return ONE_DEVICE
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) != 1:
        raise ValueError(f"--mesh {text}: expected one axis, tp=N or ep=N (a mesh of both is not planned yet)")
    axis, _, size = parts[0].partition("=")
    if axis not in AXES or not (size.isascii() and size.isdigit()) or int(size) < 1:
        raise ValueError(f"--mesh {text}: expected tp=N or ep=N with N a whole number of devices >= 1, e.g. tp=4")
    return Mesh(axis=axis, size=int(size))


def kv_heads_per_device(cfg: ModelConfig, layer: int, tp: int) -> int:
    """KV heads one device holds of `layer` under tp: K / tp when tp divides K, else 1 (tp a multiple of K: each
    device the head its query heads read)."""
    k = cfg.kv_heads(layer)
    return k // tp if k % tp == 0 else 1


def _tp_sizes(cfg: ModelConfig) -> list[tuple[str, int]]:
    """What tp must divide, (name, size): the query heads, the vocabulary, each MLP width, the experts' width."""
    sizes = [("query heads", cfg.num_heads), ("vocabulary rows", cfg.vocab_size)]
    sizes += [("MLP width", f) for f in sorted({cfg.ffw_dim(i) for i in range(cfg.num_layers)})]
    if cfg.num_experts:
        sizes.append(("expert width", cfg.moe_intermediate_size))
    return sizes


def _tp_fits(cfg: ModelConfig, n: int) -> bool:
    kv = {cfg.kv_heads(i) for i in range(cfg.num_layers)}
    return all(v % n == 0 for _, v in _tp_sizes(cfg)) and all(k % n == 0 or n % k == 0 for k in kv)


def valid_sizes(cfg: ModelConfig, axis: str, limit: int = 64) -> tuple[int, ...]:
    """The mesh sizes 1..`limit` of `axis` that `check_mesh` accepts for `cfg` (ep: () without experts)."""
    if axis == "ep":
        return tuple(n for n in range(1, limit + 1) if cfg.num_experts and cfg.num_experts % n == 0)
    return tuple(n for n in range(1, limit + 1) if _tp_fits(cfg, n))


def check_mesh(cfg: ModelConfig, mesh: Mesh) -> None:
    """Raises ValueError (one line with the numbers and the sizes that work) when `mesh` does not divide `cfg`:
    under tp the query heads, the vocabulary, the MLP widths and the experts' width, and every layer's KV heads
    (tp dividing them or a multiple of them); under ep the experts (and ep on a model without experts)."""
    n, text = mesh.size, mesh.text
    ok = ", ".join(map(str, valid_sizes(cfg, mesh.axis)))
    if mesh.axis == "ep":
        if not cfg.num_experts:
            raise ValueError(f"--mesh {text}: this model has no experts to split; expected tp=N")
        if cfg.num_experts % n:
            raise ValueError(f"--mesh {text}: {n} does not divide the model's {cfg.num_experts} experts; "
                             f"expected ep in {ok}")  # fmt: skip
        return
    for what, size in _tp_sizes(cfg):
        if size % n:
            raise ValueError(f"--mesh {text}: {n} does not divide the model's {what} ({size}); expected tp in {ok}")
    for k in sorted({cfg.kv_heads(i) for i in range(cfg.num_layers)}):
        if k % n and n % k:
            raise ValueError(f"--mesh {text}: {n} neither divides a layer's KV heads ({k}) nor is a multiple of "
                             f"them; expected tp in {ok}")  # fmt: skip


def experts_on_slowest(cfg: ModelConfig, mesh: Mesh, routed: int | Sequence[int]) -> int:
    """Experts per layer each device reads in a decode step (the engine's walk runs to the largest device's count:
    module docstring). `routed`: the expert ids one layer's step chose (the count the engine reads: max over
    devices g of the ids e with e mod ep == g, the dealt placement), or a count n of them (the balanced assumption,
    `ROUTING_ASSUMED`: ceil(n / ep)). Off ep: n (every device reads every chosen expert's shard)."""
    if isinstance(routed, int):
        return routed if mesh.ep == 1 else -(-routed // mesh.ep)
    if mesh.ep == 1:
        return len(routed)
    return max(sum(1 for e in routed if e % mesh.ep == g) for g in range(mesh.ep))


# ---- one device's share -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Collective:
    """Collectives of one kind in one decode step: kind ("all-reduce", "all-gather"), what they carry, count per
    step, payload (bytes of the whole array, e.g. [B, D] activations) and sent (bytes each device sends for one:
    ring all-reduce 2 (N - 1) / N x payload, all-gather (N - 1) / N x payload)."""

    kind: str
    what: str
    count: int
    payload: int
    sent: int

    @property
    def total_sent(self) -> int:
        """count x sent: the bytes each device sends for these in one step."""
        return self.count * self.sent


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceShare:
    """What one device of `mesh` holds and reads (module docstring), at `context` positions and `batch` rows.

    weight_bytes: the parameters placed on it (packed values + scales; the largest device's, all equal here);
    replicated_bytes: the part of them every device holds whole; replicated: those leaves, in words;
    decode_weight_bytes: weight bytes the slowest device reads in one decode step; experts_read: experts per
    layer it reads (under ep: balanced routing, `ROUTING_ASSUMED`); experts_worst: experts per layer the slowest
    device would read with every chosen expert on it (min(n, E / ep); = experts_read off ep); expert_slice_bytes:
    the bytes of one expert's slice of every expert leaf of one layer on it (0 without experts), so the worst case
    reads (experts_worst - experts_read) x layers x that more; layers: the model's; kv_bytes_per_row /
    kv_read_bytes_per_row: one row's KV cache held / read per step;
    collectives: one step's (`Collective`), empty on one device.
    """

    mesh: Mesh
    context: int
    batch: int
    weight_bytes: int
    replicated_bytes: int
    replicated: tuple[str, ...]
    decode_weight_bytes: int
    experts_read: int
    experts_worst: int
    expert_slice_bytes: int
    layers: int
    kv_bytes_per_row: int
    kv_read_bytes_per_row: int
    collectives: tuple[Collective, ...]

    @property
    def kv_bytes(self) -> int:
        """The batch's KV cache on this device: batch x kv_bytes_per_row."""
        return self.batch * self.kv_bytes_per_row

    @property
    def step_read_bytes(self) -> int:
        """Bytes the slowest device reads in one decode step: its weights read + every row's KV read."""
        return self.decode_weight_bytes + self.batch * self.kv_read_bytes_per_row

    @property
    def routing(self) -> str:
        """The routing the slowest device's expert reads assume, in words, with the worst case's bytes ("" off ep
        or without experts)."""
        if self.mesh.ep == 1 or not self.expert_slice_bytes:
            return ""
        return (f"experts: the slowest device reads {self.experts_read} per layer ({ROUTING_ASSUMED}); worst case, "
                f"every chosen expert on one device: {self.experts_worst} per layer, "
                f"{self.worst_decode_weight_bytes:,} bytes of weights")  # fmt: skip

    @property
    def worst_decode_weight_bytes(self) -> int:
        """`decode_weight_bytes` with every chosen expert on the slowest device (`experts_worst`)."""
        extra = (self.experts_worst - self.experts_read) * self.expert_slice_bytes * self.layers
        return self.decode_weight_bytes + extra

    @property
    def collective_bytes(self) -> int:
        """Bytes each device sends in the collectives of one step."""
        return sum(c.total_sent for c in self.collectives)


def _tp_layer_shape(cfg: ModelConfig, i: int, field: str, shape: Shape, tp: int) -> Shape | None:
    """The shard of layer leaf `field` one device holds under tp, None for a leaf it holds whole."""
    d, h = cfg.hidden_size, cfg.layer_head_dim(i)
    if field == "qkv_DX":
        own = compute_layer_shapes(cfg, i)["k_norm_H"] is not None  # a KV-shared layer computes q only
        kv = (1 + has_v_projection(cfg, i)) * kv_heads_per_device(cfg, i, tp) * h if own else 0
        return (d, cfg.num_heads // tp * h + kv)
    if field in ("o_DX", "gate_up_DX", "down_DF"):
        return (shape[0], shape[1] // tp)
    if field in EXPERT_LEAVES:
        return (*shape[:2], shape[2] // tp)
    return None


def device_share(cfg: ModelConfig, mesh: Mesh, *, itemsize: int, context: int, batch: int = 1,
                 scale_itemsize: int = 2, quant: QuantSpec = NO_QUANT, kv_itemsize: int | None = None,
                 act_itemsize: int | None = None, experts: int | None = None,
                 layout: str = NATURAL) -> DeviceShare:  # fmt: skip
    """`DeviceShare` of one device of `mesh` (checked first: `check_mesh`) for `cfg`: dense leaves at `itemsize`
    bytes, quantized ones packed with `scale_itemsize` scales (`model.accounting.leaf_bytes` per shard, as placed in
    `layout`), `context` KV positions per row at `kv_itemsize` (default `itemsize`), `batch` rows, `act_itemsize`
    activations (default `itemsize`) in the collectives, `experts` read per layer a step (default top_k). On one
    device its bytes equal `model.accounting.weight_bytes_by_component`'s. Raises ValueError for a mesh that does
    not divide the model, an expert count out of range or an unknown layout."""
    check_mesh(cfg, mesh)
    n_read = check_experts_read(cfg, experts)
    tp, ep = mesh.tp, mesh.ep
    kv_itemsize, act_itemsize = kv_itemsize or itemsize, act_itemsize or itemsize
    held = read = repl = 0
    repl_names: set[str] = set()

    def add(field: str, shape: Shape, read_shape: Shape | None = None, *, whole: bool = False) -> None:
        nonlocal held, read, repl
        stored = leaf_bytes(field, shape, itemsize, scale_itemsize, quant, layout)[0]
        held += stored
        read += (stored if read_shape is None else
                 leaf_bytes(field, read_shape, itemsize, scale_itemsize, quant, layout)[0])  # fmt: skip
        if whole and mesh.size > 1:
            repl += stored
            repl_names.add(field)

    for field, shape in global_shapes(cfg).items():
        if shape is None:
            continue
        if field in ("embed_VD", "ple_embed_VX"):  # split by vocabulary rows under tp; one row read
            add(field, (shape[0] // tp, shape[1]), (1, shape[1]), whole=tp == 1)
        else:
            add(field, shape, whole=True)
    head = (cfg.vocab_size // tp, cfg.hidden_size)
    if quant.int8_lm_head:
        add(LM_HEAD, head, whole=tp == 1)
    else:
        read += math.prod(head) * itemsize  # the tied table's rows on this device, read whole for the logits
    per_device = experts_on_slowest(cfg, mesh, n_read)
    slice_bytes = 0
    for i in range(cfg.num_layers):
        for field, shape in layer_leaves(cfg, i).items():
            if shape is None:
                continue
            if field in EXPERT_LEAVES:
                part = _tp_layer_shape(cfg, i, field, shape, tp) if tp > 1 else (shape[0] // ep, *shape[1:])
                add(field, part, (per_device, *part[1:]))
                if i == 0:
                    slice_bytes += leaf_bytes(field, (1, *part[1:]), itemsize, scale_itemsize, quant, layout)[0]
                continue
            part = _tp_layer_shape(cfg, i, field, shape, tp) if tp > 1 else None
            add(field, part or shape, whole=part is None)
    kv_held, kv_read = _kv_per_row(cfg, tp, context, kv_itemsize)
    return DeviceShare(mesh=mesh, context=context, batch=batch, weight_bytes=held, replicated_bytes=repl,
                       replicated=tuple(sorted(repl_names)), decode_weight_bytes=read, experts_read=per_device,
                       experts_worst=min(n_read, cfg.num_experts // ep) if ep > 1 else per_device,
                       expert_slice_bytes=slice_bytes, layers=cfg.num_layers,
                       kv_bytes_per_row=kv_held, kv_read_bytes_per_row=kv_read,
                       collectives=_collectives(cfg, mesh, batch, act_itemsize))  # fmt: skip


def _kv_per_row(cfg: ModelConfig, tp: int, context: int, kv_itemsize: int) -> tuple[int, int]:
    """(bytes held, bytes read per decode step) of one row's KV cache on one device at `context` positions: its KV
    heads (`kv_heads_per_device`) of every cache layer held, of every layer's KV source read."""
    held = read = 0
    for i in range(cfg.num_layers):
        src = cfg.kv_source(i)
        per_slot = 2 * kv_heads_per_device(cfg, src, tp) * cfg.layer_head_dim(src) * kv_itemsize
        read += slots(cfg, src, context) * per_slot
        if i in cfg.cache_layers:
            held += slots(cfg, i, context) * per_slot
    return held, read


def _collectives(cfg: ModelConfig, mesh: Mesh, batch: int, act_itemsize: int) -> tuple[Collective, ...]:
    """One decode step's collectives under `mesh` (module docstring), none on one device."""
    n = mesh.size
    if n == 1:
        return ()

    def reduce(what: str, count: int, payload: int) -> Collective:
        return Collective(kind="all-reduce", what=what, count=count, payload=payload, sent=2 * (n - 1) * payload // n)

    act = batch * cfg.hidden_size * act_itemsize  # one [B, D] activation
    layers = cfg.num_layers
    if mesh.axis == "ep":
        combine = batch * cfg.hidden_size * COMBINE_ITEMSIZE
        return (reduce("experts' output [B, D] (float32), per layer", layers, combine),)
    out = [reduce("attention output [B, D], per layer", layers, act),
           reduce("MLP output [B, D], per layer", layers, act)]  # fmt: skip
    if cfg.num_experts:
        out.append(reduce("experts' output [B, D], per layer", layers, act))
    out.append(reduce("input embedding row [B, D]", 1, act))
    if cfg.ple_dim:
        out.append(reduce("PLE row [B, X]", 1, batch * cfg.num_layers * cfg.ple_dim * act_itemsize))
    best = batch * n * ARGMAX_ITEMSIZE  # [B, N]: one value per row and vocabulary shard
    out.append(Collective(kind="all-gather", what="greedy argmax across vocabulary shards [B, N] (value, index)",
                          count=2, payload=best, sent=(n - 1) * best // n))  # fmt: skip
    return tuple(out)
