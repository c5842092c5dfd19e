"""The engine configuration: every option that decides which engine runs, in one frozen object.

A new engine option is one field here and one option in the CLI's shared group (`bench/cli/engine_options.py`),
never a tuple threaded through the commands. The CLI builds one `EngineConfig` from its options
(`EngineConfig.from_options`: every value checked, `--quant` parsed once into a `model.quantspec.QuantSpec`), the
engine is opened with it, and the run's manifest stores it whole, as the engine resolved it (`to_manifest`, under
`engine_options`), where the build id covers it (bench/runs/manifest.py, `payload_build_id`). A resumed run is
compared field by field against it (bench/sweep/resume.py). See docs/engine.md, "The engine configuration".

Every field is None where the option was not given: the engine decides (the compute dtype from the live device,
the bucket ladder from the maximum length, the w4 kernel from the device and the weights). A resolved
configuration (`bench.runs.manifest.engine_options_of`, from a loaded engine's facts) has every field the engine
decided filled in; an option given explicitly with the value the engine would have chosen resolves to the same
configuration, so it has the same build id.

Batch is not a field: one engine decodes any batch (a batch is a compiled shape, like a prompt bucket), so the
batch sizes are the workload's (`bench sweep --batch`, `bench profile --batch`, `bench serve --max-batch`).

Standard library only (no jax): the report and the fleet read it from manifests of machines you no longer have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from model.errors import OptionError
from model.placement import Mesh, parse_mesh
from model.quantspec import QuantSpec, parse_quant

DTYPE_NAMES = ("float32", "bfloat16", "float16")
"""The dtypes `--dtype` and `--weight-dtype` name (`model.policy.DTYPES`' keys, in its order; a test checks)."""
SCALE_DTYPES = ("bfloat16", "float16", "float32")
"""The dtypes `--scale-dtype` accepts for quantization scales (16-bit by default: the published layout)."""
DEFAULT_SCALE_DTYPE = "bfloat16"
"""The scale dtype when `--scale-dtype` is not given."""
BACKEND_NAMES = ("jax", "cpu-kernels")
"""The backends `--backend` names, the default first (`model.backends.BACKENDS`' keys, in its order; a test checks:
the registry imports jax, and this module must not)."""

FLAGS = {
    "compute_dtype": "--dtype", "weight_dtype": "--weight-dtype", "max_length": "--max-length",
    "buckets": "--buckets", "quant": "--quant", "scale_dtype": "--scale-dtype", "kernel": "--kernel",
    "backend": "--backend", "mesh": "--mesh",
}  # fmt: skip
"""Each field a CLI option sets -> that option's name (the fields without one are resolved, never asked)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Which engine runs (with the code and the checkpoint: the build payload). None: the engine decides.

    `compute_dtype` (`--dtype`), `weight_dtype` (`--weight-dtype`: the dtype the weights are stored in),
    `activation_dtype`, `kv_cache_dtype`: dtype names of `DTYPE_NAMES` (the last two follow the compute dtype in
    `model.policy.decide_policy`; no option sets them yet, a resolved configuration records them).
    `max_length` (`--max-length`): the largest prompt, tokens >= 1. `buckets` (`--buckets`): the prompt-length
    ladder, tokens, increasing and distinct. `quant` (`--quant`): the quantization option set, parsed
    (`model.quantspec.QuantSpec`; None: not given, dense). `scale_dtype` (`--scale-dtype`): the quantization
    scales' dtype (`SCALE_DTYPES`; None: `DEFAULT_SCALE_DTYPE`; a dense engine has no scales and resolves to None).
    `kernel` (`--kernel w4a16=IMPL`): how w4 weights are multiplied, "pallas", "pallas:POLICY" (the TPU kernel
    under a tiling policy other than the default, `model.kernels.fit_tpu.TILING_POLICIES`) or "xla". `backend`
    (`--backend`): a name of `model.backends.BACKENDS` ("jax" is the pure-JAX engine, the default). `mesh`
    (`--mesh tp=N` or `ep=N`): the device mesh the parameters and KV cache are placed on (`model.placement.Mesh`,
    frozen, hashable; `model.sharding` places them), None = one device; a mesh of one device is None, so a
    one-device run keeps its build id. Unlike the other fields, None is not "the engine decides": it is one device
    (docs/engine.md, "Several devices").
    """

    compute_dtype: str | None = None
    weight_dtype: str | None = None
    activation_dtype: str | None = None
    kv_cache_dtype: str | None = None
    max_length: int | None = None
    buckets: tuple[int, ...] | None = None
    quant: QuantSpec | None = None
    scale_dtype: str | None = None
    kernel: str | None = None
    backend: str | None = None
    mesh: Mesh | None = None

    @classmethod
    def from_options(cls, *, dtype: str | None = None, weight_dtype: str | None = None, max_length: int | None = None,
                     buckets: str | None = None, quant: str | None = None, scale_dtype: str | None = None,
                     kernel: str | None = None, backend: str | None = None,
                     mesh: str | None = None) -> EngineConfig:  # fmt: skip
        """The configuration of the CLI's option texts (None: not given), every value checked before anything
        loads. Raises OptionError (one line: the flag, the value received, what is expected) for an unknown dtype,
        a `--max-length` below 1, a malformed `--buckets` ladder, an unknown scale dtype or backend, a malformed
        `--kernel`, a `--kernel` without w4 weights in `--quant`, or a malformed `--mesh` (`parse_mesh_option`);
        QuantError for a bad `--quant` set (`model.quantspec.parse_quant`). Whether the device can run it is the
        engine's question, when it opens (a mesh: before the weights load, `bench.engines.check_mesh_here`)."""
        for flag, name in (("--dtype", dtype), ("--weight-dtype", weight_dtype)):
            if name is not None and name not in DTYPE_NAMES:
                raise OptionError(f"{flag} {name}: unknown dtype; expected one of {', '.join(DTYPE_NAMES)}")
        if max_length is not None and max_length < 1:
            raise OptionError(f"--max-length {max_length}: must be a positive number of tokens, at most the model's "
                              "positions (max_position_embeddings)")  # fmt: skip
        spec = parse_quant(quant) if quant is not None else None
        if scale_dtype is not None and scale_dtype not in SCALE_DTYPES:
            raise OptionError(f"--scale-dtype {scale_dtype}: unknown dtype; expected one of {', '.join(SCALE_DTYPES)}")
        return cls(compute_dtype=dtype, weight_dtype=weight_dtype, max_length=max_length,
                   buckets=parse_buckets(buckets), quant=spec, scale_dtype=scale_dtype,
                   kernel=_parse_kernel(kernel, spec), backend=_parse_backend(backend),
                   mesh=parse_mesh_option(mesh))  # fmt: skip

    @property
    def quant_spec(self) -> QuantSpec:
        """`quant`, dense (`parse_quant(None)`) where it is None."""
        return self.quant if self.quant is not None else parse_quant(None)

    @property
    def scales(self) -> str:
        """The scale dtype the engine quantizes with: `scale_dtype`, else `DEFAULT_SCALE_DTYPE`."""
        return self.scale_dtype or DEFAULT_SCALE_DTYPE

    def flag_text(self, field: str) -> str | None:
        """The value of `field` as its option is written (`FLAGS`), None where it is None: `--buckets 64,128`,
        `--quant int8_lm_head,ple4` (canonical), `--kernel w4a16=xla`, `--mesh tp=2`."""
        value = getattr(self, field)
        if value is None:
            return None
        if field == "buckets":
            return ",".join(map(str, value))
        if field == "quant":
            return value.canonical
        if field == "kernel":
            return f"w4a16={value}"
        if field == "mesh":
            return value.text
        return str(value)

    def to_args(self) -> list[str]:
        """The options that rebuild this configuration in another process (`from_options` of them gives it back,
        the resolved-only fields aside), e.g. ["--dtype", "float32", "--quant", "w4:128"]."""
        return [part for field, flag in FLAGS.items() if (text := self.flag_text(field)) is not None
                for part in (flag, text)]  # fmt: skip

    def to_manifest(self) -> dict[str, Any]:
        """The fields as JSON values (the manifest's `engine_options`, and the build id's): `buckets` a list,
        `quant` its canonical text, `kernel` its option text ("w4a16=xla"), `mesh` its text ("tp=2"); None stays
        None."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**out, "buckets": list(self.buckets) if self.buckets is not None else None,
                "quant": self.flag_text("quant"), "kernel": self.flag_text("kernel"),
                "mesh": self.flag_text("mesh")}  # fmt: skip

    @classmethod
    def from_manifest(cls, d: Mapping[str, Any]) -> EngineConfig:
        """The configuration a manifest's `engine_options` object records (`to_manifest`'s layout; keys it does not
        know are left out, so a later field reads as None in an older run). Raises QuantError for a quantization
        text that is not an option set, OptionError for a malformed kernel or mesh text."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        if values.get("buckets") is not None:
            values["buckets"] = tuple(values["buckets"])
        if values.get("quant") is not None:
            values["quant"] = parse_quant(values["quant"])
        if values.get("kernel") is not None:
            values["kernel"] = _parse_kernel(values["kernel"], None, check_w4=False)
        if values.get("mesh") is not None:
            values["mesh"] = parse_mesh_option(values["mesh"])
        return cls(**values)

    def differences(self, stored: EngineConfig) -> list[tuple[str, str, str]]:
        """(flag, this value, stored value) of every option field where both are set and differ, as the options
        are written (`flag_text`), in `FLAGS` order: what a resumed run refuses (bench/sweep/resume.py). The mesh
        is compared whenever it is given: a stored None is one device ("one device"; every run before meshes ran
        on one)."""
        out = []
        for field, flag in FLAGS.items():
            mine, theirs = self.flag_text(field), stored.flag_text(field)
            if field == "mesh" and theirs is None:
                theirs = ONE_DEVICE_TEXT
            if mine is not None and theirs is not None and mine != theirs:
                out.append((flag, mine, theirs))
        return out

    def or_else(self, stored: EngineConfig) -> EngineConfig:
        """This configuration with each field that is None taken from `stored` (a resumed run's)."""
        return dataclasses.replace(self, **{f.name: getattr(stored, f.name) for f in dataclasses.fields(self)
                                            if getattr(self, f.name) is None})  # fmt: skip

    def dense(self) -> EngineConfig:
        """The same configuration unquantized: no quantization, scales or w4 kernel (the payload of a manifest's
        `dense_build_id`)."""
        return dataclasses.replace(self, quant=parse_quant(None) if self.quant is not None else None, scale_dtype=None,
                                   kernel=None)  # fmt: skip


def parse_buckets(text: str | None) -> tuple[int, ...] | None:
    """`--buckets 64,128,1024` -> (64, 128, 1024); None -> None (the engine's default ladder). Raises OptionError
    for a non-numeric or non-positive rung, and for rungs out of order or repeated (naming the ladder that was
    meant: a silently reordered ladder would hide a typo)."""
    if text is None:
        return None
    try:
        rungs = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise OptionError(f"--buckets {text}: expected comma-separated whole numbers of tokens, e.g. 64,512,4096") from None
    if not rungs or min(rungs) < 1:
        raise OptionError(f"--buckets {text}: expected positive token counts, e.g. 64,512,4096")
    ladder = sorted(set(rungs))
    if rungs != ladder:
        what = "repeats a rung" if len(set(rungs)) < len(rungs) else "is not in increasing order"
        raise OptionError(f"--buckets {text}: {what}; expected increasing, distinct rungs, e.g. "
                          f"--buckets {','.join(map(str, ladder))}")  # fmt: skip
    return tuple(rungs)


def _parse_kernel(text: str | None, spec: QuantSpec | None, *, check_w4: bool = True) -> str | None:
    """`--kernel` text -> "pallas", "pallas:POLICY" or "xla" (`model.kernels.fit.parse_kernel`: the default
    policy's name dropped), None when not given; OptionError
    for another value, and (`check_w4`) for a kernel with a quantization `spec` (None: dense) that has no w4 (the
    kernel multiplies w4 weights). `from_manifest` reads a recorded kernel back without that check."""
    from model.kernels.fit import parse_kernel

    try:
        impl = parse_kernel(text)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    dense = spec if spec is not None else parse_quant(None)
    if impl is not None and check_w4 and dense.layer_bits != 4:
        raise OptionError(f"--kernel {text}: chooses how w4 weights are multiplied, and --quant {dense.canonical} has "
                          "none; add w4 to --quant or drop --kernel")  # fmt: skip
    return impl


ONE_DEVICE_TEXT = "one device"
"""How a configuration without a mesh is written where a mesh is compared or shown."""


def parse_mesh_option(text: str | None) -> Mesh | None:
    """`--mesh` text -> `model.placement.Mesh` ("tp=2", "ep=4": `model.placement.parse_mesh`), None for None and
    for a mesh of one device ("tp=1": one device, the run without --mesh). Raises OptionError (one line: the text,
    what is expected) for anything else. Whether the model divides it and the devices are there is asked before
    the engine loads (`bench.engines.check_mesh_here`)."""
    if text is None:
        return None
    try:
        mesh = parse_mesh(text)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    return mesh if mesh.size > 1 else None


def _parse_backend(name: str | None) -> str | None:
    """`--backend` text -> the backend's name (`model.backends.BACKENDS`), None when not given (the pure-JAX
    default); OptionError for another name. Whether it can run here is asked when the engine opens."""
    if name is not None and name not in BACKEND_NAMES:
        raise OptionError(f"--backend {name}: expected one of {', '.join(BACKEND_NAMES)} (default {BACKEND_NAMES[0]}, "
                          "the pure-JAX engine)")  # fmt: skip
    return name


__all__ = ["DEFAULT_SCALE_DTYPE", "DTYPE_NAMES", "EngineConfig", "FLAGS", "ONE_DEVICE_TEXT", "SCALE_DTYPES",
           "parse_buckets", "parse_mesh_option", "BACKEND_NAMES"]
