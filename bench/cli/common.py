"""Set-up shared by the commands that load an engine (generate, sweep, profile, serve): the checkpoint and
compile-cache options, opening the engine under its configuration (`open_engine`; the configuration's options are
bench/cli/engine_options.py), its manifest (`engine_manifest`), and the one console every command prints its tables
with (`make_console`)."""

from __future__ import annotations

import logging
import sys

import typer

from bench.engines import (  # noqa: F401  (re-exported for the commands)
    check_backend_runs,
    check_prompt_sizes,
    checkpoint_config,
    checkpoint_path,
    checkpoint_positions,
    compile_cache_dir,
    engine_manifest,
    open_engine,
    parse_random_flag,
)
from model.config import PRESETS


PRESET_NAMES = ", ".join(PRESETS)
"""Every preset of the one preset table (`model.config.PRESETS`, jax-free), in its order: what every help text
that names the presets lists, so a new preset appears in each without another edit."""
CHECKPOINT_HELP = (
    "Checkpoint: a local Hugging Face directory, a hub repo id (owner/name), builtin:PRESET "
    f"({PRESET_NAMES}), or random:PRESET / random:PRESET@SEED (dummy "
    "weights made on the device, no checkpoint file). "
    "Default: the built-in 'default' checkpoint, created on first use."
)
CACHE_HELP = "Persistent XLA compilation cache folder, or 'off'. Default: a folder under the user's cache dir."

API_KEY_ENV = "GEMMA4_BENCH_API_KEY"
"""The environment variable `bench serve` reads its API key from, and `bench sweep --target` sends it from."""


CONSOLE_MIN_WIDTH, CONSOLE_PIPE_WIDTH = 150, 200


def make_console():
    """The rich console of every command's tables: in a terminal its width, but at least 150 columns (the sweep
    tables fold their cells where that is still too narrow); 200 columns when stdout is not a terminal (pipes,
    logs, tests; the sweep widens it to the whole table there)."""
    from rich.console import Console

    probe = Console()
    return Console(width=max(probe.width, CONSOLE_MIN_WIDTH) if probe.is_terminal else CONSOLE_PIPE_WIDTH)


def setup_logging(verbose: bool = False) -> None:
    """Log lines (the engine's policy line first) go to stderr, plain, at INFO."""
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if verbose else logging.INFO, format="%(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)  # backend-probing chatter would precede the policy line


CheckpointOpt = typer.Option(None, "--checkpoint", "-c", help=CHECKPOINT_HELP)
CompileCacheOpt = typer.Option(None, "--compile-cache", help=CACHE_HELP)


