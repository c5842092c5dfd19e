"""`bench.gpurun.run` in this process with its step processes made up: the plans, the budget, the stops and the
summary, in well under a second each.

Only the processes are fake (`FakeProcesses` stands in for `subprocess` in bench/gpurun/steps.py and main.py):
`run_step`'s own limits, SIGTERM, SIGKILL, logs and statuses, the plans, `settle_run`, the signal handler and the
summary are the product's. A fake `bench sweep` leaves a synthetic measured run folder (tests/runfolders.py) named
as the real one would be; a fake probe reports a CPU. tests/test_gpu_run.py runs the real script end to end once,
and keeps the tests whose point is the process (a missing package, startup imports).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
import types
from pathlib import Path

import pytest
from runfolders import make_measured_run

from bench.gpurun import EXIT_BUDGET, EXIT_OK, PROBE_MARK, Options, PilotPlan, run
from bench.gpurun import main as gpurun_main
from bench.gpurun import steps as gpurun_steps
from bench.runs import open_run, validate_run

PROBE = {"platform": "cpu", "device_kind": "cpu", "device_line": "device: cpu (platform cpu, 1 device(s), fake)",
         "policy_line": "device policy: float32 (fake)"}  # fmt: skip


def _opt(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


class FakeProcess:
    """One step's process: its output lines, its exit code, and how it meets its limit (`hang`: it runs past any
    limit and stops at SIGTERM; `deaf`: not even then, only SIGKILL stops it)."""

    def __init__(self, fake: FakeProcesses, argv: list[str], **_kw) -> None:
        self.argv, self.signals, self.returncode = list(argv), [], None
        self.command = argv[3] if len(argv) > 3 else ""
        lines, self.hang, self.deaf, self.stop_self = fake.start(self)
        self.busy_polls = fake.generator_polls if "_make_builtin" in argv else 0  # polls that find it running
        self.stdout = io.StringIO("".join(f"{ln}\n" for ln in lines))
        self._rc = 0

    def wait(self, timeout: float | None = None) -> int:
        if self.stop_self:  # the device tool's timeout arrives while this step runs: SIGTERM to the run's process
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while self.returncode is None and time.monotonic() < deadline:  # the handler signals this step
                time.sleep(0.01)
            self.stop_self = False
        if self.returncode is None and (self.hang or self.deaf):
            raise subprocess.TimeoutExpired(self.argv, timeout or 0)
        if self.returncode is None:
            self.returncode = self._rc
        return self.returncode

    def poll(self) -> int | None:
        if self.busy_polls:
            self.busy_polls -= 1
            return None
        if self.returncode is None and not (self.hang or self.deaf or self.stop_self):
            self.returncode = self._rc  # it ended: a real Popen sets returncode when poll finds it so
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.deaf:
            self.returncode = -sig

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.returncode = -signal.SIGKILL


class FakeProcesses:
    """Stands in for the `subprocess` module of the gpu-run steps and plans. `sweep` is "complete", "hang" (past
    its limit: left 'running' with two cells, as a real sweep is when it is cut), "deaf" (the same, ignoring
    SIGTERM) or "stop" (the run's process gets SIGTERM while the sweep runs). The background checkpoint generator
is found running by its first `generator_polls` polls, then done. Every process started is in `procs`."""

    PIPE, STDOUT, TimeoutExpired = subprocess.PIPE, subprocess.STDOUT, subprocess.TimeoutExpired

    def __init__(self, monkeypatch, sweep: str = "complete", generator_polls: int = 0) -> None:
        self.sweep, self.procs, self.generator_polls = sweep, [], generator_polls
        module = types.SimpleNamespace(Popen=self.popen, PIPE=self.PIPE, STDOUT=self.STDOUT,
                                       TimeoutExpired=self.TimeoutExpired)  # fmt: skip
        monkeypatch.setattr(gpurun_steps, "subprocess", module)
        monkeypatch.setattr(gpurun_main, "subprocess", module)

    def popen(self, argv, **kw) -> FakeProcess:
        proc = FakeProcess(self, argv, **kw)
        self.procs.append(proc)
        return proc

    def start(self, proc: FakeProcess) -> tuple[list[str], bool, bool, bool]:
        """(output lines, hang, deaf, stop_self) of `proc`; a sweep makes its run folder here."""
        argv = proc.argv
        if "_probe" in argv:
            return [PROBE["device_line"], PROBE["policy_line"], PROBE_MARK + json.dumps(PROBE)], False, False, False
        if proc.command == "bandwidth":
            return ["bandwidth: 1.00 GB/s (fake copy)", "read-only bandwidth: 2.00 GB/s (fake read)"], False, False, False
        if proc.command == "sweep":
            cut = self.sweep in ("hang", "deaf", "stop")
            inputs = [int(n) for n in _opt(argv, "--inputs").split(",")]
            make_measured_run(Path(_opt(argv, "--runs-dir")), _opt(argv, "--name"), inputs=inputs,
                              status="running" if cut else "complete", date=time.strftime("%Y-%m-%d"))  # fmt: skip
            return ["sweep: fake"], self.sweep == "hang", self.sweep == "deaf", self.sweep == "stop"
        if proc.command == "profile" and _opt(argv, "--name"):  # the largest batch's profile: its own run folder
            make_measured_run(Path(_opt(argv, "--runs-dir")), _opt(argv, "--name"), inputs=[41],
                              date=time.strftime("%Y-%m-%d"))  # fmt: skip
        return [f"{proc.command or argv[-1]}: fake"], False, False, False

    def steps(self) -> list[tuple[str, list[str]]]:
        """(command, argv) of every `bench` step process started, in order."""
        return [(p.command, p.argv) for p in self.procs if p.argv[1:3] == ["-m", "bench"]]


def _run(tmp_path, monkeypatch, *, sweep: str = "complete", plan: PilotPlan | None = None, generator_polls: int = 0,
         **opts):  # fmt: skip
    """`run` on the tiny mode's plan with fake step processes; returns (outcome, lines, the fakes)."""
    fake = FakeProcesses(monkeypatch, sweep, generator_polls)
    lines: list[str] = []
    options = Options(outdir=tmp_path / "out", tiny=True, **{"budget_s": 200, **opts})
    outcome = run(options, emit=lines.append, plan=plan)
    return outcome, lines, fake


def _runs(outdir: Path) -> list[Path]:
    return sorted(p for p in (outdir / "runs").iterdir() if p.is_dir())


def test_the_single_plan_runs_checkpoint_bandwidth_sweep_profile_and_summarises_last(tmp_path, monkeypatch):
    outcome, lines, fake = _run(tmp_path, monkeypatch, inputs="41", max_new_tokens=8, repeats=1, steps=5)
    assert outcome.code == EXIT_OK, "\n".join(lines)
    assert lines[:2] == [PROBE["device_line"], PROBE["policy_line"]]
    (run_dir,) = _runs(outcome.outdir)
    assert validate_run(run_dir) == [] and open_run(run_dir).status == "complete"
    sweep, profile = (argv for cmd, argv in fake.steps() if cmd in ("sweep", "profile"))
    assert _opt(sweep, "--inputs") == "41" and _opt(sweep, "--max-new-tokens") == "8" and _opt(sweep, "--repeats") == "1"
    assert _opt(sweep, "--compile-cache") == str(outcome.outdir / "xla-cache") and "--quant" not in sweep
    assert _opt(profile, "--run") == str(run_dir) and _opt(profile, "--steps") == "5"
    assert [c for c, _ in fake.steps()] == ["bandwidth", "sweep", "profile"]
    tail = lines[lines.index("==== gpu-run summary ===="):]
    assert tail[-1].startswith("gpu-run: exit 0") and outcome.summary[-1] == tail[-1]
    assert "bandwidth: 1.00 GB/s (fake copy)" in tail and any(ln.strip().startswith("41 ") for ln in tail)
    assert (outcome.outdir / "summary.txt").read_text().strip().splitlines()[-1] == tail[-1]
    assert (outcome.outdir / "gpu-run.log").read_text().splitlines()[-1] == tail[-1]
    assert (outcome.outdir / "logs" / "sweep-tiny.log").read_text() == "sweep: fake\n"


def test_a_sweep_past_its_limit_gets_sigterm_keeps_its_cells_and_the_run_exits_3(tmp_path, monkeypatch):
    outcome, lines, fake = _run(tmp_path, monkeypatch, sweep="hang", budget_s=40, inputs="20,41")
    assert outcome.code == EXIT_BUDGET, "\n".join(lines)
    swept = next(p for p in fake.procs if p.command == "sweep")
    assert swept.signals == [signal.SIGTERM]
    (run_dir,) = _runs(outcome.outdir)
    assert validate_run(run_dir) == [] and open_run(run_dir).status == "incomplete"  # settled by gpu-run
    assert len(open_run(run_dir).cells()) == 2
    assert any(ln.startswith("-- sweep-tiny: reached its limit") for ln in lines)
    assert any(ln.startswith("-- sweep-tiny: interrupted") for ln in lines)
    assert any("left 'running' by the interrupted step; marked incomplete" in ln for ln in lines)
    # the sweep's limit kept the profile's reserve and the grace period back: 40 s budget, tiny timing
    t = gpurun_steps.TINY_TIMING
    limit = float(next(ln for ln in lines if ln.startswith("== sweep-tiny (limit")).split()[3])
    assert limit <= 40 - t.end_margin - t.profile_reserve - t.grace
    assert any(ln.startswith("== profile-tiny") for ln in lines)
    assert lines[-1].startswith("gpu-run: exit 3")


def test_a_sweep_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path, monkeypatch):
    outcome, lines, fake = _run(tmp_path, monkeypatch, sweep="deaf", inputs="41")
    swept = next(p for p in fake.procs if p.command == "sweep")
    assert swept.signals == [signal.SIGTERM, signal.SIGKILL] and outcome.code == EXIT_BUDGET
    assert any(ln.startswith("-- sweep-tiny: still running") for ln in lines)
    assert any(ln.startswith("-- sweep-tiny: killed") for ln in lines)
    (run_dir,) = _runs(outcome.outdir)
    assert validate_run(run_dir) == [] and open_run(run_dir).status == "incomplete"


def test_too_small_a_budget_skips_the_steps_it_cannot_fit(tmp_path, monkeypatch):
    t = gpurun_steps.TINY_TIMING
    budget = t.end_margin + t.sweep_min + t.grace - 1  # room for the checkpoint and bandwidth, not for a sweep
    outcome, lines, fake = _run(tmp_path, monkeypatch, budget_s=budget)
    assert outcome.code == EXIT_BUDGET and [c for c, _ in fake.steps()] == ["bandwidth"]
    assert any(ln.startswith("== sweep-tiny: skipped (") and "needs" in ln for ln in lines)
    assert "== profile-tiny: skipped (no run folder to add it to)" in lines
    assert not _runs(outcome.outdir) and lines[-1].startswith("gpu-run: exit 3")


def test_sigterm_to_the_run_stops_the_step_and_no_later_step_starts(tmp_path, monkeypatch):
    """The device tool's timeout: SIGTERM to the run's process while the sweep runs reaches the sweep (which keeps
    its finished cells), no later step starts, and the summary comes last with exit code 3."""
    previous = signal.getsignal(signal.SIGTERM)
    outcome, lines, fake = _run(tmp_path, monkeypatch, sweep="stop", inputs="20,41")
    assert signal.getsignal(signal.SIGTERM) == previous  # the run's handler is gone again
    swept = next(p for p in fake.procs if p.command == "sweep")
    assert swept.signals == [signal.SIGTERM] and outcome.code == EXIT_BUDGET
    assert any(ln.startswith("-- sweep-tiny: stopped") for ln in lines), lines
    assert "== profile-tiny: skipped (the run was stopped (SIGTERM or SIGINT))" in lines
    assert [c for c, _ in fake.steps()] == ["bandwidth", "sweep"]
    (run_dir,) = _runs(outcome.outdir)
    assert validate_run(run_dir) == [] and open_run(run_dir).status == "incomplete"
    assert lines[-1].startswith("gpu-run: exit 3") and "==== gpu-run summary ====" in lines


@pytest.mark.parametrize(("generator_polls", "order"), [
    (1, ["sweep-pilot", "profile-pilot", "sweep-tiny", "profile-tiny"]),  # the pilot profiled while E2B is written
    (0, ["sweep-pilot", "sweep-tiny", "profile-tiny", "profile-pilot"]),  # E2B ready first: its steps, then it
])  # fmt: skip
def test_the_pilot_plan_sweeps_pilot_and_big_into_two_valid_runs(tmp_path, monkeypatch, generator_polls, order):
    """The GPU plan (pilot sweep + profile while the big checkpoint is generated in the background, then the big
    one) with the tiny preset for both."""
    outcome, lines, fake = _run(tmp_path, monkeypatch, plan=PilotPlan(pilot="tiny", big="tiny"), inputs="41",
                                steps=3, generator_polls=generator_polls)  # fmt: skip
    assert outcome.code == EXIT_OK, "\n".join(lines)
    (generator,) = [p for p in fake.procs if p.argv[3:] == ["_make_builtin", "tiny"]]
    assert any(ln.startswith("== checkpoint-tiny: generating builtin:tiny") for ln in lines)
    assert "== checkpoint-tiny: ready after 0 s" in lines
    starts = [ln.split()[1] for ln in lines if ln.startswith(("== sweep-", "== profile-"))]
    assert starts == order and generator.returncode == 0
    runs = _runs(outcome.outdir)
    assert len(runs) == 2 and any("pilot" in r.name for r in runs), [r.name for r in runs]
    for path in runs:
        assert validate_run(path) == [] and open_run(path).status == "complete"
    tail = lines[lines.index("==== gpu-run summary ===="):]
    assert sum(ln.startswith("run ") for ln in tail) == 2 and tail[-1].startswith("gpu-run: exit 0")
    assert outcome.summary[-1] == lines[-1] and outcome.outdir == (tmp_path / "out").resolve()


def test_each_quant_set_is_its_own_sweep_and_profile(tmp_path, monkeypatch):
    """`--quant none --quant ple4,int8_lm_head`: a sweep + profile pair per set, in the order given, each sweep
    into its own run folder, the set passed to both steps (as its configuration writes it: canonical, with the
    mesh every step gets, `EngineConfig.to_args`); the first sweep capped at its share."""
    outcome, lines, fake = _run(tmp_path, monkeypatch, inputs="41", quant=("none", "ple4,int8_lm_head"), mesh="tp=2")
    assert outcome.code == EXIT_OK, "\n".join(lines)
    starts = [ln.split()[1] for ln in lines if ln.startswith(("== sweep-", "== profile-"))]
    assert starts == ["sweep-tiny-none", "profile-tiny-none", "sweep-tiny-int8_lm_head.ple4",
                      "profile-tiny-int8_lm_head.ple4"]  # fmt: skip
    pairs = [(cmd, _opt(argv, "--quant")) for cmd, argv in fake.steps() if cmd in ("sweep", "profile")]
    assert pairs == [("sweep", "none"), ("profile", "none"), ("sweep", "int8_lm_head,ple4"),
                     ("profile", "int8_lm_head,ple4")]  # fmt: skip
    assert {_opt(argv, "--mesh") for cmd, argv in fake.steps() if cmd in ("sweep", "profile")} == {"tp=2"}
    runs = _runs(outcome.outdir)
    assert len(runs) == 2 and all(validate_run(p) == [] for p in runs)
    profiled = [_opt(argv, "--run") for cmd, argv in fake.steps() if cmd == "profile"]
    assert sorted(profiled) == sorted(map(str, runs))
    limits = [float(ln.split()[3]) for ln in lines if ln.startswith("== sweep-")]
    assert limits[0] < limits[1]  # the first of two pairs gets its share, the last what is left


def test_a_batch_is_passed_to_the_sweep_and_the_largest_batch_is_profiled_into_its_own_run(tmp_path, monkeypatch):
    outcome, lines, fake = _run(tmp_path, monkeypatch, inputs="41", steps=3, batch="1,2")
    assert outcome.code == EXIT_OK, "\n".join(lines)
    starts = [ln.split()[1] for ln in lines if ln.startswith(("== sweep-", "== profile-"))]
    assert starts == ["sweep-tiny", "profile-tiny", "profile-tiny-b2"]
    (sweep,) = [argv for cmd, argv in fake.steps() if cmd == "sweep"]
    assert _opt(sweep, "--batch") == "1,2"
    joined, own = [argv for cmd, argv in fake.steps() if cmd == "profile"]
    assert "--batch" not in joined and _opt(joined, "--run")
    assert _opt(own, "--batch") == "2" and _opt(own, "--name").startswith("gpurun-tiny-profile-b2-")
    assert len(_runs(outcome.outdir)) == 2


@pytest.mark.parametrize("deaf", [False, True])
def test_the_real_run_step_stops_a_real_process_at_its_limit(tmp_path, deaf):
    """`run_step` itself, on a real (tiny) process that outlives its limit: SIGTERM at the limit ("interrupted"),
    its output kept in the step's log; one that ignores SIGTERM is killed after the grace period."""
    import dataclasses

    from bench.gpurun.steps import TINY_TIMING, Context, run_step

    (tmp_path / "logs").mkdir()
    out: list[str] = []
    script = ("trap '' TERM; " if deaf else "") + "echo started; exec sleep 60"  # an ignored signal stays so
    with open(tmp_path / "gpu-run.log", "a") as log_fh:
        ctx = Context(repo=Path.cwd(), outdir=tmp_path, budget=60, t0=time.monotonic(), log_fh=log_fh,
                      emit=out.append, timing=dataclasses.replace(TINY_TIMING, grace=1))  # fmt: skip
        res = run_step(ctx, "slow", ["bash", "-c", script], 1.0)
    assert res.status == ("killed" if deaf else "interrupted") and res.rc is not None and res.rc < 0
    assert (tmp_path / "logs" / "slow.log").read_text() == "started\n" and "started" in out
