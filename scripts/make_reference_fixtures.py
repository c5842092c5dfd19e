"""Write the numerical reference fixtures under tests/fixtures/reference/ from Hugging Face transformers.

For each config name below it writes tests/fixtures/reference/<name>/:
  config.json, generation_config.json, model.safetensors   a random Gemma 4 checkpoint, float32, exactly as
                                                            transformers' `save_pretrained` writes it
                                                            (tiny-published is post-processed, see below)
  expected.npz    input_ids    int32   [T]          T = 24 ids (> sliding window 8); ids[0] = 2 (BOS), the rest
                                                    drawn from [3, vocab) by a seeded generator
                  logits       float32 [T, V]       full no-cache forward, eval mode, eager attention
                  hidden_states float32 [L+1, T, D] output_hidden_states=True: [0] is the scaled token embedding
                                                    (layer 0's input), [i] layer i-1's output, and [L] the last
                                                    layer's output AFTER the final norm (HIDDEN_STATES_INDEXING)
                  greedy_ids   int32   [16]         greedy continuation of input_ids: 16 full no-cache forwards,
                                                    argmax of the last position each time, no EOS stopping
  expected.json   versions, shapes, what each array is, sha256 of model.safetensors, sanity statistics

Configs (vocab 512, max positions 256, final softcap 30, p-RoPE 0.25/1e6 on full layers, RoPE 1e4 on sliding):
  tiny            the project's `model.config.TINY` preset: 6 layers [S,S,F,S,S,F], 4 heads / 1 KV head,
                  head dims 16 / 32, window 8, last 3 layers KV-shared, double-wide MLP, PLE width 8.
  tiny-gqa        8 layers [S,S,S,F]*2, 4 heads / 2 KV heads, head dims 16 / 32, intermediate 96,
                  last 2 layers KV-shared, no double-wide MLP, PLE width 8, window 8.
  tiny-published  tiny's weights saved the way the hub release is laid out: `Gemma4ForConditionalGeneration`
                  (keys `model.language_model.*`), then model.safetensors gets extra tensors the real E2B file has
                  and transformers does not write (a few random `model.vision_tower.*` tensors,
                  `model.embed_vision.embedding_projection.weight`, and k_proj / v_proj / k_norm for every
                  KV-shared layer, which no computation reads), and config.json's text_config is rewritten from
                  transformers' `per_layer_config` form to the hub's `global_head_dim` form. Its expected.npz is
                  identical to tiny's (asserted).

Weights are drawn from a fixed seed so that the model behaves like a trained one
(../shared/gemma4-architecture.md §7): embed_tokens with std 1/sqrt(hidden) and embed_tokens_per_layer with
std 1/sqrt(PLE width) (unit-scale entries after their sqrt(hidden) / sqrt(PLE width) embedding scales);
q_norm / k_norm gains head_dim^-1/4 * (1 + 0.05 * noise) for the layer's own head dim (unit-scale attention
logits); every other RMSNorm gain 1 + 0.1 * noise (a norm applied with the wrong weight is noticed);
layer_scalar uniform in [0.7, 1.3]; every linear weight (per_layer_model_projection included) normal with std
1/sqrt(fan_in). The script checks that greedy decoding is not degenerate, that the logits are far from the
softcap and that attention is not one-hot, and records those statistics in expected.json.

The output is deterministic: fixed seeds (SEEDS), one CPU thread, and files written without timestamps; running
the script twice gives byte-identical files (check with `sha256sum tests/fixtures/reference/*/*`). The three
float32 checkpoints take about 4.5 MB in all.

Environment. torch and transformers are deliberately NOT dependencies of the project, its .venv or CI: the
fixtures are committed, and the tests read them with numpy / safetensors only. To regenerate them, build a
separate Python 3.11 venv (the one used was torch 2.13.0+cpu, transformers 5.23.0):

    python3.11 -m venv /work/refenv/venv311
    /work/refenv/venv311/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
    /work/refenv/venv311/bin/pip install transformers==5.23.0 safetensors numpy

(the CPU wheel index is optional; a plain `pip install torch==2.13.0 transformers==5.23.0 safetensors numpy`
works too, at the cost of a larger download), then, from the repository root:

    /work/refenv/venv311/bin/python scripts/make_reference_fixtures.py

The script imports the project's model/config.py (plain Python, no jax) for the TINY preset; nothing else from
the project.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import transformers
from transformers import (
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from model.config import FULL, PRESETS, SLIDING, TINY, ModelConfig, load_config  # noqa: E402

OUT = REPO / "tests" / "fixtures" / "reference"
# One seed per checkpoint; it drives the weights, then the prompt ids. A random model with tied embeddings tends
# to repeat its last token under greedy decoding (the token's own embedding stays in the residual stream), so
# these two were picked from seeds 0..63 as ones whose greedy continuation has >= 12 distinct tokens out of 16 with
# a top-1/top-2 logit margin of at least 0.03 at every step (checked in reference_arrays). EXTRA_SEED draws the
# tensors added to tiny-published. tiny-31b and tiny-moe (issue 45: attention_k_eq_v, separate full-layer KV heads,
# no PLE, no KV sharing; and the expert block) repeat their last token far more (no per-layer inputs: the token's
# own embedding dominates the residual stream): with the embedding std of tiny no seed of 0..63 passed. Their
# embedding table is drawn with EMBED_FACTOR times that std (the project's own random init uses 0.1, see
# model.params.init_rule), and their seeds are the first of 0..39 that pass (`--find-seeds`) with a smallest greedy
# top-1/top-2 margin of 0.01 (MIN_MARGIN; 0.011 and 0.013 found), still four orders of magnitude above float32
# parity errors.
SEED_31B, SEED_MOE = 19, 35
EMBED_FACTOR = {"tiny-31b": 0.3, "tiny-moe": 0.5}
MIN_MARGIN = {"tiny-31b": 0.01, "tiny-moe": 0.01}
SEEDS = {"tiny": 35, "tiny-gqa": 2, "tiny-31b": SEED_31B, "tiny-moe": SEED_MOE}
EXTRA_SEED = 1
PROMPT_LEN = 24  # T: longer than the sliding window (8), so the window mask matters
GREEDY_LEN = 16
BOS = 2

TINY_GQA = dataclasses.replace(
    TINY, num_layers=8, layer_types=(SLIDING, SLIDING, SLIDING, FULL) * 2, num_kv_heads=2,
    intermediate_size=96, num_kv_shared_layers=2, use_double_wide_mlp=False,
)  # fmt: skip

# What transformers 5.23's output_hidden_states holds (L = num_hidden_layers entries + 1), asserted for every
# fixture by reference_arrays(): `capture_outputs` records the first decoder layer's input, then every decoder
# layer's output, and finally overwrites the last entry with last_hidden_state, which is taken after model.norm.
HIDDEN_STATES_INDEXING = {
    "0": "the input of layer 0: embed_tokens(ids) * sqrt(hidden_size) (no PLE, nothing else)",
    "1..L-1": "hidden_states[i] is the output of decoder layer i-1 (after its layer_scalar), the input of layer i",
    "L": "the output of the last decoder layer AFTER the final RMSNorm (model.norm), i.e. last_hidden_state; "
    "the last layer's pre-norm output is not returned",
}


# ---- configs -----------------------------------------------------------------------------------------------------
def text_config(mc: ModelConfig) -> Gemma4TextConfig:
    """The transformers text config of a project ModelConfig (float32, eager attention)."""
    d = mc.to_hf_dict(form="global_head_dim")
    for key in ("architectures", "model_type", "torch_dtype"):
        d.pop(key)
    # experts_implementation="eager": transformers' own per-expert loop (`Gemma4TextExperts.forward`) rather than
    # its default grouped_mm kernel, whose float32 sums run in another order (the reloaded model took another one).
    return Gemma4TextConfig(**d, dtype="float32", attn_implementation="eager", experts_implementation="eager")


def model_config_note(mc: ModelConfig) -> str:
    if mc == TINY:
        return "model.config.TINY"
    fields = [f.name for f in dataclasses.fields(mc)]
    changed = {k: getattr(mc, k) for k in fields if getattr(mc, k) != getattr(TINY, k)}
    return f"dataclasses.replace(model.config.TINY, **{changed})"


# ---- weights -----------------------------------------------------------------------------------------------------
def init_trained_like(model: torch.nn.Module, gen: torch.Generator, embed_factor: float = 1.0) -> None:
    """Overwrite every parameter and layer_scalar of a Gemma4ForCausalLM with the module docstring's init
    (`embed_factor` times the embedding table's std: see EMBED_FACTOR)."""
    from transformers.models.gemma4.modeling_gemma4 import (
        Gemma4RMSNorm,
        Gemma4TextDecoderLayer,
        Gemma4TextExperts,
        Gemma4TextRouter,
        Gemma4TextScaledWordEmbedding,
    )

    def normal(t: torch.Tensor, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=gen) * std)

    done: set[int] = set()
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name == "lm_head":  # tied to model.embed_tokens; written there
                continue
            if isinstance(mod, Gemma4TextScaledWordEmbedding):  # scaled by sqrt(hidden) or sqrt(PLE width)
                normal(mod.weight, (embed_factor if name.endswith("embed_tokens") else 1.0) / mod.scalar_embed_scale)
            elif isinstance(mod, Gemma4TextRouter):  # unit-scale expert logits; its scales near 1
                normal(mod.proj.weight, 1.0)
                for t in (mod.scale, mod.per_expert_scale):
                    t.copy_(1 + 0.1 * torch.randn(t.shape, generator=gen))
                done.update(id(t) for t in (mod.proj.weight, mod.scale, mod.per_expert_scale))
                continue
            elif isinstance(mod, Gemma4TextExperts):  # [E, 2I, D] and [E, D, I]: std 1/sqrt(fan_in)
                normal(mod.gate_up_proj, mod.gate_up_proj.shape[-1] ** -0.5)
                normal(mod.down_proj, mod.down_proj.shape[-1] ** -0.5)
                done.update(id(t) for t in (mod.gate_up_proj, mod.down_proj))
                continue
            elif isinstance(mod, torch.nn.Linear):
                normal(mod.weight, mod.in_features**-0.5)
            elif isinstance(mod, Gemma4RMSNorm) and mod.with_scale:
                noise = torch.randn(mod.weight.shape, generator=gen)
                if name.endswith(("q_norm", "k_norm")):  # per-head gain on this layer's own head dim
                    mod.weight.copy_(mod.weight.shape[0] ** -0.25 * (1 + 0.05 * noise))
                else:
                    mod.weight.copy_(1 + 0.1 * noise)
            elif isinstance(mod, Gemma4TextDecoderLayer):
                mod.layer_scalar.copy_(0.7 + 0.6 * torch.rand(mod.layer_scalar.shape, generator=gen))
                done.add(id(mod.layer_scalar))
            else:
                continue
            if hasattr(mod, "weight") and mod.weight is not None:
                done.add(id(mod.weight))
    assert model.lm_head.weight is model.model.embed_tokens.weight, "lm_head is expected to be tied"
    missed = [n for n, t in model.state_dict(keep_vars=True).items() if id(t) not in done]
    assert not missed, f"tensors left at transformers' init: {missed}"


# ---- reference computations --------------------------------------------------------------------------------------
def last_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids[None], use_cache=False).logits[0, -1]


def reference_arrays(model: torch.nn.Module, ids: torch.Tensor, min_margin: float = 0.03
                     ) -> tuple[dict[str, np.ndarray], dict]:  # fmt: skip
    """expected.npz's arrays for a Gemma4ForCausalLM, plus statistics, checking the hidden-state indexing."""
    text = model.model
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        layer.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"layer{i}", out.detach().clone()))
        for i, layer in enumerate(text.layers)
    ]
    hooks.append(text.norm.register_forward_hook(lambda m, a, out: seen.__setitem__("norm", out.detach().clone())))
    try:
        out = model(input_ids=ids[None], use_cache=False, output_hidden_states=True, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()

    num_layers = len(text.layers)
    hs = out.hidden_states
    assert len(hs) == num_layers + 1
    # The indexing documented in HIDDEN_STATES_INDEXING (transformers 5.23 `capture_outputs` records each decoder
    # layer's input 0 once and every layer's output, then replaces the last entry by last_hidden_state).
    assert torch.equal(hs[0], text.embed_tokens(ids[None]))
    for i in range(1, num_layers):
        assert torch.equal(hs[i], seen[f"layer{i - 1}"]), f"hidden_states[{i}] is not layer {i - 1}'s output"
    assert torch.equal(hs[num_layers], seen["norm"]), "hidden_states[L] is not the final norm's output"
    assert not torch.allclose(hs[num_layers], seen[f"layer{num_layers - 1}"])

    logits = out.logits[0]
    greedy: list[int] = []
    margins: list[float] = []
    seq = ids.clone()
    for _ in range(GREEDY_LEN):
        step = last_logits(model, seq)
        top2 = torch.topk(step, 2).values
        margins.append(float(top2[0] - top2[1]))
        nxt = int(torch.argmax(step))
        greedy.append(nxt)
        seq = torch.cat([seq, torch.tensor([nxt])])
    assert greedy[0] == int(torch.argmax(logits[-1])), "greedy step 0 disagrees with the full forward's last row"

    # Behaves like a trained model: not saturated at the softcap, not one-hot attention, not degenerate greedy.
    max_abs = float(logits.abs().max())
    attn_max = torch.stack([a[0].max(-1).values.mean() for a in out.attentions])  # per layer: mean max prob
    assert max_abs < 15.0, f"logits reach {max_abs:.2f}: too close to the softcap 30"
    assert float(attn_max.max()) < 0.9, f"attention is nearly one-hot: {attn_max.tolist()}"
    assert len(set(greedy)) >= 12, f"degenerate greedy continuation {greedy}"
    assert min(margins) >= min_margin, f"greedy top-1/top-2 margin {min(margins):.2e} is too thin to test against"

    arrays = {
        "input_ids": ids.numpy().astype(np.int32),
        "logits": logits.numpy().astype(np.float32),
        "hidden_states": torch.stack(hs)[:, 0].numpy().astype(np.float32),
        "greedy_ids": np.asarray(greedy, dtype=np.int32),
    }
    stats = {
        "logits_std": round(float(logits.std()), 4),
        "logits_max_abs": round(max_abs, 4),
        "greedy_min_top2_margin": round(min(margins), 4),
        "greedy_distinct_tokens": len(set(greedy)),
        "attention_mean_max_prob_per_layer": [round(float(x), 3) for x in attn_max],
    }
    return arrays, stats


def prompt_ids(vocab: int, gen: torch.Generator) -> torch.Tensor:
    rest = torch.randint(3, vocab, (PROMPT_LEN - 1,), generator=gen)
    return torch.cat([torch.tensor([BOS]), rest])


# ---- writing -----------------------------------------------------------------------------------------------------
def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez's format (an uncompressed zip of .npy files) with a fixed timestamp: np.savez stamps each member
    with the current time, so two runs would differ."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buf.getvalue())


def write_expected(out: Path, arrays: dict[str, np.ndarray], stats: dict, extra: dict) -> None:
    save_npz(out / "expected.npz", arrays)
    num_layers = arrays["hidden_states"].shape[0] - 1
    meta = {
        "generator": "scripts/make_reference_fixtures.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "prompt_len": PROMPT_LEN,
        "greedy_len": GREEDY_LEN,
        "num_layers": num_layers,
        "computation": "Gemma4ForCausalLM, float32, model.eval(), torch.no_grad(), attn_implementation='eager', "
        "use_cache=False (full forwards only), batch 1, positions 0..T-1, no padding",
        "arrays": {
            "input_ids": f"int32 [{PROMPT_LEN}]: the prompt; ids[0] = {BOS} (BOS), the rest uniform in [3, vocab)",
            "logits": "float32 [T, V]: softcapped logits (30 * tanh(x / 30)) of the full forward over input_ids",
            "hidden_states": "float32 [L+1, T, D]: transformers' output_hidden_states, see hidden_states_indexing",
            "greedy_ids": f"int32 [{GREEDY_LEN}]: greedy continuation after input_ids (argmax of the last row of "
            "a full forward over input_ids + the tokens so far, repeated; no EOS stopping)",
        },
        "hidden_states_indexing": HIDDEN_STATES_INDEXING,
        "hidden_states_last_is_after_final_norm": True,
        "model_safetensors_sha256": sha256(out / "model.safetensors"),
        "stats": stats,
        **extra,
    }
    (out / "expected.json").write_text(json.dumps(meta, indent=2) + "\n")


def save_causal(name: str, mc: ModelConfig) -> tuple[Gemma4ForCausalLM, dict, dict]:
    """Build, initialise, save and compute the references of one Gemma4ForCausalLM fixture."""
    gen = torch.Generator().manual_seed(SEEDS[name])
    model = Gemma4ForCausalLM(text_config(mc)).eval()
    init_trained_like(model, gen, EMBED_FACTOR.get(name, 1.0))
    ids = prompt_ids(mc.vocab_size, gen)
    arrays, stats = reference_arrays(model, ids, MIN_MARGIN.get(name, 0.03))

    out = OUT / name
    model.save_pretrained(out)
    reloaded = Gemma4ForCausalLM.from_pretrained(out, attn_implementation="eager", experts_implementation="eager").eval()
    again = reloaded(input_ids=ids[None], use_cache=False).logits[0]
    # The reloaded expert model (same tensors, bit for bit) sums in another order somewhere: 1.2e-7 apart on
    # tiny-moe (transformers 5.23, torch 2.13 CPU); every other fixture reloads bit for bit.
    reload_diff = float((again - torch.from_numpy(arrays["logits"])).abs().max())
    assert reload_diff <= (1e-6 if mc.has_experts else 0.0), f"{name}: reloaded logits differ by {reload_diff}"
    assert load_config(out) == mc, f"{name}: the project's load_config disagrees with the ModelConfig it came from"
    extra = {"seed": SEEDS[name], "model_config": model_config_note(mc), "reload_max_abs_diff": reload_diff}
    if name in EMBED_FACTOR:
        extra["embed_tokens_std"] = f"{EMBED_FACTOR[name]} / sqrt(hidden_size)"
    write_expected(out, arrays, stats, extra)
    return model, arrays, stats


def save_published(causal: Gemma4ForCausalLM, arrays: dict, stats: dict) -> None:
    """tiny's weights in the release layout (Gemma4ForConditionalGeneration + extra tensors + hub config form)."""
    gen = torch.Generator().manual_seed(EXTRA_SEED)
    text_cfg = causal.config
    model = Gemma4ForConditionalGeneration(
        Gemma4Config(
            text_config=text_cfg.to_dict(), vision_config=None, audio_config=None,
            dtype="float32", attn_implementation="eager",
        )
    ).eval()  # fmt: skip
    state = {k.replace("model.", "model.language_model.", 1): v for k, v in causal.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight

    ids = torch.from_numpy(arrays["input_ids"]).long()
    out_mm = model(input_ids=ids[None], use_cache=False, output_hidden_states=True)
    assert torch.equal(out_mm.logits[0], torch.from_numpy(arrays["logits"])), "multimodal text logits differ"
    assert torch.equal(torch.stack(out_mm.hidden_states)[:, 0], torch.from_numpy(arrays["hidden_states"]))
    seq = ids.clone()
    for want in arrays["greedy_ids"]:
        nxt = int(torch.argmax(last_logits(model, seq)))
        assert nxt == int(want), "multimodal greedy continuation differs"
        seq = torch.cat([seq, torch.tensor([nxt])])

    out = OUT / "tiny-published"
    model.save_pretrained(out)
    st_path = out / "model.safetensors"
    tensors = safetensors.torch.load_file(st_path)
    written_by_transformers = sorted(tensors)

    # (a) Multimodal tensors the text engine must skip (shapes of a 32-wide vision tower; E2B's is 768 wide).
    hidden = text_cfg.hidden_size
    extra = {
        "model.vision_tower.patch_embedder.input_proj.weight": (32, 48),
        "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight": (32, 32),
        "model.vision_tower.encoder.layers.0.input_layernorm.weight": (32,),
        "model.embed_vision.embedding_projection.weight": (hidden, 32),
    }
    # (b) K/V tensors of the KV-shared layers, unused by the computation (the E2B release stores them).
    first_shared = text_cfg.num_hidden_layers - text_cfg.num_kv_shared_layers
    for i in range(first_shared, text_cfg.num_hidden_layers):
        hd = text_cfg.per_layer_config[i].head_dim
        kv = text_cfg.per_layer_config[i].num_key_value_heads
        pre = f"model.language_model.layers.{i}.self_attn."
        extra |= {pre + "k_proj.weight": (kv * hd, hidden), pre + "v_proj.weight": (kv * hd, hidden),
                  pre + "k_norm.weight": (hd,)}  # fmt: skip
    for key, shape in extra.items():
        assert key not in tensors, key
        tensors[key] = torch.randn(shape, generator=gen) * 0.05
    safetensors.torch.save_file(tensors, st_path, metadata={"format": "pt"})

    # config.json: the hub's form of the text config (global_head_dim instead of per_layer_config).
    cfg = json.loads((out / "config.json").read_text())
    text = cfg["text_config"]
    per_layer = text.pop("per_layer_config")
    assert {int(k) for k in per_layer} == {i for i, t in enumerate(text["layer_types"]) if t == FULL}, per_layer
    text["global_head_dim"] = text_cfg.per_layer_config[text["layer_types"].index(FULL)].head_dim
    text["num_global_key_value_heads"] = None
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    # The post-processed checkpoint still loads in transformers (extra keys ignored) and gives the same logits.
    reloaded = Gemma4ForConditionalGeneration.from_pretrained(out, attn_implementation="eager").eval()
    assert torch.equal(reloaded(input_ids=ids[None], use_cache=False).logits[0], torch.from_numpy(arrays["logits"]))
    assert load_config(out) == TINY, "the project's load_config does not read tiny-published as TINY"

    write_expected(
        out, arrays, stats,
        {
            "seed": SEEDS["tiny"],
            "extra_tensors_seed": EXTRA_SEED,
            "model_config": model_config_note(TINY),
            "same_arrays_as": "tiny",
            "layout": "Gemma4ForConditionalGeneration (text weights under model.language_model.), tied lm_head not "
            "stored; config.json text_config in the hub's global_head_dim form",
            "added_tensors_unused_by_text_model": sorted(extra),
            "tensors_written_by_transformers": len(written_by_transformers),
        },
    )  # fmt: skip


def check_same_arrays(a: Path, b: Path) -> None:
    with np.load(a / "expected.npz") as x, np.load(b / "expected.npz") as y:
        assert sorted(x.files) == sorted(y.files)
        for k in x.files:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), f"{a.name} vs {b.name}: {k} differs"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(only: tuple[str, ...] = ()) -> None:
    """Write every fixture (the folder is remade), or with `only` (fixture names of `PRESETS`) just those."""
    torch.manual_seed(0)  # only transformers' own init (all overwritten) draws from the global generator
    torch.set_num_threads(1)  # one summation order for every matmul, whatever the machine
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_default_handler()  # warnings are printed once, at the end
    collected = _Collect()
    logging.getLogger("transformers").addHandler(collected)

    if only:  # just these fixtures, the others left as they are
        for name in only:
            shutil.rmtree(OUT / name, ignore_errors=True)
        with torch.no_grad():
            for name in only:
                save_causal(name, PRESETS[name])
    else:
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        with torch.no_grad():
            tiny, arrays, stats = save_causal("tiny", TINY)
            save_causal("tiny-gqa", TINY_GQA)
            save_published(tiny, arrays, stats)
            save_causal("tiny-31b", PRESETS["tiny-31b"])
            save_causal("tiny-moe", PRESETS["tiny-moe"])
        check_same_arrays(OUT / "tiny", OUT / "tiny-published")

    for path in sorted(OUT.rglob("*")):
        if path.is_file():
            print(f"{path.stat().st_size:>9}  {path.relative_to(REPO)}")
    for name in ("tiny", "tiny-gqa", "tiny-31b", "tiny-moe"):
        print(name, json.loads((OUT / name / "expected.json").read_text())["stats"])
    if collected.messages:
        print("transformers warnings:")
        for m in collected.messages:
            print("  " + m.replace("\n", "\n  "))


def find_seeds(names: tuple[str, ...] = ("tiny-31b", "tiny-moe"), tries: int = 40) -> None:
    """Print, for each preset named, the first seed in 0..tries-1 whose fixture passes reference_arrays' checks
    (the way SEEDS were picked); writes nothing."""
    torch.set_num_threads(1)
    transformers.utils.logging.disable_default_handler()
    for name in names:
        mc = PRESETS[name]
        for seed in range(tries):
            gen = torch.Generator().manual_seed(seed)
            model = Gemma4ForCausalLM(text_config(mc)).eval()
            with torch.no_grad():
                init_trained_like(model, gen, EMBED_FACTOR.get(name, 1.0))
                try:
                    _, stats = reference_arrays(model, prompt_ids(mc.vocab_size, gen), MIN_MARGIN.get(name, 0.03))
                except AssertionError as exc:
                    print(f"{name} seed {seed}: {str(exc)[:100]}")
                    continue
            print(f"{name}: seed {seed} {stats}")
            break


if __name__ == "__main__":
    if sys.argv[1:] == ["--find-seeds"]:
        find_seeds()
    else:
        main(tuple(a.removeprefix("--only=") for a in sys.argv[1:] if a.startswith("--only=")))
