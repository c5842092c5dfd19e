"""The run manifest, typed: which payload ran (code, checkpoint, engine configuration), where, for which command.

One function builds it for every command that loads or measures a model (`build_manifest`: `bench sweep`,
`bench sweep --target`, `bench profile`, `bench serve`), and one payload names the build (`payload_build_id`):
the `.py` sources of `model/` and `bench/`, the checkpoint's content hash and the `EngineConfig` (buckets,
max_length, batch, quantization, dtypes). What one command asks of the engine (inputs, max_new_tokens, repeats,
profile steps, the server's name: the `Workload`) is recorded but is not part of the build, so the same code,
checkpoint and engine configuration give the same build id from every command. A sweep through a server records
the server's build id, as its /health reports it (None when it reports none). A peer run (another engine measured
on the sweep's workload, e.g. Hugging Face transformers: `PeerEngine`) records the peer's own build id,
`PeerEngine.build_id`, which is never one of ours (it starts with the engine's name), and the peer under key `peer`.

JSON layout (schema version 2, `bench.runs.schema`): the keys of `MANIFEST_FIELDS`, plus `command`;
`engine_config` holds the engine fields and the workload's fields side by side, flat, as version 1 wrote them;
other top-level keys (`decode_bytes`, `target`, a published run's notes) are kept in `extra`. `Manifest.from_dict`
reads versions 1 and 2 (version 1: `checkpoint.path` instead of `checkpoint.source`, no `command`).

No local path is recorded: the checkpoint is named by `checkpoint_id` and `checkpoint_source`, and a compile cache
folder inside the cache root (`model.folders.cache_root()`) is written relative to it, as `<cache>/xla`.

Standard library only (no jax, no engine): the report reads manifests of machines you no longer have. Facts that
need jax (`device_facts`) are gathered by the caller and passed in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.errors import RunFolderError
from model.errors import ModelError
from bench.runs.environment import build_id, git_state, host_facts, package_versions, python_command_line
from bench.runs.schema import MANIFEST, SCHEMA_VERSION, manifest_problems
from model.engine_config import EngineConfig as EngineOptions

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (REPO / "model", REPO / "bench")
"""The source folders whose `.py` files the build id covers."""
CACHE_PREFIX = "<cache>"
"""How a folder inside the cache root is written in a manifest: `<cache>/xla`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where the numbers come from: kind "measured" (this harness) or "published" (copied; `source` names it)."""

    kind: str
    source: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GitState:
    """The checkout that ran: commit (40 hex) and whether tracked files differed from it; None when unknown."""

    commit: str | None = None
    dirty: bool | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointFacts:
    """The checkpoint, without a local path.

    `id`: a portable name (a hub repo id, else the checkpoint folder's name, e.g. "default-bfloat16-seed0-v1").
    `source`: how to get the same checkpoint on any machine ("builtin:NAME" or a hub repo id); None for a local
    folder. `content_hash`: `model.checkpoint.content_hash` (sha256 hex). `weight_bytes`: bytes of the loaded
    parameters. `tensors`, `ignored_tensors`: counts of the load; `load_s`: seconds. `path`: the folder on the
    machine that ran, read from version 1 manifests only (never written now). `dummy`: for dummy weights
    (`--checkpoint random:PRESET[@SEED]`, made on the device, no checkpoint file) what was made: {"kind": "random",
    "preset", "seed", "weight_dtype", "source", "note", "draw_s", and "expert_routing" for a preset with experts:
    "router" or "balanced", `model.random_weights.ROUTING_ENV`}; their `content_hash` is a hash of the preset,
    seed, weight dtype, config and tokenizer (`model.random_weights.dummy_content_hash`), not of a file. None (and
    absent from the manifest) for a checkpoint read from files.
    """

    id: str | None
    source: str | None = None
    content_hash: str | None = None
    weight_bytes: int | None = None
    tensors: int | None = None
    ignored_tensors: int | None = None
    load_s: float | None = None
    path: str | None = None
    dummy: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The manifest's `checkpoint` object (schema 2): no path; the load counts and `dummy` only when known."""
        out = {"id": self.id, "source": self.source, "content_hash": self.content_hash, "weight_bytes": self.weight_bytes}
        out.update({k: v for k, v in (("tensors", self.tensors), ("ignored_tensors", self.ignored_tensors),
                                      ("load_s", self.load_s)) if v is not None})  # fmt: skip
        if self.dummy is not None:
            out["dummy"] = dict(self.dummy)
        return out

    @property
    def label(self) -> str | None:
        """How a report names the checkpoint: its id, and for dummy weights "(dummy weights)" after it, with the
        expert routing where there are experts ("(dummy weights, balanced routing)")."""
        if self.id is None or not self.dummy:
            return self.id
        routing = self.dummy.get("expert_routing")
        return f"{self.id} (dummy weights{f', {routing} routing' if routing else ''})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The engine configuration that decides what runs: with the code and the checkpoint, the build payload.

    `buckets`: the prompt-length ladder (tokens); `max_length`: the largest prompt (tokens); `batch`: sequences
    decoded together; `quantization`: "none" or the `--quant` option set in its canonical text
    (`model.quantspec.QuantSpec.canonical`, e.g. "int8_lm_head,ple4"); `scale_dtype`: the dtype of the
    quantization scales, None when nothing is quantized (a dense run has no scales: its build does not depend on
    `--scale-dtype`); dtypes by name ("float32", "bfloat16", ...). A manifest written before `--quant` existed
    records quantization "none" (or nothing) and no scale dtype: it reads as dense.
    `kernel`: how w4 weights were multiplied, "w4a16=pallas" (the fused kernel) or "w4a16=xla", None without w4 weights
    (and in manifests from before the kernel); "bf16=cpu" where the engine's CPU kernels multiplied bfloat16 weights
    (`model.backends.cpu.kernels`) and "attention=cpu" where their decode attention ran, after the w4 kernel's name
    where there are both ("w4a16=xla bf16=cpu attention=cpu": `w4_kernel_of`, `cpu_kernel_of`); `kernel_tiles`: with
    pallas, the tiling of each projection ({"qkv_DX K=1536 N=2560": "bm16 bn256 bk128 stages4 splits12 warps4", ...},
    "xla (why)" for one the kernel does not take; `model.kernels.choice.KernelPlan.tiles`). Both enter the build id:
    other tiles, another build.
    `xla_options`: the XLA options the engine compiled its decode programs with
    (`model.backends.BackendPlan.xla_options`, e.g. "xla_disable_hlo_passes=tree_reduction_rewriter" under the
    cpu-kernels backend), None for XLA's defaults and in manifests from before it was recorded; it enters the build
    id.
    `backend`: which engine ran (`model.backends`): "jax" (the pure-JAX engine, the default on every platform) or
    "cpu-kernels" (the engine's hand-written XLA:CPU kernels, asked for with `--backend cpu-kernels`; its kernels in
    use are named in `kernel`); None in manifests from before it was recorded, when the CPU kernels were on by
    default on CPU where they built (their names in `kernel` say whether they ran). It enters the build id.
    """

    buckets: tuple[int, ...] | None = None
    max_length: int | None = None
    batch: int | None = None
    quantization: str | None = None
    scale_dtype: str | None = None
    weight_dtype: str | None = None
    activation_dtype: str | None = None
    kv_cache_dtype: str | None = None
    compute_dtype: str | None = None
    kernel: str | None = None
    kernel_tiles: Mapping[str, str] | None = None
    xla_options: str | None = None
    backend: str | None = None

    @property
    def quantized(self) -> bool:
        """True when the run quantized some weights (`quantization` recorded and not "none")."""
        return self.quantization not in (None, "none")

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (the build id's configuration payload); `backend` only when recorded, so the
        payload of a manifest from before it reads as it was written."""
        d = dataclasses.asdict(self)
        if d["backend"] is None:
            del d["backend"]
        d["kernel_tiles"] = dict(self.kernel_tiles) if self.kernel_tiles is not None else None
        return {**d, "buckets": list(self.buckets) if self.buckets is not None else None}

    def dense(self) -> EngineConfig:
        """The same configuration without quantization (quantization "none", no scale dtype, no w4 kernel): the
        payload whose build id `dense_build_id` names."""
        return dataclasses.replace(self, quantization="none", scale_dtype=None, kernel=cpu_kernel_of(self.kernel),
                                   kernel_tiles=None)  # fmt: skip


def w4_kernel_of(kernel: str | None) -> str | None:
    """The w4 product's part of an `EngineConfig.kernel` text ("w4a16=pallas" or "w4a16=xla"), else None."""
    return next((part for part in (kernel or "").split() if part.startswith("w4a16=")), None)


def cpu_kernel_of(kernel: str | None) -> str | None:
    """The CPU kernels' part of an `EngineConfig.kernel` text ("bf16=cpu", "attention=cpu", "bf16=cpu attention=cpu":
    every name but the w4 product's), else None."""
    return " ".join(part for part in (kernel or "").split() if not part.startswith("w4a16=")) or None


def kernel_text(w4: str | None, cpu: str | None) -> str | None:
    """`EngineConfig.kernel` of an engine with the w4 product `w4` and the CPU kernel `cpu` (either None)."""
    return " ".join(part for part in (w4, cpu) if part) or None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """What one command asked of the engine; recorded, not part of the build id.

    `inputs`: input sizes (tokens); `max_new_tokens`: tokens generated per request; `repeats`: timed repeats per
    cell; `sampling`, `eos`: how tokens were chosen and EOS treated; `notes`: the command's other settings (e.g.
    profile_steps, the target URL and model, the prompt tokenizer), JSON values.
    """

    inputs: tuple[int, ...] | None = None
    max_new_tokens: int | None = None
    repeats: int | None = None
    sampling: str | None = None
    eos: str | None = None
    notes: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values, notes flattened in (how `engine_config` stores them beside the engine's)."""
        return {"max_new_tokens": self.max_new_tokens, "repeats": self.repeats,
                "inputs": list(self.inputs) if self.inputs is not None else None, "sampling": self.sampling,
                "eos": self.eos, **self.notes}  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompileCacheFacts:
    """The persistent compilation cache: folder (`<cache>/...` inside the cache root; None when off), and the hits
    and misses of the run (None until counted, or when not observable)."""

    dir: str | None = None
    hits: int | None = None
    misses: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetFacts:
    """The server a remote sweep measured through: its build id as its /health reports it (None when it does not)
    and its description (`bench.sweep.remote.Target.describe()`: url, model, kind, health, models)."""

    build_id: str | None
    description: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PeerEngine:
    """Another engine measured on this harness's workload (a peer): not this project's engine.

    `name`: the engine ("transformers"); `version`: its version ("5.24.0"); `framework`: what it runs on
    ("torch 2.13.0+cpu"); `settings`: what decides its speed, JSON values (threads, attention implementation, dtype,
    decode loop, the hash of the script that drove it); `versions`: the peer process's packages ({"python": ...,
    "torch": ..., ...}: they replace this process's in the manifest's `versions`); `command_line`: the peer
    process's. The manifest stores it under key `peer` (`to_dict`), and `Manifest.peer` reads it back.
    """

    name: str
    version: str
    framework: str
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    versions: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    command_line: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """"transformers 5.24.0": the engine as the report names it."""
        return f"{self.name} {self.version}"

    def build_id(self, engine: EngineConfig, checkpoint_hash: str | None) -> str:
        """The peer's build id: "<name>-<version>-" + 12 hex of sha256 over the framework, settings, versions,
        engine configuration and checkpoint content hash (sorted-key JSON). It never equals one of ours (12 bare
        hex, `payload_build_id`): two runs of one build id ran one payload, and a peer is another payload."""
        payload = {"framework": self.framework, "settings": dict(self.settings), "versions": dict(self.versions),
                   "engine": engine.to_dict(), "checkpoint": checkpoint_hash}  # fmt: skip
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return f"{self.name}-{self.version}-{digest}"

    def to_dict(self) -> dict[str, Any]:
        """The manifest's `peer` object: `engine` (the label) and every field."""
        return {"engine": self.label, "name": self.name, "version": self.version, "framework": self.framework,
                "settings": dict(self.settings), "versions": dict(self.versions),
                "command_line": list(self.command_line)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any) -> PeerEngine | None:
        """The typed view of a manifest's `peer` object; None when it is not an object naming a name and version."""
        if not isinstance(d, Mapping) or not isinstance(d.get("name"), str) or not isinstance(d.get("version"), str):
            return None
        return cls(name=d["name"], version=d["version"], framework=str(d.get("framework") or ""),
                   settings=dict(d.get("settings") or {}), versions=dict(d.get("versions") or {}),
                   command_line=tuple(d.get("command_line") or ()))  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    """A run's manifest, typed (schema version 1 or 2). `device`, `host`, `versions` and `dtype_policy` are the
    environment's facts as gathered (`bench.runs.environment`); `extra` holds the other top-level keys."""

    schema_version: int = SCHEMA_VERSION
    name: str | None = None
    status: str = "running"
    provenance: Provenance = Provenance(kind="measured")
    started_at: str | None = None
    ended_at: str | None = None
    command: str | None = None
    command_line: tuple[str, ...] | str | None = None
    build_id: str | None = None
    git: GitState = GitState()
    versions: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    device: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    host: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dtype_policy: Mapping[str, Any] | None = None
    checkpoint: CheckpointFacts = CheckpointFacts(id=None)
    engine: EngineConfig = EngineConfig()
    workload: Workload = Workload()
    compile_cache: CompileCacheFacts = CompileCacheFacts()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def peer(self) -> PeerEngine | None:
        """The peer engine a peer run measured (its `peer` key), None for a run of this project's engine."""
        return PeerEngine.from_dict(self.extra.get("peer"))

    @property
    def dense_build_id(self) -> str | None:
        """The build id of this run's payload without quantization (`DENSE_BUILD_ID_KEY`, written by
        `build_manifest`): equal in a dense run and a quantized run of the same code, checkpoint and engine
        configuration, so `bench compare` can tell a quantization that is the only difference. A run written
        before the key existed: its own build id when it was dense, else None (unknown)."""
        recorded = self.extra.get(DENSE_BUILD_ID_KEY)
        if isinstance(recorded, str):
            return recorded
        return None if self.engine.quantized or self.peer is not None else self.build_id

    @property
    def engine_options(self) -> EngineOptions:
        """The engine configuration the run resolved (`model.engine_config.EngineConfig`): the manifest's
        `ENGINE_OPTIONS_KEY` object, or, in a run written before it was stored, the same fields read from its
        `engine_config` facts (`engine_options_of`). Raises RunFolderError for a stored object that does not read
        back (an unknown quantization or kernel text)."""
        stored = self.extra.get(ENGINE_OPTIONS_KEY)
        if not isinstance(stored, Mapping):
            return engine_options_of(self.engine)
        try:
            return EngineOptions.from_manifest(stored)
        except ModelError as exc:
            raise RunFolderError(f"{MANIFEST}: {ENGINE_OPTIONS_KEY}: {exc}") from None

    @property
    def slug(self) -> str | None:
        """The device's short name for run-folder names (device.slug), None when unknown."""
        return self.device.get("slug")

    @property
    def device_kind(self) -> str | None:
        return self.device.get("device_kind")

    def to_dict(self) -> dict[str, Any]:
        """The manifest.json object (schema version 2 layout; `command` only when known)."""
        line = list(self.command_line) if isinstance(self.command_line, tuple) else self.command_line
        return {
            "schema_version": self.schema_version, "name": self.name, "status": self.status,
            "provenance": dataclasses.asdict(self.provenance), "started_at": self.started_at,
            "ended_at": self.ended_at, **({"command": self.command} if self.command is not None else {}),
            "command_line": line, "build_id": self.build_id,
            "git": dataclasses.asdict(self.git), "versions": dict(self.versions), "device": dict(self.device),
            "host": dict(self.host), "dtype_policy": dict(self.dtype_policy) if self.dtype_policy is not None else None,
            "checkpoint": self.checkpoint.to_dict(), "engine_config": {**self.engine.to_dict(), **self.workload.to_dict()},
            "compile_cache": dataclasses.asdict(self.compile_cache), **self.extra,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str = MANIFEST) -> Manifest:
        """The typed view of a parsed manifest.json of schema version 1 or 2. RunFolderError (naming `where` and
        the first problem) when it breaks its schema (`bench.runs.schema.manifest_problems`)."""
        problems = manifest_problems(d)
        if problems:
            raise RunFolderError(f"{where}: {problems[0]}")
        known = {f.name for f in dataclasses.fields(cls)} - {"engine", "workload"} | {"engine_config"}
        engine, workload = _split_engine_config(d["engine_config"])
        line = d["command_line"]
        return cls(
            schema_version=d["schema_version"], name=d["name"], status=d["status"],
            provenance=_typed(Provenance, d["provenance"]), started_at=d["started_at"], ended_at=d["ended_at"],
            command=d.get("command"), command_line=tuple(line) if isinstance(line, list) else line,
            build_id=d["build_id"], git=_typed(GitState, d["git"]), versions=d["versions"], device=d["device"],
            host=d["host"], dtype_policy=d["dtype_policy"], checkpoint=_typed(CheckpointFacts, d["checkpoint"]),
            engine=engine, workload=workload, compile_cache=_typed(CompileCacheFacts, d["compile_cache"]),
            extra={k: v for k, v in d.items() if k not in known},
        )  # fmt: skip


def _typed(cls: type, d: Mapping[str, Any]) -> Any:
    """`cls` from the keys of `d` it has fields for (other keys are ignored: a schema allows extra keys)."""
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def _split_engine_config(cfg: Mapping[str, Any]) -> tuple[EngineConfig, Workload]:
    """`engine_config` (flat) -> (the engine's fields, the workload's fields with every other key as a note)."""
    engine_keys = {f.name for f in dataclasses.fields(EngineConfig)}
    workload_keys = {f.name for f in dataclasses.fields(Workload)} - {"notes"}
    engine = {k: v for k, v in cfg.items() if k in engine_keys}
    if isinstance(engine.get("buckets"), list):
        engine["buckets"] = tuple(engine["buckets"])
    work = {k: v for k, v in cfg.items() if k in workload_keys}
    if isinstance(work.get("inputs"), list):
        work["inputs"] = tuple(work["inputs"])
    notes = {k: v for k, v in cfg.items() if k not in engine_keys | workload_keys}
    return EngineConfig(**engine), Workload(**work, notes=notes)


# ---- the sweep's measured rates (bench.sweep.rates writes them) -------------------------------------------------
RATES_KEY = "rates"
"""The run manifest's top-level key (in `Manifest.extra`) that holds an in-process sweep's measured rates
(`bench.sweep.rates`: `copy_bandwidth`, `read_bandwidth` (the fastest read probe), `read_probes` (every one),
`matmul`, each its measurement's JSON; `ceiling`, the roofline's denominator, and `roofline_findings`, the shares
above 100% of it: bench/runs/ceiling.py). Runs recorded earlier lack the later keys: `read_bandwidth` since
2026-12-05, `read_probes`, `ceiling` and `roofline_findings` since the read-rate ceiling."""


def _positive_rate(manifest: Mapping[str, Any], key: str) -> float | None:
    """`manifest[RATES_KEY][key]["bytes_per_s"]` as a float, None where it is missing or not a positive number."""
    try:
        value = float(manifest[RATES_KEY][key]["bytes_per_s"])
    except (TypeError, KeyError, ValueError):
        return None
    return value if value > 0 else None


def read_bandwidth_of(manifest: Mapping[str, Any]) -> float | None:
    """The read-only bandwidth (bytes/s: the fastest of `bench.profile.bandwidth.measure_read_probes`; XLA's
    reduction alone in runs recorded before the Pallas probe) a run measured beside its copy, from a manifest's
    top-level keys (`Manifest.extra`, or the parsed manifest.json): `RATES_KEY` -> `read_bandwidth` ->
    `bytes_per_s`. None when the run has none (recorded before it was measured, a `--target` sweep, a published run)
    or it is not a positive number. The roofline's ceiling is max(this, the datasheet figure):
    `bench.runs.ceiling.ceiling_of`."""
    return _positive_rate(manifest, "read_bandwidth")


COPY_END_KEY = "copy_bandwidth_end"
"""The key, under `RATES_KEY`, of the copy bandwidth an in-process sweep measured again after its last cell
(`BandwidthResult.to_json()`, written by `bench sweep`); absent from runs recorded before it, and from stopped or
failed sweeps."""


def copy_bandwidths_of(manifest: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(the copy bandwidth a sweep measured before its first cell, the one it measured after its last), bytes/s,
    from a manifest's top-level keys: `RATES_KEY` -> `copy_bandwidth` / `COPY_END_KEY` -> `bytes_per_s`
    (`bench.sweep.rates`). Each None where the run has none (a `--target` sweep, a published run, a stopped sweep's
    end, a run recorded before the end was measured) or it is not a positive number."""
    return _positive_rate(manifest, "copy_bandwidth"), _positive_rate(manifest, COPY_END_KEY)


def drift_pct(start_bytes_s: float, end_bytes_s: float) -> float:
    """How far a bandwidth moved from `start_bytes_s` to `end_bytes_s`, percent of the start's: (end - start) /
    start x 100 (the sweep's end line, the report's note, `bench compare`'s bandwidth note). Raises ValueError for a
    start that is not a positive number."""
    if not start_bytes_s > 0:
        raise ValueError(f"start bandwidth {start_bytes_s!r}: expected bytes/s > 0")
    return 100.0 * (end_bytes_s - start_bytes_s) / start_bytes_s


# ---- the one build id and the one builder ---------------------------------------------------------------------
TEST_INJECTION_KEY = "test_injection"
"""The manifest key that records a test-only slowdown the engine was given (`model.switches.TEST_DELAY_ENV`, set by
`bench ab`'s tests): {"variable", "decode_delay_ms"}; absent from every ordinary run."""

DENSE_BUILD_ID_KEY = "dense_build_id"
"""The manifest key of `Manifest.dense_build_id`: the build id of the same payload unquantized."""


ENGINE_OPTIONS_KEY = "engine_options"
"""The manifest's top-level key holding the engine configuration whole, as the engine resolved it
(`model.engine_config.EngineConfig.to_manifest()`, `Manifest.engine_options`); `engine_config` keeps the same facts
flat beside the workload, as every reader of it expects (bench report, bench compare)."""


def payload_build_id(engine: EngineConfig, checkpoint_hash: str | None, options: EngineOptions | None = None) -> str:
    """The build id of a payload (12 hex chars): `bench.runs.environment.build_id` over the `.py` sources of
    `SOURCE_ROOTS`, the checkpoint content hash and `engine.to_dict()`, with the engine configuration
    `options.to_manifest()` under key "options" where given (every command that opens the engine gives it:
    `build_manifest`). Nothing per command enters it."""
    config = engine.to_dict() if options is None else {**engine.to_dict(), "options": options.to_manifest()}
    return build_id(SOURCE_ROOTS, checkpoint_hash, config)


def build_manifest(command: str, *, checkpoint: CheckpointFacts, engine: EngineConfig, workload: Workload,
                   device: Mapping[str, Any], dtype_policy: Mapping[str, Any] | None,
                   compile_cache: CompileCacheFacts, target: TargetFacts | None = None,
                   peer: PeerEngine | None = None, extra: Mapping[str, Any] | None = None,
                   options: EngineOptions | None = None) -> Manifest:  # fmt: skip
    """The manifest of `command` ("sweep", "sweep --target", "profile", "serve", "peer"), status "running", name
    and times unset (`bench.runs.create_run` sets them).

    The build id is `payload_build_id(engine, checkpoint.content_hash)` for a payload run here; with `target`
    (a sweep through a server) it is the server's own, as it reports it; with `peer` (another engine measured
    on the sweep's workload) it is `peer.build_id(...)`, never one of ours. This process's command line, git
    state, package versions and host are gathered here (a peer's package versions, and its Python in `host`,
    are the peer process's); `device` and `dtype_policy` come from the caller (jax's, the server's or the
    peer's). `extra`: other top-level keys (e.g. decode_bytes); the target's description goes under `target`,
    the peer under `peer`; a payload run here also records `dense_build_id` (`Manifest.dense_build_id`).
    `options`: the engine configuration as resolved (`engine_options_of`), stored whole under
    `ENGINE_OPTIONS_KEY` and hashed into a payload's build id (`payload_build_id`).
    Raises InputError when a source folder is missing (environment.build_id); ValueError
    for both a target and a peer.
    """
    if target is not None and peer is not None:
        raise ValueError("build_manifest: a run measures through a target or a peer engine, not both")
    from model.switches import TEST_DELAY_ENV, injected_decode_delay_s  # jax-free; not a reader's import

    more, host, versions = dict(extra or {}), host_facts(), package_versions()
    if options is not None:
        more[ENGINE_OPTIONS_KEY] = options.to_manifest()
    if (delay := injected_decode_delay_s()) is not None:  # test only: a known slowdown, never unrecorded
        more[TEST_INJECTION_KEY] = {"variable": TEST_DELAY_ENV, "decode_delay_ms": 1e3 * delay}
    if target is not None:
        payload_id = target.build_id
        more["target"] = dict(target.description)
    elif peer is not None:
        payload_id = peer.build_id(engine, checkpoint.content_hash)
        more["peer"] = peer.to_dict()
        versions = dict(peer.versions)
        host["python"] = peer.versions.get("python")
    else:
        payload_id = payload_build_id(engine, checkpoint.content_hash, options)
        dense = options.dense() if options is not None else None
        more[DENSE_BUILD_ID_KEY] = (payload_build_id(engine.dense(), checkpoint.content_hash, dense)
                                    if engine.quantized else payload_id)  # fmt: skip
    return Manifest(
        command=command, command_line=tuple(python_command_line()), build_id=payload_id, git=_typed(GitState, git_state(REPO)),
        versions=versions, device=dict(device), host=host, dtype_policy=dtype_policy,
        checkpoint=checkpoint, engine=engine, workload=workload, compile_cache=compile_cache, extra=more,
    )  # fmt: skip


# ---- facts of a loaded engine, without jax (duck-typed) ---------------------------------------------------------
def engine_config_of(engine: Any, *, batch: int = 1) -> EngineConfig:
    """The `EngineConfig` of a loaded `model.engine.Engine`: its buckets, max_length, policy's dtypes and quantization
    (`engine.quant.canonical`, "none" for dense or an engine without `quant`; `engine.scale_dtype` only when something
    is quantized) and w4 kernel (`engine.kernel`, a `model.kernels.choice.KernelPlan`: its option and tiles; None
    without one) and its CPU kernels (`engine.cpu_kernel`, e.g. "bf16=cpu attention=cpu", "attention=cpu", or None),
    joined by `kernel_text`, the XLA options of its decode programs (`engine.xla_options`) and its backend
    (`engine.backend`)."""
    pol = engine.policy
    quant = getattr(engine, "quant", None)
    quantization = quant.canonical if quant is not None else "none"
    scale = getattr(engine, "scale_dtype", None) if quantization != "none" else None
    plan = getattr(engine, "kernel", None)
    return EngineConfig(buckets=tuple(engine.buckets), max_length=engine.max_length, batch=batch,
                        quantization=quantization, scale_dtype=scale, weight_dtype=pol.weight_dtype,
                        activation_dtype=pol.activation_dtype, kv_cache_dtype=pol.kv_dtype,
                        compute_dtype=pol.compute_dtype,
                        kernel=kernel_text(plan.option if plan is not None else None,
                                           getattr(engine, "cpu_kernel", None)),
                        kernel_tiles=plan.tiles if plan is not None else None,
                        xla_options=getattr(engine, "xla_options", None),
                        backend=getattr(engine, "backend", None))  # fmt: skip


def engine_options_of(facts: EngineConfig, *, mesh: Any = None) -> EngineOptions:
    """The engine configuration (`model.engine_config.EngineConfig`) an engine with the recorded `facts` resolved:
    its dtypes, max length and buckets, its quantization (dense where none is recorded) with its scale dtype, its
    w4 kernel (`w4_kernel_of`: "pallas" or "xla"; the CPU kernels follow the backend and the weight dtype) and its
    backend (None in a run from before it was recorded); `mesh` as given (None: one device). Where a fact was
    not recorded (older runs) the field is None. Raises QuantError for a recorded quantization that is not an
    option set."""
    from model.quantspec import parse_quant

    w4 = w4_kernel_of(facts.kernel)
    return EngineOptions(compute_dtype=facts.compute_dtype, weight_dtype=facts.weight_dtype,
                         activation_dtype=facts.activation_dtype, kv_cache_dtype=facts.kv_cache_dtype,
                         max_length=facts.max_length, buckets=tuple(facts.buckets) if facts.buckets else None,
                         quant=parse_quant(facts.quantization if facts.quantized else None),
                         scale_dtype=facts.scale_dtype if facts.quantized else None,
                         kernel=w4.partition("=")[2] if w4 else None, backend=facts.backend, mesh=mesh)  # fmt: skip


def policy_facts(pol: Any) -> dict[str, Any]:
    """The manifest's `dtype_policy` object of a `model.policy.DevicePolicy`."""
    return {"line": pol.line(), "compute_dtype": pol.compute_dtype, "weights": pol.weight_dtype,
            "activations": pol.activation_dtype, "kv_cache": pol.kv_dtype, "pre_ampere": pol.pre_ampere,
            "pallas_interpret": pol.pallas_interpret, "overridden": pol.overridden, "emulated": pol.emulated,
            "w4a16_kernel": getattr(pol, "w4a16_kernel", None), "w4a16_reason": getattr(pol, "w4a16_reason", None),
            "backend": getattr(pol, "backend", None)}  # fmt: skip


def checkpoint_id(path: str | Path) -> str:
    """A portable name for a checkpoint folder: "owner/name" for a Hugging Face cache snapshot
    (`.../models--owner--name/snapshots/REVISION`), else the folder's name."""
    p = Path(path)
    if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
        return p.parent.parent.name[len("models--"):].replace("--", "/", 1)
    return p.name


def checkpoint_source(spec: str) -> str | None:
    """How the checkpoint given as `spec` (`--checkpoint`: builtin:NAME, random:NAME[@SEED], a hub repo id or a
    local folder) is had again anywhere: `spec` itself for builtin:NAME, random:NAME[@SEED] or a repo id, None for
    a local folder (a path of this machine)."""
    if spec.startswith(("builtin:", "random:")):
        return spec
    return None if Path(spec).expanduser().exists() else spec


def checkpoint_facts(spec: str, load_report: Mapping[str, Any], weight_bytes: int) -> CheckpointFacts:
    """The `CheckpointFacts` of a load: `spec` as given to `--checkpoint` (None resolved to its builtin:NAME by the
    caller), the load report of `model.engine.load_engine` (path, tensors, ignored, content_hash, load_s, and
    `dummy` for dummy weights: then the id is "random-PRESET-DTYPE-seedSEED", "-balanced" added for balanced expert
    routing, and the source the canonical random:PRESET[@SEED], whatever folder or text named it)."""
    dummy = load_report.get("dummy")
    ident = checkpoint_id(load_report["path"])
    source = checkpoint_source(spec)
    if dummy:
        ident = f"random-{dummy['preset']}-{dummy['weight_dtype']}-seed{dummy['seed']}"
        ident += "-balanced" if dummy.get("expert_routing") == "balanced" else ""
        source = dummy["source"]
    return CheckpointFacts(id=ident, source=source, content_hash=load_report.get("content_hash"),
                           weight_bytes=weight_bytes, tensors=load_report.get("tensors"),
                           ignored_tensors=len(load_report.get("ignored", ())), load_s=load_report.get("load_s"),
                           dummy=dummy)  # fmt: skip


def portable_dir(path: str | Path | None, cache_root: str | Path) -> str | None:
    """A folder as a manifest writes it: `<cache>/REL` inside `cache_root`, else the folder as given; None stays."""
    if path is None:
        return None
    p, root = Path(path).expanduser(), Path(cache_root).expanduser()
    try:
        rel = p.resolve().relative_to(root.resolve())
    except ValueError:
        return str(path)
    return CACHE_PREFIX if str(rel) == "." else f"{CACHE_PREFIX}/{rel.as_posix()}"


def local_dir(text: str | None, cache_root: str | Path) -> str | None:
    """The inverse of `portable_dir` on this machine: `<cache>/REL` -> the folder under `cache_root`."""
    if text is None or not (text == CACHE_PREFIX or text.startswith(CACHE_PREFIX + "/")):
        return text
    return str(Path(cache_root) / text[len(CACHE_PREFIX):].lstrip("/"))
