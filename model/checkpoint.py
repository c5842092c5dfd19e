"""Hugging Face Gemma 4 checkpoints: resolve (local dir or hub repo id), load safetensors into `Params`, write.

The name map is one table (`tensor_table`) from checkpoint names to parameter fields, each with its expected
checkpoint shape and the transform into the storage layout (`model.accounting.layer_shapes`: HF stores linear
weights [out, in], the storage layout input-major, e.g. q_proj [N*H, D] -> wq_DNH [D, N, H]); each complete layer
is then fused into the compute layout (`model.params.fuse_layer`). Loading fails on a missing, unexpected, duplicate or
mis-shaped tensor and names the key and both shapes. Known-ignorable tensors are skipped knowingly and counted:
the multimodal wrapper's vision/audio towers and projections, a stored (tied) lm_head, and the K/V tensors that
KV-shared layers do not use (the original E2B release still has them; architecture notes §3).

Layouts: `model.language_model.` (published multimodal, Gemma4ForConditionalGeneration) and `model.`
(text-only, Gemma4ForCausalLM). Each weight file is read once, front to back, tensor by tensor and large tensors
block by block of rows (`model.stream`), converted (and quantized, `--quant`) as they stream into preallocated
host arrays, so host memory peaks near the loaded result plus one stored tensor (bound in `load_params`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from model.accounting import global_shapes, layer_shapes
from model.config import ModelConfig, load_config
from model.errors import CheckpointError
from model.folders import write_config_files  # noqa: F401 -- re-exported (model/folders.py writes it)
from model.params import LayerParams, Params, fuse_layer, unfuse_layer
from model.quant import quantize, quantize_fields
from model.quantspec import LM_HEAD, NO_QUANT, QuantSpec, leaf_layout
from model.random_spec import is_random, parse_random
from model.stream import (StoredTensor, iter_tensors, numpy_dtype, read_dense, read_quantized, read_transposed,
                          release_free_heap, safetensors_header)  # fmt: skip

PREFIXES = ("model.language_model.", "model.")
_IGNORED_PREFIXES = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
_SHARED_KV_SUFFIXES = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight",
                       "self_attn.v_norm.weight")  # fmt: skip
_FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")  # safetensors dtype names the loader converts


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: where it goes (`layer` None for a global field), its HF shape, and the transform
    from the HF array to the engine's array (`to_engine`) and back (`to_hf`)."""

    field: str
    layer: int | None
    hf_shape: tuple[int, ...]
    to_engine: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _t(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T)


def tensor_table(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Checkpoint name (without prefix) -> TensorSpec, for every tensor the engine needs."""
    g = global_shapes(cfg)
    d = cfg.hidden_size
    table: dict[str, TensorSpec] = {"embed_tokens.weight": TensorSpec("embed_VD", None, g["embed_VD"], _identity, _identity),
                                    "norm.weight": TensorSpec("final_norm_D", None, (d,), _identity, _identity)}  # fmt: skip
    if cfg.ple_dim:
        x = cfg.num_layers * cfg.ple_dim
        table["embed_tokens_per_layer.weight"] = TensorSpec("ple_embed_VX", None, (cfg.ple_vocab, x), _identity, _identity)
        table["per_layer_model_projection.weight"] = TensorSpec("ple_proj_DX", None, (x, d), _t, _t)
        table["per_layer_projection_norm.weight"] = TensorSpec("ple_norm_P", None, (cfg.ple_dim,), _identity, _identity)
    for i in range(cfg.num_layers):
        s = layer_shapes(cfg, i)
        n, h, k, f = cfg.num_heads, cfg.layer_head_dim(i), cfg.kv_heads(i), cfg.ffw_dim(i)

        def heads_in(shape, *, i=i):  # [heads*H, D] -> [D, heads, H]
            return lambda a: np.ascontiguousarray(a.T.reshape(shape))

        def heads_out(shape):  # [D, heads, H] -> [heads*H, D]
            return lambda a: np.ascontiguousarray(a.reshape(shape[0], -1).T)

        entries = {
            "input_layernorm.weight": ("attn_norm_D", (d,), _identity, _identity),
            "post_attention_layernorm.weight": ("post_attn_norm_D", (d,), _identity, _identity),
            "pre_feedforward_layernorm.weight": ("pre_ffw_norm_D", (d,), _identity, _identity),
            "post_feedforward_layernorm.weight": ("post_ffw_norm_D", (d,), _identity, _identity),
            "layer_scalar": ("layer_scalar_1", (1,), _identity, _identity),
            "self_attn.q_proj.weight": ("wq_DNH", (n * h, d), heads_in(s["wq_DNH"]), heads_out(s["wq_DNH"])),
            "self_attn.q_norm.weight": ("q_norm_H", (h,), _identity, _identity),
            "self_attn.o_proj.weight": (
                "wo_NHD", (d, n * h),
                lambda a, shp=s["wo_NHD"]: np.ascontiguousarray(a.T.reshape(shp)),
                lambda a: np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T),
            ),
            "mlp.gate_proj.weight": ("gate_DF", (f, d), _t, _t),
            "mlp.up_proj.weight": ("up_DF", (f, d), _t, _t),
            "mlp.down_proj.weight": ("down_FD", (d, f), _t, _t),
        }  # fmt: skip
        if not cfg.is_kv_shared(i):
            entries["self_attn.k_proj.weight"] = ("wk_DKH", (k * h, d), heads_in(s["wk_DKH"]), heads_out(s["wk_DKH"]))
            entries["self_attn.k_norm.weight"] = ("k_norm_H", (h,), _identity, _identity)
        if s["wv_DKH"] is not None:  # absent on KV-shared layers and on attention_k_eq_v's full layers
            entries["self_attn.v_proj.weight"] = ("wv_DKH", (k * h, d), heads_in(s["wv_DKH"]), heads_out(s["wv_DKH"]))
        if cfg.has_experts:
            entries.update(_expert_entries(cfg))
        if cfg.ple_dim:
            p = cfg.ple_dim
            entries["per_layer_input_gate.weight"] = ("ple_gate_DP", (p, d), _t, _t)
            entries["per_layer_projection.weight"] = ("ple_proj_PD", (d, p), _t, _t)
            entries["post_per_layer_input_norm.weight"] = ("post_ple_norm_D", (d,), _identity, _identity)
        for name, (field, shape, fwd, back) in entries.items():
            table[f"layers.{i}.{name}"] = TensorSpec(field, i, shape, fwd, back)
    return table


def _swap_last(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def _expert_entries(cfg: ModelConfig) -> dict[str, tuple]:
    """A layer's expert-block tensors (26B-A4B), transformers' names (models/gemma4/modeling_gemma4.py:
    `Gemma4TextDecoderLayer` router / experts / the three extra norms): name -> (field, HF shape, to engine, to HF).
    router.proj.weight [E, D] is transposed to router_DE [D, E]; experts.gate_up_proj [E, 2I, D] to [E, D, 2I];
    experts.down_proj [E, D, I] is kept as stored (`model.accounting.expert_shapes`)."""
    d, e, m = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    return {
        "router.proj.weight": ("router_DE", (e, d), _t, _t),
        "router.scale": ("router_scale_D", (d,), _identity, _identity),
        "router.per_expert_scale": ("expert_scale_E", (e,), _identity, _identity),
        "experts.gate_up_proj": ("experts_gate_up_EDX", (e, 2 * m, d), _swap_last, _swap_last),
        "experts.down_proj": ("experts_down_EDF", (e, d, m), _identity, _identity),
        "post_feedforward_layernorm_1.weight": ("post_ffw1_norm_D", (d,), _identity, _identity),
        "pre_feedforward_layernorm_2.weight": ("pre_ffw2_norm_D", (d,), _identity, _identity),
        "post_feedforward_layernorm_2.weight": ("post_ffw2_norm_D", (d,), _identity, _identity),
    }  # fmt: skip


def _is_ignorable(full_key: str, rel_key: str | None, cfg: ModelConfig) -> bool:
    if full_key.startswith(_IGNORED_PREFIXES) or full_key == "lm_head.weight":
        return True
    if rel_key and rel_key.startswith("layers.") and rel_key.endswith(_SHARED_KV_SUFFIXES):
        layer = rel_key.split(".")[1]
        return layer.isdigit() and cfg.is_kv_shared(int(layer))
    return False


# ---- resolving a checkpoint -------------------------------------------------------------------------------------
def resolve_checkpoint(spec: str | os.PathLike) -> Path:
    """A local checkpoint directory, a `random:PRESET[@SEED]` text (dummy weights: its folder of config and
    tokenizer, `model.random_weights.ensure_random`, created on first use), or a Hugging Face repo id downloaded
    (or found in the local cache).

    Hub access uses huggingface_hub (token from HF_TOKEN); when the hub is unreachable or HF_HUB_OFFLINE=1, the
    local cache is used. Raises CheckpointError naming the path or repo when nothing can be found, and for a
    `random:` text naming no preset (`model.random_spec.parse_random`).
    """
    text = os.fspath(spec)
    if is_random(text):
        import logging

        from model.random_weights import ensure_random

        return ensure_random(parse_random(text), log=logging.getLogger("model.engine").info)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"{path}: is a file; expected a checkpoint directory with config.json and *.safetensors")
        return path
    looks_like_repo = text.count("/") == 1 and not text.startswith((".", "/", "~")) and " " not in text
    if not looks_like_repo:
        raise CheckpointError(f"{text}: no such checkpoint directory (nor an 'owner/name' Hugging Face repo id)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    patterns = ["*.json", "*.safetensors", "tokenizer*"]
    try:
        try:
            return Path(snapshot_download(text, allow_patterns=patterns, local_files_only=True))
        except Exception:  # not cached (or partially): ask the hub unless offline
            if os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "True", "ON"):
                raise
            return Path(snapshot_download(text, allow_patterns=patterns))
    except HFValidationError as exc:
        raise CheckpointError(f"{text}: not a valid Hugging Face repo id ({exc})") from None
    except Exception as exc:
        raise CheckpointError(
            f"{text}: not in the local Hugging Face cache and the hub could not provide it "
            f"({type(exc).__name__}); download it where there is network (`hf download {text}`) "
            "or pass a local directory"
        ) from None


def safetensors_files(ckpt: Path) -> list[Path]:
    """The weight files of a checkpoint dir: the shards named by model.safetensors.index.json, else *.safetensors."""
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
        files = [ckpt / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index}: names shard(s) {missing} that are not in {ckpt}")
        return files
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{ckpt}: no *.safetensors files; a Hugging Face checkpoint directory has model.safetensors")
    return files


_BLOCK = 1 << 22  # bytes per read when hashing whole files


def _hashed_names(ckpt: Path) -> list[str]:
    """The files the content hash covers, in its order: config.json, tokenizer.json, then the weight files."""
    return ["config.json", "tokenizer.json"] + [p.name for p in safetensors_files(ckpt)]


def _hash_file(h, path: Path) -> None:
    """Feed `name NUL bytes` of one file into the sha256 `h` (nothing when the file does not exist)."""
    if not path.is_file():
        return
    h.update(path.name.encode() + b"\0")
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)


def _match_tensor(key: str, shape: tuple[int, ...], stored_dtype: str, file: Path, table: dict[str, TensorSpec],
                  cfg: ModelConfig, seen: set[str], prefix_used: set[str]) -> str | None:  # fmt: skip
    """The table name (prefix removed) of checkpoint tensor `key`, or None for a known-ignorable one. Raises
    CheckpointError for an unexpected, duplicate (`seen` so far), mis-shaped or non-float tensor, naming it."""
    rel = next((key[len(p):] for p in PREFIXES if key.startswith(p)), None)
    spec = table.get(rel) if rel is not None else None
    if spec is None:
        if _is_ignorable(key, rel, cfg):
            return None
        raise CheckpointError(f"{file.name}: unexpected tensor {key!r} with shape {list(shape)} for this config")
    if rel in seen:
        raise CheckpointError(f"{file.name}: tensor {rel!r} appears twice (under prefixes {sorted(prefix_used)})")
    if shape != spec.hf_shape:
        raise CheckpointError(f"{file.name}: tensor {key!r} has shape {list(shape)}, expected {list(spec.hf_shape)}")
    if stored_dtype not in _FLOAT_DTYPES:  # e.g. a quantized checkpoint: its scales would be ignored silently
        raise CheckpointError(f"{file.name}: tensor {key!r} is stored as {stored_dtype}, expected a float dtype "
                              f"({', '.join(_FLOAT_DTYPES)}); quantized checkpoints are not supported yet")  # fmt: skip
    return rel


def _check_complete(path: Path, table: dict[str, TensorSpec], seen: set[str]) -> None:
    """CheckpointError naming the first tensor of `table` not in `seen` (and how many more), if any."""
    missing = sorted(set(table) - seen, key=lambda k: (k.count("."), k))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{path}: tensor {missing[0]!r} is missing{more}; expected shape {list(table[missing[0]].hf_shape)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointShapes:
    """What a checkpoint's config.json and safetensors headers say, without reading a tensor.

    path: the directory; config: its `ModelConfig`; tensors: tensors the engine loads; ignored: known-ignorable
    keys; stored_dtypes: the safetensors dtypes of the loaded tensors (e.g. ("BF16",)); stored_bytes: their bytes
    as stored (shape x the stored dtype's itemsize).
    """

    path: str
    config: ModelConfig
    tensors: int
    ignored: tuple[str, ...]
    stored_dtypes: tuple[str, ...]
    stored_bytes: int


def read_checkpoint_shapes(path: str | os.PathLike) -> CheckpointShapes:
    """`CheckpointShapes` of a local checkpoint directory, from config.json and the safetensors headers only (no
    tensor data is read). The checks are `load_params`'s: a missing, unexpected, duplicate, mis-shaped or
    non-float (e.g. already quantized) tensor is a CheckpointError naming it; a bad config.json a ConfigError."""
    ckpt = Path(path).expanduser()
    if not ckpt.is_dir():
        what = "is a file" if ckpt.exists() else "no such directory"
        raise CheckpointError(f"{ckpt}: {what}; expected a checkpoint directory with config.json and *.safetensors")
    cfg = load_config(ckpt)
    table = tensor_table(cfg)
    seen: set[str] = set()
    prefix_used: set[str] = set()
    ignored: list[str] = []
    stored: set[str] = set()
    stored_bytes = 0
    for file in safetensors_files(ckpt):
        with open(file, "rb") as f:
            _, entries = safetensors_header(f, file)
        for _, _, key, entry in entries:
            shape, dtype = tuple(int(d) for d in entry.get("shape", ())), str(entry.get("dtype"))
            rel = _match_tensor(key, shape, dtype, file, table, cfg, seen, prefix_used)
            if rel is None:
                ignored.append(key)
                continue
            seen.add(rel)
            prefix_used.add(key[: len(key) - len(rel)])
            stored.add(dtype)
            stored_bytes += int(np.prod(shape, dtype=np.int64)) * numpy_dtype(dtype, file).itemsize
    _check_complete(ckpt, table, seen)
    return CheckpointShapes(path=str(ckpt), config=cfg, tensors=len(seen), ignored=tuple(ignored),
                            stored_dtypes=tuple(sorted(stored)), stored_bytes=stored_bytes)  # fmt: skip


def load_params(ckpt: str | os.PathLike, cfg: ModelConfig | None = None, *, dtype=np.float32, device_put=None,
                quant: QuantSpec = NO_QUANT, scale_dtype=None):  # fmt: skip
    """Load a checkpoint's text-decoder weights as `Params`, converted to `dtype`, quantized as `quant` says.

    Returns (params, report) where report is a dict: path, prefixes used, tensors loaded, ignored keys, the
    safetensors dtypes the tensors were stored in (e.g. ["BF16"]), and `content_hash`: the checkpoint's
    `content_hash`, computed from the bytes as they are read for the load (each weight file is read once).

    Streaming (`model.stream`): a global tensor is read in blocks of rows into one preallocated, aligned array
    of `dtype`; `quant` (`model.quantspec.QuantSpec`, scales of `scale_dtype`, default bfloat16) quantizes the
    tables `leaf_layout` gives one scale block per row (`ple_embed_VX`; with `int8_lm_head` the head copy
    `lm_head_VD`, made from the same blocks as the dense `embed_VD` the input lookup keeps) block by block, so
    the full-precision PLE table is never held whole. A layer's tensors (transposed: the simple path) are fused
    once the layer is complete (`model.params.fuse_layer`), its projections quantized (`model.quant
    .quantize_fields`), then placed. The result equals `model.quant.quantize_params` of the dense load, leaf for
    leaf and bit for bit. `device_put` (e.g. `jax.device_put`) places each global leaf as it is made and each
    layer once fused; None keeps numpy arrays (a layer's quantized leaves are jax arrays either way).

    Peak host memory (RSS; tests/test_load_memory.py measures it): <= the process baseline (python, jax, the
    XLA runtime and compiler) + the result's bytes (`model.quant.tree_bytes`; on CPU the placed arrays are the
    aligned host arrays, `jax.device_put` aliases them; on an accelerator they are freed once copied) + the
    largest tensor as stored + a margin of a few 16 MiB blocks (the read buffer, its conversion, the quantizer's
    float32 work) and one layer (its storage tensors while it fuses; for Gemma 4 shapes far below the largest
    tensor, the PLE table or the embedding). Measured (2-core CPU, jax 0.12) on a 420 MB bfloat16 checkpoint
    with a 402 MB PLE table, over a 225 MiB baseline: dense bfloat16 peaked 13 MiB above baseline + result,
    dense float32 9 MiB, `ple4,int8_lm_head,w8` 105 MiB (the block work and the quantizer's compiles), where
    the load before streaming went 765, 1145 and 1875 MiB above it (2.0x, 3.0x, 4.9x the largest tensor).
    Raises CheckpointError for a missing/unexpected/duplicate/mis-shaped tensor (naming it and both shapes) or
    an unreadable file; ConfigError for a bad config.json.
    """
    path = resolve_checkpoint(ckpt)
    cfg = cfg or load_config(path)
    table = tensor_table(cfg)
    put = device_put or (lambda a: a)
    scales = {"scale_dtype": jnp.bfloat16 if scale_dtype is None else scale_dtype}
    loaded = _stream_tensors(path, cfg, table, dtype, quant, scales, put)
    _check_complete(path, table, loaded.seen)
    params = Params(**loaded.glob, layers=tuple(loaded.layers), lm_head_VD=loaded.head)
    report = {"path": str(path), "prefixes": sorted(loaded.prefixes), "tensors": len(loaded.seen),
              "ignored": loaded.ignored, "stored_dtypes": sorted(loaded.stored),
              "content_hash": loaded.content_hash}  # fmt: skip
    return params, report


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Streamed:
    """What `_stream_tensors` read: the global leaves by field (`glob`), the int8 head copy or None, the fused
    layers (None where a layer was incomplete), the table names seen, the ignored keys, the prefixes and stored
    dtypes met, and the content hash of the bytes read (`content_hash`'s value)."""

    glob: dict[str, object]
    head: object
    layers: list[LayerParams | None]
    seen: set[str]
    ignored: list[str]
    prefixes: set[str]
    stored: set[str]
    content_hash: str


def _stream_tensors(path: Path, cfg: ModelConfig, table: dict[str, TensorSpec], dtype, quant: QuantSpec,
                    scales: dict, put: Callable) -> _Streamed:  # fmt: skip
    """`load_params`' one pass over the weight files, in order (`model.stream.iter_tensors`, hashing as it
    reads): each tensor matched against `table` (`_match_tensor`: CheckpointError for an unexpected, duplicate
    or mis-shaped one), a global one converted or quantized as it streams (`_load_global`) and placed with
    `put`, a layer's kept until the layer is complete, then fused, quantized and placed."""
    glob: dict[str, object] = {name: None for name in global_shapes(cfg)}
    head = None
    layers: list[dict[str, object]] = [{name: None for name in layer_shapes(cfg, i)} for i in range(cfg.num_layers)]
    pending = [{name for name, shape in layer_shapes(cfg, i).items() if shape is not None} for i in range(cfg.num_layers)]
    fused: list[LayerParams | None] = [None] * cfg.num_layers
    seen: set[str] = set()
    ignored: list[str] = []
    prefix_used: set[str] = set()
    stored: set[str] = set()
    h = hashlib.sha256()
    for name in _hashed_names(path)[:2]:  # config.json, tokenizer.json: as content_hash orders them
        _hash_file(h, path / name)
    for t in iter_tensors(safetensors_files(path), h):
        rel = _match_tensor(t.key, t.shape, t.dtype, t.file, table, cfg, seen, prefix_used)
        if rel is None:
            ignored.append(t.key)
            continue  # iter_tensors reads (and hashes) it
        seen.add(rel)
        stored.add(t.dtype)
        prefix_used.add(t.key[: len(t.key) - len(rel)])
        spec = table[rel]
        if spec.layer is None:
            leaf, lm_head = _load_global(t, spec, dtype, quant, scales)
            glob[spec.field] = jax.tree_util.tree_map(put, leaf)
            head = head if lm_head is None else jax.tree_util.tree_map(put, lm_head)
            continue
        layers[spec.layer][spec.field] = read_transposed(t, spec.to_engine, dtype)
        pending[spec.layer].discard(spec.field)
        if not pending[spec.layer]:  # the layer is complete: fuse it on the host, quantize, drop the parts, place
            lp = fuse_layer(layers[spec.layer])
            layers[spec.layer] = {}
            fused[spec.layer] = jax.tree_util.tree_map(put, quantize_fields(lp, quant, **scales))
            if quant.layer_bits is not None:
                release_free_heap()  # the quantizer's temporaries (model.stream.release_free_heap says why)
    return _Streamed(glob=glob, head=head, layers=fused, seen=seen, ignored=ignored, prefixes=prefix_used,
                     stored=stored, content_hash=h.hexdigest())  # fmt: skip


def _load_global(t: StoredTensor, spec: TensorSpec, dtype, quant: QuantSpec, scales: dict):
    """(the leaf of global tensor `t`, its int8 head copy or None): streamed into `dtype` (`model.stream
    .read_dense`), or quantized while it streams (`read_quantized`) where `leaf_layout` quantizes the field or,
    for embed_VD under int8_lm_head, its head copy. A transposed tensor (ple_proj_DX) takes the simple path
    (`read_transposed`) and, were a layout ever to quantize one, is quantized whole."""
    if spec.to_engine is not _identity:
        leaf = read_transposed(t, spec.to_engine, dtype)
        layout = leaf_layout(spec.field, tuple(leaf.shape), quant, jax.default_backend())
        if layout is None:
            return leaf, None
        return quantize(leaf, layout.bits, layout.block, words=layout.words, **scales), None
    if spec.field == "embed_VD" and quant.int8_lm_head:
        layout = leaf_layout(LM_HEAD, t.shape, quant, jax.default_backend())  # stored for the device it goes to
        return read_quantized(t, dtype, layout, scales["scale_dtype"], keep_dense=True)
    layout = leaf_layout(spec.field, t.shape, quant, jax.default_backend())
    if layout is not None:
        return read_quantized(t, dtype, layout, scales["scale_dtype"], keep_dense=False)[1], None
    return read_dense(t, dtype), None


# ---- writing ----------------------------------------------------------------------------------------------------
def save_tensors(
    leaves: Iterable[tuple[int | None, str, np.ndarray]],
    cfg: ModelConfig,
    out_dir: Path,
    *,
    dtype=np.float32,
    layout: str = "text",
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write parameter leaves, given as (layer or None, field, array) in the engine's layout, as a Hugging Face
    model.safetensors (format "pt" metadata, tensors in `dtype`, keys in sorted order).

    Each leaf is converted to its checkpoint name, layout and dtype as it arrives, so a generator of leaves
    (`model.params.init_tensors`) is never held twice: host memory peaks near the checkpoint's size plus one
    leaf. layout "text" uses the `model.` prefix (Gemma4ForCausalLM); "published" the `model.language_model.`
    prefix of the released multimodal checkpoints. The file's bytes depend only on the values and `dtype`.
    Raises CheckpointError for a leaf that is not in `tensor_table(cfg)` or has the wrong shape, or when a
    tensor of the table is missing.
    """
    from safetensors.numpy import save_file

    prefix = {"text": "model.", "published": "model.language_model."}[layout]
    table = tensor_table(cfg)
    by_leaf = {(spec.layer, spec.field): rel for rel, spec in table.items()}
    tensors: dict[str, np.ndarray] = {}
    for layer, field, value in leaves:
        rel = by_leaf.get((layer, field))
        if rel is None:
            raise CheckpointError(f"leaf {field!r} of layer {layer!r} has no checkpoint name for this config")
        if prefix + rel in tensors:
            raise CheckpointError(f"leaf {field!r} of layer {layer!r} was given twice")
        spec = table[rel]
        want = (global_shapes(cfg) if layer is None else layer_shapes(cfg, layer))[field]
        got = getattr(value, "shape", None)
        if got is None or tuple(got) != want:
            raise CheckpointError(f"leaf {field!r} of layer {layer!r}: shape {got}, expected {want} for this config")
        tensors[prefix + rel] = np.ascontiguousarray(spec.to_hf(np.asarray(value)).astype(dtype, copy=False))
    missing = sorted(prefix + rel for rel in table if prefix + rel not in tensors)
    if missing:
        raise CheckpointError(f"{len(missing)} tensors were not given, e.g. {missing[0]}")
    tensors.update(extra_tensors or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.safetensors"
    save_file(dict(sorted(tensors.items())), str(target), metadata={"format": "pt"})
    umask = os.umask(0)  # safetensors creates the file 0600; give it the mode any other file written here gets
    os.umask(umask)
    os.chmod(target, 0o666 & ~umask)
    return target


def save_params(params: Params, cfg: ModelConfig, out_dir: Path, *, dtype=np.float32, layout: str = "text",
                extra_tensors: dict[str, np.ndarray] | None = None) -> Path:  # fmt: skip
    """Write a whole parameter tree with `save_tensors` (same format, names, dtype and errors)."""

    def leaves():
        for spec in tensor_table(cfg).values():
            if spec.layer is None:
                yield None, spec.field, getattr(params, spec.field)
            else:
                yield spec.layer, spec.field, storage[spec.layer][spec.field]

    storage = [unfuse_layer(cfg, i, jax.tree_util.tree_map(np.asarray, lp)) for i, lp in enumerate(params.layers)]

    return save_tensors(leaves(), cfg, out_dir, dtype=dtype, layout=layout, extra_tensors=extra_tensors)


def content_hash(ckpt: Path) -> str:
    """sha256 (hex) over the names and bytes of config.json, tokenizer.json and the safetensors files, in that
    order (each file as its name, a NUL byte, its bytes; a missing tokenizer.json is left out).

    Two checkpoints with one hash load the same weights, config and tokenizer. `load_params` computes the same
    value while it loads (its report's `content_hash`); this reads the files again, for callers that do not load.
    """
    h = hashlib.sha256()
    for name in _hashed_names(Path(ckpt)):
        _hash_file(h, Path(ckpt) / name)
    return h.hexdigest()
