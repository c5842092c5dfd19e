"""Calibrations of a host's noise between runs and the rules that choose one (docs/method.md, "Rerun intervals"):
the same host, refusals with their reasons (worker mode, loaded, stale, thin), the nearest in time; the rerun
interval and the agreement rule that uses it; the machine id a run records; `bench compare`'s choice in its verdict
line. No engine, no jax: synthetic run folders."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import bench_captured
from runfolders import make_measured_run, make_sample, manifest

from bench.runs import summarize_cell
from bench.runs.agreement import (
    RERUN_KEY,
    WITHIN_ONLY,
    Drift,
    Widening,
    agreement,
    state,
    sweep_drift,
    widening_of,
)
from bench.runs.calibration import (
    MAX_AGE_DAYS,
    MAX_NOISE_PCT,
    Calibration,
    HostKey,
    candidates,
    choose,
)
from bench.runs.environment import machine_id

T0 = datetime.fromisoformat("2026-12-07T21:00:00+00:00")
EPYC = HostKey(machine_id=None, device_kind="cpu", cpu_model="AMD EPYC", logical_cpus=2)


def run_manifest(host: HostKey = EPYC, at: datetime = T0) -> dict:
    return {"started_at": at.isoformat(), "device": {"device_kind": host.device_kind},
            "host": {"cpu_model": host.cpu_model, "logical_cpus": host.logical_cpus,
                     "machine_id": host.machine_id}}  # fmt: skip


def cal(name: str, *, hours: float = -1.0, noise: float = 10.0, ratios: int = 8, host: HostKey = EPYC,
        refusal: str | None = None, gap_s: float = 600.0) -> Calibration:  # fmt: skip
    return Calibration(kind="sweep pair", runs=(f"{name}-a", f"{name}-b"), ratios=(1.0,) * ratios, noise_pct=noise,
                       at=T0 + timedelta(hours=hours), gap_s=gap_s, host=host, refusal=refusal)  # fmt: skip


# ---- the choice rules ----------------------------------------------------------------------------------------------
def test_the_nearest_usable_calibration_of_the_same_host_is_chosen_and_says_why() -> None:
    found = [cal("far", hours=-30), cal("near", hours=-2), cal("later", hours=+1.5)]
    choice = choose(found, run_manifest())
    assert choice.chosen.name == "later-a + later-b"  # nearest either side (compare reads archived runs)
    assert "the same host model (AMD EPYC, 2 CPUs, device cpu" in choice.why and "1.5 hours after the run" in choice.why
    assert "the nearest of 3 usable" in choice.why and choice.refused == ()
    # at a sweep's end only those measured before it began count
    assert choose(found, run_manifest(), before=True).chosen.name == "near-a + near-b"
    # a tie in time goes to the pair whose sessions are closer together
    tie = [cal("wide", hours=-2, gap_s=7200.0), cal("close", hours=-2, gap_s=300.0)]
    assert choose(tie, run_manifest()).chosen.name == "close-a + close-b"


def test_loaded_stale_thin_and_worker_mode_calibrations_are_refused_with_the_reason() -> None:
    found = [
        cal("loaded", hours=-1, noise=MAX_NOISE_PCT + 0.1),
        cal("stale", hours=-24 * (MAX_AGE_DAYS + 0.5)),
        cal("thin", hours=-1, ratios=2),
        cal("workers", hours=-1, refusal="worker mode: it pairs requests seconds apart in warm processes, not runs"),
        cal("ok", hours=-5),
    ]
    choice = choose(found, run_manifest())
    assert choice.chosen.name == "ok-a + ok-b"
    why = dict(choice.refused)
    assert why["loaded-a + loaded-b"] == "its noise +-25.1% is above 25%: a loaded period"
    assert why["stale-a + stale-b"] == "7.5 days from the run, more than 7 days"
    assert why["thin-a + thin-b"] == "2 ratio(s): a calibration needs at least 3"
    assert why["workers-a + workers-b"].startswith("worker mode")
    assert "refused: " in choice.line() and "a loaded period" in choice.line()
    alone = choose(found[:1], run_manifest())
    assert alone.chosen is None and alone.short() == "no calibration: none of this host usable"
    assert alone.noise_pct is None


def test_another_host_never_calibrates_and_a_machine_id_decides_where_both_have_one() -> None:
    xeon = HostKey(machine_id=None, device_kind="cpu", cpu_model="Intel Xeon", logical_cpus=2)
    four = HostKey(machine_id=None, device_kind="cpu", cpu_model="AMD EPYC", logical_cpus=4)
    choice = choose([cal("xeon", host=xeon), cal("four", host=four)], run_manifest())
    assert choice.chosen is None and choice.others == 2 and "none recorded for this host (AMD EPYC" in choice.why
    mine, other = (HostKey(machine_id=m, device_kind="cpu", cpu_model="AMD EPYC", logical_cpus=2) for m in "ab")
    assert choose([cal("other", host=other)], run_manifest(mine)).chosen is None  # same model, another machine
    same = choose([cal("same", host=mine)], run_manifest(mine))
    assert same.chosen is not None and same.why.startswith("the same machine (machine id)")
    # one side without a machine id (a run from before they were recorded): the host model decides, said so
    older = choose([cal("older", host=EPYC)], run_manifest(mine))
    assert older.chosen is not None and "machine id not recorded by both runs" in older.why
    assert choose([cal("own", host=EPYC)], run_manifest(), exclude=("own-b",)).chosen is None  # a run under test


def test_machine_id_is_a_hash_of_the_first_id_file(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "id").write_text("0123456789abcdef0123456789abcdef\n")
    got = machine_id([tmp_path / "missing", tmp_path / "empty", tmp_path / "id"])
    assert got is not None and len(got) == 16 and int(got, 16) >= 0 and "0123456789abcdef" not in got
    assert machine_id([tmp_path / "missing"]) is None


# ---- calibrations found in a runs folder ----------------------------------------------------------------------------
def _sweep(runs: Path, label: str, gauge: float, minutes: int, more: dict | None = None, **kwargs):
    at = (T0 + timedelta(minutes=minutes)).isoformat()
    run = make_measured_run(runs, label, gauge=gauge, started_at=at, status="running", **kwargs)
    run.update_manifest(command="sweep", **(more or {}))
    run.finish("complete")
    return run


def test_two_sweeps_of_one_build_and_host_are_a_sweep_pair(tmp_path: Path) -> None:
    a = _sweep(tmp_path, "a", 20.0, 0)
    b = _sweep(tmp_path, "b", 22.0, 10)
    _sweep(tmp_path, "other-config", 30.0, 20, config={"buckets": [64], "max_length": 72})
    _sweep(tmp_path, "other-build", 30.0, 30, build_id="ffffffffffff")
    _sweep(tmp_path, "via-server", 30.0, 40, more={"target": {"url": "http://server"}})  # its host: the client's
    _sweep(tmp_path, "slowed", 18.0, 50, more={"test_injection": {"decode_delay_ms": 5.0}})  # a change, not noise
    (pair,) = candidates(tmp_path)
    assert pair.kind == "sweep pair" and pair.runs == (a.name, b.name) and pair.gap_s == 600.0
    assert pair.ratios == pytest.approx((1.1,) * 2)  # 2 cells x the host loop's gauge (no device loop here)
    assert pair.noise_pct == pytest.approx(100 * (1.1**1.959963984540054 - 1))
    assert candidates(tmp_path / "missing") == []


# ---- rerun intervals and the agreement rule --------------------------------------------------------------------------
def _row(n: int, gauges: tuple[float, ...]):
    return summarize_cell([make_sample(n, "timed", r, n=4, gauge=g) for r, g in enumerate(gauges)], max_new_tokens=4)


def test_the_rerun_interval_is_the_hull_of_its_measured_widenings() -> None:
    drift = Drift(probe="read", probes=4, low=0.8, high=1.05)
    assert Widening(drift=None).interval(20.0, 19.0, 21.0) == (19.0, 21.0)
    assert Widening(drift=None).sources() == WITHIN_ONLY
    assert Widening(drift=drift).interval(20.0, 19.0, 21.0) == (pytest.approx(16.0), 21.0)
    chosen = choose([cal("c", noise=25.0)], run_manifest())
    wide = Widening(drift=drift, calibration=chosen)
    assert wide.interval(20.0, 19.0, 21.0) == (pytest.approx(16.0), pytest.approx(25.0))
    assert "read probe -20.0%..+5.0%" in wide.sources() and "calibration sweep pair c-a + c-b" in wide.sources()
    none = Widening(drift=None, calibration=choose([], run_manifest()))
    assert none.sources().startswith(WITHIN_ONLY + " (none recorded for this host")


def test_rerun_agreement_asks_each_median_inside_the_others_interval() -> None:
    a, b = [_row(41, (20.0, 20.2, 20.4))], [_row(41, (22.0, 22.2, 22.4))]  # 10% apart, disjoint ranges
    narrow = Widening(drift=Drift(probe="read", probes=3, low=0.98, high=1.02))
    calibrated = Widening(drift=narrow.drift, calibration=choose([cal("c", noise=12.0)], run_manifest()))
    (found,) = agreement(a, b, calibrated, calibrated)
    assert not found.agree and found.rerun_agree and not found.drift_agree
    assert "within-sweep DISAGREE, rerun agree (probes alone: DISAGREE)" in found.line
    (tight,) = agreement(a, b, *(Widening(drift=narrow.drift, calibration=choose([cal("c", noise=5.0)],
                                                                                 run_manifest())),) * 2)  # fmt: skip
    assert tight.rerun_agree is False  # 10% apart: outside +-5%, although the intervals overlap
    assert tight.rerun_a[1] > tight.rerun_b[0]
    (plain,) = agreement(a, b)
    assert plain.rerun_agree is None and "rerun" not in plain.line


def test_a_sweep_states_its_rerun_intervals_in_its_manifest(tmp_path: Path) -> None:
    probes = [{"session": 0, "after_round": r, "read_bytes_s": v, "copy_bytes_s": 2 * v}
              for r, v in enumerate((10.0, 8.0, 10.5))]  # fmt: skip
    assert sweep_drift({"rates": {"probes": probes}}) == Drift(probe="read", probes=3, low=0.8, high=1.05)
    assert sweep_drift({"rates": {"probes": probes[:1]}}) is None and sweep_drift({}) is None
    three = {"inputs": (41, 521, 2057)}  # 3 cells: 3 ratios, the fewest a calibration takes
    _sweep(tmp_path, "earlier-1", 20.0, -120, **three)
    _sweep(tmp_path, "earlier-2", 20.0 * 1.04, -110, **three)
    run = make_measured_run(tmp_path, "now", started_at=T0.isoformat(), status="running")
    run.update_manifest(rates={"probes": probes})
    lines = state(run)
    record = run.manifest[RERUN_KEY]
    assert record["calibration"]["chosen"]["runs"] == [p.name for p in sorted(tmp_path.iterdir())[:2]]
    assert record["drift"] == {"probe": "read", "probes": 3, "low": 0.8, "high": 1.05}
    first = record["cells"][0]
    assert first["figure"] == "gauge" and first["within"][0] <= first["median"] <= first["within"][1]
    assert first["rerun"][0] == pytest.approx(0.8 * first["median"])  # the probe's low end is the widest below
    assert lines[0].startswith("rerun intervals (where a rerun of this build on this host is stated to land")
    assert "calibration sweep pair" in lines[0] and lines[1].startswith("  41 gauge: ")
    again = widening_of(run)  # read back from what the run stated
    assert again.calibration.chosen.runs == tuple(record["calibration"]["chosen"]["runs"])


def test_compare_names_its_calibration_and_never_calibrates_with_the_compared_runs(tmp_path: Path, capsys) -> None:
    base = _sweep(tmp_path, "base", 20.0, 0)
    cand = _sweep(tmp_path, "cand", 20.0, 10)  # with base, a sweep pair: never a calibration of their own compare
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path), "--runs-dir", str(tmp_path)], capsys)
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert code == 0 and "no calibration: none recorded for this host (Test CPU, 2 CPUs, device cpu)" in verdict
    loaded = [_sweep(tmp_path, f"loaded-{k}", g, 20 + k, inputs=(41, 521, 2057))
              for k, g in enumerate((20.0, 30.0, 14.0))]  # fmt: skip
    code, out, _ = bench_captured(["compare", str(base.path), str(cand.path), "--runs-dir", str(tmp_path)], capsys)
    verdict = " ".join(out.split()[out.split().index("verdict:"):])  # the line, unwrapped
    assert f"{loaded[0].name} + {loaded[1].name} (its noise" in verdict and "a loaded period" in verdict
    assert "no calibration: none of this host usable" in verdict
    assert manifest()["host"]["cpu_model"] == "Test CPU"


def test_the_agreement_command_reports_both_kinds_and_exits_by_the_rerun_intervals(tmp_path: Path, capsys) -> None:
    from bench.runs.agreement import main

    three = {"inputs": (41, 521, 2057)}
    c1 = _sweep(tmp_path, "cal-1", 20.0, -300, **three)
    c2 = _sweep(tmp_path, "cal-2", 20.0 * 1.06, -290, **three)  # a calibration of +-12%: 6% between its sessions
    a = _sweep(tmp_path, "a", 20.0, 0, **three)
    b = _sweep(tmp_path, "b", 20.0 * 1.08, 10, **three)  # 8% apart: disjoint repeat ranges (+-1% jitter)
    assert main([str(a.path), str(b.path)]) == 0
    out = capsys.readouterr().out
    assert "within-sweep intervals (min–max of the timed repeats, agree = overlap): 0 of 3 agree" in out
    assert "rerun intervals, the sweeps' probes alone (agree = each median inside the other's): 0 of 3 agree" in out
    assert "rerun intervals, probes and calibration (agree = each median inside the other's): 3 of 3 agree" in out
    assert "chosen now: the run stated none" in out
    assert f"calibration sweep pair {c1.name} + {c2.name}" in out  # never a pair holding a or b
    # with no calibration to be had (another runs folder), 8% apart is a disagreement
    assert main([str(a.path), str(b.path), "--runs-dir", str(tmp_path / "none")]) == 1
    assert "within-sweep only: no calibration for this host" in capsys.readouterr().out
    assert main([str(a.path)]) == 2 and "expected two run folders" in capsys.readouterr().out
