"""`bench profile`, `bench profile analyze` and `bench bandwidth` through the CLI, on the built-in tiny checkpoint.

The leak-one check: the tiny checkpoint is stored in bfloat16; with the float32 CPU policy and `--weight-dtype
bfloat16` every decode step converts the weights, which the profile must show (measured on this CPU machine: 34-75%
of device time in dtype conversion over 5 steps), while the matched float32 run converts nothing (0.0%).
Commands run in-process through `bench.cli.main` (exit code read from SystemExit), nothing under the home folder:
GEMMA4_BENCH_CACHE points at a temporary folder and the compile cache is off.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import bench_in_process
from bench.profile.command import nvidia_gpu_expected
from model.backends.cpu.kernels import ATTENTION_KERNEL, bf16_kernel_name

STEPS = 3


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("profile_cli")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMA4_BENCH_CACHE", str(root / "cache"))
        yield root


def _profile(env: Path, name: str, *extra: str) -> Path:
    runs = env / "runs"
    code = bench_in_process(["profile", "--steps", str(STEPS), "--checkpoint", "builtin:tiny", "--runs-dir", str(runs),
                   "--name", name, "--compile-cache", "off", *extra])  # fmt: skip
    assert code == 0
    (run,) = runs.glob(f"*-{name}-*")
    return run


@pytest.fixture(scope="module")
def matched(env):
    """float32 weights and float32 compute (the CPU policy): nothing to convert."""
    run = _profile(env, "matched")
    return run, json.loads((run / "profile.json").read_text())


@pytest.fixture(scope="module")
def leak(env):
    """bfloat16 weights, float32 compute, the default pure-JAX engine: XLA converts the weights every step."""
    run = _profile(env, "leak", "--weight-dtype", "bfloat16")
    return run, json.loads((run / "profile.json").read_text())


@pytest.fixture(scope="module")
def kernels(env):
    """bfloat16 weights, float32 compute, the engine's CPU kernels asked for: the weights are read as stored."""
    from model.backends.cpu import kernels as cpu

    if not cpu.available():
        pytest.skip(f"the CPU kernels are not available here: {cpu.availability()[1]}")
    run = _profile(env, "kernels", "--weight-dtype", "bfloat16", "--backend", "cpu-kernels")
    return run, json.loads((run / "profile.json").read_text())


def test_exactly_n_steps_captured_and_analysed(matched):
    run, prof = matched
    assert prof["schema_version"] == 1
    assert prof["steps"] == STEPS
    assert prof["capture"]["steps"] == STEPS and len(prof["capture"]["step_wall_ms"]) == STEPS
    assert prof["totals"]["steps"] == STEPS
    assert prof["config"]["input_tokens"] == prof["config"]["prompt"]["tokens"] == 41  # the default: a real prompt
    assert prof["config"]["prompt"]["text_chars"] > 0
    assert list(run.glob("profile/**/*.xplane.pb")), "the trace lies under <run>/profile/"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    from bench.runs import validate_run

    assert validate_run(run) == []


def test_categories_sum_to_100_and_no_tensor_cores_on_cpu(matched):
    _, prof = matched
    pcts = [c["pct"] for c in prof["categories"].values() if c["pct"] is not None]
    assert sum(pcts) == pytest.approx(100.0, abs=0.01)
    assert prof["categories"]["tensor_core"]["pct"] is None  # absent, not 0


def test_roofline_attached_from_engine_bytes_and_measured_bandwidth(matched):
    _, prof = matched
    roof = prof["roofline"]
    assert roof["bytes_per_step"] == prof["config"]["decode_bytes"]["total"] > 0
    assert roof["tok_s_source"] == "profile"  # a new run has no sweep cell
    read = prof["read_bandwidth"]  # the fastest read probe: on a CPU, with no datasheet figure, the denominator
    assert roof["bandwidth_bytes_s"] == read["bytes_per_s"] == prof["ceiling"]["bytes_per_s"] > 0
    assert roof["bandwidth_kind"] == "ceiling: measured read (max(read, datasheet))"
    assert prof["ceiling"]["copy_bytes_s"] == prof["bandwidth"]["bytes_per_s"] > 0  # the copy beside it
    assert roof["share_pct"] == pytest.approx(100 * roof["bytes_per_step"] * roof["tok_s"] / roof["bandwidth_bytes_s"])
    assert read["bytes_moved"] == read["n_bytes"] == prof["bandwidth"]["n_bytes"] and read["bytes_per_s"] > 0
    assert read["method"] != prof["bandwidth"]["method"] and prof["read_probes"] == [read]
    assert ("roofline_findings" in prof) == (roof["share_pct"] > 100)  # a share above 100% is a finding
    assert prof["capture"]["nvidia_gpu_expected"] is False  # conftest sets JAX_PLATFORMS=cpu


def test_reanalysis_of_saved_trace_equals_profile_json(matched, capsys):
    run, prof = matched
    capsys.readouterr()
    assert bench_in_process(["profile", "analyze", str(run), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in ("steps", "categories", "totals", "ops", "ops_total_rows", "roofline", "device", "trace",
                "read_bandwidth"):  # fmt: skip
        assert again[key] == prof[key], key


def test_update_rewrites_the_analysis_and_keeps_what_the_capture_recorded(matched, tmp_path, capsys):
    run, prof = matched
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    capture_notes = prof["capture_notes"]
    assert capture_notes and all(n in prof["notes"] for n in capture_notes)
    stale = {key: value for key, value in prof.items() if key != "capture_notes"}  # as an older profile.json
    stale.update(categories={**prof["categories"], "other": {"pct": 99.0, "ms": 1.0}},
                 notes=["an analysis note of an older classification", *capture_notes])  # fmt: skip
    (copy / "profile.json").write_text(json.dumps(stale))  # as an older classification would have left it
    assert bench_in_process(["profile", "analyze", str(copy), "--update"]) == 0
    assert "rewritten" in capsys.readouterr().out
    updated = json.loads((copy / "profile.json").read_text())
    assert updated["categories"] == prof["categories"]
    assert updated["notes"] == prof["notes"] and updated["capture_notes"] == capture_notes
    for key in ("config", "capture", "bandwidth", "roofline", "trace"):
        assert updated[key] == prof[key], key
    assert updated["reanalysed"]["at"] and set(updated["reanalysed"]["git"]) == {"commit", "dirty"}
    trace = next(copy.glob("profile/**/*.xplane.pb"))
    assert bench_in_process(["profile", "analyze", str(trace), "--update"]) == 2  # a bare trace: no profile.json
    assert "--update" in capsys.readouterr().err


def test_update_reanalyses_the_trace_profile_json_names_not_the_newest(matched, leak, tmp_path, capsys):
    run, prof = matched
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    other = next(leak[0].glob("profile/**/*.xplane.pb"))  # another trace, newer on disk (a copy, a touch, an rsync)
    newer = copy / "profile" / "elsewhere" / other.name
    newer.parent.mkdir(parents=True)
    shutil.copy(other, newer)
    later = time.time() + 60
    os.utime(newer, (later, later))
    assert bench_in_process(["profile", "analyze", str(copy), "--update"]) == 0
    capsys.readouterr()
    updated = json.loads((copy / "profile.json").read_text())
    assert updated["trace"] == prof["trace"]
    for key in ("categories", "totals", "roofline", "notes", "read_bandwidth"):
        assert updated[key] == prof[key], key
    for trace in copy.glob("profile/**/*.xplane.pb"):  # the trace it names is gone: one line naming it
        trace.unlink()
    assert bench_in_process(["profile", "analyze", str(copy), "--update"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--update" in err and prof["trace"] in err and "--run" not in err
    assert json.loads((copy / "profile.json").read_text()) == updated  # nothing written


def test_analyze_prints_the_published_table(matched, capsys):
    run, _ = matched
    trace = next(run.glob("profile/**/*.xplane.pb"))
    capsys.readouterr()
    assert bench_in_process(["profile", "analyze", str(trace)]) == 0
    out = capsys.readouterr().out
    for label in ("dtype conversion", "fp32 gemv", "tensor core", "absent", "total kernel time", "distinct kernels",
                  "device-time rate", "bandwidth", "roofline share"):  # fmt: skip
        assert label in out


def test_leak_one_visible_through_the_cli(leak, matched):
    _, leaky = leak
    _, clean = matched
    assert leaky["config"]["weight_dtype"] == "bfloat16" and leaky["config"]["compute_dtype"] == "float32"
    assert clean["config"]["weight_dtype"] == "float32"
    assert leaky["categories"]["dtype_conversion"]["pct"] > 10.0
    assert clean["categories"]["dtype_conversion"]["pct"] < 2.0


def test_leak_one_is_named_by_the_findings_and_matched_weights_give_none(leak, matched, capsys):
    # bench.profile.findings: the published report's dtype-conversion tax, named without reading the tables
    run, bad = leak
    named = [f for f in bad["findings"] if "parameter rewrite" in f["rules"]]
    assert named and {f["rewrite"]["kind"] for f in named} == {"dtype conversion"}
    assert all(f["rewrite"]["parameter_shape"].startswith("bf16[") and f["rewrite"]["result_shape"].startswith("f32[")
               for f in named)  # fmt: skip
    _, good = matched
    assert not [f for f in good["findings"] if "parameter rewrite" in f["rules"]]
    assert good["findings_rules"]["param_min_share"] > 0
    for row in good["ops"]:  # every top op: its HLO text and the bytes it moves, from the trace's HLO shapes
        assert row["hlo"].startswith(f"%{row['hlo_op']} = ") and row["bytes_source"] == "bytes from shapes"
    capsys.readouterr()
    assert bench_in_process(["profile", "analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"findings: {len(bad['findings'])} (rules: an op moving more than" in out
    assert "finding: " in out and "dtype conversion of parameter" in out and "bytes from shapes" in out


def test_the_cpu_kernels_remove_leak_one_and_the_manifest_names_them(kernels, leak):
    run, prof = kernels
    _, leaky = leak
    assert prof["config"]["weight_dtype"] == "bfloat16" and prof["categories"]["dtype_conversion"]["pct"] < 2.0
    assert prof["config"]["decode_bytes"]["weights"] == leaky["config"]["decode_bytes"]["weights"]
    engine = json.loads((run / "manifest.json").read_text())["engine_config"]
    assert engine["kernel"] == f"{bf16_kernel_name()} {ATTENTION_KERNEL}" and engine["backend"] == "cpu-kernels"
    assert prof["categories"]["attention"]["pct"] > 0  # the attention kernel's calls, by their named scope
    plain = json.loads((leak[0] / "manifest.json").read_text())["engine_config"]
    assert plain["kernel"] is None and plain["backend"] == "jax"


def test_a_profile_joined_to_a_bfloat16_run_takes_its_weight_dtype_and_kernel(kernels, env):
    run, _ = kernels
    code = bench_in_process(["profile", "--steps", str(STEPS), "--checkpoint", "builtin:tiny", "--runs-dir",
                             str(env / "runs"), "--run", str(run), "--replace", "--compile-cache", "off"])  # fmt: skip
    assert code == 0
    prof = json.loads((run / "profile.json").read_text())
    assert prof["config"]["weight_dtype"] == "bfloat16"  # and the run's backend, cpu-kernels: nothing differs
    assert not [n for n in prof["notes"] if "differs" in n], prof["notes"]


def test_profile_replaces_a_runs_profile_only_when_asked(env, tmp_path, capsys):
    run = _profile(env, "addto")
    before = (run / "profile.json").read_bytes()
    again = ["profile", "--steps", "2", "--checkpoint", "builtin:tiny", "--run", str(run), "--compile-cache", "off"]
    capsys.readouterr()
    assert bench_in_process(again) == 2  # nothing already measured is lost without asking
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert "already has a profile" in line and "--replace" in line and "drop --run" in line
    assert (run / "profile.json").read_bytes() == before and not (run / ".lock").exists()
    assert bench_in_process([*again, "--replace"]) == 0
    printed = capsys.readouterr().out
    assert "roofline ceiling" in printed and "measured read" in printed  # the denominator, in the summary table
    ceiling = json.loads((run / "profile.json").read_text())["ceiling"]
    assert ceiling["chosen"] == "measured read" and ceiling["bytes_per_s"] > 0  # a CPU: no datasheet figure
    prof = json.loads((run / "profile.json").read_text())
    assert prof["steps"] == 2
    assert len(list(run.glob("profile/**/*.xplane.pb"))) == 2  # the earlier trace is kept
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"


def test_bandwidth_command(capsys):
    assert bench_in_process(["bandwidth", "--bytes", str(8 * 2**20), "--repeats", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    copy = next(ln for ln in lines if ln.startswith("bandwidth: "))
    (read,) = [ln for ln in lines if ln.startswith("read-only bandwidth: ")]  # a CPU: XLA's read probe alone
    assert "GiB/s" in copy and "GB/s" in copy and "GiB/s" in read and "GB/s" in read and "x the copy" in read
    assert any("16,777,216 bytes moved (read + written)" in ln and "median" in ln for ln in lines)
    assert "; 8 MiB read, median" in read and "jit(x.reshape" in read
    assert "datasheet: none known for cpu" in lines
    (ceiling,) = [ln for ln in lines if ln.startswith("roofline ceiling ")]
    assert "= measured read; the larger of the measured read" in ceiling and "not the denominator" in ceiling


def test_gpu_guess_without_initialising_jax(tmp_path):
    assert nvidia_gpu_expected({"JAX_PLATFORMS": "cpu"})[0] is False
    assert nvidia_gpu_expected({"JAX_PLATFORMS": "cuda,cpu"})[0] is True
    assert nvidia_gpu_expected({"JAX_PLATFORMS": "gpu"})[0] is True


def _bad_inputs(env: Path, matched_run: Path, tmp: Path) -> dict[str, list[str]]:
    not_trace = tmp / "notes.txt"
    not_trace.write_text("hello")
    fake = tmp / "fake.xplane.pb"
    fake.write_bytes(b"\x00garbage")
    no_profile = tmp / "run-without-profile"
    no_profile.mkdir()
    shutil.copy(matched_run / "manifest.json", no_profile / "manifest.json")
    tiny = ["--checkpoint", "builtin:tiny", "--runs-dir", str(tmp / "runs"), "--compile-cache", "off"]
    return {
        "steps 0": ["profile", "--steps", "0", *tiny],
        "input tokens 0": ["profile", "--input-tokens", "0", *tiny],
        "input tokens below the chat minimum": ["profile", "--input-tokens", "5", *tiny],
        "input tokens too many": ["profile", "--input-tokens", "100000", *tiny],
        "weight dtype": ["profile", "--weight-dtype", "int3", *tiny],
        "missing trace": ["profile", "analyze", str(tmp / "nowhere")],
        "not a trace": ["profile", "analyze", str(not_trace)],
        "corrupt trace": ["profile", "analyze", str(fake)],
        "run without profile": ["profile", "analyze", str(no_profile)],
        "missing run": ["profile", "--run", str(tmp / "no-run"), *tiny],
        "replace without run": ["profile", "--replace", *tiny],
        "bandwidth bytes": ["bandwidth", "--bytes", "5"],
        "bandwidth repeats": ["bandwidth", "--repeats", "0"],
    }


def test_bad_input_one_line_exit_2(env, matched, tmp_path, capsys):
    cases = _bad_inputs(env, matched[0], tmp_path)
    for what, args in cases.items():
        capsys.readouterr()
        assert bench_in_process(args) == 2, what
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("device policy:")]
        assert len(lines) == 1, (what, err)
        assert lines[0].startswith("error: ") and "Traceback" not in err, (what, err)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "no run folder for bad input"


def test_gauge_from_the_runs_sweep_cell(env, tmp_path):
    from runfolders import make_measured_run

    from bench.runs import open_run

    run = make_measured_run(tmp_path / "runs", "swept", inputs=(41,), gauge=123.0)
    gauge = open_run(run.path).cells()[0].gauge_tok_s_median
    code = bench_in_process(["profile", "--steps", "2", "--checkpoint", "builtin:tiny", "--run", str(run.path),
                   "--compile-cache", "off"])  # fmt: skip
    assert code == 0
    prof = json.loads((run.path / "profile.json").read_text())
    assert prof["roofline"]["tok_s_source"] == "gauge" and prof["roofline"]["tok_s"] == pytest.approx(gauge)
    assert prof["config"]["prompt"]["tokens"] == 41  # the cell's exact prompt size, built as the sweep builds it
    assert any("sweep gauge" in note for note in prof["notes"])
    assert any("checkpoint" in note and "differs" in note for note in prof["notes"])  # synthetic run, other checkpoint
    assert open_run(run.path).status == "complete"


def _min_prompt_tokens(checkpoint: Path) -> int:
    from bench.measure.prompts import min_prompt_tokens
    from model.tokenizer import GemmaTokenizer

    return min_prompt_tokens(GemmaTokenizer.from_dir(checkpoint))


def test_input_tokens_below_the_smallest_chat_prompt_is_refused_like_the_sweep(env, tiny_checkpoint, tmp_path, capsys):
    minimum = _min_prompt_tokens(tiny_checkpoint)
    runs = tmp_path / "runs"
    capsys.readouterr()
    code = bench_in_process(["profile", "--input-tokens", str(minimum - 1), "--checkpoint", str(tiny_checkpoint),
                   "--runs-dir", str(runs), "--compile-cache", "off"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    for needle in (f"--input-tokens {minimum - 1}", "smallest possible prompt", f"{minimum} tokens",
                   f"--input-tokens {minimum} or more"):  # fmt: skip
        assert needle in line, (needle, line)
    assert not runs.exists() or not any(runs.iterdir())


def test_input_tokens_below_the_minimum_leaves_a_joined_run_as_it_was(env, tiny_checkpoint, tmp_path, capsys):
    from runfolders import make_measured_run

    from bench.runs import open_run

    run = make_measured_run(tmp_path / "runs", "swept", inputs=(41,), gauge=123.0)
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    capsys.readouterr()
    code = bench_in_process(["profile", "--steps", "2", "--input-tokens", "3", "--checkpoint", str(tiny_checkpoint),
                   "--run", str(run.path), "--compile-cache", "off"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--input-tokens 3" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before  # no profile, no lock
    again = open_run(run.path)
    again.lock()  # the refused command released the run's lock
    again.unlock()


# ---- errors name profile's own flags and the values that fit -------------------------------------------------------
def _shape_cases(minimum: int) -> list[tuple[list[str], list[str]]]:
    """(flags, needles) on the tiny checkpoint: 256 positions, prompts up to 256 tokens; a profile after n input
    tokens needs n + 1 + 2 + 1 positions (the prefill's token, 2 warm-up steps, one traced step), whatever --steps
    (the shape never grows with it: test_profile_steps)."""
    return [
        (["--input-tokens", "99999999999999999999999"],
         ["--input-tokens 99999999999999999999999", "--max-length", f"--input-tokens {minimum}..252"]),
        (["--input-tokens", "253"], ["--input-tokens 253", "257 positions", "256", f"--input-tokens {minimum}..252"]),
        (["--input-tokens", "255"], ["--input-tokens 255", f"--input-tokens {minimum}..252"]),
        (["--input-tokens", "100", "--max-length", "64"],
         ["--input-tokens 100", "64 (--max-length)", f"--input-tokens {minimum}..64", "--max-length 100..256"]),
        (["--max-length", "1000"], ["--max-length 1000", "--max-length 1..256"]),
        (["--input-tokens", str(minimum - 1)], [f"--input-tokens {minimum} or more", f"{minimum}..252"]),
    ]  # fmt: skip


def test_shape_errors_name_profiles_own_flags_and_the_range(env, tiny_checkpoint, tmp_path, capsys):
    runs = tmp_path / "runs"
    for flags, needles in _shape_cases(_min_prompt_tokens(tiny_checkpoint)):
        capsys.readouterr()
        code = bench_in_process(["profile", "--checkpoint", str(tiny_checkpoint), "--runs-dir", str(runs),
                       "--compile-cache", "off", *flags])  # fmt: skip
        err = capsys.readouterr().err
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "Traceback" not in err, (flags, err)
        for needle in needles:
            assert needle in errors[0], (flags, needle, errors[0])
        assert "--max-new-tokens" not in errors[0], errors[0]  # a flag of `bench sweep`, not of `bench profile`
    assert not runs.exists()


def test_too_long_a_prompt_is_refused_before_the_weights_load(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """config.json and tokenizer.json decide: no weight is read (the same line as after a load)."""
    import model.engine

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before --input-tokens was checked")

    monkeypatch.setattr(model.engine, "load_engine", no_load)
    minimum = _min_prompt_tokens(tiny_checkpoint)
    code = bench_in_process(["profile", "--input-tokens", "100000", "--checkpoint", str(tiny_checkpoint),
                             "--runs-dir", str(tmp_path / "runs"), "--compile-cache", "off"])  # fmt: skip
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "--input-tokens 100000" in errors[0] and f"--input-tokens {minimum}..252" in errors[0], errors[0]
    assert not (tmp_path / "runs").exists()


# ---- runs a profile may not join -----------------------------------------------------------------------------------
def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _archived(name: str) -> Path:
    if name == "published":
        from runfolders import REFERENCE_RUNS

        return REFERENCE_RUNS[1]
    return Path(__file__).resolve().parents[1] / "runs" / name


@pytest.mark.parametrize(("archived", "needle"), [("published", "published"),
                                                  ("2026-12-02-serve-load-cpu", "against a server"),
                                                  ("2026-12-02-transformers-cpu-cpu", "another engine")])
def test_a_run_a_profile_may_not_join_is_refused_and_nothing_is_written(env, tmp_path, capsys, archived, needle):
    """A published run (its profile is a published figure), a load run (`--target --concurrency`: a server's
    engine) and a peer run (transformers): a profile of the local engine would pair its bytes with their speeds."""
    source = _archived(archived)
    joined = tmp_path / "runs" / source.name
    shutil.copytree(source, joined)
    before = _files(joined)
    capsys.readouterr()
    code = bench_in_process(["profile", "--steps", "2", "--checkpoint", "builtin:tiny", "--run", str(joined),
                             "--compile-cache", "off"])  # fmt: skip
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]  # refused before the engine loads: one line only
    assert code == 2 and line.startswith("error:") and needle in line and "drop --run" in line
    assert _files(joined) == before


def test_make_profile_flow_adds_to_the_latest_sweep_once(env, tmp_path, capsys):
    """`make profile` = `bench profile --steps 20 --run latest`: on a fresh sweep it adds the profile; run again,
    it refuses instead of overwriting it (and says how to replace it)."""
    from runfolders import make_measured_run

    runs = tmp_path / "runs"
    run = make_measured_run(runs, "sweep", inputs=(41,), gauge=50.0)
    args = ["profile", "--steps", "2", "--run", "latest", "--runs-dir", str(runs), "--checkpoint", "builtin:tiny",
            "--compile-cache", "off"]  # fmt: skip
    assert bench_in_process(args) == 0
    prof = (run.path / "profile.json").read_bytes()
    capsys.readouterr()
    assert bench_in_process(args) == 2
    assert "--replace" in capsys.readouterr().err
    assert (run.path / "profile.json").read_bytes() == prof and not (run.path / ".lock").exists()


# ---- however a profile ends, its run is not left running or locked ------------------------------------------------
def _raise(exc):
    def fail(*_args, **_kwargs):
        raise exc

    return fail


@pytest.mark.parametrize("exc,code,status", [(KeyboardInterrupt, 130, "incomplete"), (RuntimeError, None, "failed")])
def test_a_profile_that_stops_marks_its_new_run_and_unlocks_it(env, tiny_checkpoint, tmp_path, monkeypatch, exc,
                                                               code, status):  # fmt: skip
    import bench.profile.analysis

    monkeypatch.setattr(bench.profile.analysis, "analyze_trace", _raise(exc("stopped here")))
    runs = tmp_path / "runs"
    args = ["profile", "--steps", "2", "--checkpoint", str(tiny_checkpoint), "--runs-dir", str(runs), "--name", "cut",
            "--compile-cache", "off"]  # fmt: skip
    if code is None:  # an unexpected error is not a user error: it propagates (a traceback), the run marked failed
        with pytest.raises(exc):
            bench_in_process(args)
    else:
        assert bench_in_process(args) == code
    (run,) = runs.iterdir()
    assert json.loads((run / "manifest.json").read_text())["status"] == status
    assert not (run / ".lock").exists() and not (run / "profile.json").exists()


def test_a_joined_run_keeps_its_status_when_the_profile_stops(env, tiny_checkpoint, tmp_path, monkeypatch):
    from runfolders import make_measured_run

    import bench.profile.capture

    run = make_measured_run(tmp_path / "runs", "swept", inputs=(41,), gauge=123.0)
    monkeypatch.setattr(bench.profile.capture, "capture_steps", _raise(KeyboardInterrupt()))
    code = bench_in_process(["profile", "--steps", "2", "--checkpoint", str(tiny_checkpoint), "--run", str(run.path),
                   "--compile-cache", "off"])  # fmt: skip
    assert code == 130
    assert json.loads((run.path / "manifest.json").read_text())["status"] == "complete"
    assert not (run.path / ".lock").exists() and not (run.path / "profile.json").exists()
    assert "profile incomplete" in (run.path / "run.log").read_text()


def _profile_process(args: list[str]) -> subprocess.Popen:
    code = "import sys; from bench.cli import main; main(sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, "profile", *args], env=dict(os.environ, JAX_PLATFORMS="cpu"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _signal_when(proc: subprocess.Popen, ready, sig: int, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the profile ended before the signal: " + proc.communicate()[1][-2000:]
    proc.send_signal(sig)
    return proc.communicate(timeout=120)[1]


@pytest.mark.slow
def test_sigterm_marks_a_new_profile_run_incomplete_and_unlocks_it(env, tiny_checkpoint, tmp_path):
    runs = tmp_path / "runs"
    proc = _profile_process(["--steps", "200", "--checkpoint", str(tiny_checkpoint), "--runs-dir", str(runs),
                             "--name", "sig", "--compile-cache", "off"])  # fmt: skip
    err = _signal_when(proc, lambda: any(runs.glob("*-sig-*/manifest.json")), signal.SIGTERM)
    assert proc.returncode == 130, err
    (run,) = runs.iterdir()
    assert json.loads((run / "manifest.json").read_text())["status"] == "incomplete", err
    assert not (run / ".lock").exists() and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_leaves_a_joined_run_as_it_was_and_unlocked(env, tiny_checkpoint, tmp_path, sig):
    from runfolders import make_measured_run

    run = make_measured_run(tmp_path / "runs", "swept", inputs=(41,), gauge=123.0)
    before = _files(run.path)
    proc = _profile_process(["--steps", "200", "--checkpoint", str(tiny_checkpoint), "--run", str(run.path),
                             "--compile-cache", "off"])  # fmt: skip
    err = _signal_when(proc, lambda: (run.path / ".lock").exists(), sig)
    assert proc.returncode == 130, err
    assert _files(run.path) == before, err  # status kept, lock gone, nothing else written before the capture


def test_the_category_table_labels_mean_and_typical_step_shares():
    from rich.console import Console

    from bench.cli.profile_cmds import print_profile

    cats = {"matmul_fp32": {"pct": 60.0, "ms": 6.0}, "attention": {"pct": 40.0, "ms": 4.0}}
    data = {"steps": 5, "device": {"platform": "cpu"}, "categories": cats,
            "categories_typical_step": {"matmul_fp32": {"pct": 55.0, "ms": 1.1}, "attention": {"pct": 45.0, "ms": 0.9}},
            "totals": {"device_ms": 10.0, "steps": 5, "distinct_ops": 2, "tok_s": 500.0, "ms_per_step": 2.0,
                       "typical_step_ms": 2.0},
            "ops": []}  # fmt: skip
    console = Console(record=True, width=200)
    print_profile(data, console=console)
    out = console.export_text()
    assert "typical step: each op" not in out  # the title no longer says the whole table is the typical step
    assert "share (all steps)" in out and "ms (all steps)" in out and "share (typical step)" in out
    assert "value (all traced steps)" in out
    line = next(x for x in out.splitlines() if "attention" in x)
    assert "40.0%" in line and "45.0%" in line
