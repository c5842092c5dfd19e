"""Interleaved sweeps (docs/method.md, "Interleaving"): every cell warmed up first, then repeat r of every cell and
loop before repeat r + 1 of any; the rate probes between rounds and each cell's rates from the probes around it;
a stop or a kill mid-round resumed without losing a measured request; the host-movement line; the within-sweep interval
and the agreement rule of two runs. No engine: `sweep_cells` with a fake request (fast tier), except the last test
(two short sweeps of the default preset: heavy)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from runfolders import make_sample, manifest

from bench.errors import InputError
from bench.measure.request import Measured
from bench.runs import CellRow, create_run, open_run, summarize_cell, validate_run, writing_run
from bench.runs.agreement import agreement, disjoint_chance, spread_pct, with_spreads
from bench.runs.ceiling import roofline_ceiling
from bench.runs.manifest import COPY_END_KEY, RATES_KEY
from bench.sweep.local import SweepConfig, parse_order, recorded_order, sweep_cells
from bench.sweep.rates import HOST_KEY, PROBES_KEY, DeviceRates, RoundProbes, host_movement

PROMPTS = {20: "p20", 41: "p41"}


def fake_measure(calls: list, *, stop_after: tuple | None = None, stop: list | None = None, fail: tuple | None = None,
                 gauge=lambda n, kind, repeat: 20.0):  # fmt: skip
    """A request of the prompt's size at bucket 64, recorded in `calls` as (n, kind, repeat). With `stop_after`
    (n, kind, repeat) the stop flag `stop` is set once that request came back; with `fail` (n, kind, repeat) that
    request raises (a failing cell)."""

    def measure(prompt, kind, repeat):
        n = int(prompt[1:])
        calls.append((n, kind, repeat))
        if (n, kind, repeat) == fail:
            raise MemoryError("out of memory at this cell")
        if stop_after == (n, kind, repeat):
            stop.append(signal.SIGINT)
        return Measured(sample=make_sample(n, kind, repeat, n=4, gauge=gauge(n, kind, repeat)), bucket=64)

    return measure


def _run(tmp_path: Path, label: str = "inter"):
    return create_run(tmp_path, label, "cpu", manifest())


def test_repeats_run_round_robin_after_every_warm_up_and_the_probes_between_rounds(tmp_path: Path) -> None:
    calls, probes = [], []
    config = SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=2, decode_loops=("host", "device"),
                         order="interleaved")  # fmt: skip
    run = _run(tmp_path)
    rows = sweep_cells(config, run, PROMPTS, measure=fake_measure(calls),
                       probe=lambda r, cells, last=False: probes.append((r, cells, last)))
    warm = [(20, "cold", 0), (20, "warmup", 0), (20, "warmup-device", 0), (41, "warmup", 0), (41, "warmup-device", 0)]
    rounds = [(n, kind, r) for r in (0, 1) for n in (20, 41) for kind in ("timed", "timed-device")]
    assert calls == warm + rounds
    assert probes == [(0, [], False), (1, [(20, 1), (41, 1)], False), (2, [(20, 1), (41, 1)], False), (2, [], True)]
    assert [(r.repeats, r.device_repeats, r.partial) for r in rows] == [(2, 2, False), (2, 2, False)]
    assert recorded_order(open_run(run.path)) == "interleaved"  # the manifest says which order ran
    assert rows[0].gauge_spread_pct == 0.0 and rows[0].device_gauge_spread_pct == 0.0  # equal repeats: no width

    sequential = _run(tmp_path, "seq")
    calls.clear()
    sweep_cells(SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=2, order="sequential"), sequential, PROMPTS,
                measure=fake_measure(calls),
                probe=lambda *_: pytest.fail("a sequential sweep takes no round probes"))  # fmt: skip
    assert calls == [(20, "cold", 0), (20, "warmup", 0), (20, "timed", 0), (20, "timed", 1), (41, "warmup", 0),
                     (41, "timed", 0), (41, "timed", 1)]  # fmt: skip
    assert recorded_order(open_run(sequential.path)) == "sequential"


def test_a_stop_mid_round_keeps_every_cell_partial_and_resume_completes_the_missing_repeats(tmp_path: Path) -> None:
    config = SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=3, order="interleaved")
    stop: list = []
    with pytest.raises(KeyboardInterrupt):
        with writing_run(lambda: _run(tmp_path)) as run:
            sweep_cells(config, run, PROMPTS, measure=fake_measure([], stop_after=(20, "timed", 1), stop=stop),
                        should_stop=lambda: bool(stop))  # fmt: skip
    run = open_run(run.path)
    assert run.status == "incomplete" and validate_run(run.path) == []
    a, b = run.cells()  # round 2 stopped after cell 20's repeat: 20 has 2, 41 has 1
    assert (a.repeats, a.partial, a.stopped_by) == (2, True, "interrupted") and (b.repeats, b.partial) == (1, True)
    assert run.finished_inputs() == []
    before = [(s.input_tokens, s.kind, s.repeat) for s in run.samples()]

    calls: list = []
    with writing_run(lambda: (run.resume(), run)[1]) as again:
        sweep_cells(config, again, PROMPTS, measure=fake_measure(calls), skip=again.finished_inputs())
    # warm-ups again (a fresh engine), then cell 41 catches up to 2 before repeat 3 of either
    assert calls == [(20, "cold-resume", 0), (20, "warmup", 0), (41, "warmup", 0), (41, "timed", 1),
                     (20, "timed", 2), (41, "timed", 2)]  # fmt: skip
    done = open_run(run.path)
    assert done.status == "complete" and validate_run(done.path) == []
    assert [(r.repeats, r.partial) for r in done.cells()] == [(3, False), (3, False)]
    after = [(s.input_tokens, s.kind, s.repeat) for s in done.samples()]
    assert after[: len(before)] == before  # nothing already measured is lost
    assert sorted(r for n, k, r in after if k == "timed" and n == 41) == [0, 1, 2]


def test_a_kill_mid_round_is_completed_and_a_run_keeps_its_order(tmp_path: Path) -> None:
    config = SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=2, order="interleaved")
    run = _run(tmp_path)
    sweep_cells(config, run, PROMPTS, measure=fake_measure([]), skip=[20, 41])  # records the order only
    run.append_samples([make_sample(20, "cold", 0, n=4), make_sample(20, "warmup", 0, n=4),
                        make_sample(41, "warmup", 0, n=4), make_sample(20, "timed", 0, n=4)])  # fmt: skip
    run.unlock()  # as a SIGKILL leaves it: samples, no rows
    with pytest.raises(InputError, match="--order sequential differs from the resumed run's interleaved"):
        sweep_cells(SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=2, order="sequential"), run, PROMPTS,
                    measure=fake_measure([]))  # fmt: skip
    calls: list = []
    with writing_run(lambda: (run.resume(), run)[1]) as again:
        sweep_cells(config, again, PROMPTS, measure=fake_measure(calls))
    assert calls[3:] == [(41, "timed", 0), (20, "timed", 1), (41, "timed", 1)]
    assert [r.repeats for r in open_run(run.path).cells()] == [2, 2]
    with pytest.raises(InputError, match="--order 'sideways'"):
        parse_order("sideways")


def test_a_failing_cell_mid_round_is_recorded_and_the_others_go_on(tmp_path: Path) -> None:
    calls: list = []
    run = _run(tmp_path)
    rows = sweep_cells(SweepConfig(inputs=(20, 41), max_new_tokens=4, repeats=3, order="interleaved"), run, PROMPTS,
                       measure=fake_measure(calls, fail=(41, "timed", 1)))  # fmt: skip
    assert [(r.status, r.repeats) for r in rows] == [("ok", 3), ("failed", 3)]
    assert "out of memory" in rows[1].error and rows[1].bucket == 64
    assert calls[-1] == (20, "timed", 2)  # the failed cell takes no more turns


def _rates(copy: float, read: float, matmul: float) -> DeviceRates:
    ceiling = roofline_ceiling(read, "xla read", "cpu", copy_bytes_s=copy)
    return DeviceRates(bandwidth_bytes_s=copy, matmul_flop_s=matmul, measured={"copy_bandwidth": {"bytes_per_s": copy}},
                       ceiling=ceiling, read_bandwidth_bytes_s=read)  # fmt: skip


def test_each_cell_is_divided_by_the_probes_around_its_repeats(tmp_path: Path, monkeypatch) -> None:
    import bench.sweep.rates

    monkeypatch.setattr(bench.sweep.rates, "PROBE_SPACING", 0.0)  # a probe after every round, whatever the host's speed
    run = _run(tmp_path)
    figures = iter([(10e9, 8e9, 1e11), (12e9, 9e9, 2e11), (11e9, 10e9, 3e11), (9e9, 6e9, 4e11)])
    probes = RoundProbes(run, lambda: _rates(*next(figures)), _rates(10e9, 8e9, 1e11))
    probes(0, [])
    probes(1, [(20, 1), (41, 1)])
    probes(2, [(41, 1)])  # cell 41 alone in round 2 (e.g. --min-duration)
    assert [p["after_round"] for p in probes.around((20, 1))] == [0, 1]
    assert [p["after_round"] for p in probes.around((41, 1))] == [0, 1, 2]
    rates = probes.rates_for((41, 1))
    assert rates.read_bandwidth_bytes_s == 9e9 and rates.ceiling.bytes_per_s == 9e9 and rates.matmul_flop_s == 2e11
    row = probes.fields(summarize_cell([make_sample(41, "timed", r, n=4) for r in range(2)], max_new_tokens=4), rates)
    assert (row.rate_probes, row.probe_read_bytes_s_min, row.probe_read_bytes_s_max) == (3, 8e9, 10e9)
    assert (row.probe_matmul_flop_s_min, row.probe_matmul_flop_s_max, row.ceiling_bytes_s) == (1e11, 3e11, 9e9)
    assert probes.rates_for((521, 1)) is None  # no repeats, no probes: the run's start rates apply
    recorded = json.loads((run.path / "manifest.json").read_text())[RATES_KEY][PROBES_KEY]
    assert [p["cells"] for p in recorded] == [[], [[20, 1], [41, 1]], [[41, 1]]] and recorded[0]["session"] == 0
    assert all(p["seconds"] >= 0 for p in recorded)  # each probe's own cost
    assert all(p["load_1m"] is None or p["load_1m"] >= 0 for p in recorded) and "load_1m" in recorded[0]

    probes(3, [(41, 1)])
    lines, warning = probes.finish([with_spreads(row)])
    moved = json.loads((run.path / "manifest.json").read_text())[RATES_KEY]
    assert moved[COPY_END_KEY]["bytes_per_s"] == 9e9 and moved[HOST_KEY]["probes"] == 4
    assert moved[HOST_KEY]["matmul_pct"] == pytest.approx(100 * 3e11 / 2.5e11)  # (4 - 1) / median 2.5
    assert "host movement across the sweep's 4 rate probes" in lines[0]
    assert warning.startswith("warning: the host moved")
    again = RoundProbes(open_run(run.path), lambda: _rates(1e9, 1e9, 1e9), _rates(10e9, 8e9, 1e11))
    assert again.session == 1  # a resumed run's probes are a new session beside the first's


def test_probes_are_spaced_so_that_they_cost_a_bounded_share(tmp_path: Path, monkeypatch) -> None:
    import bench.sweep.rates

    monkeypatch.setattr(bench.sweep.rates, "PROBE_SPACING", 1e9)  # no round is long enough: start and end only
    probes = RoundProbes(_run(tmp_path), lambda: _rates(10e9, 8e9, 1e11), _rates(10e9, 8e9, 1e11))
    probes(0, [])
    probes(1, [(20, 1)])
    probes(2, [(20, 1), (41, 1)])
    probes(2, [], last=True)  # the end: every cell measured since the last probe
    assert [(p["after_round"], p["cells"]) for p in probes.records] == [(0, []), (2, [[20, 1], [41, 1]])]
    probes(2, [], last=True)
    assert len(probes.records) == 2  # nothing measured since: no probe
    assert [p["after_round"] for p in probes.around((20, 1))] == [0, 2]


def test_the_host_moved_line_compares_the_probes_with_the_cells_spread() -> None:
    def cell(lo: float, hi: float) -> CellRow:
        samples = [make_sample(41, "timed", r, n=4, gauge=g) for r, g in enumerate((lo, (lo + hi) / 2, hi))]
        return with_spreads(summarize_cell(samples, max_new_tokens=4))

    probes = [{"copy_bytes_s": c, "read_bytes_s": 1e10, "matmul_flop_s": 1e11} for c in (10e9, 10.5e9, 10.2e9)]
    wide = host_movement(probes, [cell(18.0, 22.0)])  # copy moved 4.9%, the cell spread 20%
    assert wide.moved_pct == pytest.approx(100 * 0.5 / 10.2) and wide.figure == "copy" and not wide.moved_more
    assert wide.warning is None and wide.read_pct == 0.0
    narrow = host_movement(probes, [cell(19.9, 20.1)])
    assert narrow.moved_more and "the copy probe 4.9%" in narrow.warning
    assert host_movement(probes[:1], [cell(18.0, 22.0)]) is None  # one probe: no movement to state


def test_the_stated_interval_and_the_agreement_rule() -> None:
    def row(n: int, gauges: tuple[float, ...]) -> CellRow:
        samples = [make_sample(n, "timed", r, n=4, gauge=g) for r, g in enumerate(gauges)]
        return with_spreads(summarize_cell(samples, max_new_tokens=4))

    a = [row(41, (20.0, 21.0, 22.0)), row(521, (10.0, 10.5, 11.0))]
    b = [row(41, (21.5, 23.0, 24.0)), row(521, (11.2, 11.5, 12.0))]
    assert a[0].gauge_spread_pct == pytest.approx(100 * 2.0 / 21.0) and spread_pct(None, 1.0, 2.0) is None
    found = agreement(a, b)
    assert [(c.cell, c.figure, c.agree) for c in found] == [("41", "gauge", True), ("521", "gauge", False)]
    assert "DISAGREE" in found[1].line and found[0].a == pytest.approx((21.0, 20.0, 22.0))
    assert disjoint_chance(3, 3) == pytest.approx(0.1) and disjoint_chance(5, 5) == pytest.approx(2 / 252)


@pytest.mark.heavy
def test_two_short_default_sweeps_are_compared_by_the_agreement_rule(tmp_path: Path) -> None:
    """Two consecutive interleaved sweeps of the default preset (one input size, few tokens): the rule is computed
    on their records for every cell and gauge. Not a timed assertion: whether they agree depends on the host."""
    from conftest import bench_in_process

    runs = tmp_path / "runs"
    for name in ("first", "second"):
        assert bench_in_process(["sweep", "--inputs", "41", "--max-new-tokens", "8", "--repeats", "3", "--name",
                                 name, "--runs-dir", str(runs)]) == 0  # fmt: skip
    first, second = (open_run(p) for p in sorted(runs.iterdir()))
    found = agreement(first.cells(), second.cells())
    assert [(c.cell, c.figure) for c in found] == [("41", "gauge"), ("41", "device-loop gauge")]
    for c, stem in zip(found, ("gauge_tok_s", "device_gauge_tok_s"), strict=True):
        a, b = (next(r for r in run.cells()) for run in (first, second))
        lows = getattr(a, f"{stem}_min"), getattr(b, f"{stem}_min")
        highs = getattr(a, f"{stem}_max"), getattr(b, f"{stem}_max")
        assert c.agree == (max(lows) <= min(highs))
    for run in (first, second):
        probes = run.manifest[RATES_KEY][PROBES_KEY]  # before round 1, after the last, between as spacing allows
        assert recorded_order(run) == "interleaved" and 2 <= len(probes) <= 4 and probes[-1]["cells"]
        (cell,) = run.cells()
        assert cell.rate_probes == len(probes) and cell.gauge_spread_pct is not None and cell.ceiling_bytes_s > 0


def test_a_bad_or_changed_order_is_one_line_before_anything_loads(tmp_path: Path, capsys, monkeypatch) -> None:
    import model.engine
    from bench.cli import main

    def no_load(*_a, **_k):
        raise AssertionError("the checkpoint was loaded before --order was checked")

    monkeypatch.setattr(model.engine, "load_engine", no_load)

    def cli(args: list[str]) -> tuple[int, str]:
        with pytest.raises(SystemExit) as ended:
            main(args)
        return ended.value.code, capsys.readouterr().err

    code, err = cli(["sweep", "--order", "sideways", "--runs-dir", str(tmp_path)])
    assert code == 2 and "--order 'sideways'" in err and "interleaved" in err and len(err.splitlines()) == 1
    run = _run(tmp_path, "seq")
    sweep_cells(SweepConfig(inputs=(20,), max_new_tokens=4, repeats=1), run, PROMPTS, measure=fake_measure([]))
    run.unlock()  # a sequential run left incomplete
    code, err = cli(["sweep", "--resume", str(run.path), "--order", "interleaved", "--runs-dir", str(tmp_path)])
    assert code == 2 and "--order interleaved differs from the resumed run's sequential" in err
    assert len(err.splitlines()) == 1


def test_the_host_load_is_the_one_minute_average_or_none(monkeypatch):
    import os

    from bench.sweep.rates import host_load

    monkeypatch.setattr(os, "getloadavg", lambda: (3.617, 2.0, 1.0))
    assert host_load() == 3.62

    def missing():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert host_load() is None
