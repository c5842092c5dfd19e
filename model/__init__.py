"""A pure-JAX Gemma 4 text decoder: config, checkpoints, forward pass, KV cache, dtype policy, engine.

Public API (everything else is internal):
- `ModelConfig`, `load_config`, `PRESETS`             (model.config)
- `load_params`, `resolve_checkpoint`, `content_hash` (model.checkpoint)
- `create_checkpoint`, `ensure_builtin`               (model.builtin)
- `forward_full`, `prefill`, `decode_step`            (model.forward)
- `decide_policy`, `DevicePolicy`                      (model.policy)
- `Engine`, `load_engine`, `full_logits`               (model.engine)
- `Sampling`                                           (model.sampling)
- `SlotDecoder`                                        (model.slots: decode slots, `Engine.slot_decoder`)
- `GemmaTokenizer`                                     (model.tokenizer)
- `QuantSpec`, `parse_quant`                           (model.quantspec: the `--quant` options, jax-free)
- `QuantArray`, `quantize_params`, `tree_bytes`        (model.quant)
- `PromptLimits`, `prompt_limits`                      (model.limits: buckets and prompt-length checks, jax-free)
The model's facts without jax: `model.config`, `model.accounting` (parameter shapes and counts, KV cache slots,
bytes a decode step reads, weight bytes under quantization) and `model.quantspec` import neither jax nor numpy, so the report can use them on archived runs.

Each name above is imported from its module on first use (PEP 562 `__getattr__`), not when the package is: so
`import model.config` runs no jax, while `from model import Engine` works as before.
This package never imports `bench`. Importing it configures nothing (no jax.config updates).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "PRESETS": "model.config", "ModelConfig": "model.config", "load_config": "model.config",
    "content_hash": "model.checkpoint", "load_params": "model.checkpoint", "resolve_checkpoint": "model.checkpoint",
    "create_checkpoint": "model.builtin", "ensure_builtin": "model.builtin",
    "forward_full": "model.forward", "prefill": "model.forward", "decode_step": "model.forward",
    "DevicePolicy": "model.policy", "decide_policy": "model.policy",
    "Engine": "model.engine", "full_logits": "model.engine", "load_engine": "model.engine",
    "Sampling": "model.sampling",
    "SlotDecoder": "model.slots",
    "GemmaTokenizer": "model.tokenizer",
    "QuantSpec": "model.quantspec", "parse_quant": "model.quantspec",
    "QuantArray": "model.quant", "quantize_params": "model.quant", "tree_bytes": "model.quant",
    "PromptLimits": "model.limits", "prompt_limits": "model.limits",
}  # fmt: skip
"""Public name -> the module that defines it."""

__all__ = [
    "PRESETS", "ModelConfig", "load_config", "content_hash", "load_params", "resolve_checkpoint",
    "create_checkpoint", "ensure_builtin", "forward_full", "prefill", "decode_step", "DevicePolicy",
    "decide_policy", "Engine", "Sampling", "full_logits", "load_engine", "SlotDecoder", "GemmaTokenizer", "QuantSpec",
    "parse_quant", "QuantArray", "quantize_params", "tree_bytes", "PromptLimits", "prompt_limits",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """The public name `name`, imported from its module on first access (then cached in this module's globals).
    Raises AttributeError for any other name, as a missing module attribute does."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from model.builtin import create_checkpoint, ensure_builtin
    from model.checkpoint import content_hash, load_params, resolve_checkpoint
    from model.config import PRESETS, ModelConfig, load_config
    from model.engine import Engine, full_logits, load_engine
    from model.forward import decode_step, forward_full, prefill
    from model.limits import PromptLimits, prompt_limits
    from model.policy import DevicePolicy, decide_policy
    from model.quant import QuantArray, quantize_params, tree_bytes
    from model.quantspec import QuantSpec, parse_quant
    from model.sampling import Sampling
    from model.slots import SlotDecoder
    from model.tokenizer import GemmaTokenizer
