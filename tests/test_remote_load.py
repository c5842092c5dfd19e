"""`bench sweep --target URL --concurrency ...` (bench/sweep/load.py) against the fake OpenAI-compatible endpoint of
test_remote.py (no engine on the server side): levels of exact-size requests with at most C in flight, Poisson
arrivals from a seed, per-request samples with their inter-token latencies, per-level rows with the serving
definitions (docs/method.md, "Serving under load"), validity, the target's answers in the manifest, stop and
resume, and the flags' one-line errors. The records' arithmetic (`summarize_level`) is checked on made-up samples.
"""

from __future__ import annotations

import json
import statistics
import threading

import pytest
from conftest import assert_one_line_error, run_cli, run_cli_here
from test_remote import MODEL, FakeEndpoint

from bench.runs import open_run, validate_run
from bench.runs.records import LoadSample, summarize_level
from bench.sweep.local import StopSignals


class CountingEndpoint(FakeEndpoint):
    """The fake endpoint, counting the streams it is writing at once (`most_in_flight`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight = self.most_in_flight = 0
        self.flight_lock = threading.Lock()

    def answer(self, handler, request):
        with self.flight_lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            super().answer(handler, request)
        finally:
            with self.flight_lock:
                self.in_flight -= 1


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from model.tokenizer import GemmaTokenizer

    return GemmaTokenizer.from_dir(tiny_checkpoint)


@pytest.fixture
def endpoint(tokenizer):
    servers = []

    def make(**kwargs) -> CountingEndpoint:
        servers.append(CountingEndpoint(tokenizer, **kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


def _load(**kw):
    from bench.sweep.load import LoadConfig

    return LoadConfig(**{"inputs": (20,), "max_new_tokens": 4, "concurrency": (1, 3), "num_requests": 6} | kw)


def test_levels_cap_requests_in_flight_and_record_the_serving_figures(endpoint, tiny_checkpoint, tmp_path):
    from bench.sweep.remote import sweep_target

    fake = endpoint(chunk_delay_s=0.02)
    run = sweep_target(fake.url, MODEL, _load(), checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name="load",
                       load=True)  # fmt: skip
    assert validate_run(run.path) == [] and open_run(run.path).status == "complete"
    assert fake.requests == 1 + 6 + 6 and fake.most_in_flight == 3  # the cap, and it was reached
    rows = run.load_rows()
    assert [(r.input_tokens, r.concurrency, r.request_rate) for r in rows] == [(20, 1, None), (20, 3, None)]
    samples = run.load_samples()
    assert [s.kind for s in samples].count("warmup") == 1 and len(samples) == 13
    for row in rows:
        mine = [s for s in samples if s.kind == "timed" and s.concurrency == row.concurrency]
        assert sorted(s.index for s in mine) == list(range(6)) and all(s.ok for s in mine)
        assert all(s.generated_tokens == s.content_chunks == 4 and len(s.itl_ms) == 3 for s in mine)
        assert all(s.ttft_ms <= s.e2e_ms and s.queue_ms is None for s in mine)  # the fake reports no queue time
        assert row.valid and row.completed == 6 and row.generated_tokens == 24 and row.compile_events is None
        assert row.output_tok_s == pytest.approx(24 / row.duration_s) and row.request_s == pytest.approx(6 / row.duration_s)
        assert row.itl_ms_median == pytest.approx(statistics.median([x for s in mine for x in s.itl_ms]))
        assert row.ttft_ms_median <= row.ttft_ms_p90 <= row.ttft_ms_p99 and row.queue_ms_median is None
    one, three = rows
    assert three.output_tok_s > 1.5 * one.output_tok_s  # three streams at once on a server that streams in parallel
    m = run.manifest
    assert m["engine_config"]["load"] == {"concurrency": [1, 3], "num_requests": 6, "request_rate": None, "seed": 0,
                                          "arrivals": "as fast as the concurrency allows"}  # fmt: skip
    assert m["target"]["models"]["data"][0]["id"] == MODEL and "health" in m["target"]
    assert m["engine_config"]["inputs"] == [20] and m["engine_config"]["max_new_tokens"] == 4


def test_poisson_arrivals_follow_the_seed(endpoint, tiny_checkpoint, tmp_path):
    from bench.sweep.load import poisson_offsets
    from bench.sweep.remote import sweep_target

    assert poisson_offsets(5, 10.0, seed=3) == poisson_offsets(5, 10.0, seed=3) != poisson_offsets(5, 10.0, seed=4)
    many = poisson_offsets(4000, 50.0, seed=1)
    assert many[0] == 0 and statistics.mean(b - a for a, b in zip(many, many[1:])) == pytest.approx(0.02, rel=0.06)
    fake = endpoint()
    config = _load(concurrency=(2,), request_rate=40.0, seed=7)
    run = sweep_target(fake.url, MODEL, config, checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name="rate",
                       load=True)  # fmt: skip
    (row,) = run.load_rows()
    assert row.request_rate == 40.0 and row.seed == 7 and row.valid
    timed = sorted((s for s in run.load_samples() if s.kind == "timed"), key=lambda s: s.index)
    offsets = poisson_offsets(6, 40.0, seed=7)
    # each request leaves at its arrival time or later (when both places are taken), never before
    assert all(s.t_sent_ms >= 1e3 * t - 1.0 for s, t in zip(timed, offsets))
    assert run.manifest["engine_config"]["load"]["arrivals"] == "poisson"


def test_a_stop_keeps_the_finished_levels_and_a_resume_runs_the_rest(endpoint, tiny_checkpoint, tmp_path):
    from bench.errors import RunFolderError
    from bench.sweep.remote import sweep_target

    stop = StopSignals()
    fake = endpoint(on_request=lambda k: stop.request() if k == 10 else None)  # request 3 of the second level
    with pytest.raises(KeyboardInterrupt):
        sweep_target(fake.url, MODEL, _load(), checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name="cut",
                     stop=stop, load=True)  # fmt: skip
    (folder,) = list(tmp_path.iterdir())
    run = open_run(folder)
    assert run.status == "incomplete" and [r.concurrency for r in run.load_rows()] == [1]
    assert validate_run(folder) == [] and fake.requests <= 13
    with pytest.raises(RunFolderError, match="--num-requests 5 differs"):
        sweep_target(fake.url, MODEL, _load(num_requests=5), checkpoint=str(tiny_checkpoint), runs_dir=tmp_path,
                     name=None, resume=folder, stop=StopSignals(), load=True)  # fmt: skip
    with pytest.raises(RunFolderError, match="a sweep under load"):
        sweep_target(fake.url, MODEL, _load(), checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name=None,
                     resume=folder, stop=StopSignals())  # fmt: skip  (no --concurrency)
    sweep_target(fake.url, MODEL, _load(), checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name=None,
                 resume=folder, stop=StopSignals(), load=True)  # fmt: skip
    run = open_run(folder)
    assert run.status == "complete" and [r.concurrency for r in run.load_rows()] == [1, 3]
    assert all(r.valid for r in run.load_rows()) and validate_run(folder) == []


def test_resuming_a_servers_run_without_target_is_refused_before_anything_runs(endpoint, tiny_checkpoint, tmp_path):
    from bench.sweep.remote import sweep_target

    stop = StopSignals()
    fake = endpoint(on_request=lambda k: stop.request() if k == 10 else None)
    with pytest.raises(KeyboardInterrupt):
        sweep_target(fake.url, MODEL, _load(), checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name="cut",
                     stop=stop, load=True)  # fmt: skip
    (folder,) = list(tmp_path.iterdir())
    before = sorted((p.name, p.stat().st_size) for p in folder.iterdir())
    proc = run_cli_here(["sweep", "--resume", str(folder), "--checkpoint", str(tiny_checkpoint)])
    assert_one_line_error(proc, "measured a server", "--target")
    assert sorted((p.name, p.stat().st_size) for p in folder.iterdir()) == before  # the run left as it was


def test_a_text_only_flush_chunk_is_not_a_token_arrival():
    """This project's server streams token ids; a chunk of text with `token_ids: []` (a character completed after
    the last token) carries no token, so it adds neither an arrival nor an inter-token gap."""
    from bench.sweep.remote import Streamed, fold_chunk

    out = Streamed()
    for t, ids, text in ((1, [5], "a"), (2, [6], "b"), (3, [], "\ufffd")):
        fold_chunk(out, {"choices": [{"delta": {"content": text}, "token_ids": ids}]}, t)
    assert out.t_content == [1, 2] and out.token_ids == [5, 6] and out.text == "ab\ufffd"
    other = Streamed()  # a server without token ids: every chunk with content is one arrival
    for t, text in ((1, "a"), (2, "b")):
        fold_chunk(other, {"choices": [{"delta": {"content": text}}]}, t)
    assert other.t_content == [1, 2] and other.token_ids is None


def test_a_server_counting_other_prompt_tokens_fails_its_levels_and_the_cli_exits_1(endpoint, tiny_checkpoint,
                                                                                     tmp_path):  # fmt: skip
    fake = endpoint(miscount=2)
    runs = tmp_path / "runs"
    proc = run_cli(["sweep", "--target", fake.url, "--model", MODEL, "--checkpoint", str(tiny_checkpoint),
                    "--inputs", "20", "--max-new-tokens", "4", "--concurrency", "1,2", "--num-requests", "2",
                    "--runs-dir", str(runs)], env={"JAX_PLATFORMS": "cpu"}, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "failed" in proc.stderr and fake.requests == 1  # the warm-up found it; no level was sent
    (folder,) = list(runs.iterdir())
    rows = open_run(folder).load_rows()
    assert [r.status for r in rows] == ["failed", "failed"] and "prompt tokens" in rows[0].error
    assert validate_run(folder) == []


@pytest.mark.parametrize(("extra", "needles"), [
    (["--concurrency", "1,4"], ("--concurrency 1,4", "--target")),
    (["--target", "http://127.0.0.1:9/v1", "--num-requests", "5"], ("--num-requests", "--concurrency")),
    (["--target", "http://127.0.0.1:9/v1", "--concurrency", "1,x"], ("--concurrency 1,x", "1,4,16")),
    (["--target", "http://127.0.0.1:9/v1", "--concurrency", "0"], ("--concurrency 0", "between 1")),
    (["--target", "http://127.0.0.1:9/v1", "--concurrency", "1,4,1"], ("--concurrency 1,4,1", "given twice")),
    (["--target", "http://127.0.0.1:9/v1", "--concurrency", "2", "--repeats", "3"], ("--repeats 3", "--num-requests")),
    (["--target", "http://127.0.0.1:9/v1", "--concurrency", "2", "--request-rate", "-1"], ("--request-rate -1",)),
])  # fmt: skip
def test_load_flags_are_refused_in_one_line(extra, needles, tmp_path):
    proc = run_cli_here(["sweep", *extra, "--runs-dir", str(tmp_path)], env={"JAX_PLATFORMS": "cpu"}, timeout=60)
    assert_one_line_error(proc, *needles)
    assert not any(tmp_path.iterdir())


def _sample(index: int, *, ok=True, n=4, ttft=10.0, itl=(1.0, 2.0, 3.0), queue=None, concurrency=2) -> LoadSample:
    e2e = ttft + sum(itl)
    return LoadSample(input_tokens=20, concurrency=concurrency, request_rate=None, kind="timed", index=index, ok=ok,
                      error=None if ok else "HTTP 500: boom", t_sent_ms=float(index), ttft_ms=ttft,
                      itl_ms=list(itl), tpot_ms=(e2e - ttft) / (n - 1), e2e_ms=e2e, generated_tokens=n,
                      content_chunks=len(itl) + 1, queue_ms=queue, degenerate=False, degenerate_reason=None,
                      token_ids=[5] * n)  # fmt: skip


def test_summarize_level_follows_the_serving_definitions():
    samples = [_sample(i, ttft=10.0 * (i + 1), queue=float(i)) for i in range(5)]
    samples.append(_sample(0, concurrency=1, ttft=999.0))  # another level's: left out
    row = summarize_level(samples, input_tokens=20, concurrency=2, request_rate=None, seed=0, max_new_tokens=4,
                          num_requests=5, duration_s=2.0, compile_events=0)  # fmt: skip
    assert row.valid and row.completed == 5 and row.failed == 0 and row.generated_tokens == 20
    assert row.output_tok_s == 10.0 and row.request_s == 2.5
    assert row.ttft_ms_median == 30.0 and row.ttft_ms_p90 == pytest.approx(46.0) and row.ttft_ms_p99 == pytest.approx(49.6)
    assert row.itl_ms_median == 2.0 and row.itl_ms_p99 == pytest.approx(3.0) and row.queue_ms_median == 2.0
    assert row.tpot_ms_median == 2.0 and row.to_dict()["concurrency"] == 2
    bad = [*samples[:3], _sample(3, ok=False), _sample(4, n=3, itl=(1.0, 1.0))]
    row = summarize_level(bad, input_tokens=20, concurrency=2, request_rate=None, seed=0, max_new_tokens=4,
                          num_requests=6, duration_s=1.0, compile_events=2)  # fmt: skip
    assert not row.valid and row.completed == 4 and row.failed == 1 and row.generated_tokens == 15
    for needle in ("5 of 6 requests", "1 request(s) failed", "other than 4", "2 compile event(s)"):
        assert needle in row.invalid_reason
    with pytest.raises(ValueError, match="duration_s"):
        summarize_level(samples, input_tokens=20, concurrency=2, request_rate=None, seed=0, max_new_tokens=4,
                        num_requests=5, duration_s=0.0, compile_events=None)  # fmt: skip


def test_a_run_folder_with_load_rows_validates_and_a_broken_row_is_named(tmp_path):
    from bench.runs import create_run

    run = create_run(tmp_path, "load", "cpu", {})
    run.append_load_samples([_sample(i) for i in range(2)])
    row = summarize_level([_sample(i) for i in range(2)], input_tokens=20, concurrency=2, request_rate=None,
                          seed=0, max_new_tokens=4, num_requests=2, duration_s=1.0, compile_events=None)  # fmt: skip
    run.append_load(row)
    run.append_load(row)  # the same level again replaces it
    run.finish("complete")
    assert validate_run(run.path) == [] and len(open_run(run.path).load_rows()) == 1
    with open(run.path / "load.jsonl", "a") as fh:
        fh.write(json.dumps(row.to_dict() | {"concurrency": "two"}) + "\n")
    problems = validate_run(run.path)
    assert any(p.startswith("load.jsonl line 2: field 'concurrency'") for p in problems), problems


def test_the_report_plots_throughput_against_latency_and_compare_shows_the_shared_levels(endpoint, tiny_checkpoint,
                                                                                          tmp_path, capsys):  # fmt: skip
    from bench.report import build_report
    from bench.report.compare import compare_runs
    from bench.sweep.remote import sweep_target

    fake = endpoint(chunk_delay_s=0.005)
    runs = tmp_path / "runs"
    a = sweep_target(fake.url, MODEL, _load(num_requests=3), checkpoint=str(tiny_checkpoint), runs_dir=runs,
                     name="a", load=True)  # fmt: skip
    b = sweep_target(fake.url, MODEL, _load(concurrency=(3, 2), num_requests=3), checkpoint=str(tiny_checkpoint),
                     runs_dir=runs, name="b", load=True)  # fmt: skip
    report = build_report(None, tmp_path / "report", runs_dir=runs)
    text = (tmp_path / "report" / "report.md").read_text()
    assert set(report.runs) == {a.name, b.name}
    assert "Serving under load (per level)" in text and "load_" in text
    pngs = list((tmp_path / "report").glob("load_*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 1000
    load_csv = (tmp_path / "report" / "load.csv").read_text().splitlines()
    assert len(load_csv) == 1 + 2 + 2 and load_csv[0].startswith("run,input tokens,concurrency")
    result = compare_runs(a.path, b.path, max_slowdown_pct=1000.0)
    assert [d.key for d in result.levels] == [(20, 3, None)]  # the one level both runs have
    assert any("in one run only" in n and "(20, 1, None)" in n and "(20, 2, None)" in n for n in result.notes)
    assert result.passed and result.levels[0].output_delta_pct is not None
    from bench.cli import main

    main(["compare", str(a.path), str(b.path), "--max-slowdown", "1000%"])  # PASS: returns
    out = capsys.readouterr().out
    assert "load levels both runs have" in out and "verdict: PASS" in out
