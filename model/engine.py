"""The generation engine: jitted prefill and decode programs per compiled shape, buckets, the token loop.

Compiled shape = (bucket, max_new_tokens, decode loop, block): a prompt of n tokens is right-padded to the smallest
bucket of the ladder that holds it, and its KV cache holds bucket + max_new_tokens positions. The bucket fixes shapes
only: prefill runs ceil(n / C) chunks of C positions (`model.forward.prefill`, C = `model.flops.prefill_chunk`), so
its cost follows the real prompt, not the bucket; the padding past the last real chunk is never computed. The
decode loop is "host" (one jitted step per token, each token synced to the host: per-step times) or "device"
(`DECODE_LOOPS`: the first token from prefill on the host, then the other max_new_tokens - 1 in jitted loops of
`block` steps each, one host sync per block; no block: one loop of them all).

Batches: `Engine.generate_batch` decodes B prompts of their own lengths together: rows right-padded to the bucket
of the longest, one length per row (`KVCache.length` [B]), each row at its own positions and slots
(`model.forward`), greedy or sampled (row b's key of a position is the one `generate` uses for it). Its KV cache
bytes are checked against the device's (or host's) memory before anything is allocated (`check_batch`).
`generate` keeps its single-sequence programs (one scalar length) and their tokens. Decode slots
(`Engine.slot_decoder`, `model.slots`): sequences join and leave a fixed batch of rows between decode steps, one
jitted step of the occupied rows (continuous batching).

Recompilation triggers (everything else is an array argument and never recompiles):
1. a new bucket (the prefill program's input shape);
2. a new bucket + max_new_tokens (the cache length: prefill's output and decode's input shapes);
3. greedy vs sampling (sampling sorts the vocabulary; greedy programs do not);
4. another ModelConfig, or parameters / KV cache of other dtypes (a new dtype policy);
5. another batch size B, and batch vs single sequence: `generate` compiles B = 1 with one scalar length;
   `generate_batch` compiles per B with a length per row (even at B = 1, another program than `generate`'s), its
   bucket that of the longest row;
6. the device decode loop: its program per (cache length, steps per call), steps = min(block, max_new_tokens - 1)
   (no block: max_new_tokens - 1). A last block shorter than `block` runs the same program with a smaller trip
   count (a traced value), so a block size that does not divide max_new_tokens - 1 adds no program.
7. `Engine.next_token_logits` (the prefill's logits, for accuracy records): its own program per (bucket, cache
   length), compiled on its first call at that shape, outside any timed request; `Engine.step_summary` (the
   per-step top-2 of a generated sequence, teacher-forced) likewise, per (prompt + generated - 1, prompt) length.
8. decode slots (`Engine.slot_decoder(max_batch, cache_len)`, `model.slots`, what `bench serve --max-batch N > 1`
   runs): the step per (max_batch, cache_len, rows it decodes: each of `model.slots.row_counts(max_batch)` and
   max_batch) and greedy-only vs any sampled row; each prefill per (bucket,
   cache_len) and greedy vs sampling (the single-sequence prefill program at the slots' cache_len, another shape
   than `generate`'s bucket + max_new_tokens); the insert of a prefilled row per (max_batch, cache_len). Which
   slot, the prompt's length within its bucket, max_new_tokens and the slots' occupancy compile nothing
   (`SlotDecoder.warmup` compiles a bucket's programs and every step).
9. another backend (`model.backends`: "jax" or "cpu-kernels"; every program takes it as a static argument) or XLA
   options of the decode programs: an engine's programs of its own.
Prompt length, position, temperature, top-k, top-p, seed and a block's trip count are traced values: changing them compiles nothing.
`CompileCounter` counts every trace/compile (jax.monitoring), so a timed region can prove it compiled nothing.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from model.accounting import (BatchMemory, decode_weight_bytes, kv_cache_bytes, kv_read_bytes,
                              routed_decode_weight_bytes)
from model.backends import BackendPlan, batch_copy, plan_backend
from model.cache import init_cache
from model.config import ModelConfig
from model.errors import EngineError
from model.limits import DEFAULT_BUCKETS, PromptLimits, bucket_ladder, prompt_limits  # noqa: F401 -- re-exported
from model.memory import memory_capacity
from model.moe import distinct_experts, recording_routes
from model.forward import decode_step, forward_full, prefill
from model.packed import PackedParams, as_params, pack_params
from model.params import Params, output_major_bytes, output_major_params, param_bytes
from model.policy import DTYPES, DevicePolicy
from model.programs import CompileCounter, program
from model.quantspec import NO_QUANT, QuantSpec
from model.sampling import GREEDY, Sampling, choose
from model.switches import TEST_DELAY_ENV, injected_decode_delay_s

# The bucket ladder and the prompt-length checks are model/limits.py's (no jax: a command line checks its sizes
# against them before the weights load); re-exported here, where they always were. So are `Sampling` and `GREEDY`
# (model/sampling.py), `CompileCounter` (model/programs.py) and `memory_capacity` (model/memory.py), which the
# engine uses: their homes are the modules the decode slots and the dummy weights share without importing this one.


def enable_compile_cache(path: Path | None) -> Path | None:
    """Turn XLA's persistent compilation cache on in `path`, caching even the smallest and fastest programs
    (minimum compile time 0, minimum entry size 0), as docs/method.md, "Compilation" requires; None turns it off for this process.

    The setting is process-wide, and jax opens its cache once, at the first compile after it is set: a later call
    with another folder, or with None, would otherwise leave the first folder in use (a second command run in the
    same process, e.g. `--compile-cache off` after a command that cached). So the cache is reset whenever the
    setting changes, and the next compile opens the folder now named (or none)."""
    from jax.experimental.compilation_cache import compilation_cache

    CompileCounter.install()
    was = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
    if path is None:
        if was[0] and was[1] is not None:
            jax.config.update("jax_enable_compilation_cache", False)
            compilation_cache.reset_cache()
        return None
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if was != (True, str(path)):
        compilation_cache.reset_cache()
    return path


@program(static_argnames=("cfg", "cache_len", "kv_dtype", "act_dtype", "greedy", "layout"))
def _prefill_program(params, ids_BT, length, args, *, cfg, cache_len, kv_dtype, act_dtype, greedy, layout=None):
    """The chunked prefill of padded ids [B, bucket] with `length` real tokens into a fresh cache of
    `cache_len` slots, then the first token [B] (int32); one program per (bucket, cache_len). `layout` (every
    program's): the engine's `model.sharding.MeshLayout`, whose cache sharding the returned cache keeps; None:
    one device."""
    cache = init_cache(cfg, cache_len, DTYPES[kv_dtype], batch=ids_BT.shape[0], layout=layout)
    logits_BV, cache = prefill(as_params(params), cfg, ids_BT, length, cache, dtype=DTYPES[act_dtype])
    return choose(logits_BV, length - 1, args, greedy), _constrained(cache, layout)


def _constrained(cache, layout):
    """`cache` constrained to the mesh's cache sharding (`model.sharding.MeshLayout.constrain_cache`); itself
    without a mesh."""
    return cache if layout is None else layout.constrain_cache(cache)


@program(static_argnames=("cfg", "cache_len", "kv_dtype", "act_dtype", "layout"))
def _prefill_logits_program(params, ids_BT, length, *, cfg, cache_len, kv_dtype, act_dtype, layout=None):
    """`_prefill_program`'s prefill at the same shape, returning its float32 logits [B, V] at the last real
    position instead of the token chosen from them (the cache is dropped)."""
    cache = init_cache(cfg, cache_len, DTYPES[kv_dtype], batch=ids_BT.shape[0], layout=layout)
    logits_BV, _ = prefill(as_params(params), cfg, ids_BT, length, cache, dtype=DTYPES[act_dtype])
    return logits_BV


@program(static_argnames=("cfg", "start", "act_dtype", "layout"))
def _step_summary_program(params, ids_BT, chosen_S, *, cfg, start, act_dtype, layout=None):
    """Per decision t of `chosen_S` (S tokens a run generated after a prompt of `start` + 1 tokens; `ids_BT` [1, T]
    the prompt and chosen_S[:-1]): the logits z_t at position start + t of one causal pass (`forward_full`,
    teacher forcing), reduced to (ids [S, 2] int32: chosen_S[t], the best other token; values [S, 2] float32:
    their logits)."""
    del layout  # one device: forward_full places nothing
    s = chosen_S.shape[0]
    z_SV = forward_full(as_params(params), cfg, ids_BT, dtype=DTYPES[act_dtype], positions=(start, s))[0]
    chosen_v = jnp.take_along_axis(z_SV, chosen_S[:, None], axis=1)[:, 0]
    others = jnp.where(jnp.arange(z_SV.shape[1])[None, :] == chosen_S[:, None], -jnp.inf, z_SV)
    runner = jnp.argmax(others, axis=1).astype(jnp.int32)
    runner_v = jnp.take_along_axis(z_SV, runner[:, None], axis=1)[:, 0]
    return jnp.stack([chosen_S, runner], axis=1), jnp.stack([chosen_v, runner_v], axis=1)


@program(static_argnames=("cfg", "act_dtype", "greedy", "layout"), donate_argnames=("cache",))
def _decode_program(params, cache, token_B, args, *, cfg, act_dtype, greedy, layout=None):
    """One decode step: (next token [B] int32, cache); for a model with experts, ((next token [B], distinct
    experts per layer int32 [L]: `model.moe.distinct_experts` of the step's routing, the union over its rows),
    cache). A model without experts compiles the program it always did."""
    with jax.named_scope("decode_step"):
        position = cache.length
        with _routes(cfg) as ids:
            logits_BV, cache = decode_step(as_params(params), cfg, token_B, cache, dtype=DTYPES[act_dtype])
        token_B = choose(logits_BV, position, args, greedy)
        out = (token_B, distinct_experts(ids, cfg.num_experts)) if cfg.has_experts else token_B
        return out, _constrained(cache, layout)


def _routes(cfg: ModelConfig):
    """`model.moe.recording_routes` for a model with experts (the step's router choices, per layer), else a
    context that records nothing."""
    return recording_routes() if cfg.has_experts else contextlib.nullcontext([])


DECODE_LOOPS = ("host", "device")
"""Where the decode loop runs: "host" (a jitted step per token, each synced to the host) or "device" (a jitted
fori_loop of steps, synced once per block)."""


@program(static_argnames=("cfg", "act_dtype", "greedy", "steps", "layout"), donate_argnames=("cache",))
def _decode_loop_program(params, cache, token_B, args, trips, *, cfg, act_dtype, greedy, steps, layout=None):
    """`trips` (int32 scalar, 1 <= trips <= steps) decode steps in one device loop, each step exactly
    `_decode_program`'s (decode_step, then `model.sampling.choose` with the key of the position decoded). Returns
    (ids [steps, B] int32: row i the token of step i, rows >= trips unused (zeros); the last token [B] int32; the
    cache); for a model with experts a fourth output, distinct experts per layer of each step (int32 [steps, L],
    `_decode_program`'s, rows >= trips zeros)."""

    params = as_params(params)

    def body(i, carry):
        token_B, cache, ids_SB, experts_SL = carry
        with jax.named_scope("decode_step"):
            position = cache.length
            with _routes(cfg) as ids:
                logits_BV, cache = decode_step(params, cfg, token_B, cache, dtype=DTYPES[act_dtype])
            token_B = choose(logits_BV, position, args, greedy)
        if cfg.has_experts:
            experts_SL = jax.lax.dynamic_update_index_in_dim(experts_SL, distinct_experts(ids, cfg.num_experts), i, 0)
        return token_B, cache, jax.lax.dynamic_update_index_in_dim(ids_SB, token_B, i, axis=0), experts_SL

    ids_SB = jnp.zeros((steps, token_B.shape[0]), jnp.int32)
    experts_SL = jnp.zeros((steps, cfg.num_layers), jnp.int32) if cfg.has_experts else None
    token_B, cache, ids_SB, experts_SL = jax.lax.fori_loop(0, trips, body, (token_B, cache, ids_SB, experts_SL))
    if cfg.has_experts:
        return ids_SB, token_B, _constrained(cache, layout), experts_SL
    return ids_SB, token_B, _constrained(cache, layout)


# ---- the engine ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """One generated sequence, what the engine ran for it, and its host-side timings.

    `bucket`: the padded prefill length this request ran at (its compiled shape is (bucket, max_new_tokens,
    decode_loop, block)); `compile_traces`: jit traces (`CompileCounter.traces`) during this request, prefill and
    decode: 0 proves it compiled nothing. Times are time.perf_counter_ns, read after a token id arrived on the
    host: `t_prefill_start_ns` (before the ids are copied to the device), `t_token_ns[j]` the arrival of token
    `arrived[j]`. The host loop (`decode_loop` "host") syncs every token: `arrived` is 0, 1, ..., n - 1. The device
    loop ("device", `block` steps per call, None: one call) syncs the first token and the last token of each block
    only: `arrived` is 0, then each block's last index; it has no per-step times (`step_ms` is empty), only
    `decode_ms` and its mean `ms_per_step`.
    `experts_read` (a model with experts; None without): for each decode step (the tokens after the first, in
    order), per layer, how many distinct experts its router chose, as the step's program returned them
    (`_decode_program`: read from the router's output in this run, not assumed; docs/method.md, "Bytes that
    follow the routing").
    """

    prompt_ids: list[int]
    token_ids: list[int]
    bucket: int
    max_new_tokens: int
    t_prefill_start_ns: int
    t_token_ns: list[int]
    compile_traces: int
    decode_loop: str = "host"
    block: int | None = None
    arrived: list[int] | None = None  # None: every token (the host loop)
    experts_read: list[list[int]] | None = None  # per decode step, per layer: distinct experts chosen (with experts)

    @property
    def prefill_ms(self) -> float:
        """Prefill program alone, device-synced: dispatch to the first token id on the host (ms)."""
        return (self.t_token_ns[0] - self.t_prefill_start_ns) / 1e6

    @property
    def decode_ms(self) -> float | None:
        """Decode time (ms): the first token on the host to the last one on the host, either loop; None with one
        token."""
        return (self.t_token_ns[-1] - self.t_token_ns[0]) / 1e6 if len(self.token_ids) > 1 else None

    @property
    def ms_per_step(self) -> float | None:
        """Mean decode step (ms): decode time / (tokens - 1), either loop; None with one token."""
        decode = self.decode_ms
        return None if decode is None else decode / (len(self.token_ids) - 1)

    @property
    def step_ms(self) -> list[float]:
        """Per-step decode times (ms) of the host loop: arrival of token i minus arrival of token i-1, i >= 1.
        Empty for the device loop, which has no per-step times (its blocks: `block_ms`)."""
        if self.decode_loop != "host":
            return []
        return [(b - a) / 1e6 for a, b in zip(self.t_token_ns, self.t_token_ns[1:])]

    @property
    def block_ms(self) -> list[float]:
        """Gaps between host arrivals (ms): per block for the device loop, per step for the host loop."""
        return [(b - a) / 1e6 for a, b in zip(self.t_token_ns, self.t_token_ns[1:])]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchGeneration:
    """B sequences generated together (`Engine.generate_batch`), what the engine ran for them, and their host-side
    timings, which every row shares: the rows run in lockstep, so each step's B tokens arrive on the host at once.

    `prompt_ids[b]` / `token_ids[b]`: row b's prompt and its max_new_tokens generated ids. `bucket`: the padded
    prefill length of the batch (that of the longest row); the compiled shape is (B, bucket, max_new_tokens,
    decode_loop, block). Times and `arrived` as in `Generation`; `compile_traces`: jit traces during the batch.
    `experts_read` as in `Generation`, each count the union over the step's rows.
    `row(b)` is row b as a `Generation` (its tokens with the shared times).
    """

    prompt_ids: list[list[int]]
    token_ids: list[list[int]]
    bucket: int
    max_new_tokens: int
    t_prefill_start_ns: int
    t_token_ns: list[int]
    compile_traces: int
    decode_loop: str = "host"
    block: int | None = None
    arrived: list[int] | None = None
    experts_read: list[list[int]] | None = None  # per decode step, per layer: the union over the rows

    @property
    def batch(self) -> int:
        """B, the rows."""
        return len(self.token_ids)

    def row(self, b: int) -> Generation:
        """Row b as a `Generation`: its prompt and tokens, the batch's bucket, times and compile count."""
        return Generation(prompt_ids=self.prompt_ids[b], token_ids=self.token_ids[b], bucket=self.bucket,
                          max_new_tokens=self.max_new_tokens, t_prefill_start_ns=self.t_prefill_start_ns,
                          t_token_ns=self.t_token_ns, compile_traces=self.compile_traces,
                          decode_loop=self.decode_loop, block=self.block, arrived=self.arrived)  # fmt: skip

    @property
    def prefill_ms(self) -> float:
        """The batch prefill, device-synced: dispatch to the first tokens of all rows on the host (ms)."""
        return self.row(0).prefill_ms

    @property
    def decode_ms(self) -> float | None:
        """Decode time (ms) of the batch, first tokens to last tokens on the host; None with one token."""
        return self.row(0).decode_ms

    @property
    def ms_per_step(self) -> float | None:
        """Mean decode step of the batch (ms): decode time / (max_new_tokens - 1); None with one token."""
        return self.row(0).ms_per_step

    @property
    def step_ms(self) -> list[float]:
        """Per-step times (ms) of the host loop (each step decodes one token of every row); empty for the device
        loop."""
        return self.row(0).step_ms

    @property
    def sequence_tok_s(self) -> float | None:
        """Per-sequence gauge (tok/s): one row's (generated - 1) / decode time (docs/method.md, "Batches")."""
        decode = self.decode_ms
        return None if not decode else (self.max_new_tokens - 1) / (decode / 1e3)

    @property
    def aggregate_tok_s(self) -> float | None:
        """Aggregate throughput (tok/s): all rows' tokens after the first / decode time = B x `sequence_tok_s`."""
        gauge = self.sequence_tok_s
        return None if gauge is None else self.batch * gauge


class Engine:
    """A loaded model on the live device, with its policy, bucket ladder and compiled programs.

    `params` must already be in the policy's weight dtype on the device, and quantized as `quant` says (a
    `model.quantspec.QuantSpec`, scales of `scale_dtype`; `model.quant.quantize_params` or a quantizing
    `model.checkpoint.load_params`). `kernel`: the `model.kernels.choice.KernelPlan` the w4 projections' tilings
    come from (None without w4 weights), recorded in the manifest. The backend is the policy's
    (`DevicePolicy.backend`, `model.backends`: "jax", the pure-JAX engine, unless the configuration asks for
    another); `backend_plan` is what it runs (`model.backends.plan_backend`, made here from the policy when not
    given: `load_engine` passes the one it planned before loading). From it: `backend` (passed to every program),
    `cpu_kernel` (the backend's kernels in use as space-separated manifest names, e.g. "bf16=cpu attention=cpu";
    None for none: recorded in the manifest as the engine's kernel) and `xla_options` (the XLA options its decode
    programs compile with; None: XLA's defaults; recorded in the manifest). Raises EngineError for a backend that
    cannot run here (`plan_backend`), a prompt that no bucket holds or a max_new_tokens below 1. `layout`: the
    `model.sharding.MeshLayout` `params` are placed over (`model.sharding.place_params`), passed to every program;
    None (default): one device.
    """

    def __init__(self, params: Params, cfg: ModelConfig, policy: DevicePolicy, *, max_length: int | None = None,
                 buckets: Sequence[int] | None = None, tokenizer=None, quant: QuantSpec = NO_QUANT,
                 scale_dtype: str = "bfloat16", kernel=None, backend_plan: BackendPlan | None = None,
                 layout=None):  # fmt: skip
        self.params = params
        self.layout = layout  # model.sharding.MeshLayout of the params (load_engine's mesh); None: one device
        if backend_plan is None:
            backend_plan = plan_backend(policy.backend, policy.platform, weight_dtype=policy.weight_dtype,
                                        activation_dtype=policy.activation_dtype, kv_dtype=policy.kv_dtype)  # fmt: skip
        self.backend_plan = backend_plan
        self.backend = backend_plan.backend
        self.cpu_kernel = backend_plan.kernel
        self.xla_options = backend_plan.xla_options
        self.cfg = cfg
        self.policy = policy
        self.quant = quant
        self.scale_dtype = scale_dtype
        self.kernel = kernel  # model.kernels.choice.KernelPlan of the w4 product; None without w4 weights
        self.tokenizer = tokenizer
        # the prompt lengths it takes, from the config alone (model/limits.py: the checks a command line runs
        # before loading); EngineError for a bucket above max_length or above the model's positions
        self.limits: PromptLimits = prompt_limits(cfg.max_position_embeddings, max_length=max_length, buckets=buckets)
        self.max_length = self.limits.max_length  # the largest prompt a request may have
        self.buckets = self.limits.buckets
        self.explicit_buckets = self.limits.explicit_buckets  # the limit's flag: --buckets if given, else --max-length
        # test only (`model.switches.TEST_DELAY_ENV`, set by `bench ab`'s tests): seconds each host-loop step waits
        self.test_decode_delay_s = injected_decode_delay_s()
        CompileCounter.install()

    def decode_positions(self, n_tokens: int, max_new_tokens: int) -> int:
        """The cache positions a decode step's attention reads per full-attention layer (a sliding layer: up to its
        window), for a request of `n_tokens` prompt tokens and `max_new_tokens` new ones: the whole buffer, bucket
        + max_new_tokens, for XLA's products; n_tokens + max_new_tokens // 2 where only the visible positions are
        read (`reads_visible_kv`): the mean of the n + 1 .. n + max_new_tokens - 1 positions its steps see, rounded
        down. Raises EngineError as `bucket_for`."""
        if self.reads_visible_kv:
            return n_tokens + max_new_tokens // 2
        return self.bucket_for(n_tokens) + max_new_tokens

    @property
    def reads_visible_kv(self) -> bool:
        """Whether decode attention reads only the visible positions of the KV cache: the "cpu-kernels" backend's
        attention kernel (`backend_plan.reads_visible_kv`) rather than XLA's products over the whole buffer."""
        return self.backend_plan.reads_visible_kv

    @property
    def weight_bytes(self) -> int:
        """The weight-bytes gauge: bytes of the parameters as placed on the device, dense leaves at their dtype and
        quantized leaves at their packed values plus scales (`model.quant.tree_bytes`; int4 counts two values per
        byte, not `nbytes`). Equals `model.accounting.weight_bytes` of the config, policy and quantization."""
        return param_bytes(self.params)

    @functools.cached_property
    def call_params(self) -> PackedParams:
        """`params` as the engine's programs receive them (`model.packed.pack_params`: the one-dimensional leaves
        in one vector per dtype: 214 buffers instead of 475 on the 35-layer presets), made on first use."""
        return pack_params(self.params)

    @functools.cached_property
    def batch_params(self) -> Params:
        """The parameters decode steps of more than one row read (`generate_batch`, `step_fn_batch`, decode slots):
        on CPU `params` with its dense input-major projections held transposed as well
        (`model.params.output_major_params`: made on first use, `batch_copy_bytes` more memory; the products and
        the bytes a step reads are the same, read weight-left), elsewhere `params` itself."""
        return output_major_params(self.params) if self._batch_copy else self.params

    @property
    def _batch_copy(self) -> bool:
        return batch_copy(jax.default_backend())

    @property
    def batch_copy_bytes(self) -> int:
        """Bytes `batch_params` holds beside `params` (0 off CPU; `model.params.output_major_bytes`)."""
        return output_major_bytes(self.params) if self._batch_copy else 0

    @functools.cached_property
    def _batch_call_params(self) -> PackedParams:
        """`batch_params` packed (`call_params` itself where the two trees are one)."""
        return self.call_params if self.batch_params is self.params else pack_params(self.batch_params)

    def decode_params(self, rows: int) -> PackedParams:
        """The parameters a decode step of `rows` rows reads, packed as programs receive them
        (`model.packed`): `batch_params` for more than one row, else `params`."""
        return self._batch_call_params if rows > 1 else self.call_params

    def decode_bytes(self, n_tokens: int, max_new_tokens: int, batch: int = 1, *,
                     experts: float | None = None) -> dict[str, int]:  # fmt: skip
        """Bytes one decode step reads at the compiled shape of `n_tokens` (roofline numerator, docs/method.md, "Rooflines"):
        `weights` (every weight the step touches at its stored size: one row of each embedding table, the whole
        tied table for the logits; quantized leaves at their packed size plus scales: one PLE row, the int8 head
        whole) and `kv_cache` (K and V read by the attention of every layer: the whole buffer of bucket +
        max_new_tokens positions of its KV source, masked slots included; with the CPU attention kernel
        the positions a step sees: `decode_positions`), and their `total`; both from
        `model.accounting` (`decode_weight_bytes`, `kv_read_bytes`). A step of `batch` rows reads the weights
        once and every row's cache (docs/method.md, "Batches"), the gathered rows (one embedding and one PLE row
        per row) counted once, as their bytes are negligible (D + X values a row). A model with experts: the
        router's top_k experts per layer (the estimate), or `experts` per layer as a measured run read them
        (`model.accounting.routed_decode_weight_bytes`; docs/method.md, "Bytes that follow the routing")."""
        itemsize, scale_itemsize = (np.dtype(DTYPES[d]).itemsize for d in (self.policy.weight_dtype, self.scale_dtype))
        if experts is None:
            weights = decode_weight_bytes(self.cfg, itemsize, scale_itemsize=scale_itemsize, quant=self.quant)
        else:
            weights = routed_decode_weight_bytes(self.cfg, itemsize, experts=experts, scale_itemsize=scale_itemsize,
                                                 quant=self.quant)  # fmt: skip
        positions = self.decode_positions(n_tokens, max_new_tokens)
        kv = batch * kv_read_bytes(self.cfg, positions, np.dtype(DTYPES[self.policy.kv_dtype]).itemsize)
        return {"weights": weights, "kv_cache": kv, "total": weights + kv}

    def check_batch(self, batch: int, n_tokens: int, max_new_tokens: int) -> BatchMemory:
        """The memory arithmetic of a batch of `batch` prompts of at most `n_tokens` tokens (`BatchMemory`: the
        KV cache of (batch, bucket + max_new_tokens) at the policy's KV dtype beside the weights, against the
        device's memory, else the host's: `memory_capacity`; on a mesh, each device's share against one device's
        memory: `_mesh_batch_memory`). Computed before anything is allocated. Raises
        EngineError for a batch below 1 (or not a whole number), as `check_request`, and with the arithmetic
        (needed, usable, the largest batch that fits) when the batch does not fit."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise EngineError(f"batch {batch!r}: expected a whole number of rows >= 1")
        bucket = self.check_request(n_tokens, max_new_tokens)
        mem = self._batch_memory(batch, bucket + max_new_tokens, spare_rows=0)
        if not mem.fits:
            raise EngineError(mem.refusal())
        return mem

    def check_slots(self, max_batch: int, cache_len: int) -> BatchMemory:
        """The memory arithmetic of a slot decoder (`slot_decoder`): `max_batch` rows of `cache_len` positions,
        plus the one-row cache each prefill fills before it is copied into its slot (`spare_rows` 1), beside the
        weights, against the device's memory, else the host's (`memory_capacity`). Computed before anything is
        allocated. Raises EngineError for max_batch < 1 (or not a whole number), a cache_len below 2 or above the
        model's max_position_embeddings, and with the arithmetic (`BatchMemory.slots_refusal`: needed, usable,
        the most slots that fit) when the slots do not fit."""
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise EngineError(f"--max-batch {max_batch!r}: expected a whole number of decode slots >= 1")
        positions = self.cfg.max_position_embeddings
        if isinstance(cache_len, bool) or not isinstance(cache_len, int) or not 2 <= cache_len <= positions:
            raise EngineError(f"slot cache of {cache_len!r} positions (--max-length): expected 2..{positions} (a "
                              "prompt token and a new one, up to the model's max_position_embeddings)")  # fmt: skip
        mem = self._batch_memory(max_batch, cache_len, spare_rows=1)
        if not mem.fits:
            raise EngineError(mem.slots_refusal())
        return mem

    def _batch_memory(self, batch: int, cache_len: int, *, spare_rows: int) -> BatchMemory:
        """`BatchMemory` of `batch` rows (+ `spare_rows`) of `cache_len` positions at the policy's KV dtype; its
        weights include `batch_copy_bytes` when batch > 1 (the transposed copy batched steps read on CPU). On a
        mesh, per device (`_mesh_batch_memory`)."""
        if self.layout is not None:
            return self._mesh_batch_memory(batch, cache_len, spare_rows=spare_rows)
        copy = self.batch_copy_bytes if batch > 1 else 0  # batched steps on CPU read a transposed copy
        weights = self.weight_bytes + copy
        made = copy if "batch_params" in self.__dict__ else 0  # already in memory, as the weights are
        capacity, where = memory_capacity(self.weight_bytes + made)
        return BatchMemory(batch=batch, cache_len=cache_len, weight_bytes=weights,
                           kv_bytes_per_row=kv_cache_bytes(self.cfg, cache_len,
                                                           np.dtype(DTYPES[self.policy.kv_dtype]).itemsize),
                           capacity=capacity, where=where, spare_rows=spare_rows, copy_bytes=copy)  # fmt: skip

    def _mesh_batch_memory(self, batch: int, cache_len: int, *, spare_rows: int) -> BatchMemory:
        """`BatchMemory` per device of the mesh (docs/method.md, "Several devices"): the largest device's weights
        as placed (`model.sharding.device_held_bytes`) and its share of each row's cache
        (`model.sharding.device_kv_bytes_per_row`: its KV heads), against one device's memory
        (`memory_capacity` of this process's first device of the mesh); where that is the host's, this process's
        devices of the mesh share it (`sharing`: all of them in one process; under jax.distributed each process
        checks its own devices against its own host). The transposed copy batched steps read on CPU is of the
        split projections: counted as its share per device, ceil(copy / devices of the mesh)."""
        from model.sharding import device_held_bytes, device_kv_bytes_per_row

        every = list(self.layout.mesh.devices.flat)
        devices = [d for d in every if d.process_index == jax.process_index()]
        held = [device_held_bytes(self.params, d) for d in devices]
        copy = -(-self.batch_copy_bytes // len(every)) if batch > 1 else 0
        made = copy if "batch_params" in self.__dict__ else 0
        capacity, where = memory_capacity(sum(held) + made * len(devices), devices[0])
        row = device_kv_bytes_per_row(self.cfg, self.layout.tp, cache_len,
                                      np.dtype(DTYPES[self.policy.kv_dtype]).itemsize)  # fmt: skip
        return BatchMemory(batch=batch, cache_len=cache_len, weight_bytes=max(held) + copy, kv_bytes_per_row=row,
                           capacity=capacity, where=where, spare_rows=spare_rows, copy_bytes=copy,
                           mesh=self.layout.spec.text, sharing=len(devices) if "host" in where else 1)  # fmt: skip

    def slot_decoder(self, max_batch: int, cache_len: int | None = None):
        """A `model.slots.SlotDecoder` over this engine: `max_batch` decode slots sharing one batched KV cache of
        `cache_len` positions per slot (default `max_length`), for continuous batching (`bench serve`). Its memory
        is checked first (`check_slots`); raises EngineError as that."""
        from model.slots import SlotDecoder

        return SlotDecoder(self, max_batch, self.max_length if cache_len is None else cache_len)

    def bucket_for(self, n_tokens: int) -> int:
        """The smallest bucket >= n_tokens (`model.limits.PromptLimits.bucket_for`). Raises EngineError naming the
        limit and a fix that can work: the flag that raises it, up to the model's positions
        (max_position_embeddings), or, for a prompt above those, that no flag can hold it."""
        return self.limits.bucket_for(n_tokens)

    def check_request(self, n_tokens: int, max_new_tokens: int) -> int:
        """The bucket of a request of `n_tokens` prompt tokens and `max_new_tokens` new ones
        (`model.limits.PromptLimits.check_request`). Raises EngineError (naming the limit and the flag that changes
        it) when no bucket holds the prompt, max_new_tokens < 1, or prompt + new tokens exceed the model's
        max_position_embeddings."""
        return self.limits.check_request(n_tokens, max_new_tokens)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: Sampling = GREEDY, *,
                 stop_at_eos: bool = False, on_token: Callable[[int], bool | None] | None = None,
                 decode_loop: str = "host", block: int | None = None) -> Generation:  # fmt: skip
        """Generate up to `max_new_tokens` ids after `prompt_ids` (exactly that many unless `stop_at_eos`, or
        `on_token` returns True to stop early, e.g. a client disconnected or a stop string matched). The result
        carries the bucket it ran and the compile traces of this request (`Generation`).

        `decode_loop` (`DECODE_LOOPS`): "host" syncs every token (per-step times); "device" runs the tokens after
        the first in device loops of `block` steps (None: all in one), the same tokens for the same sampling.
        The host loop keeps `HOST_LOOP_AHEAD` (2) steps dispatched past the token it reads (step n + 1's input is
        step n's token, still on the device), each token's copy to the host begun when its step is dispatched, so
        the device never waits for Python between steps; each token's time is still read when that token has
        arrived on the host. One step ahead against none, paired on the default preset (float32, 2-core EPYC, 63
        steps, 8 pairs): 21.49 -> 20.08 ms per step at 41 input tokens, 28.11 -> 26.76 at 521. Two ahead with the
        copies begun at dispatch against one ahead, paired in one process (bfloat16 weights, 62 steps, 8 pairs):
        on the lent TPU v5e 1.154 -> 0.785 ms per step at 41 tokens (0.685x) and 1.023 -> 0.706 at 521 (0.693x); on
        the 2-core Xeon 15.80 -> 15.36 ms at 41 (0.991x, within the host's noise). A request that stops early
        (EOS, `on_token`) has computed up to `HOST_LOOP_AHEAD` steps more than it returns.
        Raises EngineError for another loop, a block < 1 or a block with the host loop, and for the device loop
        with `stop_at_eos` or `on_token` (both decide after every token on the host: they need the host loop)."""
        _check_loop(decode_loop, block, stop_at_eos=stop_at_eos, on_token=on_token is not None)
        ids, bucket = self._padded(prompt_ids, max_new_tokens)
        args = sampling.args()
        eos = set(self.cfg.eos_token_ids)
        traces0 = CompileCounter.traces
        t0 = time.perf_counter_ns()  # from here: the ids' copy to the device, prefill, first token on the host
        token_B, cache = self.prefill_row(ids, len(prompt_ids), bucket + max_new_tokens, args, sampling.greedy)
        tokens = [int(np.asarray(token_B)[0])]  # token_B[0] would run a device gather before the copy
        times = [time.perf_counter_ns()]
        arrived, experts = None, []
        if decode_loop == "device":
            arrived = self._decode_on_device(token_B, cache, args, sampling.greedy, max_new_tokens, block, tokens, times,
                                             experts=experts)  # fmt: skip

        def stops(token: int) -> bool:  # after `token`: the caller's stop, or EOS when asked to stop there
            return bool(on_token and on_token(token)) or (stop_at_eos and token in eos)

        def step(cache, token_B):  # the call `_decode_program` was traced with (positional args: one program)
            out, cache = _decode_program(self.call_params, cache, token_B, args, cfg=self.cfg,
                                         act_dtype=self.policy.activation_dtype, greedy=sampling.greedy,
                                         xla_options=self.xla_options, backend=self.backend, layout=self.layout)  # fmt: skip
            return _routed(out, experts), cache

        steps = 0 if stops(tokens[0]) else max_new_tokens - len(tokens)  # the device loop leaves none
        if self.test_decode_delay_s:  # test only: every step's token passes a wait on the device's stream
            step = _delayed_step(step, self.test_decode_delay_s)
        for token_B in _dispatched_ahead(step, cache, token_B, steps):
            tokens.append(int(np.asarray(token_B)[0]))  # waits for this step's token only
            times.append(time.perf_counter_ns())
            if stops(tokens[-1]):
                break
        return Generation(prompt_ids=list(prompt_ids), token_ids=tokens, bucket=bucket, max_new_tokens=max_new_tokens,
                          t_prefill_start_ns=t0, t_token_ns=times, compile_traces=CompileCounter.traces - traces0,
                          decode_loop=decode_loop, block=block, arrived=arrived,
                          experts_read=self._experts_read(experts, len(tokens) - 1))  # fmt: skip

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, sampling: Sampling = GREEDY, *,
                       decode_loop: str = "host", block: int | None = None) -> BatchGeneration:  # fmt: skip
        """Generate exactly `max_new_tokens` ids after each of the B = len(prompts) prompts, decoded together (EOS
        ignored: every row does the same number of steps). Rows have their own lengths: each is right-padded to the
        bucket of the longest, prefilled with its own length (`model.forward.prefill` with lengths [B]) and decoded
        at its own positions. Greedy, a row's tokens are those of `generate` of its prompt alone, up to float
        summation order (another bucket, chunk size or batch size can sum in another order): measured equal on
        every row so far (tests/test_batch.py on the tiny preset, dense and quantized, B up to 10; the default
        preset, float32 CPU, 32 new tokens: 16 rows of 41 tokens and rows of 5, 41, 100, 300 tokens, 0 rows
        differ). Sampled, row b at position p draws with the key `generate` uses at p.

        `decode_loop` / `block` as in `generate`. Raises EngineError for no prompts, a prompt `check_request`
        refuses, a batch whose KV cache does not fit in memory (`check_batch`, before anything is allocated), and a
        decode loop `generate` refuses."""
        _check_loop(decode_loop, block, stop_at_eos=False, on_token=False)
        ids, lengths, bucket = self._padded_batch(prompts, max_new_tokens)
        args = sampling.args()
        traces0 = CompileCounter.traces
        t0 = time.perf_counter_ns()  # from here: the ids' copy to the device, prefill, first tokens on the host
        token_B, cache = _prefill_program(
            self.call_params, jnp.asarray(ids), jnp.asarray(lengths, jnp.int32), args, cfg=self.cfg,
            cache_len=bucket + max_new_tokens, kv_dtype=self.policy.kv_dtype, act_dtype=self.policy.activation_dtype,
            greedy=sampling.greedy, xla_options=None, backend=self.backend, layout=self.layout,
        )  # fmt: skip
        rows = [[t] for t in np.asarray(token_B).tolist()]
        times = [time.perf_counter_ns()]
        arrived, experts = None, []
        params = self.decode_params(len(prompts))
        if decode_loop == "device":
            arrived = self._decode_on_device(token_B, cache, args, sampling.greedy, max_new_tokens, block, rows, times,
                                             params=params, experts=experts)  # fmt: skip
        def step(cache, token_B):
            out, cache = _decode_program(params, cache, token_B, args, cfg=self.cfg,
                                         act_dtype=self.policy.activation_dtype, greedy=sampling.greedy,
                                         xla_options=self.xla_options, backend=self.backend, layout=self.layout)  # fmt: skip
            return _routed(out, experts), cache

        for token_B in _dispatched_ahead(step, cache, token_B, max_new_tokens - len(rows[0])):
            for row, t in zip(rows, np.asarray(token_B).tolist(), strict=True):
                row.append(t)
            times.append(time.perf_counter_ns())
        return BatchGeneration(prompt_ids=[list(p) for p in prompts], token_ids=rows, bucket=bucket,
                               max_new_tokens=max_new_tokens, t_prefill_start_ns=t0, t_token_ns=times,
                               compile_traces=CompileCounter.traces - traces0, decode_loop=decode_loop, block=block,
                               arrived=arrived, experts_read=self._experts_read(experts, len(rows[0]) - 1))  # fmt: skip

    def _experts_read(self, experts: list, steps: int) -> list[list[int]] | None:
        """The distinct-expert counts of a request's first `steps` decode steps as lists (per step, per layer), from
        the arrays its steps returned (`_routed`, `_decode_on_device`: already on their way to the host); None
        for a model without experts. Steps dispatched ahead past a stop are left out."""
        if not self.cfg.has_experts:
            return None
        return [np.asarray(counts_L).tolist() for counts_L in experts[:steps]]

    def _decode_on_device(self, token_B, cache, args, greedy: bool, max_new_tokens: int, block: int | None,
                          tokens: list, times: list[int], *, params: PackedParams | None = None,
                          experts: list | None = None) -> list[int]:  # fmt: skip
        """The device loop after the first token: max_new_tokens - 1 steps in calls of `steps` = min(block, that)
        steps (the last call's trip count the rest), appending each block's ids to `tokens` (a list of ids: row 0's;
        a list of B lists: every row's) and its arrival on the host to `times`; for a model with experts, each
        step's distinct-expert counts [L] to `experts`. Returns the token indices `times` mark (0, then each
        block's last)."""
        left = max_new_tokens - 1
        steps = min(block or left, left)
        arrived = [0]
        while left > 0:
            trips = min(steps, left)
            ids_SB, token_B, cache, *counts = _decode_loop_program(
                self.call_params if params is None else params, cache, token_B, args, jnp.int32(trips), cfg=self.cfg,
                act_dtype=self.policy.activation_dtype, greedy=greedy, steps=steps, xla_options=self.xla_options,
                backend=self.backend, layout=self.layout,
            )  # fmt: skip
            if counts and experts is not None:  # a model with experts: each step's counts [L]
                experts.extend(np.asarray(counts[0])[:trips])
            if tokens and isinstance(tokens[0], list):  # a batch: every row's ids
                for row, ids in zip(tokens, np.asarray(ids_SB)[:trips].T.tolist(), strict=True):
                    row.extend(ids)
                done = len(tokens[0])
            else:
                tokens.extend(int(t) for t in np.asarray(ids_SB)[:trips, 0])  # the copy to the host waits for the block
                done = len(tokens)
            times.append(time.perf_counter_ns())
            arrived.append(done - 1)
            left -= trips
        return arrived

    def next_token_logits(self, prompt_ids: Sequence[int], max_new_tokens: int) -> np.ndarray:
        """The next-token logits of a prompt: float32 numpy [V], the prefill's logits at the last real position,
        computed at the request's compiled shape (bucket, bucket + max_new_tokens) by the same prefill as
        `generate`, so a greedy `generate` of the same prompt starts with their argmax. For accuracy records
        (a quantized run against a dense one); not timed. Its own program per shape (recompilation trigger 7).
        Raises EngineError as `check_request`."""
        ids, bucket = self._padded(prompt_ids, max_new_tokens)
        logits_BV = _prefill_logits_program(
            self.call_params, jnp.asarray(ids), jnp.int32(len(prompt_ids)), cfg=self.cfg, cache_len=bucket + max_new_tokens,
            kv_dtype=self.policy.kv_dtype, act_dtype=self.policy.activation_dtype, xla_options=None,
            backend=self.backend, layout=self.layout,
        )  # fmt: skip
        return np.asarray(logits_BV[0], np.float32)

    def step_summary(self, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per decode step of a greedy run that generated `token_ids` (S >= 1 ids) after `prompt_ids` (n ids):
        (ids int32 [S, 2]: the token it chose and the best other token; values float32 [S, 2]: their logits),
        from the logits of decision t teacher-forced on the prompt and token_ids[:t] (one causal pass,
        `model.forward.forward_full`, in the activation dtype: the reference form, not the cached decode, so equal
        to the decode step's logits up to rounding). For accuracy records (bench/runs/logits.py); not timed. Its
        own program per (n + S - 1, n) (recompilation trigger 7). Raises EngineError for no tokens or more
        positions than the engine's max_length."""
        n, s = len(prompt_ids), len(token_ids)
        if s < 1 or n < 1 or n + s - 1 > self.max_length:
            raise EngineError(f"step_summary: {n} prompt and {s} generated tokens: expected at least one of each and "
                              f"at most {self.max_length} positions (the engine's max_length)")  # fmt: skip
        ids = np.asarray([list(prompt_ids) + list(token_ids[:-1])], np.int32)
        out_ids, out_values = _step_summary_program(
            self.call_params, jnp.asarray(ids), jnp.asarray(np.asarray(token_ids, np.int32)), cfg=self.cfg,
            start=n - 1, act_dtype=self.policy.activation_dtype, xla_options=None, backend=self.backend,
            layout=self.layout,
        )  # fmt: skip
        return np.asarray(out_ids, np.int32), np.asarray(out_values, np.float32)

    def warmup(self, n_tokens: int, max_new_tokens: int, sampling: Sampling = GREEDY, *, decode_loop: str = "host",
               block: int | None = None) -> Generation:  # fmt: skip
        """Compile (or load from the persistent cache) and run the programs of one compiled shape once."""
        return self.generate([self.cfg.bos_token_id] * n_tokens, max_new_tokens, sampling, decode_loop=decode_loop,
                             block=block)  # fmt: skip

    def lower_decode(self, cache, token_B, rows: int = 1):
        """The greedy decode step's program lowered (a `jax.stages.Lowered`) for `cache` and `token_B` (arrays or
        `jax.ShapeDtypeStruct`s with their shardings) and the parameters a step of `rows` rows reads, exactly as
        `generate` calls it: for reading what it compiles to (`model.sharding.decode_program_text`). Runs nothing."""
        jitted = _decode_program._plain if self.xla_options is None else _decode_program._cpu
        return jitted.lower(self.decode_params(rows), cache, token_B, GREEDY.args(), cfg=self.cfg,
                            act_dtype=self.policy.activation_dtype, greedy=True, backend=self.backend,
                            layout=self.layout)  # fmt: skip

    def step_fn(self, prompt_ids: Sequence[int], max_new_tokens: int):
        """(state, step) for profiling decode alone: state = (token_B [1] int32, cache) after a greedy prefill of
        `prompt_ids` at its compiled shape (bucket, max_new_tokens), padded as `generate` pads; step(state) runs
        one greedy decode step and returns the next state. The same jitted programs as `generate`, so the first
        token and every step equal `generate(prompt_ids, ...)`. Raises EngineError as `check_request`."""
        ids, bucket = self._padded(prompt_ids, max_new_tokens)
        args = GREEDY.args()
        act_dtype = self.policy.activation_dtype
        state = self.prefill_row(ids, len(prompt_ids), bucket + max_new_tokens, args, True)

        def step(state):
            token_B, cache = state
            out, cache = _decode_program(self.call_params, cache, token_B, args, cfg=self.cfg, act_dtype=act_dtype,
                                         greedy=True, xla_options=self.xla_options, backend=self.backend,
                                         layout=self.layout)  # fmt: skip
            return _token(out), cache

        return state, step

    def step_fn_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int):
        """`step_fn` for a batch: (state, step), state = (tokens [B] int32, cache with lengths [B]) after the greedy
        batch prefill of `prompts` (as `generate_batch` pads them), step(state) one greedy decode step of all rows.
        The same jitted programs as `generate_batch`. Raises EngineError as `generate_batch`."""
        ids, lengths, bucket = self._padded_batch(prompts, max_new_tokens)
        args = GREEDY.args()
        act_dtype = self.policy.activation_dtype
        state = _prefill_program(self.call_params, jnp.asarray(ids), jnp.asarray(lengths, jnp.int32), args, cfg=self.cfg,
                                 cache_len=bucket + max_new_tokens, kv_dtype=self.policy.kv_dtype,
                                 act_dtype=act_dtype, greedy=True, xla_options=None, backend=self.backend,
                                 layout=self.layout)  # fmt: skip

        params = self.decode_params(len(prompts))

        def step(state):
            token_B, cache = state
            out, cache = _decode_program(params, cache, token_B, args, cfg=self.cfg, act_dtype=act_dtype, greedy=True,
                                         xla_options=self.xla_options, backend=self.backend, layout=self.layout)  # fmt: skip
            return _token(out), cache

        return state, step

    def _padded_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int
                      ) -> tuple[np.ndarray, list[int], int]:  # fmt: skip
        """(ids [B, bucket] int32, each row right-padded with the pad id, lengths [B], bucket of the longest row).
        EngineError for no prompts, a prompt `check_request` refuses, or a batch `check_batch` refuses."""
        if not prompts:
            raise EngineError("a batch needs at least 1 prompt, got none")
        lengths = [len(p) for p in prompts]
        for n in lengths:
            self.check_request(n, max_new_tokens)
        bucket = self.check_batch(len(prompts), max(lengths), max_new_tokens).cache_len - max_new_tokens
        ids = np.full((len(prompts), bucket), self.cfg.pad_token_id, np.int32)
        for b, prompt in enumerate(prompts):
            ids[b, : lengths[b]] = np.asarray(prompt, np.int32)
        return ids, lengths, bucket

    def _padded(self, prompt_ids: Sequence[int], max_new_tokens: int) -> tuple[np.ndarray, int]:
        """(ids [1, bucket] int32 right-padded with the pad id, bucket); EngineError as `check_request`."""
        n = len(prompt_ids)
        bucket = self.check_request(n, max_new_tokens)
        ids = np.full((1, bucket), self.cfg.pad_token_id, np.int32)
        ids[0, :n] = np.asarray(prompt_ids, np.int32)
        return ids, bucket

    def prefill_row(self, ids: np.ndarray, n: int, cache_len: int, args, greedy: bool):
        """The compiled prefill of padded `ids` [1, bucket] (int32) with `n` real tokens into a fresh cache of
        `cache_len` positions, then its first token chosen with `args` (`Sampling.args`; `greedy`: argmax):
        (first token [1] int32, cache). `generate`, `step_fn` and the decode slots (`model.slots`, at the slots'
        cache length) prefill through it: one program per (bucket, cache_len, greedy)."""
        return _prefill_program(
            self.call_params, jnp.asarray(ids), jnp.int32(n), args, cfg=self.cfg, cache_len=cache_len,
            kv_dtype=self.policy.kv_dtype, act_dtype=self.policy.activation_dtype, greedy=greedy, xla_options=None,
            backend=self.backend, layout=self.layout,
        )  # fmt: skip


def _token(out) -> jax.Array:
    """The next token [B] of a `_decode_program` output (with experts the program also returns its counts, which
    the profiled steps (`Engine.step_fn`) compute and leave on the device)."""
    return out[0] if isinstance(out, tuple) else out


def _routed(out, experts: list) -> jax.Array:
    """The next token [B] of a `_decode_program` output; for a model with experts (a (token, counts) pair), its
    distinct-expert counts [L] are appended to `experts`, their copy to the host begun, so reading them after the
    loop waits for nothing."""
    if not isinstance(out, tuple):
        return out
    token_B, counts_L = out
    counts_L.copy_to_host_async()
    experts.append(counts_L)
    return token_B


HOST_LOOP_AHEAD = 2
"""Decode steps the host loop keeps dispatched past the token it is reading (`_dispatched_ahead`).

Each dispatched step's token also begins its copy to the host at once (`jax.Array.copy_to_host_async`), so reading
a token waits only for what is left of that copy, not for a device-to-host transfer begun after the step ended.
On an accelerator, where a step is shorter than the host's dispatch plus that transfer, the host thread bounds
the loop: on the lent TPU v5e (jax 0.10.2; a 64-step loop of a program of 212 bfloat16 products over 197 MB,
0.32 ms a step in a device loop, 0.38-0.40 ms to dispatch; median of 5 rounds in one process) a step took
0.86 ms with one step ahead and each token copied when read (the loop before), 0.71 ms with the copy begun at
dispatch, 0.50 ms with the copy begun and two steps ahead, 0.48 ms with four. The engine's default preset there:
`runs/2026-12-07-tpu-ahead-new-tpuv5e` against `...-old-tpuv5e`, host loop 1,346.2 / 1,343.4 tok/s against
932.1 / 947.8 at 41 / 521 tokens, host overhead per step 0.321 / 0.297 ms against 0.651 / 0.608, same tokens
and logits. On CPU the copy is free and a step is 10-50 ms: no measurable change."""


def _dispatched_ahead(step: Callable, cache, token_B: jax.Array, steps: int) -> Iterator[jax.Array]:
    """The host loop's tokens: yields the next-token ids [B] (int32, on the device, their copy to the host begun)
    of `steps` decode steps, `step(cache, token_B) -> (token_B, cache)` each, in order, keeping `HOST_LOOP_AHEAD`
    steps dispatched past the one yielded, so the device does not wait while the caller reads a token. A caller
    that stops early leaves up to `HOST_LOOP_AHEAD` dispatched steps unread; 0 steps dispatches nothing."""
    pending: collections.deque[jax.Array] = collections.deque()
    sent = 0

    def send() -> None:
        nonlocal token_B, cache, sent
        token_B, cache = step(cache, token_B)
        token_B.copy_to_host_async()
        pending.append(token_B)
        sent += 1

    while sent < min(HOST_LOOP_AHEAD, steps):
        send()
    for _ in range(steps):
        ready = pending.popleft()
        if sent < steps:
            send()
        yield ready


@functools.lru_cache(maxsize=None)
def _delay_program(seconds: float) -> Callable:
    """Test only: a jitted identity of a token array that works `seconds` of CPU time on the host inside the
    program (a `jax.pure_callback` that spins until its thread's CPU time, `time.thread_time`, has advanced by
    `seconds`), so the next step, which takes its output, waits for it on the device's stream. Work rather than a
    sleep: it costs the same CPU time however busy the host is, and its wall time grows with the host's load as a
    step's own work does (a sleep would cost nothing in CPU time and wake late on a busy host)."""

    def wait(token):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        return token

    return jax.jit(lambda t: jax.pure_callback(wait, jax.ShapeDtypeStruct(t.shape, t.dtype), t))


def _delayed_step(step: Callable, seconds: float) -> Callable:
    """Test only (`model.switches.TEST_DELAY_ENV`): `step` whose token passes `_delay_program(seconds)` before the
    next step takes it. A wait on the host between dispatches would be hidden by the steps dispatched ahead
    (`HOST_LOOP_AHEAD`); this one lengthens every step by `seconds` (plus the callback's own cost)."""
    delay = _delay_program(seconds)

    def delayed(cache, token_B):
        token_B, cache = step(cache, token_B)
        return delay(token_B), cache

    return delayed


def _check_loop(decode_loop: str, block: int | None, *, stop_at_eos: bool, on_token: bool) -> None:
    """EngineError (one line: received, expected, fix) for a decode loop `Engine.generate` cannot run."""
    if decode_loop not in DECODE_LOOPS:
        raise EngineError(f"decode loop {decode_loop!r}: expected one of {', '.join(DECODE_LOOPS)}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise EngineError(f"decode block {block!r}: expected a whole number of steps >= 1, or none (one loop)")
    if block is not None and decode_loop != "device":
        raise EngineError(f"decode block {block}: blocks are steps of the device loop; pass decode_loop='device' "
                          "or no block")  # fmt: skip
    if decode_loop == "device" and (stop_at_eos or on_token):
        what = "stop_at_eos" if stop_at_eos else "on_token (streaming, stop strings, cancellation)"
        raise EngineError(f"the device decode loop cannot run with {what}: that decides after every token on the "
                          "host; use the host loop (decode_loop='host')")  # fmt: skip


def check_engine_switches() -> None:
    """Raises EngineError (one line, `model.switches.switch_on`) for a value of a backend's on/off switch that is
    neither on nor off (`model.backends.check_switches`: GEMMA4_BENCH_XLA_CPU_OPTIONS, GEMMA4_BENCH_CPU_AMX,
    GEMMA4_BENCH_CPU_ATTENTION). Loads and builds nothing: `load_engine` calls it before the weights load,
    `bench serve` before its port opens."""
    from model.backends import check_switches

    check_switches()
    if injected_decode_delay_s() is not None:  # EngineError for a malformed value; a set one is said at once
        import logging

        logging.getLogger("model.engine").warning(
            f"{TEST_DELAY_ENV} is set: every host-loop decode step does {1e3 * injected_decode_delay_s():g} ms more "
            "CPU work (a test-only slowdown; recorded in the run's manifest as test_injection)")


def load_engine(checkpoint, *, policy: DevicePolicy | None = None, max_length: int | None = None,
                buckets: Sequence[int] | None = None, log_policy: bool = True, quant: QuantSpec = NO_QUANT,
                scale_dtype: str = "bfloat16", kernel: str | None = None,
                mesh=None) -> tuple[Engine, dict]:  # fmt: skip
    """Resolve and load a Hugging Face Gemma 4 checkpoint onto the live device under a dtype policy; a
    `random:PRESET[@SEED]` text (or its folder) makes dummy weights on the device instead
    (`model.random_weights.load_random`: same layouts, no weight file; its report adds `dummy`).

    `policy` defaults to `decide_policy()` for the live device; its weight dtype is the dtype the weights are
    converted to once, at load (so no decode step converts weights unless the policy asks for it). The policy
    is logged first (logger "model.engine"), then any emulation warning. `quant` (`model.quantspec.QuantSpec`)
    quantizes the weights it names as they load, with scales of `scale_dtype` (a `model.policy.DTYPES` name).
    `kernel` ("pallas", "pallas:POLICY" (a TPU tiling policy), "xla" or None: decide; `--kernel w4a16=...`)
    chooses how w4 weights are multiplied: the
    fused Pallas kernel where the device runs it, with the tiles `model.kernels.fit` chooses for each projection
    at this config's shapes before anything compiles (logged, and recorded in the engine's `kernel` plan), or
    XLA's product. Returns (engine, load report: path,
    prefixes, tensors, ignored keys, stored dtypes, content_hash (computed while loading, `load_params`), load_s
    (seconds, hashing included)). Raises CheckpointError / ConfigError / TokenizerError, KernelError for a
    forced kernel the device cannot run or whose tiles do not fit, and EngineError for a policy's backend that
    cannot run here (`model.backends.plan_backend`: "cpu-kernels" off CPU or without a C++ compiler) and for a
    value of an on/off switch (GEMMA4_BENCH_XLA_CPU_OPTIONS, GEMMA4_BENCH_CPU_AMX, GEMMA4_BENCH_CPU_ATTENTION)
    that is neither on nor off (all before the weights load). `mesh` (a `model.placement.Mesh`, None: one
    device, the path before meshes): the weights and KV cache placed over that many devices
    (`model.sharding.prepare_mesh` before the weights load: MeshError for a mesh the model or the devices cannot
    take; `place_params` after).
    """
    from model.checkpoint import load_params, resolve_checkpoint
    from model.config import load_config
    from model.kernels.choice import with_kernel_mode
    from model.policy import decide_policy
    from model.random_weights import load_random, read_marker
    from model.tokenizer import GemmaTokenizer

    policy = with_kernel_mode(policy or decide_policy(), quant, kernel)
    log = logging.getLogger("model.engine")
    if log_policy:  # callers that log it themselves, first thing, pass False
        log_policy_line(policy)
    check_engine_switches()  # EngineError for a bad switch value, before anything loads
    backend = plan_backend(policy.backend, policy.platform, weight_dtype=policy.weight_dtype,
                           activation_dtype=policy.activation_dtype, kv_dtype=policy.kv_dtype)  # before the weights
    path = resolve_checkpoint(checkpoint)
    cfg = load_config(path)
    layout, kernel, policy = _prepare_mesh(mesh, cfg, backend, kernel, policy, quant)  # MeshError before the weights
    plan, policy = _plan_w4_kernel(cfg, policy, quant, scale_dtype, kernel, log)  # before anything loads
    t0 = time.perf_counter()
    load = load_random if read_marker(path) is not None else load_params  # dummy weights: made on the device
    params, report = load(path, cfg, dtype=np.dtype(DTYPES[policy.weight_dtype]), device_put=jax.device_put,
                          quant=quant, scale_dtype=DTYPES[scale_dtype])  # fmt: skip
    cfg = _dummy_routing(cfg, report)
    params = _arranged(params, cfg, plan, backend, layout)
    jax.block_until_ready(params)
    report["load_s"] = time.perf_counter() - t0
    log.info(_loaded_line(report, path, policy, quant))
    for level, line in backend.lines:
        (log.warning if level == "warning" else log.info)(line)
    tokenizer = GemmaTokenizer.from_dir(path) if (path / "tokenizer.json").is_file() else None
    engine = Engine(params, cfg, policy, max_length=max_length, buckets=buckets, tokenizer=tokenizer, quant=quant,
                    scale_dtype=scale_dtype, kernel=plan, backend_plan=backend, layout=layout)  # fmt: skip
    return engine, report


def _prepare_mesh(mesh, cfg: ModelConfig, backend: BackendPlan, kernel: str | None, policy: DevicePolicy,
                  quant: QuantSpec) -> tuple:  # fmt: skip
    """(the `model.sharding.MeshLayout` or None, the kernel choice, the policy) for `load_engine`: with a mesh,
    `model.sharding.prepare_mesh` (MeshError for a mesh the model or the devices cannot take) turns off the
    kernels a mesh cannot place, and the policy says so; without one, everything as given."""
    if mesh is None:
        return None, kernel, policy
    from model.kernels.choice import with_kernel_mode
    from model.sharding import prepare_mesh

    layout, kernel = prepare_mesh(mesh, cfg, backend.backend, kernel)
    return layout, kernel, with_kernel_mode(policy, quant, kernel)


def _arranged(params: Params, cfg: ModelConfig, plan, backend: BackendPlan, layout) -> Params:
    """The loaded `params` as the engine reads them: the w4 projections in the TPU kernel's layout where `plan`
    chose it (`model.kernels.choice.with_tilings`), the input-major projections held transposed where the
    backend's kernels read [N, K] (one leaf at a time: the peak stays near the weights), then placed over the mesh
    of `layout` (`model.sharding.place_params`; one device without one)."""
    if plan is not None and plan.impl == "pallas":
        from model.kernels.choice import with_tilings

        params = with_tilings(params, plan, release=True)  # expert leaves: one copy at a time
    if backend.output_major:
        params = output_major_params(params, release=True)
    if layout is None:
        return params
    from model.sharding import place_params

    return place_params(params, cfg, layout)


def _dummy_routing(cfg: ModelConfig, report: dict) -> ModelConfig:
    """`cfg` with the expert routing the dummy weights were drawn for (`report["dummy"]["expert_routing"]`,
    "router" or "balanced": `model.random_weights.expert_routing`); `cfg` itself for real weights."""
    routing = report.get("dummy", {}).get("expert_routing", "router")
    return cfg if routing == cfg.expert_routing else dataclasses.replace(cfg, expert_routing=routing)


def _plan_w4_kernel(cfg: ModelConfig, policy: DevicePolicy, quant: QuantSpec, scale_dtype: str, kernel: str | None,
                    log) -> tuple:  # fmt: skip
    """(the `model.kernels.choice.KernelPlan` of the w4 projections, the policy) for `load_engine`: the fit check
    at this config's shapes, before anything loads or compiles (logged); (None, `policy`) without w4 weights.
    Where nothing fits, XLA's product, and the policy returned says so from here on. Raises KernelError for a
    forced kernel (`kernel` "pallas" or "pallas:POLICY", whose TPU tiling policy the plan follows) whose tiles do
    not fit."""
    from model.kernels.choice import log_plan, plan_kernel
    from model.kernels.fit import split_kernel

    if quant.layer_bits != 4:
        return None, policy
    asked, tiling_policy = split_kernel(kernel)
    plan = plan_kernel(cfg, quant, impl=policy.w4a16_kernel, reason=policy.w4a16_reason,
                       act_bytes=np.dtype(DTYPES[policy.activation_dtype]).itemsize,
                       scale_bytes=np.dtype(DTYPES[scale_dtype]).itemsize, forced=asked == "pallas",
                       policy=tiling_policy)  # fmt: skip
    log_plan(plan, log)
    if plan.impl != policy.w4a16_kernel:  # nothing fits: XLA's product, and the policy says so from here on
        policy = dataclasses.replace(policy, w4a16_kernel=plan.impl, w4a16_reason=plan.reason)
    return plan, policy


def _loaded_line(report: dict, path: Path, policy: DevicePolicy, quant: QuantSpec) -> str:
    """`load_engine`'s log line of a finished load: what was loaded (or drawn on the device), from where, stored
    and converted to which dtypes, the quantization and the seconds it took (`report["load_s"]`)."""
    how = (f"made {report['tensors']} random tensors on the device for {path} ({report['dummy']['note']}, "
           f"{policy.weight_dtype}" if report.get("dummy") else
           f"loaded {report['tensors']} tensors from {path} (stored {'/'.join(report['stored_dtypes'])}, "
           f"converted once at load to {policy.weight_dtype}")  # fmt: skip
    return f"{how}, quant {quant.canonical}) in {report['load_s']:.1f} s"


def log_policy_line(policy: DevicePolicy) -> None:
    """Log the policy line (logger "model.engine") and, where the compute dtype is emulated, its warning."""
    import logging

    log = logging.getLogger("model.engine")
    log.info(policy.line())
    if policy.warning():
        log.warning(policy.warning())


def full_logits(checkpoint, token_ids: Sequence[int], *, dtype: str = "float32") -> np.ndarray:
    """Full-sequence logits of a checkpoint for `token_ids`: float32 numpy array [T, V] (one causal forward,
    no cache, computed in `dtype`). The entry point for comparing with other implementations."""
    from model.forward import forward_full
    from model.policy import decide_policy

    engine, _ = load_engine(checkpoint, policy=decide_policy(dtype))
    ids_BT = jnp.asarray(np.asarray(token_ids, np.int32)[None])
    return np.asarray(forward_full(engine.params, engine.cfg, ids_BT, dtype=DTYPES[dtype])[0], np.float32)
