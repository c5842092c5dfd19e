"""Dummy weights: random parameters made directly on the device in their final (quantized) layout, no weight file.

`--checkpoint random:PRESET[@SEED]` (`model.random_spec`) loads a preset's shapes with random weights without
writing or reading a checkpoint: a built-in E2B checkpoint is 9.26 GB of safetensors to write (219 s on 13 cores)
and read back before anything is measured; here each parameter is drawn on the device by a jitted program, in the
weight dtype, and quantized there, so nothing but the small config and tokenizer files touches the disk.

The folder (`ensure_random`, cached like a built-in checkpoint, `random_folder`) holds everything of a built-in
checkpoint but its weights: config.json, generation_config.json, the tokenizer the built-in checkpoints use
(trained on the shipped text, `model.folders.write_model_files`), and `MARKER`, which names the preset and seed.
`model.engine.load_engine` loads such a folder with `load_random` instead of `model.checkpoint.load_params`; every
command that takes a checkpoint folder (its config, its tokenizer) takes it as it is.

How the values are drawn (`random_params`). jax's threefry generator by default (`PRNG_ENV` chooses "rbg", XLA's
RngBitGenerator, instead; recorded and hashed). Each leaf has its own key, `fold_in(key(seed), crc32(name))` with
`name` the leaf's place ("embed_VD", "layers.3.qkv_DX"; `leaf_key`), and the distribution of
`model.params.init_rule`, the rule the built-in checkpoints' `init_tensors` follows (same families and scales:
N(0, 1/fan_in) projections, 0.1/sqrt(D) tied table, norm gains near 1, q/k-norm gains near head_dim^-1/4, layer
scalars U[0.7, 1.3]), so activations behave alike. The values are NOT those of `builtin:PRESET`: jax's threefry
generator, not numpy's, and each layer's leaves drawn directly in the compute layout (`LayerParams`: qkv_DX fused,
with one std for its q, k and v parts as `init_rule` gives each part). Values are drawn in float32 and cast to the
weight dtype, then quantized from that dtype (as a checkpoint's are), so a quantized load holds the quantized
values of the dense load's weights. 2-D global tables are drawn `DRAW_BLOCK` scalars at a time, by rows, into one
preallocated buffer (donated, updated in place), quantized block by block where `--quant` quantizes them (the PLE
table, the int8 head copy), with the same `model.quant.quantize` arithmetic `model.quant.quantize_blocks` uses
for a streaming checkpoint; a layer's leaves are drawn whole and quantized by `model.quant.quantize_fields`, the
function the checkpoint path calls. Same preset, seed, weight dtype, jax version and platform -> the same
weights; across platforms the float32 transforms of the random bits may differ in their last bit.

Memory: the device holds the result plus one layer's dense leaves and one drawn block's float32 work at a time;
`check_fits` refuses, before anything is drawn, a preset whose weights as placed (`model.accounting.weight_bytes`)
and that working margin exceed the device's memory.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from model.accounting import MEMORY_RESERVE, compute_layer_shapes, global_shapes, weight_bytes
from model.config import PRESETS, ModelConfig
from model.errors import CheckpointError, EngineError
from model.folders import cache_root, create_atomically, write_model_files
from model.memory import memory_capacity
from model.params import LayerParams, Params, init_rule
from model.quant import QuantArray, quantize, quantize_fields
from model.quantspec import (EXPERT_PROJECTIONS, LM_HEAD, NO_QUANT, QuantLayout, QuantSpec, leaf_layout, scale_shape,
                             value_dtype, value_shape)  # fmt: skip
from model.random_spec import DUMMY_NOTE, RandomSpec

RANDOM_VERSION = 1
"""Bump when the draw changes (keys, blocks, rules, the folder's files): the content hash and folder change too."""

MARKER = "dummy_weights.json"
"""The file that makes a folder a dummy-weights checkpoint: {"preset", "seed", "version", "note"}."""

PRNG_ENV = "GEMMA4_BENCH_RANDOM_PRNG"
"""The environment variable that chooses jax's generator for dummy weights: one of `PRNGS`, default the first."""
PRNGS = ("threefry2x32", "rbg")
"""threefry2x32 (jax's default: the same bits on every backend) or rbg (XLA's RngBitGenerator: its bits may differ
by backend and version; jax's documentation says it may be faster on TPUs). Part of the draw: recorded in the
manifest (`dummy.prng`) and hashed (`dummy_content_hash`)."""

ROUTING_ENV = "GEMMA4_BENCH_EXPERT_ROUTING"
"""The environment variable that chooses how dummy weights of a preset with experts (26B-A4B) route tokens: one of
`model.moe.ROUTINGS`, default "router" (the random router's own top-k). "balanced" assigns every expert equally
often across a step's tokens, the K experts per token unchanged (a random router may favour experts unlike a
trained one's). Not part of the weights (not hashed), but of the run: recorded in the manifest
(`dummy.expert_routing`), and a balanced run's checkpoint id ends in "-balanced" (`bench.runs.manifest`)."""

DRAW_BLOCK = 1 << 24
"""Scalars drawn per block of a 2-D global table (64 MiB of float32 work): the E2B PLE table, 2.35e9 scalars, would
need 9.4 GB of float32 drawn whole. Part of the draw: a table's values depend on its blocks."""


# ---- the folder ---------------------------------------------------------------------------------------------------
def random_folder(spec: RandomSpec) -> Path:
    """Where the cached folder of `spec` lives: <cache root>/random/random-PRESET-seedSEED-vVERSION
    (`model.folders.cache_root`)."""
    return cache_root() / "random" / f"random-{spec.preset}-seed{spec.seed}-v{RANDOM_VERSION}"


def ensure_random(spec: RandomSpec, *, log=print) -> Path:
    """The folder of `spec`, created on first use (atomically, `model.folders.create_atomically`): the preset's
    config files, the built-in checkpoints' tokenizer and `MARKER`; no weights. `log` gets one line when it
    creates. Raises CheckpointError when the cache folder cannot be written."""
    target = random_folder(spec)
    if (target / MARKER).is_file():
        return target
    log(f"creating the config and tokenizer of {spec.text} in {target} (first use only; no weights are written)")

    def make(tmp: Path) -> None:
        write_model_files(PRESETS[spec.preset], tmp)
        marker = {"preset": spec.preset, "seed": spec.seed, "version": RANDOM_VERSION, "note": DUMMY_NOTE}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")

    try:
        return create_atomically(target, make)
    except OSError as exc:
        raise CheckpointError(f"{target}: cannot write the dummy checkpoint's config ({exc.strerror or exc}); "
                              "set GEMMA4_BENCH_CACHE to a writable folder")  # fmt: skip


def read_marker(path: str | os.PathLike) -> RandomSpec | None:
    """The `RandomSpec` a folder's `MARKER` names, None when the folder has no marker (an ordinary checkpoint).
    Raises CheckpointError (naming the file) for a marker that is not valid, or of another `RANDOM_VERSION`."""
    file = Path(path) / MARKER
    if not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
        spec = RandomSpec(str(raw["preset"]), int(raw["seed"]))
        version = raw["version"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{file}: not a valid dummy-weights marker ({exc}); delete the folder, it is remade "
                              "on first use")  # fmt: skip
    if version != RANDOM_VERSION or spec.preset not in PRESETS:
        raise CheckpointError(f"{file}: dummy weights of version {version!r}, preset {spec.preset!r}; this harness "
                              f"makes version {RANDOM_VERSION}; delete the folder, it is remade on first use")  # fmt: skip
    return spec


def prng_impl() -> str:
    """The generator `PRNG_ENV` names (unset: `PRNGS[0]`). Raises EngineError, one line, for another value."""
    value = os.environ.get(PRNG_ENV, PRNGS[0]).strip()
    if value not in PRNGS:
        raise EngineError(f"{PRNG_ENV}={value!r}: expected one of {', '.join(PRNGS)}; unset it for {PRNGS[0]}")
    return value


def expert_routing() -> str:
    """The routing `ROUTING_ENV` names (unset: "router"). Raises EngineError, one line, for another value."""
    from model.moe import ROUTINGS

    value = os.environ.get(ROUTING_ENV, ROUTINGS[0]).strip()
    if value not in ROUTINGS:
        raise EngineError(f"{ROUTING_ENV}={value!r}: expected one of {', '.join(ROUTINGS)}; unset it for {ROUTINGS[0]}")
    return value


def dummy_content_hash(path: str | os.PathLike, spec: RandomSpec, weight_dtype: str, prng: str = PRNGS[0]) -> str:
    """The content hash (sha256 hex) of dummy weights: over the draw's key (`RANDOM_VERSION`, preset, seed, the
    weight dtype's name, the generator unless it is the default `PRNGS[0]`) and the folder's config.json and
    tokenizer.json bytes, in place of a weight file's bytes. Same key, same weights (on one platform and jax
    version, module docstring)."""
    h = hashlib.sha256()
    h.update(f"random-weights v{RANDOM_VERSION} preset={spec.preset} seed={spec.seed} dtype={weight_dtype}".encode())
    h.update(b"\0" if prng == PRNGS[0] else f" prng={prng}\0".encode())
    for name in ("config.json", "tokenizer.json"):
        file = Path(path) / name
        if file.is_file():
            h.update(name.encode() + b"\0" + file.read_bytes())
    return h.hexdigest()


# ---- the bound ------------------------------------------------------------------------------------------------------
def working_bytes(cfg: ModelConfig, itemsize: int) -> int:
    """Bytes `random_params` holds beside the finished weights at most (a stated margin from the shapes, not a
    measurement): one layer's leaves dense at `itemsize` (they are quantized together, `quantize_fields`; the
    expert weights are not among them: drawn by blocks) plus twice the float32 bytes of the largest leaf or block
    (of a table's rows, of an expert weight's experts) drawn at once (its draw and the quantizer's float32 work)."""
    def whole(i):  # the leaves drawn whole (the expert weights are drawn by blocks of experts, `_expert_leaf`)
        return [s for n, s in compute_layer_shapes(cfg, i).items() if s is not None and n not in EXPERT_PROJECTIONS]

    layer = max(sum(math.prod(s) for s in whole(i)) for i in range(cfg.num_layers))
    largest = max(math.prod(s) for i in range(cfg.num_layers) for s in whole(i))
    tables = [s for s in global_shapes(cfg).values() if s is not None and len(s) > 1]
    tables += [s for n, s in compute_layer_shapes(cfg, 0).items() if n in EXPERT_PROJECTIONS and s is not None]
    block = max(_block_rows(s) * math.prod(s[1:]) for s in tables)
    return layer * itemsize + 2 * 4 * max(largest, block)


def check_fits(cfg: ModelConfig, name: str, *, itemsize: int, scale_itemsize: int, quant: QuantSpec,
               device=None) -> int:  # fmt: skip
    """The bytes dummy weights of `cfg` need on `device` (default: jax's first): the weights as placed
    (`model.accounting.weight_bytes` at `itemsize` bytes per dense scalar, `scale_itemsize` per scale, `quant`)
    plus `working_bytes`, checked before anything is drawn against the device's memory (`bytes_limit` where it
    reports one, else the host's available memory: `model.memory.memory_capacity`) less `MEMORY_RESERVE`.
    `name` (e.g. "random:e2b") names the checkpoint in the refusal. Raises EngineError, one line with the
    arithmetic and the fix, when they do not fit."""
    weights = weight_bytes(cfg, itemsize, scale_itemsize=scale_itemsize, quant=quant)
    work = working_bytes(cfg, itemsize)
    capacity, where = memory_capacity(0, device)
    usable = math.floor(capacity * (1 - MEMORY_RESERVE))
    if weights + work > usable:
        gb = 1e9
        raise EngineError(f"{name} (quant {quant.canonical}) does not fit: {weights / gb:.3f} GB of weights as placed "
                          f"+ {work / gb:.3f} GB drawn at a time = {(weights + work) / gb:.3f} GB, above the "
                          f"{usable / gb:.3f} GB usable ({capacity / gb:.3f} GB {where}, less {MEMORY_RESERVE:.0%} "
                          "reserved); pick a smaller preset or a lighter --quant (w8 or w4, ple4, int8_lm_head)")  # fmt: skip
    return weights + work


# ---- drawing on the device ------------------------------------------------------------------------------------------
def leaf_key(seed_key: jax.Array, name: str) -> jax.Array:
    """The key of leaf `name` ("embed_VD", "layers.3.qkv_DX"): `seed_key` folded with the name's crc32."""
    return jax.random.fold_in(seed_key, np.uint32(zlib.crc32(name.encode())))


def _sample(key: jax.Array, shape: tuple[int, ...], kind: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """float32 values of `shape` from an `model.params.InitRule` of `kind` with parameters a, b (traced)."""
    if kind == "uniform":
        return jax.random.uniform(key, shape, jnp.float32, a, b)
    z = jax.random.normal(key, shape, jnp.float32)
    return a * (1 + b * z) if kind == "gain" else z * a


@functools.partial(jax.jit, static_argnames=("specs", "dtype"))
def _draw(keys, a, b, *, specs, dtype):
    """Whole leaves in `dtype`, leaf j of `specs[j]` = (shape, kind) with key `keys[j]` and the rule's numbers
    `a[j]`, `b[j]` (traced): one program per (specs, dtype), so each layer structure compiles once (E2B: a
    handful), not each leaf shape."""
    return tuple(_sample(k, shape, kind, a[j], b[j]).astype(dtype)
                 for j, (k, (shape, kind)) in enumerate(zip(keys, specs, strict=True)))  # fmt: skip


def _draw_leaves(seed_key, cfg: ModelConfig, shapes: dict, prefix: str, head_dim: int, dtype) -> dict:
    """{name: leaf} of the `shapes` given (None stays None), each drawn by its `init_rule` with the key of
    `prefix + name` (`leaf_key`), in one `_draw` program."""
    names = [n for n, s in shapes.items() if s is not None]
    rules = [init_rule(cfg, n, shapes[n], head_dim) for n in names]
    drawn = _draw(tuple(leaf_key(seed_key, prefix + n) for n in names), np.array([r.a for r in rules], np.float32),
                  np.array([r.b for r in rules], np.float32), specs=tuple((shapes[n], r.kind) for n, r in zip(names, rules)),
                  dtype=dtype) if names else ()  # fmt: skip
    return {**dict.fromkeys(shapes), **dict(zip(names, drawn, strict=True))}


@functools.partial(jax.jit, static_argnames=("rows", "row", "kind", "dtype", "layouts", "scale_dtype"),
                   donate_argnums=(0,))  # fmt: skip
def _fill_rows(buffers, key, a, b, r0, *, rows, row, kind, dtype, layouts, scale_dtype):
    """Rows r0 .. r0 + `rows` of a table whose rows have shape `row`: drawn with key `fold_in(key, r0)`, cast to
    `dtype` and written into `buffers` (donated, so updated in place): (the dense table or None, then per layout
    of `layouts` its (values, scales)), each block quantized by `model.quant.quantize` (block[0] == 1: one scale
    row per table row, so a block of rows is quantized exactly as the whole table would be)."""
    dense, *quantized = buffers
    x = _sample(jax.random.fold_in(key, r0), (rows, *row), kind, a, b).astype(dtype)
    at = (r0,) + (0,) * len(row)
    if dense is not None:
        dense = jax.lax.dynamic_update_slice(dense, x, at)
    out = []
    for (values, scales), layout in zip(quantized, layouts, strict=True):
        q = quantize(x, layout.bits, layout.block, scale_dtype=scale_dtype, words=layout.words)
        out.append((jax.lax.dynamic_update_slice(values, q.values, at),
                    jax.lax.dynamic_update_slice(scales, q.scales, at)))  # fmt: skip
    return (dense, *out)


def _block_rows(shape: tuple[int, ...]) -> int:
    """Rows of a 2-D table of `shape` drawn at a time: as many as `DRAW_BLOCK` scalars hold, at least 1, at most
    all."""
    return min(shape[0], max(1, DRAW_BLOCK // math.prod(shape[1:])))


def _table(key, rule, shape: tuple[int, ...], dtype, layouts: tuple[QuantLayout, ...], scale_dtype, *,
           keep_dense: bool) -> tuple[jax.Array | None, list[QuantArray]]:  # fmt: skip
    """A 2-D global table drawn by blocks of `_block_rows` rows into preallocated device buffers: (the dense table
    in `dtype` when `keep_dense`, else None; one `QuantArray` per layout of `layouts`). The last block ends at the
    table's last row (it may overlap the block before, whose rows it redraws), so every block has one shape and
    one program. The blocks, and so the values, do not depend on `layouts`."""
    rows = _block_rows(shape)
    buffers = (jnp.zeros(shape, dtype) if keep_dense else None,
               *((jnp.zeros(value_shape(shape, lay.bits, lay.words), value_dtype(lay.bits, lay.words)),
                  jnp.zeros(scale_shape(shape, lay.block), scale_dtype)) for lay in layouts))  # fmt: skip
    a, b = np.float32(rule.a), np.float32(rule.b)
    for start in range(0, shape[0], rows):
        r0 = np.int32(min(start, shape[0] - rows))
        buffers = _fill_rows(buffers, key, a, b, r0, rows=rows, row=shape[1:], kind=rule.kind, dtype=dtype,
                             layouts=layouts, scale_dtype=scale_dtype)  # fmt: skip
    dense, *quantized = buffers
    return dense, [QuantArray(values=v, scales=s, shape=shape, bits=lay.bits, block=lay.block, words=lay.words)
                   for (v, s), lay in zip(quantized, layouts, strict=True)]  # fmt: skip


def _expert_leaf(seed_key, cfg: ModelConfig, key_name: str, name: str, shape: tuple[int, ...], dtype,
                 quant: QuantSpec, scale_dtype, platform: str):  # fmt: skip
    """An expert weight [E, ...] (`model.quantspec.EXPERT_PROJECTIONS`) drawn `_block_rows` experts at a time into
    preallocated buffers (`_table`: each block quantized as it is drawn, every expert its own scales, so blocks
    quantize exactly as the whole would): the dense leaf, or its `QuantArray` where `leaf_layout` quantizes it.
    26B-A4B's gate/up weight is 507M scalars a layer: drawn whole, its float32 work alone was 4 GB."""
    layout = leaf_layout(name, shape, quant, platform)
    layouts = () if layout is None else (layout,)
    dense, quantized = _table(leaf_key(seed_key, key_name), init_rule(cfg, name, shape, 0), shape, dtype, layouts,
                              scale_dtype, keep_dense=layout is None)  # fmt: skip
    return dense if layout is None else quantized[0]


def random_params(cfg: ModelConfig, seed: int, *, dtype, quant: QuantSpec = NO_QUANT, scale_dtype=jnp.bfloat16,
                  prng: str = PRNGS[0], platform: str | None = None) -> tuple[Params, int]:  # fmt: skip
    """Random `Params` of `cfg` made on jax's default device: every leaf drawn as the module docstring says, in
    `dtype` (the weight dtype, a jnp/numpy dtype), quantized as `quant` says with scales of `scale_dtype`
    (`model.quantspec.leaf_layout`: the same layouts, leaf dtypes and pytree as `model.checkpoint.load_params`
    of a checkpoint of `cfg` with that quant, each table stored as `leaf_layout` says for `platform`: None, jax's
    default backend, where the arrays are placed). `seed`: 0 <= seed < 2^32; `prng`: jax's generator (`PRNGS`).
    Returns (params, leaves drawn).
    Draws leaf after leaf, dropping each dense leaf once it is quantized: the device holds the result plus
    `working_bytes` at most."""
    seed_key = jax.random.key(seed, impl=prng)
    platform = platform or jax.default_backend()  # where the draws are placed: `leaf_layout` stores for it
    shapes = global_shapes(cfg)
    glob = _draw_leaves(seed_key, cfg, {n: s if s is not None and len(s) == 1 else None for n, s in shapes.items()},
                        "", 0, dtype)  # the 1-D leaves (norms), in one program  # fmt: skip
    drawn = sum(x is not None for x in glob.values())
    head = None
    for name, shape in shapes.items():
        if shape is None or len(shape) == 1:
            continue
        rule, key = init_rule(cfg, name, shape, 0), leaf_key(seed_key, name)
        drawn += 1
        layout = leaf_layout(name, shape, quant, platform)  # stored as the checkpoint path stores it on this device
        head_layout = leaf_layout(LM_HEAD, shape, quant, platform) if name == "embed_VD" else None
        layouts = tuple(lay for lay in (layout, head_layout) if lay is not None)
        if any(lay.block[0] != 1 for lay in layouts):  # no layout does this today: quantize the table whole
            dense, _ = _table(key, rule, shape, dtype, (), scale_dtype, keep_dense=True)
            glob[name] = dense if layout is None else quantize(dense, layout.bits, layout.block, scale_dtype=scale_dtype,
                                                               words=layout.words)  # fmt: skip
            if head_layout is not None:
                head = quantize(dense, head_layout.bits, head_layout.block, scale_dtype=scale_dtype,
                                words=head_layout.words)  # fmt: skip
            continue
        dense, quantized = _table(key, rule, shape, dtype, layouts, scale_dtype, keep_dense=layout is None)
        glob[name] = dense if layout is None else quantized[0]
        head = quantized[-1] if head_layout is not None else head
    layers = []
    for i in range(cfg.num_layers):
        shapes = compute_layer_shapes(cfg, i)
        plain = {n: None if n in EXPERT_PROJECTIONS else s for n, s in shapes.items()}
        leaves = _draw_leaves(seed_key, cfg, plain, f"layers.{i}.", cfg.layer_head_dim(i), dtype)
        for name in EXPERT_PROJECTIONS:  # [E, ...]: drawn and quantized a few experts at a time, like a table
            if shapes[name] is not None:
                leaves[name] = _expert_leaf(seed_key, cfg, f"layers.{i}.{name}", name, shapes[name], dtype, quant,
                                            scale_dtype, platform)  # fmt: skip
        drawn += sum(x is not None for x in leaves.values())
        layers.append(quantize_fields(LayerParams(**leaves), quant, scale_dtype=scale_dtype, platform=platform))
        del leaves  # the dense leaves of a quantized layer go now, before the next layer is drawn
    return Params(**glob, layers=tuple(layers), lm_head_VD=head), drawn


def load_random(ckpt: str | os.PathLike, cfg: ModelConfig | None = None, *, dtype=np.float32, device_put=None,
                quant: QuantSpec = NO_QUANT, scale_dtype=None) -> tuple[Params, dict]:  # fmt: skip
    """`model.checkpoint.load_params` for a dummy-weights folder (`ensure_random`): the same arguments and
    result, the weights made on the device (`random_params`) after `check_fits`. `device_put` is accepted for the
    same call and unused (the draws run on jax's default device). The report: path, prefixes [], tensors (leaves
    drawn), ignored [], stored_dtypes [] (nothing is stored), content_hash (`dummy_content_hash`) and `dummy`:
    {kind "random", preset, seed, weight_dtype, prng (`prng_impl`), source (the `random:` text), note
    `DUMMY_NOTE`, draw_s (seconds drawing, device-synced), and for a preset with experts expert_routing
    (`expert_routing`: "router" or "balanced"; `model.engine.load_engine` runs the engine with that routing)}.
    Raises CheckpointError for a folder without a valid marker, EngineError for a bad `PRNG_ENV` or `ROUTING_ENV`
    value or when the weights do not fit (`check_fits`), before anything is drawn."""
    from model.config import load_config

    path = Path(ckpt)
    spec = read_marker(path)
    if spec is None:
        raise CheckpointError(f"{path}: no {MARKER}; not a dummy-weights folder (make one with --checkpoint random:PRESET)")
    cfg = cfg or load_config(path)
    scale = jnp.bfloat16 if scale_dtype is None else scale_dtype
    dtype_name = np.dtype(dtype).name
    prng = prng_impl()
    routing = expert_routing()  # EngineError for a bad value, before anything is drawn
    check_fits(cfg, spec.text, itemsize=np.dtype(dtype).itemsize, scale_itemsize=np.dtype(scale).itemsize, quant=quant)
    t0 = time.perf_counter()
    params, drawn = random_params(cfg, spec.seed, dtype=dtype, quant=quant, scale_dtype=scale, prng=prng)
    jax.block_until_ready(params)
    dummy = {"kind": "random", "preset": spec.preset, "seed": spec.seed, "weight_dtype": dtype_name, "prng": prng,
             "source": spec.text, "note": DUMMY_NOTE, "draw_s": round(time.perf_counter() - t0, 3)}  # fmt: skip
    if cfg.has_experts:
        dummy["expert_routing"] = routing
    report = {"path": str(path), "prefixes": [], "tensors": drawn, "ignored": [], "stored_dtypes": [],
              "content_hash": dummy_content_hash(path, spec, dtype_name, prng), "dummy": dummy}  # fmt: skip
    return params, report
