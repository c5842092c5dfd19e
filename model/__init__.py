"""A pure-JAX Gemma 4 text decoder: config, checkpoints, forward pass, KV cache, dtype policy, engine.

Public API (everything else is internal):
- `ModelConfig`, `load_config`, `PRESETS`             (model.config)
- `load_params`, `resolve_checkpoint`, `content_hash` (model.checkpoint)
- `create_checkpoint`, `ensure_builtin`               (model.builtin)
- `forward_full`, `prefill`, `decode_step`            (model.forward)
- `decide_policy`, `DevicePolicy`                      (model.policy)
- `Engine`, `load_engine`, `full_logits`, `Sampling`  (model.engine)
- `GemmaTokenizer`                                     (model.tokenizer)
This package never imports `bench`. Importing it configures nothing (no jax.config updates).
"""

from model.builtin import create_checkpoint, ensure_builtin
from model.checkpoint import content_hash, load_params, resolve_checkpoint
from model.config import PRESETS, ModelConfig, load_config
from model.engine import Engine, Sampling, full_logits, load_engine
from model.forward import decode_step, forward_full, prefill
from model.policy import DevicePolicy, decide_policy
from model.tokenizer import GemmaTokenizer

__all__ = [
    "PRESETS", "ModelConfig", "load_config", "content_hash", "load_params", "resolve_checkpoint",
    "create_checkpoint", "ensure_builtin", "forward_full", "prefill", "decode_step", "DevicePolicy",
    "decide_policy", "Engine", "Sampling", "full_logits", "load_engine", "GemmaTokenizer",
]  # fmt: skip
