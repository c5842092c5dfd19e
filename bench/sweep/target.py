"""The target of `bench sweep --target URL`: an OpenAI-compatible server, who it is, what its metrics say, the
tokenizer its prompts are sized with, and how one chunk of its streamed answers is read.

Shared by the one-at-a-time remote sweep (`bench.sweep.remote`) and the sweep under load (`bench.sweep.load`),
which import it and not each other. Neither imports the server (an import contract): this project's server is
recognised from outside, by the metric `OURS` on its /metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.errors import BenchError

TIMEOUT = httpx.Timeout(connect=10.0, read=1800.0, write=60.0, pool=60.0)
OURS = "gemma4_bench_ready"  # a metric only this project's server exposes
GAUGE_LAST, TRACES = 'gemma4_bench_decode_tokens_per_second{stat="last"}', "gemma4_bench_compile_traces_total"


class TargetError(BenchError):
    """A target that cannot be measured as asked (unreachable, unknown model, bad answer, wrong prompt size)."""


# ---- the target ---------------------------------------------------------------------------------------------------
class Target:
    """An OpenAI-compatible endpoint: `base` (ends in /v1), `root` (scheme://host:port, where /health and /metrics
    live), the `model` id, whether it is this project's server (`ours`), and what it said about itself."""

    def __init__(self, base: str, root: str, model: str, ours: bool, health: Any, models: Any):
        self.base, self.root, self.model, self.ours, self.health, self.models = base, root, model, ours, health, models

    @property
    def kind(self) -> str:
        return "gemma4-bench" if self.ours else "openai-compatible"

    def describe(self) -> dict[str, Any]:
        return {"url": self.base, "model": self.model, "kind": self.kind, "health": self.health, "models": self.models}


def describe_target(client: httpx.Client, url: str, model: str | None) -> Target:
    """Ask the server who it is: `GET /v1/models` (required), `/health` and `/metrics` (optional). `model` None picks
    the only (or first) served model. Raises TargetError for a bad URL, an unreachable server or an unknown model."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TargetError(f"--target {url}: expected http://HOST:PORT/v1")
    base, root = url.rstrip("/"), f"{parts.scheme}://{parts.netloc}"
    try:
        r = client.get(f"{base}/models")
    except httpx.HTTPError as exc:
        raise TargetError(f"--target {url}: cannot reach the server ({type(exc).__name__}: {exc})") from None
    if r.status_code in (401, 403):
        raise TargetError(f"--target {url}: GET {base}/models answered {r.status_code}: the server wants an API key; "
                          "pass --api-key KEY (or set $GEMMA4_BENCH_API_KEY)")
    if r.status_code != 200:
        raise TargetError(f"--target {url}: GET {base}/models answered {r.status_code} ({r.text[:200]}); is it ready?")
    models = r.json()
    ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
    if model is None:
        if not ids:
            raise TargetError(f"--target {url}: the server lists no models; pass --model NAME")
        model = ids[0]
    elif ids and model not in ids:
        raise TargetError(f"--model {model}: the server serves {ids}; pass one of them")
    health = _get_json(client, f"{root}/health")
    metrics = scrape_metrics(client, root)
    return Target(base, root, model, OURS in metrics, health, models)


def _get_json(client: httpx.Client, url: str) -> Any:
    try:
        r = client.get(url)
        return {"status_code": r.status_code, "body": r.json()}
    except (httpx.HTTPError, ValueError):
        return None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{label="v",...}': value}, labels sorted by name (no braces when there are none)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = float(sample.value)
    return out


def scrape_metrics(client: httpx.Client, root: str) -> dict[str, float]:
    """`GET {root}/metrics` as {'name{labels}': value}; {} when the server has none or it cannot be parsed."""
    try:
        r = client.get(f"{root}/metrics")
        return parse_metrics(r.text) if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def load_prompt_tokenizer(checkpoint: str | None, target: Target):
    """The tokenizer prompts are sized with: `checkpoint` (a local folder, or a hub repo id whose tokenizer.json is
    fetched), else the one of this project's server's checkpoint, found from the `source` its /health publishes
    (builtin:NAME: the built-in in this machine's cache, when it is there; a hub repo id: as a given one; an older
    server's `path`, when that folder exists here). Returns (tokenizer, source): the source is the checkpoint's
    builtin:NAME or repo id, or for a local folder its `checkpoint_id` (never a path of this machine). Raises
    TargetError when there is none."""
    from bench.runs.manifest import checkpoint_id
    from model.tokenizer import GemmaTokenizer

    if checkpoint is None and target.ours:
        served = (((target.health or {}).get("body") or {}).get("checkpoint") or {})
        local = _builtin_folder(served.get("source")) or served.get("path")
        if local and (Path(local) / "tokenizer.json").is_file():
            return GemmaTokenizer.from_dir(local), served.get("source") or checkpoint_id(Path(local).resolve())
        if served.get("source") and not str(served["source"]).startswith(("builtin:", "random:")):
            checkpoint = served["source"]  # a hub repo id
    if checkpoint is None:
        raise TargetError("--target: pass --checkpoint naming the served model's tokenizer (a folder, repo id or "
                          "builtin:NAME); exact input sizes are built with it and checked against the server's usage")  # fmt: skip
    if Path(checkpoint).is_dir():
        return GemmaTokenizer.from_dir(checkpoint), checkpoint_id(Path(checkpoint).resolve())  # no path of here
    from huggingface_hub import hf_hub_download

    try:
        file = hf_hub_download(checkpoint, "tokenizer.json")
    except Exception as exc:  # noqa: BLE001  (hub errors are many; one line says which)
        raise TargetError(f"--checkpoint {checkpoint}: cannot fetch its tokenizer.json ({type(exc).__name__})") from None
    return GemmaTokenizer.from_dir(Path(file).parent), checkpoint


def _builtin_folder(source: str | None) -> str | None:
    """The cached folder of a built-in checkpoint named `builtin:NAME`, or of the config and tokenizer of dummy
    weights named `random:NAME[@SEED]`, on this machine (None for another source, or a malformed one)."""
    if source and source.startswith("random:"):
        from model.errors import CheckpointError
        from model.random_spec import parse_random
        from model.random_weights import random_folder

        try:
            return str(random_folder(parse_random(source)))
        except CheckpointError:
            return None
    if not source or not source.startswith("builtin:"):
        return None
    from model.builtin import builtin_path

    return str(builtin_path(source.split(":", 1)[1]))


# ---- one streamed chunk -------------------------------------------------------------------------------------------
def fold_chunk(out: Any, obj: dict[str, Any], t: int) -> None:
    """Fold one parsed stream chunk `obj`, which arrived at `t` (perf_counter_ns), into `out` (a `Streamed`, or the
    load sweep's stream): its `usage` and degeneracy verdict where it carries them, and for each choice its text,
    its token ids and, when it brings a token, its arrival time (`t_content`: what TTFT and the inter-token gaps
    are read from). A server that streams token ids (this project's) brings a token exactly where the ids are not
    empty: a text-only chunk with `token_ids: []` (the flush of a character cut at the last token) is text, not
    a token. For any other server a chunk with content is one arrival."""
    out.usage = obj.get("usage") or out.usage
    out.verdict = obj.get("degenerate") or out.verdict
    for choice in obj.get("choices") or []:
        content = (choice.get("delta") or {}).get("content") or ""
        ids = choice.get("token_ids")
        out.text += content
        if ids or (ids is None and content):
            out.t_content.append(t)
        if ids:
            out.token_ids = (out.token_ids or []) + list(ids)
