"""The fit check of the TPU W4A16 kernel (`model.kernels.w4a16_tpu`): the VMEM one grid step needs for a tiling at a
projection's shape, against the scoped VMEM limit the kernel asks Mosaic for, before anything compiles; what a
tiling must satisfy to tile a shape (the TPU's block rules), and the tiling chosen per projection.

Key: K contraction length, N output length of one projection (the logical [K, N] product, whatever the leaf's
stored orientation); g the w4 group (values per scale along K), G = bk / g the groups of one step; a bytes per
activation value (2 for bfloat16), s bytes per scale, P(s) the rows of one VMEM tile of the scale type (16 for
16-bit, 8 for 32-bit: jax's `TpuInfo.get_sublane_tiling`), up(x, P) x rounded up to a multiple of P. A tiling
(`TpuTiling`) is bm activation rows (the most a block takes; fewer rows are padded to a multiple of 16 and take a
smaller block), bn outputs and bk contraction values per grid step; the weight is 32-bit words [K / 8, N]
(`model.kernels.tpu_layout`), so a step reads bk / 8 x bn words.

VMEM bytes of one grid step (`need_tpu`), the formula:

    need = 2 x (bm bk a)                 # activation block [bm, bk], double-buffered
         + 2 x (bk / 8 x bn x 4)         # packed words (= bk bn / 2 bytes), double-buffered
         + 2 x (up(G, P(s)) bn s)        # scales [G, bn], double-buffered
         + 2 x (bm bn 4)                 # float32 output block, double-buffered
         + up(G, 8) bn 4                 # the step's scales in float32
         + 2 x (bm bn 4)                 # the accumulator and one group's product
         + g bn a + 2 x (g / 8 x bn x 4) # one group's values, one run of them in float32, the group's words

Why these terms: Pallas's TPU pipeline (a grid with BlockSpecs) keeps two buffers of every blocked input and output
in VMEM, so the copy of step i + 1 runs while step i computes (the Pallas TPU pipelining docs, "double
buffering"); the rest are the kernel body's own values, which Mosaic keeps in vector registers and spills to
VMEM: counted whole, so a tiling that passes leaves room.

The vector-unit variant (`TpuTiling.vpu_rows` rows, `need_tpu_vpu`): its activations are a float32 [G, g, 8] block
whose 8 lanes take a 128-lane tile's room, its output [8, bn]:

    need_vpu = 2 x (bk 128 4) + 2 x (bk / 8 x bn x 4) + 2 x (up(G, P(s)) bn s) + 2 x (8 bn 4) + up(G, 8) bn 4
             + (rows + 3) x (g / 8 x bn x 4)  # each row's sum over the runs, one run, its broadcast activations,
                                               # the group's words
             + rows x 8 bn 4                   # accumulators [1, bn] per row, 8 sublanes' room each

and a tiling with vpu_rows > 0 is charged the larger of the two.

Limits: the kernel passes `vmem_limit_bytes = SCOPED_VMEM` (16 MiB) to Mosaic (`pltpu.CompilerParams`), so the
scoped limit does not depend on the compiler's default (16 MiB on the lent v5e too: a Pallas kernel whose
double-buffered blocks took 16.03 MB failed there with "Scoped allocation with size 16.03M and limit 16.00M",
issue 43's TPU notes); a tiling is chosen only when its `need_tpu` is within `BUDGET_SHARE` (3/4) of that, the
rest left to Mosaic's internal scratch and the values the model does not count. The VMEM a core has
(`TPU_VMEM_BYTES`, read from `jax.experimental.pallas.tpu.get_tpu_info()` on a live TPU by
`model.kernels.choice.device_limit`, else this table) only caps the scoped limit: jax's own table
(jax/_src/pallas/mosaic/tpu_info.py in jax 0.10.2; jax/_src/tpu_info.py in 0.12, the same figures): v2, v3, v4, v4i
16 MiB per TensorCore; v5e 128 MiB; v5p 64 MiB; v6e 128 MiB; 7, 7x 64 MiB.

The TPU's block rules (jax's Pallas TPU lowering, `_check_block_mappings`, jax 0.10.2 and 0.12): each block's last
dimension a multiple of 128 or the array's whole dimension, its second-to-last a multiple of 8 or the whole
dimension. Here: x blocks [bm, bk] (bk a multiple of g, g of 128: each group a lane-aligned slice; bm of 16, bfloat16's sublane tile), words [bk / 8, bn]
and the output [bm, bn] (bn a multiple of 128 or N; bk / 8 a multiple of 16 since bk is one of 128), scales
[G, bn] (G a multiple of 16, both scale types' tile, or all of K's groups: bk = K). The kernel unrolls its groups:
at most `MAX_GROUPS_PER_STEP` per step. jax's rule is the same for every dtype: a block of 8 scale rows (bk = 1024)
passes it and exports for the TPU with float32 and with bfloat16 scales alike (a bfloat16 tile holds 16 rows), so
it cannot show that Mosaic compiles G = 8; only a TPU can, and until one does the kernel keeps 16.

Tiling policies (`TILING_POLICIES`, defined with the `--kernel` option in `model.kernels.fit`): how
`candidates_tpu` orders the tilings of a projection after the row block, largest first:

- "fewest": the fewest grid steps (the largest bk x bn), then the larger bk. Most of E2B's products are then one
  grid step (qkv 1536 x 2560, o 2048 x 1536, the PLE projections).
- "steps": tilings of at least `MIN_STEPS` grid steps whose packed weight block (bk x bn / 2 bytes) is at least
  `MIN_BLOCK_BYTES` first, the steps taken along N first (the larger bk), then the fewest steps among those (the
  larger bn); a projection with no such tiling (E2B's PLE projections: 196,608 bytes in all) orders as "fewest".
  Why: Pallas's TPU pipeline copies block i + 1 from HBM while block i computes (the Pallas TPU pipelining docs,
  "double buffering"), so a one-step grid copies, then computes, with nothing overlapped; the TPU probe of
  2026-12-07 read 350 GB/s on the one-step products against 629 on gate_up's six steps
  (reports/2026-12-07-w4-pair-unpack-tpuv5e/notes.md).

Chosen per engine with `--kernel w4a16=pallas:POLICY` (`parse_policy`); without one, `DEFAULT_POLICY` ("steps":
measured faster end to end on the lent v5e, `model.kernels.fit.DEFAULT_POLICY`; scripts/tpu-quant-archive.sh,
steps `policy` and `policy1`; the per-shape probe scripts/probes/w4_tiling_tpu.py, step `tiling`).

Pure Python on ints (no jax): `bench kernels fit` and the report use it without a device.
"""

from __future__ import annotations

import dataclasses
import functools

from model.kernels.fit import DEFAULT_POLICY, TILING_POLICIES, Fit, Need, Projection, choose_by, refusal_line, tiling_fields

__all__ = ["TILING_POLICIES", "DEFAULT_POLICY", "MIN_STEPS", "MIN_BLOCK_BYTES", "grid_steps", "SCOPED_VMEM", "BUDGET_SHARE", "TPU_VMEM_BYTES", "TPU_DEVICES", "VPU_ROWS", "VPU_COL_SHARE", "VPU_MAX_ROWS", "VPU_ROW_PAD",
           "ROW_TILE", "MAX_ROWS", "TpuTiling", "generation_of", "vmem_capacity", "budget", "need_tpu", "need_tpu_vpu",
           "shape_problem_tpu", "tiling_problem_tpu", "fits_tpu", "rows_block", "candidates_tpu", "choose_tpu",
           "plan_tpu", "refusal_tpu", "parse_tpu_tiling", "parse_policy", "padded_k", "placed_k",
           "expert_projections"]  # fmt: skip

MIB = 2**20

SCOPED_VMEM = 16 * MIB
"""The scoped VMEM limit the kernel passes to Mosaic (`vmem_limit_bytes`), bytes."""

BUDGET_SHARE = 0.75
"""Share of the scoped limit a tiling's modelled need may take (the rest: Mosaic's own scratch, uncounted values)."""

TPU_VMEM_BYTES: dict[str, int] = {
    "v2": 16 * MIB, "v3": 16 * MIB, "v4": 16 * MIB, "v4i": 16 * MIB,
    "v5e": 128 * MIB, "v5p": 64 * MIB, "v6e": 128 * MIB, "7": 64 * MIB, "7x": 64 * MIB,
}  # fmt: skip
"""VMEM per TensorCore by TPU generation, bytes (jax's table, module docstring)."""

TPU_DEVICES = ("tpu", *(f"tpu-{g}" for g in TPU_VMEM_BYTES))
"""The `--device-capability` names of TPUs: "tpu" (v5e, the lent machine) or "tpu-GEN"."""

VPU_ROWS = 0
"""Rows up to which the chosen tilings take the kernel's vector-unit variant (`vpu_rows`; no matrix unit: each
value multiplied and summed in float32 on the VPU) instead of the matrix unit. 0 (never) until the TPU probe
(`scripts/probes/w4a16_tpu.py`, variant "vpu") shows it faster at decode's few rows."""

VPU_COL_SHARE = 0.0
"""Share of each output block (bn) the chosen tilings give the vector unit at decode's few rows (`vpu_cols`,
rounded down to a multiple of 128; 0: none). At one row the matrix unit alone is bound by loading each weight tile
(about 1.0e12 weights/s on the v5e, issue 43's profile), and the vector unit can multiply other columns at the same
time. 0: measured slower on the lent v5e at one row (2026-12-07, `scripts/probes/w4_hybrid_tpu.py`, report
`reports/2026-12-07-w4-pair-unpack-tpuv5e`): 1536 x 12288 read 629 GB/s with the matrix unit alone and 509-595
with 512-1024 of 2048 columns on the vector unit; 6144 x 1536 571 against 360-398."""

VPU_MAX_ROWS = 8
"""Most rows the vector-unit variant takes (its activations are one [g, 8] block per group, transposed)."""

VPU_ROW_PAD = 8
"""Rows the vector-unit variant's blocks hold (the rows it takes, padded)."""

ROW_TILE = 16
"""Rows are padded to a multiple of this (bfloat16's sublane tile: 16 rows per VMEM tile)."""

MAX_ROWS = 128
"""The largest row block (bm) the chosen tilings use: a batch of 128 rows is one row block; more rows take several
row blocks, each reading the weight again."""

ROW_BLOCKS = (128, 64, 32, 16)
"""Row blocks tried, largest first."""
MAX_OUTPUT_BLOCK = 4096
"""Outputs per block tried (bn): every multiple of 128 up to this that divides N, largest first; N itself where
no multiple of 128 divides it (one block along N)."""
MAX_GROUPS_PER_STEP = 24
"""Most w4 groups in one grid step (the kernel unrolls them): bk <= 24 g = 3072 at g 128."""
SCALE_ROWS = 16
"""A step's scale rows (groups) must be a multiple of this (the 16-bit tile's rows), or all of K's groups."""


MIN_STEPS = 4
"""Grid steps the "steps" policy asks for: with double buffering, one step's copy in MIN_STEPS is left without a
compute to hide behind (at most 1/4 of the copy time exposed). A stated choice, to be set from the probe."""

MIN_BLOCK_BYTES = 384 * 1024
"""Smallest packed weight block (bk x bn / 2 bytes) the "steps" policy splits a product into: each grid step costs
about 0.35 us of its own (the Pallas TPU pipelining docs' figure per step), which is 287 KB at the v5e's 819 GB/s;
384 KiB keeps that overhead below the copy time and still gives every E2B qkv and o product 4 steps (1536 x 2048
at bn 512 and 2048 x 1536 at bn 384 are exactly 384 KiB blocks)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TpuTiling:
    """One tiling of the TPU kernel: bm rows (the most per block), bn outputs and bk contraction values per grid
    step; `vpu_rows`: rows up to which a call takes the vector-unit variant (0: never); `vpu_cols`: at most
    `VPU_MAX_ROWS` rows, the last vpu_cols outputs of each bn block go through the vector unit while the matrix unit
    takes the others (the hybrid form; 0: never); `mlp` (on a gate_up leaf's tiling, the "fused" policy only): the
    intermediate values per grid step of the fused MLP kernel (`model.kernels.w4_mlp_tpu`; 0: the MLP's two
    products are two calls); `resident` (the "resident" policy): a call of at most bm rows takes the kernel's
    resident form, every operand whole in VMEM (`model.kernels.w4a16_tpu.w4a16_tpu_matmul`). Hashable: a static
    field of
    a quantized leaf (`model.quant.QuantArray.tiling`), where it also says that the leaf is stored in the TPU layout
    (`model.kernels.tpu_layout`). `text` is its manifest form, e.g. "tpu bm128 bn2048 bk1536"."""

    bm: int
    bn: int
    bk: int
    vpu_rows: int = 0
    vpu_cols: int = 0
    mlp: int = 0
    resident: bool = False

    @property
    def text(self) -> str:
        return (f"tpu bm{self.bm} bn{self.bn} bk{self.bk}" + (f" vpu{self.vpu_rows}" if self.vpu_rows else "")
                + (f" vc{self.vpu_cols}" if self.vpu_cols else "") + (f" mlp{self.mlp}" if self.mlp else "")
                + (" resident" if self.resident else ""))  # fmt: skip


def generation_of(device_kind: str) -> str | None:
    """The TPU generation ("v5e", ...) of a jax device kind ("TPU v5 lite", "TPU v5e", "TPU v6 lite", "TPU7x"), as
    jax's `chip_version_from_device_kind` maps them; None for an unknown kind."""
    kind = device_kind.strip()
    known = {"TPU v2": "v2", "TPU v3": "v3", "TPU v4": "v4", "TPU v4 lite": "v4i", "TPU v5e": "v5e",
             "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6e": "v6e", "TPU v6 lite": "v6e",
             "TPU7": "7", "TPU7x": "7x"}  # fmt: skip
    return known.get(kind)


def vmem_capacity(generation: str) -> int | None:
    """VMEM per TensorCore (bytes) of a TPU generation ("v5e", "v6e", ...; `TPU_VMEM_BYTES`), None if unknown."""
    return TPU_VMEM_BYTES.get(generation.lower().removeprefix("tpu-").removeprefix("tpu "))


def budget(capacity: int | None = None) -> int:
    """The bytes a tiling's `need_tpu` may take: `BUDGET_SHARE` of the scoped limit, the limit capped by the core's
    VMEM `capacity` (bytes) where known."""
    limit = SCOPED_VMEM if capacity is None else min(SCOPED_VMEM, capacity)
    return int(limit * BUDGET_SHARE)


def _sublanes(itemsize: int) -> int:
    """Rows of one VMEM tile of a type of `itemsize` bytes (8 for 32-bit, 16 for 16-bit, 32 for 8-bit)."""
    return 8 * max(1, 4 // itemsize)


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def need_tpu(t: TpuTiling, *, group: int, act_bytes: int = 2, scale_bytes: int = 2) -> Need:
    """`Need` (bytes, term by term) of one grid step of tiling `t` for w4 groups of `group` values, activations of
    `act_bytes` and scales of `scale_bytes` bytes (the module docstring's formula); with `t.vpu_rows`, the larger
    of that and the vector-unit variant's (`need_tpu_vpu`)."""
    g_, bn, bm = t.bk // group, t.bn, t.bm
    srows = _up(g_, _sublanes(scale_bytes))
    mxu = Need(terms=(
        (f"activation block (2 x {bm}x{t.bk} x {act_bytes} B)", 2 * bm * t.bk * act_bytes),
        (f"packed words (2 x {t.bk // 8}x{bn} x 4 B)", 2 * (t.bk // 8) * bn * 4),
        (f"scales (2 x {srows}x{bn} x {scale_bytes} B)", 2 * srows * bn * scale_bytes),
        (f"output block (2 x {bm}x{bn} x 4 B)", 2 * bm * bn * 4),
        (f"float32 scales ({_up(g_, 8)}x{bn} x 4 B)", _up(g_, 8) * bn * 4),
        (f"accumulator and product (2 x {bm}x{bn} x 4 B)", 2 * bm * bn * 4),
        (f"one group's values ({group}x{bn} x {act_bytes} B + 2 x {group // 8}x{bn} x 4 B)",
         group * bn * act_bytes + 2 * (group // 8) * bn * 4),
    ))  # fmt: skip
    if t.vpu_cols:
        mxu = Need(terms=(*mxu.terms,
                          (f"transposed activations (2 x {t.bk}x128 lanes x 4 B)", 2 * t.bk * 128 * 4),
                          (f"vector-unit values (4 x {group // 8}x{t.vpu_cols} x 4 B)",
                           4 * (group // 8) * t.vpu_cols * 4)))  # fmt: skip
    if not t.vpu_rows:
        return mxu
    vpu = need_tpu_vpu(t, group=group, scale_bytes=scale_bytes)
    return vpu if vpu.total > mxu.total else mxu


def need_tpu_vpu(t: TpuTiling, *, group: int, scale_bytes: int = 2) -> Need:
    """`Need` (bytes) of one grid step of the vector-unit variant at `t.vpu_rows` rows (the module docstring's
    formula)."""
    g_, bn, rows = t.bk // group, t.bn, max(t.vpu_rows, 1)
    srows = _up(g_, _sublanes(scale_bytes))
    run = group // 8 * bn * 4
    return Need(terms=(
        (f"transposed activations (2 x {t.bk}x128 lanes x 4 B)", 2 * t.bk * 128 * 4),
        (f"packed words (2 x {t.bk // 8}x{bn} x 4 B)", 2 * (t.bk // 8) * bn * 4),
        (f"scales (2 x {srows}x{bn} x {scale_bytes} B)", 2 * srows * bn * scale_bytes),
        (f"output block (2 x 8x{bn} x 4 B)", 2 * 8 * bn * 4),
        (f"float32 scales ({_up(g_, 8)}x{bn} x 4 B)", _up(g_, 8) * bn * 4),
        (f"group values ({rows + 3} x {group // 8}x{bn} x 4 B)", (rows + 3) * run),
        (f"accumulators ({rows} x 8x{bn} x 4 B)", rows * 8 * bn * 4),
    ))  # fmt: skip


def shape_problem_tpu(p: Projection) -> str | None:
    """Why the TPU kernel cannot tile projection `p` at all, or None: the group a multiple of 128 (x's lane blocks;
    8 runs of g / 8 word rows, 16 at g = 128) dividing K."""
    if p.group % 128:
        return f"group {p.group} is not a multiple of 128 (the TPU's lane width)"
    if p.k % p.group:
        return f"K={p.k} is not a multiple of the group {p.group}"
    return None


def tiling_problem_tpu(k: int, n: int, group: int, t: TpuTiling) -> str | None:
    """Why tiling `t` cannot tile a K x N product with w4 groups of `group` values, or None (the TPU's block rules,
    module docstring): bm a multiple of 16; bk a multiple of the group dividing K, at most `MAX_GROUPS_PER_STEP`
    groups, a multiple of `SCALE_ROWS` groups or all of K; bn dividing N, a multiple of 128 or N; vpu_rows within
    0..`VPU_MAX_ROWS`."""
    problem = shape_problem_tpu(Projection(field="", k=k, n=n, axis=0, group=group))
    if problem:
        return problem
    if t.bm < ROW_TILE or t.bm % ROW_TILE:
        return f"bm {t.bm} is not a multiple of {ROW_TILE}"
    if not 0 <= t.vpu_rows <= VPU_MAX_ROWS:
        return f"vpu_rows {t.vpu_rows} is not within 0..{VPU_MAX_ROWS}"
    if t.vpu_cols and (t.vpu_cols % 128 or not 0 < t.vpu_cols < t.bn):
        return f"vpu_cols {t.vpu_cols} is not a multiple of 128 below bn {t.bn}"
    if t.bk % group:
        return f"bk {t.bk} is not a multiple of the group {group}"
    if k % t.bk:
        return f"bk {t.bk} does not divide K={k}"
    if t.bk // group > MAX_GROUPS_PER_STEP:
        return f"bk {t.bk} is {t.bk // group} groups, over the {MAX_GROUPS_PER_STEP} one step unrolls"
    if t.bk != k and (t.bk // group) % SCALE_ROWS:
        return f"bk {t.bk} is {t.bk // group} groups: not a multiple of {SCALE_ROWS} (scale rows) nor all of K={k}"
    if n % t.bn:
        return f"bn {t.bn} does not divide N={n}"
    if t.bn % 128 and t.bn != n:
        return f"bn {t.bn} is not a multiple of 128 nor N={n}"
    return None


def padded_k(k: int, group: int) -> int:
    """K rounded up to a whole number of w4 groups: the K of an expert leaf in the batched TPU layout
    (`model.kernels.tpu_layout.to_tpu_experts`, whose docstring says why)."""
    return -(-k // group) * group


@functools.cache
def placed_k(k: int, n: int, group: int) -> int:
    """K of a w4 projection's [K, N] product (one expert's, for an expert leaf; w4 groups of `group` values) as a TPU
    places it: `padded_k` where the kernel tiles the padded product within `budget()` (12 MiB of VMEM per grid step: the same on every generation
    `TPU_VMEM_BYTES` lists, each having at least the 16 MiB scoped limit), which is when
    `model.kernels.choice.plan_kernel` tiles the leaf and `with_tilings` stores it in the TPU layout
    (`model.kernels.tpu_layout.to_tpu`, `to_tpu_experts`); else K (the leaf keeps the w4 layout and XLA's product).
    At bfloat16 activations and scales (`need_tpu`'s defaults; the smallest row block fits either way at 26B-A4B's
    shapes). 26B-A4B: the experts' down projection K = 704 -> 768, the MLP's down K = 2112 -> 2176, group 128.
    `model.accounting.placed_shape` counts it."""
    kp = padded_k(k, group)
    return kp if choose_tpu(Projection(field="", k=kp, n=n, axis=0, group=group), budget()).fits else k


def expert_projections(cfg, group: int) -> tuple[Projection, ...]:
    """The expert projections of a `model.config.ModelConfig` with experts (26B-A4B; () without) as the expert
    kernel (`model.kernels.w4a16_tpu.w4a16_tpu_expert_matmul`) multiplies them: one expert's product, K padded to
    whole groups (`padded_k`), `axis` that of one expert's [A, B] slice (`model.quantspec.EXPERT_PROJECTIONS`'
    contraction axis less one: gate_up [D, 2I] contracts D, axis 0; down [D, I] contracts I, axis 1), `layers`
    every layer (each has the expert block). Planned on a TPU only (`model.kernels.choice.plan_kernel`)."""
    from model.shapes import expert_shapes  # jax-free
    from model.quantspec import EXPERT_PROJECTIONS

    if not cfg.has_experts:
        return ()
    shapes = expert_shapes(cfg)
    out = []
    for field, (contract,) in EXPERT_PROJECTIONS.items():
        shape = shapes[field]
        k, n, g = shape[contract], shape[3 - contract], min(group, shape[contract])
        out.append(Projection(field=field, k=padded_k(k, g), n=n, axis=contract - 1, group=g, layers=cfg.num_layers))
    return tuple(out)


def fits_tpu(k: int, n: int, group: int, t: TpuTiling) -> bool:
    """Whether the TPU kernel can run a K x N product with w4 groups of `group` at tiling `t`: the one check
    `model.kernels.w4a16_tpu.w4a16_tpu_matmul` and the dispatch (`model.quant.matmul`) apply."""
    return tiling_problem_tpu(k, n, group, t) is None


def rows_block(rows: int, t: TpuTiling) -> int:
    """The row block a call of `rows` activation rows uses: rows rounded up to a multiple of `ROW_TILE`, at most
    t.bm (more rows take several blocks)."""
    return min(t.bm, -(-max(rows, 1) // ROW_TILE) * ROW_TILE)


def _vpu_cols(bn: int) -> int:
    """`VPU_COL_SHARE` of an output block, a multiple of 128 below bn (0 where none fits)."""
    cols = int(bn * VPU_COL_SHARE) // 128 * 128
    return cols if 0 < cols < bn else 0


def grid_steps(k: int, n: int, t: TpuTiling) -> int:
    """Grid steps of one row block of a K x N product at tiling `t`: (N / bn) x (K / bk)."""
    return (n // t.bn) * (k // t.bk)


MLP_BLOCKS = (2048,)
"""Intermediate values per grid step (bf) the fused MLP kernel (`model.kernels.w4_mlp_tpu`) is planned with, largest
first: bf / g scale rows of the down projection must be a multiple of `SCALE_ROWS` (16 at g 128), so 2048 is the
smallest at the default group; at decode that is three blocks of about 1.5 MiB a step (gate, up, down)."""

MLP_MAX_ROWS = 32
"""The most activation rows the fused MLP kernel takes (one row block); a larger batch takes the two products (their
intermediate [R, bf] float32 values and row blocks of 128 would not fit the budget beside three weight blocks)."""


def need_mlp(d: int, bf: int, group: int, *, rows: int = MLP_MAX_ROWS, act_bytes: int = 2,
             scale_bytes: int = 2) -> int:  # fmt: skip
    """VMEM bytes of one grid step of the fused MLP kernel, double-buffered where Pallas pipelines: the gate, up and
    down blocks of packed words (3 x d bf / 2) and their scales (2 d / g x bf + bf / g x d), the activations
    [rows, d] and the float32 output [rows, d], plus the step's float32 gate and up values [rows, bf] (single)."""
    words = 3 * d * bf // 2
    scales = (2 * (d // group) * bf + (bf // group) * d) * scale_bytes
    io = rows * d * (act_bytes + 4)
    return 2 * (words + scales + io) + 2 * rows * bf * 4


def mlp_block(d: int, f: int, group: int, limit: int | None = None) -> int:
    """The fused MLP kernel's bf for hidden size `d` and MLP width `f` at w4 group `group`: the first of
    `MLP_BLOCKS` that divides f, whose down scale rows are a multiple of `SCALE_ROWS`, with d / g groups at most
    `MAX_GROUPS_PER_STEP` and `need_mlp` within `limit` (bytes; default `budget()`); 0 where none does (the MLP
    then takes two kernel calls)."""
    limit = budget() if limit is None else limit
    if d % group or d // group > MAX_GROUPS_PER_STEP or group % 128:
        return 0
    for bf in MLP_BLOCKS:
        if f % bf == 0 and bf % group == 0 and (bf // group) % SCALE_ROWS == 0 and need_mlp(d, bf, group) <= limit:
            return bf
    return 0


def fuse_mlp(fits, limit: int):
    """The "fused" policy's plan: each gate_up projection's tiling (`Fit`s of `plan_tpu`) given `mlp` = its
    `mlp_block` where the down projection of the same width is tiled too (both leaves then in the TPU layout);
    the other fits unchanged. Returns a tuple of `Fit`."""
    downs = {f.projection.k for f in fits if f.fits and f.projection.field == "down_DF"}
    out = []
    for f in fits:
        p = f.projection
        if f.fits and p.field == "gate_up_DX" and p.n // 2 in downs:
            bf = mlp_block(p.k, p.n // 2, p.group, limit)
            t = dataclasses.replace(f.tiling, mlp=bf)
            f = dataclasses.replace(f, tiling=t, tried=t) if bf else f
        out.append(f)
    return tuple(out)


RESIDENT_POLICY_BYTES = 2 * MIB
"""The "resident" policy's bound: a product of at most this many packed weight bytes (K N / 2) takes the resident
form. On E2B: the PLE products (0.2 MB), o 2048 x 1536 and qkv 1536 x 2048 (1.57 MB), qkv 1536 x 2560 (1.97 MB),
the products that read 137-474 GB/s in a step (reports/2026-12-07-w4-natural-order-tpuv5e/notes.md); alone, the
resident form is not faster (reports/2026-12-08-fused-mlp-family-tpuv5e/notes.md): the question the policy asks is
whether XLA starts the weight's copy into VMEM during the ops before the call, inside a step."""


def need_resident(k: int, n: int, group: int, bm: int, *, act_bytes: int = 2, scale_bytes: int = 2) -> int:
    """VMEM bytes of the resident form of a K x N product at bm rows, all single-buffered: words K N / 2, scales
    K / g x N, x [bm, K], the float32 output [bm, N], and one group's bfloat16 values [g, N] being multiplied."""
    return k * n // 2 + (k // group) * n * scale_bytes + bm * k * act_bytes + bm * n * 4 + group * n * 2


def mark_resident(fits, limit: int):
    """The "resident" policy's plan: each fitting dense projection's tiling (`Fit`s of `plan_tpu`) with `resident`
    set where its packed weight is at most `RESIDENT_POLICY_BYTES`, its K / g at most `MAX_GROUPS_PER_STEP` and
    `need_resident` at the tiling's bm within `limit` (bytes); the other fits (the experts' too) unchanged. Returns
    a tuple of `Fit`."""
    from model.quantspec import EXPERT_PROJECTIONS

    out = []
    for f in fits:
        p = f.projection
        if (f.fits and p.field not in EXPERT_PROJECTIONS and p.k * p.n // 2 <= RESIDENT_POLICY_BYTES
                and p.k // p.group <= MAX_GROUPS_PER_STEP and need_resident(p.k, p.n, p.group, f.tiling.bm) <= limit):
            t = dataclasses.replace(f.tiling, resident=True)
            f = dataclasses.replace(f, tiling=t, tried=t)
        out.append(f)
    return tuple(out)


def parse_policy(name: str | None) -> str:
    """A tiling policy's name (`TILING_POLICIES`) -> itself; None -> `DEFAULT_POLICY`. Raises ValueError naming
    the name and the expected ones."""
    if name is None:
        return DEFAULT_POLICY
    if name not in TILING_POLICIES:
        raise ValueError(f"tiling policy {name!r}: expected one of {', '.join(TILING_POLICIES)} (default "
                         f"{DEFAULT_POLICY})")  # fmt: skip
    return name


def _order(p: Projection, policy: str):
    """The sort key (largest first) of `candidates_tpu` under `policy` (`TILING_POLICIES`)."""
    fewest = lambda t: (t.bm, t.bk * t.bn, t.bk)  # noqa: E731
    if policy == "fewest":
        return fewest

    def steps(t: TpuTiling):
        ok = grid_steps(p.k, p.n, t) >= MIN_STEPS and t.bk * t.bn // 2 >= MIN_BLOCK_BYTES
        return (t.bm, ok, t.bk if ok else 0, t.bn if ok else 0, *fewest(t)[1:])

    return steps


def candidates_tpu(p: Projection, policy: str = DEFAULT_POLICY) -> list[TpuTiling]:
    """Every tiling of projection `p` the TPU kernel can run, most preferred first: larger row blocks (a batch of
    `MAX_ROWS` in one block), then as the tiling `policy` says (`TILING_POLICIES`): "fewest": fewer grid steps
    (larger bk x bn), then larger bk (each output block's K loop in fewer steps); "steps": at least `MIN_STEPS`
    steps of blocks of at least `MIN_BLOCK_BYTES` first (larger bk, then larger bn), the others after as
    "fewest". Raises ValueError for an unknown policy."""
    key = _order(p, parse_policy(policy))
    if shape_problem_tpu(p):
        return []
    bns = [b for b in range(MAX_OUTPUT_BLOCK, 0, -128) if p.n % b == 0] or [p.n]
    groups = p.k // p.group
    bks = [p.k // s for s in range(1, groups + 1) if groups % s == 0]
    out = [TpuTiling(bm=bm, bn=bn, bk=bk, vpu_rows=VPU_ROWS, vpu_cols=_vpu_cols(bn))
           for bm in ROW_BLOCKS for bn in bns for bk in bks]  # fmt: skip
    out = [t for t in out if fits_tpu(p.k, p.n, p.group, t)]
    return sorted(out, key=key, reverse=True)


def choose_tpu(p: Projection, limit: int, *, act_bytes: int = 2, scale_bytes: int = 2,
               tiling: TpuTiling | None = None, policy: str = DEFAULT_POLICY) -> Fit:  # fmt: skip
    """The first tiling of `candidates_tpu(p, policy)` whose `need_tpu` is within `limit` bytes; with `tiling`
    given, that tiling alone (it fits when it tiles the shape and its need is within the limit). A `Fit`
    (`model.kernels.fit`) whose tiling is None says why, as the GPU check's does."""
    return choose_by(p, limit, tiling=tiling, shape_problem=shape_problem_tpu,
                     candidates=lambda q: candidates_tpu(q, policy),
                     need_of=lambda t: need_tpu(t, group=p.group, act_bytes=act_bytes, scale_bytes=scale_bytes),
                     given_problem=lambda t: tiling_problem_tpu(p.k, p.n, p.group, t))  # fmt: skip


def plan_tpu(projs, limit: int, *, act_bytes: int = 2, scale_bytes: int = 2,
             tiling: TpuTiling | None = None, policy: str = DEFAULT_POLICY) -> tuple[Fit, ...]:  # fmt: skip
    """`choose_tpu` for every projection; under the "fused" policy, each layer's MLP fused where it can be
    (`fuse_mlp`); under "resident", the small products marked for the resident form (`mark_resident`)."""
    fits = tuple(choose_tpu(p, limit, act_bytes=act_bytes, scale_bytes=scale_bytes, tiling=tiling, policy=policy)
                 for p in projs)  # fmt: skip
    policy = parse_policy(policy)
    return fuse_mlp(fits, limit) if policy == "fused" else mark_resident(fits, limit) if policy == "resident" else fits


def refusal_tpu(f: Fit, device: str, *, act_bytes: int = 2, scale_bytes: int = 2) -> str:
    """The one-line refusal of a projection the TPU kernel cannot take: the shape's problem, or need, limit, the
    dominating term and the tiling that would fit (or that none would)."""
    return refusal_line(f, device, kernel="w4a16 TPU kernel", memory="of VMEM per grid step", limit_name="budget",
                        best=lambda: choose_tpu(f.projection, f.limit, act_bytes=act_bytes, scale_bytes=scale_bytes),
                        none_fits=lambda _: "no tiling of this kernel fits; use --kernel w4a16=xla")  # fmt: skip


def parse_tpu_tiling(text: str) -> TpuTiling:
    """"[tpu] bm16 bn2048 bk1536 [vpu1] [vc512]" (spaces or commas) -> `TpuTiling` (vpuN: `vpu_rows` N; vcN:
    `vpu_cols` N). Raises ValueError
    naming the text and the expected form (bm a multiple of 16, vpu at most `VPU_MAX_ROWS`; whether it tiles a
    shape is `tiling_problem_tpu`'s)."""
    resident = "resident" in text.replace(",", " ").split()
    fields = tiling_fields(text, keys=("bm", "bn", "bk", "vpu", "vc", "mlp"), required=("bm", "bn", "bk"),
                           zero_ok=("vpu", "vc", "mlp"),
                           skip=("tpu", "resident"), expected="expected e.g. 'tpu bm16 bn2048 bk1536' (bm, bn, bk; vpuN optional)",
                           needs="needs bm, bn and bk, e.g. 'tpu bm16 bn2048 bk1536'")  # fmt: skip
    names = {"vpu": "vpu_rows", "vc": "vpu_cols"}
    t = TpuTiling(**{names.get(key, key): value for key, value in fields.items()}, resident=resident)
    if t.bm % ROW_TILE or t.vpu_rows > VPU_MAX_ROWS:
        raise ValueError(f"tiling {text!r}: bm must be a multiple of {ROW_TILE} and vpu at most {VPU_MAX_ROWS}, "
                         "e.g. 'tpu bm16 bn2048 bk1536 vpu1'")  # fmt: skip
    return t
