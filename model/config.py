"""The Gemma 4 text-decoder architecture, as a frozen config read field by field from `config.json`.

Source of every field and default: Hugging Face transformers 5.23 `Gemma4TextConfig`
(models/gemma4/configuration_gemma4.py) and `../shared/gemma4-architecture.md` §1 and §6.

Two published serialisations are accepted:
- the hub's form, with `global_head_dim` (and `num_global_key_value_heads`) for the full-attention layers;
- transformers' saved form, with `per_layer_config: {"<layer>": {"head_dim": ..., "num_key_value_heads": ...}}`.
A multimodal wrapper (`model_type: gemma4`) is read through its `text_config`.

Only frozen objects are jit statics: `ModelConfig` is hashable and every derived per-layer fact is a method
or a tuple, so a program compiled for one config can never be reused for another.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from model.errors import ConfigError

SLIDING = "sliding_attention"
FULL = "full_attention"

_SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh",)
_TEXT_MODEL_TYPES = ("gemma4_text",)
_WRAPPER_MODEL_TYPES = ("gemma4",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a Gemma 4 text decoder (everything the weights' shapes and the forward pass depend on).

    Per-layer values (head dim, KV heads, feed-forward width, KV source) are derived by the methods below;
    `layer_types` has one entry per layer, `SLIDING` or `FULL`.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # sliding layers (and full layers unless `num_global_kv_heads` is set)
    num_global_kv_heads: int | None = None
    head_dim: int  # sliding layers
    global_head_dim: int  # full-attention layers
    intermediate_size: int
    use_double_wide_mlp: bool = False  # KV-shared layers get 2 * intermediate_size
    sliding_window: int  # a key j is visible from query i iff i - sliding_window < j <= i
    layer_types: tuple[str, ...]
    rope_local_theta: float = 10_000.0
    rope_global_theta: float = 1_000_000.0
    rope_global_partial_factor: float = 0.25  # share of the full layers' head dim that rotates (p-RoPE)
    rms_norm_eps: float = 1e-6
    final_logit_softcap: float | None = 30.0
    num_kv_shared_layers: int = 0
    ple_dim: int = 256  # hidden_size_per_layer_input; 0 disables per-layer embeddings
    ple_vocab_size: int | None = None  # vocab_size_per_layer_input (defaults to vocab_size)
    max_position_embeddings: int = 131_072
    tie_word_embeddings: bool = True
    pad_token_id: int = 0
    bos_token_id: int = 2
    eos_token_ids: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        if self.ple_vocab_size is None:  # normalise, so that equal architectures compare (and hash) equal
            object.__setattr__(self, "ple_vocab_size", self.vocab_size)
        sizes = {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                 "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                 "head_dim": self.head_dim, "global_head_dim": self.global_head_dim,
                 "intermediate_size": self.intermediate_size, "sliding_window": self.sliding_window,
                 "max_position_embeddings": self.max_position_embeddings}  # fmt: skip
        bad_sizes = {k: v for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
        if bad_sizes or self.ple_dim < 0 or (self.num_global_kv_heads is not None and self.num_global_kv_heads < 1):
            raise ConfigError(f"config: sizes must be positive whole numbers, got {bad_sizes or 'a negative PLE/KV size'}")
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(
                f"config: layer_types has {len(self.layer_types)} entries, expected num_hidden_layers={self.num_layers}"
            )
        bad = sorted({t for t in self.layer_types if t not in (SLIDING, FULL)})
        if bad:
            raise ConfigError(f"config: unknown layer type(s) {bad}; expected {SLIDING!r} or {FULL!r}")
        if not 0 <= self.num_kv_shared_layers < self.num_layers:
            raise ConfigError(
                f"config: num_kv_shared_layers={self.num_kv_shared_layers} must be in [0, {self.num_layers})"
            )
        producing = set(self.layer_types[: self.first_shared_layer])
        if not set(self.layer_types) <= producing:
            raise ConfigError(
                "config: every layer type used by a KV-shared layer must also occur among the non-shared layers "
                f"(non-shared types: {sorted(producing)}, all types: {sorted(set(self.layer_types))})"
            )
        if self.num_heads % self.num_kv_heads or self.num_heads % self.kv_heads(self._first_full_or(0)):
            raise ConfigError(
                f"config: num_attention_heads={self.num_heads} is not a multiple of the KV head count"
            )
        if self.global_head_dim % 2 or self.head_dim % 2:
            raise ConfigError("config: head dims must be even for RoPE")
        if self.tie_word_embeddings is False:
            raise ConfigError("config: tie_word_embeddings=false is not supported yet (Gemma 4 ties lm_head)")

    def _first_full_or(self, default: int) -> int:
        return next((i for i, t in enumerate(self.layer_types) if t == FULL), default)

    # ---- per-layer facts -------------------------------------------------------------------------------------
    @property
    def first_shared_layer(self) -> int:
        """Index of the first KV-shared layer (= num_layers when nothing is shared)."""
        return self.num_layers - self.num_kv_shared_layers

    def is_sliding(self, layer: int) -> bool:
        """True when `layer` uses sliding-window attention (local RoPE, head_dim)."""
        return self.layer_types[layer] == SLIDING

    def layer_head_dim(self, layer: int) -> int:
        """Head dim H of `layer`: head_dim on sliding layers, global_head_dim on full ones."""
        return self.head_dim if self.is_sliding(layer) else self.global_head_dim

    def kv_heads(self, layer: int) -> int:
        """KV head count K of `layer` (MQA when 1)."""
        if not self.is_sliding(layer) and self.num_global_kv_heads is not None:
            return self.num_global_kv_heads
        return self.num_kv_heads

    def is_kv_shared(self, layer: int) -> bool:
        """True when `layer` computes no K/V of its own and reads its producer's (see `kv_source`)."""
        return layer >= self.first_shared_layer

    def kv_source(self, layer: int) -> int:
        """The layer whose K/V `layer` attends over: itself, or for a shared layer the last non-shared layer
        of the same type (transformers' `kv_sharing_modes`; E2B: sliding -> 13, full -> 14)."""
        if not self.is_kv_shared(layer):
            return layer
        kind = self.layer_types[layer]
        return max(i for i in range(self.first_shared_layer) if self.layer_types[i] == kind)

    def ffw_dim(self, layer: int) -> int:
        """Feed-forward width F of `layer` (doubled on KV-shared layers when use_double_wide_mlp)."""
        if self.use_double_wide_mlp and self.is_kv_shared(layer):
            return 2 * self.intermediate_size
        return self.intermediate_size

    @property
    def cache_layers(self) -> tuple[int, ...]:
        """Layers that own a KV cache (the non-shared ones): 15 for E2B."""
        return tuple(range(self.first_shared_layer))

    @property
    def rotary_pairs_global(self) -> int:
        """Rotating (dim, dim + H/2) pairs on full layers: int(factor * global_head_dim / 2) (64 for E2B)."""
        return int(self.rope_global_partial_factor * self.global_head_dim / 2)

    @property
    def embed_scale(self) -> float:
        """sqrt(hidden_size): the input-embedding multiplier (cast to the weight dtype before use, as HF does)."""
        return math.sqrt(self.hidden_size)

    @property
    def ple_vocab(self) -> int:
        """Rows of the per-layer embedding table (vocab_size_per_layer_input)."""
        assert self.ple_vocab_size is not None  # set in __post_init__
        return self.ple_vocab_size

    # ---- serialisation ---------------------------------------------------------------------------------------
    def to_hf_dict(self, *, form: str = "global_head_dim") -> dict[str, Any]:
        """This config as a transformers `gemma4_text` config.json dict.

        form: "global_head_dim" (the hub's form) or "per_layer_config" (what transformers 5.23 writes).
        """
        d: dict[str, Any] = {
            "architectures": ["Gemma4ForCausalLM"],
            "model_type": "gemma4_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "pad_token_id": self.pad_token_id,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_ids[0],
            "tie_word_embeddings": True,
            "rope_parameters": {
                FULL: {
                    "rope_type": "proportional",
                    "partial_rotary_factor": self.rope_global_partial_factor,
                    "rope_theta": self.rope_global_theta,
                },
                SLIDING: {"rope_type": "default", "rope_theta": self.rope_local_theta},
            },
            "attention_bias": False,
            "attention_dropout": 0.0,
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "final_logit_softcapping": self.final_logit_softcap,
            "use_bidirectional_attention": None,
            "vocab_size_per_layer_input": self.ple_vocab,
            "hidden_size_per_layer_input": self.ple_dim,
            "attention_k_eq_v": False,
            "num_kv_shared_layers": self.num_kv_shared_layers,
            "enable_moe_block": False,
            "use_double_wide_mlp": self.use_double_wide_mlp,
            "torch_dtype": "bfloat16",
        }
        if form == "global_head_dim":
            d["global_head_dim"] = self.global_head_dim
            d["num_global_key_value_heads"] = self.num_global_kv_heads
        elif form == "per_layer_config":
            over: dict[str, Any] = {"head_dim": self.global_head_dim}
            if self.num_global_kv_heads is not None:
                over["num_key_value_heads"] = self.num_global_kv_heads
            d["per_layer_config"] = {str(i): dict(over) for i, t in enumerate(self.layer_types) if t == FULL}
        else:
            raise ValueError(f"form must be 'global_head_dim' or 'per_layer_config', got {form!r}")
        return d


def _require(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] is None:
        raise ConfigError(f"{where}: field {key!r} is missing; a Gemma 4 text config needs it")
    return d[key]


def config_from_dict(raw: dict[str, Any], *, where: str = "config.json") -> ModelConfig:
    """Build a `ModelConfig` from a parsed config.json (text config, or a `gemma4` wrapper's `text_config`).

    Raises ConfigError for another model type, a missing field, or a Gemma 4 feature not supported yet
    (attention_k_eq_v, enable_moe_block, bidirectional attention, per-layer overrides other than the head dim
    and KV heads of full layers), naming the field.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if model_type in _WRAPPER_MODEL_TYPES:
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError(f"{where}: model_type 'gemma4' without a 'text_config' object")
        return config_from_dict({"model_type": "gemma4_text", **text}, where=f"{where} (text_config)")
    if model_type not in _TEXT_MODEL_TYPES:
        raise ConfigError(
            f"{where}: model_type is {model_type!r}; expected 'gemma4_text' or 'gemma4' (a Gemma 4 checkpoint)"
        )
    for field, unsupported in (("attention_k_eq_v", True), ("enable_moe_block", True)):
        if raw.get(field) == unsupported:
            raise ConfigError(f"{where}: {field}={unsupported} (Gemma 4 31B/26B feature) is not supported yet")
    if raw.get("use_bidirectional_attention") not in (None, False):
        raise ConfigError(
            f"{where}: use_bidirectional_attention={raw['use_bidirectional_attention']!r} is not supported yet"
        )
    act = raw.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in _SUPPORTED_ACTIVATIONS:
        raise ConfigError(f"{where}: hidden_activation={act!r}; expected one of {_SUPPORTED_ACTIVATIONS}")

    num_layers = int(_require(raw, "num_hidden_layers", where))
    layer_types = raw.get("layer_types")
    if layer_types is None:  # transformers' default: 5 sliding then 1 full
        layer_types = [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]
    layer_types = list(layer_types)
    if layer_types and layer_types[-1] != FULL:  # transformers forces the last layer to full attention
        layer_types[-1] = FULL

    num_kv_heads = int(_require(raw, "num_key_value_heads", where))
    global_head_dim = raw.get("global_head_dim")
    num_global_kv = raw.get("num_global_key_value_heads")
    per_layer = raw.get("per_layer_config")
    if per_layer:
        overrides: dict[int, dict[str, Any]] = {int(k): dict(v) for k, v in per_layer.items()}
        for idx, over in overrides.items():
            if not 0 <= idx < num_layers or layer_types[idx] != FULL:
                raise ConfigError(f"{where}: per_layer_config names layer {idx}, which is not a full-attention layer")
            extra = set(over) - {"head_dim", "num_key_value_heads"}
            if extra:
                raise ConfigError(f"{where}: per_layer_config override(s) {sorted(extra)} are not supported yet")
        head_dims = {o.get("head_dim") for o in overrides.values()}
        kv_counts = {o.get("num_key_value_heads") for o in overrides.values()}
        full_layers = {i for i, t in enumerate(layer_types) if t == FULL}
        if set(overrides) != full_layers or len(head_dims) != 1 or len(kv_counts) != 1:
            raise ConfigError(
                f"{where}: per_layer_config must give every full-attention layer {sorted(full_layers)} "
                f"the same overrides; got {per_layer}"
            )
        global_head_dim = head_dims.pop()
        num_global_kv = kv_counts.pop()
    if global_head_dim is None:
        global_head_dim = 512  # transformers' default when neither form is given

    rope = raw.get("rope_parameters") or {}
    full_rope = rope.get(FULL) or {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    local_rope = rope.get(SLIDING) or {"rope_type": "default", "rope_theta": 1e4}
    if local_rope.get("rope_type", "default") != "default":
        raise ConfigError(f"{where}: sliding rope_type={local_rope.get('rope_type')!r} is not supported yet")
    if full_rope.get("rope_type") not in ("proportional", "default"):
        raise ConfigError(f"{where}: full-attention rope_type={full_rope.get('rope_type')!r} is not supported yet")
    partial = float(full_rope.get("partial_rotary_factor", 1.0)) if full_rope.get("rope_type") == "proportional" else 1.0

    eos = raw.get("eos_token_id", 1)
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    ple_dim = raw.get("hidden_size_per_layer_input", 256) or 0
    softcap = raw.get("final_logit_softcapping", 30.0)
    try:
        return ModelConfig(
            vocab_size=int(_require(raw, "vocab_size", where)),
            hidden_size=int(_require(raw, "hidden_size", where)),
            num_layers=num_layers,
            num_heads=int(_require(raw, "num_attention_heads", where)),
            num_kv_heads=num_kv_heads,
            num_global_kv_heads=None if num_global_kv is None else int(num_global_kv),
            head_dim=int(_require(raw, "head_dim", where)),
            global_head_dim=int(global_head_dim),
            intermediate_size=int(_require(raw, "intermediate_size", where)),
            use_double_wide_mlp=bool(raw.get("use_double_wide_mlp", False)),
            sliding_window=int(_require(raw, "sliding_window", where)),
            layer_types=tuple(layer_types),
            rope_local_theta=float(local_rope.get("rope_theta", 1e4)),
            rope_global_theta=float(full_rope.get("rope_theta", 1e6)),
            rope_global_partial_factor=partial,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            final_logit_softcap=None if softcap is None else float(softcap),
            num_kv_shared_layers=int(raw.get("num_kv_shared_layers", 0) or 0),
            ple_dim=int(ple_dim),
            ple_vocab_size=raw.get("vocab_size_per_layer_input"),
            max_position_embeddings=int(raw.get("max_position_embeddings", 131_072)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            pad_token_id=int(raw.get("pad_token_id", 0) if raw.get("pad_token_id") is not None else 0),
            bos_token_id=int(raw.get("bos_token_id", 2) if raw.get("bos_token_id") is not None else 2),
            eos_token_ids=eos_ids,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: malformed field value ({exc})") from None


def load_config(path: str | Path) -> ModelConfig:
    """Read `config.json` (a file, or a directory holding one). Raises ConfigError naming the path."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"{p}: no config.json there; a Hugging Face Gemma 4 checkpoint directory has one")
    try:
        raw = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{p}: not valid JSON ({exc})") from None
    return config_from_dict(raw, where=str(p))


# ---- presets ---------------------------------------------------------------------------------------------------
def _pattern(num_layers: int, period: int) -> tuple[str, ...]:
    """(period - 1) sliding layers then one full layer, repeated; the last layer is full."""
    return tuple(FULL if (i + 1) % period == 0 else SLIDING for i in range(num_layers))


E2B = ModelConfig(
    vocab_size=262_144, hidden_size=1536, num_layers=35, num_heads=8, num_kv_heads=1, head_dim=256,
    global_head_dim=512, intermediate_size=6144, use_double_wide_mlp=True, sliding_window=512,
    layer_types=_pattern(35, 5), num_kv_shared_layers=20, ple_dim=256, eos_token_ids=(1, 106),
)  # fmt: skip
"""Gemma 4 E2B text decoder (google/gemma-4-E2B-it config.json; 4,628,569,379 text parameters)."""

E4B = ModelConfig(
    vocab_size=262_144, hidden_size=2560, num_layers=42, num_heads=8, num_kv_heads=2, head_dim=256,
    global_head_dim=512, intermediate_size=10240, use_double_wide_mlp=False, sliding_window=512,
    layer_types=_pattern(42, 6), num_kv_shared_layers=18, ple_dim=256, eos_token_ids=(1, 106),
)  # fmt: skip
"""Gemma 4 E4B text decoder (../shared/gemma4-architecture.md §6: 42 layers, 5:1, 18 KV-shared layers)."""

DEFAULT = dataclasses.replace(
    E2B, vocab_size=8192, ple_vocab_size=8192, hidden_size=256, intermediate_size=1024, max_position_embeddings=8192
)
"""The built-in benchmark default: every E2B irregularity (35 layers at 4:1, head dims 256/512, 8 query heads on
1 KV head, 20 KV-shared layers with double-wide MLP, window 512, PLE width 256) at hidden size 256 and a
vocabulary of 8192 (about 172M parameters), so the default sweep runs in minutes on 2 CPU cores."""

TINY = ModelConfig(
    vocab_size=512, hidden_size=64, num_layers=6, num_heads=4, num_kv_heads=1, head_dim=16, global_head_dim=32,
    intermediate_size=128, use_double_wide_mlp=True, sliding_window=8, layer_types=(SLIDING, SLIDING, FULL) * 2,
    num_kv_shared_layers=3, ple_dim=8, max_position_embeddings=256, eos_token_ids=(1, 106),
)  # fmt: skip
"""A tiny config for tests: both geometries, MQA, KV sharing, double-wide MLP, PLE, window 8."""

PRESETS: dict[str, ModelConfig] = {"tiny": TINY, "default": DEFAULT, "e2b": E2B, "e4b": E4B}
