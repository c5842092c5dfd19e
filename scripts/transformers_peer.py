"""The transformers peer: Hugging Face transformers timed on the sweep's own workload (not in CI).

    python scripts/transformers_peer.py PLAN.json REQUESTS.jsonl [--threads 2] [--attn sdpa]

Reads a plan written by `bench peer plan` (the checkpoint folder, max_new_tokens, repeats, and per input size the
sweep's own exact-length prompt: text and ids) and writes one JSON line per request of raw host timestamps, which
`bench peer import REQUESTS.jsonl` archives as a run folder (formats: bench/sweep/peer.py). `make peer` runs all
three steps, with this script in its own venv (.venv-peer: Python 3.11, torch 2.13.0 CPU, transformers 5.24.0,
safetensors, numpy); the project's own venv never installs torch.

What it measures, as `bench sweep` does (docs/method.md, "Per request" and "Per cell"):
- the model: `AutoModelForCausalLM` on the plan's checkpoint folder, float32 weights and compute, the attention
  implementation `--attn` (default sdpa), eval mode, every request under `torch.inference_mode`, on the CPU with
  `torch.set_num_threads(--threads)` (default 2);
- one request: request start (prompt text in hand) -> the chat prompt tokenized by transformers' own tokenizer
  (`apply_chat_template`), whose ids must equal the plan's (else it stops with one line: the two would not
  measure the same prompt) -> one prefill forward of the whole prompt (logits of the last position only, as
  `generate` asks) -> greedy decoding, one forward per token with the KV cache the model returns, each argmax id
  brought to the host (`.item()`) and timestamped -> exactly max_new_tokens ids (EOS ignored) -> the ids decoded
  to text -> request end. Times from `time.perf_counter_ns` (monotonic). The harness derives TTFT, prefill,
  decode time, gauge, end-to-end tok/s, TPOT and per-step times from these stamps with the sweep's own functions,
  and runs the degeneracy check on every response;
- order: the first request of the process is `cold` (the first cell's), then per cell one warm-up and `repeats`
  timed requests;
- compile events: eager PyTorch compiles nothing unless torch.compile is used (it is not); each request records
  how many graphs torch._dynamo compiled meanwhile (its counters), so a timed repeat that compiled would show.
A cell whose request raises (e.g. out of memory) is recorded as failed and the next cell runs. A tokenization
mismatch, a bad plan or a missing checkpoint stop the script with one `error:` line and exit code 2.

Standard library, torch and transformers only: nothing from the project is imported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib.metadata
import inspect
import json
import platform
import sys
import time
from pathlib import Path

RAW_FORMAT, PLAN_FORMAT, FORMAT_VERSION = "gemma4-bench peer requests", "gemma4-bench peer plan", 1
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "huggingface_hub")


class PeerAbort(Exception):
    """A reason to stop the whole peer run (one line for a person)."""


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def read_plan(path: Path) -> dict:
    """The plan at `path`, checked for the fields this script reads. PeerAbort otherwise."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PeerAbort(f"{path}: cannot read the plan ({exc}); write one with `bench peer plan`") from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or plan.get("format_version") != FORMAT_VERSION:
        raise PeerAbort(f"{path}: not a peer plan of version {FORMAT_VERSION}; write one with `bench peer plan`")
    folder = Path(plan["checkpoint"]["path"])
    if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
        raise PeerAbort(f"{path}: checkpoint folder {folder} has no config.json / tokenizer.json; "
                        "write the plan again on this machine")  # fmt: skip
    return plan


def compiled_graphs() -> int:
    """Graphs torch._dynamo has compiled in this process so far (0 while nothing was compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0))


class Peer:
    """The loaded model and tokenizer, and one request measured (`request`)."""

    def __init__(self, folder: Path, attn: str, threads: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the log is one line per request
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn)
        self.model.eval()
        self.load_s = time.perf_counter() - t0
        self.torch = torch
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers 5.24 renamed it

    def weight_bytes(self) -> int:
        """Bytes of the model's parameters as loaded (tied tensors once)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def settings(self, threads: int, script: Path) -> dict:
        torch = self.torch
        return {
            "threads": torch.get_num_threads(), "threads_requested": threads,
            "interop_threads": torch.get_num_interop_threads(),
            "attn_implementation": self.model.config._attn_implementation,
            "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
            "grad": "torch.inference_mode", "model_class": type(self.model).__name__,
            "tokenizer_class": type(self.tokenizer).__name__,
            "decode": f"greedy argmax, one forward per token with the returned KV cache ({self.cache_kw}=), "
                      "logits of the last position only (logits_to_keep=1)",
            "script_sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
        }  # fmt: skip

    def _forward(self, ids, cache):
        kw = {self.cache_kw: cache} if cache is not None else {}
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **kw)
        cache = out.get("cache") if "cache" in out else out.past_key_values
        return out.logits[:, -1, :].argmax(-1), cache  # [1] (int64), the cache for the next step

    def request(self, prompt: dict, max_new_tokens: int) -> dict:
        """One request of `prompt` (the plan's), timed; its raw record (bench/sweep/peer.py). PeerAbort when the
        tokenizer does not reproduce the plan's ids."""
        torch = self.torch
        graphs0 = compiled_graphs()
        with torch.inference_mode():
            t_start = time.perf_counter_ns()
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt["text"]}],
                                                     add_generation_prompt=True, tokenize=True, return_dict=False)
            ids = list(ids)
            if ids != prompt["ids"]:
                first = next((i for i, (a, b) in enumerate(zip(ids, prompt["ids"])) if a != b),
                             min(len(ids), len(prompt["ids"])))
                raise PeerAbort(f"the {prompt['input_tokens']}-token prompt tokenized to {len(ids)} ids with "
                                f"transformers, differing from the plan's at index {first}: the two tokenizers "
                                "disagree, so the peer would measure another prompt")  # fmt: skip
            t_prefill = time.perf_counter_ns()
            nxt, cache = self._forward(torch.tensor([ids], dtype=torch.long), None)
            tokens, stamps = [int(nxt.item())], [time.perf_counter_ns()]
            while len(tokens) < max_new_tokens:  # EOS ignored: exactly max_new_tokens
                nxt, cache = self._forward(nxt[:, None], cache)
                tokens.append(int(nxt.item()))
                stamps.append(time.perf_counter_ns())
            self.tokenizer.decode(tokens)
            t_end = time.perf_counter_ns()
        return {"record": "request", "input_tokens": prompt["input_tokens"], "prompt_ids": ids, "token_ids": tokens,
                "t_start_ns": t_start, "t_prefill_ns": t_prefill, "t_token_ns": stamps, "t_end_ns": t_end,
                "compile_events": compiled_graphs() - graphs0}  # fmt: skip


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def run(plan_path: Path, out_path: Path, threads: int, attn: str) -> int:
    """Measure every cell of the plan into `out_path` (rewritten). Returns the number of failed cells."""
    plan = read_plan(plan_path)
    started = now_iso()
    peer = Peer(Path(plan["checkpoint"]["path"]), attn, threads)
    import transformers

    v = versions()
    header = {
        "record": "header", "format": RAW_FORMAT, "format_version": FORMAT_VERSION, "plan": plan,
        "engine": {"name": "transformers", "version": transformers.__version__,
                   "framework": f"torch {peer.torch.__version__}", "settings": peer.settings(threads, Path(__file__))},
        "versions": v, "command_line": [Path(sys.argv[0]).name, *sys.argv[1:]], "device": "cpu",
        "weight_bytes": peer.weight_bytes(), "load_s": peer.load_s, "started_at": started,
    }  # fmt: skip
    failed, first = 0, True
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as fh:
        def write(record: dict) -> None:
            fh.write(json.dumps(record, separators=(",", ":")) + "\n")
            fh.flush()

        write(header)
        settings = header["engine"]["settings"]
        log(f"transformers {transformers.__version__}, torch {peer.torch.__version__}, {settings['threads']} threads, "
            f"{settings['attn_implementation']}; loaded in {peer.load_s:.1f} s")
        for prompt in plan["prompts"]:
            kinds = ([("cold", 0)] if first else []) + [("warmup", 0)] + [("timed", r) for r in range(plan["repeats"])]
            try:
                for kind, repeat in kinds:
                    rec = peer.request(prompt, plan["max_new_tokens"])
                    write({**rec, "kind": kind, "repeat": repeat})
                    first = False
                    log(f"{prompt['input_tokens']} input tokens, {kind} {repeat}: TTFT "
                        f"{(rec['t_token_ns'][0] - rec['t_start_ns']) / 1e6:,.0f} ms, request "
                        f"{(rec['t_end_ns'] - rec['t_start_ns']) / 1e9:.2f} s")
            except PeerAbort:
                raise
            except Exception as exc:  # one failing cell (e.g. out of memory) must not lose the others
                failed += 1
                message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
                write({"record": "failed", "input_tokens": prompt["input_tokens"], "error": message})
                log(f"{prompt['input_tokens']} input tokens: FAILED ({message})")
        write({"record": "end", "ended_at": now_iso()})
    return failed


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path, help="the plan written by `bench peer plan`")
    ap.add_argument("out", type=Path, help="where the raw requests (JSON lines) are written")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--attn", default="sdpa", help="attention implementation (default sdpa)")
    args = ap.parse_args(argv)
    if args.threads < 1:
        print(f"error: --threads {args.threads}: expected at least 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        failed = run(args.plan, args.out, args.threads, args.attn)
    except PeerAbort as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log(f"wrote {args.out} in {time.perf_counter() - t0:.1f} s" + (f"; {failed} cell(s) failed" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
