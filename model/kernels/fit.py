"""The fit check of the fused W4A16 kernel (`model.kernels.w4a16`): the scratch memory one block (one program of
the grid) needs for a tiling at a projection's shape, against the device's limit, before anything compiles; the
tiling chosen for each projection; and the refusal, with the arithmetic, where nothing fits.

Key: K contraction length, N output length of one projection; g the w4 group (values per scale along K);
a bytes per activation value (2 for bfloat16 / float16), s bytes per scale (2 for 16-bit scales).
A tiling (`Tiling`) is bm rows x bn outputs x bk contraction values per step, `stages` pipeline stages (Triton's
`num_stages`: how many steps' loads are in flight at once), `splits` programs along K (a split-K grid, whose
float32 partial sums are added after the kernel) and `warps` (Triton's `num_warps`, registers only).

Scratch bytes of one block (`need`), the formula:

    need = stages x (bm bk a  +  bk bn / 2  +  (bk / g) bn s)   # input block, packed int4 tile, scales: staged
         + bk bn a                                              # the dequantized tile fed to the matrix unit
         + bm bn 4                                              # float32 accumulator
         + bm bn 4                                              # output tile (float32 partial sums)

Why these terms: Triton pipelines the loads of a loop over K through shared memory, one buffer per stage, so
each loaded operand of one step counts `stages` times; the dequantized weight tile is computed in registers and
handed to the matrix-multiply unit through shared memory (a layout conversion on Ampere/Ada, a shared-memory
operand on Hopper's wgmma), once; the accumulator and the output tile live in registers and are staged through
shared memory for the store. Counting the last three is conservative (registers may hold them), so a tiling
that passes leaves room; a tiling over the limit fails to launch (Triton's OutOfResources), which is what this
check prevents. This is a model of the kernel's buffers, not Triton's own allocator: on a GPU the compiled
kernel's `shared` size is the figure to compare it with.

Limits (`LIMITS`): the device's `shared_memory_per_block_optin` where the jax device exposes it, else the maximum
shared memory per thread block (opt-in) by compute capability, from NVIDIA's CUDA C++ Programming Guide,
"Compute Capabilities", table "Technical Specifications per Compute Capability" (and the tuning guides of each
architecture): 7.5 (Turing) 64 KiB; 8.0 (A100) and 8.7 (Orin) 163 KiB; 8.6, 8.9 (Ada, L4) and 12.0 99 KiB;
9.0 (Hopper) and 10.0 (Blackwell) 227 KiB. A TPU core's VMEM is counted at 16 MiB, the scoped VMEM the published
kernel was tiled for ("16 MB of scratchpad per core", seeds/002), only to compare the published tiles in this
kernel's model; the TPU kernel's own check is `model.kernels.fit_tpu`.

The published kernel's tiles (`PUBLISHED_TILING`): the report gives only their size, "550 KiB to 1.1 MiB per
block" at E2B's shapes, not the block sizes. Our reconstruction is TPU-natural: the whole contraction in one step
(bk = K, what a 16 MiB scratchpad allows), 128 outputs (one lane width), 8 rows (one sublane group), two stages
(Pallas TPU double-buffers every input). `bench kernels fit --tiling published` prints what it needs at each
projection; at E2B's shapes with bfloat16 activations and scales and w4:128 that is 638 KiB (K = 1536) to 4.9 MiB
(K = 12288), 10x to 79x a Turing block's 64 KiB and 6x to 51x an Ada block's 99 KiB: the published refusal.

Pure Python on ints (no jax): `bench kernels fit` and the report use it without a device (wall 5).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

__all__ = ["KIB", "LIMITS", "TPU_VMEM", "PUBLISHED_TILING", "Tiling", "Projection", "Fit", "Need", "limit_for",
           "need", "projections", "shape_problem", "tile_problem", "tiling_problem", "fits_kernel", "candidates",
           "choose", "plan", "refusal", "parse_tiling", "KERNEL_OPTIONS", "TILING_POLICIES", "DEFAULT_POLICY", "parse_kernel", "split_kernel", "KERNEL_MAX_ROWS"]

KIB = 1024

LIMITS: dict[str, int] = {
    "7.5": 64 * KIB,
    "8.0": 163 * KIB, "8.7": 163 * KIB,
    "8.6": 99 * KIB, "8.9": 99 * KIB, "12.0": 99 * KIB,
    "9.0": 227 * KIB, "10.0": 227 * KIB,
}  # fmt: skip
"""Shared memory per thread block, opt-in maximum, bytes, by NVIDIA compute capability (the module docstring
cites the source)."""

TPU_VMEM = 16 * 2**20
"""A TPU core's scoped VMEM the published kernel was tiled for (bytes)."""

MIN_GROUP = 32
"""Smallest w4 group the kernel takes: a step's products contract g (or g / 2) values, and the matrix unit needs
at least 16."""

DOT_ROWS = 16
"""Rows of one block (bm): the matrix unit's smallest M. Fewer rows (a decode step has 1) are padded."""

KERNEL_MAX_ROWS = 64
"""Most activation rows a product goes through the kernel with on a GPU (4 row blocks); longer products (prefill
chunks) take XLA's dot (`model.quant`'s dispatch; `model.kernels.choice` says why)."""

MIN_PROGRAMS = 256
"""Programs the split-K grid aims for (about two per streaming multiprocessor on the largest GPUs): a decode
product has few output blocks (E2B's o_proj: 1536 outputs), too few to keep every multiprocessor reading."""

BLOCK_N = (256, 128, 64, 32)
"""Output block sizes tried, largest first (powers of two: Triton's tensors are)."""
GROUPS_PER_STEP = (4, 2, 1)
"""Contraction step sizes tried, in w4 groups, largest first."""
STAGES = (4, 3, 2, 1)
"""Pipeline stages tried."""
WARPS = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tiling:
    """One tiling of the kernel: block sizes bm (rows), bn (outputs), bk (contraction values per step), pipeline
    `stages`, `splits` programs along K and Triton `warps`. Hashable: it is a static field of a quantized leaf
    (`model.quant.QuantArray.tiling`). `text` is its manifest form, e.g. "bm16 bn256 bk512 stages3 splits2 warps4"."""

    bm: int
    bn: int
    bk: int
    stages: int
    splits: int = 1
    warps: int = WARPS

    @property
    def text(self) -> str:
        return (f"bm{self.bm} bn{self.bn} bk{self.bk} stages{self.stages} splits{self.splits} "
                f"warps{self.warps}")  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class Projection:
    """One quantized projection shape: `field` (a `model.params.LayerParams` field), K, N, `axis` (the weight's
    contraction axis: 0 for [K, N], 1 for [N, K]), `group` (w4 values per scale along K) and `layers` (how many
    layers have it)."""

    field: str
    k: int
    n: int
    axis: int
    group: int
    layers: int = 1

    @property
    def label(self) -> str:
        """"qkv_DX K=1536 N=2560": the projection as tables and manifests name it."""
        return f"{self.field} K={self.k} N={self.n}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Need:
    """The scratch bytes of one block, term by term (the module docstring's formula) and their total."""

    terms: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(b for _, b in self.terms)

    @property
    def dominant(self) -> tuple[str, int]:
        """The largest term (name, bytes)."""
        return max(self.terms, key=lambda t: t[1])


def need(t: Tiling, *, group: int, act_bytes: int = 2, scale_bytes: int = 2) -> Need:
    """`Need` of tiling `t` for w4 groups of `group` values, activations of `act_bytes` and scales of `scale_bytes`
    bytes (the module docstring's formula; bytes)."""
    st = t.stages
    return Need(terms=(
        (f"input block ({st} x {t.bm}x{t.bk} x {act_bytes} B)", st * t.bm * t.bk * act_bytes),
        (f"packed int4 tile ({st} x {t.bk}x{t.bn} / 2 B)", st * t.bk * t.bn // 2),
        (f"scales ({st} x {-(-t.bk // group)}x{t.bn} x {scale_bytes} B)", st * -(-t.bk // group) * t.bn * scale_bytes),
        (f"dequantized tile ({t.bk}x{t.bn} x {act_bytes} B)", t.bk * t.bn * act_bytes),
        (f"accumulator ({t.bm}x{t.bn} x 4 B)", t.bm * t.bn * 4),
        (f"output ({t.bm}x{t.bn} x 4 B)", t.bm * t.bn * 4),
    ))  # fmt: skip


def limit_for(capability: str) -> int | None:
    """The scratch limit (bytes) of a device named by NVIDIA compute capability ("7.5", "9.0"; "9" reads "9.0")
    or "tpu"; None when the table has no entry for it."""
    if capability.lower() == "tpu":
        return TPU_VMEM
    major, _, minor = capability.partition(".")
    return LIMITS.get(f"{major}.{minor or 0}")


def projections(cfg, group: int) -> tuple[Projection, ...]:
    """The distinct w4 projection shapes of a `model.config.ModelConfig` (the layer projections `w4` quantizes:
    `model.quantspec.LAYER_PROJECTIONS`, in the compute layout), first-seen order, with their layer counts."""
    from model.shapes import compute_layer_shapes  # jax-free
    from model.quantspec import LAYER_PROJECTIONS

    seen: dict[tuple[str, int, int, int], int] = {}
    for i in range(cfg.num_layers):
        shapes = compute_layer_shapes(cfg, i)
        for field, (axis,) in LAYER_PROJECTIONS.items():
            shape = shapes[field]
            if shape is not None:
                key = (field, shape[axis], shape[1 - axis], axis)
                seen[key] = seen.get(key, 0) + 1
    return tuple(Projection(field=f, k=k, n=n, axis=a, group=min(group, k), layers=c)
                 for (f, k, n, a), c in seen.items())  # fmt: skip


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def shape_problem(p: Projection) -> str | None:
    """Why the kernel cannot tile projection `p` at all (whatever the memory), or None: the group must be a power
    of two of at least `MIN_GROUP` dividing K, and N a multiple of the smallest output block."""
    if not _pow2(p.group) or p.group < MIN_GROUP:
        return f"group {p.group} is not a power of two >= {MIN_GROUP}"
    if p.k % p.group:
        return f"K={p.k} is not a multiple of the group {p.group}"
    if p.n % min(BLOCK_N):
        return f"N={p.n} is not a multiple of {min(BLOCK_N)}"
    return None


def tile_problem(t: Tiling) -> str | None:
    """Why the kernel (`model.kernels.w4a16`) cannot run tiling `t` at any shape, or None. Triton's loads and
    stores take tensors of power-of-two sizes and its matrix product needs at least 16 along each axis, so: bm a
    power of two >= `DOT_ROWS`, bn a power of two >= `min(BLOCK_N)` (a [K, N] weight's step multiplies bn / 2
    outputs at a time), warps a power of two."""
    if not _pow2(t.bm) or t.bm < DOT_ROWS:
        return f"bm {t.bm} is not a power of two >= {DOT_ROWS} (the matrix unit's rows)"
    if not _pow2(t.bn) or t.bn < min(BLOCK_N):
        return f"bn {t.bn} is not a power of two >= {min(BLOCK_N)}"
    if not _pow2(t.warps):
        return f"warps {t.warps} is not a power of two"
    return None


def tiling_problem(k: int, n: int, group: int, t: Tiling) -> str | None:
    """Why tiling `t` cannot tile a K x N product with w4 groups of `group` values, or None: the group a power of
    two >= `MIN_GROUP`, bk a multiple of the group, bk dividing K, bn dividing N, the splits dividing the K / bk
    steps. Only the block sizes against the shape (`tile_problem` checks the tiling alone)."""
    if not _pow2(group) or group < MIN_GROUP:
        return f"group {group} is not a power of two >= {MIN_GROUP}"
    if t.bk % group:
        return f"bk {t.bk} is not a multiple of the group {group}"
    if k % t.bk:
        return f"bk {t.bk} does not divide K={k}"
    if n % t.bn:
        return f"bn {t.bn} does not divide N={n}"
    if (k // t.bk) % t.splits:
        return f"splits {t.splits} does not divide the {k // t.bk} steps of bk {t.bk} along K={k}"
    return None


def fits_kernel(k: int, n: int, group: int, t: Tiling) -> bool:
    """Whether the kernel can run a K x N product with w4 groups of `group` at tiling `t` (`tile_problem` and
    `tiling_problem` both None): the one check `model.kernels.w4a16.w4a16_matmul` and the dispatch
    (`model.quant.matmul`) apply, so the kernel never runs on a shape it cannot tile."""
    return tile_problem(t) is None and tiling_problem(k, n, group, t) is None


def candidates(p: Projection) -> list[Tiling]:
    """Every tiling of projection `p` the kernel can run (blocks dividing K and N), largest first: pipelined
    (2+ stages) before not, then by weight tile (bn x bk), then stages, then bn. Splits: as many as K allows, up
    to what brings the grid to `MIN_PROGRAMS` programs."""
    if shape_problem(p):
        return []
    out = []
    for bn in BLOCK_N:
        for per in GROUPS_PER_STEP:
            bk = per * p.group
            if p.n % bn or p.k % bk:
                continue
            steps = p.k // bk
            want = -(-MIN_PROGRAMS // (p.n // bn))
            splits = max(d for d in range(1, steps + 1) if steps % d == 0 and d <= want)
            out += [Tiling(bm=DOT_ROWS, bn=bn, bk=bk, stages=s, splits=splits) for s in STAGES]
    return sorted(out, key=lambda t: (t.stages >= 2, t.bn * t.bk, t.stages, t.bn), reverse=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fit:
    """The fit check of one projection: the tiling chosen (None where none fits or the shape cannot be tiled),
    `tried` (the tiling whose `need` is given: the chosen one, the one asked for, or the smallest candidate where
    none fits), its `need` (bytes), the `limit` (bytes) and `problem` (why not, or None)."""

    projection: Projection
    tiling: Tiling | None
    need: Need | None
    limit: int
    problem: str | None = None
    tried: Tiling | None = None

    @property
    def fits(self) -> bool:
        return self.tiling is not None


def choose(p: Projection, limit: int, *, act_bytes: int = 2, scale_bytes: int = 2,
           tiling: Tiling | None = None) -> Fit:  # fmt: skip
    """The largest tiling of `candidates(p)` whose `need` is within `limit` bytes; with `tiling` given, that tiling
    alone: it fits when it tiles the shape (`shape_problem`, `tiling_problem`) and its need is within the limit.
    A `Fit` whose tiling is None says why: the shape (need None), or the need of the smallest candidate (or of the
    tiling given) over the limit. A given tiling's block sizes alone (`tile_problem`) are not checked here: the
    published TPU tiles (`published_tiling`, bm 8) are another kernel's, compared for memory only; `parse_tiling`
    refuses a tiling text this kernel cannot run."""
    return choose_by(p, limit, tiling=tiling, shape_problem=shape_problem, candidates=candidates,
                     need_of=lambda t: need(t, group=p.group, act_bytes=act_bytes, scale_bytes=scale_bytes),
                     given_problem=lambda t: shape_problem(p) or tiling_problem(p.k, p.n, p.group, t))  # fmt: skip


def choose_by(p: Projection, limit: int, *, tiling, shape_problem: Callable, candidates: Callable,
              need_of: Callable, given_problem: Callable) -> Fit:  # fmt: skip
    """The search `choose` and `fit_tpu.choose_tpu` share, for any kernel's tilings: with `tiling` given, that
    tiling alone (`given_problem(tiling)`, a str or None, refuses it; else it fits when `need_of(tiling).total` is
    within `limit` bytes); else `shape_problem(p)` (str or None) refuses the shape, or the first of
    `candidates(p)` whose need is within the limit fits, or the candidate of the smallest need is reported over the
    limit. Returns a `Fit`; raises nothing of its own."""
    if tiling is not None:
        problem = given_problem(tiling)
        if problem:
            return Fit(projection=p, tiling=None, need=None, limit=limit, problem=problem, tried=tiling)
        n = need_of(tiling)
        ok = n.total <= limit
        return Fit(projection=p, tiling=tiling if ok else None, need=n, limit=limit,
                   problem=None if ok else "over the limit", tried=tiling)  # fmt: skip
    problem = shape_problem(p)
    if problem:
        return Fit(projection=p, tiling=None, need=None, limit=limit, problem=problem)
    tried = candidates(p)
    for t in tried:
        n = need_of(t)
        if n.total <= limit:
            return Fit(projection=p, tiling=t, need=n, limit=limit, tried=t)
    if not tried:
        return Fit(projection=p, tiling=None, need=None, limit=limit, problem="no tiling of the kernel tiles this shape")
    smallest = min(tried, key=lambda t: need_of(t).total)
    return Fit(projection=p, tiling=None, need=need_of(smallest), limit=limit, problem="over the limit", tried=smallest)


def plan(projs: Iterable[Projection], limit: int, *, act_bytes: int = 2, scale_bytes: int = 2,
         tiling: Tiling | None = None) -> tuple[Fit, ...]:  # fmt: skip
    """`choose` for every projection."""
    return tuple(choose(p, limit, act_bytes=act_bytes, scale_bytes=scale_bytes, tiling=tiling) for p in projs)


def published_tiling(p: Projection) -> Tiling:
    """The reconstructed published TPU tiling at projection `p` (module docstring): bm 8, bn 128, bk = K, 2
    stages."""
    return Tiling(bm=8, bn=128, bk=p.k, stages=2)


PUBLISHED_TILING = "bm8 bn128 bk=K stages2"
"""The reconstructed published tiling, as text (`published_tiling` gives it at a projection)."""


def refusal(f: Fit, device: str, *, act_bytes: int = 2, scale_bytes: int = 2) -> str:
    """The one-line refusal of a projection where nothing fits: need, limit, the dominating term, and the tiling
    that would fit (the largest candidate within the limit), or that none would."""
    return refusal_line(f, device, kernel="w4a16 kernel", memory="of scratch per block", limit_name="limit",
                        best=lambda: choose(f.projection, f.limit, act_bytes=act_bytes, scale_bytes=scale_bytes),
                        none_fits=lambda best: ("no tiling of this kernel fits (the smallest needs "
                                                f"{best.need.total if best.need else 0:,} B); "
                                                "use --kernel w4a16=xla"))  # fmt: skip


def refusal_line(f: Fit, device: str, *, kernel: str, memory: str, limit_name: str, best: Callable[[], Fit],
                 none_fits: Callable[[Fit], str]) -> str:  # fmt: skip
    """The one-line refusal `refusal` and `fit_tpu.refusal_tpu` share: for a `Fit` with no need (the shape or the
    given tiling does not tile), what does not tile and its problem; else the need in bytes and KiB (`memory` says
    of what), the `limit_name`d limit, the dominating term, and the tiling that would fit (`best()`, the kernel's
    own search), or `none_fits(best())` when none would. `kernel` opens the line ("w4a16 kernel")."""
    p, n = f.projection, f.need
    if n is None:
        what = f"{f.tried.text} does not tile it" if f.tried else "cannot be tiled"
        return f"{kernel}: {p.label} on {device}: {what} ({f.problem})"
    name, b = n.dominant
    fit = best()
    would = f"{fit.tiling.text} would fit ({fit.need.total:,} B)" if fit.fits else none_fits(fit)
    tiles = f.tried.text if f.tried else "the smallest tiling"
    return (f"{kernel}: {p.label} on {device}: {tiles} needs {n.total:,} B ({n.total / KIB:,.0f} KiB) {memory}, "
            f"over the {limit_name} of {f.limit:,} B ({f.limit / KIB:,.0f} KiB); the largest term is the {name} at "
            f"{b:,} B; {would}")  # fmt: skip


def parse_tiling(text: str) -> Tiling:
    """"bm16 bn128 bk256 stages3 [splits2] [warps4]" (spaces or commas) -> `Tiling`. Raises ValueError naming the
    text and the expected form, or, for block sizes the kernel cannot run at any shape, why (`tile_problem`)."""
    fields = tiling_fields(text, keys=("bm", "bn", "bk", "stages", "splits", "warps"),
                           required=("bm", "bn", "bk", "stages"),
                           expected="expected e.g. 'bm16 bn128 bk256 stages3' (splits, warps optional)",
                           needs="needs bm, bn, bk and stages, e.g. 'bm16 bn128 bk256 stages3'")  # fmt: skip
    t = Tiling(**fields)
    problem = tile_problem(t)
    if problem:
        raise ValueError(f"tiling {text!r}: {problem}; expected e.g. 'bm16 bn128 bk256 stages3'")
    return t



def tiling_fields(text: str, *, keys: tuple[str, ...], required: tuple[str, ...], expected: str, needs: str,
                  zero_ok: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> dict[str, int]:  # fmt: skip
    """The words of a tiling text (spaces or commas) -> {key: whole number}, as `parse_tiling` and
    `fit_tpu.parse_tpu_tiling` read them: each word is a key of `keys` followed by its digits (at least 1, or 0 for
    a key in `zero_ok`); a word in `skip` is passed over. Raises ValueError "tiling '<text>': <expected>" for any
    other word and "tiling '<text>': <needs>" when a key of `required` is missing."""
    fields = {}
    for part in text.replace(",", " ").split():
        if part in skip:
            continue
        key = part.rstrip("0123456789")
        value = part[len(key):]
        if key not in keys or not value or int(value) < (0 if key in zero_ok else 1):
            raise ValueError(f"tiling {text!r}: {expected}")
        fields[key] = int(value)
    if not set(required) <= set(fields):
        raise ValueError(f"tiling {text!r}: {needs}")
    return fields

# ---- the --kernel option -----------------------------------------------------------------------------------------
KERNEL_OPTIONS = ("pallas", "xla")
"""The implementations of the w4 product `--kernel w4a16=IMPL` chooses."""

TILING_POLICIES = ("fewest", "steps", "fused", "resident")
"""The TPU kernel's tiling policies `--kernel w4a16=pallas:POLICY` names (what each orders first:
`model.kernels.fit_tpu.candidates_tpu`); "fused" is "steps" with each layer's MLP (gate_up, GeGLU, down) in one
kernel call where it fits (`model.kernels.fit_tpu.fuse_mlp`, `model.kernels.w4_mlp_tpu`); "resident" is "steps"
with the small products in the kernel's resident form (`model.kernels.fit_tpu.mark_resident`)."""

DEFAULT_POLICY = "steps"
"""The policy `--kernel w4a16=pallas` (no policy named) uses: the faster one measured end to end on the lent TPU
v5e (E2B `w4`, 41 tokens, host loop, 2026-12-07): 254.8 and 254.6 tok/s against `fewest`'s 240.7 and 240.5
(alternating, twice, runs/2026-12-07-tpu-w4perm-*), and after the layout change 326.3 against 322.0 (one pair,
runs/2026-12-07-tpu-w4nat-*); reports/2026-12-07-w4-natural-order-tpuv5e."""


def parse_kernel(text: str | None) -> str | None:
    """`--kernel` text -> "pallas", "pallas:POLICY", "xla", or None (not given: the engine decides). POLICY names
    the TPU kernel's tiling policy (`TILING_POLICIES`); the default policy's name is dropped
    ("w4a16=pallas:fewest" -> "pallas"), so naming the default resolves to the same configuration (and build id).
    Raises ValueError (one line: received, expected) for anything else."""
    if text is None:
        return None
    name, sep, value = text.strip().partition("=")
    impl, colon, policy = value.partition(":")
    if name != "w4a16" or not sep or impl not in KERNEL_OPTIONS or (colon and (impl != "pallas" or
                                                                             policy not in TILING_POLICIES)):
        raise ValueError(f"--kernel {text}: expected w4a16=pallas (the fused Pallas kernel; on a TPU "
                         f"w4a16=pallas:POLICY picks its tiling policy, one of {', '.join(TILING_POLICIES)}) or "
                         "w4a16=xla (XLA's dequantize-and-dot)")  # fmt: skip
    return impl if not colon or policy == DEFAULT_POLICY else f"{impl}:{policy}"


def split_kernel(kernel: str | None) -> tuple[str | None, str | None]:
    """A `parse_kernel` result -> (implementation "pallas" / "xla" / None, tiling policy or None: the default)."""
    if kernel is None:
        return None, None
    impl, _, policy = kernel.partition(":")
    return impl, policy or None
