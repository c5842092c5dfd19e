"""`bench generate`, `bench checkpoint create` and `bench checkpoint inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from bench.cli.root import app
from bench.cli.common import PRESET_NAMES, CheckpointOpt, CompileCacheOpt, make_console, setup_logging
from bench.cli.engine_options import QUANT_HELP, EngineFlags, engine_options
from bench.errors import InputError, RunFolderError

checkpoint_app = typer.Typer(
    help="Create built-in checkpoints in the Hugging Face format; inspect a checkpoint's weight bytes.",
    no_args_is_help=True,
)
app.add_typer(checkpoint_app, name="checkpoint")


PromptOpt = typer.Option(
    ..., "--prompt", "-p",
    help="The user message, wrapped in Gemma's chat turn format; it is always text (a control-token string such as "
    "<turn|> in it is encoded as ordinary characters).",
)  # fmt: skip
MaxNewOpt = typer.Option(32, "--max-new-tokens", "-n", help="Tokens to generate (stops at EOS).")
RawOpt = typer.Option(
    False, "--raw",
    help="Feed BOS + exactly the prompt given, without the chat turn format; special-token strings in it "
    "(<|turn>, <turn|>, <eos>, ...) are parsed as those tokens.",
)  # fmt: skip
DecodeLoopOpt = typer.Option(
    "host", "--decode-loop", help="host (default: one step per token, stops at EOS) or device (the tokens after the "
    "first in one device loop, or blocks of --decode-block steps: exactly --max-new-tokens are generated, and what "
    "follows the first EOS is dropped from the output); prints its timing on stderr.")
DecodeBlockOpt = typer.Option(None, "--decode-block", help="With --decode-loop device: steps per device call (default: "
                              "all in one).")  # fmt: skip


@app.command()
@engine_options("dtype", "max_length", "quant", "scale_dtype", "kernel", "backend", "mesh")
def generate(
    prompt: str = PromptOpt, checkpoint: str | None = CheckpointOpt, max_new_tokens: int = MaxNewOpt,
    raw: bool = RawOpt, temperature: float = typer.Option(0.0, help="0 = greedy (default); > 0 samples."),
    top_k: int = typer.Option(0, help="Sample from the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass (1.0 = off)."),
    seed: int = typer.Option(0, help="Sampling seed: the same seed gives the same tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print prompt and generated token ids as JSON."),
    engine_flags: EngineFlags = EngineFlags(), compile_cache: str | None = CompileCacheOpt,
    decode_loop: str = DecodeLoopOpt, decode_block: int | None = DecodeBlockOpt,
) -> None:
    """Generate a completion for one prompt and print it (with --json: the ids, and the quantization and weight
    bytes (packed values + scales, as placed on the device) of the engine that generated them)."""
    from bench.engines import check_generate, generate_once
    from model.engine import Sampling

    check_generate(max_new_tokens, decode_loop, decode_block, temperature, top_k, top_p)
    config = engine_flags.config()  # one line for a bad value, before anything loads
    setup_logging()
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    done = generate_once(checkpoint, config, compile_cache, prompt, raw=raw, max_new_tokens=max_new_tokens,
                         sampling=sampling, decode_loop=decode_loop, block=decode_block)  # fmt: skip
    engine, gen = done.engine, done.generation
    if decode_loop != "host":
        typer.echo(_device_timing_line(gen), err=True)
    if not as_json:
        typer.echo(done.text)
        return
    out = {"prompt": prompt, "prompt_ids": done.prompt_ids, "generated_ids": done.shown, "text": done.text,
           "quant": engine.quant.canonical, "scale_dtype": engine.scale_dtype if engine.quant.names else None,
           "weight_bytes": engine.weight_bytes, "backend": engine.backend}  # fmt: skip
    if decode_loop != "host":
        out["decode_loop"] = {"loop": "device", "block": decode_block, "generated": len(gen.token_ids),
                              "prefill_ms": gen.prefill_ms, "decode_ms": gen.decode_ms,
                              "ms_per_step": gen.ms_per_step, "block_ms": gen.block_ms}  # fmt: skip
    typer.echo(json.dumps(out))


def _device_timing_line(gen) -> str:
    """The timing the device loop has (`model.engine.Generation`): prefill, decode time (first token to last on the
    host), its mean ms per step, the blocks, and whether it compiled; no per-step times (one sync per block)."""
    n = len(gen.token_ids)
    decode = "no decode steps" if gen.decode_ms is None else (
        f"decode {gen.decode_ms:.1f} ms for {n - 1} steps = {gen.ms_per_step:.3f} ms/step (mean; one host sync per "
        f"block, {len(gen.block_ms)} block(s) of {min(gen.block or n - 1, n - 1)} steps)")  # fmt: skip
    compiled = (f"; {gen.compile_traces} program(s) compiled during it: these times include compiling (a sweep "
                "warms up first)" if gen.compile_traces else "")  # fmt: skip
    return f"device decode loop: {n} tokens generated; prefill {gen.prefill_ms:.1f} ms; {decode}{compiled}"


@checkpoint_app.command("create")
def checkpoint_create(
    out_dir: Path = typer.Argument(..., help="New directory to write the checkpoint into."),
    preset: str = typer.Option("default", "--preset", help=f"One of {PRESET_NAMES}."),
    seed: int = typer.Option(0, help="Random seed of the weights."),
    dtype: str = typer.Option("bfloat16", help="Stored dtype: bfloat16 (as released), float32 or float16."),
    layout: str = typer.Option("text", help="text (model. prefix) or published (model.language_model. prefix)."),
) -> None:
    """Write a random-weight Gemma 4 checkpoint in the exact Hugging Face format (deterministic)."""
    from model.builtin import create_checkpoint
    from model.checkpoint import content_hash

    if layout not in ("text", "published"):
        raise InputError(f"--layout {layout}: expected 'text' or 'published'")
    path = create_checkpoint(preset, out_dir, seed=seed, dtype=dtype, layout=layout)
    typer.echo(f"wrote {path} (preset {preset}, {dtype}, seed {seed}); content sha256 {content_hash(path)}")


_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
"""Bytes per scalar of the body and scale dtypes `checkpoint inspect` accepts (float64 only as a stored dtype)."""
_STORED = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
"""safetensors dtype names -> the dtype names above."""


def _inspect_source(checkpoint: str | None, preset: str | None, dtype: str | None) -> tuple[dict, object, str]:
    """(facts about the source for the output, its ModelConfig, the body dtype name) of `checkpoint inspect`.
    Raises InputError for both or neither source, an unknown preset or dtype, or mixed stored dtypes without
    --dtype; CheckpointError / ConfigError from the checkpoint's headers."""
    from model.config import PRESETS

    shapes = PRESETS
    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise InputError(f"--dtype {dtype}: unknown dtype; expected float32, bfloat16 or float16")
    if (checkpoint is None) == (preset is None):
        raise InputError("checkpoint inspect: expected a CHECKPOINT directory or --preset NAME (one of them, "
                         "e.g. bench checkpoint inspect --preset e2b)")  # fmt: skip
    if preset is not None:
        if preset not in shapes:
            raise InputError(f"--preset {preset}: unknown preset; expected one of {', '.join(shapes)}")
        return {"preset": preset}, shapes[preset], dtype or "bfloat16"
    from model.checkpoint import read_checkpoint_shapes

    shapes = read_checkpoint_shapes(checkpoint)
    stored = [_STORED[d] for d in shapes.stored_dtypes]
    if dtype is None and len(stored) != 1:
        raise InputError(f"{shapes.path}: tensors are stored in several dtypes ({', '.join(stored)}); pass --dtype "
                         "to say which one the body is placed in")  # fmt: skip
    facts = {"checkpoint": shapes.path, "tensors": shapes.tensors, "ignored_tensors": len(shapes.ignored),
             "stored_dtypes": stored, "stored_bytes": shapes.stored_bytes}  # fmt: skip
    return facts, shapes.config, dtype or stored[0]


def _print_weight_bytes(source: dict, wb, dtype: str, scale_dtype: str) -> None:
    """The component table of `checkpoint inspect` (exact integers with thousands separators) and its total."""
    from rich.table import Table

    what = f"checkpoint {source['checkpoint']}" if "checkpoint" in source else f"preset {source['preset']} (shapes)"
    table = Table(title=f"{what}: body {dtype}, scales {scale_dtype}, quant {wb.quant}")
    for col in ("component", "parameters", "scales", "bytes", "bytes read per decode step", "stored as"):
        table.add_column(col, justify="left" if col in ("component", "stored as") else "right")
    for c in wb.components:
        table.add_row(c.name, f"{c.params:,}", f"{c.scales:,}", f"{c.bytes:,}", f"{c.decode_bytes:,}", c.note)
    table.add_row("total", f"{wb.params:,}", f"{wb.scales:,}", f"{wb.bytes:,}", f"{wb.decode_bytes:,}", "")
    make_console().print(table)
    typer.echo(f"weight bytes: {wb.bytes:,} (packed values + scales; 4-bit values two per byte)")
    if "stored_bytes" in source:
        typer.echo(f"stored in the checkpoint: {source['stored_bytes']:,} bytes ({', '.join(source['stored_dtypes'])}; "
                   f"{source['tensors']} tensors loaded, {source['ignored_tensors']} ignored)")  # fmt: skip


def _plan_flags(cfg, context: int | None, batch: int, mesh: str | None, device: str | None,
                experts: int | None, read_rate: str | None):  # fmt: skip
    """(context, Mesh, Device or None, (read rate bytes/s, where) or None) of `checkpoint inspect`'s planning flags,
    checked before anything is computed: InputError (one line) for a context outside 1..positions, a batch below 1,
    a mesh that does not divide the model (`model.placement.check_mesh`), an unknown device, an expert count
    outside 1..E, a read rate without --device, <= 0, or from a run without one or of another device;
    RunFolderError for a run that is not there."""
    from model.accounting import check_experts_read
    from model.limits import prompt_limits
    from model.placement import check_mesh, parse_mesh

    from bench.runs.devices import device_named, device_names

    positions = cfg.max_position_embeddings
    context = prompt_limits(positions).max_length if context is None else context
    if not 1 <= context <= positions:
        raise InputError(f"--context {context}: expected 1..{positions} positions (the model's "
                         "max_position_embeddings)")  # fmt: skip
    if batch < 1:
        raise InputError(f"--batch {batch}: expected rows >= 1")
    try:
        plan = parse_mesh(mesh)
        check_mesh(cfg, plan)
        check_experts_read(cfg, experts)
    except ValueError as exc:
        raise InputError(f"--experts {exc}" if str(exc).startswith("experts") else str(exc)) from None
    dev = None if device is None else device_named(device)
    if device is not None and dev is None:
        raise InputError(f"--device {device}: unknown device; expected one of {device_names()}")
    return context, plan, dev, None if read_rate is None else _read_rate(read_rate, dev)


def _read_rate(text: str, dev) -> tuple[float, str]:
    """`--read-rate`: GB/s, or a run folder (a path, or a name in runs/) whose measured read rate to use."""
    from bench.runs import open_run
    from bench.runs.devices import run_read_rate
    from bench.runs.listing import resolve_run

    if dev is None:
        raise InputError(f"--read-rate {text}: a measured rate belongs to one kind of device; pass --device too")
    try:
        rate = float(text)
    except ValueError:
        try:
            run = open_run(resolve_run(text, flag="--read-rate"))
        except RunFolderError as exc:
            raise InputError(f"--read-rate {text}: not GB/s, and {exc}") from None
        return run_read_rate(run, dev)
    if not rate > 0:
        raise InputError(f"--read-rate {text}: expected GB/s > 0, or a run folder whose measured read rate to use")
    return rate * 1e9, f"given: {rate:,.0f} GB/s"


def _plan(cfg, body: str, scale_dtype: str, spec, context: int, batch: int, plan, dev, experts, rate) -> dict:
    """The fit of every device (or `dev`) and, with a device, the prediction of its mesh: a JSON-ready dict. Each
    device's weights as placed there (`model.accounting.placement_layout` of its platform, the default kernel:
    on a TPU with w4, the experts in the TPU kernel's layout); "share" is `dev`'s (else the natural layout's)."""
    from model.accounting import NATURAL, placement_layout
    from model.placement import device_share

    from bench.runs.devices import DEVICES, fit_on, predict

    shares: dict[str, object] = {}

    def share_in(layout: str):
        if layout not in shares:
            shares[layout] = device_share(cfg, plan, itemsize=_ITEMSIZE[body], scale_itemsize=_ITEMSIZE[scale_dtype],
                                          quant=spec, context=context, batch=batch, experts=experts,
                                          layout=layout)  # fmt: skip
        return shares[layout]

    fits = []
    for d in DEVICES if dev is None else (dev,):
        layout = placement_layout(d.platform, spec)
        share = share_in(layout)
        mem = fit_on(d, weight_bytes=share.weight_bytes, kv_bytes_per_row=share.kv_bytes_per_row, batch=batch,
                     context=context, count=plan.size)  # fmt: skip
        guess = predict(d, share, *(rate or ()))
        fits.append({"device": d.name, "label": d.label, "memory": d.memory_figure, "capacity": mem.capacity,
                     "capacity_source": d.capacity_text, "layout": layout, "weight_bytes": share.weight_bytes,
                     "usable": mem.usable, "needed": mem.needed, "fits": mem.fits, "largest_batch": mem.largest_batch,
                     "predicted_tok_s": guess.tok_s, "_mem": mem, "_prediction": guess})  # fmt: skip
    layout = placement_layout(dev.platform, spec) if dev is not None else NATURAL
    return {"mesh": plan.text, "devices": plan.size, "context": context, "batch": batch, "share": share_in(layout),
            "layout": layout, "fits": fits}  # fmt: skip


def _print_layouts(plan: dict, wb) -> None:
    """Where a device of the fit table places the weights in another layout than the component table's (a TPU with
    w4 experts: the kernel's layout pads their K), one line per layout: its weight bytes and the devices."""
    if plan["devices"] > 1:  # a mesh: the fit table's figures are per device, and name their layout below
        return
    other: dict[str, list[str]] = {}
    for f in plan["fits"]:
        if f["layout"] != wb.layout:
            other.setdefault(f["layout"], []).append(f["device"])
    for layout, names in other.items():
        placed = next(f["weight_bytes"] for f in plan["fits"] if f["layout"] == layout)
        typer.echo(f"weight bytes as placed on {', '.join(names)}: {placed:,} ({placed - wb.bytes:+,}: the w4 "
                   "projections in the TPU kernel's layout, K padded to whole groups; docs/devices/tpu.md); the fit table "
                   "counts them there")  # fmt: skip


def _print_plan(plan: dict, dtype: str) -> None:
    """The KV cache, the fit table (per device of the mesh) and, for one device type, the prediction's arithmetic."""
    from rich.table import Table

    from bench.runs.devices import fit_line

    share, gb, mesh = plan["share"], 1e9, plan["mesh"]
    per = f" per device of {mesh}" if plan["devices"] > 1 else ""
    typer.echo(f"KV cache{per}: {share.kv_bytes_per_row:,} bytes per row of {plan['context']} positions ({dtype}); "
               f"batch {plan['batch']}: {share.kv_bytes:,} bytes")  # fmt: skip
    if plan["devices"] > 1:
        typer.echo(f"weights per device of {mesh}: {share.weight_bytes:,} bytes, of which {share.replicated_bytes:,} "
                   f"replicated on every device ({', '.join(share.replicated) or 'none'})")  # fmt: skip
    table = Table(title=f"where it fits{per}: weights + batch x KV <= memory less 10% reserved (memory: what a run "
                        f"here recorded, else the datasheet; docs/method.md, \"Where a model fits\")")  # fmt: skip
    for col in ("device", "memory", "capacity GB", "usable GB", "needed GB", "fits", "most rows",
                "predicted decode tok/s"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("device", "memory", "fits") else "right")
    for f in plan["fits"]:
        table.add_row(f["label"], f["memory"], f"{f['capacity'] / gb:.3f}", f"{f['usable'] / gb:.3f}",
                      f"{f['needed'] / gb:.3f}",
                      "yes" if f["fits"] else "no", str(f["largest_batch"]),
                      f"{f['predicted_tok_s']:,.1f}")  # fmt: skip
    make_console().print(table)
    if len(plan["fits"]) != 1:
        return
    f = plan["fits"][0]
    guess, dev = f["_prediction"], f["_prediction"].device
    typer.echo(f"{mesh} on {plan['devices']} x {dev.label}: {fit_line(f['_mem'])}")
    typer.echo(f"decode step (bytes only, docs/method.md \"Predicting a mesh\"): the slowest device reads "
               f"{share.decode_weight_bytes:,} bytes of weights + {plan['batch']} x {share.kv_read_bytes_per_row:,} "
               f"of KV = {share.step_read_bytes:,} bytes at {guess.read_rate / gb:,.0f} GB/s ({guess.read_source}) "
               f"= {guess.memory_s * 1e3:.3f} ms")  # fmt: skip
    if share.routing:  # ep: the routing the slowest device's bytes assume, and the worst case
        worst = share.worst_decode_weight_bytes + plan["batch"] * share.kv_read_bytes_per_row
        typer.echo(f"  {share.routing} (+ KV = {worst:,} bytes, {worst / guess.read_rate * 1e3:.3f} ms)")
    for c in share.collectives:
        typer.echo(f"  {c.count} {c.kind} of {c.what}: {c.payload:,} bytes each, {c.sent:,} sent per device")
    if share.collectives:
        link = dev.link
        typer.echo(f"collectives: {share.collective_bytes:,} bytes sent per device at {link.bytes_per_s / gb:,.0f} "
                   f"GB/s ({link.name}, one direction of {link.figure}) = {guess.link_s * 1e3:.3f} ms")  # fmt: skip
    typer.echo(f"predicted step {guess.step_s * 1e3:.3f} ms: {guess.tok_s:,.1f} tok/s per sequence"
               + (f", {guess.aggregate_tok_s:,.1f} tok/s over {plan['batch']} rows" if plan["batch"] > 1 else ""))


@checkpoint_app.command("inspect")
def checkpoint_inspect(
    checkpoint: str | None = typer.Argument(None, help="A local checkpoint directory (config.json, *.safetensors): "
                                            "only config.json and the safetensors headers are read."),
    preset: str | None = typer.Option(None, "--preset", help="Inspect a preset's shapes instead "
                                      f"({PRESET_NAMES}); nothing is written or read."),
    quant: str | None = typer.Option(None, "--quant", help=QUANT_HELP),
    dtype: str | None = typer.Option(None, "--dtype", help="Dtype the dense weights (and the KV cache) are placed in "
                                     "(float32, bfloat16, float16); default: the checkpoint's stored dtype, bfloat16 "
                                     "for a preset."),
    scale_dtype: str = typer.Option("bfloat16", "--scale-dtype", help="Dtype of the quantization scales: bfloat16, "
                                    "float16 or float32."),
    context: int | None = typer.Option(None, "--context", help="KV cache positions per row for the fit (default: "
                                       "the engine's max length, 8192 or the model's positions if fewer)."),
    batch: int = typer.Option(1, "--batch", help="Rows of KV cache for the fit and the prediction."),
    mesh: str | None = typer.Option(None, "--mesh", help="Plan a mesh: tp=N (heads and widths split) or ep=N "
                                    "(experts split): memory per device and the predicted decode step."),
    device: str | None = typer.Option(None, "--device", help="One device type (t4, l4, a100-40gb, a100-80gb, h100, "
                                      "tpu-v5e, tpu-v6e, tpu-v5p): its fit and the prediction's arithmetic."),
    experts: int | None = typer.Option(None, "--experts", help="Experts per layer a decode step reads (default: the "
                                       "router's top_k; at batch B the union of the rows' choices)."),
    read_rate: str | None = typer.Option(None, "--read-rate", help="With --device: the memory read rate of the "
                                         "prediction, GB/s, or a run folder (path or name in runs/) whose measured "
                                         "read rate to use; default: the device's datasheet bandwidth."),
    as_json: bool = typer.Option(False, "--json", help="Print the components and totals as JSON."),
) -> None:
    """Weight bytes of a checkpoint (or a preset's shapes) by component, as placed on the device, under --quant;
    the KV cache; where it fits; with --mesh, the memory per device and the predicted decode step."""
    import dataclasses

    from model.accounting import weight_bytes_by_component

    from model.engine_config import EngineConfig

    options = EngineConfig.from_options(quant=quant, scale_dtype=scale_dtype)  # one line for a bad value
    spec, scale_dtype = options.quant_spec, options.scales
    source, cfg, body = _inspect_source(checkpoint, preset, dtype)
    context, plan_mesh, dev, rate = _plan_flags(cfg, context, batch, mesh, device, experts, read_rate)
    plan = _plan(cfg, body, scale_dtype, spec, context, batch, plan_mesh, dev, experts, rate)
    wb = weight_bytes_by_component(cfg, _ITEMSIZE[body], scale_itemsize=_ITEMSIZE[scale_dtype], quant=spec,
                                   experts=experts, layout=plan["layout"])  # fmt: skip
    if not as_json:
        _print_weight_bytes(source, wb, body, scale_dtype)
        _print_layouts(plan, wb)
        _print_plan(plan, body)
        return
    totals = {"params": wb.params, "scales": wb.scales, "bytes": wb.bytes, "decode_bytes": wb.decode_bytes}
    share = plan["share"]
    per_device = {k: v for k, v in dataclasses.asdict(share).items() if k not in ("mesh", "collectives")}
    per_device["collectives"] = [{**dataclasses.asdict(c), "total_sent": c.total_sent} for c in share.collectives]
    fits = [{k: v for k, v in f.items() if not k.startswith("_")} for f in plan["fits"]]
    for f, row in zip(plan["fits"], fits, strict=True):
        g = f["_prediction"]
        row["prediction"] = {"read_rate": g.read_rate, "read_source": g.read_source, "memory_s": g.memory_s,
                             "link": g.device.link.name, "link_bytes_per_s": g.device.link.bytes_per_s,
                             "link_s": g.link_s, "step_s": g.step_s, "tok_s": g.tok_s,
                             "aggregate_tok_s": g.aggregate_tok_s}  # fmt: skip
    typer.echo(json.dumps({**source, "dtype": body, "scale_dtype": scale_dtype, "quant": wb.quant, "layout": wb.layout,
                           "components": [dataclasses.asdict(c) for c in wb.components], "total": totals,
                           "context": context, "batch": batch, "mesh": plan["mesh"], "per_device": per_device,
                           "fit": fits}))  # fmt: skip
