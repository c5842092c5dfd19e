"""`bench serve` under load, over real HTTP on loopback (127.0.0.1 only) with the tiny checkpoint: concurrent
greedy requests get exactly the tokens they get alone, decode slots are shared and freed, a full queue is a 429
with Retry-After, stream options and the model card follow OpenAI/vLLM, and a bounded load test (a few dozen
concurrent requests, some leaving mid-stream, some malformed) leaves the server healthy, every well-formed request
answered correctly, and the metrics consistent.

Every request uses the warmed-up shape (prompt <= 32 tokens, max_tokens 16, greedy). The engine is wrapped
(`_PacedEngine`) to pause a little after each token, so requests overlap on a 2-core machine, and to record how
many generations were open at once.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from test_serve import MODEL, _loaded, _Served

MAX_TOKENS = 16
PROMPTS = ["The garden", "A weather station", "Timetables and trains", "The old harbour", "Bread rises",
           "Memory chips"]  # fmt: skip


class _PacedEngine:
    """The real engine, pausing `delay_s` after each token; `most_open`: most generations open at once."""

    def __init__(self, engine, delay_s: float):
        self._engine, self.delay_s = engine, delay_s
        self.open = self.most_open = 0
        self.lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, ids, max_new_tokens, sampling=None, *, stop_at_eos=False, on_token=None):
        from model.engine import GREEDY

        def paced(token_id):
            time.sleep(self.delay_s)
            return on_token(token_id) if on_token else False

        with self.lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        try:
            return self._engine.generate(ids, max_new_tokens, sampling or GREEDY, stop_at_eos=stop_at_eos,
                                         on_token=paced)  # fmt: skip
        finally:
            with self.lock:
                self.open -= 1


def _serve(checkpoint, delay_s: float, **app_kw):
    """A served app over the paced engine; returns (the _Served server, the list its engine lands in)."""
    from bench.serve import create_app

    engines = []

    def provider():
        loaded = _loaded(checkpoint, wrap=lambda e: _PacedEngine(e, delay_s))
        engines.append(loaded.engine)
        return loaded

    s = _Served(create_app(provider, model_name=MODEL, warmup_shapes=[(20, MAX_TOKENS)], **app_kw))
    s.wait_ready()
    return s, engines


@pytest.fixture(scope="module")
def batched(tiny_checkpoint):
    """A server with 4 decode slots and room for 12 waiting requests, and the text of each prompt served alone."""
    s, engines = _serve(tiny_checkpoint, 0.004, max_batch=4, max_queue=12)
    s.engine = engines[0]
    s.alone = {p: _body(s.client, p)["choices"][0]["text"] for p in PROMPTS}  # one at a time: each alone
    assert s.engine.most_open == 1
    yield s
    s.stop()


def _body(client, prompt, **kw):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                             "temperature": 0, **kw})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def _metrics(s) -> dict[str, float]:
    from bench.sweep.remote import scrape_metrics

    return scrape_metrics(s.client, s.url)


def _streamed_text(client, prompt, **kw) -> tuple[str, list[dict]]:
    chunks = []
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, **kw}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks


def test_concurrent_greedy_requests_get_the_tokens_they_get_alone(batched):
    results, errors = {}, []

    def client(p):
        try:
            with httpx.Client(base_url=batched.url, timeout=60) as c:
                results[p] = _streamed_text(c, p)[0]
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(p,)) for p in PROMPTS[:4]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and results == {p: batched.alone[p] for p in PROMPTS[:4]}
    assert batched.engine.most_open >= 2  # the requests did share the slots
    m = _metrics(batched)
    assert m["gemma4_bench_max_batch"] == 4 and m["gemma4_bench_slot_occupancy"] == 0
    assert m["gemma4_bench_running_requests"] == m["gemma4_bench_waiting_requests"] == 0
    assert m["gemma4_bench_inter_token_latency_seconds_count"] >= 4 * (MAX_TOKENS - 1)
    assert m["gemma4_bench_queue_time_seconds_count"] >= 4 and m["gemma4_bench_time_to_first_token_seconds_count"] >= 4
    serving = batched.client.get("/health").json()["serving"]
    assert serving["max_batch"] == 4 and serving["max_queue"] == 12 and "sequential" in serving["slot_engine"]


def test_stream_options_usage_and_the_model_card(batched):
    text, chunks = _streamed_text(batched.client, "Bread rises",
                                  stream_options={"include_usage": True, "continuous_usage_stats": True})  # fmt: skip
    assert text == batched.alone["Bread rises"]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    assert [len(c["choices"][0]["token_ids"]) for c in content] == [1] * MAX_TOKENS  # one token per chunk
    assert [c["usage"]["completion_tokens"] for c in content] == list(range(1, MAX_TOKENS + 1))
    finish, last = chunks[-2], chunks[-1]
    assert finish["choices"][0]["finish_reason"] == "length" and finish["server_timing"]["queue_ms"] >= 0
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == MAX_TOKENS  # before [DONE]
    _, plain = _streamed_text(batched.client, "Bread rises")
    assert all("usage" not in c for c in plain)
    card = batched.client.get("/v1/models").json()["data"][0]
    assert {"id", "object", "created", "owned_by", "root"} <= set(card)
    assert card["id"] == MODEL and card["object"] == "model" and card["root"] == MODEL and card["created"] > 0


def test_a_full_queue_is_a_429_with_retry_after_never_a_hang(tiny_checkpoint):
    s, _ = _serve(tiny_checkpoint, 0.05, max_batch=1, max_queue=1)
    try:
        done = []
        body = {"model": MODEL, "prompt": "Tides", "max_tokens": MAX_TOKENS, "temperature": 0}

        def hold():
            with httpx.Client(base_url=s.url, timeout=60) as c:
                done.append(c.post("/v1/completions", json=body).status_code)

        first = threading.Thread(target=hold)
        first.start()
        deadline = time.monotonic() + 30
        while _metrics(s)["gemma4_bench_running_requests"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        second = threading.Thread(target=hold)
        second.start()
        while _metrics(s)["gemma4_bench_waiting_requests"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        t0 = time.monotonic()
        r = s.client.post("/v1/completions", json=body | {"stream": True})
        assert time.monotonic() - t0 < 5  # answered at once
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        err = r.json()["error"]
        assert err["code"] == "queue_full" and err["type"] == "rate_limit_exceeded" and "at most 2" in err["message"]
        first.join(timeout=30)
        second.join(timeout=30)
        assert done == [200, 200]
        assert _body(s.client, "Tides")["usage"]["completion_tokens"] == MAX_TOKENS  # room again
        m = _metrics(s)
        assert m['gemma4_bench_rejected_requests_total{reason="queue_full"}'] == 1
        assert m["gemma4_bench_admitted_requests_total"] == 3
        assert m['gemma4_bench_finished_requests_total{outcome="finished"}'] == 3
    finally:
        s.stop()


def test_a_bounded_load_leaves_the_server_healthy_correct_and_its_metrics_consistent(batched):
    """36 concurrent clients on loopback: 24 well-formed (plain and streamed), 6 that leave after their first token,
    6 malformed, the leaving ones first. Every well-formed one is answered with its alone text or refused with a
    429 (the server holds 16 at most); the counters add up once it is quiet."""
    before = _metrics(batched)
    outcomes: dict[str, list] = {"ok": [], "wrong": [], "429": [], "left": [], "bad": [], "other": []}
    lock = threading.Lock()

    def note(kind, item=None):
        with lock:
            outcomes[kind].append(item)

    def well_formed(k):
        p = PROMPTS[k % len(PROMPTS)]
        with httpx.Client(base_url=batched.url, timeout=60) as c:
            if k % 2:
                r = c.post("/v1/completions", json={"model": MODEL, "prompt": p, "max_tokens": MAX_TOKENS,
                                                    "temperature": 0})  # fmt: skip
                text = r.json()["choices"][0]["text"] if r.status_code == 200 else None
                status = r.status_code
            else:
                body = {"model": MODEL, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
                with c.stream("POST", "/v1/completions", json=body) as r:
                    status = r.status_code
                    if status == 200:
                        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
                        text = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in lines)
                    else:
                        r.read()
        if status == 200:
            note("ok" if text == batched.alone[p] else "wrong", (p, text))
        elif status == 429:
            note("429")
        else:
            note("other", status)

    def leaving(k):
        body = {"model": MODEL, "prompt": PROMPTS[k % len(PROMPTS)], "max_tokens": MAX_TOKENS, "temperature": 0,
                "stream": True}  # fmt: skip
        with httpx.Client(base_url=batched.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                note("429" if r.status_code == 429 else "other", r.status_code)
                return
            for line in r.iter_lines():
                if line.startswith("data: "):
                    note("left")
                    return  # one token arrived: leave with the rest to come

    bad_bodies = [b"{not json", b'{"model": "tiny", "prompt": "x", "max_tokens": "5"}',
                  b'{"model": "tiny", "prompt": "x", "n": 3}', b'{"model": "tiny"}',
                  b'{"model": "tiny", "prompt": "x", "max_tokens": -1}', b"[1]"]  # fmt: skip

    def malformed(k):
        with httpx.Client(base_url=batched.url, timeout=60) as c:
            r = c.post("/v1/completions", content=bad_bodies[k], headers={"content-type": "application/json"})
        note("bad" if r.status_code == 400 and "error" in r.json() else "other", r.status_code)

    def guarded(fn, k):
        try:
            fn(k)
        except Exception as exc:  # noqa: BLE001
            note("other", repr(exc))

    jobs = [(well_formed, k) for k in range(24)] + [(leaving, k) for k in range(6)] + [(malformed, k) for k in range(6)]
    order = jobs[24:30] + [j for pair in zip(jobs[:24:4], jobs[30:]) for j in pair] + [j for i, j in enumerate(jobs[:24]) if i % 4]
    assert sorted(order, key=jobs.index) == jobs
    threads = [threading.Thread(target=guarded, args=job) for job in order]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and time.monotonic() - t0 < 120
    assert outcomes["other"] == [] and outcomes["wrong"] == [], outcomes
    assert len(outcomes["ok"]) + len(outcomes["429"]) + len(outcomes["left"]) == 30 and len(outcomes["bad"]) == 6
    assert len(outcomes["ok"]) + len(outcomes["left"]) >= 16  # a 429 means 16 were in, and those were answered

    # the server is healthy and serves the next request correctly
    assert batched.client.get("/health").status_code == 200
    assert _body(batched.client, PROMPTS[0])["choices"][0]["text"] == batched.alone[PROMPTS[0]]
    deadline = time.monotonic() + 20
    while (m := _metrics(batched))["gemma4_bench_running_requests"] + m["gemma4_bench_waiting_requests"] > 0:
        assert time.monotonic() < deadline, "requests never left"
        time.sleep(0.05)

    def delta(key):
        return m.get(key, 0) - before.get(key, 0)

    answered = len(outcomes["ok"]) + len(outcomes["left"]) + 1  # + the check request above
    rejected = delta('gemma4_bench_rejected_requests_total{reason="queue_full"}')
    statuses = {code: delta(f'gemma4_bench_requests_total{{code="{code}",path="/v1/completions"}}')
                for code in ("200", "400", "429")}  # fmt: skip
    assert rejected == len(outcomes["429"]) == statuses["429"]
    assert statuses["200"] == answered == delta("gemma4_bench_admitted_requests_total")
    assert statuses["400"] == 6
    arrived = sum(delta(k) for k in m if k.startswith("gemma4_bench_requests_total{") and 'path="/v1/completions"' in k)
    assert arrived == len(jobs) + 1 == answered + rejected + statuses["400"]  # requests in = answered + rejected
    finished = {o: delta(f'gemma4_bench_finished_requests_total{{outcome="{o}"}}') for o in
                ("finished", "cancelled", "expired", "error")}  # fmt: skip
    assert sum(finished.values()) == delta("gemma4_bench_admitted_requests_total")  # every admitted one left
    assert finished["error"] == finished["expired"] == 0 and finished["cancelled"] <= len(outcomes["left"])
    assert finished["cancelled"] >= 1 or len(outcomes["left"]) < 3  # leaving mid-stream cancels (15 tokens to go)
    assert finished["finished"] >= len(outcomes["ok"]) + 1
    assert m["gemma4_bench_slot_occupancy"] == 0


def test_the_load_sweep_measures_the_server_with_its_queue_times(batched, tiny_checkpoint, tmp_path):
    """`bench sweep --target --concurrency` against this project's server: valid levels, nothing compiled, the
    server's queue time in every sample, its /v1/models and /health (with the scheduler's settings) recorded."""
    from bench.cli import main
    from bench.runs import open_run, validate_run

    main(["sweep", "--target", f"{batched.url}/v1", "--model", MODEL, "--checkpoint", str(tiny_checkpoint),
          "--inputs", "20", "--max-new-tokens", str(MAX_TOKENS), "--concurrency", "1,4", "--num-requests", "8",
          "--runs-dir", str(tmp_path), "--name", "load"])  # fmt: skip
    (folder,) = list(tmp_path.iterdir())
    assert validate_run(folder) == []
    run = open_run(folder)
    rows = run.load_rows()
    assert [r.concurrency for r in rows] == [1, 4] and all(r.valid and r.compile_events == 0 for r in rows), rows
    timed = [s for s in run.load_samples() if s.kind == "timed"]
    assert all(s.queue_ms is not None and s.content_chunks == s.generated_tokens == MAX_TOKENS for s in timed)
    assert rows[1].queue_ms_p99 >= rows[0].queue_ms_median  # 8 requests for 4 slots: some waited
    notes = run.manifest["engine_config"]
    assert notes["serving"]["max_batch"] == 4 and notes["load"]["num_requests"] == 8
    assert run.manifest["target"]["models"]["data"][0]["root"] == MODEL


def test_a_deadline_stops_a_running_request_and_refuses_a_waiting_one(tiny_checkpoint):
    """--request-deadline 0.3 s with one slot and 0.4 s per token: the running request is stopped after its first
    token (200, finish_reason "length"); the one waiting behind it is refused, 503 "deadline_exceeded"."""
    s, _ = _serve(tiny_checkpoint, 0.4, max_batch=1, max_queue=4, request_deadline_s=0.3)
    try:
        answers = {}
        body = {"model": MODEL, "prompt": "Tides", "max_tokens": MAX_TOKENS, "temperature": 0}

        def send(name):
            with httpx.Client(base_url=s.url, timeout=60) as c:
                answers[name] = c.post("/v1/completions", json=body)

        first = threading.Thread(target=send, args=("first",))
        first.start()
        deadline = time.monotonic() + 30
        while _metrics(s)["gemma4_bench_running_requests"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        send("second")
        first.join(timeout=30)
        ran, waited = answers["first"], answers["second"]
        assert ran.status_code == 200 and ran.json()["usage"]["completion_tokens"] < MAX_TOKENS
        assert ran.json()["choices"][0]["finish_reason"] == "length"
        assert waited.status_code == 503 and waited.json()["error"]["code"] == "deadline_exceeded"
        assert waited.headers["Retry-After"] == "1"
        assert _metrics(s)['gemma4_bench_finished_requests_total{outcome="expired"}'] == 2
    finally:
        s.stop()


def test_bad_scheduler_options_are_refused_in_one_line_before_the_port_opens():
    from conftest import assert_one_line_error, run_cli_here

    from bench.cli.serve_cmds import _check_options
    from bench.errors import InputError

    for kw, flag in (({"max_batch": 0}, "--max-batch 0"), ({"max_queue": -1}, "--max-queue -1"),
                     ({"request_deadline": 0.0}, "--request-deadline 0.0")):  # fmt: skip
        with pytest.raises(InputError, match=flag):
            _check_options(None, 8000, 1024, None, **kw)
    assert_one_line_error(run_cli_here(["serve", "--max-batch", "0"]), "--max-batch 0", "decode slots")
