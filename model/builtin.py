"""Built-in checkpoints: random-weight Gemma 4 models in exactly the Hugging Face on-disk format.

Real Gemma 4 weights need a hub account and gigabytes; these are made here, deterministically, from a preset
(`model.config.PRESETS`), a seed and a dtype, with a tokenizer trained on the shipped text (`model/data/text`):
config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json. The same loading
code serves them and real checkpoints. Same preset + seed + dtype -> the same bytes (and content hash) anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from model.checkpoint import save_tensors
from model.config import PRESETS, ModelConfig
from model.errors import CheckpointError
from model.folders import cache_root, create_atomically, write_model_files
from model.params import init_tensors

BUILTIN_VERSION = 2  # bump when the generator changes, so a cached default is rebuilt rather than reused
DEFAULT_PRESET = "default"


def _dtype(name: str):
    import ml_dtypes

    table = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
    if name not in table:
        raise CheckpointError(f"checkpoint dtype {name!r} is not one of {sorted(table)}")
    return table[name]


def create_checkpoint(preset: str, out_dir: str | os.PathLike, *, seed: int = 0, dtype: str = "bfloat16",
                      layout: str = "text", config_form: str = "global_head_dim") -> Path:  # fmt: skip
    """Write a random-weight checkpoint of `preset` into `out_dir` (which must not exist or be empty).

    dtype: stored tensor dtype (the released Gemma 4 weights are bfloat16). layout: "text" (`model.` prefix)
    or "published" (`model.language_model.` prefix, multimodal wrapper config). Raises CheckpointError for an
    unknown preset, a non-empty target, or an unwritable location.
    """
    if preset not in PRESETS:
        raise CheckpointError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    if not 0 <= seed < 2**63:
        raise CheckpointError(f"seed {seed} is out of range; expected a whole number in [0, 2^63)")
    cfg: ModelConfig = PRESETS[preset]
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out}: exists and is not an empty directory; choose a new path")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Leaves are drawn in the stored dtype and converted one by one: about 1x the checkpoint's size in host
        # memory (E2B bf16: ~9.3 GB), where a float32 tree first took ~3x and was killed on a 24 GB machine.
        save_tensors(init_tensors(cfg, seed, dtype=_dtype(dtype)), cfg, out, dtype=_dtype(dtype), layout=layout)
        write_model_files(cfg, out, config_form=config_form, wrapper=layout == "published")
    except OSError as exc:
        raise CheckpointError(f"{out}: cannot write the checkpoint ({exc.strerror or exc})") from None
    return out


def builtin_path(preset: str = DEFAULT_PRESET, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Where the cached built-in checkpoint of (preset, dtype, seed) lives."""
    return cache_root() / "checkpoints" / f"{preset}-{dtype}-seed{seed}-v{BUILTIN_VERSION}"


def ensure_builtin(preset: str = DEFAULT_PRESET, *, dtype: str = "bfloat16", seed: int = 0, log=print) -> Path:
    """The cached built-in checkpoint, created on first use (atomically: built in a temporary folder, then
    renamed, so an interrupted creation never leaves a half checkpoint). `log` gets one line when it creates."""
    target = builtin_path(preset, dtype, seed)
    if (target / "model.safetensors").is_file():
        return target
    log(f"creating built-in checkpoint '{preset}' ({dtype}, seed {seed}) in {target} (first use only)")
    return create_atomically(target, lambda tmp: create_checkpoint(preset, tmp, seed=seed, dtype=dtype))
