"""The Gemma 4 text-decoder architecture, as a frozen config read field by field from `config.json`.

Source of every field and default: Hugging Face transformers 5.23 `Gemma4TextConfig`
(models/gemma4/configuration_gemma4.py) and `../shared/gemma4-architecture.md` §1 and §6.

Two published serialisations are accepted:
- the hub's form, with `global_head_dim` (and `num_global_key_value_heads`) for the full-attention layers;
- transformers' saved form, with `per_layer_config: {"<layer>": {"head_dim": ..., "num_key_value_heads": ...}}`.
A multimodal wrapper (`model_type: gemma4`) is read through its `text_config`.
Every field is type-checked as transformers annotates it (booleans are not integers, 35.0 is not an
integer, null only where the field is `X | None`): a wrong type is one ConfigError naming the file, the field
with its path (`text_config.num_hidden_layers`, `layer_types[3]`), the value received and the type expected.

Only frozen objects are jit statics: `ModelConfig` is hashable and every derived per-layer fact is a method
or a tuple, so a program compiled for one config can never be reused for another.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
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
    # 31B / 26B-A4B (transformers' `attention_k_eq_v`): full-attention layers have no value projection; their values
    # are the key projection's output before k-norm and RoPE, through the v-norm (modeling_gemma4.py,
    # `Gemma4TextAttention.forward`). Sliding layers keep their own v_proj.
    attention_k_eq_v: bool = False
    # 26B-A4B (transformers' `enable_moe_block`, `num_experts`, `top_k_experts`, `moe_intermediate_size`): every layer
    # has an expert block beside its dense MLP (`model.moe`); 0 experts = no expert block.
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    # Not an architecture fact and not in config.json: how tokens are assigned to experts, "router" (the model's)
    # or "balanced" (dummy weights only: `model.moe.ROUTINGS`, chosen by `model.random_weights.ROUTING_ENV`).
    expert_routing: str = "router"

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
        no_experts = self.num_experts == self.top_k_experts == self.moe_intermediate_size == 0
        experts = 1 <= self.top_k_experts <= self.num_experts and self.moe_intermediate_size >= 1
        if not (no_experts or experts):
            raise ConfigError(f"config: num_experts={self.num_experts}, top_k_experts={self.top_k_experts}, "
                              f"moe_intermediate_size={self.moe_intermediate_size}; expected all 0 (no experts) or "
                              "1 <= top_k_experts <= num_experts and moe_intermediate_size >= 1")  # fmt: skip
        if self.expert_routing not in ("router", "balanced"):
            raise ConfigError(f"config: expert_routing={self.expert_routing!r}; expected 'router' or 'balanced'")
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

    def values_from_keys(self, layer: int) -> bool:
        """True when `layer`'s values are its keys' projection (`attention_k_eq_v` on a full-attention layer that
        owns K/V): the layer has no v_proj, v = v-norm(k_proj(x)) taken before the k-norm and RoPE, so keys and
        values still differ and the cache holds both."""
        return self.attention_k_eq_v and not self.is_sliding(layer) and not self.is_kv_shared(layer)

    @property
    def has_experts(self) -> bool:
        """True when every layer has an expert block beside its dense MLP (`num_experts` > 0: 26B-A4B)."""
        return self.num_experts > 0

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
            "attention_k_eq_v": self.attention_k_eq_v,
            "num_kv_shared_layers": self.num_kv_shared_layers,
            "enable_moe_block": self.has_experts,
            "num_experts": self.num_experts or None,
            "top_k_experts": self.top_k_experts or None,
            "moe_intermediate_size": self.moe_intermediate_size or None,
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


# ---- reading config.json -----------------------------------------------------------------------------------------
# Types follow transformers' `Gemma4TextConfig` field annotations: null is accepted only where it types a field
# `X | None` (pad/bos/eos ids, rope_parameters, layer_types, final_logit_softcapping, use_bidirectional_attention,
# and the kwargs global_head_dim / num_global_key_value_heads / per_layer_config). Booleans are not integers;
# integers are numbers; a number with a fraction (even 35.0) is not an integer.
@dataclasses.dataclass(frozen=True, kw_only=True)
class _Kind:
    """An expected JSON type: its name in messages, its test, and for a list the kind of every element."""

    name: str
    accepts: Callable[[Any], bool]
    item: _Kind | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_INT = _Kind(name="an integer", accepts=_is_int)
_FLOAT = _Kind(name="a number", accepts=lambda v: _is_int(v) or isinstance(v, float))
_BOOL = _Kind(name="true or false", accepts=lambda v: isinstance(v, bool))
_STR = _Kind(name="a string", accepts=lambda v: isinstance(v, str))
_OBJECT = _Kind(name="an object", accepts=lambda v: isinstance(v, dict))
_STR_LIST = _Kind(name="a list of strings", accepts=lambda v: isinstance(v, list | tuple), item=_STR)
_IDS = _Kind(name="an integer or a non-empty list of integers", accepts=_is_int)
_ABSENT = object()  # "no default": the field is required


def _json_type(value: Any) -> str:
    """The JSON type of `value` in words, for messages ('a string', 'null', ...)."""
    if value is None:
        return "null"
    names = ((bool, "a boolean"), (int, "an integer"), (float, "a number with a decimal point"), (str, "a string"),
             (list | tuple, "a list"), (dict, "an object"))  # fmt: skip
    return next((name for t, name in names if isinstance(value, t)), type(value).__name__)


def _shown(value: Any, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters (a hostile config.json can hold megabytes in one field)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _checked(value: Any, kind: _Kind, name: str, where: str) -> Any:
    """`value` when it is of `kind` (a list's elements checked one by one, as `name[i]`); else ConfigError naming
    the file, the field, the value received and the type expected."""
    if not kind.accepts(value):
        raise ConfigError(f"{where}: field {name!r} is {_shown(value)} ({_json_type(value)}); expected {kind.name}")
    if kind.item is not None:
        return [_checked(v, kind.item, f"{name}[{i}]", where) for i, v in enumerate(value)]
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Reader:
    """Typed reads from one JSON object of a config.json.

    where: the file (for messages); path: the object's place in it ("" at the top, "text_config." in a wrapper,
    "rope_parameters.full_attention." ...), so that every message names a field as `path + key`.
    """

    obj: dict[str, Any]
    where: str
    path: str = ""

    def name(self, key: str) -> str:
        """The field's full name in messages, e.g. 'text_config.num_hidden_layers'."""
        return self.path + key

    def error(self, message: str) -> ConfigError:
        """A ConfigError for this file: '<where>: <message>'."""
        return ConfigError(f"{self.where}: {message}")

    def get(self, key: str, kind: _Kind, default: Any = _ABSENT, *, null: Any = _ABSENT) -> Any:
        """Field `key`, checked against `kind`. Absent: `default`, or ConfigError when there is none (a required
        field). Null: `null`, or ConfigError when none is given (transformers does not type the field `X | None`)."""
        if key not in self.obj:
            if default is _ABSENT:
                raise self.error(f"field {self.name(key)!r} is missing; a Gemma 4 text config needs it ({kind.name})")
            return default
        value = self.obj[key]
        if value is None and null is not _ABSENT:
            return null
        return _checked(value, kind, self.name(key), self.where)

    def child(self, key: str, default: dict[str, Any]) -> _Reader:
        """A reader of the object field `key`; `default` when it is absent, null or empty."""
        obj = self.get(key, _OBJECT, default, null=default) or default
        return _Reader(obj=obj, where=self.where, path=f"{self.name(key)}.")


def _text_config(raw: Any, where: str) -> _Reader:
    """A reader of the text decoder's fields: the object itself, or a `gemma4` wrapper's `text_config`.
    Raises ConfigError for a non-object or another model type."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    reader = _Reader(obj=raw, where=where)
    if raw.get("model_type") in _WRAPPER_MODEL_TYPES:
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError(f"{where}: model_type 'gemma4' without a 'text_config' object")
        reader = _Reader(obj={"model_type": "gemma4_text", **text}, where=where, path="text_config.")
    model_type = reader.obj.get("model_type")
    if model_type not in _TEXT_MODEL_TYPES:
        raise reader.error(
            f"{reader.name('model_type')} is {_shown(model_type)}; expected 'gemma4_text' or 'gemma4' "
            "(a Gemma 4 checkpoint)"
        )
    return reader


def _refuse_unsupported(r: _Reader) -> None:
    """ConfigError for a Gemma 4 feature the engine does not implement yet, naming the field.

    `use_bidirectional_attention: "vision"` (31B, 26B-A4B) is accepted: in transformers it makes only vision tokens
    attend bidirectionally, and the engine reads text only, which stays causal; "all" is refused."""
    bidirectional = r.obj.get("use_bidirectional_attention")
    if bidirectional not in (None, False, "vision"):
        raise r.error(f"{r.name('use_bidirectional_attention')}={_shown(bidirectional)} is not supported yet "
                      "(only null or 'vision', whose text tokens attend causally)")
    act = r.get("hidden_activation", _STR, "gelu_pytorch_tanh")
    if act not in _SUPPORTED_ACTIVATIONS:
        raise r.error(f"{r.name('hidden_activation')}={_shown(act)}; expected one of {_SUPPORTED_ACTIVATIONS}")


def _layer_types(r: _Reader) -> tuple[str, ...]:
    """`layer_types`, or transformers' default (5 sliding then 1 full, repeated); the last layer forced to full
    attention, as transformers does. Unknown names and a wrong count are refused by ModelConfig."""
    num_layers = r.get("num_hidden_layers", _INT)
    types = r.get("layer_types", _STR_LIST, None, null=None)
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]
    types = list(types)
    if types and types[-1] != FULL:
        types[-1] = FULL
    return tuple(types)


def _layer_index(key: Any, name: str, where: str) -> int:
    """A `per_layer_config` key as a layer index: JSON writes '2', transformers' own dict holds 2."""
    if _is_int(key):
        return key
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    raise ConfigError(f"{where}: field {name!r} has key {_shown(key)}; expected layer indices such as '2'")


def _per_layer_overrides(r: _Reader, layer_types: tuple[str, ...]) -> tuple[int | None, int | None]:
    """(head_dim, num_key_value_heads) of the full-attention layers from transformers' saved `per_layer_config`
    (None where not overridden). Raises ConfigError unless every full layer, and only those, has the same
    overrides, of head_dim and KV heads only."""
    name = r.name("per_layer_config")
    per_layer = r.obj["per_layer_config"]
    overrides: dict[int, tuple[int | None, int | None]] = {}
    for key, value in per_layer.items():
        idx = _layer_index(key, name, r.where)
        over = _Reader(obj=_checked(value, _OBJECT, f"{name}.{key}", r.where), where=r.where, path=f"{name}.{key}.")
        if not 0 <= idx < len(layer_types) or layer_types[idx] != FULL:
            raise r.error(f"{name} names layer {idx}, which is not a full-attention layer")
        extra = set(over.obj) - {"head_dim", "num_key_value_heads"}
        if extra:
            raise r.error(f"{name} override(s) {sorted(extra)} are not supported yet")
        overrides[idx] = (over.get("head_dim", _INT, None, null=None),
                          over.get("num_key_value_heads", _INT, None, null=None))  # fmt: skip
    full_layers = {i for i, t in enumerate(layer_types) if t == FULL}
    if set(overrides) != full_layers or len(set(overrides.values())) != 1:
        raise r.error(f"{name} must give every full-attention layer {sorted(full_layers)} the same overrides; "
                      f"got {_shown(per_layer, 200)}")  # fmt: skip
    return overrides[min(overrides)]


def _full_attention_geometry(r: _Reader, layer_types: tuple[str, ...]) -> tuple[int, int | None]:
    """(global_head_dim, num_global_kv_heads) from either published form: the hub's `global_head_dim` /
    `num_global_key_value_heads`, or transformers' `per_layer_config` (which wins when both are given).
    The head dim defaults to 512 as in transformers; None KV heads means "the same as sliding layers".
    As transformers 5.23 (`Gemma4TextConfig.__post_init__`), `num_global_key_value_heads` applies only when
    `attention_k_eq_v` is true; without it the full layers keep `num_key_value_heads`."""
    head_dim = r.get("global_head_dim", _INT, None, null=None)
    kv_heads = r.get("num_global_key_value_heads", _INT, None, null=None)
    if not r.get("attention_k_eq_v", _BOOL, False):
        kv_heads = None
    if r.get("per_layer_config", _OBJECT, None, null=None):
        head_dim, kv_heads = _per_layer_overrides(r, layer_types)
    return (512 if head_dim is None else head_dim), kv_heads


def _rope_parameters(r: _Reader) -> tuple[float, float, float]:
    """(local rope_theta, global rope_theta, global partial_rotary_factor) from `rope_parameters`, with
    transformers' defaults for an absent part. Raises ConfigError for a RoPE type not supported yet."""
    rope = r.child("rope_parameters", {})
    full = rope.child(FULL, {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6})
    local = rope.child(SLIDING, {"rope_type": "default", "rope_theta": 1e4})
    local_type = local.get("rope_type", _STR, "default")
    if local_type != "default":
        raise r.error(f"{local.name('rope_type')}={_shown(local_type)} (sliding layers) is not supported yet")
    full_type = full.get("rope_type", _STR, None)
    if full_type not in ("proportional", "default"):
        raise r.error(f"{full.name('rope_type')}={_shown(full_type)} (full-attention layers) is not supported yet")
    partial = float(full.get("partial_rotary_factor", _FLOAT, 1.0)) if full_type == "proportional" else 1.0
    return float(local.get("rope_theta", _FLOAT, 1e4)), float(full.get("rope_theta", _FLOAT, 1e6)), partial


def _eos_ids(r: _Reader) -> tuple[int, ...]:
    """`eos_token_id`: one id or a non-empty list of ids (null: Gemma's 1, as for absent)."""
    eos = r.obj.get("eos_token_id")
    if isinstance(eos, list | tuple) and eos:
        return tuple(_checked(e, _INT, f"{r.name('eos_token_id')}[{i}]", r.where) for i, e in enumerate(eos))
    return (r.get("eos_token_id", _IDS, 1, null=1),)


def config_from_dict(raw: dict[str, Any], *, where: str = "config.json") -> ModelConfig:
    """Build a `ModelConfig` from a parsed config.json (text config, or a `gemma4` wrapper's `text_config`).

    where: the file, named in every message. Raises ConfigError for another model type, a missing field, a
    field of the wrong JSON type (naming it with its path, e.g. 'text_config.num_hidden_layers', the value and
    the type expected), or a Gemma 4 feature not supported yet (attention_k_eq_v, enable_moe_block,
    bidirectional attention of every token, per-layer overrides other than the head dim and KV heads of full
    layers), and for an expert block (`enable_moe_block`) without its sizes.
    """
    r = _text_config(raw, where)
    _refuse_unsupported(r)
    experts = _expert_block(r)
    layer_types = _layer_types(r)
    global_head_dim, num_global_kv_heads = _full_attention_geometry(r, layer_types)
    local_theta, global_theta, partial = _rope_parameters(r)
    softcap = r.get("final_logit_softcapping", _FLOAT, 30.0, null=None)
    return ModelConfig(
        vocab_size=r.get("vocab_size", _INT),
        hidden_size=r.get("hidden_size", _INT),
        num_layers=r.get("num_hidden_layers", _INT),
        num_heads=r.get("num_attention_heads", _INT),
        num_kv_heads=r.get("num_key_value_heads", _INT),
        num_global_kv_heads=num_global_kv_heads,
        head_dim=r.get("head_dim", _INT),
        global_head_dim=global_head_dim,
        intermediate_size=r.get("intermediate_size", _INT),
        use_double_wide_mlp=r.get("use_double_wide_mlp", _BOOL, False),
        sliding_window=r.get("sliding_window", _INT),
        layer_types=layer_types,
        rope_local_theta=local_theta,
        rope_global_theta=global_theta,
        rope_global_partial_factor=partial,
        rms_norm_eps=float(r.get("rms_norm_eps", _FLOAT, 1e-6)),
        final_logit_softcap=None if softcap is None else float(softcap),
        num_kv_shared_layers=r.get("num_kv_shared_layers", _INT, 0),
        ple_dim=r.get("hidden_size_per_layer_input", _INT, 256),
        ple_vocab_size=r.get("vocab_size_per_layer_input", _INT, None),
        max_position_embeddings=r.get("max_position_embeddings", _INT, 131_072),
        tie_word_embeddings=r.get("tie_word_embeddings", _BOOL, True),
        pad_token_id=r.get("pad_token_id", _INT, 0, null=0),
        bos_token_id=r.get("bos_token_id", _INT, 2, null=2),
        eos_token_ids=_eos_ids(r),
        attention_k_eq_v=r.get("attention_k_eq_v", _BOOL, False),
        **experts,
    )


def _expert_block(r: _Reader) -> dict[str, int]:
    """{num_experts, top_k_experts, moe_intermediate_size} of an `enable_moe_block` config (each a required
    integer then), or zeros when the block is off (transformers ignores the sizes then)."""
    if not r.get("enable_moe_block", _BOOL, False):
        return {"num_experts": 0, "top_k_experts": 0, "moe_intermediate_size": 0}
    fields = ("num_experts", "top_k_experts", "moe_intermediate_size")
    missing = [f for f in fields if r.obj.get(f) is None]
    if missing:
        raise r.error(f"{r.name('enable_moe_block')}=True needs {r.name(missing[0])} (an integer); it is missing or null")
    return {f: r.get(f, _INT) for f in fields}


def load_config(path: str | Path) -> ModelConfig:
    """Read `config.json` (a file, or a directory holding one). Raises ConfigError naming the path, also for a
    config that declares the checkpoint already quantized (`quantization_config`, top level or in `text_config`):
    the engine loads dense weights and quantizes them itself (`--quant`)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"{p}: no config.json there; a Hugging Face Gemma 4 checkpoint directory has one")
    try:
        raw = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{p}: not valid JSON ({exc})") from None
    for where in (raw, raw.get("text_config") if isinstance(raw, dict) else None):
        if isinstance(where, dict) and "quantization_config" in where:
            method = (where["quantization_config"] or {}).get("quant_method", "?") if isinstance(
                where["quantization_config"], dict) else "?"  # fmt: skip
            raise ConfigError(f"{p}: has quantization_config (quant_method {method}): this checkpoint is already "
                              "quantized; load the dense checkpoint and quantize on load with --quant")  # fmt: skip
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

G31B = ModelConfig(
    vocab_size=262_144, hidden_size=5376, num_layers=60, num_heads=32, num_kv_heads=16, num_global_kv_heads=4,
    head_dim=256, global_head_dim=512, intermediate_size=21504, sliding_window=1024, layer_types=_pattern(60, 6),
    num_kv_shared_layers=0, ple_dim=0, max_position_embeddings=262_144, eos_token_ids=(1, 106),
    attention_k_eq_v=True,
)  # fmt: skip
"""Gemma 4 31B text decoder: google-deepmind/gemma `gemma/gm/nn/gemma4/_gemma4.py` (`Gemma4_31B`: 60 layers at 5:1,
embed_dim 5376, hidden_dim 4 x 5376 = 21504, 32 heads, 16 KV heads on sliding layers and 4 on global ones, head dims
256 / 512, window 1024, no per-layer inputs, no KV sharing, `k_eq_v_global`); 256K context (architecture notes §6).
Field names as transformers' `Gemma4TextConfig` (models/gemma4/configuration_gemma4.py)."""

G26B_A4B = ModelConfig(
    vocab_size=262_144, hidden_size=2816, num_layers=30, num_heads=16, num_kv_heads=8, num_global_kv_heads=2,
    head_dim=256, global_head_dim=512, intermediate_size=2112, sliding_window=1024, layer_types=_pattern(30, 6),
    num_kv_shared_layers=0, ple_dim=0, max_position_embeddings=262_144, eos_token_ids=(1, 106),
    attention_k_eq_v=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
)  # fmt: skip
"""Gemma 4 26B-A4B (mixture of experts): google-deepmind/gemma `gemma/gm/nn/gemma4/_gemma4.py` (`Gemma4_26B_A4B`:
30 layers at 5:1, embed_dim 2816, 16 heads, 8 KV heads on sliding layers and 2 on global ones, head dims 256 / 512,
window 1024, `k_eq_v_global`, 128 experts of width 704 with the top 8 per token beside a dense MLP of 2112, no
per-layer inputs, no KV sharing); 256K context."""

TINY_31B = ModelConfig(
    vocab_size=512, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, num_global_kv_heads=1, head_dim=16,
    global_head_dim=32, intermediate_size=64, sliding_window=8, layer_types=(SLIDING, FULL) * 2,
    ple_dim=0, max_position_embeddings=256, eos_token_ids=(1, 106), attention_k_eq_v=True,
)  # fmt: skip
"""31B's shape, tiny, for tests (and small enough for a fixture of a few hundred KB): K = V on full layers,
separate full-layer KV heads (2 sliding, 1 full), no PLE, no KV sharing, window 8, 4 layers."""

TINY_MOE = dataclasses.replace(TINY_31B, intermediate_size=48, num_experts=8, top_k_experts=3, moe_intermediate_size=16)
"""26B-A4B's shape, tiny, for tests: `TINY_31B` with an expert block of 8 experts of width 16, the top 3 per token,
beside a dense MLP of 48."""

PRESETS: dict[str, ModelConfig] = {"tiny": TINY, "default": DEFAULT, "e2b": E2B, "e4b": E4B,
                                   "tiny-31b": TINY_31B, "tiny-moe": TINY_MOE, "31b": G31B, "26b-a4b": G26B_A4B}
