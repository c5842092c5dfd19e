"""The transformers peer's harness side (no torch): the plan, the import of raw requests into a run folder, the
report and compare over it, and bad files as one clear line (bench/sweep/peer.py, bench/cli/peer_cmds.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import bench_captured
from runfolders import MAX_NEW, make_measured_run

from bench.runs import Manifest, PeerEngine, build_manifest, open_run, summarize_cell, validate_run
from bench.runs.manifest import CheckpointFacts, CompileCacheFacts, EngineConfig, TargetFacts, Workload
from bench.sweep.peer import FORMAT_VERSION, PLAN_FORMAT, RAW_FORMAT, PeerError, import_peer, read_requests

SIZES, REPEATS, HASH = (41, 521), 2, "sha256:feed"  # HASH: the checkpoint hash runfolders.manifest records
IDS = [11, 22, 33, 44, 55, 66, 77, 88]


def _plan(sizes=SIZES, max_new: int = MAX_NEW, repeats: int = REPEATS) -> dict:
    prompts = [{"input_tokens": n, "text": f"prompt of {n}", "ids": [2] + [(7 * i) % 500 + 3 for i in range(n - 1)]}
               for n in sizes]  # fmt: skip
    return {"format": PLAN_FORMAT, "format_version": FORMAT_VERSION, "max_new_tokens": max_new, "repeats": repeats,
            "checkpoint": {"path": "/nowhere/default", "id": "default-bfloat16-seed0-v1", "source": "builtin:default",
                           "content_hash": HASH}, "prompts": prompts}  # fmt: skip


def _request(prompt: dict, kind: str, repeat: int, t0: int, *, ttft_ms: float, step_ms: float, ids=IDS) -> dict:
    """A raw request whose first id arrives `ttft_ms` after the start (tokenization 1 ms of it), then one id every
    `step_ms`; detokenization 1 ms."""
    ms = 1_000_000
    first = t0 + int(ttft_ms * ms)
    stamps = [first + int(i * step_ms * ms) for i in range(len(ids))]
    return {"record": "request", "input_tokens": prompt["input_tokens"], "kind": kind, "repeat": repeat,
            "prompt_ids": prompt["ids"], "token_ids": list(ids), "t_start_ns": t0, "t_prefill_ns": t0 + ms,
            "t_token_ns": stamps, "t_end_ns": stamps[-1] + ms, "compile_events": 0}  # fmt: skip


def _records(plan: dict, *, ids=IDS, step_ms: float = 100.0) -> list[dict]:
    header = {"record": "header", "format": RAW_FORMAT, "format_version": FORMAT_VERSION, "plan": plan,
              "engine": {"name": "transformers", "version": "5.24.0", "framework": "torch 2.13.0+cpu",
                         "settings": {"threads": 2, "attn_implementation": "sdpa", "dtype": "float32"}},
              "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0"},
              "command_line": ["transformers_peer.py", "plan.json", "requests.jsonl"], "device": "cpu",
              "weight_bytes": 1000, "load_s": 1.5, "started_at": "2026-12-01T10:00:00+00:00"}  # fmt: skip
    out, t = [header], 10**12
    for i, prompt in enumerate(plan["prompts"]):
        kinds = ([("cold", 0)] if i == 0 else []) + [("warmup", 0)] + [("timed", r) for r in range(plan["repeats"])]
        for kind, repeat in kinds:
            ttft = 300.0 if kind == "cold" else 20.0 + prompt["input_tokens"] / 10 + repeat
            out.append(_request(prompt, kind, repeat, t, ttft_ms=ttft, step_ms=step_ms + repeat, ids=ids))
            t += 10**10
    return out + [{"record": "end", "ended_at": "2026-12-01T10:01:00+00:00"}]


def _write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# ---- the plan ---------------------------------------------------------------------------------------------------------
def test_the_plan_holds_the_sweeps_own_prompts_and_the_checkpoint_hash(tiny_checkpoint: Path, tmp_path: Path, capsys):
    from bench.sweep.local import sized_prompt
    from model.checkpoint import content_hash
    from model.tokenizer import GemmaTokenizer

    out = tmp_path / "plan" / "plan.json"
    code, _, err = bench_captured(["peer", "plan", "-c", str(tiny_checkpoint), "--inputs", "30,45", "--max-new-tokens",
                                   "4", "--repeats", "2", "--out", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    plan = json.loads(out.read_text())
    assert (plan["format"], plan["max_new_tokens"], plan["repeats"]) == (PLAN_FORMAT, 4, 2)
    assert plan["checkpoint"]["content_hash"] == content_hash(tiny_checkpoint)
    assert plan["checkpoint"]["path"] == str(tiny_checkpoint.resolve()) and plan["checkpoint"]["source"] is None
    tok = GemmaTokenizer.from_dir(tiny_checkpoint)
    for p, n in zip(plan["prompts"], (30, 45)):
        want = sized_prompt(tok, n)
        assert (p["input_tokens"], p["text"], p["ids"]) == (n, want.text, list(want.ids)) and len(p["ids"]) == n


def test_a_plan_below_the_smallest_prompt_is_one_clear_line(tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    code, _, err = bench_captured(["peer", "plan", "-c", str(tiny_checkpoint), "--inputs", "3", "--out",
                                   str(tmp_path / "p.json")], capsys)  # fmt: skip
    assert code == 2 and err.count("error:") == 1 and "--inputs 3" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


# ---- the import -------------------------------------------------------------------------------------------------------
def test_the_import_writes_a_complete_valid_run_with_the_sweeps_cells(tmp_path: Path) -> None:
    raw = _write(tmp_path / "requests.jsonl", _records(_plan()))
    run = import_peer(raw, tmp_path / "runs", None)
    assert run.path.name == "2026-12-01-transformers-cpu" and validate_run(run.path) == []
    again = open_run(run.path)
    m = again.typed_manifest
    assert (again.status, m.provenance.kind, m.command) == ("complete", "measured", "peer")
    assert m.peer == PeerEngine.from_dict(again.manifest["peer"]) and m.peer.label == "transformers 5.24.0"
    assert re.fullmatch(r"transformers-5\.24\.0-[0-9a-f]{12}", m.build_id)  # never 12 bare hex, as ours are
    assert m.versions["torch"] == "2.13.0+cpu" and "jax" not in m.versions and m.host["python"] == "3.11.7"
    assert (m.checkpoint.content_hash, m.checkpoint.weight_bytes, m.started_at) == (HASH, 1000, "2026-12-01T10:00:00+00:00")
    assert m.workload.inputs == SIZES and m.workload.max_new_tokens == MAX_NEW and m.engine.compute_dtype == "float32"
    samples = again.samples()
    assert [s.kind for s in samples] == ["cold", "warmup", "timed", "timed", "warmup", "timed", "timed"]
    s = samples[2]  # 41 tokens, timed 0: first id at 24.1 ms, then one every 100 ms, end 1 ms after the last
    assert s.ttft_ms == pytest.approx(24.1) and s.prefill_ms == pytest.approx(23.1)
    assert s.decode_ms == pytest.approx(700.0) and s.gauge_tok_s == pytest.approx(7 / 0.7)
    assert s.e2e_ms == pytest.approx(725.1) and s.tpot_ms == pytest.approx((725.1 - 24.1) / 7)
    assert s.step_ms == [pytest.approx(100.0)] * 7 and s.degenerate is False and s.token_ids == IDS
    for row in again.cells():  # the sweep's own summary of the same samples
        mine = [x for x in samples if x.input_tokens == row.input_tokens]
        assert row == summarize_cell(mine, max_new_tokens=MAX_NEW, bucket=None)
        assert row.valid and row.bucket is None and row.repeats == REPEATS
    assert again.cells()[0].cold_ttft_ms == pytest.approx(300.0) and again.cells()[1].cold_ttft_ms is None


def test_a_failed_cell_is_kept_as_failed(tmp_path: Path) -> None:
    records = _records(_plan())
    records = [r for r in records if r.get("input_tokens") != 521]
    records.insert(-1, {"record": "failed", "input_tokens": 521, "error": "RuntimeError: out of memory"})
    run = import_peer(_write(tmp_path / "r.jsonl", records), tmp_path / "runs", "peer")
    rows = {r.input_tokens: r for r in run.cells()}
    assert rows[41].valid and rows[521].status == "failed" and rows[521].error == "RuntimeError: out of memory"


def test_the_peer_manifest_is_built_by_the_one_builder_and_never_with_a_target() -> None:
    peer = PeerEngine(name="transformers", version="5.24.0", framework="torch 2.13.0+cpu", settings={"threads": 2},
                      versions={"python": "3.11.7"})  # fmt: skip
    facts = dict(checkpoint=CheckpointFacts(id="x", content_hash=HASH), engine=EngineConfig(), workload=Workload(),
                 device={}, dtype_policy=None, compile_cache=CompileCacheFacts())  # fmt: skip
    m = build_manifest("peer", peer=peer, **facts)
    assert Manifest.from_dict(m.to_dict() | {"name": "a-peer-run"}).peer == peer
    assert m.build_id == peer.build_id(EngineConfig(), HASH)
    other = PeerEngine(name="transformers", version="5.24.0", framework="torch 2.13.0+cpu", settings={"threads": 1})
    assert other.build_id(EngineConfig(), HASH) != m.build_id  # its settings are part of the build
    assert build_manifest("sweep", **facts).peer is None
    with pytest.raises(ValueError, match="not both"):
        build_manifest("peer", peer=peer, target=TargetFacts(build_id=None, description={}), **facts)


# ---- report and compare -----------------------------------------------------------------------------------------------
def test_report_and_compare_put_the_peer_beside_our_run(tmp_path: Path) -> None:
    from bench.report import build_report
    from bench.report.compare import compare_runs

    runs = tmp_path / "runs"
    ours = make_measured_run(runs, "ours", inputs=SIZES, gauge=30.0, token_ids=lambda n: IDS)
    peer = import_peer(_write(tmp_path / "r.jsonl", _records(_plan())), runs, None)
    report = build_report([], tmp_path / "out", runs_dir=runs)
    text = report.markdown.read_text()
    assert "| transformers 5.24.0 (peer) |" in text and "split from G1 by method: in-process vs transformers" in text
    result = compare_runs(ours.path, peer.path, max_slowdown_pct=100.0, require_same_tokens=True)
    assert [t.status for t in result.tokens] == ["identical", "identical"] and result.passed
    assert result.single_variable is False and any(d.field == "build id" for d in result.differences)
    assert not compare_runs(ours.path, peer.path, require_same_tokens=True).passed  # 3x slower than ours: > 5%
    other = import_peer(_write(tmp_path / "o.jsonl", _records(_plan(), ids=IDS[:3] + [9, 9, 8, 7, 6])), runs, "other")
    diverged = compare_runs(ours.path, other.path, max_slowdown_pct=100.0, require_same_tokens=True)
    assert [t.first_divergence for t in diverged.tokens] == [3, 3] and not diverged.passed


def test_compare_cli_accepts_the_peer(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    make_measured_run(runs, "ours", inputs=SIZES, gauge=5.0, token_ids=lambda n: IDS)  # slower than the peer
    import_peer(_write(tmp_path / "r.jsonl", _records(_plan())), runs, None)
    code, out, _ = bench_captured(["compare", "2026-11-30-ours-cpu", "2026-12-01-transformers-cpu",
                                   "--require-same-tokens", "--runs-dir", str(runs)], capsys)  # fmt: skip
    assert code == 0 and "verdict: PASS" in out and out.count("identical") == 2


# ---- bad files --------------------------------------------------------------------------------------------------------
def _bad(kind: str, tmp_path: Path) -> Path:
    good = _records(_plan())
    path = tmp_path / "bad.jsonl"
    if kind == "missing":
        return path
    if kind == "not json":
        return _write(path, good[:2] + ["{not json"] + good[2:])
    if kind == "unfinished":
        return _write(path, good[:-1])
    if kind == "another prompt":
        good[3]["prompt_ids"] = good[3]["prompt_ids"][:-1] + [4]
    if kind == "a repeat missing":
        del good[4]
    if kind == "another format":
        good[0]["format_version"] = 99
    if kind == "times out of order":
        good[2]["t_token_ns"] = good[2]["t_token_ns"][::-1]
    return _write(path, good)


@pytest.mark.parametrize("kind,needle", [
    ("missing", "cannot read"), ("not json", "bad.jsonl:3: not JSON"), ("unfinished", "did not finish"),
    ("another prompt", "differ from the plan"), ("a repeat missing", "expected one warm-up"),
    ("another format", "version 99"), ("times out of order", "out of order"),
])  # fmt: skip
def test_a_bad_raw_file_is_one_clear_line_and_exit_2(kind: str, needle: str, tmp_path: Path, capsys) -> None:
    path = _bad(kind, tmp_path)
    with pytest.raises(PeerError, match=re.escape(needle)):
        read_requests(path)
    code, _, err = bench_captured(["peer", "import", str(path), "--runs-dir", str(tmp_path / "runs")], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing archived from a bad file
