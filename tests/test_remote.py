"""`bench sweep --target` against a fake OpenAI-compatible endpoint (no engine, no jax on the server side): the
remote sweep honours the stop flag and the signals of the in-process sweep (SIGTERM / Ctrl-C finish the request in
flight and stop before the next one; a second signal abandons it), keeps finished cells, marks the run incomplete,
ends with the same lines and exit code 130 as the in-process path, and resumes.

The fake server streams one content chunk per token and counts prompt tokens with the same tokenizer the client
sizes prompts with (BOS and chat template included), so every cell has its exact input size. It is not this
project's server (no /metrics), so compile events are unobservable and the cells are recorded invalid; these tests
check what was kept, not validity. With `on_metrics` it also serves a /metrics that says it is this project's
server (and nothing else), so the client scrapes it around the sweep.

However a sweep ends once its run folder exists (finished, stopped, a signal, an error), the run is not left
"running" and its lock is released.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import assert_one_line_error, run_cli

from bench.runs import open_run, validate_run
from bench.sweep.local import StopSignals, SweepConfig

MODEL = "fake-gemma"


class FakeEndpoint:
    """An OpenAI-compatible server in a thread on a free loopback port: GET /v1/models, streamed POST
    /v1/chat/completions. `on_request(k)` runs in the server thread when chat request k (1-based) arrives, before
    its answer; `chunk_delay_s` spaces the content chunks. `requests` counts chat requests, `completed` those whose
    whole stream was written, `broken` those whose client left mid-stream."""

    def __init__(self, tokenizer, *, on_request: Callable[[int], None] = lambda _: None, chunk_delay_s: float = 0.0,
                 on_metrics: Callable[[int], None] | None = None, miscount: int = 0,
                 api_key: str | None = None):  # fmt: skip
        self.tokenizer, self.on_request, self.chunk_delay_s = tokenizer, on_request, chunk_delay_s
        self.api_key = api_key  # None: open; else every request must carry `Authorization: Bearer <api_key>` (401)
        self.unauthorized = 0
        self.miscount = miscount  # added to the prompt tokens the server reports (a different tokenizer/template)
        self.on_metrics = on_metrics  # None: no /metrics; else it runs before /metrics scrape k (1-based) is answered
        self.requests = self.completed = self.broken = self.scrapes = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:  # quiet
                pass

            def refused(self) -> bool:
                if fake.api_key is None or self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                    return False
                fake.unauthorized += 1
                self.send_error(401)
                return True

            def do_GET(self) -> None:
                if self.refused():
                    return
                if self.path == "/metrics" and fake.on_metrics is not None:
                    with fake.lock:
                        fake.scrapes += 1
                        k = fake.scrapes
                    fake.on_metrics(k)
                    body = b"# TYPE gemma4_bench_ready gauge\ngemma4_bench_ready 1\n"  # says: this project's server
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.path != "/v1/models":
                    self.send_error(404)
                    return
                body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if self.refused():
                    return
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests += 1
                    k = fake.requests
                fake.on_request(k)
                fake.answer(self, request)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, handler: BaseHTTPRequestHandler, request: dict) -> None:
        n_prompt = len(self.tokenizer.chat_ids(request["messages"][0]["content"])) + self.miscount
        n_new = request["max_tokens"]
        handler.protocol_version = "HTTP/1.0"  # the stream ends when the connection closes
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()

        def event(obj) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            handler.wfile.write(f"data: {data}\n\n".encode())
            handler.wfile.flush()

        def chunk(delta: dict) -> dict:
            return {"object": "chat.completion.chunk", "model": MODEL, "choices": [{"index": 0, "delta": delta}]}

        try:
            event(chunk({"role": "assistant"}))
            for i in range(n_new):
                time.sleep(self.chunk_delay_s)
                event(chunk({"content": f" word{i}"}))
            event({"object": "chat.completion.chunk", "model": MODEL, "choices": [],
                   "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_new}})  # fmt: skip
            event("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            self.broken += 1
            return
        self.completed += 1

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from model.tokenizer import GemmaTokenizer

    return GemmaTokenizer.from_dir(tiny_checkpoint)


@pytest.fixture
def endpoint(tokenizer):
    servers = []

    def make(**kwargs) -> FakeEndpoint:
        servers.append(FakeEndpoint(tokenizer, **kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


# Inputs 20 and 28, 2 repeats: requests 1-4 are cell 20 (cold, warm-up, 2 timed), 5-7 cell 28 (warm-up, 2 timed).
ARGS = ["--inputs", "20,28", "--max-new-tokens", "4", "--repeats", "2", "--model", MODEL]


def test_stop_flag_set_mid_sweep_keeps_finished_cells_and_marks_the_run_incomplete(endpoint, tiny_checkpoint, tmp_path):
    from bench.sweep.remote import sweep_target

    lines: list[str] = []
    stop = StopSignals(lines.append)
    fake = endpoint(on_request=lambda k: stop.request() if k == 4 else None)  # during cell 20's last request
    config = SweepConfig(inputs=(20, 28), max_new_tokens=4, repeats=2)
    with pytest.raises(KeyboardInterrupt):
        sweep_target(fake.url, MODEL, config, checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name="cut",
                     progress=lines.append, stop=stop)  # fmt: skip
    assert fake.requests == fake.completed == 4  # the request in flight finished; none started after the flag
    (folder,) = list(tmp_path.iterdir())
    run = open_run(folder)
    assert run.status == "incomplete" and run.finished_inputs() == [20]
    assert [s.kind for s in run.samples()] == ["cold", "warmup", "timed", "timed"]
    assert validate_run(folder) == []
    assert StopSignals.MESSAGE in lines and any(line.startswith("sweep incomplete in") for line in lines)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers were restored


def _sweep_process(url: str, checkpoint, runs, *extra: str) -> subprocess.Popen:
    code = "import sys; from bench.cli import main; main(sys.argv[1:])"
    args = ["sweep", "--target", url, "--checkpoint", str(checkpoint), *ARGS, "--runs-dir", str(runs), *extra]
    return subprocess.Popen([sys.executable, "-c", code, *args], env=dict(os.environ, JAX_PLATFORMS="cpu"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.mark.slow
def test_sigterm_stops_the_remote_sweep_like_the_in_process_one_and_it_resumes(endpoint, tiny_checkpoint, tmp_path):
    runs = tmp_path / "runs"
    procs: list[subprocess.Popen] = []

    def on_request(k: int) -> None:
        if k == 4:  # cell 20's last request: it must finish, so that cell is kept
            procs[0].send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the handler has run while the request is in flight

    fake = endpoint(on_request=on_request)
    procs.append(_sweep_process(fake.url, tiny_checkpoint, runs, "--name", "cut"))
    _, err = procs[0].communicate(timeout=120)
    assert procs[0].returncode == 130, err  # as the in-process path: KeyboardInterrupt -> exit code 130
    assert StopSignals.MESSAGE in err and err.splitlines()[-1].startswith("sweep incomplete in")
    assert "Traceback" not in err
    assert fake.requests == fake.completed == 4
    (folder,) = list(runs.iterdir())
    run = open_run(folder)
    assert run.status == "incomplete" and run.finished_inputs() == [20]
    assert validate_run(folder) == []

    resumed = run_cli(["sweep", "--target", fake.url, "--checkpoint", str(tiny_checkpoint), *ARGS,
                       "--resume", folder.name, "--runs-dir", str(runs)], env={"JAX_PLATFORMS": "cpu"},
                      timeout=120)  # fmt: skip  (a run name, as `bench runs list` prints it)
    assert resumed.returncode == 0, resumed.stderr
    run = open_run(folder)
    assert run.status == "complete" and run.finished_inputs() == [20, 28]
    # the resumed process's first request is cold too, but not the run's cold start (cell 20 holds that one)
    assert [s.kind for s in run.samples() if s.input_tokens == 28] == ["cold-resume", "warmup", "timed", "timed"]
    assert run.cells()[1].cold_request_s is None and run.cells()[0].cold_request_s is not None


@pytest.mark.slow
def test_a_second_signal_abandons_the_request_in_flight(endpoint, tiny_checkpoint, tmp_path):
    runs = tmp_path / "runs"
    procs: list[subprocess.Popen] = []

    def on_request(k: int) -> None:
        if k == 2:  # cell 20's warm-up, streamed slowly: the client leaves mid-stream
            procs[0].send_signal(signal.SIGINT)
            time.sleep(0.3)
            procs[0].send_signal(signal.SIGINT)

    fake = endpoint(on_request=on_request, chunk_delay_s=0.5)
    procs.append(_sweep_process(fake.url, tiny_checkpoint, runs, "--name", "cut2"))
    _, err = procs[0].communicate(timeout=120)
    assert procs[0].returncode == 130, err  # the second signal ends the process at once (bench.signals.stop_now)
    assert err.splitlines()[-1] == StopSignals.HARD_STOP and "Traceback" not in err
    deadline = time.monotonic() + 10
    while fake.broken + fake.completed < 2 and time.monotonic() < deadline:  # the server notices on its next write
        time.sleep(0.05)
    assert fake.requests == 2 and fake.completed == 1 and fake.broken == 1
    (folder,) = list(runs.iterdir())
    run = open_run(folder)
    assert run.status == "incomplete" and run.finished_inputs() == []
    assert [s.kind for s in run.samples()] == ["cold"]  # the request that came back is kept; the abandoned one not
    assert validate_run(folder) == []


def test_a_size_below_the_smallest_chat_prompt_is_refused_before_anything_is_created(endpoint, tokenizer,
                                                                                     tiny_checkpoint, tmp_path):  # fmt: skip
    from bench.errors import InputError
    from bench.measure.prompts import min_prompt_tokens
    from bench.sweep.remote import sweep_target

    minimum = min_prompt_tokens(tokenizer)
    fake = endpoint()
    config = SweepConfig(inputs=(20, minimum - 1), max_new_tokens=4, repeats=1)
    with pytest.raises(InputError, match=f"--inputs {minimum - 1}: below the smallest possible prompt.*"
                                         f"pass --inputs {minimum} or more"):  # fmt: skip
        sweep_target(fake.url, MODEL, config, checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name="x",
                     stop=StopSignals())  # fmt: skip
    assert fake.requests == 0 and not any(tmp_path.iterdir())


def _stopped_run(endpoint, tiny_checkpoint, tmp_path):
    """A remote run stopped after cell 20 (incomplete, resumable), with its target.json."""
    from bench.sweep.remote import sweep_target

    stop = StopSignals()
    fake = endpoint(on_request=lambda k: stop.request() if k == 4 else None)
    config = SweepConfig(inputs=(20, 28), max_new_tokens=4, repeats=2)
    with pytest.raises(KeyboardInterrupt):
        sweep_target(fake.url, MODEL, config, checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name="cut", stop=stop)
    (folder,) = list(tmp_path.iterdir())
    assert open_run(folder).status == "incomplete" and (folder / "target.json").is_file()
    return fake, config, folder


def test_a_resume_with_a_corrupt_target_json_is_refused_and_leaves_the_run_as_it_was(endpoint, tiny_checkpoint,
                                                                                       tmp_path):  # fmt: skip
    from bench.errors import RunFolderError
    from bench.sweep.remote import sweep_target

    fake, config, folder = _stopped_run(endpoint, tiny_checkpoint, tmp_path)
    for corrupt in ("{not json", "[1, 2]"):
        (folder / "target.json").write_text(corrupt)
        manifest = (folder / "manifest.json").read_bytes()
        with pytest.raises(RunFolderError, match="target.json"):
            sweep_target(fake.url, MODEL, config, checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name=None,
                         resume=folder, stop=StopSignals())  # fmt: skip
        assert (folder / "manifest.json").read_bytes() == manifest and open_run(folder).status == "incomplete"
        assert not (folder / ".lock").exists()


def test_an_error_after_the_resume_ends_the_run_failed_and_unlocked(endpoint, tiny_checkpoint, tmp_path, monkeypatch):
    import bench.sweep.remote
    from bench.sweep.remote import sweep_target

    fake, config, folder = _stopped_run(endpoint, tiny_checkpoint, tmp_path)

    def broken(*_args, **_kwargs):
        raise RuntimeError("the disk is gone")

    monkeypatch.setattr(bench.sweep.remote, "run_remote_sweep", broken)
    lines: list[str] = []
    with pytest.raises(RuntimeError):
        sweep_target(fake.url, MODEL, config, checkpoint=str(tiny_checkpoint), runs_dir=tmp_path, name=None,
                     resume=folder, progress=lines.append, stop=StopSignals())  # fmt: skip
    assert open_run(folder).status == "failed" and not (folder / ".lock").exists()
    assert lines[-1].startswith("sweep failed in") and validate_run(folder) == []
    assert json.loads((folder / "target.json").read_text())["url"] == fake.url  # written at the end, as ever


@pytest.mark.slow
def test_ctrl_c_during_the_first_metrics_scrape_of_the_run_ends_it_incomplete(endpoint, tiny_checkpoint, tmp_path):
    """Between the run's creation and its first request the client scrapes /metrics (read timeout up to 30 min):
    Ctrl-C there stops the sweep like anywhere else, the run marked incomplete, unlocked, exit code 130."""
    runs = tmp_path / "runs"
    procs: list[subprocess.Popen] = []

    def on_metrics(k: int) -> None:
        if k == 2:  # scrape 1 describes the target, before the run; scrape 2 is the run's baseline
            procs[0].send_signal(signal.SIGINT)
            time.sleep(0.5)

    fake = endpoint(on_metrics=on_metrics)
    procs.append(_sweep_process(fake.url, tiny_checkpoint, runs, "--name", "scrape"))
    _, err = procs[0].communicate(timeout=120)
    assert procs[0].returncode == 130, err
    assert fake.scrapes >= 2 and fake.requests == 0, err  # stopped before the first request
    (folder,) = list(runs.iterdir())
    run = open_run(folder)
    assert run.status == "incomplete" and not (folder / ".lock").exists(), err
    assert err.splitlines()[-1].startswith("sweep incomplete in") and "Traceback" not in err
    assert validate_run(folder) == []


def test_failed_cells_keep_the_run_and_exit_1(endpoint, tiny_checkpoint, tmp_path):
    """A server whose prompt token counts disagree with the sizing tokenizer fails every cell (TargetError): the
    table and the run folder keep the failed cells, and the exit code says so (it was 0)."""
    fake = endpoint(miscount=3)
    runs = tmp_path / "runs"
    proc = run_cli(["sweep", "--target", fake.url, "--checkpoint", str(tiny_checkpoint), *ARGS, "--runs-dir",
                    str(runs)], env={"JAX_PLATFORMS": "cpu"}, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert any("cell(s) [20, 28] failed" in line for line in proc.stderr.splitlines()), proc.stderr
    (folder,) = list(runs.iterdir())
    assert validate_run(folder) == [] and [c.status for c in open_run(folder).cells()] == ["failed", "failed"]


def test_an_api_key_goes_with_every_request_and_into_no_file(endpoint, tiny_checkpoint, tmp_path):
    """`--api-key` (or $GEMMA4_BENCH_API_KEY) is sent as a Bearer token on every request of a remote sweep, and no
    file of the run folder holds it; without it, a keyed server refuses the sweep in one line."""
    fake = endpoint(api_key="s3cret-key")
    runs = tmp_path / "runs"
    base = ["sweep", "--target", fake.url, "--checkpoint", str(tiny_checkpoint), *ARGS, "--runs-dir", str(runs)]
    refused = run_cli([*base, "--name", "nokey"], env={"JAX_PLATFORMS": "cpu"}, timeout=120)
    assert_one_line_error(refused, "401", "API key", "--api-key", "$GEMMA4_BENCH_API_KEY")
    assert fake.unauthorized >= 1 and fake.requests == 0
    proc = run_cli([*base, "--name", "keyed"], env={"JAX_PLATFORMS": "cpu", "GEMMA4_BENCH_API_KEY": "s3cret-key"},
                   timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in runs.iterdir() if "keyed" in p.name]
    assert validate_run(folder) == [] and fake.requests == 7
    assert not any("s3cret-key" in f.read_text(errors="replace") for f in folder.rglob("*") if f.is_file())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("command_line", None)  # the command line as typed names the folder; nothing else may
    assert manifest["engine_config"]["prompt_tokenizer"] == tiny_checkpoint.resolve().name  # its id, no path
    assert not {str(tiny_checkpoint), str(tiny_checkpoint.resolve())} & set(json.dumps(manifest).split('"'))
