"""`bench generate` and `bench checkpoint create`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from bench.cli import app
from bench.cli.common import (
    CheckpointOpt,
    CompileCacheOpt,
    DtypeOpt,
    MaxLengthOpt,
    open_engine,
    setup_logging,
)
from bench.errors import InputError

checkpoint_app = typer.Typer(help="Create built-in checkpoints in the Hugging Face format.", no_args_is_help=True)
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
    decode_loop: str = typer.Option(
        "host", "--decode-loop", help="host (default: one step per token, stops at EOS) or device (the tokens "
        "after the first in one device loop, or blocks of --decode-block steps: exactly --max-new-tokens are "
        "generated, and what follows the first EOS is dropped from the output); prints its timing on stderr."),
    decode_block: int | None = typer.Option(None, "--decode-block", help="With --decode-loop device: steps per "
                                            "device call (default: all in one)."),
) -> None:
    """Generate a completion for one prompt and print it."""
    from model.engine import Sampling

    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    if decode_loop not in ("host", "device"):
        raise InputError(f"--decode-loop {decode_loop!r}: expected host or device (bench generate times one loop)")
    if decode_block is not None and (decode_block < 1 or decode_loop != "device"):
        raise InputError(f"--decode-block {decode_block}: expected steps >= 1, with --decode-loop device")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise InputError("sampling: expected --temperature >= 0, --top-k >= 0 and 0 < --top-p <= 1")
    setup_logging()
    engine, _, path, _ = open_engine(checkpoint, dtype, max_length, compile_cache)
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
        out = {"prompt": prompt, "prompt_ids": ids, "generated_ids": shown, "text": text}
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
