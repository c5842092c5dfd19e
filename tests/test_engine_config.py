"""The one engine configuration (model/engine_config.py): built from the shared options with one-line errors, stored
whole in the manifest and read back, hashed into the build id, and compared field by field on resume
(bench/sweep/resume.py); and bench/cli parses and prints only (no function over 60 lines)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.errors import InputError
from model.engine_config import EngineConfig
from model.errors import ModelError, OptionError, QuantError

REPO = Path(__file__).resolve().parents[1]

FULL = EngineConfig.from_options(dtype="float32", weight_dtype="bfloat16", max_length=512, buckets="64,512",
                                 quant="ple4,w4:64", scale_dtype="float16", kernel="w4a16=xla", backend="jax",
                                 mesh="tp=2")  # fmt: skip
"""A configuration with every option given."""


# ---- built once, checked once ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("options,error,needles", [
    ({"dtype": "float8"}, OptionError, ["--dtype float8", "unknown dtype", "bfloat16"]),
    ({"weight_dtype": "int3"}, OptionError, ["--weight-dtype int3", "float32, bfloat16, float16"]),
    ({"max_length": 0}, OptionError, ["--max-length 0", "positive number of tokens"]),
    ({"buckets": "64,32"}, OptionError, ["--buckets 64,32", "not in increasing order", "--buckets 32,64"]),
    ({"buckets": "a,b"}, OptionError, ["--buckets a,b", "whole numbers"]),
    ({"quant": "w3"}, QuantError, ["w3"]),
    ({"scale_dtype": "int8"}, OptionError, ["--scale-dtype int8", "bfloat16, float16, float32"]),
    ({"kernel": "w4a16=cuda"}, OptionError, ["--kernel w4a16=cuda", "w4a16=pallas", "w4a16=xla"]),
    ({"kernel": "w4a16=xla", "quant": "w8"}, OptionError, ["--kernel w4a16=xla", "--quant w8 has none", "add w4"]),
    ({"kernel": "w4a16=xla"}, OptionError, ["--quant none has none"]),
    ({"backend": "cuda"}, OptionError, ["--backend cuda", "jax, cpu-kernels", "default jax"]),
    ({"mesh": "tp=0"}, OptionError, ["--mesh tp=0", "tp=N or ep=N", "e.g. tp=4"]),
    ({"mesh": "dp=2"}, OptionError, ["--mesh dp=2", "tp=N or ep=N"]),
    ({"mesh": "tp=2,ep=2"}, OptionError, ["--mesh tp=2,ep=2", "one axis"]),
])  # fmt: skip
def test_a_bad_option_is_one_line_naming_it(options, error, needles) -> None:
    with pytest.raises(error) as info:
        EngineConfig.from_options(**options)
    text = str(info.value)
    assert "\n" not in text and all(n in text for n in needles), text


def test_options_are_parsed_once_into_typed_fields() -> None:
    assert FULL.buckets == (64, 512) and FULL.max_length == 512
    assert FULL.quant.canonical == "ple4,w4:64" and FULL.quant.layer_bits == 4  # a QuantSpec, not a string
    assert (FULL.kernel, FULL.scales, FULL.backend) == ("xla", "float16", "jax")
    assert (FULL.mesh.axis, FULL.mesh.size, FULL.flag_text("mesh")) == ("tp", 2, "tp=2")  # a frozen placement.Mesh
    assert hash(FULL) == hash(EngineConfig.from_options(**_options_of(FULL)))  # hashable, the mesh included
    assert EngineConfig.from_options(mesh="ep=4").mesh.ep == 4  # parsed and passed on (the engine places it)
    plain = EngineConfig.from_options()
    assert all(getattr(plain, f.name) is None for f in dataclasses.fields(plain))  # nothing given: the engine decides
    assert plain.quant_spec.canonical == "none" and plain.scales == "bfloat16"
    assert EngineConfig.from_options(**_options_of(FULL)) == FULL  # to_args' options give it back


def _options_of(cfg: EngineConfig) -> dict:
    """`to_args` as from_options keywords."""
    args = cfg.to_args()
    names = {"--dtype": "dtype", "--weight-dtype": "weight_dtype", "--max-length": "max_length", "--buckets": "buckets",
             "--quant": "quant", "--scale-dtype": "scale_dtype", "--kernel": "kernel", "--backend": "backend",
             "--mesh": "mesh"}  # fmt: skip
    out = {names[flag]: value for flag, value in zip(args[::2], args[1::2], strict=True)}
    return {**out, "max_length": int(out["max_length"])} if "max_length" in out else out


def test_the_jax_free_name_lists_match_the_engines() -> None:
    from model.backends import BACKENDS
    from model.engine_config import BACKEND_NAMES, DTYPE_NAMES
    from model.policy import DTYPES

    assert DTYPE_NAMES == tuple(DTYPES) and BACKEND_NAMES == tuple(BACKENDS)


# ---- stored whole in the manifest, hashed into the build id ---------------------------------------------------------
def _manifest(options: EngineConfig | None, facts=None):
    from bench.runs.manifest import CheckpointFacts, CompileCacheFacts, EngineConfig as Facts, Workload, build_manifest

    m = build_manifest("sweep", checkpoint=CheckpointFacts(id="tiny", content_hash="h"),
                          engine=facts or Facts(buckets=(64,), compute_dtype="float32"), workload=Workload(),
                          device={"slug": "cpu"}, dtype_policy=None, compile_cache=CompileCacheFacts(),
                          options=options)  # fmt: skip
    return dataclasses.replace(m, name="2026-12-07-x-cpu", started_at="2026-12-07T00:00:00Z")  # as create_run sets


def test_the_configuration_round_trips_through_the_manifest() -> None:
    from bench.runs import ENGINE_OPTIONS_KEY, Manifest

    assert EngineConfig.from_manifest(FULL.to_manifest()) == FULL
    written = json.loads(json.dumps(_manifest(FULL).to_dict()))  # as manifest.json holds it
    assert written[ENGINE_OPTIONS_KEY]["quant"] == "ple4,w4:64" and written[ENGINE_OPTIONS_KEY]["kernel"] == "w4a16=xla"
    assert written["engine_config"]["buckets"] == [64] and "compute_dtype" in written["engine_config"]  # readers' keys
    assert Manifest.from_dict(written).engine_options == FULL
    assert written[ENGINE_OPTIONS_KEY]["mesh"] == "tp=2"


def test_a_mesh_of_one_device_is_one_device_and_keeps_the_build_id() -> None:
    from bench.runs.manifest import EngineConfig as Facts, payload_build_id

    one = dataclasses.replace(FULL, mesh=None)
    for text in ("tp=1", "ep=1", None):
        assert EngineConfig.from_options(mesh=text).mesh is None
    assert one.to_manifest()["mesh"] is None and "--mesh" not in one.to_args()  # as every run before meshes
    assert EngineConfig.from_manifest(one.to_manifest()) == one
    facts = Facts(buckets=(64,), compute_dtype="float32")
    assert payload_build_id(facts, "h", dataclasses.replace(one, mesh=EngineConfig.from_options(mesh="tp=1").mesh)) \
        == payload_build_id(facts, "h", one)


def test_a_manifest_from_before_reads_its_configuration_from_the_engine_facts() -> None:
    from bench.runs import ENGINE_OPTIONS_KEY, Manifest
    from bench.runs.manifest import EngineConfig as Facts

    facts = Facts(buckets=(64, 128), max_length=128, quantization="int8_lm_head,ple4", scale_dtype="float16",
                  weight_dtype="bfloat16", compute_dtype="float32", kernel="w4a16=xla bf16=cpu", backend="cpu-kernels")  # fmt: skip
    written = _manifest(None, facts).to_dict()
    assert ENGINE_OPTIONS_KEY not in written
    got = Manifest.from_dict(json.loads(json.dumps(written))).engine_options
    assert (got.buckets, got.max_length, got.quant.canonical, got.scale_dtype) == ((64, 128), 128, "int8_lm_head,ple4",
                                                                                   "float16")  # fmt: skip
    assert (got.compute_dtype, got.weight_dtype, got.kernel, got.backend) == ("float32", "bfloat16", "xla",
                                                                              "cpu-kernels")  # fmt: skip
    broken = {**written, ENGINE_OPTIONS_KEY: {"quant": "w3"}}
    with pytest.raises(Exception, match="engine_options"):
        Manifest.from_dict(broken).engine_options  # noqa: B018


@pytest.mark.parametrize("field,other", [
    ("compute_dtype", "bfloat16"), ("weight_dtype", "float32"), ("activation_dtype", "float16"),
    ("kv_cache_dtype", "float16"), ("max_length", 256), ("buckets", (64, 256)), ("quant", "w8"),
    ("scale_dtype", "bfloat16"), ("kernel", "pallas"), ("backend", "cpu-kernels"), ("mesh", "tp=4"),
    ("mesh", "ep=2"), ("mesh", None),
])  # fmt: skip
def test_two_configurations_differing_in_any_field_have_different_build_ids(field, other) -> None:
    from bench.runs.manifest import EngineConfig as Facts, payload_build_id
    from model.quantspec import parse_quant

    assert {f.name for f in dataclasses.fields(EngineConfig)} >= {field}
    value = {"quant": parse_quant, "mesh": lambda t: EngineConfig.from_options(mesh=t).mesh}.get(field, lambda v: v)
    changed = dataclasses.replace(FULL, **{field: value(other)})
    assert changed != FULL
    facts = Facts(buckets=(64,), compute_dtype="float32")
    assert payload_build_id(facts, "h", changed) != payload_build_id(facts, "h", FULL)
    assert _manifest(changed).build_id != _manifest(FULL).build_id


def test_the_fields_are_every_option_of_the_shared_group() -> None:
    from bench.cli.engine_options import OPTIONS
    from model.engine_config import FLAGS

    assert sorted(flag for flag, _ in OPTIONS.values()) == sorted(FLAGS.values())


# ---- resume: the stored configuration against the given one, in one place ------------------------------------------
def _run(facts, **workload):
    from bench.runs import CheckpointFacts, Manifest, Workload

    m = Manifest(engine=facts, workload=Workload(**workload), checkpoint=CheckpointFacts(id="c", source="builtin:tiny"))
    m = dataclasses.replace(m, extra={"engine_options": facts_options(facts).to_manifest()})
    return SimpleNamespace(path=Path("runs/x"), typed_manifest=m)


def facts_options(facts):
    from bench.runs.manifest import engine_options_of

    return engine_options_of(facts)


@pytest.mark.parametrize("option,value,stored", [
    ("dtype", "bfloat16", "float32"), ("weight_dtype", "float32", "bfloat16"), ("max_length", 256, "128"),
    ("buckets", "64,256", "64,128"), ("quant", "w8", "int8_lm_head,ple4"), ("scale_dtype", "bfloat16", "float16"),
    ("backend", "jax", "cpu-kernels"), ("mesh", "tp=2", "one device"),
])  # fmt: skip
def test_resuming_with_a_changed_engine_option_names_it(option, value, stored) -> None:
    from bench.runs.manifest import EngineConfig as Facts
    from bench.sweep.resume import SweepFlags, resume_options

    facts = Facts(buckets=(64, 128), max_length=128, quantization="int8_lm_head,ple4", scale_dtype="float16",
                  weight_dtype="bfloat16", compute_dtype="float32", backend="cpu-kernels")  # fmt: skip
    run = _run(facts, inputs=(41,), max_new_tokens=8, repeats=2)
    flag = "--" + option.replace("_", "-")
    with pytest.raises(InputError) as info:
        resume_options(run, SweepFlags(), EngineConfig.from_options(**{option: value}))
    assert str(info.value) == (f"{flag} {value} differs from the resumed run's {stored}; drop the flag to continue "
                               "runs/x as it started")  # fmt: skip
    got = resume_options(run, SweepFlags(), EngineConfig())[1]  # nothing given: the run's configuration
    assert got == facts_options(facts)


def test_resuming_names_every_difference_in_one_line() -> None:
    from bench.runs.manifest import EngineConfig as Facts
    from bench.sweep.resume import SweepFlags, resume_options

    run = _run(Facts(buckets=(64,), compute_dtype="float32", backend="jax"), inputs=(41, 521), max_new_tokens=8,
               repeats=2, notes={"decode_loop": "both", "batches": [1, 4]})  # fmt: skip
    given = SweepFlags(inputs="41", repeats=3, decode_loop="host", batch="1,8", max_duration=5.0)
    with pytest.raises(InputError) as info:
        resume_options(run, given, EngineConfig.from_options(dtype="bfloat16", quant="w8"))
    text = str(info.value)
    assert "\n" not in text and text.endswith("; drop the flags to continue runs/x as it started")
    for part in ("--inputs 41 differs from the resumed run's 41,521", "--repeats 3 differs from the resumed run's 2",
                 "--max-duration 5 differs from the resumed run's none",
                 "--decode-loop host differs from the resumed run's both", "--batch 1,8 differs from the resumed run's 1,4",
                 "--dtype bfloat16 differs from the resumed run's float32", "--quant w8 differs from the resumed run's none"):  # fmt: skip
        assert part in text, text
    same = SweepFlags(inputs="41,521", max_new_tokens=8, decode_loop="both", batch="1,4")
    flags, cfg = resume_options(run, same, EngineConfig.from_options(dtype="float32", quant="none"))
    assert (flags.repeats, flags.checkpoint, flags.compile_cache, cfg.buckets) == (2, "builtin:tiny", "off", (64,))


# ---- bench/cli parses and prints only ---------------------------------------------------------------------------------
LIMIT = 60
"""The most lines a function of bench/cli may have (end_lineno - lineno + 1 of its def: the signature counts)."""


def test_no_function_in_bench_cli_is_over_60_lines() -> None:
    long = []
    for path in sorted((REPO / "bench" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], f"functions over {LIMIT} lines in bench/cli (move the work into its package): {long}"


@pytest.mark.parametrize("command,options", [
    ("sweep", 9), ("serve", 9), ("profile", 8), ("generate", 7),
])  # fmt: skip
def test_the_commands_take_the_shared_group(command, options) -> None:
    import typer

    import bench.cli as cli
    from bench.cli.engine_options import OPTIONS

    cli._register([])
    cmd = typer.main.get_command(cli.app).commands[command]
    names = {opt for p in cmd.params for opt in p.opts}
    flags = [flag for flag, _ in OPTIONS.values() if flag in names]
    assert len(flags) == options, flags
    assert issubclass(OptionError, ModelError)  # one line, exit 2, from bench.cli.main
