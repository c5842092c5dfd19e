"""`bench serve` on the batched decode slots (`BatchedSlots`), over real HTTP on loopback with the tiny checkpoint:
greedy requests that join at different steps get the tokens they get served alone, each scheduler step is one
batched decode step, joining and leaving compile nothing after warm-up, a client that leaves frees its slot for the
next request, a prompt + max_tokens beyond the slots' --max-length is a 400, and slots that do not fit in memory
stop `bench serve` at start-up with the arithmetic in one line.

The slots are wrapped (`_PacedSlots`) to pause a little before each step, so requests overlap on a 2-core machine,
and to record how many slots were occupied at once. Every request uses the warmed-up shape (bucket 32, greedy).
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from conftest import assert_one_line_error, run_cli
from test_serve import MODEL, _Served

from bench.serve.slots import BatchedSlots

MAX_TOKENS = 16
MAX_LENGTH = 64  # the slots' cache: positions per slot
PROMPTS = ["The garden", "A weather station", "Timetables and trains", "The old harbour"]


class _PacedSlots(BatchedSlots):
    """`BatchedSlots`, pausing `delay_s` before each step; `most_occupied`: most slots stepped at once."""

    def __init__(self, engine, max_batch: int, delay_s: float):
        super().__init__(engine, max_batch)
        self.delay_s, self.most_occupied = delay_s, 0

    def step(self, slots):
        self.most_occupied = max(self.most_occupied, len(slots))
        time.sleep(self.delay_s)
        return super().step(slots)


@pytest.fixture(scope="module")
def served(tiny_checkpoint):
    """A server with 3 batched slots of 64 positions (warmed up at 20 prompt tokens), the app's state, and each
    prompt's tokens served alone (one request at a time)."""
    from bench.serve import LoadedModel, create_app
    from model.engine import load_engine

    made = []

    def provider():
        engine, _ = load_engine(tiny_checkpoint, max_length=MAX_LENGTH)
        ck = {"id": MODEL, "source": None, "content_hash": None, "weight_bytes": engine.weight_bytes}
        return LoadedModel(engine=engine, checkpoint=ck, build_id="test-build")

    def factory(engine, max_batch):
        made.append(_PacedSlots(engine, max_batch, 0.01))
        return made[-1]

    app = create_app(provider, model_name=MODEL, warmup_shapes=[(20, MAX_TOKENS)], max_batch=3, max_queue=8,
                     slots_factory=factory)  # fmt: skip
    s = _Served(app)
    s.health = s.wait_ready()
    s.state, s.slots = app.state.server, made[0]
    s.alone = {p: _streamed_ids(s.client, p) for p in PROMPTS}
    assert s.slots.most_occupied == 1
    yield s
    s.stop()


def _streamed_ids(client, prompt, **kw) -> list[int]:
    import json

    ids = []
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, **kw}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    ids += chunk["choices"][0].get("token_ids") or []
    return ids


def test_requests_joining_at_different_steps_get_their_tokens_alone_in_one_step_per_scheduler_step(served):
    from model.engine import CompileCounter

    results, errors = {}, []

    def client(prompt, delay_s):
        time.sleep(delay_s)
        try:
            with httpx.Client(base_url=served.url, timeout=60) as c:
                results[prompt] = _streamed_ids(c, prompt)
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    traces0, steps0 = CompileCounter.traces, served.state.scheduler.steps
    decoder_steps0 = served.slots.decoder.steps
    threads = [threading.Thread(target=client, args=(p, 0.04 * k)) for k, p in enumerate(PROMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and results == served.alone  # 4 requests, 3 slots: the last joins a freed slot
    assert all(len(ids) == MAX_TOKENS for ids in results.values())
    assert served.slots.most_occupied >= 2  # they did share the batch
    assert CompileCounter.traces == traces0  # joining, stepping and leaving compiled nothing after warm-up
    # one batched decode step (one jitted call for every slot) per scheduler step
    assert served.slots.decoder.steps - decoder_steps0 == served.state.scheduler.steps - steps0 > 0


def test_health_names_the_batched_slots_and_their_length(served):
    serving = served.health.json()["serving"]
    assert serving["max_batch"] == 3 and serving["slot_positions"] == MAX_LENGTH
    assert serving["slot_engine"].startswith("batched: 3 slots decoded together")
    assert "a step decodes 1 or 3 rows" in serving["slot_engine"]  # model.slots.row_counts(3) == (1,)


def test_a_request_beyond_the_slots_length_is_a_400_naming_max_tokens(served):
    r = served.client.post("/v1/completions", json={"model": MODEL, "prompt": "The garden", "max_tokens": 63,
                                                     "temperature": 0})  # fmt: skip
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert "exceed this server's context (--max-length) of 64 tokens" in err["message"]


def test_a_client_leaving_frees_its_slot_for_the_next_request(served):
    import json

    from bench.sweep.remote import scrape_metrics

    cancelled0 = scrape_metrics(served.client, served.url).get("gemma4_bench_cancelled_requests_total", 0)
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    with httpx.Client(base_url=served.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["token_ids"]:
                break  # one token arrived; leave with 15 still to come
    deadline = time.monotonic() + 30
    while served.state.scheduler.running:  # freed at the next step boundary
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert served.slots.decoder.active == ()
    assert _streamed_ids(served.client, PROMPTS[1]) == served.alone[PROMPTS[1]]
    assert scrape_metrics(served.client, served.url)["gemma4_bench_cancelled_requests_total"] == cancelled0 + 1


def test_bench_serve_refuses_slots_that_do_not_fit_at_start_up(tiny_checkpoint):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_cli(["serve", "--checkpoint", str(tiny_checkpoint), "--port", str(port), "--max-batch",
                    str(10**12)], timeout=300)  # fmt: skip
    assert_one_line_error(proc, f"--max-batch {10**12} does not fit", "256 positions per slot, --max-length",
                          "lower --max-batch or --max-length")  # fmt: skip
    assert proc.stderr.count("does not fit") == 1, proc.stderr  # said once: not also logged as "loading failed"
