"""The state `bench profile` traces: decode steps after the sweep's real prompt, not a stand-in.

`prompt_decode_steps` prefills a prompt exactly as `Engine.generate` does, through the engine's own programs, so
its first token and every traced step equal a sweep request's tokens for the same prompt (greedy, tiny checkpoint).
"""

from __future__ import annotations

import pytest

from bench.profile.capture import prompt_decode_steps
from bench.sweep.local import SweepConfig, build_prompts

MAX_NEW = 6


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    from model.engine import load_engine

    engine, _ = load_engine(tiny_checkpoint, log_policy=False)
    return engine


def test_profiled_steps_decode_the_sweep_prompt_like_generate(engine):
    prompt = build_prompts(engine, SweepConfig(inputs=(20,), max_new_tokens=MAX_NEW))[20]
    assert len(prompt.ids) == 20 and prompt.ids == tuple(engine.tokenizer.chat_ids(prompt.text))
    expected = engine.generate(prompt.ids, MAX_NEW).token_ids
    state, step = prompt_decode_steps(engine, prompt.ids, MAX_NEW)
    tokens = [int(state[0][0])]
    for _ in range(MAX_NEW - 1):
        state = step(state)
        tokens.append(int(state[0][0]))
    assert tokens == expected
