"""`bench kernels fit`: the fit check of the W4A16 kernels per projection, without a device (no jax): the Triton
kernel's shared memory on NVIDIA compute capabilities, the Mosaic TPU kernel's VMEM on TPUs ("tpu", "tpu-v5e")."""

from __future__ import annotations

import dataclasses

import json

import typer

from bench.cli.root import app
from bench.cli.common import PRESET_NAMES, make_console
from bench.errors import InputError

kernels_app = typer.Typer(help="The engine's hand-written kernels: whether their tiles fit a device.",
                          no_args_is_help=True)  # fmt: skip
app.add_typer(kernels_app, name="kernels")

_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


def _capabilities(given: list[str] | None) -> list[str]:
    """The devices to check: the `--device-capability` values (validated), default every capability of the table."""
    from model.kernels.fit import LIMITS, limit_for
    from model.kernels.fit_tpu import TPU_DEVICES

    known = sorted(LIMITS, key=lambda cc: tuple(int(p) for p in cc.split(".")))  # 7.5, 8.0, ..., 12.0
    if not given:
        return known
    for cc in given:
        if limit_for(cc) is None and cc.lower() not in TPU_DEVICES:
            raise InputError(f"--device-capability {cc}: no shared-memory or VMEM limit known for it; expected one "
                             f"of {', '.join(known)} (NVIDIA) or {', '.join(TPU_DEVICES)}")  # fmt: skip
    return list(given)


def _tpu_generation(capability: str) -> str | None:
    """"tpu" -> "v5e" (the lent machine's), "tpu-v6e" -> "v6e"; None for an NVIDIA capability."""
    from model.kernels.fit_tpu import TPU_DEVICES

    cc = capability.lower()
    if cc not in TPU_DEVICES:
        return None
    return "v5e" if cc == "tpu" else cc.removeprefix("tpu-")


def tpu_fit_rows(preset: str, capability: str, group: int, act: str, scale: str, tiling: str | None,
                 policy: str | None = None) -> dict:  # fmt: skip
    """`fit_rows` for a TPU (`capability` "tpu" or "tpu-GEN"): the Mosaic TPU kernel's tiling per projection
    under the tiling `policy` (`model.kernels.fit_tpu.TILING_POLICIES`; None: the default), its grid steps
    (one row block) and its VMEM bytes per grid step against the budget (a share of the scoped limit the kernel
    sets, capped by the generation's VMEM). A preset with experts (26B-A4B) adds its expert projections
    (`model.kernels.fit_tpu.expert_projections`): one expert's [K, N] product, K padded to whole groups, stored
    as int32 words [E, K / 8, N] (`model.kernels.tpu_layout.to_tpu_experts`), which the expert kernel multiplies
    tile by tile (a (token, expert) pair: that many grid steps each); their rows carry `experts` (E),
    `k_unpadded` and `words` ([E, K / 8, N]; a dense row [K / 8, N]). Raises InputError for an unknown preset or
    policy, a bad tiling text, or a tiling that tiles none of the projections."""
    from model.config import PRESETS
    from model.kernels import fit, fit_tpu

    if preset not in PRESETS:
        raise InputError(f"--preset {preset}: unknown preset; expected one of {', '.join(PRESETS)}")
    fixed = None
    if tiling is not None:
        try:
            fixed = fit_tpu.parse_tpu_tiling(tiling)
        except ValueError as exc:
            raise InputError(f"--{exc}") from None
    if policy is not None and policy not in fit_tpu.TILING_POLICIES:
        raise InputError(f"--tiling-policy {policy}: unknown policy; expected one of "
                         f"{', '.join(fit_tpu.TILING_POLICIES)} (default {fit_tpu.DEFAULT_POLICY})")  # fmt: skip
    policy = fit_tpu.parse_policy(policy)
    gen = _tpu_generation(capability)
    cap = fit_tpu.vmem_capacity(gen)
    limit = fit_tpu.budget(cap)
    device = (f"TPU {gen} (VMEM {cap // 2**20} MiB per core; budget {fit_tpu.BUDGET_SHARE:.0%} of the "
              f"{fit_tpu.SCOPED_VMEM // 2**20} MiB scoped limit the kernel sets)")  # fmt: skip
    sizes = {"act_bytes": _ITEMSIZE[act], "scale_bytes": _ITEMSIZE[scale]}
    cfg = PRESETS[preset]
    projs, dense_k = _tpu_projections(cfg, group)
    unpadded = _expert_k(cfg)
    if fixed is not None:
        problems = [fit_tpu.tiling_problem_tpu(p.k, p.n, p.group, fixed) for p in projs]
        if all(problems):
            raise InputError(f"--tiling {tiling!r}: tiles none of preset {preset}'s w4 projections at w4:{group} "
                             f"({'; '.join(dict.fromkeys(problems))}); expected bk a multiple of the group dividing "
                             "K and bn (a multiple of 128) dividing N, or no --tiling (the largest tiling that "
                             "fits)")  # fmt: skip
    rows, refusals = [], []
    for p, f in zip(projs, fit_tpu.plan_tpu(projs, limit, tiling=fixed, policy=policy, **sizes), strict=True):
        rows.append({"projection": p.field, "layers": p.layers, "k": p.k, "n": p.n, "axis": p.axis,
                     "tiling": f.tried.text if f.tried else None, "need": f.need.total if f.need else None,
                     "limit": limit, "fits": f.fits, "dominant": f.need.dominant[0] if f.need else None,
                     "problem": f.problem, "grid_steps": fit_tpu.grid_steps(p.k, p.n, f.tried) if f.tried and
                     not fit_tpu.tiling_problem_tpu(p.k, p.n, p.group, f.tried) else None,
                     "block_bytes": f.tried.bk * f.tried.bn // 2 if f.tried else None,
                     "experts": cfg.num_experts if p.field in unpadded else None,
                     "k_unpadded": unpadded.get(p.field, dense_k.get(p.field, p.k)),
                     "words": [*([cfg.num_experts] if p.field in unpadded else []), p.k // 8, p.n]})  # fmt: skip
        if not f.fits:
            refusals.append(fit_tpu.refusal_tpu(f, device, **sizes))
    return {"preset": preset, "device": device, "capability": capability, "limit": limit, "group": group,
            "activation_dtype": act, "scale_dtype": scale,
            "tiling": tiling or f"policy {policy} ({_POLICY_TEXT[policy]})", "rows": rows, "refusals": refusals,
            "kernel": "model.kernels.w4a16_tpu (Mosaic TPU)", "policy": policy}  # fmt: skip


def _tpu_projections(cfg, group: int):
    """(every w4 projection of `cfg` as a TPU's plan has it: dense K padded to whole groups, as
    `model.kernels.choice.plan_kernel` pads it, then the experts'; {dense field: its K before padding} where padded)."""
    from model.kernels import fit, fit_tpu

    dense = fit.projections(cfg, group)
    projs = tuple(dataclasses.replace(p, k=fit_tpu.padded_k(p.k, p.group)) for p in dense)
    return projs + fit_tpu.expert_projections(cfg, group), {p.field: p.k for p in dense
                                                            if p.k != fit_tpu.padded_k(p.k, p.group)}


def _expert_k(cfg) -> dict[str, int]:
    """{expert field: its contraction length before the TPU layout's padding} of a config ({} without experts)."""
    from model.accounting import expert_shapes
    from model.quantspec import EXPERT_PROJECTIONS

    shapes = expert_shapes(cfg)
    return {f: shapes[f][axis] for f, (axis,) in EXPERT_PROJECTIONS.items() if shapes[f] is not None}


_POLICY_TEXT = {"fewest": "the fewest grid steps that fit",
                "steps": "at least MIN_STEPS grid steps of blocks of at least MIN_BLOCK_BYTES, along N first",
                "fused": "steps, and each MLP's gate_up, GeGLU and down in one kernel call (mlp: values per step)",
                "resident": "steps, and products of at most 2 MiB with every operand whole in VMEM"}


def fit_rows(preset: str, capability: str, group: int, act: str, scale: str, tiling: str | None,
             policy: str | None = None) -> dict:  # fmt: skip
    """The fit check of preset `preset` on a device of `capability` as a JSON-able dict: device, limit (bytes),
    rows (projection, layers, K, N, axis, tiling, need, fits, dominant term, problem) and refusal lines (one per
    projection over the limit). `tiling`: None (the largest that fits), "published"
    (`model.kernels.fit.published_tiling`) or a tiling text. A given tiling that does not tile a projection's
    shape (`model.kernels.fit.tiling_problem`: e.g. bk not dividing K) does not fit it: need None, the problem
    named. Raises InputError for an unknown preset, a bad tiling text, or a tiling that tiles none of the
    projections. `policy`: the TPU kernel's tiling policy (`tpu_fit_rows`; InputError when given for an NVIDIA
    capability)."""
    from model.config import PRESETS
    from model.kernels import fit

    if _tpu_generation(capability) and tiling != "published":
        return tpu_fit_rows(preset, capability, group, act, scale, tiling, policy)
    if policy is not None:
        raise InputError(f"--tiling-policy {policy}: chooses the TPU kernel's tiling; --device-capability {capability} "
                         "is not a TPU (expected tpu or tpu-GEN, or no --tiling-policy)")  # fmt: skip
    if preset not in PRESETS:
        raise InputError(f"--preset {preset}: unknown preset; expected one of {', '.join(PRESETS)}")
    fixed = None
    if tiling not in (None, "published"):
        try:
            fixed = fit.parse_tiling(tiling)
        except ValueError as exc:
            raise InputError(f"--{exc}") from None
    limit = fit.limit_for(capability)
    device = "TPU (scoped VMEM)" if capability.lower() == "tpu" else f"compute capability {capability}"
    sizes = {"act_bytes": _ITEMSIZE[act], "scale_bytes": _ITEMSIZE[scale]}
    projs = fit.projections(PRESETS[preset], group)
    given = {p: fit.published_tiling(p) if tiling == "published" else fixed for p in projs}
    if tiling is not None:
        problems = [fit.shape_problem(p) or fit.tiling_problem(p.k, p.n, p.group, t) for p, t in given.items()]
        if all(problems):
            ks = ", ".join(str(k) for k in sorted({p.k for p in projs}))
            raise InputError(f"--tiling {tiling!r}: tiles none of preset {preset}'s w4 projections at w4:{group} "
                             f"({'; '.join(dict.fromkeys(problems))}); expected bk a multiple of the group dividing K "
                             f"(K: {ks}) and bn dividing N, or no --tiling (the largest tiling that fits)")  # fmt: skip
    rows, refusals = [], []
    for p in projs:
        f = fit.choose(p, limit, tiling=given[p], **sizes)
        shown = f.tried
        rows.append({"projection": p.field, "layers": p.layers, "k": p.k, "n": p.n, "axis": p.axis,
                     "tiling": shown.text if shown else None, "need": f.need.total if f.need else None,
                     "limit": limit, "fits": f.fits, "dominant": f.need.dominant[0] if f.need else None,
                     "problem": f.problem})  # fmt: skip
        if f.problem == "over the limit":
            refusals.append(fit.refusal(f, device, **sizes))
    return {"preset": preset, "device": device, "capability": capability, "limit": limit, "group": group,
            "activation_dtype": act, "scale_dtype": scale, "tiling": tiling or "largest that fits", "rows": rows,
            "refusals": refusals}  # fmt: skip


def _print(result: dict) -> None:
    from rich.table import Table

    from model.kernels.fit import KIB

    limit = result["limit"]
    table = Table(title=f"w4a16 kernel fit: preset {result['preset']}, w4:{result['group']}, {result['device']}: "
                  f"limit {limit:,} B ({limit / KIB:,.0f} KiB) per "
                  f"{'grid step' if 'kernel' in result else 'block'}; tiling: {result['tiling']}")  # fmt: skip
    tpu = "kernel" in result
    experts = any(r.get("experts") for r in result["rows"])
    cols = ("projection", "layers", "K", "N", *(("weights (int32 words)",) if experts else ()), "tiling",
            *(("grid steps", "weight block") if tpu else ()), "bytes needed", "limit", "fits")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col in ("projection", "tiling") else "right")
    for r in result["rows"]:
        need = "—" if r["need"] is None else f"{r['need']:,} ({r['need'] / KIB:,.0f} KiB)"
        fits = "yes" if r["fits"] else ("no: " + (r["problem"] or ""))
        steps = (("—" if r["grid_steps"] is None else str(r["grid_steps"]),
                  "—" if r["block_bytes"] is None else f"{r['block_bytes'] / KIB:,.0f} KiB") if tpu else ())
        name, k = r["projection"], str(r["k"])
        if r.get("experts"):
            name = f"{name} (one expert of {r['experts']})"
        k = k if r.get("k_unpadded", r["k"]) == r["k"] else f"{k} ({r['k_unpadded']} padded)"
        words = (f"[{', '.join(str(x) for x in r['words'])}]",) if experts else ()
        table.add_row(name, str(r["layers"]), k, str(r["n"]), *words, r["tiling"] or "—", *steps, need, f"{limit:,}",
                      fits)  # fmt: skip
    console = make_console()
    console.print(table)
    needs = [r["need"] for r in result["rows"] if r["need"] is not None]
    if needs:
        over = sum(1 for r in result["rows"] if r["problem"] == "over the limit")
        untiled = sum(1 for r in result["rows"] if r["need"] is None)
        console.print(f"bytes needed per block: {min(needs):,} to {max(needs):,} ({min(needs) / KIB:,.0f} to "
                      f"{max(needs) / KIB:,.0f} KiB; {min(needs) / limit:.1f}x to {max(needs) / limit:.1f}x the limit); "
                      f"{over} of {len(result['rows'])} projections over the limit"
                      + (f"; {untiled} not tiled at all (see fits)" if untiled else ""), soft_wrap=True)  # fmt: skip
    if experts:
        console.print("expert rows: one expert's [K, N] product (K padded to whole groups with zero values) of the "
                      "[E, K / 8, N] words; the expert kernel runs its grid steps once per (token, expert) tile of a "
                      "step, one call per projection per layer (docs/devices/tpu.md, \"The experts' kernel\")",
                      soft_wrap=True, markup=False)  # fmt: skip
    for line in result["refusals"]:
        console.print(line, soft_wrap=True, markup=False)


def _group(group: int | None, quant: str | None) -> int:
    """The w4 group `kernels fit` checks: `--quant`'s (a set with w4), else `--group`, else 128. Raises InputError
    for a set that does not parse or has no w4, or both flags given."""
    from model.errors import QuantError
    from model.quantspec import DEFAULT_W4_GROUP, parse_quant

    if quant is None:
        return DEFAULT_W4_GROUP if group is None else group
    if group is not None:
        raise InputError(f"--quant {quant} and --group {group}: give one (--quant w4:GROUP sets the group)")
    try:
        spec = parse_quant(quant)
    except QuantError as exc:
        raise InputError(str(exc)) from None
    if spec.layer_bits != 4:
        raise InputError(f"--quant {quant}: the w4a16 kernels multiply w4 weights, and this set has none; expected "
                         "a set with w4 or w4:GROUP, e.g. --quant w4")  # fmt: skip
    return spec.w4_group


@kernels_app.command("fit")
def kernels_fit(
    device_capability: list[str] | None = typer.Option(
        None, "--device-capability", help="NVIDIA compute capability (7.5, 8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 12.0), or "
        "a TPU: tpu (v5e, the lent machine's) or tpu-GEN (tpu-v5e, tpu-v6e, tpu-v5p, ...): the Mosaic TPU kernel's "
        "tiling and VMEM; repeatable. Default: every NVIDIA capability of the table."),
    preset: str = typer.Option("e2b", "--preset", help="Model preset whose w4 projections are checked "
                               f"({PRESET_NAMES})."),
    group: int | None = typer.Option(None, "--group", help="w4 group size (values per scale along K), as --quant "
                                     "w4:GROUP. Default 128."),
    quant: str | None = typer.Option(None, "--quant", help="The quantization set whose w4 projections are checked "
                                     "(w4 or w4:GROUP, with other options or not, as the engine's --quant): its "
                                     "group, instead of --group."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Activation dtype: bfloat16, float16 or float32."),
    scale_dtype: str = typer.Option("bfloat16", "--scale-dtype", help="Scale dtype: bfloat16, float16 or float32."),
    tiling: str | None = typer.Option(
        None, "--tiling", help="Check one tiling instead of choosing: 'published' (the published TPU-sized tiles, "
        "reconstructed: bm8 bn128 bk=K stages2, in the Triton kernel's model) or e.g. 'bm16 bn128 bk256 stages3' "
        "(bm, bn, warps powers of two, bm >= 16, bn >= 32); on a TPU e.g. 'tpu bm16 bn2048 bk1536'. A projection "
        "whose K the bk (a multiple of the group) does not divide, or whose N the bn does not divide, does not "
        "fit; a tiling that tiles none is refused."),
    tiling_policy: str | None = typer.Option(
        None, "--tiling-policy", help="On a TPU: the kernel's tiling policy, steps (the default: at least 4 grid "
        "steps of weight blocks of at least 384 KiB where the shape has them) or fewest (the fewest grid steps that "
        "fit), as --kernel w4a16=pallas:POLICY chooses it (docs/devices/tpu.md)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tables as JSON (one object per device)."),
) -> None:
    """Per projection: K, N, the tiling chosen (the largest that fits), the scratch bytes one block needs and the
    device's limit; where nothing fits, the refusal with the arithmetic; with --tiling, whether that tiling tiles
    the projection at all. On a TPU a preset with experts (26b-a4b) adds its expert projections (one expert's
    product, and the [E, K / 8, N] words the expert kernel reads). No GPU needed (and no jax imported)."""
    group = _group(group, quant)
    if group < 1:
        raise InputError(f"--group {group}: expected a whole number >= 1, e.g. 128")
    for flag, value in (("--dtype", dtype), ("--scale-dtype", scale_dtype)):
        if value not in _ITEMSIZE:
            raise InputError(f"{flag} {value}: unknown dtype; expected one of {', '.join(_ITEMSIZE)}")
    results = [fit_rows(preset, cc, group, dtype, scale_dtype, tiling, tiling_policy)
               for cc in _capabilities(device_capability)]  # fmt: skip
    if as_json:
        typer.echo(json.dumps(results if len(results) > 1 else results[0]))
        return
    for result in results:
        _print(result)
