"""The folders the model writes besides weights: the cache root, a folder made atomically, and a checkpoint
folder's files but its weights (config.json, generation_config.json, the tokenizer files).

Shared by the built-in checkpoints (`model.builtin`), the dummy-weights folders (`model.random_weights`) and the
CPU kernels' build (`model.backends.cpu.kernels`); it imports none of them, nor the weight loading
(`model.checkpoint`), so each can use it without an import circle. No jax.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from model.config import ModelConfig

TOKENIZER_VOCAB_CAP = 8192  # the shipped text cannot teach more merges; larger model vocabs keep the extra rows


def cache_root() -> Path:
    """Folder for built-in checkpoints and the compilation cache: $GEMMA4_BENCH_CACHE, else
    $XDG_CACHE_HOME/gemma4-bench, else ~/.cache/gemma4-bench."""
    env = os.environ.get("GEMMA4_BENCH_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemma4-bench"


def create_atomically(target: Path, make) -> Path:
    """Make the folder `target` with `make(tmp)` in a temporary sibling folder, then rename it into place, so an
    interrupted creation never leaves a half folder; when another process won the race its folder (identical:
    built-in folders are deterministic) is kept. Returns `target`. `make`'s errors propagate (the temporary
    folder removed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the checkpoint is an ordinary readable folder
    try:
        make(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; its folder is identical
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_config_files(cfg: ModelConfig, out_dir: Path, *, form: str = "global_head_dim", wrapper: bool = False) -> None:
    """Write config.json (text config, or wrapped as a `gemma4` multimodal config) and generation_config.json."""
    text = cfg.to_hf_dict(form=form)
    body = text
    if wrapper:
        text = {k: v for k, v in text.items() if k != "architectures"}
        body = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
                "vision_config": None, "audio_config": None, "tie_word_embeddings": True}  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": list(cfg.eos_token_ids), "pad_token_id": cfg.pad_token_id,
           "do_sample": False}  # fmt: skip
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")


def write_model_files(cfg: ModelConfig, out: Path, *, config_form: str = "global_head_dim", wrapper: bool = False) -> None:
    """Everything of a built-in checkpoint but its weights, into the existing folder `out`: config.json and
    generation_config.json (`write_config_files`), and the tokenizer trained on the shipped text
    (`model.tokenizer.train_tokenizer`, at most `TOKENIZER_VOCAB_CAP` ids) as tokenizer.json and
    tokenizer_config.json. Deterministic: the same config gives the same bytes. Raises OSError when `out` cannot
    be written."""
    from model.tokenizer import default_training_texts, save_tokenizer_files, train_tokenizer

    write_config_files(cfg, out, form=config_form, wrapper=wrapper)
    tok = train_tokenizer(default_training_texts(), min(cfg.vocab_size, TOKENIZER_VOCAB_CAP))
    save_tokenizer_files(tok, out, model_max_length=cfg.max_position_embeddings)
