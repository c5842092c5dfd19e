"""`bench peer plan` and `bench peer import`: the transformers peer's workload out, its raw requests in as a run.

Between the two runs `scripts/transformers_peer.py` in its own Python 3.11 venv (`make peer` does all three);
bench/sweep/peer.py says what each file holds. Neither command imports jax's engine: `plan` reads the checkpoint's
tokenizer and config only, `import` reads the raw file only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from bench.cli.root import app
from bench.cli.common import CheckpointOpt, setup_logging
from bench.errors import InputError

peer_app = typer.Typer(help="The transformers peer: write its plan, import its raw requests as a run folder.",
                       no_args_is_help=True)  # fmt: skip
app.add_typer(peer_app, name="peer")

DEFAULT_PLAN = Path(".cache/peer/plan.json")


@peer_app.command("plan")
def plan_cmd(
    inputs: Annotated[str, typer.Option("--inputs", help="Comma-separated exact input sizes (tokens), as `bench "
                                        "sweep --inputs`.")] = "41,521,2057,3593",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per request (EOS "
                                                "ignored), as `bench sweep`.")] = 64,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed repeats per cell after one warm-up.")] = 3,
    checkpoint: str | None = CheckpointOpt,
    out: Annotated[Path, typer.Option("--out", help="Where the plan (JSON) is written.")] = DEFAULT_PLAN,
) -> None:
    """Write the peer's plan: the checkpoint folder and hash, and per input size the sweep's own exact prompt."""
    from bench.cli.common import checkpoint_path
    from bench.runs.manifest import CheckpointFacts, checkpoint_id, checkpoint_source
    from bench.sweep.local import SweepConfig, parse_inputs
    from bench.sweep.peer import build_plan, write_plan
    from model.builtin import DEFAULT_PRESET
    from model.checkpoint import content_hash, resolve_checkpoint
    from model.config import load_config
    from model.tokenizer import GemmaTokenizer

    config = SweepConfig(inputs=parse_inputs(inputs), max_new_tokens=max_new_tokens, repeats=repeats)
    config.check()
    setup_logging()
    if checkpoint is not None and checkpoint.startswith("random:"):
        raise InputError(f"--checkpoint {checkpoint}: dummy weights exist only inside this engine, and the peer "
                         "reads its weights from files; use builtin:PRESET (the same shapes, written to disk)")  # fmt: skip
    folder = Path(resolve_checkpoint(checkpoint_path(checkpoint)))
    spec = checkpoint or f"builtin:{DEFAULT_PRESET}"
    facts = CheckpointFacts(id=checkpoint_id(folder), source=checkpoint_source(spec), content_hash=content_hash(folder))
    if not (folder / "tokenizer.json").is_file():
        raise InputError(f"--checkpoint {spec}: no tokenizer.json; the peer's prompts are the sweep's, sized with it")
    plan = build_plan(GemmaTokenizer.from_dir(folder), folder, facts, config,
                      max_positions=load_config(folder).max_position_embeddings)  # fmt: skip
    write_plan(plan, out)
    sizes = ",".join(str(p["input_tokens"]) for p in plan["prompts"])
    logging.getLogger("bench").info(f"wrote {out}: prompts of {sizes} tokens, {max_new_tokens} new tokens, "
                                    f"{repeats} repeats, checkpoint {facts.id}")  # fmt: skip


@peer_app.command("import")
def import_cmd(
    raw: Annotated[Path, typer.Argument(help="The peer's raw requests (JSON lines of scripts/transformers_peer.py).")],
    name: Annotated[str | None, typer.Option("--name", help="Run label: runs/<date>-<label>-<device>/ (default: "
                                             "the engine's name, suffixed -2, -3, ... when taken).")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run folders are archived.")] = Path("runs"),
) -> None:
    """Archive the peer's raw requests as a complete run folder (same cells and samples as `bench sweep`)."""
    from bench.cli.sweep_cmds import _print_table
    from bench.sweep.peer import import_peer

    if name is not None and not name.strip():
        raise InputError(f"--name {name!r}: an empty run label; pass one such as --name transformers")
    setup_logging()
    log = logging.getLogger("bench")
    run = import_peer(raw, runs_dir, name, progress=log.info)
    log.info(f"peer run complete; run folder {run.path}")
    _print_table(run, log)
