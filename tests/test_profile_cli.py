"""`bench profile`, `bench profile analyze` and `bench bandwidth` through the CLI, on the built-in tiny checkpoint.

The leak-one check: the tiny checkpoint is stored in bfloat16; with the float32 CPU policy and `--weight-dtype
bfloat16` every decode step converts the weights, which the profile must show (measured on this CPU machine: 34-75%
of device time in dtype conversion over 5 steps), while the matched float32 run converts nothing (0.0%).
Commands run in-process through `bench.cli.main` (exit code read from SystemExit), nothing under the home folder:
GEMMA4_BENCH_CACHE points at a temporary folder and the compile cache is off.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.cli import main
from bench.cli.profile_cmds import nvidia_gpu_expected

STEPS = 3


def _bench(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("profile_cli")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMA4_BENCH_CACHE", str(root / "cache"))
        yield root


def _profile(env: Path, name: str, *extra: str) -> Path:
    runs = env / "runs"
    code = _bench(["profile", "--steps", str(STEPS), "--checkpoint", "builtin:tiny", "--runs-dir", str(runs),
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
    """bfloat16 weights, float32 compute: the weights are converted every step."""
    run = _profile(env, "leak", "--weight-dtype", "bfloat16")
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
    assert roof["bandwidth_bytes_s"] == prof["bandwidth"]["bytes_per_s"] > 0
    assert roof["share_pct"] == pytest.approx(100 * roof["bytes_per_step"] * roof["tok_s"] / roof["bandwidth_bytes_s"])
    assert prof["capture"]["nvidia_gpu_expected"] is False  # conftest sets JAX_PLATFORMS=cpu


def test_reanalysis_of_saved_trace_equals_profile_json(matched, capsys):
    run, prof = matched
    capsys.readouterr()
    assert _bench(["profile", "analyze", str(run), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in ("steps", "categories", "totals", "ops", "ops_total_rows", "roofline", "device", "trace"):
        assert again[key] == prof[key], key


def test_analyze_prints_the_published_table(matched, capsys):
    run, _ = matched
    trace = next(run.glob("profile/**/*.xplane.pb"))
    capsys.readouterr()
    assert _bench(["profile", "analyze", str(trace)]) == 0
    out = capsys.readouterr().out
    for label in ("dtype conversion", "fp32 gemv", "tensor core", "absent", "total kernel time", "distinct kernels",
                  "decode gauge", "bandwidth", "roofline share"):  # fmt: skip
        assert label in out


def test_leak_one_visible_through_the_cli(leak, matched):
    _, leaky = leak
    _, clean = matched
    assert leaky["config"]["weight_dtype"] == "bfloat16" and leaky["config"]["compute_dtype"] == "float32"
    assert clean["config"]["weight_dtype"] == "float32"
    assert leaky["categories"]["dtype_conversion"]["pct"] > 10.0
    assert clean["categories"]["dtype_conversion"]["pct"] < 2.0


def test_profile_adds_to_an_existing_run(env, tmp_path):
    run = _profile(env, "addto")
    code = _bench(["profile", "--steps", "2", "--checkpoint", "builtin:tiny", "--run", str(run),
                   "--compile-cache", "off"])  # fmt: skip
    assert code == 0
    prof = json.loads((run / "profile.json").read_text())
    assert prof["steps"] == 2
    assert len(list(run.glob("profile/**/*.xplane.pb"))) == 2


def test_bandwidth_command(capsys):
    assert _bench(["bandwidth", "--bytes", str(8 * 2**20), "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "GiB/s" in out and "GB/s" in out and "16,777,216 bytes moved" in out and "median" in out


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
        "bandwidth bytes": ["bandwidth", "--bytes", "5"],
        "bandwidth repeats": ["bandwidth", "--repeats", "0"],
    }


def test_bad_input_one_line_exit_2(env, matched, tmp_path, capsys):
    cases = _bad_inputs(env, matched[0], tmp_path)
    for what, args in cases.items():
        capsys.readouterr()
        assert _bench(args) == 2, what
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
    code = _bench(["profile", "--steps", "2", "--checkpoint", "builtin:tiny", "--run", str(run.path),
                   "--compile-cache", "off"])  # fmt: skip
    assert code == 0
    prof = json.loads((run.path / "profile.json").read_text())
    assert prof["roofline"]["tok_s_source"] == "gauge" and prof["roofline"]["tok_s"] == pytest.approx(gauge)
    assert prof["config"]["prompt"]["tokens"] == 41  # the cell's exact prompt size, built as the sweep builds it
    assert any("sweep gauge" in note for note in prof["notes"])
    assert any("checkpoint" in note and "differs" in note for note in prof["notes"])  # synthetic run, other checkpoint
    assert open_run(run.path).status == "complete"


def _min_prompt_tokens(checkpoint: Path) -> int:
    from bench.prompts import min_prompt_tokens
    from model.tokenizer import GemmaTokenizer

    return min_prompt_tokens(GemmaTokenizer.from_dir(checkpoint))


def test_input_tokens_below_the_smallest_chat_prompt_is_refused_like_the_sweep(env, tiny_checkpoint, tmp_path, capsys):
    minimum = _min_prompt_tokens(tiny_checkpoint)
    runs = tmp_path / "runs"
    capsys.readouterr()
    code = _bench(["profile", "--input-tokens", str(minimum - 1), "--checkpoint", str(tiny_checkpoint),
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
    code = _bench(["profile", "--steps", "2", "--input-tokens", "3", "--checkpoint", str(tiny_checkpoint),
                   "--run", str(run.path), "--compile-cache", "off"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--input-tokens 3" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before  # no profile, no lock
    again = open_run(run.path)
    again.lock()  # the refused command released the run's lock
    again.unlock()
