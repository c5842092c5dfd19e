"""`bench generate`, `bench checkpoint create` and `bench checkpoint inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from bench.cli import app
from bench.cli.common import (
    BackendOpt,
    CheckpointOpt,
    CompileCacheOpt,
    DtypeOpt,
    KernelOpt,
    MaxLengthOpt,
    QuantOpt,
    ScaleDtypeOpt,
    make_console,
    open_engine,
    parse_backend_flag,
    parse_kernel_flag,
    parse_quant_flags,
    setup_logging,
)
from bench.errors import InputError

checkpoint_app = typer.Typer(
    help="Create built-in checkpoints in the Hugging Face format; inspect a checkpoint's weight bytes.",
    no_args_is_help=True,
)
app.add_typer(checkpoint_app, name="checkpoint")


@app.command()
def generate(
    prompt: str = typer.Option(
        ..., "--prompt", "-p",
        help="The user message, wrapped in Gemma's chat turn format; it is always text (a control-token string "
        "such as <turn|> in it is encoded as ordinary characters).",
    ),  # fmt: skip
    checkpoint: str | None = CheckpointOpt,
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", "-n", help="Tokens to generate (stops at EOS)."),
    raw: bool = typer.Option(
        False, "--raw",
        help="Feed BOS + exactly the prompt given, without the chat turn format; special-token strings in it "
        "(<|turn>, <turn|>, <eos>, ...) are parsed as those tokens.",
    ),  # fmt: skip
    temperature: float = typer.Option(0.0, help="0 = greedy (default); > 0 samples."),
    top_k: int = typer.Option(0, help="Sample from the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass (1.0 = off)."),
    seed: int = typer.Option(0, help="Sampling seed: the same seed gives the same tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print prompt and generated token ids as JSON."),
    dtype: str | None = DtypeOpt,
    max_length: int | None = MaxLengthOpt,
    compile_cache: str | None = CompileCacheOpt,
    quant: str | None = QuantOpt,
    scale_dtype: str | None = ScaleDtypeOpt,
    kernel: str | None = KernelOpt,
    backend: str | None = BackendOpt,
    decode_loop: str = typer.Option(
        "host", "--decode-loop", help="host (default: one step per token, stops at EOS) or device (the tokens "
        "after the first in one device loop, or blocks of --decode-block steps: exactly --max-new-tokens are "
        "generated, and what follows the first EOS is dropped from the output); prints its timing on stderr."),
    decode_block: int | None = typer.Option(None, "--decode-block", help="With --decode-loop device: steps per "
                                            "device call (default: all in one)."),
) -> None:
    """Generate a completion for one prompt and print it (with --json: the ids, and the quantization and weight
    bytes (packed values + scales, as placed on the device) of the engine that generated them)."""
    from model.engine import Sampling

    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    if decode_loop not in ("host", "device"):
        raise InputError(f"--decode-loop {decode_loop!r}: expected host or device (bench generate times one loop)")
    if decode_block is not None and (decode_block < 1 or decode_loop != "device"):
        raise InputError(f"--decode-block {decode_block}: expected steps >= 1, with --decode-loop device")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise InputError("sampling: expected --temperature >= 0, --top-k >= 0 and 0 < --top-p <= 1")
    parse_quant_flags(quant, scale_dtype)  # one line for a bad value, before anything loads
    parse_kernel_flag(kernel, quant)
    parse_backend_flag(backend)
    setup_logging()
    engine, _, path, _ = open_engine(checkpoint, dtype, max_length, compile_cache, quant=quant, scale_dtype=scale_dtype,
                                     kernel=kernel, backend=backend)  # fmt: skip
    tok = engine.tokenizer
    if tok is None:
        raise InputError(f"{path}: has no tokenizer.json; bench generate needs one to read --prompt")
    ids = [tok.bos_id] + tok.encode(prompt) if raw else tok.chat_ids(prompt)
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    on_host = decode_loop == "host"
    gen = engine.generate(ids, max_new_tokens, sampling, stop_at_eos=on_host, decode_loop=decode_loop,
                          block=decode_block)  # fmt: skip
    shown = gen.token_ids if on_host else _until_eos(gen.token_ids, set(engine.cfg.eos_token_ids))
    text = tok.decode(shown)
    if not on_host:
        typer.echo(_device_timing_line(gen), err=True)
    if as_json:
        out = {"prompt": prompt, "prompt_ids": ids, "generated_ids": shown, "text": text,
               "quant": engine.quant.canonical, "scale_dtype": engine.scale_dtype if engine.quant.names else None,
               "weight_bytes": engine.weight_bytes, "backend": engine.backend}  # fmt: skip
        if not on_host:
            out["decode_loop"] = {"loop": "device", "block": decode_block, "generated": len(gen.token_ids),
                                  "prefill_ms": gen.prefill_ms, "decode_ms": gen.decode_ms,
                                  "ms_per_step": gen.ms_per_step, "block_ms": gen.block_ms}  # fmt: skip
        typer.echo(json.dumps(out))
    else:
        typer.echo(text)


def _until_eos(token_ids: list[int], eos: set[int]) -> list[int]:
    """The ids up to and including the first EOS (all of them when none): what the host loop would have stopped at."""
    cut = next((i for i, t in enumerate(token_ids) if t in eos), None)
    return token_ids if cut is None else token_ids[: cut + 1]


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
    preset: str = typer.Option("default", "--preset", help="tiny, default, e2b or e4b."),
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

    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise InputError(f"--dtype {dtype}: unknown dtype; expected float32, bfloat16 or float16")
    if (checkpoint is None) == (preset is None):
        raise InputError("checkpoint inspect: expected a CHECKPOINT directory or --preset NAME (one of them, "
                         "e.g. bench checkpoint inspect --preset e2b)")  # fmt: skip
    if preset is not None:
        if preset not in PRESETS:
            raise InputError(f"--preset {preset}: unknown preset; expected one of {', '.join(PRESETS)}")
        return {"preset": preset}, PRESETS[preset], dtype or "bfloat16"
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


@checkpoint_app.command("inspect")
def checkpoint_inspect(
    checkpoint: str | None = typer.Argument(None, help="A local checkpoint directory (config.json, *.safetensors): "
                                            "only config.json and the safetensors headers are read."),
    preset: str | None = typer.Option(None, "--preset", help="Inspect a preset's shapes instead (tiny, default, e2b, "
                                      "e4b); nothing is written or read."),
    quant: str | None = QuantOpt,
    dtype: str | None = typer.Option(None, "--dtype", help="Dtype the dense weights are placed in (float32, bfloat16, "
                                     "float16); default: the checkpoint's stored dtype, bfloat16 for a preset."),
    scale_dtype: str = typer.Option("bfloat16", "--scale-dtype", help="Dtype of the quantization scales: bfloat16, "
                                    "float16 or float32."),
    as_json: bool = typer.Option(False, "--json", help="Print the components and totals as JSON."),
) -> None:
    """Weight bytes of a checkpoint (or a preset's shapes) by component, as placed on the device, under --quant."""
    import dataclasses

    from model.accounting import weight_bytes_by_component

    spec, scale_dtype = parse_quant_flags(quant, scale_dtype)
    source, cfg, body = _inspect_source(checkpoint, preset, dtype)
    wb = weight_bytes_by_component(cfg, _ITEMSIZE[body], scale_itemsize=_ITEMSIZE[scale_dtype], quant=spec)
    if not as_json:
        _print_weight_bytes(source, wb, body, scale_dtype)
        return
    totals = {"params": wb.params, "scales": wb.scales, "bytes": wb.bytes, "decode_bytes": wb.decode_bytes}
    typer.echo(json.dumps({**source, "dtype": body, "scale_dtype": scale_dtype, "quant": wb.quant,
                           "components": [dataclasses.asdict(c) for c in wb.components], "total": totals}))  # fmt: skip
