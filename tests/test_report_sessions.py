"""Like with like (issue 44 part 4, issue 43's view "quantization on TPU v5e"): the quantization sets of one session
side by side, with accuracy against that session's dense run (ties told apart from errors); every table whose
runs differ in host, build or date names the keys that differ; shares above 100% of a denominator are findings."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from runfolders import MAX_NEW, REPO, cell_samples, manifest

from bench.profile.findings import share_findings
from bench.report import build_report
from bench.report.accuracy import LOGIT_ERROR_BOUNDS, divergence_verdict, dtype_step, set_bound, step_error
from bench.report.groups import Selection
from bench.report.rows import run_keys
from bench.report.sessions import SESSION_GAP_HOURS
from bench.report.tables import load_runs
from bench.runs import create_run, summarize_cell
from bench.runs.logits import read_step_summaries, write_logits, write_step_summary

EPYC, XEON = "AMD EPYC", "Intel(R) Xeon(R) Processor"
IDS = [0, 12, 13, 14, 15, 16, 17, 18]  # dense's first token: the argmax of its logits
TPU_SESSION = ("2026-12-07-tpu-e2b-dense-tpuv5e", "2026-12-07-tpu-e2b-published-tpuv5e", "2026-12-07-tpu-e2b-w4-tpuv5e")


def _run(root: Path, label: str, *, host: str, quant: str, started: str, dense_build: str, gauge: float,
         ids: Sequence[int] = IDS, logits: Sequence[float] | None = None, inputs: Sequence[int] = (41,),
         matmul_share: float | None = None, steps: tuple | None = None) -> str:  # fmt: skip
    """A measured CPU run of `quant` on `host` started at `started` (ISO), its build that of its dense build and
    quantization, its greedy ids `ids` and, given, its next-token logits and per-step summary (`steps`: (ids [S, 2],
    values [S, 2])); returns its folder name."""
    m = manifest(build_id=f"{dense_build[:6]}{abs(hash(quant)) % 10**6:06d}" if quant != "none" else dense_build,
                 config={"buckets": [64, 512], "max_length": 4160, "batch": 1, "quantization": quant,
                         "scale_dtype": None if quant == "none" else "bfloat16"},
                 dtype="bfloat16")  # fmt: skip
    m.update(started_at=started, dense_build_id=dense_build, host={"cpu_model": host, "logical_cpus": 2})
    m["rates"] = {"matmul": {"m": 1536, "n": 1536, "k": 1536, "dtype": "float32", "gflop_s": 100.0}}
    run = create_run(root, label, "cpu", m, date=started[:10])
    for n in inputs:
        samples = cell_samples(n, gauge=gauge, cold=True, token_ids=ids)
        run.append_samples(samples)
        row = summarize_cell(samples, max_new_tokens=MAX_NEW, bucket=64)
        if matmul_share is not None:
            row = dataclasses.replace(row, prefill_flops=10**9, prefill_flop_s=matmul_share * 1e9,
                                      prefill_matmul_share_pct=matmul_share)  # fmt: skip
        if logits is not None:
            write_logits(run.path, n, logits)
        if steps is not None:
            write_step_summary(run.path, n, *steps)
        run.append_cell(row)
    run.finish("complete")
    return run.name


DENSE_LOGITS = [0.5, -0.5, 0.4995, 0.1, -0.2] + [0.0] * 27  # token 0 is dense's top-1; 2 is within a bf16 step


@pytest.fixture()
def two_hosts(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An EPYC session (dense, w8, w4 and a tie-only set, minutes apart), a Xeon session of another build a day later
    (dense, w8), and an EPYC w8 run of the first build three hours after its session: not of it."""
    root = tmp_path / "runs"
    day1, day2 = "2026-12-01T10:", "2026-12-02T09:"
    tie = [2] + IDS[1:]
    names = {
        "dense": _run(root, "dense", host=EPYC, quant="none", started=day1 + "00:00+00:00", dense_build="aaaaaaaaaaaa",
                      gauge=20.0, logits=DENSE_LOGITS),
        "w8": _run(root, "w8", host=EPYC, quant="w8", started=day1 + "05:00+00:00", dense_build="aaaaaaaaaaaa",
                   gauge=30.0, ids=IDS[:3] + [99] + IDS[4:], logits=[x + 0.01 for x in DENSE_LOGITS]),
        "w4": _run(root, "w4", host=EPYC, quant="w4:128", started=day1 + "10:00+00:00", dense_build="aaaaaaaaaaaa",
                   gauge=40.0, ids=[1] + IDS[1:], logits=[0.1, 0.6] + DENSE_LOGITS[2:]),
        "ple8": _run(root, "ple8", host=EPYC, quant="ple8", started=day1 + "12:00+00:00", dense_build="aaaaaaaaaaaa",
                     gauge=22.0, ids=tie, logits=DENSE_LOGITS, matmul_share=150.0),
        "late": _run(root, "late", host=EPYC, quant="w8", started="2026-12-01T13:20:00+00:00",
                     dense_build="aaaaaaaaaaaa", gauge=5.0),
        "xdense": _run(root, "xdense", host=XEON, quant="none", started=day2 + "00:00+00:00", dense_build="bbbbbbbbbbbb",
                       gauge=10.0),
        "xw8": _run(root, "xw8", host=XEON, quant="w8", started=day2 + "04:00+00:00", dense_build="bbbbbbbbbbbb",
                    gauge=12.0),
    }  # fmt: skip
    return root, names


def _all_keys(root: Path) -> dict:
    """RunKeys of every run of `root` (a table's history draws on runs the selection does not show)."""
    views, _ = load_runs(None, root)
    return {v.name: run_keys(v) for v in views}


def _session_tables(report) -> list:
    return [t for t in report.tables if t.kind == "quant-session"]


def test_no_table_of_two_hosts_is_silent_about_it(two_hosts, tmp_path: Path) -> None:
    root, _ = two_hosts
    for selection in (Selection(), Selection(latest_per=("device",))):
        report = build_report(None, tmp_path / "out", runs_dir=root, selection=selection)
        keys = _all_keys(root)
        mixed = [t for t in report.tables if len({keys[n].host for n in t.sources if n in keys}) > 1]
        assert mixed, "the fixture puts runs of two hosts into some table"
        for t in mixed:
            note = next((n for n in t.notes if n.startswith("runs differ in host (")), None)
            assert note is not None and EPYC in note and XEON in note, (t.kind, t.title, t.notes)
        assert all(t.sources for t in report.tables if t.kind not in ("groups", "roofline")), "every table names its runs"


def test_the_quantization_table_compares_one_session_only(two_hosts, tmp_path: Path) -> None:
    root, names = two_hosts
    report = build_report(None, tmp_path / "out", runs_dir=root)
    tables = _session_tables(report)
    assert [set(t.sources) for t in tables] == [{names[k] for k in ("dense", "w8", "w4", "ple8")},
                                                {names["xdense"], names["xw8"]}]  # fmt: skip
    epyc = {r[0]: r for r in tables[0].rows}
    assert epyc["none"][4] == "1.00x" and epyc["w8"][4] == "1.50x" and epyc["w4:128"][4] == "2.00x"
    assert {r[0]: r for r in tables[1].rows}["w8"][4] == "1.20x"  # against the Xeon's own dense run
    assert "host AMD EPYC, dense build aaaaaaaaaaaa, runs started 2026-12-01 10:00..10:12 UTC" in tables[0].title
    assert names["late"] not in tables[0].sources  # 3 h 8 min after the last run of its session
    assert SESSION_GAP_HOURS < 3.1
    md = report.markdown.read_text()
    assert "## Quantization by session" in md and "### Quantization on CPU" in md


def test_ties_are_told_apart_from_errors(two_hosts, tmp_path: Path) -> None:
    root, _ = two_hosts
    report = build_report(None, tmp_path / "out", runs_dir=root)
    rows = {r[0]: r for r in _session_tables(report)[0].rows}
    assert rows["none"][6:] == ["reference", "0 (reference)", "0 (reference)"]
    assert rows["w8"][6:] == ["step 3: undecided", "0.01", "—"]  # dense's logits at step 3 are not stored
    assert rows["w4:128"][6:] == ["step 0: error", "1.1", "—"]  # 0.5 vs -0.5: 1.0 > 2 x 0.44 + a bfloat16 step
    assert rows["ple8"][6:] == ["step 0: tie", "0", "—"]  # 0.5 vs 0.4995: within 2 x 0.0053 + a bfloat16 step
    md = report.markdown.read_text()
    assert ("ple8, 41 input tokens: diverges at step 0 (2 vs dense 0); in dense's logits the gap between them is "
            "0.0005 <= 2 x the bound 0.0053 + one bfloat16 step at 0.5 (0.01451): a tie") in md
    assert "w4:128, 41 input tokens: diverges at step 0 (1 vs dense 0)" in md and "an error, not a tie" in md


def test_the_tie_rule() -> None:
    assert dtype_step(0.5, "bfloat16") == 2**-8 and dtype_step(0.4999, "bfloat16") == 2**-9
    assert dtype_step(-3.0, "bfloat16") == 2**-6 and dtype_step(1.0, "float32") == 2**-23
    assert dtype_step(0.5, None) == dtype_step(0.5, "bfloat16")
    logits = [0.5, 0.4961, 0.49]
    assert divergence_verdict(0, 0, 1, logits, "bfloat16")[0] == "tie"  # 0.0039 <= 2^-8
    assert divergence_verdict(0, 0, 2, logits, "bfloat16")[0] == "error"  # 0.01 > 2^-8
    assert divergence_verdict(0, 0, 1, logits, "float32")[0] == "error"  # float32 tells them apart
    assert divergence_verdict(5, 0, 1, logits, "bfloat16")[0] == "undecided"
    assert divergence_verdict(0, 0, 1, None, "bfloat16")[0] == "undecided"


def _steps(ids: Sequence[int], chosen: Sequence[float], runner: Sequence[int], runner_v: Sequence[float]) -> tuple:
    """(ids [S, 2], values [S, 2]) of a per-step summary."""
    return [list(p) for p in zip(ids, runner, strict=True)], [list(v) for v in zip(chosen, runner_v, strict=True)]


@pytest.fixture()
def step_session(tmp_path: Path) -> Path:
    """One session whose runs store per-step summaries: dense (IDS, chosen logits 1.0; runner-up 40 at 0.9 at step
    3, 41 at 0.0 at step 2, 50 at 0.5 elsewhere); w4:128 diverging at step 3 to dense's runner-up (gap 0.1: a tie
    within 2 x 0.44); w8 diverging at step 2 to dense's runner-up (gap 1.0 > 2 x 0.038: an error); ple4 diverging
    at step 5 to a token that is not dense's runner-up while even that one is 0.5 below (> 2 x 0.087: an error);
    ple8 equal to dense throughout, its logits 0.003 above. w8's step 2 ranks 41 (0.1) over 13 (0.05)."""
    root, day = tmp_path / "runs", "2026-12-01T10:"
    s = len(IDS)
    runner = [50, 50, 41, 40] + [50] * (s - 4)
    runner_v = [0.5, 0.5, 0.0, 0.9] + [0.5] * (s - 4)
    dense = _steps(IDS, [1.0] * s, runner, runner_v)

    def run(label, quant, minute, ids, steps):
        _run(root, label, host=EPYC, quant=quant, started=f"{day}{minute:02d}:00+00:00", dense_build="cccccccccccc",
             gauge=20.0, ids=ids, logits=DENSE_LOGITS, steps=steps)

    run("dense", "none", 0, IDS, dense)
    w4_ids = IDS[:3] + [40] + IDS[4:]  # step 3: q's 40 at 0.97, dense's 14 its runner-up at 0.95
    run("w4", "w4:128", 2, w4_ids, _steps(w4_ids, [1.05] * 3 + [0.97] + [1.0] * (s - 4), runner[:3] + [14] + runner[4:],
                                          runner_v[:3] + [0.95] + runner_v[4:]))
    w8_ids = IDS[:2] + [41] + IDS[3:]
    run("w8", "w8", 4, w8_ids, _steps(w8_ids, [1.0, 1.0, 0.1] + [1.0] * (s - 3), runner[:2] + [13] + runner[3:],
                                      runner_v[:2] + [0.05] + runner_v[3:]))  # step 2: q's 41 at 0.1, 13 at 0.05
    ple4_ids = IDS[:5] + [77] + IDS[6:]
    run("ple4", "ple4", 6, ple4_ids, _steps(ple4_ids, [1.0] * s, runner, runner_v))
    run("ple8", "ple8", 8, IDS, _steps(IDS, [1.003] * s, runner, [v + 0.003 for v in runner_v]))
    return root


def test_divergences_after_step_0_are_ties_or_errors_from_the_stored_steps(step_session: Path, tmp_path: Path) -> None:
    report = build_report(None, tmp_path / "out", runs_dir=step_session)
    (table,) = _session_tables(report)
    rows = {r[0]: r for r in table.rows}
    assert rows["w4:128"][6] == "step 3: tie"  # gap 0.1 <= 2 x 0.44 + a bfloat16 step
    assert rows["w8"][6] == "step 2: error"  # gap 1.0 > 2 x 0.038 + a bfloat16 step
    assert rows["ple4"][6] == "step 5: error"  # 77 is not dense's runner-up, and that one is 0.5 below already
    assert rows["ple8"][6] == f"none ({len(IDS)} of {len(IDS)})"
    # the agreeing steps' error: w4 0.05 at steps 0-2, 0.07 at step 3 (token 40: 0.97 vs 0.9); ple8 0.003 throughout
    assert rows["w4:128"][8] == "0.07 over 4 steps (bound 0.44)"
    assert rows["ple8"][8] == f"0.003 over {len(IDS)} steps (bound 0.0053)"
    assert rows["w8"][8] == "0.95 over 3 steps (bound 0.038 OVER)"  # step 2: token 13, 1.0 vs 0.05
    md = report.markdown.read_text()
    assert ("w4:128, 41 input tokens: diverges at step 3 (40 vs dense 14); in dense's step-3 logits the gap between "
            "them is 0.1 <= 2 x the bound 0.44 + one bfloat16 step at 1 (0.8878): a tie") in md
    assert "w8, 41 input tokens: diverges at step 2 (41 vs dense 13)" in md and "an error, not a tie" in md
    assert "even the runner-up 50 is 0.5 below dense's token" in md


def test_the_step_summaries_round_trip_and_the_rule_reads_them(tmp_path: Path) -> None:
    ids, values = _steps([3, 5], [1.25, -0.5], [7, 2**24 - 1], [1.0, -0.75])
    write_step_summary(tmp_path, 41, ids, values)
    (summary,) = read_step_summaries(tmp_path).values()
    assert summary.chosen == (3, 5) and summary.runner_up == (7, 2**24 - 1)
    assert summary.chosen_logit == (1.25, -0.5) and summary.margin(0) == 0.25 and summary.logit_of(1, 9) is None
    with pytest.raises(ValueError):
        write_step_summary(tmp_path, 41, [[3, 2**24]], [[1.0, 0.5]])  # not exact in float32
    with pytest.raises(ValueError):
        write_step_summary(tmp_path, 41, [[3, 4]], [[float("nan"), 0.5]])
    assert set_bound("w4:128,ple4,int8_lm_head") == pytest.approx(0.44 + 0.087 + 0.0057)
    assert set_bound("none") == 0 == set_bound(None) and set_bound("w8") == LOGIT_ERROR_BOUNDS["tiny"]["w8"]
    # b not dense's runner-up while the margin is within the threshold: undecided; beyond it: an error
    assert divergence_verdict(0, 3, 9, None, "bfloat16", bound=0.44, dense_steps=summary)[0] == "undecided"
    assert divergence_verdict(0, 3, 9, None, "float32", bound=0.01, dense_steps=summary)[0] == "error"
    assert divergence_verdict(0, 3, 7, None, "float32", bound=0.2, dense_steps=summary)[0] == "tie"
    assert divergence_verdict(2, 3, 7, None, "float32", bound=0.2, dense_steps=summary)[0] == "undecided"  # past S
    assert step_error(summary, summary, 2) == (0.0, 2)


def test_shares_above_100_are_findings_with_the_probes_numbers(two_hosts, tmp_path: Path) -> None:
    root, names = two_hosts
    report = build_report(None, tmp_path / "out", runs_dir=root)
    found = [f for f in report.findings if "prefill matmul share 150.0% above 100" in f]
    assert found and "the matrix-product probe's 100.0 GFLOP/s (1536x1536x1536 float32" in found[0]
    assert "150.0 GFLOP/s" in found[0]
    old = {"roofline": {"bytes_per_step": 4565044294, "tok_s": 120.95, "tok_s_source": "gauge",
                        "bandwidth_bytes_s": 545174291261.9, "share_pct": 101.28}}  # a profile of 2026-12-05
    (line,) = share_findings(old)
    assert line.startswith("finding: profile roofline share 101.3% above 100% of its denominator")
    assert "4.565 GB x 120.95 tok/s (the joined sweep's gauge) = 514.2 GiB/s" in line and "507.7 GiB/s (545.2 GB/s)" in line
    assert share_findings({"roofline_findings": [{"line": "finding: recorded"}], **old}) == ["finding: recorded"]
    assert share_findings({"roofline": {**old["roofline"], "share_pct": 90.0}}) == []
    assert share_findings({}) == []


def _archived_session(names: Sequence[str], tmp_path: Path):
    """The report of archived runs read where they lie (skipped where the checkout lacks them): (report, its one
    quantization-session table, that table's rows by set)."""
    runs = [REPO / "runs" / n for n in names]
    if not all(r.is_dir() for r in runs):
        pytest.skip("the archived TPU runs are not in this checkout")
    report = build_report(runs, tmp_path / "out")
    (table,) = _session_tables(report)
    return report, table, {r[0]: r for r in table.rows}


def test_the_archived_tpu_session_renders(tmp_path: Path) -> None:
    """Issue 43's view on the three archived runs of 2026-12-07 (dense, published, w4), read where they lie."""
    report, table, rows = _archived_session(TPU_SESSION, tmp_path)
    assert list(rows) == ["none", "int8_lm_head,ple4", "w4:128"]
    assert rows["none"][2:6] == ["4,565,044,294", "161.51 (161.48–161.51)", "1.00x", "90.0"]
    assert rows["int8_lm_head,ple4"][4:7] == ["1.08x", "88.6", "step 3: undecided"]
    assert rows["w4:128"][4:8] == ["1.66x", "58.9", "step 0: tie", "0.314"]  # 0.1308 <= 2 x 0.44 + a step
    assert any("= datasheet" in n and "819 GB/s" in n for n in table.notes)  # the ceiling, named
    md = report.markdown.read_text()
    assert "### Quantization on TPU v5 lite (TPU v5e)" in md  # the chip as jax names it, and as its datasheet does
    assert "the gap between them is 0.1308 <= 2 x the bound 0.44 + one bfloat16 step at 0.4999 (0.882): a tie" in md


def test_a_tiling_policy_pair_gives_two_rows_of_one_quantization(tmp_path: Path) -> None:
    """The archived late TPU session of 2026-12-07: dense and `w4` under two kernel options (the tiling policies'
    pair), and a profile under one: each option its own row (the later run does not hide the earlier), the profile's
    findings under its own option's row, the bound read from the quantization."""
    names = ["2026-12-07-tpu-w4nat-dense-41-tpuv5e", "2026-12-07-tpu-w4nat-steps-41-tpuv5e",
             "2026-12-07-tpu-w4nat-fewest-1-tpuv5e", "2026-12-07-tpu-w4nat-steps-profile-tpuv5e"]  # fmt: skip
    report, table, rows = _archived_session(names, tmp_path)
    assert list(rows) == ["none", "w4:128 (w4a16=pallas)", "w4:128 (w4a16=pallas:steps)"]
    assert rows["w4:128 (w4a16=pallas:steps)"][3:5] == ["326.26 (325.89–326.36)", "2.02x"]
    assert rows["w4:128 (w4a16=pallas)"][3:5] == ["321.95 (321.72–322.11)", "1.99x"]
    assert all(r[6] == "step 0: tie" for q, r in rows.items() if q != "none")  # the w4 bound, not "unknown set"
    md = report.markdown.read_text()
    assert "w4:128 (w4a16=pallas:steps) (2026-12-07-tpu-w4nat-steps-profile-tpuv5e): multiply_reduce_fusion" in md
    assert "w4:128 (w4a16=pallas): no profile in this session" in md


def test_the_repositorys_own_report_names_every_host_it_mixes(tmp_path: Path) -> None:
    """`make report` on runs/ (read in place): no table sets runs of two hosts side by side without saying so."""
    report = build_report(None, tmp_path / "out", runs_dir=REPO / "runs", selection=Selection(latest_per=("device",)))
    keys = _all_keys(REPO / "runs")
    for t in report.tables:
        hosts = {keys[n].host for n in t.sources if n in keys}
        if len(hosts) > 1:
            assert any(n.startswith("runs differ in host (") for n in t.notes), (t.kind, t.title)
    for t in _session_tables(report):
        assert len({keys[n].host for n in t.sources}) == 1, t.title


def test_a_selection_of_one_set_shows_no_quantization_table(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for name in TPU_SESSION:
        if not (REPO / "runs" / name).is_dir():
            pytest.skip("the archived TPU runs are not in this checkout")
        shutil.copytree(REPO / "runs" / name, root / name)
    report = build_report(None, tmp_path / "out", runs_dir=root, selection=Selection(where={"quant": "w4:128"}))
    assert not _session_tables(report)  # the selection left one set: nothing to set side by side


def test_each_sets_profile_findings_stand_under_its_session(two_hosts, tmp_path: Path) -> None:
    root, names = two_hosts
    finding = {"rules": ["bytes share"], "op": "copy.191", "module": "jit__decode_program", "category": "copies",
               "hlo": "%copy.191 = u8[262144,4480]{1,0:T(8,128)(4,1)} copy(u8[262144,4480] %p)",
               "bytes_per_step": 2.34e9, "bytes_source": "the trace's bytes", "step_bytes": 4.163e9,
               "step_bytes_source": "the roofline's bytes per step", "share_of_step_bytes": 0.562,
               "ms_per_step": 3.57, "pct_time": 38.4, "rewrite": None}  # fmt: skip
    profile = {"schema_version": 1, "steps": 20, "categories": {"other": {"pct": 100.0, "ms": 20.0}},
               "totals": {"device_ms": 20.0, "steps": 20, "ms_per_step": 1.0, "tok_s": 1000.0, "distinct_ops": 3},
               "roofline": {"bytes_per_step": 4.163e9, "tok_s": 1000.0, "tok_s_source": "profile",
                            "bandwidth_bytes_s": 1e12, "share_pct": 416.3},
               "findings": [finding]}  # fmt: skip
    (root / names["ple8"] / "profile.json").write_text(json.dumps(profile))
    md = build_report(None, tmp_path / "out", runs_dir=root).markdown.read_text()
    session = md.split("### Quantization on CPU")[1].split("### ")[0]
    assert f"- ple8 ({names['ple8']}): copy.191 (jit__decode_program); moves 2.340 GB per step" in session
    assert f"- ple8 ({names['ple8']}): finding: profile roofline share 416.3% above 100% of its denominator" in session
    assert "(the device-time rate, 1000 / device ms per step)" in session
    assert "- none: no profile in this session" in session
